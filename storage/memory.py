"""MemorySegmentStore: the SegmentStore semantics in process memory (tests, transient queues).

Theory of operation: each queue is a `_Queue` holding `records` (seq -> checksummed value, the
same bytes RocksSegmentStore would store) and `seqs`, a sorted list of seqs that may still name
deleted ones ("stale" entries), with `head` the index of the first entry not known to be stale.
Appends (the common case: seqs increase) are list appends; an acked prefix (`delete_range` from
the head) only moves `head`; point deletes only drop the record. Stale entries are dropped in
bulk once they outnumber the live ones, so every operation is amortised O(1) per record touched
and `bounds` is O(1) amortised, like RocksDB's seeks. A queue with no records is removed, so
`queue_ids` lists exactly the queues holding something, as a RocksDB key scan would.

Checksums are computed and verified exactly as on disk, so a test that corrupts a stored value
(`_queues[q].records[seq] = ...`) sees the same CorruptRecord as on RocksDB. `put_batch` and
`delete` validate every item before changing anything, so a bad item leaves the store untouched.
Additions beyond the SegmentStore protocol: `path` (for messages), `check_invariants()` (tests)
and context-manager use.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import pairwise

from .errors import CorruptRecord, StoreClosed
from .records import (
    U64_MAX,
    check_u64,
    decode_value,
    describe_damage,
    encode_value,
    pack_key,
)

# Stale entries tolerated in a queue's `seqs` beyond its live record count before a rebuild.
_STALE_SLACK = 64


class _Queue:
    __slots__ = ("records", "seqs", "head")

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.seqs: list[int] = []  # strictly ascending; a superset of records' keys from `head` on
        self.head = 0

    def put(self, seq: int, value: bytes) -> None:
        records = self.records
        if seq not in records:
            seqs = self.seqs
            if not seqs or seq > seqs[-1]:
                seqs.append(seq)
            else:
                # Out of order (rare): make seqs[:head] disappear so bisect sees only candidates.
                if self.head:
                    del seqs[: self.head]
                    self.head = 0
                i = bisect_left(seqs, seq)
                if i == len(seqs) or seqs[i] != seq:  # else a stale entry comes back to life
                    seqs.insert(i, seq)
        records[seq] = value

    def delete_range(self, seq_from: int, seq_to_exclusive: int) -> None:
        seqs, records = self.seqs, self.records
        i = bisect_left(seqs, seq_from, self.head)
        j = bisect_left(seqs, seq_to_exclusive, i)
        for k in range(i, j):
            records.pop(seqs[k], None)
        if i == self.head:
            self.head = j  # an acked prefix: O(1) on the list
        else:
            del seqs[i:j]

    def tidy(self) -> None:
        """Drop stale entries in bulk once they outweigh the live ones (amortised O(1))."""
        seqs, records = self.seqs, self.records
        if self.head > _STALE_SLACK and self.head * 2 > len(seqs):
            del seqs[: self.head]
            self.head = 0
        if len(seqs) - self.head > 2 * len(records) + _STALE_SLACK:
            self.seqs = [s for s in seqs[self.head :] if s in records]
            self.head = 0

    def bounds(self) -> tuple[int, int]:
        seqs, records = self.seqs, self.records
        assert records, "empty queues are removed"
        while seqs[self.head] not in records:
            self.head += 1
        while seqs[-1] not in records:
            seqs.pop()
        return seqs[self.head], seqs[-1]


class MemorySegmentStore:
    """A dict-based SegmentStore; `name` only labels error messages."""

    def __init__(self, name: str = "memory") -> None:
        self.path = f"<memory:{name}>"
        self._queues: dict[int, _Queue] = {}
        self._meta: dict[str, bytes] = {}
        self._closed = False

    # -- messages --------------------------------------------------------------------------

    def put_batch(self, items: Iterable[tuple[int, int, bytes]]) -> None:
        self._check_open()
        encoded = []
        for queue_id, seq, record in items:
            key = pack_key(queue_id, seq)
            encoded.append((queue_id, seq, encode_value(key, record)))
        queues = self._queues
        for queue_id, seq, value in encoded:
            queue = queues.get(queue_id)
            if queue is None:
                queue = queues[queue_id] = _Queue()
            queue.put(seq, value)

    def get(self, queue_id: int, seq: int) -> bytes | None:
        self._check_open()
        key = pack_key(queue_id, seq)
        queue = self._queues.get(queue_id)
        value = None if queue is None else queue.records.get(seq)
        if value is None:
            return None
        return self._verified(key, value, queue_id, seq)

    def scan(self, queue_id: int, seq_from: int, limit: int) -> list[tuple[int, bytes]]:
        self._check_open()
        pack_key(queue_id, seq_from)
        _check_limit(limit)
        queue = self._queues.get(queue_id)
        out: list[tuple[int, bytes]] = []
        if queue is None or limit == 0:
            return out
        seqs, records = queue.seqs, queue.records
        k = bisect_left(seqs, seq_from, queue.head)
        end = len(seqs)
        while k < end and len(out) < limit:  # stale entries are bounded by tidy()
            seq = seqs[k]
            value = records.get(seq)
            if value is not None:
                out.append((seq, self._verified(pack_key(queue_id, seq), value, queue_id, seq)))
            k += 1
        return out

    def delete(self, queue_id: int, seqs: Iterable[int]) -> None:
        self._check_open()
        seqs = list(seqs)
        for seq in seqs:  # validate all before changing any
            pack_key(queue_id, seq)
        queue = self._queues.get(queue_id)
        if queue is None:
            return
        for seq in seqs:
            queue.records.pop(seq, None)
        self._after_delete(queue_id, queue)

    def delete_range(self, queue_id: int, seq_from: int, seq_to_exclusive: int) -> None:
        self._check_open()
        pack_key(queue_id, seq_from)
        check_u64("seq_to_exclusive", seq_to_exclusive, inclusive_max=U64_MAX + 1)
        if seq_from > seq_to_exclusive:
            raise ValueError(f"delete_range: seq_from {seq_from} > seq_to_exclusive {seq_to_exclusive}")
        queue = self._queues.get(queue_id)
        if queue is None or seq_from == seq_to_exclusive:
            return
        queue.delete_range(seq_from, seq_to_exclusive)
        self._after_delete(queue_id, queue)

    def bounds(self, queue_id: int) -> tuple[int, int] | None:
        self._check_open()
        check_u64("queue id", queue_id)
        queue = self._queues.get(queue_id)
        return None if queue is None else queue.bounds()

    def drop_queue(self, queue_id: int) -> None:
        self._check_open()
        check_u64("queue id", queue_id)
        self._queues.pop(queue_id, None)

    def queue_ids(self) -> list[int]:
        self._check_open()
        return sorted(self._queues)

    def write(
        self,
        puts: Iterable[tuple[int, int, bytes]],
        deletes: Iterable[tuple[int, int]],
        meta: dict[str, bytes | None] | None,
        *,
        wal: bool = True,
    ) -> None:
        """Puts, deletes and meta changes (None deletes a key) at once; `wal` means nothing here."""
        self._check_open()
        deletes = list(deletes)
        for queue_id, seq in deletes:
            pack_key(queue_id, seq)
        for key in meta or ():
            _meta_key_bytes(key)
        self.put_batch(puts)
        by_queue: dict[int, list[int]] = {}
        for queue_id, seq in deletes:
            by_queue.setdefault(queue_id, []).append(seq)
        for queue_id, seqs in by_queue.items():
            self.delete(queue_id, seqs)
        for key, value in (meta or {}).items():
            if value is None:
                self._meta.pop(key, None)
            else:
                self.put_meta(key, value)

    def sync_wal(self) -> None:
        self._check_open()

    # -- meta ------------------------------------------------------------------------------

    def put_meta(self, key: str, value: bytes) -> None:
        self._check_open()
        self._meta[key] = encode_value(_meta_key_bytes(key), value)

    def get_meta(self, key: str) -> bytes | None:
        self._check_open()
        key_bytes = _meta_key_bytes(key)
        stored = self._meta.get(key)
        if stored is None:
            return None
        value = decode_value(key_bytes, stored)
        if value is None:
            raise CorruptRecord(self.path, describe_damage(key_bytes, stored), meta_key=key)
        return value

    # -- lifecycle -------------------------------------------------------------------------

    def flush(self) -> None:
        self._check_open()

    def close(self) -> None:
        self._closed = True

    def __repr__(self) -> str:
        return f"MemorySegmentStore({self.path!r}, queues={len(self._queues)})"

    def __enter__(self) -> MemorySegmentStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def check_invariants(self) -> None:
        """For tests: the structure is consistent and every record passes its checksum."""
        for queue_id, queue in self._queues.items():
            assert queue.records, f"queue {queue_id} is empty but listed"
            live = queue.seqs[queue.head :]
            assert all(a < b for a, b in pairwise(queue.seqs)), f"queue {queue_id}: seqs unsorted"
            assert set(queue.records) <= set(live), f"queue {queue_id}: a record is missing from seqs"
            for seq, value in queue.records.items():
                self._verified(pack_key(queue_id, seq), value, queue_id, seq)

    # -- helpers ---------------------------------------------------------------------------

    def _verified(self, key: bytes, value: bytes, queue_id: int, seq: int) -> bytes:
        record = decode_value(key, value)
        if record is None:
            raise CorruptRecord(self.path, describe_damage(key, value), queue_id=queue_id, seq=seq)
        return record

    def _after_delete(self, queue_id: int, queue: _Queue) -> None:
        if not queue.records:
            del self._queues[queue_id]
        else:
            queue.tidy()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed(f"store {self.path} is closed")


def _check_limit(limit: int) -> None:
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"scan limit {limit!r} must be a non-negative integer")


def _meta_key_bytes(key: str) -> bytes:
    if not isinstance(key, str):
        raise ValueError(f"meta key {key!r} must be a str")
    return key.encode("utf-8")
