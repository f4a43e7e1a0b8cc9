"""The SegmentStore behaviour, run against MemorySegmentStore and RocksSegmentStore (with and
without a WAL) through the `store` fixture: the same inputs must give the same answers."""

from __future__ import annotations

import random

import pytest

from maxq_raft.storage import (
    U64_MAX,
    CorruptRecord,
    MemorySegmentStore,
    RocksSegmentStore,
    SegmentStore,
    StoreClosed,
    pack_key,
)
from maxq_raft.storage.records import encode_value


def all_records(store, queue_id):
    return store.scan(queue_id, 0, 1_000_000)


def test_implements_the_protocol(store):
    assert isinstance(store, SegmentStore)


def test_put_get(store):
    big = bytes(range(256)) * 256  # 64 KiB
    store.put_batch([(1, 0, b"a"), (1, 1, b""), (1, 2, big), (1, 3, bytearray(b"ba")), (1, 4, memoryview(b"mv"))])
    assert store.get(1, 0) == b"a"
    assert store.get(1, 1) == b""
    assert store.get(1, 2) == big
    assert store.get(1, 3) == b"ba"
    assert store.get(1, 4) == b"mv"
    assert store.get(1, 5) is None
    assert store.get(2, 0) is None


def test_empty_batch_is_a_no_op(store):
    store.put_batch([])
    store.delete(1, [])
    assert store.queue_ids() == []


def test_last_write_in_a_batch_wins(store):
    store.put_batch([(1, 5, b"first"), (1, 5, b"second")])
    store.put_batch([(1, 6, b"x")])
    store.put_batch([(1, 6, b"y")])
    assert store.scan(1, 0, 10) == [(5, b"second"), (6, b"y")]


def test_scan_is_ascending_whatever_the_write_order(store):
    seqs = list(range(200))
    random.Random(7).shuffle(seqs)
    for start in range(0, 200, 50):
        store.put_batch([(4, seq, b"%d" % seq) for seq in seqs[start : start + 50]])
    assert all_records(store, 4) == [(seq, b"%d" % seq) for seq in range(200)]


def test_scan_from_and_limit(store):
    store.put_batch([(1, seq, b"r%d" % seq) for seq in range(0, 100, 10)])
    assert store.scan(1, 0, 3) == [(0, b"r0"), (10, b"r10"), (20, b"r20")]
    assert store.scan(1, 15, 2) == [(20, b"r20"), (30, b"r30")]
    assert store.scan(1, 90, 10) == [(90, b"r90")]
    assert store.scan(1, 91, 10) == []
    assert store.scan(1, 0, 0) == []
    assert store.scan(2, 0, 10) == []
    with pytest.raises(ValueError):
        store.scan(1, 0, -1)


def test_queues_never_bleed_into_each_other(store):
    # Adjacent key ranges: the last possible key of queue 1 is right before queue 2's first.
    store.put_batch(
        [
            (0, U64_MAX, b"q0-last"),
            (1, 0, b"q1-first"),
            (1, U64_MAX, b"q1-last"),
            (2, 0, b"q2-first"),
            (2, 1, b"q2-second"),
            (U64_MAX, 0, b"qmax"),
        ]
    )
    assert all_records(store, 1) == [(0, b"q1-first"), (U64_MAX, b"q1-last")]
    assert store.scan(1, 1, 10) == [(U64_MAX, b"q1-last")]
    assert all_records(store, 2) == [(0, b"q2-first"), (1, b"q2-second")]
    assert all_records(store, 0) == [(U64_MAX, b"q0-last")]
    assert all_records(store, U64_MAX) == [(0, b"qmax")]
    assert store.bounds(1) == (0, U64_MAX)
    assert store.bounds(0) == (U64_MAX, U64_MAX)
    assert store.bounds(2) == (0, 1)
    assert store.bounds(3) is None
    assert store.queue_ids() == [0, 1, 2, U64_MAX]
    store.delete_range(1, 0, U64_MAX + 1)
    assert store.bounds(1) is None
    assert store.bounds(0) == (U64_MAX, U64_MAX) and store.bounds(2) == (0, 1)
    assert store.queue_ids() == [0, 2, U64_MAX]


def test_delete_points(store):
    store.put_batch([(1, seq, b"x") for seq in range(10)])
    store.delete(1, [0, 3, 9, 50])  # 50 is absent: ignored
    store.delete(2, [1])  # absent queue: ignored
    assert [seq for seq, _ in all_records(store, 1)] == [1, 2, 4, 5, 6, 7, 8]
    assert store.bounds(1) == (1, 8)
    assert store.get(1, 3) is None
    store.delete(1, [0, 3])  # deleting twice is fine: effects may be performed twice
    assert store.bounds(1) == (1, 8)


def test_delete_range(store):
    store.put_batch([(1, seq, b"x") for seq in range(100)] + [(2, seq, b"y") for seq in range(5)])
    store.delete_range(1, 0, 10)  # an acked prefix
    assert store.bounds(1) == (10, 99)
    store.delete_range(1, 50, 60)  # a hole
    assert [seq for seq, _ in all_records(store, 1)] == [*range(10, 50), *range(60, 100)]
    store.delete_range(1, 95, U64_MAX + 1)  # the tail, to the end of the key space
    assert store.bounds(1) == (10, 94)
    store.delete_range(1, 30, 30)  # empty range: nothing
    assert store.get(1, 30) == b"x"
    store.delete_range(1, 0, 10)  # again: nothing left there, no error
    with pytest.raises(ValueError):
        store.delete_range(1, 20, 10)
    with pytest.raises(ValueError):
        store.delete_range(1, 0, U64_MAX + 2)
    assert store.bounds(2) == (0, 4)


def test_bounds_follow_deletes_to_empty(store):
    store.put_batch([(5, seq, b"m") for seq in (3, 4, 5, 6)])
    assert store.bounds(5) == (3, 6)
    store.delete(5, [3])
    assert store.bounds(5) == (4, 6)
    store.delete(5, [6])
    assert store.bounds(5) == (4, 5)
    store.delete_range(5, 0, 5)
    assert store.bounds(5) == (5, 5)
    store.delete(5, [5])
    assert store.bounds(5) is None
    assert store.queue_ids() == []
    store.put_batch([(5, 2, b"again")])  # below the old head: a queue may be refilled
    assert store.bounds(5) == (2, 2)


def test_drop_queue(store):
    store.put_batch([(q, seq, b"%d" % q) for q in (1, 2, 3) for seq in range(20)])
    store.drop_queue(2)
    store.drop_queue(9)  # absent: nothing
    assert store.queue_ids() == [1, 3]
    assert store.bounds(2) is None and all_records(store, 2) == []
    assert store.bounds(1) == (0, 19) and store.bounds(3) == (0, 19)


def test_queue_ids(store):
    ids = [U64_MAX, 0, 7, 1 << 32, 8]
    store.put_batch([(q, seq, b"") for q in ids for seq in range(3)])
    assert store.queue_ids() == sorted(ids)


def test_meta_is_its_own_key_space(store):
    assert store.get_meta("snapshot") is None
    store.put_meta("snapshot", b"state-1")
    store.put_meta("snapshot", b"state-2")
    store.put_meta("é/ключ", b"")
    store.put_meta("", b"empty key")
    assert store.get_meta("snapshot") == b"state-2"
    assert store.get_meta("é/ключ") == b""
    assert store.get_meta("") == b"empty key"
    # A meta key spelling out a message key's bytes does not touch queues, and vice versa.
    store.put_meta(pack_key(0, 0).decode("latin-1"), b"meta")
    assert store.queue_ids() == [] and store.bounds(0) is None
    store.put_batch([(0, 0, b"message")])
    assert store.get_meta(pack_key(0, 0).decode("latin-1")) == b"meta"
    assert store.get(0, 0) == b"message"
    with pytest.raises(ValueError):
        store.put_meta(b"bytes", b"x")


