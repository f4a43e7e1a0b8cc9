"""A single node's log: a command is applied as it is submitted, and is durable once fsynced.

Theory of operation: a single node is a one-member log behind the same interface as a cluster
(command_log.py). `submit` stamps the command with the next index and the node's time, applies
it at once through the one apply path (`Applier`), and calls `then(reply)` in the caller's
stack, so a publish goes from its frames to the consumer's buffer without an `await`.

What is durable is the node's store, not a log of entries: persistent messages of durable
queues are written through the store's WAL by their queue's backing (message_store.py) and
durable topology by the metadata log (persistence.py, fsynced before the `-ok`). A command that
wrote something to be fsynced (the syncer is "dirty" after it) returns a Pending that is done
when the group-commit syncer's next ticket is: one ticket per scheduler pass covers every
command of that pass, one fsync covers every ticket taken while the previous one ran. A ticket
the store could not make durable (a failed write or fsync: storage/guarded.py) fails its
Pendings, and their publishes are nacked. A command that wrote nothing durable is done at once.

Queues get their machine from `make_queue`: a durable queue's backing writes through the WAL, and
the store id it is given (`next_queue_id`, itself stored) is logged with its declare, so a
restart finds its messages (recovery.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from ..machines import commands as qc
from ..machines.metadata import META_GROUP
from ..machines.priority_queue import make_queue_machine
from ..machines.queue import QueueMachine
from ..machines.queue_args import settings_or_default
from ..machines.queue_types import Meta
from . import persistence
from .applier import Applier
from .command_log import CommandLog
from .confirms import Pending
from .message_store import QueueBacking

log = logging.getLogger("maxq.log")

SHARD = "shard-0"  # a single node's queues are all in one shard
STORE_FAILED = "store failed"  # a Pending's error when the store could not make it durable


class LocalLog(CommandLog):
    synchronous = True

    def __init__(self, broker) -> None:
        super().__init__(broker)
        self.origin = broker.node_id + "@local"
        self.shards = [SHARD]
        self.index = 0
        self.applier = Applier(broker, self)
        self._token = trio.lowlevel.current_trio_token()
        self._unsynced: list[Pending] = []  # wait for the next ticket, requested at the end of the pass
        self._ticket_scheduled = False
        self._tickets: deque[tuple[int, list[Pending]]] = deque()  # requested, not yet answered
        self.forced_queue_id: int | None = None  # recovery.py: the store id a replayed declare had
        self.flow_blocked = False  # a local log never has proposals waiting
        self.flow_room = trio.Event()
        self.flow_room.set()

    # -- the log ---------------------------------------------------------------------------

    def stamp(self) -> Meta:
        self.index += 1
        return Meta(self.index, self.broker.clock_ms())

    def submit(
        self, target: Any, command: Any, then: Callable[[Any], None] | None, group: str | None = None
    ) -> Pending:
        broker = self.broker
        self.applier.apply(
            broker.groups[group or self.group_of(target)], self.stamp(), target, command, self.origin, True, then
        )
        pending = Pending()
        syncer = broker.syncer
        if syncer is not None and syncer.dirty:
            self._unsynced.append(pending)
            if not self._ticket_scheduled:
                self._ticket_scheduled = True
                self._token.run_sync_soon(self._request_ticket)
        else:
            pending.done = True
        return pending

    def _request_ticket(self) -> None:
        self._ticket_scheduled = False
        pendings, self._unsynced = self._unsynced, []
        syncer = self.broker.syncer
        if pendings and syncer is not None:
            self._tickets.append((syncer.request(), pendings))

    def on_sync(self, ticket: int, mark: Any) -> None:
        """The syncer's outcome for `ticket` (loop thread): durable up to the store's `mark`, or
        failed (None): the Pendings of every ticket up to it are done, or failed."""
        if mark is not None:
            self.broker.store.synced(mark)
        error = None if mark is not None else STORE_FAILED
        tickets = self._tickets
        failed = 0
        while tickets and tickets[0][0] <= ticket:
            _, pendings = tickets.popleft()
            for pending in pendings:
                self.confirms.done(pending, error)
            failed += len(pendings) if error else 0
        if failed:
            log.warning("%d commands not confirmed: the store failed before they were durable", failed)
        self.broker.send_queued()  # (the confirms)

    def when_committed(self, pendings: list[Pending], then: Callable[[bool], None]) -> None:
        """then(True) at once: what a single node applied is in its store's WAL in apply order,
        and a crash loses at most a suffix of it, so a later write (a dead letter's source
        forgetting it) never survives one that was lost (its copy in the target queue). Only a
        publisher's confirm waits for the fsync."""
        then(True)

    def group_of(self, target: Any) -> str:
        return META_GROUP if target is None else SHARD

    def leads(self, group: str) -> bool:
        return True

    def members(self) -> list[str]:
        return [self.node_id]

    replication_node = None  # no Raft engine: membership commands do not apply

    # -- queues ----------------------------------------------------------------------------

    def make_queue(self, key: tuple[str, str], create: qc.Create) -> QueueMachine:
        broker = self.broker
        queue_id = self.forced_queue_id
        if queue_id is None:
            queue_id = broker.next_queue_id
            broker.next_queue_id += 1
            if broker.store is not None:
                broker.store.write(
                    (), (), {persistence.NEXT_QUEUE_ID_KEY: broker.next_queue_id.to_bytes(8, "big")}, wal=create.durable
                )
        else:
            broker.next_queue_id = max(broker.next_queue_id, queue_id + 1)
        broker.queue_ids[key] = queue_id
        backing = None
        if broker.store is not None:
            backing = QueueBacking(broker.store, queue_id, create.durable, broker.epoch, broker.syncer)
        settings = settings_or_default(key[0], key[1], create.arguments)
        return make_queue_machine(key[0], key[1], backing=backing, durable=create.durable, settings=settings)
