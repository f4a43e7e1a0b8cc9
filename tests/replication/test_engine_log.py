"""RaftLog: pysyncobj's journal interface over our durable Journal, with a bounded RAM tail."""

from __future__ import annotations

import time

import pytest

from maxq_raft.replication.journal import JournalCorruption
from maxq_raft.replication.raft_journal import COMMIT_FILE, TERM_FILE, LogView, RaftLog, read_term_file

pytestmark = pytest.mark.timeout(30)


def cmd(i: int) -> bytes:
    return b"\x04" + b"entry-%d-" % i + bytes(i % 7)


def fill(rl: RaftLog, lo: int, hi: int, term: int) -> None:
    for i in range(lo, hi + 1):
        rl.add(cmd(i), i, term)


def wait_durable(rl: RaftLog, index: int) -> None:
    assert rl.journal.wait_durable(index, 5)


@pytest.fixture
def small(tmp_path):
    """A log whose RAM tail holds 4 entries, so most reads go to disk."""
    rl = RaftLog(tmp_path / "g", fsync=False, tail_entries_max=4)
    yield rl
    rl.close()


def test_pysyncobj_access_patterns_read_through_to_disk(small):
    rl = small
    rl.add(b"\x01", 1, 0)
    fill(rl, 2, 40, 1)
    fill(rl, 41, 50, 2)
    wait_durable(rl, 50)
    assert len(rl) == 50 and rl[0] == (b"\x01", 1, 0) and rl[-1] == (cmd(50), 50, 2)
    assert rl[9] == (cmd(10), 10, 1)  # below the tail: from disk
    view = rl[4:]  # pysyncobj's __getEntries(5) slices to the end
    assert isinstance(view, LogView) and len(view) == 46
    assert view[0] == (cmd(5), 5, 1) and view[-1][1] == 50
    assert [e[1] for e in view] == list(range(5, 51))
    assert [e[1] for e in view[:3]] == [5, 6, 7]
    assert [e[1] for e in reversed(rl[44:])] == list(range(50, 44, -1))
    assert rl[47:49] == [(cmd(48), 48, 2), (cmd(49), 49, 2)]  # inside the tail: a plain list
    assert [rl.term_at(i) for i in (1, 2, 40, 41, 50, 51)] == [0, 1, 1, 2, 2, None]
    assert rl.run_start(45) == 41 and rl.run_start(40) == 2
    assert list(rl.entries(38, 42)) == [(cmd(i), i, 1 if i <= 40 else 2) for i in range(38, 43)]


def test_truncation_below_the_tail(small):
    rl = small
    rl.add(b"\x01", 1, 0)
    fill(rl, 2, 30, 1)
    wait_durable(rl, 30)
    cut: list = []
    rl.on_truncate = lambda first, n: cut.append((first, n))
    rl.deleteEntriesFrom(19)  # pysyncobj passes a position: index 20
    assert cut == [(20, 11)] and rl.last_index == 19 and rl.last_term == 1
    assert rl[-1] == (cmd(19), 19, 1)
    fill(rl, 20, 22, 3)
    assert [rl.term_at(i) for i in (19, 20, 22)] == [1, 3, 3]
    assert [e[1] for e in rl[15:]] == list(range(16, 23))
    assert rl.durable_index <= 22


def test_restart_recovers_entries_terms_vote_and_commit(tmp_path):
    rl = RaftLog(tmp_path / "g", fsync=True)
    rl.add(b"\x01", 1, 0)
    fill(rl, 2, 20, 2)
    rl.setCurrentTerm(3, "n2")
    rl.setRaftCommitIndex(15)
    rl.onOneSecondTimer()
    wait_durable(rl, 20)
    rl.close()
    assert read_term_file(tmp_path / "g") == (3, "n2")
    rl = RaftLog(tmp_path / "g", fsync=True)
    try:
        assert (rl.getCurrentTerm(), rl.getVotedForNodeId(), rl.getRaftCommitIndex()) == (3, "n2", 15)
        assert len(rl) == 20 and rl[-1] == (cmd(20), 20, 2) and rl.durable_index == 20
        assert rl.term_at(2) == 2 and rl.run_start(20) == 2
    finally:
        rl.close()


def test_commit_index_is_clamped_to_the_log(tmp_path):
    rl = RaftLog(tmp_path / "g", fsync=False)
    rl.add(b"\x01", 1, 0)
    fill(rl, 2, 5, 1)
    rl.setRaftCommitIndex(5)
    rl.close()
    assert (tmp_path / "g" / COMMIT_FILE).exists()
    rl = RaftLog(tmp_path / "g", fsync=False)
    try:
        assert rl.getRaftCommitIndex() == 5
        rl.deleteEntriesFrom(3)  # a position: index 4 and after go
        assert rl.getRaftCommitIndex() == 3
    finally:
        rl.close()
    (tmp_path / "g" / COMMIT_FILE).write_bytes(b"garbage")  # a damaged commit file is only a stale hint
    rl = RaftLog(tmp_path / "g", fsync=False)
    try:
        assert rl.getRaftCommitIndex() == 1
    finally:
        rl.close()


def test_a_damaged_term_file_stops_the_node(tmp_path):
    rl = RaftLog(tmp_path / "g", fsync=False)
    rl.setCurrentTerm(7, "x")
    rl.close()
    p = tmp_path / "g" / TERM_FILE
    p.write_bytes(p.read_bytes()[:-1] + b"\x00")
    with pytest.raises(JournalCorruption):
        RaftLog(tmp_path / "g", fsync=False)


def test_snapshot_and_compaction_paths_are_refused(small):
    small.add(b"\x01", 1, 0)
    with pytest.raises(RuntimeError):
        small.clear()
    with pytest.raises(RuntimeError):
        small.deleteEntriesTo(1)


def test_undurable_bytes_follow_the_writer(tmp_path):
    rl = RaftLog(tmp_path / "g", fsync=False)
    try:
        rl.add(b"\x01", 1, 0)
        fill(rl, 2, 50, 1)
        end = time.monotonic() + 5
        while rl.undurable_bytes and time.monotonic() < end:
            time.sleep(0.01)
        assert rl.undurable_bytes == 0
    finally:
        rl.close()