@pytest.mark.parametrize("bad", [-1, U64_MAX + 1, 1.0, "1", None])
def test_ids_out_of_range_are_rejected_before_any_write(store, bad):
    with pytest.raises((ValueError, TypeError)):
        store.put_batch([(1, 1, b"good"), (bad, 1, b"bad")])
    with pytest.raises((ValueError, TypeError)):
        store.put_batch([(1, 2, b"good"), (1, bad, b"bad")])
    assert store.get(1, 1) is None and store.get(1, 2) is None
    for call in (
        lambda: store.get(bad, 0),
        lambda: store.get(0, bad),
        lambda: store.scan(bad, 0, 1),
        lambda: store.bounds(bad),
        lambda: store.delete(1, [bad]),
        lambda: store.delete_range(bad, 0, 1),
        lambda: store.drop_queue(bad),
    ):
        with pytest.raises((ValueError, TypeError)):
            call()


def test_delete_with_a_bad_seq_deletes_nothing(store):
    store.put_batch([(1, 1, b"x")])
    with pytest.raises(ValueError):
        store.delete(1, [1, -5])
    assert store.get(1, 1) == b"x"


def test_flush_then_everything_still_readable(store):
    store.put_batch([(1, seq, b"x%d" % seq) for seq in range(50)])
    store.put_meta("m", b"v")
    store.flush()
    assert len(all_records(store, 1)) == 50 and store.get_meta("m") == b"v"


def test_closed_store_refuses_calls(store):
    store.close()
    store.close()  # idempotent
    for call in (
        lambda: store.get(1, 1),
        lambda: store.put_batch([(1, 1, b"")]),
        lambda: store.scan(1, 0, 1),
        lambda: store.bounds(1),
        lambda: store.queue_ids(),
        lambda: store.get_meta("m"),
        lambda: store.flush(),
    ):
        with pytest.raises(StoreClosed):
            call()


def _write_raw(store, queue_id, seq, value):
    """Put `value` under a valid key bypassing the checksum (the store's own handle, privately)."""
    if isinstance(store, MemorySegmentStore):
        store._queues[queue_id].records[seq] = value
    else:
        assert isinstance(store, RocksSegmentStore)
        store._db.put(pack_key(queue_id, seq), value)


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-key"])
def test_get_and_scan_verify_checksums(store, damage):
    store.put_batch([(3, seq, b"body-%d" % seq) for seq in range(40, 45)])
    good = encode_value(pack_key(3, 42), b"body-42")
    bad = {
        "flip": good[:6] + bytes([good[6] ^ 0x10]) + good[7:],
        "truncate": good[:3],
        "other-key": encode_value(pack_key(3, 43), b"body-42"),
    }[damage]
    _write_raw(store, 3, 42, bad)
    with pytest.raises(CorruptRecord) as caught:
        store.get(3, 42)
    assert (caught.value.queue_id, caught.value.seq) == (3, 42)
    assert store.path in str(caught.value) and "queue 3 seq 42" in str(caught.value)
    with pytest.raises(CorruptRecord, match="queue 3 seq 42"):
        store.scan(3, 40, 10)
    assert store.get(3, 41) == b"body-41"  # the neighbours are fine
    assert store.scan(3, 43, 10) == [(43, b"body-43"), (44, b"body-44")]
    assert store.bounds(3) == (40, 44)  # bounds reads keys only


def test_get_meta_verifies_checksums(store):
    store.put_meta("snap", b"good")
    if isinstance(store, MemorySegmentStore):
        store._meta["snap"] = b"\x00\x00\x00\x00good"
    else:
        store._meta.put(b"snap", b"\x00\x00\x00\x00good")
    with pytest.raises(CorruptRecord, match="meta key 'snap'") as caught:
        store.get_meta("snap")
    assert caught.value.meta_key == "snap"


def test_write_is_one_batch_of_puts_deletes_and_meta(store):
    store.write([(7, 0, b"a"), (7, 1, b"b"), (8, 0, b"c")], [], {"counters/7": b"\x02", "gone": b"x"}, wal=True)
    store.write([(7, 2, b"d")], [(7, 0), (8, 0)], {"counters/7": b"\x01", "gone": None}, wal=False)
    store.sync_wal()
    assert store.scan(7, 0, 10) == [(1, b"b"), (2, b"d")]
    assert store.bounds(8) is None
    assert store.get_meta("counters/7") == b"\x01"
    assert store.get_meta("gone") is None
