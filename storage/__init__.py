"""Message storage for MaxQ-Raft (installed as `maxq_raft.storage`).

Theory of operation: the queue machines keep counters, each queue's head window and what is in
flight in memory; message bodies live in a `SegmentStore` (segment_store.py), so memory does not
grow with queue depth (docs/design.md §5). A message is addressed by (queue_id, seq), both u64, under
the key `queue_id ‖ seq` in big-endian, so key order is queue order and one queue is one key
range: appends are batched writes, acked prefixes are one `delete_range`, and start-up finds each
queue's extent with a couple of seeks (`queue_ids`, `bounds`) whatever its depth. Small state such
as snapshots lives in a separate meta key space (`put_meta`/`get_meta`).

Every record is stored as crc32(key ‖ record) ‖ record (records.py) and verified on every read: a
mismatch raises `CorruptRecord` naming the store, queue and seq, and damage RocksDB finds itself
raises `StoreCorruption` with RocksDB's message; either must stop the node, never be skipped.
`flush()` is the durability point (rocks.py explains the WAL / no-WAL modes).

Two implementations: `MemorySegmentStore` (memory.py: tests and transient queues) and
`RocksSegmentStore` (rocks.py: rocksdict in raw mode), with `verify(path)` to check a RocksDB
store offline. This package imports only the standard library and rocksdict.
"""

from .errors import CorruptRecord, StorageError, StoreClosed, StoreCorruption, StoreLocked
from .memory import MemorySegmentStore
from .records import U64_MAX, pack_key, unpack_key
from .rocks import RocksSegmentStore, verify
from .segment_store import SegmentStore

__all__ = [
    "CorruptRecord",
    "MemorySegmentStore",
    "RocksSegmentStore",
    "SegmentStore",
    "StorageError",
    "StoreClosed",
    "StoreCorruption",
    "StoreLocked",
    "U64_MAX",
    "pack_key",
    "unpack_key",
    "verify",
]
