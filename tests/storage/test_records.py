"""Key layout and record checksums: key order is (queue, seq) order, queue ranges do not overlap,
and any damage to a stored value, or a value under the wrong key, fails the check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.storage.records import (
    U64_MAX,
    decode_value,
    describe_damage,
    encode_value,
    pack_key,
    queue_end_key,
    queue_start_key,
    range_end_key,
    unpack_key,
)

u64 = st.one_of(st.integers(0, U64_MAX), st.sampled_from([0, 1, 255, 256, U64_MAX - 1, U64_MAX]))


@given(u64, u64, u64, u64)
def test_key_order_is_queue_then_seq_order(q1, s1, q2, s2):
    assert (pack_key(q1, s1) < pack_key(q2, s2)) == ((q1, s1) < (q2, s2))
    assert unpack_key(pack_key(q1, s1)) == (q1, s1)


@given(u64, u64)
def test_queue_range_holds_exactly_its_keys(queue_id, seq):
    key = pack_key(queue_id, seq)
    assert queue_start_key(queue_id) <= key < queue_end_key(queue_id)
    if queue_id < U64_MAX:
        assert queue_end_key(queue_id) < queue_start_key(queue_id + 1)
    assert range_end_key(queue_id, U64_MAX + 1) == queue_end_key(queue_id)


@pytest.mark.parametrize("queue_id, seq", [(-1, 0), (0, -1), (U64_MAX + 1, 0), (0, U64_MAX + 1), (0.5, 0), ("1", 0)])
def test_out_of_range_ids_are_value_errors(queue_id, seq):
    with pytest.raises(ValueError):
        pack_key(queue_id, seq)


@given(st.binary(max_size=300), u64, u64)
def test_roundtrip(record, queue_id, seq):
    key = pack_key(queue_id, seq)
    assert decode_value(key, encode_value(key, record)) == record


@given(st.binary(max_size=300), st.data())
def test_any_single_bit_flip_is_detected(record, data):
    key = pack_key(3, 42)
    value = bytearray(encode_value(key, record))
    bit = data.draw(st.integers(0, len(value) * 8 - 1))
    value[bit // 8] ^= 1 << (bit % 8)
    assert decode_value(key, bytes(value)) is None  # crc32 catches every single-bit error
    assert "checksum mismatch" in describe_damage(key, bytes(value))


def test_value_under_the_wrong_key_is_detected():
    value = encode_value(pack_key(1, 7), b"body")
    assert decode_value(pack_key(1, 8), value) is None
    assert decode_value(pack_key(2, 7), value) is None


@pytest.mark.parametrize("value", [b"", b"\x00", b"\x01\x02\x03"])
def test_truncated_value_is_detected(value):
    key = pack_key(1, 1)
    assert decode_value(key, value) is None
    assert "shorter than its 4-byte checksum" in describe_damage(key, value)
