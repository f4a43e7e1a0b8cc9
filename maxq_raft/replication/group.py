"""One Raft group on one node: a pysyncobj SyncObj, its durable log, its transport, its proposals.

Theory of operation
-------------------
The group never uses pysyncobj's replicated methods (which pickle calls into the log and
unpickle them when applying). A proposal enters pysyncobj's command queue as an entry of our
own kind (wire.CMD_PAYLOAD): pysyncobj stores and replicates it like any command and skips it
when it applies the log, so nothing the state machine sees is ever pickled.

Everything here runs in the engine's hub thread, which calls `tick` (doTick(0), autoTick off):

* `submit` moves proposals queued by any thread into pysyncobj if this node leads the group,
  and answers "not leader" / "busy" at once otherwise.
* pysyncobj's success callback runs while it applies index i, when raftLastApplied == i - 1:
  that is how a proposal learns its index (asserted again when it is confirmed).
* `deliver` hands committed entries to on_commit, in order, each once per process lifetime:
  up to min(pysyncobj's lastApplied, the Journal's durable_index), read from the RAM tail or
  the Journal, in bounded chunks. Confirms (callback(index, None)) follow on_commit for their
  index. After a restart, pysyncobj starts at the saved commit index, so the retained log is
  replayed from index 1 before anything new.
* A proposal is answered exactly once: committed, "not leader" (pysyncobj reported it was
  not or no longer leader, or the entry was overwritten), "timeout" (outcome unknown: it may
  still commit), "busy" (too many pending, or the disk is behind) or "stopped".

Settings (docs/design.md §3, measured cliffs): `RAFT_SETTINGS`.
"""

from __future__ import annotations

import collections
import heapq
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pysyncobj.syncobj
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.config import FAIL_REASON
from pysyncobj.node import Node

from ..storage.sync_latency import SyncLatency
from . import wire
from .group_transport import HELD_BYTES_MAX, GroupTransport
from .journal import JournalError
from .raft_journal import RaftLog, install_journal_hook, register_log, unregister_log, write_atomic
from .snapshot_file import SnapshotError, SnapshotHeader, latest_snapshot, prune_snapshots, write_snapshot
from .snapshot_install import NoPickleSerializer

