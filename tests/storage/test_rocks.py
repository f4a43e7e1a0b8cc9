"""RocksSegmentStore specifics: persistence across reopen and crashes, start-up by seeks only on
a 1,000,000-record queue, and what happens to damaged or foreign folders (StoreCorruption,
CorruptRecord, verify())."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from rocksdict import Options, Rdict

from maxq_raft.storage import (
    U64_MAX,
    CorruptRecord,
    RocksSegmentStore,
    StorageError,
    StoreCorruption,
    StoreLocked,
    pack_key,
    verify,
)
from maxq_raft.storage.records import encode_value

SUBPROCESS_TIMEOUT_S = 60


def snapshot_of(store, queue_ids=None):
    """Everything a store holds, as plain data (bounded by the small test sizes)."""
    ids = store.queue_ids() if queue_ids is None else queue_ids
    return {q: (store.bounds(q), store.scan(q, 0, 100_000)) for q in ids}


def raw_db(path):
    """The folder opened with rocksdict directly, outside our code (all column families)."""
    return Rdict(str(path), Options(raw_mode=True))


def close_raw(db):
    meta = db.get_column_family("meta")
    meta.close()
    db.close()


# -- persistence ---------------------------------------------------------------------------------


@pytest.mark.parametrize("wal", [True, False])
def test_close_and_reopen_keeps_everything(tmp_path, wal):
    path = tmp_path / "store"
    with RocksSegmentStore(path, wal=wal) as store:
        store.put_batch([(q, seq, b"%d/%d" % (q, seq)) for q in (1, 2, U64_MAX) for seq in range(300)])
        store.delete_range(1, 0, 100)
        store.delete(2, [5, 6, 299])
        store.drop_queue(U64_MAX)
        store.put_meta("snapshot", b"raft-index=42")
        before = snapshot_of(store)
    with RocksSegmentStore(path, wal=wal) as store:
        assert snapshot_of(store) == before
        assert store.queue_ids() == [1, 2]
        assert store.bounds(1) == (100, 299) and store.bounds(2) == (0, 298)
        assert store.get_meta("snapshot") == b"raft-index=42"
    assert verify(path) == []


def test_reopen_with_a_million_records_seeks_instead_of_scanning(tmp_path):
    path = tmp_path / "store"
    record_count = 1_000_000
    with RocksSegmentStore(path, wal=False) as store:
        for start in range(0, record_count, 50_000):
            store.put_batch([(7, seq, b"m") for seq in range(start, start + 50_000)])
        store.put_batch([(q, 0, b"small") for q in (1, 3, 9, 1 << 40)])
    with RocksSegmentStore(path, wal=False) as store:
        moves = store.iterator_moves
        assert store.bounds(7) == (0, record_count - 1)
        assert store.iterator_moves - moves == 2  # one seek for the head, one for the tail

        moves = store.iterator_moves
        assert store.queue_ids() == [1, 3, 7, 9, 1 << 40]
        assert store.iterator_moves - moves == 1 + 5  # the first key, then one seek past each queue

        moves = store.iterator_moves
        assert store.bounds(8) is None
        assert store.iterator_moves - moves == 1

        store.delete_range(7, 0, 900_000)
        moves = store.iterator_moves
        assert store.bounds(7) == (900_000, record_count - 1)
        assert store.iterator_moves - moves == 2
        assert [seq for seq, _ in store.scan(7, 0, 3)] == [900_000, 900_001, 900_002]
    with RocksSegmentStore(path, wal=False) as store:
        assert store.bounds(7) == (900_000, record_count - 1)


CRASHING_WRITER = textwrap.dedent("""
    import os, sys
    from maxq_raft.storage import RocksSegmentStore
    store = RocksSegmentStore(sys.argv[1], wal=sys.argv[2] == "wal")
    store.put_batch([(1, seq, b"flushed-%d" % seq) for seq in range(100)])
    store.put_meta("snapshot", b"A")
    store.flush()
    store.put_batch([(1, seq, b"unflushed-%d" % seq) for seq in range(100, 200)])
    store.put_meta("snapshot", b"B")
    os._exit(0)  # no close(), no destructors: the process dies as under kill -9
