"""A single node whose store cannot write: the alarm, and recovery once the disk has room.

Theory of operation: the store (storage/guarded.py) reports a failed write or fsync once, from
whichever thread met it, through `StoreWatch.on_failure`. On the trio loop that raises the disk
alarm (alarms.py: publishing connections get connection.blocked and are no longer read), and
wakes `run`. Publishes already taken in are answered by the group-commit syncer: every ticket it
could not make durable is nacked (Broker.on_sync_failed), and the queue machines stay whole,
because the store keeps what it could not write in its redo log.

`run` then tries to recover (reopen, redo, fsync: GuardedStore.recover) whenever the data folder
has the room a reopen needs, checking every `RETRY_S` and backing off to `RETRY_S_MAX` after
attempts that fail. When one works, the alarm goes off, publishers are read again, and
everything confirmed before the failure is still there (it was fsynced).
"""

from __future__ import annotations

import logging

import trio

from .alarms import ResourceAlarms, disk_free_bytes

log = logging.getLogger("maxq.store")

RETRY_S = 1.0
RETRY_S_MAX = 30.0


class StoreWatch:
    def __init__(self, store, data_dir: str) -> None:
        self.store = store
        self.alarms: ResourceAlarms | None = None  # set by `run`
        self.data_dir = data_dir
        self._token = trio.lowlevel.current_trio_token()
        self._failed = trio.Event()

    def on_failure(self, reason: str) -> None:
        """From the store, in any thread: hop to the loop."""
        try:
            self._token.run_sync_soon(self._failed_here, reason)
        except trio.RunFinishedError:
            pass  # stopping: GuardedStore.close reports what it could not write

    def _failed_here(self, reason: str) -> None:
        if self.alarms is not None:
            self.alarms.set_store_failure(reason)
        self._failed.set()

    async def run(self, alarms: ResourceAlarms) -> None:
        self.alarms = alarms
        if self.store.failure is not None:
            self._failed_here(self.store.failure)
        while True:  # for the life of the node; each pass waits for a failure first
            await self._failed.wait()
            self._failed = trio.Event()
            backoff_s = RETRY_S
            while self.store.failure is not None:  # until the store writes again; each turn sleeps
                wait_s = RETRY_S
                if disk_free_bytes(self.data_dir) >= self.store.recovery_bytes_needed():
                    if self.store.recover():
                        break
                    wait_s, backoff_s = backoff_s, min(RETRY_S_MAX, backoff_s * 2)  # room, yet it failed
                await trio.sleep(wait_s)
            alarms.set_store_failure(None)
