"""Key layout and the checksummed record format shared by every store.

Theory of operation: a message is addressed by (queue_id, seq), both u64. Its key is
`queue_id (8 bytes big-endian) ‖ seq (8 bytes big-endian)`, so byte order of keys is
(queue, then sequence) order and one queue's messages are one contiguous key range:
`queue_start_key(q) <= key < queue_end_key(q)`. The stored value is
`crc32(key ‖ record) (4 bytes big-endian) ‖ record`. Covering the key as well as the record
means a value that ends up under the wrong key (a bug, a misdirected write) fails the check
just like flipped bits do. Writers call `encode_value`; readers call `decode_value` and, only
on failure, `describe_damage` to say what is wrong. Meta values use the same format with the
UTF-8 meta key in place of the message key.
"""

from __future__ import annotations

import struct
from zlib import crc32

U64_MAX = (1 << 64) - 1
KEY_SIZE_BYTES = 16
CHECKSUM_SIZE_BYTES = 4

_KEY = struct.Struct(">QQ")
_PREFIX = struct.Struct(">Q")
_CHECKSUM = struct.Struct(">I")
# 9 bytes of 0xff after an 8-byte prefix: longer than any 16-byte key of that queue whose
# first 16 bytes it equals or exceeds, and smaller than every key of the next queue.
_END_SUFFIX = b"\xff" * 9


def pack_key(queue_id: int, seq: int) -> bytes:
    """The 16-byte key of message `seq` of queue `queue_id`."""
    try:
        return _KEY.pack(queue_id, seq)
    except struct.error:
        raise ValueError(f"queue id {queue_id!r} and seq {seq!r} must be integers in [0, 2**64)") from None


def unpack_key(key: bytes) -> tuple[int, int]:
    """(queue_id, seq) of a 16-byte key; the caller checks the length first."""
    return _KEY.unpack(key)


def queue_start_key(queue_id: int) -> bytes:
    """The smallest key of a queue (its seq 0)."""
    return pack_key(queue_id, 0)


def queue_prefix(queue_id: int) -> bytes:
    """The 8-byte prefix shared by every key of a queue."""
    try:
        return _PREFIX.pack(queue_id)
    except struct.error:
        raise ValueError(f"queue id {queue_id!r} must be an integer in [0, 2**64)") from None


def queue_end_key(queue_id: int) -> bytes:
    """An exclusive upper bound for a queue's keys: above (queue_id, 2**64-1), below (queue_id+1, 0)."""
    return queue_prefix(queue_id) + _END_SUFFIX


def range_end_key(queue_id: int, seq_to_exclusive: int) -> bytes:
    """Exclusive end key for seqs below `seq_to_exclusive`, which may be 2**64 (the whole tail)."""
    if seq_to_exclusive == U64_MAX + 1:
        return queue_end_key(queue_id)
    return pack_key(queue_id, seq_to_exclusive)


def check_u64(name: str, value: int, *, inclusive_max: int = U64_MAX) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= inclusive_max:
        raise ValueError(f"{name} {value!r} must be an integer in [0, {inclusive_max}]")


def encode_value(key: bytes, record: bytes) -> bytes:
    """checksum ‖ record, the checksum being crc32 over key then record."""
    return _CHECKSUM.pack(crc32(record, crc32(key))) + record


def decode_value(key: bytes, value: bytes) -> bytes | None:
    """The record inside `value` if its checksum matches `key` and the record; None otherwise."""
    if len(value) < CHECKSUM_SIZE_BYTES:
        return None
    record = value[CHECKSUM_SIZE_BYTES:]
    if crc32(record, crc32(key)) != _CHECKSUM.unpack_from(value)[0]:
        return None
    return record


def describe_damage(key: bytes, value: bytes) -> str:
    """What is wrong with a value that decode_value rejected (the slow path, for messages)."""
    if len(value) < CHECKSUM_SIZE_BYTES:
        return f"value is {len(value)} bytes, shorter than its {CHECKSUM_SIZE_BYTES}-byte checksum"
    record = value[CHECKSUM_SIZE_BYTES:]
    stored = _CHECKSUM.unpack_from(value)[0]
    computed = crc32(record, crc32(key))
    return (
        f"checksum mismatch: stored {stored:#010x}, computed {computed:#010x} "
        f"over the {len(key)}-byte key and {len(record)} record bytes"
    )