__all__ = ["Group", "RAFT_SETTINGS", "PAYLOAD_BYTES_MAX", "raft_conf", "Proposal"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
# An entry of one command >= appendEntriesBatchSizeBytes goes down pysyncobj's chunked path
# (1-4 commands/s, and it pickles); proposals are capped well below the batch size.
PAYLOAD_BYTES_MAX = 1 * MiB
RAFT_SETTINGS: dict[str, Any] = dict(
    autoTick=False,  # the engine's one hub thread ticks every group
    appendEntriesUseBatch=False,  # True waits for the 100 ms tick: 10 commits/s at one in flight
    # Below ~0.3 s starved Python threads cause spurious elections. A heartbeat goes out every
    # 0.1-0.15 s (HEARTBEAT_PERIODS), so 0.5 leaves a member's threads 0.35 s of starvation, as
    # 0.4 did with a heartbeat every 0.05 s and the engine's tick of 0.02 s before 2026-12-06.
    raftMinTimeout=0.5,
    raftMaxTimeout=0.9,
    # When pysyncobj's leader sends appends with nothing new (a heartbeat), checked at each
    # tick; also how long one of its loops may send batches or take commands.
    appendEntriesPeriod=0.05,
    leaderFallbackTimeout=2.0,  # a leader that hears from no majority for 2 s steps down
    connectionTimeout=3.5,  # unused by our transport; pysyncobj checks it against raftMaxTimeout
    appendEntriesBatchSizeBytes=2 * MiB,
    logCompactionMinEntries=1 << 62,  # compaction off: it pickles the object in the tick thread
    logCompactionMinTime=1 << 62,
    dynamicMembershipChange=True,
    commandsWaitLeader=False,
    commandsQueueSize=100_000,
    useFork=False,
    tcp_keepalive=None,
)
# pysyncobj's PipeNotifier wakes its own tick thread (autoTick) when a command is queued: a
# byte written to a pipe per `_applyCommand` and a poll(2) of it per tick of every group, for a
# thread we never run (the engine's hub ticks every group). Off for every SyncObj of this
# process (pysyncobj reads the flag in __init__ and in _applyCommand); `Group` also gives
# each SyncObj a poller with nothing to poll.
pysyncobj.syncobj.PIPE_NOTIFIER_ENABLED = False


class _NothingToPoll:
    """SyncObj's poller: our transport owns no descriptor of pysyncobj's, and there is no pipe."""

    def poll(self, timeout: float) -> None:
        pass


# Our transport sends a leader's heartbeat (an append with no new entry and no new commit
# index) only once this many periods passed since its last message to that follower: an idle
# group's leader sends one to each follower, which answers, and at one per period an idle
# member of 7 at factor 3 (14 groups) spent ~0.055 cores on them and on the ticks, ~0.035 at
# two (with the engine's 0.05 s tick; issue #19, docs/benchmarks.md). Under load appends go
# out with every commit.
HEARTBEAT_PERIODS = 2
_MEMBERSHIP_KIND = bytes([wire.CMD_MEMBERSHIP])
LEARNER_ELECTION_TIMEOUT_S = 1e9  # a learner's: it never stands (Group.start_learning)
LEARNER_MARKER = "learner"  # in the group's folder while this node is a learner of it
DELIVER_ENTRIES_PER_TICK = 4096
DELIVER_BYTES_PER_TICK = 8 * MiB
DELIVER_CHUNK_ENTRIES = 1024  # one on_commit call carries at most this many entries ...
DELIVER_CHUNK_BYTES = 2 * MiB  # ... or about this many bytes
# Delivered to on_commit and not applied yet by its consumer (the node's trio loop) past which no
# more is delivered until it catches up: the hub reads a member's log faster than the loop applies
# it, so without a bound a start that replays a long log queued all of it, decoded payloads and
# all, and the process kept that peak as RSS (+91 MiB after a replay of 1.2 GiB of log).
APPLY_BACKLOG_BYTES_MAX = 16 * MiB
DISK_BEHIND_BYTES_MAX = HELD_BYTES_MAX // 2

_ERRORS = {
    FAIL_REASON.QUEUE_FULL: "busy",
    FAIL_REASON.MISSING_LEADER: "not leader",
    FAIL_REASON.DISCARDED: "not leader",
    FAIL_REASON.NOT_LEADER: "not leader",
    FAIL_REASON.LEADER_CHANGED: "not leader",
    FAIL_REASON.REQUEST_DENIED: "denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "timeout",
}
_STATE = {0: "follower", 1: "candidate", 2: "leader"}
_CANDIDATE = 1


def raft_conf(journal_token: str | None = None, **overrides: Any) -> SyncObjConf:
    kw = dict(RAFT_SETTINGS)
    kw.update(overrides)
    if journal_token is not None:
        kw["journalFile"] = journal_token
    return SyncObjConf(**kw)


class Proposal:
    __slots__ = ("callback", "deadline", "done", "index", "term")

    def __init__(self, callback: Callable[[int | None, str | None], None], deadline: float) -> None:
        self.callback, self.deadline, self.done, self.index = callback, deadline, False, None
        self.term: int | None = None  # of the entry at `index` when pysyncobj applied it


class Group:
    def __init__(
        self,
        name: str,
        *,
        node_id: str,
        raft_addr: tuple[str, int],
        peers: dict[str, tuple[str, int]],
        data_dir: Path,
        fsync: bool,
        link: Any,
        on_commit: Callable[[str, list[tuple[int, bytes]]], None],
        on_durable: Callable[[Group], None],
        propose_timeout_s: float,
        proposals_pending_max: int,
        on_snapshot: Callable[[str, SnapshotHeader], None] | None = None,
        joining: bool = False,
        settings: dict[str, Any] | None = None,
        seams: bool = True,
        journal_factory: Callable[..., Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        apply_backlog_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.name = name
        self.node_id = node_id
        self.fsync = fsync
        self.on_commit = on_commit
        # bytes delivered to on_commit that its consumer has not applied yet (None: not counted)
        self.apply_backlog_bytes = apply_backlog_bytes
        self.propose_timeout_s = propose_timeout_s
        self.proposals_pending_max = proposals_pending_max
        self.clock = clock
        self.folder = Path(data_dir) / "raft" / name
        self.snap_dir = self.folder / "snapshot"
        self.on_snapshot = on_snapshot  # (group, header): the machines take the snapshot's state
        self.snapshot: SnapshotHeader | None = None  # the latest durable snapshot of this group
        self.pending_snapshot: SnapshotHeader | None = None  # for on_snapshot, before any later entry
        self.install_ack: tuple[str, int, int] | None = None  # (leader, index, term): ack once durable
        self.failed: str | None = None
        self.on_failed: Callable[[Group, str], None] | None = None  # set by the engine: the node stops
        self.removed = False
        self.joining = joining  # started to be added (maxqctl add-node): see `deliver`
        # a move's new member while it catches up, before it is added: it never campaigns
        # (`start_learning`) until it applies its own addition
        self.learning = False
        # Set when it stops learning (its addition applied here); the server's watch takes it
        # (server/cluster.py `serve_remote`): a promotion between two of its looks, not missed.
        self.promoted_unseen = False
        self._voter_timeouts: tuple[float, float] | None = None
        self.inbox: collections.deque[tuple[bytes, Callable, float]] = collections.deque()  # any thread appends
        self.outstanding: collections.deque[Proposal] = collections.deque()  # submission (= deadline) order
        self.n_pending = 0
        self.confirms: collections.deque[tuple[int, Proposal]] = collections.deque()
        self.applied_waiters: list[tuple[int, int, Callable]] = []  # heap: forwarded proposals' answers
        self._waiter_seq = 0
        self.applied = 0  # delivered to on_commit through this index
        self.leader_id: str | None = None
        # set by the engine: forward(group, payload, callback, deadline) -> bool (False: cannot)
        self.forward: Callable | None = None
        self.is_leader = False
        self.term = 0
        # While this node leads: the index of its leadership's first entry (pysyncobj's no-op);
        # the entries before it were appended by earlier leaders (server/remote.py, `catching_up`).
        self.term_from: int | None = None
        self._candidate_term = 0  # the last term this node was seen standing in (elections_started)
        self.transfer: dict | None = None
        self.stats: collections.Counter[str] = collections.Counter()
        conf_kw = dict(settings or {})
        period_s = conf_kw.get("appendEntriesPeriod", RAFT_SETTINGS["appendEntriesPeriod"])
        self.raft_log = RaftLog(
            self.folder, fsync=fsync, on_durable=lambda _i: on_durable(self), journal_factory=journal_factory
        )
        self.sync_latency = SyncLatency()  # the journal's data fdatasyncs, for /metrics
        self.raft_log.journal.on_fdatasync = self.sync_latency.observe
        install_journal_hook()
        token = register_log(self.raft_log)
        box: dict[str, GroupTransport] = {}

        def make_transport(so, self_node, other_nodes):
            t = GroupTransport(
                so,
                self_node,
                other_nodes,
                group=name,
                link=link,
                raft_log=self.raft_log,
                joining=joining,
                heartbeat_s=HEARTBEAT_PERIODS * period_s,
                seams=seams,
                clock=clock,
            )
            box["t"] = t
            return t

        try:
            self_node = wire.RaftNode(node_id, raft_addr)
            others = [wire.RaftNode(pid, addr) for pid, addr in sorted(peers.items()) if pid != node_id]
            self.so = SyncObj(
                self_node, others, raft_conf(token, **conf_kw), nodeClass=Node, transportClass=make_transport
            )
        except BaseException:
            unregister_log(token)
            self.raft_log.close()
            raise
        self.transport = box["t"]
        self.so._poller = _NothingToPoll()
        self.so._SyncObj__serializer = NoPickleSerializer(self.transport.begin_install)
        self.transport.snapshot_source = lambda: self.snapshot
        self.transport.on_installed = self._installed
        self.transport.snap_dir = self.snap_dir
        try:
            self._start_from_snapshot()
            self._take_logged_membership()
        except BaseException:
            self.so.destroy()
            raise
        self.transport.sync_connections()
        self._orig_on_truncate = self.raft_log.on_truncate
        self.raft_log.on_truncate = self._on_truncate

    # ------------------------------------------------------------------------ snapshots

    def _start_from_snapshot(self) -> None:
        """A restart: the latest snapshot is the state up to its index; the log goes on from there."""
        rl = self.raft_log
        header = latest_snapshot(self.snap_dir)
        if header is None:
            if rl.first_index > 1:
                raise SnapshotError(
                    f"group {self.name}: the log starts at {rl.first_index} and no snapshot "
                    f"in {self.snap_dir} covers what came before"
                )
            return
        if header.index > rl.last_index or rl.term_at(header.index) != header.term:
            # A received snapshot whose base did not reach the log before a crash: lay it now.
            rl.install_base(header.prev, header.last)
        elif rl.first_index > header.index:
            raise SnapshotError(
                f"group {self.name}: the log starts at {rl.first_index}, after the snapshot at {header.index}"
            )
        self._adopt(header)
        log.info(
            "group %s: starting from the snapshot at index %d; the log holds %d..%d",
            self.name,
            header.index,
            rl.first_index,
            rl.last_index,
        )

    def start_learning(self) -> None:
        """This node receives the group's log as a learner (group_moves.py): it must not stand
        for election, which pysyncobj would do once it stops hearing from a leader (its vote
        requests would be dropped by the members, but its term would climb, and disrupt the
        group once it is added). Its election timeout is made too long to pass until it applies
        its own addition."""
        conf = self.so.conf
        self._voter_timeouts = (conf.raftMinTimeout, conf.raftMaxTimeout)
        conf.raftMinTimeout = conf.raftMaxTimeout = LEARNER_ELECTION_TIMEOUT_S
        self.learning = True
        marker = self.folder / LEARNER_MARKER
        if not marker.exists():  # a restart before its addition is a learner's too
            write_atomic(self.folder, LEARNER_MARKER, b"", self.fsync)

    def _stop_learning(self) -> None:
        if self._voter_timeouts is not None:
            conf = self.so.conf
            conf.raftMinTimeout, conf.raftMaxTimeout = self._voter_timeouts
            self._voter_timeouts = None
        # In this order: the trio thread reads `learning`, then `promoted_unseen`
        # (ClusterLog.local_deliveries). Written the other way round, a switch of threads between
        # the two let it see a member neither learning nor promoted, and write the deliveries of
        # an entry applied then before those it had skipped as a learner, which `_promoted`
        # wrote later (FIFO broken once in CI: test_a_drain_under_confirmed_load_..., 235 before 234).
        self.promoted_unseen = True
        self.learning = False
        (self.folder / LEARNER_MARKER).unlink(missing_ok=True)
        log.info("group %s: %s is a member now, no longer a learner", self.name, self.node_id)

    def _take_logged_membership(self) -> None:
        """A restart: the members are the latest configuration in the log (Raft, section 6).

        pysyncobj takes a membership change into its configuration when it appends the entry,
        but after a restart only when it applies the entry again, once it has heard the commit
        index from a leader: meanwhile it would count votes and acks over the members it was
        first started with (a member moved onto a group restarts with the members from before
        its own addition: engine.py, group moves). So the retained log's changes after the
        snapshot are taken here, in order, and pysyncobj's second taking of each, at apply, is
        skipped (applying one again would pass through the older configurations)."""
        so = self.so
        applied = so._SyncObj__raftLastApplied
        through = 0
        for index in self.raft_log.membership_indexes:
            if index <= applied:
                continue  # the snapshot's members include it
            for cmd, _idx, _term in self.raft_log.entries(index, index):
                request = so._SyncObj__parseChangeClusterRequest(cmd)
                if request is not None:
                    so._SyncObj__doChangeCluster(request)
                    through = index
        if not through:
            return
        self.stats["membership_changes_taken_at_start"] += 1
        apply_command = so._SyncObj__doApplyCommand

        def apply_once(command: bytes) -> Any:
            # (pysyncobj applies index raftLastApplied + 1, and counts it applied afterwards)
            if command[:1] == _MEMBERSHIP_KIND and so._SyncObj__raftLastApplied < through:
                return None
            return apply_command(command)

        so._SyncObj__doApplyCommand = apply_once

    def _adopt(self, header: SnapshotHeader, leader: str | None = None) -> None:
        """pysyncobj's view: everything through header.index is committed and applied, and the
        members are the snapshot's (the entries that named them may be gone), whether or not
        they name this node: a learner (a move onto this node) installs a snapshot taken before
        its addition, and the entries after it replay the changes since on top. Taking only
        those that named it (as before) left a learner that had once held the group with the
        members of an old snapshot from before its removal (n1, n4, n5 on n4, where the group
        was on n2, n3, n5): its next snapshot, without it, changed nothing, the entries between
        (n3 added, n1 removed) were never appended here, and once it led the group it told n3,
        a member, that it was not one, which left (jepsen-style run, seed 2006).

        The transport drops messages from nodes outside the members, so the leader that sent
        the snapshot (`leader`; added after the snapshot's index, its addition comes in the
        entries after it) is kept among them; so are, at a restart from a snapshot that does
        not name this node (a learner's), the members it was started with, its leader's among
        them."""
        so = self.so
        self.snapshot = header
        self.pending_snapshot = header
        if so._SyncObj__raftLastApplied < header.index:
            so._SyncObj__raftLastApplied = header.index
        if so._SyncObj__raftCommitIndex < header.index:
            so._SyncObj__raftCommitIndex = header.index
            self.raft_log.setRaftCommitIndex(header.index)
        members = {m[0]: (m[1], m[2]) for m in header.members}
        if not members:  # (a snapshot of the old layout may name none: the peers stay)
            return
        others = [wire.RaftNode(nid, addr) for nid, addr in sorted(members.items()) if nid != self.node_id]
        kept = {n.id: n for n in so.otherNodes}
        if leader is not None:
            if leader not in members and leader in kept:
                others.append(kept[leader])
        elif self.node_id not in members:
            others.extend(node for nid, node in sorted(kept.items()) if nid not in members)
        so._SyncObj__updateClusterConfiguration(others)

    def _installed(self, header: SnapshotHeader, leader: str, term: int) -> None:
        """The transport received a whole snapshot from the leader (hub thread)."""
        log.info("group %s: installing the snapshot at index %d from %s", self.name, header.index, leader)
        self.raft_log.install_base(header.prev, header.last)
        self.applied = min(self.applied, header.index)
        self._adopt(header, leader)
        prune_snapshots(self.snap_dir, header.index)
        self.install_ack = (leader, header.index, term)
        self.stats["snapshots_installed"] += 1

    def snapshot_header(self, index: int) -> SnapshotHeader | None:
        """The header of a snapshot of the state at `index` (applied here), or None when one cannot
        be taken there now (not applied yet, already covered, a membership change after it)."""
        rl = self.raft_log
        if (
            index < 2
            or index > self.applied
            or index <= rl.first_index
            or (self.snapshot and index <= self.snapshot.index)
        ):
            return None
        if any(i > index for i in rl.membership_indexes):
            return None  # the members at `index` are not the current ones: wait until it is older
        prev, last = rl.entry(index - 1), rl.entry(index)
        nodes = [self.so.selfNode, *self.so.otherNodes]
        members = [(n.id, *(getattr(n, "raft_addr", None) or ("", 0))) for n in nodes]
        return SnapshotHeader(self.name, index, last[2], tuple(prev), tuple(last), members)

    def snapshot_saved(self, header: SnapshotHeader) -> None:
        """A snapshot of this group is durable: compact the log below it (hub thread)."""
        if self.snapshot is not None and header.index <= self.snapshot.index:
            return
        self.snapshot = header
        self.stats["snapshots_saved"] += 1
        rl = self.raft_log
        first = header.index - 1  # pysyncobj's log[0]: the entry before the snapshot's last
        if self.so._isLeader():
            # Keep what connected followers still need: they catch up from the log, not a snapshot.
            match = self.so._SyncObj__raftMatchIndex
            for node in self.so.otherNodes:
                if node.id in self.transport.connected:
                    first = min(first, max(match.get(node, 0), rl.first_index))
        if first > rl.first_index:
            rl.compact(first)
            self.stats["compactions"] += 1
        prune_snapshots(self.snap_dir, header.index)

    def write_snapshot(self, header: SnapshotHeader, body) -> SnapshotHeader:
        """Write the file (any thread but the hub's: it may be large)."""
        header.path = write_snapshot(self.snap_dir, header, body)
        header.body_bytes = header.path.stat().st_size
        return header

    # ------------------------------------------------------------------ log and membership

    def _on_truncate(self, first_index: int, count: int) -> None:
        self._orig_on_truncate(first_index, count)
        if first_index <= self.applied:
            self.stats["applied_entries_truncated"] += self.applied - first_index + 1
            log.critical(
                "group %s: truncating entries from %d, already delivered through %d",
                self.name,
                first_index,
                self.applied,
            )

    def mark_removed(self) -> None:
        """This node is no longer a member: stop sending (no more campaigns), fail proposals."""
        self.removed = True
        self.transport.silent = True
        self.fail_all("not leader")

    def membership_change_pending(self) -> bool:
        mi = self.raft_log.membership_indexes
        return bool(mi) and mi[-1] > self.so.raftCommitIndex

    # --------------------------------------------------------------------------- proposals

    def _finish(self, p: Proposal, index: int | None, error: str | None) -> None:
        if p.done:
            return
        p.done = True
        self.n_pending -= 1
        try:
            p.callback(index, error)
        except Exception:
            log.exception("group %s: proposal callback raised", self.name)

    def _result(self, p: Proposal, err: int) -> None:
        """pysyncobj's callback (inside doTick)."""
        if p.done:
            return
        if err == FAIL_REASON.SUCCESS:
            p.index = self.so.raftLastApplied + 1  # pysyncobj calls back before it counts the entry applied
            p.term = self.raft_log.term_at(p.index)
            self.confirms.append((p.index, p))
        else:
            self._finish(p, None, _ERRORS.get(err, f"error {err}"))

    def _track(self, callback: Callable, deadline: float) -> Proposal:
        p = Proposal(callback, deadline)
        self.outstanding.append(p)
        self.n_pending += 1
        return p

    def submit(self, now: float) -> None:
        inbox = self.inbox
        if not inbox:
            return
        if self.failed is not None:
            while inbox:
                _, cb, _ = inbox.popleft()
                call_safely(cb, None, "stopped")
            return
        if self.transfer is not None and now < self.transfer["deadline"]:
            return  # hold proposals while leadership moves (bounded by the transfer deadline)
        leader = self.so._isLeader()
        disk_behind = leader and self.raft_log.undurable_bytes > DISK_BEHIND_BYTES_MAX
        for _ in range(len(inbox)):  # bounded: what is queued now
            payload, cb, deadline = inbox.popleft()
            if not leader:
                # One hop to the leader we know of; a proposal that was already forwarded here is
                # not sent on again (leadership moving under it would make it bounce).
                if (
                    getattr(cb, "forwarded", False)
                    or self.forward is None
                    or not self.forward(self, payload, cb, deadline)
                ):
                    call_safely(cb, None, "not leader")
            elif self.n_pending >= self.proposals_pending_max or disk_behind:
                self.stats["busy"] += 1
                call_safely(cb, None, "busy")
            elif deadline <= now:
                call_safely(cb, None, "timeout")
            else:
                p = self._track(cb, deadline)
                self.so._applyCommand(payload, lambda _r, err, p=p: self._result(p, err), wire.CMD_PAYLOAD)

    def sweep(self, now: float) -> None:
        q = self.outstanding
        while q and (q[0].done or q[0].deadline <= now):
            p = q.popleft()
            if not p.done:
                self.stats["timeouts"] += 1
                self._finish(p, None, "timeout")
        waiters = self.applied_waiters
        if waiters and self.is_leader is False and self.leader_id is None:
            # Committed elsewhere but this node cannot apply it (cut off): the outcome is known
            # to the cluster, not here; say "timeout" rather than keep the proposer waiting.
            self.stats["applied_waiters_abandoned"] += len(waiters)
            self.applied_waiters = []
            for _index, _seq, cb in waiters:
                call_safely(cb, None, "timeout")

    def hand_off(self) -> None:
        """This node leaves the group (group_moves.py): what waits here goes on elsewhere. A
        proposal committed and not yet applied here is answered with its index (the members
        apply it); the rest "not leader", so the proposer sends it to a member that holds the
        group (one appended already is then a copy, which the appliers skip)."""
        waiters, self.applied_waiters = self.applied_waiters, []
        for index, _seq, cb in waiters:
            call_safely(cb, index, None)
        self.fail_all("not leader")

    def fail_all(self, error: str) -> None:
        while self.inbox:
            _, cb, _ = self.inbox.popleft()
            call_safely(cb, None, error)
        while self.outstanding:
            self._finish(self.outstanding.popleft(), None, error)
        self.confirms.clear()
        waiters, self.applied_waiters = self.applied_waiters, []
        for _index, _seq, cb in waiters:
            call_safely(cb, None, error)  # committed, not yet applied here: "stopped" means unknown here
        if self.transfer is not None:
            t, self.transfer = self.transfer, None
            call_safely(t["callback"], error)

    # -------------------------------------------------------------------------------- tick

    def tick(self, now: float) -> bool:
        """One round; True if committed entries are still waiting to be delivered."""
        if self.failed is not None or self.removed:
            return False  # a removed member stays silent (it would only campaign) until it is stopped
        self.submit(now)
        try:
            self.so.doTick(0)
            self.transport.after_tick()
        except JournalError as exc:
            self.fail(f"journal: {exc}")
            return False
        except OSError as exc:  # the term file (raft_term) could not be written: no vote may go out
            self.fail(f"storage: {exc}")
            return False
        except Exception:
            self.stats["tick_errors"] += 1
            log.exception("group %s: pysyncobj tick raised", self.name)
        so = self.so
        leading = so._isLeader()
        self.term_from = so._SyncObj__noopIDx if leading else None  # (first: read with is_leader elsewhere)
        self.is_leader = leading
        leader = so._getLeader()
        leader_id = leader.id if leader is not None else None
        if leader_id is not None and leader_id != self.leader_id:
            self.stats["leader_changes"] += 1  # a leader this node had not known (the first too)
        self.leader_id = leader_id
        self.term = so._getTerm()
        if (self.is_leader or so._SyncObj__raftState == _CANDIDATE) and self.term > self._candidate_term:
            # A candidacy bumps the term: one per term in which this node is seen standing at a
            # tick's end, or leading (a one-voter group wins within the tick it stands in).
            self._candidate_term = self.term
            self.stats["elections_started"] += 1
        if self.transport.held:
            self.transport.release()
        if self.transport.installs:
            self.transport.pump_installs()
        more = self.deliver()
        if self.transfer is not None:
            self._transfer_step(now)
        return more

    def fail(self, why: str) -> None:
        """Fail-stop (hub thread): this group answers nothing more, and the node stops."""
        if self.failed is not None:
            return
        log.critical("group %s failed and stops (fail-stop): %s", self.name, why)
        self.failed = why
        self.is_leader = False
        self.term_from = None
        self.fail_all("stopped")
        if self.on_failed is not None:
            self.on_failed(self, why)

    def durable_advanced(self) -> bool:
        """The Journal made more entries durable (hub thread)."""
        if self.failed is not None:
            return False
        self.transport.release()
        return self.deliver()

    def deliver(self) -> bool:
        if self.install_ack is not None and self.raft_log.durable_index >= self.install_ack[1]:
            leader, index, term = self.install_ack
            self.install_ack = None
            self.transport._send_install_ack(leader, term, index, 0, True)
        pending = self.pending_snapshot
        if pending is not None:
            self.pending_snapshot = None
            if pending.index > self.applied:
                self.applied = pending.index
                if self.on_snapshot is not None:
                    try:
                        self.on_snapshot(self.name, pending)
                    except Exception:
                        log.exception("group %s: on_snapshot raised (index %d)", self.name, pending.index)
        target = min(self.so.raftLastApplied, self.raft_log.durable_index)
        budget_entries, budget_bytes = DELIVER_ENTRIES_PER_TICK, DELIVER_BYTES_PER_TICK
        backlog = self.apply_backlog_bytes
        held = False
        while self.applied < target and budget_entries > 0 and budget_bytes > 0:
            if backlog is not None and backlog() >= APPLY_BACKLOG_BYTES_MAX:
                held = True
                self.stats["deliveries_held"] += 1
                break
            hi = min(target, self.applied + min(budget_entries, DELIVER_CHUNK_ENTRIES))
            batch = []
            last, size = self.applied, 0
            for cmd, idx, _term in self.raft_log.entries(self.applied + 1, hi):
                kind = cmd[0]
                if kind == wire.CMD_PAYLOAD:
                    batch.append((idx, cmd[1:]))
                elif kind == wire.CMD_MEMBERSHIP:
                    action, nid, _addr = wire.membership_of(cmd)
                    if action == "add" and nid == self.node_id and self.learning:
                        self._stop_learning()
                    if action == "rem" and nid == self.node_id and not self.removed:
                        if self._added_back_after(idx):
                            # Removed, then added back under the same name: that removal was an
                            # earlier life's (a restart replays it before the addition).
                            log.info(
                                "group %s: removal of %s at index %d, added back later in the log",
                                self.name,
                                self.node_id,
                                idx,
                            )
                        elif self.joining:
                            # A node that joined with a fresh log replays the cluster's history,
                            # where its name may have been removed (and added back) before: those
                            # are earlier lives'. Its own removal reaches it as the remover's
                            # notice ("removed", engine.py), which makes it silent at once.
                            log.info(
                                "group %s: removal of an earlier %s at index %d (this node joined later)",
                                self.name,
                                self.node_id,
                                idx,
                            )
                        else:
                            log.warning("group %s: this node was removed from the group at index %d", self.name, idx)
                            self.mark_removed()
                last = idx
                size += len(cmd)
                if size >= DELIVER_CHUNK_BYTES:
                    break
            budget_entries -= last - self.applied
            budget_bytes -= size
            self.applied = last
            if batch:
                try:
                    self.on_commit(self.name, batch)
                except Exception:
                    log.exception(
                        "group %s: on_commit raised (entries %d..%d count as applied)",
                        self.name,
                        batch[0][0],
                        batch[-1][0],
                    )
        confirms = self.confirms
        while confirms and confirms[0][0] <= self.applied:
            idx, p = confirms.popleft()
            term = self.raft_log.term_at(idx)
            assert term is not None, (self.name, idx)
            if term != p.term:
                # pysyncobj applies what its leader's count says is committed, which counts this
                # node's undurable tail (group_transport.py, 1. hold); an entry replaced since is
                # not this proposal's. (Not seen: it needs another leader without the entry while
                # this node lives; kept as the check that a confirm names this proposal's entry.)
                self.stats["confirms_of_replaced_entries"] += 1
                self._finish(p, None, "not leader")
                continue
            self._finish(p, idx, None)
        waiters = self.applied_waiters
        while waiters and waiters[0][0] <= self.applied:
            idx, _seq, cb = heapq.heappop(waiters)
            call_safely(cb, idx, None)
        # Held: the engine's next periodic tick tries again (no spinning while the consumer works).
        return self.applied < target and not held

    def _added_back_after(self, index: int) -> bool:
        for later in self.raft_log.membership_indexes:
            if later > index:
                for cmd, _idx, _term in self.raft_log.entries(later, later):
                    action, nid, _addr = wire.membership_of(cmd)
                    if action == "add" and nid == self.node_id:
                        return True
        return False

    def answer_when_applied(self, index: int, callback: Callable) -> None:
        """A forwarded proposal committed at `index`: answer it once this node has applied it."""
        self._waiter_seq += 1
        heapq.heappush(self.applied_waiters, (index, self._waiter_seq, callback))

    # ----------------------------------------------------------------------- leadership

    def start_transfer(
        self, target: str, callback: Callable[[str | None], None] | None, now: float, timeout_s: float = 3.0
    ) -> None:
        if self.transfer is not None:
            call_safely(callback, "busy")
            return
        if not self.so._isLeader():
            call_safely(callback, "not leader")
            return
        if target == self.node_id:
            call_safely(callback, None)
            return
        if target not in {n.id for n in self.so.otherNodes}:
            call_safely(callback, "not a member")
            return
        self.transfer = {"target": target, "callback": callback, "deadline": now + timeout_s, "sent": False}

    def _transfer_step(self, now: float) -> None:
        t = self.transfer
        done: str | None | bool = False
        if self.leader_id == t["target"]:
            done = None
        elif now > t["deadline"]:
            done = "timeout"
        elif self.is_leader and not t["sent"]:
            res: list[int] = []
            self.so.transferLeadership(t["target"], callback=lambda _r, err: res.append(err))
            if res and res[0] == FAIL_REASON.SUCCESS:
                t["sent"] = True  # TimeoutNow is on its way; wait to see the target lead
            elif res and res[0] == FAIL_REASON.NOT_LEADER:
                done = "not leader"
            # REQUEST_DENIED: the target is not caught up yet; proposals are held, try again
        elif not self.is_leader and not t["sent"]:
            done = "not leader"
        if done is not False:
            self.transfer = None
            call_safely(t["callback"], done)

    def member_request(
        self, action: str, node_id: str, addr: tuple[str, int] | None, reply: Callable[[str | None], None], now: float
    ) -> None:
        """Leader side of add_member/remove_member for this group; reply(None) once committed."""
        so = self.so
        if self.failed is not None or not so._isLeader():
            reply("not leader")
            return
        if self.membership_change_pending():
            reply("pending")
            return
        members = {n.id for n in so.otherNodes}
        if action == "add":
            if node_id in members or node_id == self.node_id:
                reply(None)
                return
            p = self._track(lambda _i, err: reply(err), now + self.propose_timeout_s)
            so.addNodeToCluster(wire.RaftNode(node_id, addr), callback=lambda _r, err, p=p: self._result(p, err))
        else:
            if node_id == self.node_id:
                so.transferLeadership(None, callback=lambda _r, _e: None)
                reply("leader is the node to remove; moving leadership")
                return
            if node_id not in members:
                reply(None)
                return
            p = self._track(lambda _i, err: reply(err), now + self.propose_timeout_s)
            so.removeNodeFromCluster(wire.RaftNode(node_id), callback=lambda _r, err, p=p: self._result(p, err))

    # ------------------------------------------------------------------------------ status

    def member_ids(self) -> list[str]:
        """This node and the others of the group's current configuration (any thread: a copy)."""
        return [self.node_id, *(n.id for n in list(self.so.otherNodes))]

    def status(self) -> dict:
        so = self.so
        rl = self.raft_log
        match = getattr(so, "_SyncObj__raftMatchIndex", {})
        nxt = getattr(so, "_SyncObj__raftNextIndex", {})
        leader = so._isLeader()
        members: dict[str, dict] = {
            self.node_id: {"self": True, "match_index": rl.durable_index, "lag": rl.last_index - rl.durable_index}
        }
        for n in so.otherNodes:
            m = match.get(n) if leader else None
            members[n.id] = {
                "self": False,
                "connected": n.id in self.transport.connected,
                "match_index": m,
                "next_index": nxt.get(n) if leader else None,
                "lag": (rl.last_index - m) if m is not None else None,
            }
        return {
            "role": _STATE.get(so._SyncObj__raftState, "?"),
            "leader": self.leader_id,
            "term": so._getTerm(),
            "commit_index": so.raftCommitIndex,
            "applied_index": self.applied,
            "last_index": rl.last_index,
            "first_index": rl.first_index,
            "snapshot_index": self.snapshot.index if self.snapshot else 0,
            "durable_index": rl.durable_index,
            "members": members,
            "pending_proposals": self.n_pending,
            "held_messages": self.transport.held_count(),
            "failed": self.failed,
            "removed": self.removed,
            "learning": self.learning,
            "learners": sorted(self.transport.learners),  # (another node's move catching them up)
            "membership_change_pending": self.membership_change_pending(),
            "seams": dict(self.transport.stats),
            "log": dict(rl.stats),
            "group": dict(self.stats),
            "journal": rl.journal.stats() if not rl.journal.closed else {},
            "snapshot_bytes": _file_bytes(self.snapshot),
            "fdatasync_seconds": _latency_json(self.sync_latency),
        }

    def close(self) -> None:
        self.fail_all("stopped")
        try:
            self.so.destroy()  # autoTick off: transport.destroy() and raft_log._destroy() (journal close)
        except JournalError as exc:  # its writer failed (logged then): the journal released its files anyway
            log.error("group %s: closed with its journal failed: %s", self.name, exc)
        except Exception:
            log.exception("group %s: closing pysyncobj failed", self.name)
            try:
                self.raft_log.close()
            except Exception:
                log.exception("group %s: closing the journal failed", self.name)


def call_safely(cb: Callable | None, *args: Any) -> None:
    """Call a user callback; its exception is logged, never raised into the hub thread."""
    if cb is None:
        return
    try:
        cb(*args)
    except Exception:
        log.exception("replication callback raised")


def _latency_json(latency: SyncLatency) -> dict:
    """A SyncLatency snapshot as JSON can carry it: the finite bounds, then one count more (+Inf)."""
    cumulative, sum_s = latency.snapshot()
    return {"bounds_s": list(latency.bounds_s), "cumulative": [count for _bound, count in cumulative], "sum_s": sum_s}


def _file_bytes(header: SnapshotHeader | None) -> int:
    """The size of the snapshot's file (0: none yet, or a file pruned meanwhile)."""
    if header is None or header.path is None:
        return 0
    try:
        return header.path.stat().st_size
    except OSError:
        return 0
