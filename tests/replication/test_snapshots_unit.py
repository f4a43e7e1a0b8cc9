"""Snapshots below the engine: the file (whole or refused), the log's compaction and base, and the
chunked install's flow control and re-sends. No processes: these are the pure parts."""

from __future__ import annotations

import pytest

from maxq_raft.replication.raft_journal import RaftLog
from maxq_raft.replication.snapshot_file import (
    SnapshotError,
    SnapshotHeader,
    latest_snapshot,
    prune_snapshots,
    read_body,
    read_header,
    write_snapshot,
)
from maxq_raft.replication.snapshot_install import CHUNK_BYTES, WINDOW_BYTES, InstallReceiver, InstallSender

PAYLOAD = b"\x03"  # wire.CMD_PAYLOAD


def header(index: int, term: int = 2) -> SnapshotHeader:
    return SnapshotHeader(
        "g",
        index,
        term,
        (PAYLOAD + b"prev", index - 1, term),
        (PAYLOAD + b"last", index, term),
        [("n1", "127.0.0.1", 7001), ("n2", "127.0.0.1", 7002)],
    )


def test_a_snapshot_file_round_trips_and_a_damaged_one_is_refused(tmp_path):
    body = [b"a" * 1000, b"b" * 3000]
    path = write_snapshot(tmp_path, header(10), body)
    h = read_header(path)
    assert (h.group, h.index, h.term, h.members) == ("g", 10, 2, [("n1", "127.0.0.1", 7001), ("n2", "127.0.0.1", 7002)])
    assert h.last == (PAYLOAD + b"last", 10, 2) and h.prev == (PAYLOAD + b"prev", 9, 2)
    assert b"".join(read_body(h)) == b"".join(body)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="crc mismatch"):
        read_header(path)
    path.write_bytes(bytes(raw[:20]))
    with pytest.raises(SnapshotError, match="torn"):
        read_header(path)
    path.write_bytes(b"MQSN" + (99).to_bytes(4, "big") + bytes(20))
    with pytest.raises(SnapshotError, match="version 99"):
        read_header(path)


def test_the_latest_whole_snapshot_wins_and_pruning_keeps_one(tmp_path):
    write_snapshot(tmp_path, header(10), [b"x"])
    newest = write_snapshot(tmp_path, header(20), [b"y"])
    assert latest_snapshot(tmp_path).index == 20
    newest.write_bytes(newest.read_bytes()[:-1])  # torn: the older one is used
    assert latest_snapshot(tmp_path).index == 10
    (tmp_path / "snapshot-00000000000000000030.tmp").write_bytes(b"half")
    assert prune_snapshots(tmp_path, 10) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot-00000000000000000010.snap"]


def fill(log: RaftLog, upto: int, term: int = 1) -> None:
    for i in range(log.last_index + 1, upto + 1):
        log.add(PAYLOAD + b"%d" % i, i, term)


def test_compaction_moves_the_first_entry_and_survives_a_reopen(tmp_path):
    log = RaftLog(tmp_path, fsync=False)
    fill(log, 50)
    log.compact(30)
    assert (log.first_index, log.last_index, len(log)) == (30, 50, 21)
    assert log[0] == (PAYLOAD + b"30", 30, 1) and log.term_at(29) is None and log.term_at(30) == 1
    assert [e[1] for e in log.entries(1, 35)] == [30, 31, 32, 33, 34, 35]
    fill(log, 60, term=2)
    log.close()
    log = RaftLog(tmp_path, fsync=False)
    assert (log.first_index, log.last_index, log[0][1], log.term_at(60)) == (30, 60, 30, 2)
    log.close()


def test_install_base_replaces_a_shorter_or_divergent_log(tmp_path):
    log = RaftLog(tmp_path, fsync=False)
    fill(log, 20, term=1)  # a follower that was behind, with entries of an old term past the snapshot's base
    h = header(15, term=3)
    log.install_base(h.prev, h.last)
    assert (log.first_index, log.last_index, log.term_at(15), log[0][1]) == (14, 15, 3, 14)
    log.add(PAYLOAD + b"16", 16, 3)
    log.close()
    log = RaftLog(tmp_path, fsync=False)
    assert (log.first_index, log.last_index, log.term_at(16)) == (14, 16, 3)
    log.close()
    empty = RaftLog(tmp_path / "e", fsync=False)
    h = header(100, term=4)
    empty.install_base(h.prev, h.last)
    assert (empty.first_index, empty.last_index) == (99, 100)
    empty.close()


def test_an_install_sends_a_window_ahead_resends_a_gap_and_checks_the_whole_file(tmp_path):
    src = write_snapshot(tmp_path / "leader", header(42), [bytes(range(256)) * (4 * WINDOW_BYTES // 256 + 7)])
    sender = InstallSender("n2", read_header(src), term=2)
    receiver = InstallReceiver(tmp_path / "follower", 42, 2)
    first = sender.next_messages()
    assert sum(len(m["data"]) for m in first) == WINDOW_BYTES and not sender.next_messages()  # window full
    offset, done = receiver.on_chunk(first[0])
    assert (offset, done) == (CHUNK_BYTES, None)
    offset, _ = receiver.on_chunk(first[2])  # the second chunk was lost: the receiver asks again from it
    assert offset == CHUNK_BYTES
    sender.on_ack({"index": 42, "term": 2, "offset": offset, "done": False})
    got = None
    for _ in range(1000):  # bounded: about 10 chunks are left
        messages = sender.next_messages()
        if not messages:
            break
        for m in messages:
            offset, got = receiver.on_chunk(m)
        sender.on_ack({"index": 42, "term": 2, "offset": offset, "done": False})
    assert got is not None and got.index == 42 and got.path.read_bytes() == src.read_bytes()
    sender.close()
    bad = InstallReceiver(tmp_path / "follower2", 42, 2)
    with pytest.raises(SnapshotError):
        bad.on_chunk({"index": 42, "term": 2, "offset": 0, "data": b"not a snapshot", "is_last": True})
