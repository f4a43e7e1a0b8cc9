"""The replication engine: many Raft groups (pysyncobj) per node, one port, one thread.

Theory of operation
-------------------
`ReplicationNode` is what the broker uses (API below). One hub thread per node does all of
pysyncobj's work and all network I/O: it waits on every socket at once (transport.Hub), hands
each frame to its group's transport (group_transport.py, where the durability and safety seams
live), ticks the groups that received something plus every group each `tick_interval_s`
(pysyncobj with autoTick off), and flushes the write buffers; then it writes and fdatasyncs
each group's small batch of new entries itself (`_write_pending`, up to INLINE_SYNC_BYTES_MAX:
no hand-off to a writer thread and back at low rates) and flushes again what that released.
Other threads only append to queues and wake it: `propose` (a per-group inbox), the Journal
writer threads (larger batches: "durable up to i": release held messages, deliver commits) and
`_call` (status, membership, transfers).
Callbacks and on_commit therefore run in the hub thread: they must be quick and must not call
blocking methods of this node (`status`, `stop`).

Files, per group: data_dir/raft/<group>/ holds the Journal's segments (the Raft log,
fdatasynced with group commit), raft_term (term and vote, fsynced before pysyncobj may send a
vote), raft_commit (the commit index, saved once a second) and snapshot/ (the owner's snapshots
of the group's state: `take_snapshot` saves one and compacts the log below it; a restart starts
from the latest and replays the log after it; a member behind the compacted log is installed
with it: group.py, snapshot_install.py).

API
---
    ReplicationNode(*, node_id, raft_addr, peers, cluster_secret, data_dir, groups, fsync=True,
                    on_commit, propose_timeout_s=10.0, joining=False, ...)
    start() / stop()
    propose(group, payload, callback)        callback(index, None) once committed (on a majority,
        fsynced there, and durable and applied here); else callback(None, error) with error
        "not leader" | "timeout" (outcome unknown) | "busy" | "stopped". ValueError for a payload
        over PAYLOAD_BYTES_MAX or an unknown group. Answered exactly once, from the hub thread
        (after stop(): at once, in the caller's thread).
    leader(group) -> node id | None; is_leader(group) -> bool
    status() -> {group: {...}} (role, leader, term, commit/applied/last/durable index, members
        with match index and lag, counters of every seam)
    add_member(node_id, addr, callback) / remove_member(node_id, callback): callback(None) when
        the change is committed in every group, else callback(error). One change at a time.
    transfer_leadership(group, node_id, callback=None): callback(None) once node_id leads.
    move_group(group, add=(node_id, addr) | None, remove=node_id | None, callback): on a member
        holding the group: the new node starts it and is added, catches up, then `remove` is
        removed and deletes it. callback(None) when done. held() / peer_held(): who holds what.
    send_message(node_id, payload) / on_message(peer, payload): the owner's own messages to the
        owner on a peer, in order over one link, dropped when it is down (server/remote.py).

Groups on a few members (issue #19): `held=[...]` and `first_members={group: {node: addr}}`
start this node with only those groups, each with its own members (group_set.py records both
in the data folder; a later start takes them from there). A proposal for a group held
elsewhere goes to a linked peer that holds it (the leader, once one answered or was named in
a "not leader" answer) and is answered when it has committed there: nothing is applied here.
Each node announces the groups it holds with its group list (`held`), again after it joins or
leaves one. Moves, and the departure of a member from a group, are group_moves.py's: a node
removed from a group it holds closes it and deletes its folder; a node started without `held`
(every group on every member) keeps a removed group's files, silent, as before. Used by the
broker with --replication-factor (server/remote.py, docs/replication.md).

Group lists: members must know the same groups (the broker hashes each queue to a shard group
by their number), whichever of them each holds. On every link it opens, a node tells the peer
its list (control op "groups"); a peer whose list differs is cut off from every group, both ways (its Raft frames and forwarded
proposals dropped, none sent to it), and each side logs why once: the majority that agrees goes
on as if that member were down, and a member whose list differs from all its peers' serves
nothing rather than put queues in other groups than the rest. A peer that never says (an older
release) is not checked. `mismatched_peers()` names the peers cut off and their lists. The same
message carries the features this node's code supports (`features`, machines/features.py), kept
per linked peer for `peer_features()`; an older release sends none. Every list a peer announces
is also handed to `on_peer_groups(peer, groups)` (the hub thread): a member that joins with only
its default count takes the cluster's from it and starts again (server/shard_count.py).

Fail-stop: when this node cannot keep its Raft state (a Journal's writer failed on a full disk or
an I/O error, a group failed, the hub thread itself raised), the whole node stops: a member that
cannot make entries durable must not vote, lead or acknowledge, and a half-working one keeps its
clients waiting. `on_fatal(reason)` (hub thread) then tells the owner, which restarts the process
from its files once the disk allows (server/main.py); the other members go on meanwhile.
"""

from __future__ import annotations

import collections
import itertools
import logging
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import group_set, wire
from .group import LEARNER_MARKER, PAYLOAD_BYTES_MAX, Group, call_safely
from .group_moves import MOVE_TIMEOUT_S, GroupMoves
from .journal import JournalError
from .transport import Hub

__all__ = ["ReplicationNode", "PAYLOAD_BYTES_MAX"]

log = logging.getLogger(__name__)

_GROUP_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
# Every group is ticked at least this often: its election timer and heartbeat (RAFT_SETTINGS),
# proposal and forward expiries, membership steps and moves. What arrives or is proposed is
# handled at once; 0.02 s made an idle member tick each group 50 times a second (issue #19).
TICK_INTERVAL_S = 0.05
STOP_JOIN_S_MAX = 40.0  # closing a Journal waits for its writer (bounded by journal.CLOSE_JOIN_S_MAX)
CALL_WAIT_S_MAX = 5.0
MEMBER_ATTEMPT_S = 2.0
MEMBER_RETRY_S = 0.1
UNWANT_GRACE_S = 3.0
MEMBER_PROBE_S = 5.0
# A group's new entries up to this many bytes are written and fdatasynced by the hub thread once
# its frames went out, not handed to the journal's writer thread and back (`_write_pending`):
# two thread hops fewer per entry on each member. 3 nodes, 2026-12-04 (docs/benchmarks.md): at
# a fixed 1,000 msgs/s the confirm latency p50 went from 4.7-5.6 to 3.7 ms, 128 B persistent
# throughput +6 % with 8 % less broker CPU per message, 4 partitions +6 % with 12 % less. A
# larger batch (a busy group) goes to the writer, which syncs groups in parallel.
INLINE_SYNC_BYTES_MAX = 64 * 1024
# What an owner's message may carry beyond one entry's payload (a get-ok with its message and
# the reply's envelope): `send_message`.
MESSAGE_ENVELOPE_BYTES = 64 * 1024
REQUEST_ID_BITS = 62  # a random start per process (below msgpack's 64-bit integers with room to count)


