"""GuardedStore: the node's store, kept usable and honest when the disk fails under it.

Theory of operation
-------------------
A write or fsync that fails (a full disk, an I/O error) must mean nothing after it is confirmed,
and must not tear the queue machines, which already counted the write as done. So writes never
raise here: a failed one puts the store in the *failed* state, reported once through
`on_failure(reason)`; every write, failed or not, is also kept in a redo log; and a sync
(`sync_wal`) raises `StoreFailed` while failed, so nothing it would have covered is confirmed.

The redo log holds every write since the last successful fsync (`synced(mark)` drops what a
sync covered). RocksDB cannot resume after a WAL write error (rocksdict does not expose
`DB::Resume`), and after a failed fsync the page cache cannot be trusted (PostgreSQL's
"fsyncgate"), so recovery never retries an fsync: `recover()` closes the handle, opens the folder
again (RocksDB replays what its WAL holds: everything up to the last good fsync, perhaps more),
writes the whole redo log again in order, fsyncs, and only then leaves the failed state. Every
write is last-writer-wins per key (put, delete, range delete, meta put), so redoing an ordered
suffix of the writes on any state between the last fsync and the last write gives the state of
all of them. Because a reopen finds only what the WAL holds, every write goes through the WAL
(`wal=False` from callers is ignored): a spilled transient message must survive a reopen as it
survives in memory, though a restart still treats it as stale by the flags in its record.

While failed, reads see the store overlaid with the redo log (`scan`, `get_meta`), so a queue
whose window empties still finds the messages whose writes failed. If a reopen fails (the disk is
still full) the folder is opened read-only for those reads until the next attempt.

Without a redo log (`redo=False`, for a cluster member, whose Raft log is the durable record and
whose store only takes what overflows memory) a failure is reported and writes are dropped: the
member stops and starts again from its log (server/main.py).

Threads: writes, reads, `synced`, `recover` and `close` belong to one thread (the trio loop);
`sync_wal` and `sync_mark` may also be called from one other thread (the group-commit syncer).
A lock keeps a sync from running on a handle that `recover` or `close` is replacing.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeAlias

from .errors import StorageError, StoreFailed
from .segment_store import WritableStore

log = logging.getLogger("maxq.storage")

__all__ = ["GuardedStore", "StoreFailed", "SyncMark"]

SyncMark = tuple[int, int]  # (generation, position in the redo log): the writes before it
RECOVERY_MARGIN_BYTES = 32 << 20  # free space wanted beyond the WAL and the redo log to reopen
REDO_CHUNK_OPS = 256  # writes redone per call during recovery
_RANGE_ALL = 1 << 64

# A redo entry: ("w", puts, deletes, meta) for `write`, ("r", queue_id, seq_from, seq_to) for a
# range delete (`drop_queue` is the whole range).
_Write: TypeAlias = tuple[
    Literal["w"], Sequence[tuple[int, int, bytes]], Sequence[tuple[int, int]], dict[str, bytes | None] | None
]
_RangeDelete: TypeAlias = tuple[Literal["r"], int, int, int]
_Op: TypeAlias = _Write | _RangeDelete


class GuardedStore:
    """Wraps a SegmentStore opened by `open_store(read_only)`; see the module docstring.

    Without a handle (while `recover` replaces it, after `close`) there is no `_store`
    attribute at all, so a call then fails with AttributeError, as on any closed object."""

    def __init__(
        self,
        open_store: Callable[[bool], WritableStore],
        *,
        redo: bool = True,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._open_store = open_store
        self._store: WritableStore = open_store(False)
        self.path: str = getattr(self._store, "path", "store")
        self.redo = redo
        self.on_failure = on_failure
        self.failure: str | None = None  # why the store cannot write, while it cannot
        self.failures = 0  # times the store entered the failed state
        self.recoveries = 0
        self._redo: collections.deque[_Op] = collections.deque()
        self._redo_base = 0  # position of _redo[0]
        self._redo_end = 0  # position after the last write kept (read by the syncer thread)
        self._generation = 0  # bumped when a recovery empties the redo log
        self._overlays: dict[int, tuple[dict[int, bytes | None], list[tuple[int, int]]]] = {}
        self._lock = threading.Lock()  # held by sync_wal, recover and close around the handle

    # -- writes: never raise a StorageError --------------------------------------------------

    def write(
        self,
        puts: Iterable[tuple[int, int, bytes]],
        deletes: Iterable[tuple[int, int]],
        meta: dict[str, bytes | None] | None,
        *,
        wal: bool = True,
    ) -> None:
        puts = puts if isinstance(puts, (list, tuple)) else list(puts)
        deletes = deletes if isinstance(deletes, (list, tuple)) else list(deletes)
        if self.failure is None:
            try:
                self._store.write(puts, deletes, meta, wal=True)
            except StorageError as exc:
                self._fail(f"write failed: {exc}")
        self._keep(("w", puts, deletes, meta))

    def put_meta(self, key: str, value: bytes) -> None:
        self.write((), (), {key: value})

    def delete_range(self, queue_id: int, seq_from: int, seq_to_exclusive: int) -> None:
        if self.failure is None:
            try:
                self._store.delete_range(queue_id, seq_from, seq_to_exclusive)
            except StorageError as exc:
                self._fail(f"range delete failed: {exc}")
        self._keep(("r", queue_id, seq_from, seq_to_exclusive))

    def drop_queue(self, queue_id: int) -> None:
        self.delete_range(queue_id, 0, _RANGE_ALL)

    def _keep(self, op: _Op) -> None:
        if not self.redo:
            return
        self._redo.append(op)
        self._redo_end += 1  # after the write: a mark never counts a write not yet made
        if self.failure is not None and self._overlays:
            for queue_id in _queues_of(op):
                self._overlays.pop(queue_id, None)

    def _fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        self.failures += 1
        self._overlays.clear()
        log.critical(
            "message store %s cannot write: %s; nothing written since the last good fsync is confirmed",
            self.path,
            reason,
        )
        if self.on_failure is not None:
            self.on_failure(reason)

    # -- reads -----------------------------------------------------------------------------

    def scan(self, queue_id: int, seq_from: int, limit: int) -> list[tuple[int, bytes]]:
        if self.failure is None or not self._redo:
            return self._store.scan(queue_id, seq_from, limit)
        items, ranges = self._overlay(queue_id)
        found: list[tuple[int, bytes]] = []
        cursor = seq_from
        while len(found) < limit:  # bounded: each turn moves past >= 1 stored record, or ends
            chunk = self._store.scan(queue_id, cursor, limit)
            for seq, record in chunk:
                if seq not in items and not any(lo <= seq < hi for lo, hi in ranges):
                    found.append((seq, record))
            if len(chunk) < limit:
                break
            cursor = chunk[-1][0] + 1
        found.extend((seq, record) for seq, record in items.items() if record is not None and seq >= seq_from)
        found.sort(key=lambda item: item[0])
        return found[:limit]

    def get_meta(self, key: str) -> bytes | None:
        if self.failure is not None:
            for op in reversed(self._redo):
                if op[0] == "w" and op[3] and key in op[3]:
                    return op[3][key]
        return self._store.get_meta(key)

    def _overlay(self, queue_id: int) -> tuple[dict[int, bytes | None], list[tuple[int, int]]]:
        """What the redo log says of one queue: seq -> record (None: deleted), and range deletes."""
        cached = self._overlays.get(queue_id)
        if cached is not None:
            return cached
        items: dict[int, bytes | None] = {}
        ranges: list[tuple[int, int]] = []
        for op in self._redo:
            if op[0] == "w":
                for q, seq, record in op[1]:
                    if q == queue_id:
                        items[seq] = record
                for q, seq in op[2]:  # a batch's deletes come after its puts
                    if q == queue_id:
                        items[seq] = None
            elif op[1] == queue_id:
                lo, hi = op[2], op[3]
                for seq in [seq for seq in items if lo <= seq < hi]:
                    del items[seq]
                ranges.append((lo, hi))
        self._overlays[queue_id] = items, ranges
        return items, ranges

    # Read only at start-up, before anything can have failed.
    def get(self, queue_id: int, seq: int) -> bytes | None:
        return self._store.get(queue_id, seq)

    def bounds(self, queue_id: int) -> tuple[int, int] | None:
        return self._store.bounds(queue_id)

    def queue_ids(self) -> list[int]:
        return self._store.queue_ids()

    # -- durability ------------------------------------------------------------------------

    def usage(self) -> dict[str, int]:
        """The wrapped store's figures (RocksSegmentStore.usage), and the redo log's bytes."""
        store = getattr(self, "_store", None)
        inner = getattr(store, "usage", None)
        try:
            figures: dict[str, int] = dict(inner()) if inner is not None else {}
        except Exception:  # noqa: BLE001 - a figure for a scrape: a store being closed has none
            figures = {}
        figures["redo_bytes"] = self.redo_bytes()
        return figures

    @property
    def unsynced_writes(self) -> int:
        return self._redo_end - self._redo_base

    def redo_bytes(self) -> int:
        """Bytes of records in the redo log (walks it: for the failed state only)."""
        return sum(sum(len(p[2]) for p in op[1]) for op in self._redo if op[0] == "w")

    def sync_mark(self) -> SyncMark:
        return self._generation, self._redo_end

    def sync_wal(self) -> SyncMark:
        """fsync what was written; returns the mark it covered (give it to `synced`). Raises
        StoreFailed while the store is failed, or if this fsync fails (which fails the store)."""
        mark = self.sync_mark()  # before the fsync: every write it counts was made already
        with self._lock:
            if self.failure is not None:
                raise StoreFailed(self.failure)
            try:
                self._store.sync_wal()
            except StorageError as exc:
                self._fail(f"fsync failed: {exc}")
                raise StoreFailed(self.failure or str(exc)) from None
        return mark

    def synced(self, mark: SyncMark) -> None:
        """The writes before `mark` are durable: the redo log lets them go (loop thread)."""
        generation, position = mark
        if generation != self._generation:
            return  # a sync of a handle that a recovery has replaced
        redo = self._redo
        while self._redo_base < position and redo:  # bounded by the log's length
            redo.popleft()
            self._redo_base += 1

    # -- recovery --------------------------------------------------------------------------

    def recovery_bytes_needed(self) -> int:
        """Free space a reopen wants: RocksDB turns its WAL into a table file, then the redo
        log is written again; plus a margin."""
        wal_bytes = 0
        try:
            with os.scandir(self.path) as entries:
                for entry in entries:
                    if entry.name.endswith(".log"):
                        wal_bytes += entry.stat().st_size
        except OSError:
            pass
        return wal_bytes + self.redo_bytes() + RECOVERY_MARGIN_BYTES

    def recover(self) -> bool:
        """Reopen, redo, fsync (see the module docstring). True when the store can write again."""
        if self.failure is None:
            return True
        with self._lock:
            self._release_handle()
            try:
                store = self._open_store(False)
            except StorageError as exc:
                self._note_retry(f"reopen failed: {exc}")
                self._open_reader()
                return False
            try:
                ops = list(self._redo)
                for start in range(0, len(ops), REDO_CHUNK_OPS):
                    for op in ops[start : start + REDO_CHUNK_OPS]:
                        if op[0] == "w":
                            store.write(op[1], op[2], op[3], wal=True)
                        else:
                            store.delete_range(op[1], op[2], op[3])
                store.sync_wal()
            except StorageError as exc:
                self._store = store
                self._release_handle()
                self._note_retry(f"redo failed: {exc}")
                self._open_reader()
                return False
            self._store = store
        redone = len(self._redo)
        self._redo.clear()
        self._redo_base = self._redo_end = 0
        self._generation += 1
        self._overlays.clear()
        log.warning(
            "message store %s writes again: reopened, %d writes redone and fsynced (failed since: %s)",
            self.path,
            redone,
            self.failure,
        )
        self.failure = None
        self.recoveries += 1
        return True

    def _note_retry(self, reason: str) -> None:
        log.warning("message store %s still cannot write (%s); trying again later", self.path, reason)

    def _open_reader(self) -> None:
        """A read-only handle for the reads of the failed state (under the lock)."""
        try:
            self._store = self._open_store(True)
        except StorageError as exc:
            log.error("message store %s cannot even be read now: %s", self.path, exc)
            self._store = _Unreadable(self.path, str(exc))

    def _release_handle(self) -> None:
        store = self.__dict__.pop("_store", None)
        if store is None:
            return
        try:
            store.close()
        except StorageError as exc:  # a handle with a write error fails its final flush: expected
            log.info("closing the failed store handle of %s: %s", self.path, exc)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Close; a failed store is recovered first if the disk has room, else what it could
        not write is reported (none of it was confirmed) and the handle released."""
        if self.failure is not None and self.redo:
            if _free_bytes(self.path) >= self.recovery_bytes_needed():
                self.recover()
            if self.failure is not None:
                log.error(
                    "message store %s closes with %d writes not stored (none of them confirmed): %s",
                    self.path,
                    len(self._redo),
                    self.failure,
                )
        with self._lock:
            if self.failure is not None:
                self._release_handle()
                return
            store = self.__dict__.pop("_store", None)
            if store is None:
                return
            try:
                store.close()
            except StorageError as exc:
                log.error("message store %s: the final flush failed: %s", self.path, exc)

    def __repr__(self) -> str:
        return f"GuardedStore({self.__dict__.get('_store')!r}, failure={self.failure!r})"


class _Unreadable:
    """Stands in for a store that cannot be opened at all, until the next recovery attempt."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason

    def __getattr__(self, name: str) -> Any:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            if name == "close":
                return None
            raise StorageError(f"store {self.path} cannot be opened now: {self.reason}")

        return refuse


def _queues_of(op: _Op) -> list[int]:
    if op[0] == "r":
        return [op[1]]
    return list(dict.fromkeys([p[0] for p in op[1]] + [d[0] for d in op[2]]))


def _free_bytes(path: str) -> int:
    try:
        st = os.statvfs(path)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize
