"""Errors raised by the message stores.

Theory of operation: everything a store raises on purpose is a `StorageError`. Damage is a
`StoreCorruption` (the node must stop and an operator must look: the message names the store
folder and, for RocksDB's own errors, the file RocksDB complained about); damage found in one
record is its subclass `CorruptRecord`, which also names the queue and sequence number (or the
meta key). `except StoreCorruption` therefore catches both. Bad arguments (a negative queue id, a
sequence number above 2**64 - 1) are plain `ValueError`s: they are bugs in the caller, not states
of the disk.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of the errors the stores raise on purpose."""


class StoreClosed(StorageError):
    """The store was used after close()."""


class StoreLocked(StorageError):
    """Another open handle (in this or another process) holds the RocksDB folder's LOCK."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"store {path} is in use by another handle: {detail}")
        self.path = path
        self.detail = detail


class StoreCorruption(StorageError):
    """The store cannot be trusted: not a MaxQ RocksDB folder, or damaged (RocksDB's message is kept)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"store {path} is damaged or not a MaxQ store: {detail}")
        self.path = path
        self.detail = detail


class CorruptRecord(StoreCorruption):
    """One record failed its checksum (or has an impossible shape) when read back."""

    def __init__(
        self,
        path: str,
        detail: str,
        *,
        queue_id: int | None = None,
        seq: int | None = None,
        meta_key: str | None = None,
    ) -> None:
        where = f"meta key {meta_key!r}" if meta_key is not None else f"queue {queue_id} seq {seq}"
        # Skip StoreCorruption.__init__'s wording: this message names the record.
        StorageError.__init__(self, f"corrupt record in store {path}, {where}: {detail}")
        self.path = path
        self.detail = detail
        self.queue_id = queue_id
        self.seq = seq
        self.meta_key = meta_key


class StoreFailed(StorageError):
    """The store cannot write now (a write or an fsync failed: a full disk, an I/O error); nothing
    written since its last good fsync may be reported durable until it has recovered."""