""")


@pytest.mark.parametrize("mode", ["wal", "nowal"])
def test_crash_after_flush(tmp_path, mode):
    path = tmp_path / "store"
    subprocess.run(
        [sys.executable, "-c", CRASHING_WRITER, str(path), mode], check=True, cwd=tmp_path, timeout=SUBPROCESS_TIMEOUT_S
    )
    with RocksSegmentStore(path, wal=mode == "wal") as store:
        records = store.scan(1, 0, 1000)
        assert records[:100] == [(seq, b"flushed-%d" % seq) for seq in range(100)]
        if mode == "wal":
            # Every returned write is in the WAL (page cache): a process crash loses nothing.
            assert len(records) == 200 and store.get_meta("snapshot") == b"B"
        else:
            # Without a WAL, flush() is the durability point: what came after it is gone, and meta
            # is not newer than the messages.
            assert len(records) == 100 and store.get_meta("snapshot") == b"A"


def test_sync_writes(tmp_path):
    with pytest.raises(ValueError):
        RocksSegmentStore(tmp_path / "x", sync_writes=True, wal=False)
    with RocksSegmentStore(tmp_path / "store", sync_writes=True) as store:
        store.put_batch([(1, 1, b"synced")])
        assert store.get(1, 1) == b"synced"


def test_a_second_handle_is_refused(tmp_path):
    with RocksSegmentStore(tmp_path / "store"), pytest.raises(StoreLocked, match="store"):
        RocksSegmentStore(tmp_path / "store")


def test_compact_returns_deleted_space(tmp_path):
    with RocksSegmentStore(tmp_path / "store", wal=False) as store:
        store.put_batch([(1, seq, b"x" * 1024) for seq in range(5000)])
        store.flush()
        store.delete_range(1, 0, 5000)
        store.compact()
        assert store.bounds(1) is None
        sst_bytes = sum(e.stat().st_size for e in os.scandir(tmp_path / "store") if e.name.endswith(".sst"))
        assert sst_bytes < 1024 * 1024


# -- damage --------------------------------------------------------------------------------------


def test_bad_value_written_directly_is_caught_on_read_and_by_verify(tmp_path):
    path = tmp_path / "store"
    with RocksSegmentStore(path) as store:
        store.put_batch([(3, seq, b"body-%d" % seq) for seq in range(40, 50)])
    good = encode_value(pack_key(3, 42), b"body-42")
    db = raw_db(path)
    db[pack_key(3, 42)] = good[:8] + bytes([good[8] ^ 0xFF]) + good[9:]  # one flipped byte in the body
    close_raw(db)

    with RocksSegmentStore(path) as store:
        with pytest.raises(CorruptRecord) as caught:
            store.get(3, 42)
        error = caught.value
        assert (error.path, error.queue_id, error.seq) == (str(path), 3, 42)
        assert str(path) in str(error) and "queue 3 seq 42" in str(error) and "checksum mismatch" in str(error)
        with pytest.raises(CorruptRecord, match="queue 3 seq 42"):
            store.scan(3, 0, 100)
        assert store.get(3, 43) == b"body-43"

    problems = verify(path)
    assert len(problems) == 1 and "queue 3 seq 42" in problems[0] and str(path) in problems[0]


def test_verify_reports_meta_damage_and_odd_keys_and_bounds_its_output(tmp_path):
    path = tmp_path / "store"
    with RocksSegmentStore(path) as store:
        store.put_batch([(1, seq, b"ok") for seq in range(10)])
        store.put_meta("snapshot", b"good")
    db = raw_db(path)
    for seq in range(5):
        db[pack_key(1, seq)] = b"\x00\x00\x00\x00bad"
    db[b"short-key"] = b"whatever"
    db.get_column_family("meta")[b"snapshot"] = b"\x00"
    close_raw(db)

    problems = verify(path, problems_max=3)
    assert problems[:2] == [problems[0], problems[1]] and len(problems) == 4
    assert problems[-1] == "... and 4 more problems"
    everything = verify(path)
    assert len(everything) == 7
    assert sum("queue 1 seq" in p for p in everything) == 5
    assert any("is 9 bytes, message keys are 16" in p for p in everything)
    assert any("meta key 'snapshot'" in p for p in everything)

    with RocksSegmentStore(path) as store:
        with pytest.raises(CorruptRecord, match="meta key 'snapshot'"):
            store.get_meta("snapshot")
        with pytest.raises(StoreCorruption, match="is 9 bytes"):
            store.queue_ids()


def test_damaged_sst_file_is_reported_with_its_name(tmp_path):
    path = tmp_path / "store"
    with RocksSegmentStore(path, wal=False) as store:
        store.put_batch([(1, seq, bytes([seq % 251]) * 1024) for seq in range(300)])
    # the biggest SST holds the messages (the meta column family has its own, tiny one)
    sst = max((e for e in os.scandir(path) if e.name.endswith(".sst")), key=lambda e: e.stat().st_size).path
    with open(sst, "r+b") as f:  # clobber bytes inside the first data blocks
        f.seek(5000)
        f.write(b"\xaa" * 64)
    with RocksSegmentStore(path, wal=False) as store:
        # rocksdict's items() would just stop here; scan() must raise, naming the file.
        with pytest.raises(StoreCorruption, match=r"block checksum mismatch.*\.sst") as caught:
            store.scan(1, 0, 300)
        assert str(path) in str(caught.value)
        with pytest.raises(StoreCorruption, match=r"\.sst"):
            store.get(1, 3)
        with pytest.raises(StoreCorruption, match=r"\.sst"):
            store.bounds(1)
    problems = verify(path)
    assert problems and ".sst" in problems[-1]


def test_garbage_folder_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "garbage"
    path.mkdir()
    (path / "notes.txt").write_bytes(os.urandom(300))
    (path / "000001.sst").write_bytes(os.urandom(300))
    with pytest.raises(StoreCorruption) as caught:
        RocksSegmentStore(path)
    assert str(path) in str(caught.value) and "no CURRENT file" in str(caught.value)
    assert sorted(os.listdir(path)) == ["000001.sst", "notes.txt"]  # nothing created among them
    assert len(verify(path)) == 1 and "no CURRENT file" in verify(path)[0]


def test_a_creation_that_did_not_finish_is_started_over(tmp_path, caplog):
    # What a store created on a disk whose fsync failed left behind (seen in a cluster test):
    # RocksDB's LOCK and LOG and rocksdict's config, no CURRENT. Nothing was ever stored in it.
    path = tmp_path / "store"
    path.mkdir()
    for name in ("LOCK", "LOG", "rocksdict-config.json", "MANIFEST-000001", "000001.dbtmp"):
        (path / name).write_bytes(b"x")
    assert verify(path) == [f"store {path}: no store here (a creation that did not finish; a start creates it again)"]
    assert len(os.listdir(path)) == 5  # verify changes nothing
    with caplog.at_level("WARNING", logger="maxq.storage"), RocksSegmentStore(path) as store:
        store.put_batch([(1, 1, b"after")])
        store.flush()
    assert "a creation that did not finish" in caplog.text
    with RocksSegmentStore(path) as store:
        assert [body for _, body in store.scan(1, 0, 10)] == [b"after"]


def test_a_folder_without_current_but_with_what_only_an_open_writes_is_refused(tmp_path):
    # tables, write-ahead logs, a MANIFEST after the first, OPTIONS: that store was opened once
    for leftover in ("000004.log", "000007.sst", "MANIFEST-000005", "OPTIONS-000007", "LOG\n"):
        path = tmp_path / leftover
        path.mkdir()
        (path / "LOCK").write_bytes(b"")
        (path / leftover).write_bytes(os.urandom(100))
        with pytest.raises(StoreCorruption, match="no CURRENT file"):
            RocksSegmentStore(path)
        assert sorted(os.listdir(path)) == sorted(["LOCK", leftover])


def test_garbage_current_file(tmp_path):
    path = tmp_path / "store"
    RocksSegmentStore(path).close()
    (path / "CURRENT").write_bytes(b"\x00garbage\n")
    with pytest.raises(StoreCorruption) as caught:
        RocksSegmentStore(path)
    assert str(path) in str(caught.value) and "RocksDB cannot open it" in str(caught.value)
    assert verify(path) and str(path) in verify(path)[0]


def test_missing_manifest(tmp_path):
    path = tmp_path / "store"
    with RocksSegmentStore(path) as store:
        store.put_batch([(1, 1, b"x")])
    for entry in os.scandir(path):
        if entry.name.startswith("MANIFEST-"):
            os.unlink(entry.path)
    with pytest.raises(StoreCorruption, match="RocksDB cannot open it"):
        RocksSegmentStore(path)


def test_a_file_is_not_a_store(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"hello")
    with pytest.raises(StoreCorruption, match="not a folder"):
        RocksSegmentStore(path)


def test_foreign_rocksdb_is_refused_but_an_empty_one_is_adopted(tmp_path):
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    foreign = Rdict(str(tmp_path / "foreign"), options)
    foreign[b"someone else's key"] = b"value"
    foreign.close()
    with pytest.raises(StoreCorruption, match="format marker"):
        RocksSegmentStore(tmp_path / "foreign")

    # A folder created but left without its marker (a crash right after creation) holds nothing: adopt it.
    empty = Rdict(str(tmp_path / "empty"), options)
    empty.close()
    with RocksSegmentStore(tmp_path / "empty") as store:
        store.put_batch([(1, 1, b"x")])
    assert verify(tmp_path / "empty") == []


def test_verify_on_missing_folder(tmp_path):
    assert verify(tmp_path / "nothing") == [f"store {tmp_path / 'nothing'}: no store here (missing or empty folder)"]
    assert not (tmp_path / "nothing").exists()


def test_write_errors_are_storage_errors(tmp_path):
    store = RocksSegmentStore(tmp_path / "store")
    store.close()
    with pytest.raises(StorageError):
        store.put_meta("x", b"y")
