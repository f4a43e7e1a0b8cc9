"""The SegmentStore interface: what the queue machines' shell needs from message storage.

Theory of operation: the queue machines keep counters, the head window and what is in flight in
memory (docs/design.md §5); message bodies of deep queues live in a SegmentStore. A queue is a
`queue_id` (u64, chosen by the metadata layer) and its messages are `seq`s (u64, increasing per
queue). The shell appends with `put_batch` (one batched write per batch of publishes), refills
its head window with `scan`, removes acked messages with `delete_range` (acked prefixes: one
range tombstone whatever the size) or `delete` (acks out of order), and on start-up finds each
queue's extent with `queue_ids` and `bounds`, which seek and never walk a queue, so start-up time
does not grow with depth. Small state (snapshots) goes to `put_meta`, a key space apart from the
queues'.

Every record carries a checksum over its key and bytes (records.py); `get` and `scan` verify it
and raise `CorruptRecord` naming the store, queue and seq: the write side computes, the read side
checks. `flush()` is the durability point: when it returns, everything written before it
survives a crash of the process and of the machine. Until then it depends on the implementation
(RocksSegmentStore documents its modes). All operations are idempotent where that makes sense
(deleting what is absent is not an error), because effects may be performed twice.

A store is owned by one thread at a time; it is not safe to call concurrently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable


@runtime_checkable
class SegmentStore(Protocol):
    def put_batch(self, items: Iterable[tuple[int, int, bytes]]) -> None:
        """Write (queue_id, seq, record) items as one atomic batch; a later item with the same
        (queue_id, seq) wins. Nothing is written if an item is invalid (ValueError)."""
        ...

    def get(self, queue_id: int, seq: int) -> bytes | None:
        """The record, or None if absent. Raises CorruptRecord if it fails its checksum."""
        ...

    def scan(self, queue_id: int, seq_from: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` (seq, record) pairs of one queue with seq >= seq_from, ascending."""
        ...

    def delete(self, queue_id: int, seqs: Iterable[int]) -> None:
        """Remove these seqs (absent ones are ignored) in one batch."""
        ...

    def delete_range(self, queue_id: int, seq_from: int, seq_to_exclusive: int) -> None:
        """Remove seq_from <= seq < seq_to_exclusive (which may be 2**64); O(1) whatever the size."""
        ...

    def bounds(self, queue_id: int) -> tuple[int, int] | None:
        """(first seq, last seq) present, or None if the queue holds nothing. Found by seeking."""
        ...

    def drop_queue(self, queue_id: int) -> None:
        """Remove every record of a queue."""
        ...

    def queue_ids(self) -> list[int]:
        """Ascending ids of the queues that hold at least one record (one seek per queue)."""
        ...

    def put_meta(self, key: str, value: bytes) -> None:
        """Store a small value under `key` in the meta key space (apart from queue keys)."""
        ...

    def get_meta(self, key: str) -> bytes | None:
        """The meta value, or None. Raises CorruptRecord if it fails its checksum."""
        ...

    def flush(self) -> None:
        """Make everything written so far durable on disk (a no-op for memory stores)."""
        ...

    def close(self) -> None:
        """Flush and release the store; idempotent. Any later call raises StoreClosed."""
        ...


class WritableStore(SegmentStore, Protocol):
    """A SegmentStore with a batch write across messages and meta and a WAL sync: what
    GuardedStore wraps (RocksSegmentStore and MemorySegmentStore are both)."""

    path: str

    def write(
        self,
        puts: Iterable[tuple[int, int, bytes]],
        deletes: Iterable[tuple[int, int]],
        meta: dict[str, bytes | None] | None,
        *,
        wal: bool = True,
    ) -> None:
        """Puts, deletes and meta changes (None deletes a meta key) in one atomic write."""
        ...

    def sync_wal(self) -> None:
        """Make the writes so far survive a crash of the machine (fsync the WAL)."""
        ...