class ReplicationNode:
    def __init__(
        self,
        *,
        node_id: str,
        raft_addr: tuple[str, int],
        peers: dict[str, tuple[str, int]],
        cluster_secret: bytes,
        data_dir: Path,
        groups: list[str],
        fsync: bool = True,
        on_commit: Callable[[str, list[tuple[int, bytes]]], None],
        propose_timeout_s: float = 10.0,
        on_snapshot: Callable[[str, Any], None] | None = None,
        joining: bool = False,
        tick_interval_s: float = TICK_INTERVAL_S,
        proposals_pending_max: int = 10_000,
        member_change_timeout_s: float = 30.0,
        peer_timeout_s: float = 3.0,
        raft_settings: dict[str, Any] | None = None,
        on_fatal: Callable[[str], None] | None = None,
        apply_backlog_bytes: Callable[[], int] | None = None,
        features: Iterable[str] = (),
        on_peer_groups: Callable[[str, list[str]], bool] | None = None,
        inline_sync_bytes_max: int = INLINE_SYNC_BYTES_MAX,
        held: Iterable[str] | None = None,
        first_members: dict[str, dict[str, tuple[str, int]]] | None = None,
        on_message: Callable[[str, bytes], None] | None = None,
        await_placement: bool = False,
        incarnation: str | None = None,
    ) -> None:
        if not groups or len(set(groups)) != len(groups):
            raise ValueError("groups must be a non-empty list of distinct names")
        for g in groups:
            if not _GROUP_NAME.match(g):
                raise ValueError(f"group name {g!r}: use 1-64 of [A-Za-z0-9_.-]")
        if node_id in peers:
            peers = {k: v for k, v in peers.items() if k != node_id}
        self.node_id = node_id
        self.raft_addr = (raft_addr[0], int(raft_addr[1]))
        self.peers = {k: (v[0], int(v[1])) for k, v in peers.items()}
        self.data_dir = Path(data_dir)
        self.group_names = list(groups)
        self.features = sorted(features)  # what this code supports, announced to peers (machines/features.py)
        # (peer, its group list) for every list a peer announces (the hub thread): a joining
        # member whose count was only its default takes the cluster's (server/shard_count.py);
        # True: this node starts again with that list (another list is then not logged as an error)
        self.on_peer_groups = on_peer_groups
        self.fsync = fsync
        self.on_commit = on_commit
        self.on_snapshot = on_snapshot  # (group, SnapshotHeader): load the machines' state from it
        self.propose_timeout_s = propose_timeout_s
        self.joining = joining
        self.tick_interval_s = tick_interval_s
        self.proposals_pending_max = proposals_pending_max
        self.member_change_timeout_s = member_change_timeout_s
        self.raft_settings = dict(raft_settings or {})
        self.on_fatal = on_fatal
        # (peer, payload) for each `send_message` of the owner on a peer (the hub thread)
        self.on_message = on_message
        # bytes handed to on_commit and not applied yet: past a bound, groups wait (group.py)
        self.apply_backlog_bytes = apply_backlog_bytes
        # A batch of new entries up to this many bytes is fdatasynced by the hub thread itself
        # (`_write_pending`); 0: every batch by the journal's writer thread
        self.inline_sync_bytes_max = inline_sync_bytes_max
        # Groups on a few members (group_set.py): the groups this node holds at its first start
        # (None: every group) and, per held group, the members it starts with (default: this
        # node and its peers). A later start takes both from its data folder.
        self.held_at_first_start = None if held is None else list(held)
        if self.held_at_first_start is not None:
            unknown = sorted(set(self.held_at_first_start) - set(self.group_names))
            if unknown:
                raise ValueError(f"held groups {unknown} are not among the groups")
        self.first_members = {name: dict(m) for name, m in (first_members or {}).items()}
        # At the first start (with `held`): the shard groups come later, from the metadata group's
        # first placement (`start_groups`); recorded in the folder until they have come.
        self.await_placement = await_placement
        self.awaiting_placement = False
        self.kept_every_group = False  # `held` was given to a folder holding every group (_held_groups)
        self.raft_dir = self.data_dir / "raft"
        # True once this node holds (or may come to hold) fewer than every group: proposals for
        # a group held elsewhere are forwarded to a member that holds it, links to every peer
        # are kept, and a group this node is removed from is left (closed, its folder deleted)
        self.partial = False
        # With `partial`: whether every member, this one too, holds every group as far as this
        # node knows (each linked member announced holding them all; one not linked counts as
        # not): a cluster of as many members as its factor. Nothing then goes through another
        # member's group, and the broker skips that path's work (server/remote.py, `active`):
        # 3 members at the default factor confirmed ~9 % fewer msgs/s with it on (2026-12-07).
        # Set by the hub thread each tick; a new member's announcement clears it before it holds
        # anything or has a client.
        self.held_everywhere = False
        self.fatal: str | None = None  # why the node stopped by itself (fail-stop), once it has
        self.hub = Hub(
            node_id,
            self.raft_addr,
            cluster_secret,
            on_frame=self._on_frame,
            on_peer_up=self._on_peer_up,
            on_peer_down=self._on_peer_down,
            peer_timeout_s=peer_timeout_s,
        )
        self.hub.on_inbound_closed = self._forget_announced
        self.groups: dict[str, Group] = {}
        self._peer_groups: dict[str, set[str]] = collections.defaultdict(set)
        self._unwant_at: dict[str, float] = {}
        self._touched: set[Group] = set()
        self._proposed: collections.deque[Group] = collections.deque()
        self._durable: collections.deque[Group] = collections.deque()
        self._calls: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_pending = False
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = False
        self._member_change: dict | None = None
        # Request ids (forwarded proposals, membership steps, joins, progress asks) start at
        # random in each process: peers answer by node id over whatever link is up, so an answer
        # to a request of this node's earlier process (a proposal committed after the restart)
        # must not name a request of this one, which would take another entry's index as its own.
        self._req_ids = itertools.count(secrets.randbits(REQUEST_ID_BITS) + 1)
        # proposals this node forwarded: request id -> (to whom, callback, deadline, the group
        # here or None when this node does not hold it, the group's name)
        self._forwards: dict[int, tuple[str, Callable, float, Group | None, str]] = {}
        # proposals for groups held elsewhere, queued by any thread for the hub thread to send
        self._elsewhere: collections.deque[tuple[str, bytes, Callable, float]] = collections.deque()
        self._leader_hint: dict[str, str] = {}  # group held elsewhere -> its leader, as last heard
        # the owner's messages to peers (`send_message`), queued by any thread for the hub thread
        self._outbox: collections.deque[tuple[str, bytes]] = collections.deque()
        self._peer_held: dict[str, frozenset[str]] = {}  # linked peer -> the groups it holds
        self._peers_pending: set[str] = set()  # linked peers waiting for the first placement
        self.moves = GroupMoves(self)  # group moves and departures (group_moves.py)
        self.stats: collections.Counter[str] = collections.Counter()
        # peers whose group list differs from ours (their "groups" op): cut off from every group
        self._mismatched: dict[str, list[str]] = {}
        # This folder's incarnation (server/folder_owner.py), announced to every peer; the ones
        # peers announced, recorded (group_set.py), and the peers refused for announcing another
        # while members of groups held here (`_check_incarnation`): peer -> what it announced.
        self.incarnation = incarnation
        self._incarnations: dict[str, str] | None = None  # (read at start)
        self._data_lost: dict[str, str] = {}
        # A joining node's groups take frames only from the members they started with (their
        # first members) until the log tells them more: announced, so that `maxqctl add-node`
        # refuses a joiner that would never hear the members as they are now (http/admin.py).
        self._first_known: set[str] = set()
        self._peer_knows: dict[str, frozenset[str]] = {}  # joining peer -> the members its groups started with
        # what each peer linked now announced it supports (its "groups" op; none from an earlier
        # release, forgotten when the link goes down)
        self._peer_features: dict[str, frozenset[str]] = {}

    # ------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Open every group's log, bind raft_addr (that address only), start the hub thread."""
        if self._thread is not None:
            raise RuntimeError("already started")
        try:
            self._incarnations = group_set.read_incarnations(self.raft_dir)
            for name in self._held_groups():
                self.groups[name] = self._make_group(name, self.joining, None)
            if self.partial:
                # A proposal for a group held elsewhere goes to a peer that holds it: keep a link
                # to every peer, not only to those this node shares a group with.
                for nid, addr in self.peers.items():
                    self.hub.set_address(nid, addr)
                    self.hub.want(nid)
            self.hub.listen()
        except BaseException:
            for g in self.groups.values():
                g.close()
            self.hub.close()
            self._stopped = True
            raise
        if not self.fsync:
            log.warning(
                "replication node %s runs with fsync=False: confirms are NOT durable (benchmarks only)", self.node_id
            )
        self._thread = threading.Thread(target=self._run, name=f"raft-hub:{self.node_id}", daemon=True)
        self._thread.start()

    def _held_groups(self) -> list[str]:
        """The groups to start: the data folder's record when there is one (group_set.py), else
        those given (then recorded), else every group (nothing recorded: the old layout)."""
        recorded = group_set.read_held(self.raft_dir)
        if recorded is not None:
            unknown = sorted(set(recorded) - set(self.group_names))
            if unknown:
                raise group_set.GroupSetError(
                    f"{self.raft_dir / group_set.HELD_FILE}: holds {unknown}, which are not among the groups"
                )
            self.partial = True
            self.awaiting_placement = group_set.placement_pending(self.raft_dir)
            return [name for name in self.group_names if name in recorded]
        if self.held_at_first_start is None:
            return list(self.group_names)
        if group_set.holds_every_group(self.raft_dir, self.group_names):
            # Started before holding every group (no record), now given a few: it stays a voting
            # member of every group, so it keeps them. Taking `held` dropped the others' folders
            # at the first placement and started them over empty (a voter that forgot its log
            # and its vote), or left them unserved with the member still counted in them.
            self.kept_every_group = True
            log.warning(
                "node %s: this data folder holds every group (a member started without a placement): "
                "it keeps them, not only %s",
                self.node_id,
                ", ".join(self.held_at_first_start),
            )
            return list(self.group_names)
        held = [name for name in self.group_names if name in self.held_at_first_start]
        if self.await_placement:
            group_set.mark_placement_pending(self.raft_dir, self.fsync)  # (before the record of held)
            self.awaiting_placement = True
        group_set.write_held(self.raft_dir, held, self.fsync)
        self.partial = True
        return held

    def _make_group(
        self, name: str, joining: bool, members: dict[str, tuple[str, int]] | None, learner: bool = False
    ) -> Group:
        """Open one group's log and its pysyncobj object, started from the members recorded in its
        folder, else `members` (a group joined now), else those given for it, else this node and
        its peers (recorded too when the folder is new: a restart then starts from them whatever
        its peers are; a folder of an earlier release, started from its peers unrecorded, goes
        on so)."""
        folder = self.raft_dir / name
        recorded = group_set.read_first_members(folder)
        if recorded is None:
            recorded = members if members is not None else self.first_members.get(name)
            if recorded is None and not folder.exists():
                # Unrecorded, a member restarted without its --peer list started its groups alone
                # over the cluster's logs, elected itself and confirmed what no other member saw
                # (a split brain; tests/cluster/test_restart_settings.py has the restart).
                recorded = {self.node_id: self.raft_addr, **self.peers}
            if recorded is not None:
                group_set.write_first_members(folder, recorded, self.fsync)
        self._first_known.update(self.peers if recorded is None else recorded)
        # Who the group's first members are comes from the record; where they are, from --peer
        # when it names them (a member moved to another address, its peers told so).
        peers = (
            self.peers
            if recorded is None
            else {k: self.peers.get(k, v) for k, v in recorded.items() if k != self.node_id}
        )
        g = Group(
            name,
            node_id=self.node_id,
            raft_addr=self.raft_addr,
            peers=peers,
            data_dir=self.data_dir,
            fsync=self.fsync,
            link=self,
            on_commit=self.on_commit,
            on_durable=self._on_durable,
            on_snapshot=self.on_snapshot,
            propose_timeout_s=self.propose_timeout_s,
            proposals_pending_max=self.proposals_pending_max,
            joining=joining,
            settings=self.raft_settings,
            apply_backlog_bytes=self.apply_backlog_bytes,
        )
        g.forward = self._forward
        g.on_failed = self._group_failed
        g.transport.on_non_member = lambda nid, g=g: self.moves.on_non_member(g, nid)
        g.raft_log.journal.on_failed = lambda exc, g=g: self._post(lambda: g.fail(f"journal write failed: {exc}"))
        g.raft_log.journal.wake_writer = not self.inline_sync_bytes_max
        if learner or (folder / LEARNER_MARKER).exists():
            g.start_learning()
        return g

    def stop(self) -> None:
        """Answer everything pending with "stopped", close the groups (journals flushed) and the
        port. Bounded: returns after at most STOP_JOIN_S_MAX even if the hub thread hangs."""
        if self._thread is None:
            if not self._stopped:
                self._stopped = True
                self.hub.close()
            return
        self._stopping = True
        self.hub.wake()
        if threading.current_thread() is self._thread:
            return  # called from a callback: the hub thread stops when the callback returns
        self._thread.join(STOP_JOIN_S_MAX)
        if self._thread.is_alive():
            log.error("replication node %s: hub thread did not stop within %.0f s", self.node_id, STOP_JOIN_S_MAX)

    # ----------------------------------------------------------------------------- API

    def propose(self, group: str, payload: bytes, callback: Callable[[int | None, str | None], None]) -> None:
        if group not in self.group_names:
            raise ValueError(f"unknown group {group!r}")
        if len(payload) > PAYLOAD_BYTES_MAX:
            raise ValueError(f"payload of {len(payload)} bytes exceeds PAYLOAD_BYTES_MAX ({PAYLOAD_BYTES_MAX})")
        if self._thread is None or self._stopping or self._stopped:
            callback(None, "stopped")
            return
        deadline = time.monotonic() + self.propose_timeout_s
        g = self.groups.get(group)
        if g is None:  # held elsewhere: the hub thread sends it to a member that holds it
            self._elsewhere.append((group, bytes(payload), callback, deadline))
        else:
            g.inbox.append((bytes(payload), callback, deadline))
            self._proposed.append(g)
        self._wake()
        if self._stopped:  # raced with the hub thread's exit: it may not have seen this one
            self._drain_after_stop()

    def send_message(self, node_id: str, payload: bytes) -> None:
        """Hand `payload` to the owner on `node_id` (its `on_message`), after what this node's
        owner sent there before (one link, in order), if the link is up when the hub thread takes
        it; else it is dropped, as on a link that goes down with it on the wire (any thread).
        For what a group's leader tells a member holding no replica of it (server/remote.py)."""
        if len(payload) > PAYLOAD_BYTES_MAX + MESSAGE_ENVELOPE_BYTES:
            raise ValueError(f"message of {len(payload)} bytes exceeds {PAYLOAD_BYTES_MAX + MESSAGE_ENVELOPE_BYTES}")
        self._outbox.append((node_id, payload))
        self._wake()

    def leader(self, group: str) -> str | None:
        g = self.groups.get(group)
        if g is None and group in self.group_names:
            return self._leader_hint.get(group)  # held elsewhere: as last heard
        return self._group(group).leader_id

    def heard_leader(self, group: str, node_id: str) -> None:
        """`node_id` says it leads `group`, a group held elsewhere (its leader's reports of the
        group's queues, server/queue_stats.py, every few seconds): the hint `leader` answers and
        proposals go by, which otherwise changes only when a proposal of this node is answered,
        so a node proposing nothing there named a leader long gone (any thread)."""
        if group not in self.group_names or node_id == self.node_id:
            return

        def take() -> None:  # (the hub thread: a group joined meanwhile knows its own leader)
            if group not in self.groups:
                self._leader_hint[group] = node_id

        self._post(take)

    def is_leader(self, group: str) -> bool:
        g = self.groups.get(group)
        if g is None and group in self.group_names:
            return False
        return self._group(group).is_leader

    def held(self) -> list[str]:
        """The groups this node holds a replica of (any thread: a copy)."""
        return list(self.groups)

    def peer_address(self, node_id: str) -> tuple[str, int] | None:
        """Where node_id's Raft listens, as this node knows it (--peer, or a membership change)."""
        return self.raft_addr if node_id == self.node_id else self.hub.addrs.get(node_id)

    def peer_knows(self) -> dict[str, frozenset[str]]:
        """Each linked joining peer's first members (its --peer list at its first start): the
        members its groups take frames from until they are added."""
        return dict(self._peer_knows)

    def peer_held(self) -> dict[str, frozenset[str]]:
        """Linked peers -> the groups each holds, as announced (an earlier release: every group)."""
        return dict(self._peer_held)

    def peers_awaiting_placement(self) -> list[str]:
        """Linked peers that said they wait for the first placement (they hold only the metadata
        group so far: what they announce is not what the placement gives them)."""
        return sorted(self._peers_pending)

    def status(self) -> dict:
        return self._call(lambda: {name: g.status() for name, g in self.groups.items()})

    def mismatched_peers(self) -> dict[str, list[str]]:
        """Peers cut off because they run other groups than this node: peer -> its group list."""
        return dict(self._mismatched)

    def peer_linked(self, node_id: str) -> bool:
        """A link with node_id is open, either way (a node about to join links to its --peer list)."""
        return self.hub.is_up(node_id) or node_id in self.hub.inc_by_peer

    def peer_features(self) -> dict[str, frozenset[str]]:
        """Peers linked now -> the features they announced (machines/features.py)."""
        return dict(self._peer_features)

    def take_snapshot(
        self, group: str, index: int, body: list[bytes], callback: Callable[[Any, str | None], None]
    ) -> None:
        """Save `body` (the machines' state after applying `index`) as the group's snapshot, then
        compact its log below it. callback(header, None) once durable, or (None, why) when a
        snapshot cannot be taken at that index now (the hub thread, or the writer thread)."""
        g = self._group(group)

        def start() -> None:
            header = g.snapshot_header(index)
            if header is None:
                call_safely(callback, None, "not now")
                return

            def write() -> None:
                try:
                    g.write_snapshot(header, body)
                except OSError as exc:
                    log.error("group %s: writing the snapshot at %d failed: %s", group, index, exc)
                    call_safely(callback, None, f"write failed: {exc}")
                    return
                self._post(lambda: (g.snapshot_saved(header), call_safely(callback, header, None)))

            threading.Thread(target=write, name=f"snapshot:{group}", daemon=True).start()

        self._post(start)

    def add_member(
        self,
        node_id: str,
        addr: tuple[str, int],
        callback: Callable[[str | None], None],
        groups: list[str] | None = None,
    ) -> None:
        """Add node_id (reachable at addr, started with joining=True and the current members as
        peers) to every group held here, or to `groups`; callback(None) once committed in each."""
        self._member(("add", node_id, (addr[0], int(addr[1]))), callback, groups)

    def remove_member(
        self, node_id: str, callback: Callable[[str | None], None], groups: list[str] | None = None
    ) -> None:
        """Remove node_id from every group held here, or from `groups` (leadership moves off it
        first); stop it afterwards."""
        self._member(("rem", node_id, None), callback, groups)

    def move_group(
        self,
        group: str,
        add: tuple[str, tuple[str, int]] | None,
        remove: str | None,
        callback: Callable[[str | None], None],
        timeout_s: float = MOVE_TIMEOUT_S,
    ) -> None:
        """Move a replica of `group`, which this node holds: node `add[0]` (at `add[1]`) starts
        the group and is added as a member (it catches up through the log, or a snapshot); once
        it has applied everything committed when it was added, `remove` is removed (leadership
        moves off it first), and leaves the group (its folder is deleted). Either may be None.
        One Raft membership change at a time; the group's proposals go on throughout.
        callback(None) once done, else callback(why) (what was done stays done)."""
        if self._thread is None or self._stopping:
            callback("stopped")
            return
        if add is not None:
            add = (add[0], (add[1][0], int(add[1][1])))
        self._post(lambda: self.moves.start(group, add, remove, callback, timeout_s))

    def start_groups(
        self, members_of: dict[str, dict[str, tuple[str, int]]], done: Callable[[str | None], None]
    ) -> None:
        """Start the groups of the first placement this node waits for (`awaiting_placement`), each
        with the members it gives (this node among them), as at a first start; a group held
        already is left as it is. `done(None)` once they are recorded held (hub thread), else
        `done(why not)`."""

        def start() -> None:
            unknown = sorted(set(members_of) - set(self.group_names))
            if unknown:
                call_safely(done, f"groups {unknown} are not among this node's groups")
                return
            started = []
            for name in self.group_names:
                members = members_of.get(name)
                if members is None or name in self.groups:
                    continue
                # (a folder of a group not held is a left-over: nothing in it is this node's)
                shutil.rmtree(self.raft_dir / name, ignore_errors=True)
                try:
                    g = self._make_group(name, False, members)
                except (OSError, ValueError) as exc:
                    call_safely(done, f"cannot start {name}: {exc}")
                    return
                self.groups[name] = g
                self._touched.add(g)
                started.append(name)
                for nid, addr in members.items():
                    if nid != self.node_id:
                        self.hub.set_address(nid, addr)
                        self.hub.want(nid)
            try:
                group_set.write_held(self.raft_dir, list(self.groups), self.fsync)
                group_set.clear_placement_pending(self.raft_dir)
            except OSError as exc:
                call_safely(done, f"cannot record the groups held: {exc}")
                return
            self.awaiting_placement = False
            log.info("node %s: started groups %s (the first placement)", self.node_id, ", ".join(started) or "none")
            self.announce_held()
            call_safely(done, None)

        self._post(start)

    def transfer_leadership(
        self, group: str, node_id: str, callback: Callable[[str | None], None] | None = None
    ) -> None:
        """Move leadership of group to node_id (pysyncobj's TimeoutNow, retried until node_id has
        caught up; new proposals wait meanwhile, at most 3 s). callback(None) once it leads."""
        g = self._group(group)
        self._post(lambda: g.start_transfer(node_id, callback, time.monotonic()))

    # -------------------------------------------------------------------------- plumbing

    def _group(self, group: str) -> Group:
        g = self.groups.get(group)
        if g is None:
            raise ValueError(f"unknown group {group!r} (or node not started)")
        return g

    def resume_deliveries(self) -> None:
        """The on_commit consumer has caught up after deliveries were held for it
        (`apply_backlog_bytes`; any thread): every group delivers again at once, not at its
        next periodic tick."""
        self._post(lambda: self._touched.update(self.groups.values()))

    def _wake(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            self.hub.wake()

    def _group_failed(self, group: Group, why: str) -> None:
        """A group failed (hub thread): the whole node stops (see Fail-stop above)."""
        if self.fatal is None:
            self.fatal = f"group {group.name}: {why}"
            self._wake()

    def _post(self, fn: Callable[[], None]) -> None:
        self._calls.append(fn)
        self._wake()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run fn in the hub thread and return its result (bounded wait)."""
        if self._thread is None or not self._thread.is_alive() or threading.current_thread() is self._thread:
            return fn()
        box: list = []
        done = threading.Event()

        def run() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed back to the caller
                box.append((False, exc))
            done.set()

        self._post(run)
        if not done.wait(CALL_WAIT_S_MAX):
            raise TimeoutError(f"replication hub did not answer within {CALL_WAIT_S_MAX} s")
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _member(self, change: tuple, callback: Callable[[str | None], None], groups: list[str] | None = None) -> None:
        if self._thread is None or self._stopping:
            callback("stopped")
            return
        self._post(lambda: self._member_start(change, callback, groups))

    # ---------------------------------------------------------------- link (for groups)

    def peer_is_up(self, node_id: str) -> bool:
        return not self._cut_off(node_id) and self.hub.is_up(node_id)

    def send_raft(self, node_id: str, body: bytes) -> bool:
        if self._cut_off(node_id):
            return False
        return self.hub.send(node_id, wire.KIND_RAFT, body)

    def add_peer(self, group: str, node_id: str, addr: tuple[str, int] | None) -> None:
        if node_id == self.node_id:
            return
        if addr is not None:
            self.hub.set_address(node_id, addr)
        elif node_id in self.peers:
            self.hub.set_address(node_id, self.peers[node_id])
        self._peer_groups[node_id].add(group)
        self._unwant_at.pop(node_id, None)
        self.hub.want(node_id)

    def drop_peer(self, group: str, node_id: str) -> None:
        gs = self._peer_groups.get(node_id)
        if gs is not None:
            gs.discard(group)
            # (Keep the link a little longer: the "removed" notice goes over it. A node holding
            # only some groups keeps it: its proposals for other groups go over such links.)
            if not gs and not self.partial:
                self._unwant_at[node_id] = time.monotonic() + UNWANT_GRACE_S

    # ------------------------------------------------------------------ hub callbacks

    def _on_durable(self, g: Group) -> None:  # a Journal writer thread
        self._durable.append(g)
        self._wake()

    def _announce(self, peer: str) -> None:
        # (an older release ignores an op it does not know, and keys it does not read: the
        # check is only between new ones)
        announce: dict[str, Any] = {
            "op": "groups",
            "groups": self.group_names,
            "features": self.features,
            "held": sorted(self.groups),
        }
        if self.incarnation is not None:
            announce["incarnation"] = self.incarnation
            if self.joining:  # (started as a new member: --join on)
                announce["joining"] = True
                announce["knows"] = sorted(self._first_known - {self.node_id})
        if self.awaiting_placement:
            announce["pending"] = True
        self.hub.send(peer, wire.KIND_CONTROL, wire.encode_control(announce))

    def announce_held(self) -> None:
        """Tell every peer linked now what this node holds (hub thread), after a change: each
        link's first message says it too (`_on_peer_up`). Every linked peer, not only those
        whose own announcement came: a peer whose link to here came up after this one did had
        heard only the list before the change, and took this node for holding none of the
        groups it had just started (in a cluster test a member waited 60 s on "not leader" for
        a group whose holders had announced it to the others only)."""
        for peer in sorted(set(self.peers) | set(self._peer_groups) | set(self._peer_held)):
            if self.hub.is_up(peer):
                self._announce(peer)

    def _forget_announced(self, peer: str) -> None:
        """What `peer` announced (its features, the groups it holds) was said over a link now
        closed: a node that joins linked only to us, stopped and started again holding other
        groups, was taken for what it had said before (`maxqctl add-node` read it)."""
        self._peer_features.pop(peer, None)
        self._peer_held.pop(peer, None)
        self._peer_knows.pop(peer, None)
        self._peers_pending.discard(peer)

    def _on_peer_up(self, peer: str) -> None:
        self._announce(peer)
        refused = self._data_lost.get(peer)
        if refused is not None:  # (said again on each link: the one it was first said on may have been down)
            self.hub.send(peer, wire.KIND_CONTROL, wire.encode_control({"op": "data_lost", "incarnation": refused}))
        for g in self.groups.values():
            g.transport.peer_up(peer)
            self._touched.add(g)

    # --------------------------------------------------------------- forwarded proposals

    def _forward(self, g: Group, payload: bytes, callback: Callable, deadline: float) -> bool:
        """Carry a proposal made here to the group's leader (hub thread). False: no leader to ask."""
        leader = g.leader_id
        if leader is None or leader == self.node_id or not self.hub.is_up(leader):
            return False
        req = next(self._req_ids)
        body = wire.encode_control(
            {
                "op": "propose",
                "req": req,
                "group": g.name,
                "payload": payload,
                "ttl_s": max(0.0, deadline - time.monotonic()),
            }
        )
        if not self.hub.send(leader, wire.KIND_CONTROL, body):
            return False
        self._forwards[req] = (leader, callback, deadline, g, g.name)
        self.stats["proposals_forwarded"] += 1
        return True

    def _send_elsewhere(self, name: str, payload: bytes, callback: Callable, deadline: float) -> None:
        """A proposal for a group this node does not hold (hub thread): to its leader as last
        heard, else to a linked peer that holds it (which answers "not leader" with the leader's
        name when it is not: the proposer's retry then goes there). Answered at commit: there is
        nothing to apply here."""
        g = self.groups.get(name)
        if g is not None:  # joined meanwhile
            g.inbox.append((payload, callback, deadline))
            self._touched.add(g)
            return
        if deadline <= time.monotonic():
            call_safely(callback, None, "timeout")
            return
        target = self._leader_hint.get(name)
        if target is None or not self.peer_is_up(target) or name not in self._peer_held.get(target, ()):
            holders = sorted(p for p, held in self._peer_held.items() if name in held and self.peer_is_up(p))
            target = holders[0] if holders else None
        if target is None:
            call_safely(callback, None, "not leader")  # no member holding it is linked now
            return
        req = next(self._req_ids)
        body = wire.encode_control(
            {
                "op": "propose",
                "req": req,
                "group": name,
                "payload": payload,
                "ttl_s": max(0.0, deadline - time.monotonic()),
            }
        )
        if not self.hub.send(target, wire.KIND_CONTROL, body):
            call_safely(callback, None, "not leader")
            return
        self._forwards[req] = (target, callback, deadline, None, name)
        self.stats["proposals_sent_elsewhere"] += 1

    def _send_message(self, node_id: str, payload: bytes) -> None:
        if self._cut_off(node_id) or not self.hub.send(
            node_id, wire.KIND_CONTROL, wire.encode_control({"op": "message", "payload": payload})
        ):
            self.stats["messages_dropped"] += 1
        else:
            self.stats["messages_sent"] += 1

    def _on_forwarded_proposal(self, peer: str, m: dict) -> None:
        req, name, payload, ttl_s = m.get("req"), m.get("group"), m.get("payload"), m.get("ttl_s")
        if (
            type(req) is not int
            or type(name) is not str
            or type(payload) is not bytes
            or type(ttl_s) not in (int, float)
            or len(payload) > PAYLOAD_BYTES_MAX
        ):
            raise wire.WireError(f"bad forwarded proposal from {peer}")
        hub = self.hub

        g = self.groups.get(name)

        def reply(index: int | None, error: str | None) -> None:
            answer: dict[str, Any] = {"op": "propose_reply", "req": req, "index": index, "error": error}
            if error == "not leader" and g is not None and g.leader_id not in (None, self.node_id):
                answer["leader"] = g.leader_id  # for a node that holds no replica (an older one ignores it)
            hub.send(peer, wire.KIND_CONTROL, wire.encode_control(answer))

        reply.forwarded = True  # a proposal answered here, never sent on to another node
        if g is None:
            # A group this node does not hold (it left it, or the sender's list of holders is
            # out of date): "not leader", so that the sender tries a member that holds it.
            reply(None, "not leader" if name in self.group_names else "stopped")
            return
        g.inbox.append((payload, reply, time.monotonic() + min(float(ttl_s), self.propose_timeout_s)))
        self._touched.add(g)

    def _on_proposal_reply(self, m: dict) -> None:
        entry = self._forwards.pop(m.get("req"), None)
        if entry is None:
            return  # timed out here already
        index, error = m.get("index"), m.get("error")
        if not ((type(index) is int and error is None) or (index is None and type(error) is str)):
            index, error = None, "timeout"  # a malformed answer: the outcome is unknown
        if entry[3] is None:  # a group held elsewhere: committed there is all there is to wait for
            name = entry[4]
            hint = m.get("leader")
            if error == "not leader" and type(hint) is str and hint != self.node_id:
                self._leader_hint[name] = hint
            elif error is None:
                self._leader_hint[name] = entry[0]  # it answered: it leads (it never forwards)
            else:
                self._leader_hint.pop(name, None)
            call_safely(entry[1], index, error)
            return
        if error is None:
            # Committed; answered once it is applied here too, as a proposal made here is, so the
            # proposer finds its effects in its own machines.
            entry[3].answer_when_applied(index, entry[1])
            self._touched.add(entry[3])
        else:
            call_safely(entry[1], index, error)

    def _expire_forwards(self, now: float, peer_down: str | None = None) -> None:
        for req, (leader, callback, deadline, _g, _name) in list(self._forwards.items()):
            if deadline <= now or leader == peer_down:
                del self._forwards[req]
                # The leader may have committed it: the outcome is unknown, as with any timeout.
                call_safely(callback, None, "timeout")

    def _on_peer_down(self, peer: str) -> None:
        self._forget_announced(peer)
        self._expire_forwards(time.monotonic(), peer_down=peer)
        for g in self.groups.values():
            g.transport.peer_down(peer)
            self._touched.add(g)

    def _on_frame(self, peer: str, kind: int, body: bytes) -> None:
        if kind == wire.KIND_RAFT:
            try:
                name, msg = wire.decode_raft(body)
            except wire.WireError as exc:
                self.stats["bad_raft_frames"] += 1
                if self.stats["bad_raft_frames"] <= 10 or self.stats["bad_raft_frames"] % 1000 == 0:
                    log.warning("dropping a raft frame from %s: %s", peer, exc)
                return
            if self._cut_off(peer):
                self.stats["frames_from_mismatched_peers"] += 1
                return
            g = self.groups.get(name)
            if g is None or g.failed is not None:
                self.stats["frames_for_unknown_group"] += 1
                return
            g.transport.receive(peer, msg)
            self._touched.add(g)
        elif kind == wire.KIND_CONTROL:
            try:
                self._on_control(peer, wire.decode_control(body))
            except wire.WireError as exc:
                self.stats["bad_control_frames"] += 1
                log.warning("dropping a control frame from %s: %s", peer, exc)
        else:
            self.stats["unknown_frames"] += 1

    def _on_control(self, peer: str, m: dict) -> None:
        op = m["op"]
        if op == "groups":
            self._on_peer_groups(peer, m.get("groups"))
            features = m.get("features", [])
            if type(features) is not list or not all(type(name) is str for name in features):
                raise wire.WireError(f"bad feature list from {peer}: {features!r}"[:200])
            self._peer_features[peer] = frozenset(features)
            held = m.get("held", m.get("groups"))  # an earlier release holds every group
            if type(held) is not list or not all(type(name) is str for name in held):
                raise wire.WireError(f"bad held-group list from {peer}: {held!r}"[:200])
            self._peer_held[peer] = frozenset(held)
            if m.get("pending") is True:  # (waits for the first placement: `start_groups`)
                self._peers_pending.add(peer)
            else:
                self._peers_pending.discard(peer)
            knows = m.get("knows")
            if m.get("joining") is True and type(knows) is list and all(type(name) is str for name in knows):
                self._peer_knows[peer] = frozenset(knows)
            else:
                self._peer_knows.pop(peer, None)
            self._check_incarnation(peer, m.get("incarnation"), m.get("joining") is True)
            return
        if op == "data_lost":
            if m.get("incarnation") == self.incarnation:
                log.critical(
                    "node %s: %s refuses this member: it knew %s with other Raft data, so this data folder is not "
                    "the one this member had (an empty folder, a disk replaced). Until it is repaired it takes no "
                    "part in any group: `maxqctl repair-member %s --raft-addr HOST:PORT` from another member, then "
                    "start it with --repair-from-peers (docs/operations.md)",
                    self.node_id,
                    peer,
                    self.node_id,
                    self.node_id,
                )
            return
        if self._cut_off(peer):
            self.stats["frames_from_mismatched_peers"] += 1
            return  # (a forwarded proposal of a peer that hashes queues elsewhere: never ours to commit)
        if op == "member":
            req, name, action, nid = m.get("req"), m.get("group"), m.get("action"), m.get("node")
            host, port = m.get("host"), m.get("port")
            if (
                type(req) is not int
                or type(name) is not str
                or action not in ("add", "rem")
                or type(nid) is not str
                or (action == "add" and (type(host) is not str or type(port) is not int))
            ):
                raise wire.WireError(f"bad member request {m!r}")

            def reply(err: str | None) -> None:
                self.hub.send(
                    peer,
                    wire.KIND_CONTROL,
                    wire.encode_control({"op": "member_reply", "req": req, "group": name, "error": err}),
                )

            g = self.groups.get(name)
            if g is None:
                reply("no such group")
                return
            g.member_request(action, nid, (host, port) if action == "add" else None, reply, time.monotonic())
            self._touched.add(g)
        elif self.moves.on_control(peer, op, m):
            pass
        elif op == "propose":
            self._on_forwarded_proposal(peer, m)
        elif op == "propose_reply":
            self._on_proposal_reply(m)
        elif op == "message":
            payload = m.get("payload")
            if type(payload) is not bytes:
                raise wire.WireError(f"bad message from {peer}")
            self.stats["messages_received"] += 1
            if self.on_message is not None:
                call_safely(self.on_message, peer, payload)
        elif op == "removed":
            names = m.get("groups")
            if type(names) is not list:
                raise wire.WireError(f"bad removed notice {m!r}")
            for name in names:
                g = self.groups.get(name) if type(name) is str else None
                if g is not None and not g.removed:
                    log.warning(
                        "node %s: %s says this node was removed from group %s; it goes silent there",
                        self.node_id,
                        peer,
                        name,
                    )
                    g.mark_removed()
        elif op == "member_reply":
            req, name, err = m.get("req"), m.get("group"), m.get("error")
            if type(req) is int and type(name) is str and (err is None or type(err) is str):
                self._member_reply(name, req, err)

    def _cut_off(self, peer: str) -> bool:
        """Whether `peer` takes no part in any group here: it runs other groups, or came back
        with data other than what it had."""
        return peer in self._mismatched or peer in self._data_lost

    def _check_incarnation(self, peer: str, incarnation: Any, joining: bool = False) -> None:
        """A peer's folder says which it is (server/folder_owner.py). One announcing another than
        the one recorded for it while it is a member of a group held here, started as the member
        it was (not --join on), lost its data (an empty folder started under its name): it
        would vote, and count toward commits, with a log and a vote it no longer has, so its
        frames are dropped until it comes back with the folder it had, or is repaired. A peer
        started as a new member (--join on: added back after a removal, or repaired) is taken
        with its new folder: a leader appends the return of a member added back before that
        member's own link to it is up, and refused it for good (a jepsen-style run,
        docs/replication.md). An earlier release announces none: not checked."""
        if incarnation is None:
            return
        if type(incarnation) is not str or len(incarnation) > 64:
            raise wire.WireError(f"bad incarnation from {peer}: {incarnation!r}"[:200])
        known = self._known_incarnations()
        if known.get(peer) == incarnation:
            if self._data_lost.pop(peer, None) is not None:
                log.warning("node %s: %s is back with the data it had; it takes part again", self.node_id, peer)
            return
        member_of = sorted(name for name, g in self.groups.items() if peer in g.member_ids())
        if peer in known and member_of and not joining:
            if self._data_lost.get(peer) != incarnation:
                log.critical(
                    "node %s: %s came back with other Raft data than it had (incarnation %s, was %s): its data was "
                    "lost or replaced, and a member that forgot its log and vote can elect a leader missing "
                    "committed entries. It takes no part in %s until it is repaired: `maxqctl repair-member %s "
                    "--raft-addr HOST:PORT`, then start it with --repair-from-peers (docs/operations.md)",
                    self.node_id,
                    peer,
                    incarnation,
                    known[peer],
                    ", ".join(member_of),
                    peer,
                )
            self._data_lost[peer] = incarnation
            self.hub.send(peer, wire.KIND_CONTROL, wire.encode_control({"op": "data_lost", "incarnation": incarnation}))
            return
        # A peer first seen, or a member removed from every group here and back with new data
        # (repair-member, a member added again): its incarnation from now on.
        self._data_lost.pop(peer, None)
        known[peer] = incarnation
        try:
            group_set.write_incarnations(self.raft_dir, known, self.fsync)
        except OSError as exc:
            log.error("node %s: cannot record %s's incarnation: %s", self.node_id, peer, exc)

    def _recheck_data_lost(self) -> None:
        """A refused peer that is no member of any group here any more (removed, as
        repair-member does first) is taken with its new data: it may be added back."""
        for peer, incarnation in list(self._data_lost.items()):
            if not any(peer in g.member_ids() for g in self.groups.values()):
                log.info("node %s: %s is no member of a group here: its new data is taken", self.node_id, peer)
                self._check_incarnation(peer, incarnation)

    def _known_incarnations(self) -> dict[str, str]:
        if self._incarnations is None:
            self._incarnations = group_set.read_incarnations(self.raft_dir)
        return self._incarnations

    def _on_peer_groups(self, peer: str, groups: Any) -> None:
        if type(groups) is not list or not all(type(name) is str for name in groups):
            raise wire.WireError(f"bad group list from {peer}: {groups!r}"[:200])
        taken = self.on_peer_groups is not None and self.on_peer_groups(peer, list(groups))
        if sorted(groups) == sorted(self.group_names):
            if self._mismatched.pop(peer, None) is not None:
                log.warning("node %s: %s now runs the same groups; it is part of them again", self.node_id, peer)
            return
        if self._mismatched.get(peer) != groups and not taken:
            log.error(
                "node %s: %s runs %d groups (%s), this node %d (%s): it is cut off from every group. Every "
                "member must run the same shard groups (--shards; a member's count is kept in its data "
                "folder): start the odd one with the others' count",
                self.node_id,
                peer,
                len(groups),
                ", ".join(groups[:8]) + (", ..." if len(groups) > 8 else ""),
                len(self.group_names),
                ", ".join(self.group_names[:8]) + (", ..." if len(self.group_names) > 8 else ""),
            )
        self._mismatched[peer] = list(groups)

    # ------------------------------------------------------------- membership changes

    def _member_start(
        self, change: tuple, callback: Callable[[str | None], None], groups: list[str] | None = None
    ) -> None:
        """Start a membership change of every group held here, or of `groups` (a move)."""
        if self._member_change is not None:
            callback("busy: another membership change is in progress")
            return
        action, nid, addr = change
        now = time.monotonic()
        if nid == self.node_id and action == "add":
            callback(None)
            return
        self._member_change = {
            "action": action,
            "node": nid,
            "addr": addr,
            "callback": callback,
            "deadline": now + self.member_change_timeout_s,
            "probe_until": None,
            "groups": {
                name: {"state": "todo", "retry_at": now, "req": 0, "sent_at": 0.0, "error": None}
                for name in (self.groups if groups is None else groups)
            },
        }
        if action == "add":
            # pysyncobj adds a node that never starts without a word, and the group then needs a
            # bigger majority of the rest: only add a node that answers the handshake now.
            self.hub.set_address(nid, addr)
            self.hub.want(nid)
            self._member_change["probe_until"] = now + MEMBER_PROBE_S
        self._member_step(now)

    def _member_reply(self, name: str, req: int, err: str | None) -> None:
        mc = self._member_change
        if mc is None:
            return
        st = mc["groups"].get(name)
        if st is None or st["req"] != req or st["state"] != "wait":
            return
        if err is None:
            st["state"] = "done"
        else:
            st.update(state="todo", retry_at=time.monotonic() + MEMBER_RETRY_S, error=err)

    def _member_step(self, now: float) -> None:
        mc = self._member_change
        if mc is None:
            return
        if mc["probe_until"] is not None:
            if not self.hub.is_up(mc["node"]):
                if now > mc["probe_until"]:
                    self._member_change = None
                    if not self._peer_groups.get(mc["node"]):
                        self._unwant_at[mc["node"]] = now
                    call_safely(
                        mc["callback"],
                        f"unreachable: {mc['node']} did not complete the handshake at {mc['addr']} "
                        f"within {MEMBER_PROBE_S:.0f} s (start it, with the cluster secret, first)",
                    )
                return
            mc["probe_until"] = None
        for name, st in mc["groups"].items():
            if st["state"] == "wait" and now - st["sent_at"] > MEMBER_ATTEMPT_S:
                st.update(state="todo", error="no answer")
            if st["state"] != "todo" or now < st["retry_at"]:
                continue
            g = self.groups.get(name)
            if g is None:  # left meanwhile (a move's removal of this node reached it first)
                st["state"] = "done"
                continue
            leader = g.leader_id
            if leader is None:
                st["error"] = "no leader"
                continue
            req = next(self._req_ids)
            st.update(state="wait", req=req, sent_at=now)
            if leader == self.node_id:
                g.member_request(
                    mc["action"],
                    mc["node"],
                    mc["addr"],
                    lambda err, name=name, req=req: self._member_reply(name, req, err),
                    now,
                )
                self._touched.add(g)
            else:
                host, port = mc["addr"] if mc["addr"] is not None else (None, None)
                body = wire.encode_control(
                    {
                        "op": "member",
                        "req": req,
                        "group": name,
                        "action": mc["action"],
                        "node": mc["node"],
                        "host": host,
                        "port": port,
                    }
                )
                if not self.hub.send(leader, wire.KIND_CONTROL, body):
                    st.update(state="todo", retry_at=now + MEMBER_RETRY_S, error=f"leader {leader} unreachable")
        if all(st["state"] == "done" for st in mc["groups"].values()):
            self._member_change = None
            if mc["action"] == "rem":
                # pysyncobj never tells a removed node (its leader stops replicating to it before
                # the removal reaches it): say so, so that it stops campaigning (best effort).
                if mc["node"] == self.node_id:  # this node removed itself: no message to itself
                    for name in mc["groups"]:
                        g = self.groups.get(name)
                        if g is not None:
                            g.mark_removed()
                else:
                    self.hub.send(
                        mc["node"],
                        wire.KIND_CONTROL,
                        wire.encode_control({"op": "removed", "groups": list(mc["groups"])}),
                    )
            call_safely(mc["callback"], None)
        elif now > mc["deadline"]:
            self._member_change = None
            left = {n: st["error"] for n, st in mc["groups"].items() if st["state"] != "done"}
            call_safely(mc["callback"], f"timeout: not done in {left}")

    # --------------------------------------------------------------------- the hub thread

    def _run(self) -> None:
        hub = self.hub
        next_tick = 0.0
        more = False
        try:
            while not self._stopping and self.fatal is None:
                now = time.monotonic()
                hub.poll(0.0 if more else max(0.0, next_tick - now))
                self._wake_pending = False  # before draining: a producer after this wakes us again
                more = False
                for _ in range(len(self._calls)):
                    fn = self._calls.popleft()
                    try:
                        fn()
                    except Exception:
                        log.exception("replication hub call raised")
                for _ in range(len(self._elsewhere)):
                    self._send_elsewhere(*self._elsewhere.popleft())
                for _ in range(len(self._outbox)):
                    self._send_message(*self._outbox.popleft())
                touched = self._touched
                while self._proposed:
                    touched.add(self._proposed.popleft())
                seen: set[Group] = set()
                while self._durable:
                    g = self._durable.popleft()
                    if g not in seen:
                        seen.add(g)
                        more |= g.durable_advanced()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + self.tick_interval_s
                    hub.maintain(now)
                    for g in self.groups.values():
                        g.sweep(now)
                        touched.add(g)
                    if self._forwards:
                        self._expire_forwards(now)
                    self._member_step(now)
                    if self._data_lost:
                        self._recheck_data_lost()
                    self.moves.step(now)
                    self.moves.leave_removed_groups()
                    self.held_everywhere = self.partial and self._holds_every_group_everywhere()
                    for nid, at in list(self._unwant_at.items()):
                        if now >= at:
                            del self._unwant_at[nid]
                            hub.unwant(nid)
                self._touched = set()
                for g in touched:
                    more |= g.tick(now)
                hub.flush()
                if self.inline_sync_bytes_max:
                    wrote, later = self._write_pending()
                    more |= later
                    if wrote:
                        hub.flush()  # (acks and commits that the writes released)
        except (JournalError, OSError) as exc:  # the disk (a full one, an I/O error), not a bug of ours
            self.fatal = self.fatal or f"storage failed: {exc}"
        except BaseException as exc:
            log.critical("replication hub thread of %s crashed", self.node_id, exc_info=True)
            self.fatal = self.fatal or f"the replication hub thread crashed: {exc!r}"
        finally:
            self._shutdown()
            if self.fatal is not None and not self._stopping:
                log.critical("replication node %s stopped: %s", self.node_id, self.fatal)
                if self.on_fatal is not None:
                    call_safely(self.on_fatal, self.fatal)

    def _holds_every_group_everywhere(self) -> bool:
        """Whether this node holds every group (none as a learner) and every other member of them
        announced holding every group too (hub thread)."""
        if len(self.groups) != len(self.group_names) or any(g.learning for g in self.groups.values()):
            return False
        names = frozenset(self.group_names)
        members: set[str] = set()
        for g in self.groups.values():
            members.update(g.member_ids())
        members.discard(self.node_id)
        return all(self._peer_held.get(m) == names for m in members)

    def _write_pending(self) -> tuple[bool, bool]:
        """After the frames went out: each group's small batch of new entries written and
        fdatasynced here rather than handed to its journal's writer thread and back (two thread
        hops fewer on the path of a commit at low rates); a large one goes to the writer.
        Returns (whether any was written here, whether a group has more to deliver)."""
        wrote = more = False
        for g in self.groups.values():
            journal = g.raft_log.journal
            if g.failed is None and journal.write_pending(self.inline_sync_bytes_max) is not None:
                self.stats["inline_syncs"] += 1
                more |= g.durable_advanced()
                wrote = True
        return wrote, more

    def _shutdown(self) -> None:
        self._stopped = True
        mc, self._member_change = self._member_change, None
        if mc is not None:
            call_safely(mc["callback"], "stopped")
        self.moves.stop()
        forwards, self._forwards = self._forwards, {}
        for _leader, callback, _deadline, _g, _name in forwards.values():
            call_safely(callback, None, "stopped")  # the leader may still commit it: unknown, as any stop
        while self._elsewhere:
            _, _, callback, _ = self._elsewhere.popleft()
            call_safely(callback, None, "stopped")
        self._outbox.clear()
        for g in self.groups.values():
            g.close()  # answers pending proposals with "stopped", flushes and closes the journal
        while self._calls:
            try:
                self._calls.popleft()()
            except Exception:
                log.exception("replication hub call raised during shutdown")
        self.hub.close()

    def _drain_after_stop(self) -> None:
        while self._elsewhere:
            try:
                _, _, cb, _ = self._elsewhere.popleft()
            except IndexError:
                break
            call_safely(cb, None, "stopped")
        for g in self.groups.values():
            while g.inbox:
                try:
                    _, cb, _ = g.inbox.popleft()
                except IndexError:
                    break
                call_safely(cb, None, "stopped")
