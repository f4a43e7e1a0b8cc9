"""The seams between pysyncobj 0.3.17 and the network/disk, one group driven message by message.

A group runs in this process with a fake link (it records what the transport puts on the wire,
decoded again with wire.decode_raft) and, where durability matters, a journal whose durable
index the test moves by hand. Each seam is shown twice where that is possible: with the seams
(must pass) and with them switched off, i.e. stock pysyncobj behaviour over the same log
(`xfail(strict=True)`: the test must FAIL there, so an upgrade of pysyncobj that changes its
private message formats or fixes a defect shows up here).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from pysyncobj.config import FAIL_REASON

from maxq_raft.replication import wire
from maxq_raft.replication.engine import TICK_INTERVAL_S
from maxq_raft.replication.group import HEARTBEAT_PERIODS, PAYLOAD_BYTES_MAX, RAFT_SETTINGS, Group
from maxq_raft.replication.raft_journal import read_term_file

pytestmark = pytest.mark.timeout(30)

STOCK = pytest.param(False, marks=pytest.mark.xfail(strict=True, reason="stock pysyncobj 0.3.17 defect"), id="stock")
SEAMS = pytest.param(True, id="seams")
FAST = dict(raftMinTimeout=0.06, raftMaxTimeout=0.07, appendEntriesPeriod=0.015)


class FakeLink:
    def __init__(self, up: set[str]) -> None:
        self.up = set(up)
        self.sent: list[tuple[str, dict]] = []
        self.on_send = None

    def peer_is_up(self, nid: str) -> bool:
        return nid in self.up

    def send_raft(self, nid: str, body: bytes) -> bool:
        _, msg = wire.decode_raft(body)
        if self.on_send is not None:
            self.on_send(nid, msg)
        self.sent.append((nid, msg))
        return True

    def add_peer(self, group, nid, addr) -> None:
        pass

    def drop_peer(self, group, nid) -> None:
        pass

    def of(self, nid: str | None = None, t: str | None = None) -> list[dict]:
        return [m for n, m in self.sent if (nid is None or n == nid) and (t is None or m["type"] == t)]

    def acks(self, nid: str = "L") -> list[int]:
        return [m["next_node_idx"] - 1 for m in self.of(nid, "next_node_idx") if m["success"]]

    def resets(self, nid: str = "L") -> list[int]:
        return [m["next_node_idx"] for m in self.of(nid, "next_node_idx") if m["reset"] and not m["success"]]


class ManualJournal:
    """The Journal API RaftLog uses, in memory; durable_index moves when the test says (or at once)."""

    def __init__(self, auto: bool, on_durable) -> None:
        self.auto, self.on_durable = auto, on_durable
        self.entries: list[tuple[int, int, bytes]] = []
        self._durable = 0
        self.closed = False
        self.first_index = 1

    @property
    def last_index(self) -> int:
        return len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1][1] if self.entries else 0

    @property
    def durable_index(self) -> int:
        return self._durable

    def append(self, index: int, term: int, payload: bytes) -> None:
        assert index == self.last_index + 1 and term >= self.last_term, (index, term)
        self.entries.append((index, term, payload))
        if self.auto:
            self._durable = index

    def make_durable(self, upto: int | None = None) -> None:
        self._durable = min(self.last_index, upto if upto is not None else self.last_index)

    def truncate_after(self, index: int) -> None:
        del self.entries[index:]
        self._durable = min(self._durable, index)

    def compact_before(self, first: int) -> None:
        self.first_index = first  # (the entries stay readable here; RaftLog no longer asks for them)

    def read(self, lo: int, hi: int | None = None):
        hi = self.last_index if hi is None else min(hi, self.last_index)
        return iter(list(self.entries[lo - 1 : hi]))

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        self.closed = True


class Harness:
    def __init__(
        self,
        tmp_path: Path,
        *,
        seams: bool = True,
        auto_durable: bool = True,
        node_id: str = "f",
        peers=("L", "L2"),
        settings: dict | None = None,
        real_journal: bool = False,
    ) -> None:
        self.link = FakeLink(set(peers))
        self.journal: ManualJournal | None = None
        self.committed: list[tuple[int, bytes]] = []

        def factory(folder, **kw):
            self.journal = ManualJournal(auto_durable, kw.get("on_durable"))
            return self.journal

        self.group = Group(
            "g",
            node_id=node_id,
            raft_addr=("127.0.0.1", 1),
            peers={p: ("127.0.0.1", 2) for p in peers},
            data_dir=tmp_path,
            fsync=False,
            link=self.link,
            on_commit=lambda _g, es: self.committed.extend(es),
            on_durable=lambda _g: None,
            propose_timeout_s=5.0,
            proposals_pending_max=1000,
            settings=settings,
            seams=seams,
            journal_factory=None if real_journal else factory,
        )
        self.t = self.group.transport
        self.log = self.group.raft_log

    def feed(self, nid: str, msg: dict) -> None:
        """Through the codec, as from the network."""
        if msg["type"] == "next_node_idx":
            msg = dict(msg)
            msg.setdefault("term", self.group.so._getTerm())
        _, decoded = wire.decode_raft(wire.encode_raft("g", msg, {}))
        self.t.receive(nid, decoded)

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.group.tick(time.monotonic())

    def durable(self, upto: int | None = None) -> None:
        self.journal.make_durable(upto)
        self.group.durable_advanced()

    def close(self) -> None:
        self.group.close()


def P(i: int) -> bytes:  # noqa: N802 - a payload command
    return bytes([wire.CMD_PAYLOAD]) + b"payload-%d" % i


def ae(term: int, prev: int, prev_term: int, entries: list[tuple[int, int]], commit: int = 1) -> dict:
    """append_entries; entries as (index, term)."""
    return {
        "type": "append_entries",
        "term": term,
        "commit_index": commit,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "entries": [[P(i), i, t] for i, t in entries],
    }


def run(lo: int, hi: int, term: int) -> list[tuple[int, int]]:
    return [(i, term) for i in range(lo, hi + 1)]


@pytest.fixture
def harness(tmp_path):
    made: list[Harness] = []

    def make(**kw) -> Harness:
        h = Harness(tmp_path / f"h{len(made)}", **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


# ------------------------------------------------------------------------ 3. stale-append guard


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_stale_append_truncates_nothing(harness, seams):
    h = harness(seams=seams)
    h.feed("L", ae(1, 1, 0, run(2, 10, 1)))
    assert h.log.last_index == 10 and h.link.acks() == [10]
    # pysyncobj's leader rewinds nextIndex after each ack and re-sends: an old append arrives
    h.feed("L", ae(1, 5, 1, run(6, 7, 1)))
    assert h.log.stats["truncated_entries"] == 0, "stock pysyncobj truncates entries 8..10, which it had acked"
    assert h.log.last_index == 10
    assert h.link.acks() == sorted(h.link.acks()), "acks must not go backwards"
    assert h.t.stats["acked_entries_truncated"] == 0


def test_real_term_conflict_still_truncates(harness):
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 10, 1)))
    # a new leader (term 2) whose log has other entries from index 8 on
    h.feed("L2", ae(2, 7, 1, run(8, 9, 2)))
    assert h.log.last_index == 9
    assert [h.log.term_at(i) for i in (7, 8, 9)] == [1, 2, 2]
    assert h.t.stats["guard_conflicts"] == 1
    assert h.link.acks("L2") == [9]
    assert h.t.stats["acked_entries_truncated"] == 0  # acked to L in term 1, not in the current term


def test_guard_trims_duplicates_but_keeps_new_entries(harness):
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 5, 1)))
    h.feed("L", ae(1, 3, 1, run(4, 8, 1)))  # 4, 5 known, 6..8 new
    assert h.log.last_index == 8 and h.log.stats["truncated_entries"] == 0
    assert h.t.stats["guard_skipped_entries"] == 2
    assert h.link.acks() == [5, 8]


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_ack_floor_within_a_term(harness, seams):
    h = harness(seams=seams)
    h.feed("L", ae(1, 1, 0, run(2, 12, 1)))
    h.feed("L", ae(2, 12, 1, []))  # L re-elected in term 2: heartbeat verifies 1..12 -> ack 12 in term 2
    assert h.link.acks()[-1] == 12
    h.feed("L", ae(2, 5, 1, run(6, 7, 1)))  # an old append re-sent in term 2 (entries of term 1)
    term2_acks = h.link.acks()[1:]
    assert min(term2_acks) == 12, f"acks in term 2 went back: {term2_acks}"
    assert h.log.last_index == 12


def test_longer_tail_of_an_older_term_is_neither_cut_nor_claimed(harness):
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 12, 1)))  # 2..12 from the old leader, never acked in term 2
    h.feed("L2", ae(2, 5, 1, run(6, 7, 1)))  # the new leader verifies only through 7
    assert h.log.last_index == 12 and h.log.stats["truncated_entries"] == 0
    assert h.link.acks("L2") == [7]
    assert h.group.so.raftCommitIndex <= 7  # commit never covers an unverified entry
    assert h.t.stats["guard_stripped"] == 1


# ------------------------------------------------------------------------- 4. conflict clamp


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_conflict_clamp_points_at_the_conflicting_term(harness, seams):
    h = harness(seams=seams)
    h.feed("L", ae(1, 1, 0, run(2, 5, 1)))
    h.feed("L", ae(2, 5, 1, run(6, 20, 2)))  # term-2 entries the rest of the cluster never got
    # new leader, term 3: its log is 1..5 (term 1), 6..30 (term 3); it pipelines appends
    h.feed("L2", ae(3, 20, 3, run(21, 22, 3)))  # prevLogTerm mismatch at 20
    h.feed("L2", ae(3, 22, 3, [(23, 3)]))  # beyond our log: stock answers "from 21", undoing the back-up
    resets = h.link.resets("L2")
    assert resets and max(resets) <= 6, f"reset replies must point at the first term-2 entry (6): {resets}"
    # the leader backs up to 6: the conflict is resolved by one truncation
    h.feed("L2", ae(3, 5, 1, run(6, 8, 3)))
    assert h.log.last_index == 8 and h.log.term_at(6) == 3
    assert h.link.acks("L2")[-1] == 8
    assert h.t.hint is None


def test_conflict_clamp_never_points_below_what_a_compacted_log_holds(harness):
    # jepsen seed 300 (2026-12-01): a member that led term 2 and then snapshotted had its
    # conflicting term-2 run begin before its first kept entry; every reset pointed the new
    # leader at that first entry, whose predecessor the member no longer had, so pysyncobj
    # answered "from my end", clamped back again: the shard never replicated to it again.
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 5, 1)))
    h.feed("L", ae(2, 5, 1, run(6, 20, 2), commit=15))
    h.log.compact(10)  # a snapshot covered the entries before 10
    h.feed("L2", ae(3, 20, 3, run(21, 22, 3)))  # prevLogTerm mismatch at 20: the term-2 run began at 6
    h.feed("L2", ae(3, 25, 3, [(26, 3)]))  # beyond our log
    resets = h.link.resets("L2")
    assert resets and all(r - 1 >= h.log.first_index for r in resets), (resets, h.log.first_index)
    # the leader backs up to the reset, with prevLogIdx an entry we hold: one truncation resolves it
    r = min(resets)
    h.feed("L2", ae(3, r - 1, 2, run(r, 19, 2) + run(20, 22, 3)))
    assert h.log.last_index == 22 and h.log.term_at(20) == 3 and h.log.term_at(19) == 2
    assert h.link.acks("L2")[-1] == 22


# ------------------------------------------------------------------------ 2. held messages


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_follower_acks_only_durable_entries(harness, seams):
    h = harness(seams=seams, auto_durable=False)
    h.journal.make_durable()  # the initial no-op
    h.feed("L", ae(1, 1, 0, run(2, 4, 1)))
    assert h.link.acks() == [], "a success reply went out before the entries were durable"
    h.durable(3)
    assert h.link.acks() == []
    h.durable(4)
    assert h.link.acks() == [4]


def test_a_held_ack_of_entries_cut_from_the_log_does_not_block_later_messages(harness):
    # Under overload (a 3-node bench, transient publishes): a member held messages for entries
    # that were then truncated, so they could never become durable; everything queued behind them
    # for that peer, votes included, waited forever and the member's shard never recovered.
    h = harness(auto_durable=False)
    h.journal.make_durable()  # the initial no-op
    h.feed("L", ae(1, 1, 0, run(2, 4, 1)))  # 2..4 appended, their ack held until durable
    assert h.link.acks() == [] and h.t.held_count() == 1
    h.feed("L", ae(2, 1, 0, run(2, 3, 2)))  # L again, in term 2, with other entries from 2 on
    assert [h.log.term_at(i) for i in (2, 3, 4)] == [2, 2, None]
    h.durable(3)  # the term-2 entries are durable; index 4 will never be
    h.tick()
    assert h.link.acks() == [3], "the ack of the term-2 entries stayed behind the one of cut entries"
    assert h.t.held_count() == 0 and h.t.stats["held_dropped_stale"] == 1


def become_leader(h: Harness, voter: str = "L") -> int:
    end = time.monotonic() + 5
    while time.monotonic() < end and not h.link.of(voter, "request_vote"):
        h.tick()
        time.sleep(0.005)
    rv = h.link.of(voter, "request_vote")
    assert rv, "no election started"
    h.feed(voter, {"type": "response_vote", "term": rv[-1]["term"]})
    h.tick()
    assert h.group.so._isLeader()
    return rv[-1]["term"]


def test_leader_sends_entries_before_its_fsync_but_commits_only_what_its_disk_holds(harness):
    # Raft lets the leader write in parallel with its followers; what must not happen is a
    # commit (a follower's apply, the leader's own confirm) of entries on fewer than a
    # majority of disks: pysyncobj counts the leader as holding every entry it appended.
    h = harness(auto_durable=False, node_id="me", peers=("L", "L2"), settings=FAST)
    h.journal.make_durable()
    term = become_leader(h)
    h.durable()  # the no-op (index 2)
    h.tick()
    got: list = []
    h.group.inbox.append((b"hello", lambda i, e: got.append((i, e)), time.monotonic() + 5))
    h.tick(2)
    assert 3 in sent_entries(h, "L"), "the leader waited for its own fsync before sending"
    h.feed("L", {"type": "next_node_idx", "next_node_idx": 4, "reset": False, "success": True, "term": term})
    h.tick(2)
    assert h.group.so.raftCommitIndex == 3  # pysyncobj: the leader and L hold it
    assert max(m["commit_index"] for m in h.link.of(t="append_entries")) <= 2, "commit named an entry on one disk"
    assert got == [] and h.committed == [], "confirmed before it was on the leader's disk"
    sent_before = len(h.link.sent)
    h.durable()  # now on two disks of three: committed, and told to the followers at once
    assert [m["commit_index"] for m in h.link.of("L2", "append_entries")[-1:]] == [3]
    assert len(h.link.sent) > sent_before and h.t.stats["commit_pushed"] >= 1
    h.tick()
    assert got == [(3, None)] and h.committed == [(3, b"hello")]


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_leader_holds_a_membership_change_until_durable_here(harness, seams):
    # pysyncobj acts on a membership entry when it is appended, and the engine makes the next
    # change once this one commits: its append waits for the leader's disk.
    h = harness(seams=seams, auto_durable=False, node_id="me", peers=("L", "L2"), settings=FAST)
    h.journal.make_durable()
    term = become_leader(h)
    h.durable()
    h.feed("L", {"type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True, "term": term})
    h.tick()  # the no-op committed: pysyncobj takes a membership change now
    answers: list = []
    h.group.member_request("rem", "L2", None, answers.append, time.monotonic())
    h.tick(2)
    assert 3 not in sent_entries(h, "L"), "a membership change left before it was on the leader's disk"
    h.durable()
    h.tick()
    assert 3 in sent_entries(h, "L")


def test_single_node_confirms_only_durable_entries(harness):
    h = harness(auto_durable=False, node_id="solo", peers=(), settings=FAST)
    h.journal.make_durable()
    end = time.monotonic() + 5
    while not h.group.so._isLeader() and time.monotonic() < end:
        h.tick()
        time.sleep(0.005)
    h.durable()
    h.tick(3)
    got: list = []
    h.group.inbox.append((b"hello", lambda i, e: got.append((i, e)), time.monotonic() + 5))
    h.tick(3)
    assert got == [] and h.committed == [], "committed before it was on disk"
    h.durable()
    h.tick()
    assert got == [(3, None)] and h.committed == [(3, b"hello")]


# --------------------------------------------------------------------------- 5. leader dedup


def sent_entries(h: Harness, nid: str) -> list[int]:
    return [e[1] for m in h.link.of(nid, "append_entries") for e in m["entries"]]


def test_heartbeats_thinned_to_one_per_heartbeat_s(harness):
    # pysyncobj tries a heartbeat every appendEntriesPeriod; the transport sends one only once
    # heartbeat_s (HEARTBEAT_PERIODS periods) passed since the last append to that follower.
    h = harness(node_id="me", peers=("L", "L2"), settings=FAST)
    become_leader(h)
    h.tick()
    assert h.t.heartbeat_s == pytest.approx(HEARTBEAT_PERIODS * FAST["appendEntriesPeriod"])
    h.link.sent.clear()
    start = time.monotonic()
    while (time.monotonic() - start < 0.3 or not h.t.stats["heartbeats_thinned"]) and time.monotonic() - start < 3:
        h.tick()
        time.sleep(0.002)
    elapsed = time.monotonic() - start
    beats = [m for m in h.link.of("L", "append_entries") if not m.get("entries")]
    assert 1 <= len(beats) <= elapsed / h.t.heartbeat_s + 1, (len(beats), elapsed)
    assert h.t.stats["heartbeats_thinned"] >= 1
    # a new commit index is never held back
    h.link.sent.clear()
    got: list = []
    h.group.inbox.append((b"x", lambda i, e: got.append((i, e)), time.monotonic() + 5))
    h.tick()
    idx = sent_entries(h, "L")[-1]
    h.feed("L", {"type": "next_node_idx", "next_node_idx": idx + 1, "reset": False, "success": True})
    h.tick()
    assert got == [(idx, None)]
    assert max(m["commit_index"] for m in h.link.of("L2", "append_entries")) == idx


def test_a_follower_behind_gets_the_next_batch_at_its_ack_not_at_the_heartbeat(harness):
    h = harness(node_id="me", peers=("L", "L2"), settings=FAST)
    become_leader(h)

    def propose(n: int) -> None:
        for i in range(n):
            h.group.inbox.append((b"e%d" % i, lambda i, e: None, time.monotonic() + 5))
        h.tick()

    propose(3)
    sent_to_l = max(sent_entries(h, "L"))
    h.link.up.discard("L")  # what follows is not sent to L (as when pysyncobj's send loop ran out of time)
    propose(5)
    assert max(sent_entries(h, "L")) == sent_to_l and h.log.last_index == sent_to_l + 5
    last = h.log.last_index
    h.feed("L2", {"type": "next_node_idx", "next_node_idx": last + 1, "reset": False, "success": True})
    h.tick()
    assert h.group.so.raftCommitIndex == last  # (so L's ack below commits nothing new)
    h.link.up.add("L")
    h.group.so._SyncObj__newAppendEntriesTime = time.monotonic() + 60  # the heartbeat far off
    h.link.sent.clear()
    h.feed("L", {"type": "next_node_idx", "next_node_idx": sent_to_l + 1, "reset": False, "success": True})
    h.tick()
    assert sent_entries(h, "L") == list(range(sent_to_l + 1, sent_to_l + 6)), "waited for the heartbeat"
    assert h.t.stats["catch_up_sends"] == 1


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_leader_does_not_resend_entries_on_the_same_connection(harness, seams):
    h = harness(seams=seams, node_id="me", peers=("L", "L2"), settings=FAST)
    term = become_leader(h)
    for i in range(5):
        h.group.inbox.append((b"e%d" % i, lambda i, e: None, time.monotonic() + 5))
    h.tick(2)
    assert sorted(set(sent_entries(h, "L"))) == list(range(2, 8))
    before = len(sent_entries(h, "L"))
    # L acks only 3: pysyncobj rewinds nextIndex[L] to 4 and re-sends 4..7
    h.feed("L", {"type": "next_node_idx", "next_node_idx": 4, "reset": False, "success": True, "term": term})
    h.tick(3)
    time.sleep(0.03)
    h.tick(3)
    again = sent_entries(h, "L")[before:]
    assert again == [], f"entries re-sent on the same connection: {again}"
    # a rejection asks for them again: they are sent
    h.feed("L", {"type": "next_node_idx", "next_node_idx": 4, "reset": True, "success": False, "term": term})
    time.sleep(0.03)  # the next heartbeat (appendEntriesPeriod) carries them
    h.tick(2)
    assert sent_entries(h, "L")[before:][:4] == [4, 5, 6, 7]


def test_reconnect_forgets_what_was_sent(harness):
    h = harness(node_id="me", peers=("L", "L2"), settings=FAST)
    become_leader(h)
    h.group.inbox.append((b"x", lambda i, e: None, time.monotonic() + 5))
    h.tick(2)
    assert h.t.sent_hi.get("L")
    h.t.peer_down("L")
    h.t.peer_up("L")
    assert "L" not in h.t.sent_hi


# ------------------------------------------------------------- terms on acks, forwarding


@pytest.mark.parametrize("seams", [SEAMS, STOCK])
def test_leader_ignores_acks_from_another_term(harness, seams):
    h = harness(seams=seams, node_id="me", peers=("L", "L2"), settings=FAST)
    term = become_leader(h)
    h.group.inbox.append((b"x", lambda i, e: None, time.monotonic() + 5))
    h.tick(2)
    match = h.group.so._SyncObj__raftMatchIndex
    # an ack produced in an older term (held, or late on the wire) must not count now
    h.feed("L", {"type": "next_node_idx", "next_node_idx": 4, "reset": False, "success": True, "term": term - 1})
    assert max(match.values()) == 0


def test_commands_are_never_forwarded_to_another_leader(harness):
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 3, 1)))
    got: list = []
    h.group.so._applyCommand(b"x", lambda r, e: got.append(e), wire.CMD_PAYLOAD)
    h.tick()
    assert got == [FAIL_REASON.NOT_LEADER]
    assert h.link.of(t="apply_command") == []
    assert h.t.stats["forward_refused"] == 1


def test_propose_on_a_follower_is_not_leader(harness):
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 3, 1)))
    got: list = []
    h.group.inbox.append((b"x", lambda i, e: got.append((i, e)), time.monotonic() + 5))
    h.tick()
    assert got == [(None, "not leader")]


def test_messages_from_non_members_are_dropped(harness):
    h = harness()
    h.feed("L", ae(1, 1, 0, run(2, 3, 1)))
    h.t.receive("stranger", {"type": "request_vote", "term": 9, "last_log_index": 99, "last_log_term": 9})
    assert h.group.so._getTerm() == 1
    assert h.t.stats["dropped_non_member"] == 1


# ---------------------------------------------------------------- 1. term and vote on disk


def test_vote_is_on_disk_before_it_is_sent_and_survives_a_restart(tmp_path):
    folder = tmp_path / "n"
    h = Harness(folder, real_journal=True)
    seen: list = []
    h.link.on_send = lambda nid, m: seen.append((m["type"], read_term_file(folder / "raft" / "g")))
    try:
        h.feed("L", {"type": "request_vote", "term": 5, "last_log_index": 50, "last_log_term": 4})
        assert ("response_vote", (5, "L")) in seen
    finally:
        h.close()
    h = Harness(folder, real_journal=True)
    try:
        assert (h.group.so._getTerm(), h.log.getVotedForNodeId()) == (5, "L")
        h.feed("L2", {"type": "request_vote", "term": 5, "last_log_index": 50, "last_log_term": 4})
        assert h.link.of("L2", "response_vote") == [], "voted twice in term 5"
    finally:
        h.close()


# ----------------------------------------------------------------------------- 7. settings


def test_settings_avoid_the_measured_cliffs(harness):
    conf = harness().group.so.conf
    assert conf.autoTick is False and conf.appendEntriesUseBatch is False
    assert 0.3 <= conf.raftMinTimeout <= 0.5 and 0.6 <= conf.raftMaxTimeout <= 1.0
    # the longest gap between two heartbeats (thinned to HEARTBEAT_PERIODS, checked at a tick)
    # leaves 0.35 s of starvation before a follower stands
    longest_gap_s = HEARTBEAT_PERIODS * conf.appendEntriesPeriod + TICK_INTERVAL_S
    assert conf.raftMinTimeout - longest_gap_s >= 0.35 - 1e-9
    assert conf.dynamicMembershipChange is True
    assert conf.appendEntriesBatchSizeBytes > PAYLOAD_BYTES_MAX + 1  # never the chunked (pickling) path
    assert conf.logCompactionMinEntries > 10**15 and conf.logCompactionMinTime > 10**15
    assert RAFT_SETTINGS["commandsWaitLeader"] is False


def pipes_open() -> set[str]:
    """The pipes this process has open ("pipe:[inode]")."""
    pipes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except FileNotFoundError:  # (listdir's own descriptor, closed since)
            continue
        if target.startswith("pipe:"):
            pipes.add(target)
    return pipes


def test_no_pipe_per_group_for_a_tick_thread_never_run(harness):
    """pysyncobj's PipeNotifier (for its own tick thread) cost a write per proposal and a
    poll(2) per tick of every group: a group opens no pipe, and proposals still commit."""
    before = pipes_open()
    h = harness(node_id="solo", peers=(), settings=FAST)
    assert pipes_open() - before == set()  # (one closed meanwhile, by an earlier test's garbage, is no matter)
    end = time.monotonic() + 5
    while not h.group.so._isLeader() and time.monotonic() < end:
        h.tick()
        time.sleep(0.005)
    got: list = []
    for i in range(3):
        h.group.inbox.append((b"p%d" % i, lambda i, e: got.append((i, e)), time.monotonic() + 5))
    h.tick(3)
    assert got == [(3, None), (4, None), (5, None)]
    assert pipes_open() - before == set()
