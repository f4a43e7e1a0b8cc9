"""The seams between pysyncobj and the network, for one Raft group (docs/design.md §3).

Theory of operation
-------------------
pysyncobj talks to a `Transport`: it calls `send(node, message)` with plain dicts and expects
`_onMessageReceived(node, message)` back. `GroupTransport` is that transport for one group. It
does not own sockets: it encodes messages (wire.py) and hands them to a `link` (the engine's
hub, which multiplexes every group over one authenticated TCP port per node). On the way it
repairs pysyncobj 0.3.17's defects, using its pinned private message formats:

1. hold (durability): a message that claims entries (follower: a successful next_node_idx)
   waits in a per-peer FIFO until the local Journal reports those entries durable; everything
   sent to that peer later waits behind it, so order is kept. On release a held message whose
   entry was truncated or replaced meanwhile (its (index, term) is gone) is dropped, and so is
   one made in a past term. Consecutive acks released together are coalesced into the last one.
   The leader's append_entries go out before its own fsync ends (Raft lets the leader write in
   parallel with its followers: the round trip and the fsync overlap): pysyncobj counts the
   leader as holding every entry it appended, so its commit index may name entries on fewer
   than a majority of disks. Two things keep that from being seen: every append_entries
   carries commit_index capped at the local durable index (a follower applies only what the
   leader's disk and the acking followers' disks hold: a majority), and the leader itself
   delivers only up to its durable index (group.py, `deliver`). When the durable index moves
   past what a peer was told, the commit is sent at once (`release`). An append that carries a
   membership change is still held until durable here (pysyncobj acts on a membership entry
   when it is appended, and the engine waits on its commit to make the next change).
2. guard (follower, stale appends): pysyncobj truncates after prevLogIdx whenever its log is
   longer, without comparing terms, and its leader rewinds nextIndex after every ack, so
   re-sent old appends are routine and used to cut acknowledged entries. Before pysyncobj sees
   an append_entries, entries the log already holds with the same term are removed from it
   (prevLogIdx moves past them); a real term conflict is passed on, so pysyncobj truncates
   from the first conflicting index as Raft requires. If every entry matches and the log is
   longer: when the last local entry has the leader's term, prevLogIdx moves to it (that entry
   came from this leader, so by Log Matching the whole prefix is the leader's); otherwise the
   message loses its entries and prevLogIdx (pysyncobj then records only leader and commit,
   with commit capped at the verified index) and we ack the verified index ourselves.
   Ack floor: a follower never acks less than it already acked to the same leader in the same
   term while that entry is still in the log.
3. conflict clamp (follower): after a prevLogTerm mismatch at p, pysyncobj answers the
   leader's other pipelined appends with "send from my end", undoing the back-up (a livelock
   measured on stock pysyncobj, docs/design.md §3). Until the first entry of the conflicting
   term is gone, every "reset" reply points at it (which is also Raft's fast back-up), but
   never at or below the first entry a compaction kept (`_hint_floor`).
4. dedup (leader): entries already put on the current connection are not sent again when
   pysyncobj rewinds nextIndex; an all-duplicate message becomes a heartbeat. A heartbeat (an
   append with no entry left) is dropped if an append of the same term went to that follower
   less than `heartbeat_s` ago and it carries no new commit index: pysyncobj tries one every
   appendEntriesPeriod, half as often would do (group.py, HEARTBEAT_PERIODS). A reset reply,
   a reconnect or a new term forgets what was sent.
5. terms on acks: next_node_idx carries no term in pysyncobj; we add the follower's term on
   the wire and the leader drops acks and rejections from any other term.
6. snapshots (snapshot_install.py): a follower behind the leader's compacted log is installed
   by our own chunked, flow-controlled transfer; pysyncobj is told it is disconnected meanwhile.
7. catch-up pace (leader): pysyncobj sends the next batch to a follower that is behind only at
   its next append, which in an idle group is its next heartbeat (its period, checked at the
   hub's 0.05 s tick: 0.05-0.1 s apart), when its send loop stopped at its time bound: a learner
   catching up through 64 MiB of log at a few 2 MiB batches per heartbeat. An ack that covers
   everything on the wire to that follower while the log holds more makes the next tick send
   at once (`catch_up_sends`).
Also: forwarded commands (apply_command) are never sent: pysyncobj's follower-side forwarding
is answered locally with NOT_LEADER (the broker forwards itself); messages from nodes that are
not members of the group are dropped; a node started with `joining=True` tells pysyncobj about
its peers only after a leader has replicated to it, so it does not campaign before it is added.
"""

from __future__ import annotations

import bisect
import collections
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from pysyncobj.config import FAIL_REASON
from pysyncobj.node import Node
from pysyncobj.transport import Transport

from . import wire
from .snapshot_file import SnapshotError
from .snapshot_install import InstallReceiver, InstallSender

__all__ = ["GroupTransport", "Link", "HELD_BYTES_MAX"]

log = logging.getLogger(__name__)

HELD_BYTES_MAX = 64 * 1024 * 1024  # per peer; beyond it messages are dropped (Raft re-sends)


class Link(Protocol):
    """What the transport needs from the engine's hub."""

    def peer_is_up(self, node_id: str) -> bool: ...

    def send_raft(self, node_id: str, body: bytes) -> bool: ...

    def add_peer(self, group: str, node_id: str, addr: tuple[str, int] | None) -> None: ...

    def drop_peer(self, group: str, node_id: str) -> None: ...


class _Held:
    __slots__ = ("need", "check_idx", "check_term", "body", "is_ack", "term", "ack_idx")

    def __init__(
        self,
        need: int,
        check_idx: int,
        check_term: int | None,
        body: bytes,
        is_ack: bool,
        term: int | None,
        ack_idx: int,
    ) -> None:
        self.need, self.check_idx, self.check_term = need, check_idx, check_term
        self.body, self.is_ack, self.term, self.ack_idx = body, is_ack, term, ack_idx


class GroupTransport(Transport):
    def __init__(
        self,
        syncObj,
        selfNode,
        otherNodes,
        *,
        group: str,
        link: Link,
        raft_log: Any,  # noqa: N803
        joining: bool = False,
        heartbeat_s: float = 0.05,
        seams: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.so = syncObj
        self.group = group
        self.link = link
        self.log = raft_log
        self.self_node = selfNode
        self.seams = seams  # False only in tests that show stock pysyncobj's behaviour
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.nodes: dict[str, Node] = {}  # the members, and the learners
        # Learners (a group move's new member while it catches up): nodes this member sends the
        # log to, as pysyncobj's read-only nodes, which are not counted for a commit or a vote
        # and do not vote; promoted when a membership change adds them (`addNode`).
        self.learners: set[str] = set()
        # learner -> when a move last asked for it (monotonic s): a move under way elsewhere
        self.learner_asked_at: dict[str, float] = {}
        self.connected: set[str] = set()  # what pysyncobj was told (members and learners)
        self.joined = not joining
        self.held: dict[str, collections.deque[_Held]] = {}
        self.held_bytes: dict[str, int] = {}
        self.sent_hi: dict[str, tuple[int, int]] = {}  # leader: node -> (term, highest entry index sent)
        self.commit_sent: dict[str, int] = {}
        self.last_append: dict[str, tuple[int, float]] = {}  # (term, when) of the last append_entries wired
        self.hint: tuple[int, int] | None = None  # follower: (first index, term) of a conflicting run
        self.floor: dict[str, tuple[int, int, int]] = {}  # follower: leader -> (term, acked index, its term)
        self.last_ack: dict[str, tuple[int, int]] = {}  # follower: leader -> (term, index) last ack on the wire
        self.acked: tuple[int, int] = (-1, 0)  # follower: (term, highest index acked on the wire in it)
        self.rejected_requests: list[int] = []
        self.silent = False  # set once this node learns it was removed from the group
        # told of every message dropped because its sender is not a member (the engine may tell
        # a node that was removed while it was down: engine.py, `_on_non_member`)
        self.on_non_member: Callable[[str], None] | None = None
        self.membership_cache: dict[bytes, bytes] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        # snapshots: set by the group
        self.snapshot_source: Callable[[], Any] | None = None  # the latest local snapshot header
        self.on_installed: Callable[[Any, str, int], None] | None = None  # (header, leader id, term)
        self.snap_dir = None
        self.installs: dict[str, InstallSender] = {}  # leader: follower -> transfer
        self.receiver: InstallReceiver | None = None  # follower: the snapshot coming in
        raft_log.on_truncate = self._on_truncate
        for node in otherNodes:
            self.addNode(node)

    # ------------------------------------------------------------------ pysyncobj Transport

    @property
    def ready(self) -> bool:
        return True

    def tryGetReady(self) -> None:  # noqa: N802
        pass

    def waitReady(self) -> None:  # noqa: N802
        pass

    def addNode(self, node: Node) -> None:  # noqa: N802
        if node.id in self.learners:
            # A learner becomes a member: pysyncobj has just put it among the members with fresh
            # indexes; it must leave the read-only set without the read-only path's clean-up,
            # which would drop those indexes (the node stays connected).
            self.learners.discard(node.id)
            self.learner_asked_at.pop(node.id, None)
            self.so._SyncObj__readonlyNodes.discard(self.nodes[node.id])
            self.stats["learners_promoted"] += 1
        self.nodes[node.id] = node
        self.link.add_peer(self.group, node.id, getattr(node, "raft_addr", None))
        if self.joined and self.link.peer_is_up(node.id):
            self._tell_connected(node.id)

    def dropNode(self, node: Node) -> None:  # noqa: N802
        nid = node.id
        sender = self.installs.pop(nid, None)
        if sender is not None:
            sender.close()
        self._forget(nid)
        self.held.pop(nid, None)
        self.held_bytes.pop(nid, None)
        if nid in self.connected:
            self._tell_disconnected(nid, self.nodes.get(nid, node))
        self.learners.discard(nid)
        self.learner_asked_at.pop(nid, None)
        self.nodes.pop(nid, None)
        self.link.drop_peer(self.group, nid)

    def add_learner(self, node: Node) -> None:
        """Send the log to `node` without making it a member (hub thread; any role: the leader
        sends, and a member that becomes leader later sends too)."""
        nid = node.id
        if nid in self.learners:
            self.learner_asked_at[nid] = time.monotonic()  # (asked again by the move's coordinator)
        if nid in self.nodes or nid == self.self_node.id:
            return  # a member already (or this node)
        self.learners.add(nid)
        self.learner_asked_at[nid] = time.monotonic()
        self.nodes[nid] = node
        self.link.add_peer(self.group, nid, getattr(node, "raft_addr", None))
        self.stats["learners_added"] += 1
        if self.joined and self.link.peer_is_up(nid):
            self._tell_connected(nid)

    def drop_learner(self, nid: str) -> None:
        """Stop sending the log to a learner (a move that ended without adding it)."""
        if nid in self.learners:
            self.dropNode(self.nodes[nid])

    def destroy(self) -> None:
        for sender in self.installs.values():
            sender.close()
        self.installs.clear()
        if self.receiver is not None:
            self.receiver.close()
            self.receiver = None
        self.held.clear()
        self.setOnMessageReceivedCallback(None)
        self.setOnNodeConnectedCallback(None)
        self.setOnNodeDisconnectedCallback(None)

    # --------------------------------------------------------------------- peer up / down

    def _tell_connected(self, nid: str) -> None:
        if self._onNodeConnectedCallback is None:
            return  # pysyncobj is still building (it sets callbacks after us): sync_connections tells it
        if nid not in self.connected and nid not in self.installs:
            self.connected.add(nid)
            if nid in self.learners:
                self._onReadonlyNodeConnected(self.nodes[nid])
            else:
                self._onNodeConnected(self.nodes[nid])

    def _tell_disconnected(self, nid: str, node: Node) -> None:
        self.connected.discard(nid)
        if nid in self.learners:
            self._onReadonlyNodeDisconnected(node)  # (pysyncobj drops its indexes; set again on connect)
        else:
            self._onNodeDisconnected(node)

    def peer_up(self, nid: str) -> None:
        if nid not in self.nodes:
            return
        self._forget(nid)
        if self.joined:
            self._tell_connected(nid)

    def peer_down(self, nid: str) -> None:
        if nid not in self.nodes:
            return
        sender = self.installs.pop(nid, None)
        if sender is not None:
            sender.close()
            self.stats["installs_abandoned"] += 1
        q = self.held.pop(nid, None)
        self.held_bytes.pop(nid, None)
        if q:
            self.stats["held_dropped_disconnect"] += len(q)
        self._forget(nid)
        if nid in self.connected:
            self._tell_disconnected(nid, self.nodes[nid])

    def sync_connections(self) -> None:
        """Tell pysyncobj about peers already up (after it has set its callbacks)."""
        if self.joined:
            for nid in self.nodes:
                if self.link.peer_is_up(nid):
                    self._tell_connected(nid)

    def _forget(self, nid: str, upto: int | None = None) -> None:
        if upto is None:
            self.sent_hi.pop(nid, None)
            self.commit_sent.pop(nid, None)
            self.last_append.pop(nid, None)
        else:
            st = self.sent_hi.get(nid)
            if st is not None and st[1] > upto:
                self.sent_hi[nid] = (st[0], upto)

    # ------------------------------------------------------------------------- outgoing

    def send(self, node: Node, message: dict) -> bool:
        nid = node.id
        t = message.get("type")
        if t == "apply_command":
            # pysyncobj forwards a command queued on a node that lost leadership: answer it here.
            if "request_id" in message:
                self.rejected_requests.append(message["request_id"])
            self.stats["forward_refused"] += 1
            return True
        if t == "apply_command_response":
            self.stats["forward_refused"] += 1
            return True
        if nid not in self.nodes or not self.link.peer_is_up(nid) or self.silent:
            return False
        seams = self.seams
        need, check_idx, check_term, is_ack, msg_term, ack_idx = 0, 0, None, False, None, 0
        if t == "next_node_idx":
            message = dict(message)
            message["term"] = msg_term = self.so._getTerm()
            if seams:
                if message["reset"] and not message["success"]:
                    message = self._clamp(message)
                elif message["success"]:
                    if self.hint is not None and message["next_node_idx"] > self.hint[0]:
                        self.hint = None  # the leader verified the prefix through the hint
                    message = self._ack_floor(nid, message)
            if message["success"]:
                ack_idx = message["next_node_idx"] - 1
                is_ack = True
                need, check_idx, check_term = ack_idx, ack_idx, self.log.term_at(ack_idx)
        elif t == "append_entries":
            msg_term = message["term"]
            if "serialized" in message and message["serialized"] is None and "transmission" not in message:
                # pysyncobj's snapshot path: NoPickleSerializer started our install instead
                self.stats["snapshot_path_taken"] += 1
                return False
            if "transmission" in message or "serialized" in message:
                self.stats["refused_snapshot_or_chunk"] += 1
                log.error(
                    "group %s: pysyncobj tried to send a chunked/snapshot append_entries to %s; refused",
                    self.group,
                    nid,
                )
                return False
            if seams and message["commit_index"] > self.log.durable_index:
                message = dict(message, commit_index=self.log.durable_index)  # (1. hold: a majority of disks)
            entries = message.get("entries")
            if entries:
                message = dict(message, entries=list(entries))  # copy now: the log may change while held
                if seams:
                    message = self._dedup(nid, message)
                    if message is None:
                        return True
                entries = message["entries"]
            elif seams and self._heartbeat_too_soon(nid, message):
                self.stats["heartbeats_thinned"] += 1
                return True
            if entries:
                last = entries[-1]
                if self._carries_membership(entries[0][1], last[1]):
                    need, check_idx, check_term = last[1], last[1], last[2]  # (1. hold)
                if seams:
                    st = self.sent_hi.get(nid)
                    hi = st[1] if st is not None and st[0] == msg_term else 0
                    self.sent_hi[nid] = (msg_term, max(hi, last[1]))
            if message["commit_index"] > self.commit_sent.get(nid, 0):
                self.commit_sent[nid] = message["commit_index"]
            self.last_append[nid] = (msg_term, self.clock())  # (sent now, or behind what is held)
        try:
            body = wire.encode_raft(self.group, message, self.membership_cache)
        except wire.WireError as exc:
            self.stats["refused_unencodable"] += 1
            log.error("group %s: not sending %s to %s: %s", self.group, t, nid, exc)
            return False
        q = self.held.get(nid)
        if not seams or (not q and need <= self.log.durable_index):
            return self._wire(nid, body, is_ack, ack_idx, msg_term)
        if q is None:
            q = self.held[nid] = collections.deque()
        size = self.held_bytes.get(nid, 0)
        if size + len(body) > HELD_BYTES_MAX:
            self.stats["held_dropped_full"] += 1
            return True
        self.held_bytes[nid] = size + len(body)
        q.append(_Held(need, check_idx, check_term, body, is_ack, msg_term, ack_idx))
        self.stats["held"] += 1
        return True

    def _carries_membership(self, first: int, last: int) -> bool:
        """Whether the log's entries first..last include a membership change (their indexes
        are kept in order by the log: no scan of the entries on the hot path)."""
        indexes = self.log.membership_indexes
        at = bisect.bisect_left(indexes, first)
        return at < len(indexes) and indexes[at] <= last

    def _wire(self, nid: str, body: bytes, is_ack: bool, ack_idx: int, term: int | None) -> bool:
        ok = self.link.send_raft(nid, body)
        if not ok:
            self.stats["dropped_by_link"] += 1
            return False
        if is_ack:
            self.stats["acks"] += 1
            prev = self.last_ack.get(nid)
            if prev is not None and prev[0] == term and ack_idx < prev[1]:
                self.stats["ack_regressions"] += 1  # should stay 0 with the seams
            self.last_ack[nid] = (term, ack_idx)
            if self.acked[0] != term or ack_idx > self.acked[1]:
                self.acked = (term, ack_idx)
        return True

    def release(self) -> None:
        """Send held messages whose entries are now durable, and a leader's commit index that
        its durable index held back (hub thread, after durable advanced)."""
        self._release_held()
        if self.seams and self.so._isLeader():
            commit = min(self.so.raftCommitIndex, self.log.durable_index)
            if any(self.commit_sent.get(nid, 0) < commit for nid in self.connected):
                self.stats["commit_pushed"] += 1
                self.so._SyncObj__sendAppendEntries()  # (1. hold: the follower applies it now)

    def _release_held(self) -> None:
        if not self.held:
            return
        durable = self.log.durable_index
        term_now = self.so._getTerm()
        for nid in list(self.held):
            q = self.held.get(nid)
            while q:
                h = q[0]
                # Stale whether or not it is durable yet: its entry was cut from the log (it
                # never will be), or it is from a past term. Waiting for it would hold back every
                # later message to this peer for good, votes included: a member that lost an
                # undurable tail with its leadership then campaigned unheard while rejecting
                # the new leader's lower term (a shard stuck without this member, under load).
                if h.check_term is not None and self.log.term_at(h.check_idx) != h.check_term:
                    q.popleft()
                    self.held_bytes[nid] -= len(h.body)
                    self.stats["held_dropped_stale"] += 1
                    continue
                if h.term is not None and h.term != term_now:
                    q.popleft()
                    self.held_bytes[nid] -= len(h.body)
                    self.stats["held_dropped_stale"] += 1  # from a past term: the leader would drop it
                    continue
                if h.need > durable:
                    break
                q.popleft()
                self.held_bytes[nid] -= len(h.body)
                if (
                    h.is_ack
                    and q
                    and q[0].is_ack
                    and q[0].need <= durable
                    and q[0].ack_idx >= h.ack_idx
                    and self.log.term_at(q[0].check_idx) == q[0].check_term
                ):
                    self.stats["acks_coalesced"] += 1
                    continue
                if not self._wire(nid, h.body, h.is_ack, h.ack_idx, h.term):
                    break
            if not q:
                self.held.pop(nid, None)
                self.held_bytes.pop(nid, None)

    def held_count(self) -> int:
        return sum(len(q) for q in self.held.values())

    def _caught_up_with_the_wire(self, nid: str, acked: int) -> bool:
        """A leader's follower acked everything sent to it, and the log holds more (seam 7)."""
        if acked >= self.log.last_index or not self.so._isLeader():
            return False
        st = self.sent_hi.get(nid)
        return st is not None and st[0] == self.so._getTerm() and acked >= st[1]

    def _dedup(self, nid: str, message: dict) -> dict | None:
        ents = message["entries"]
        st = self.sent_hi.get(nid)
        hi = st[1] if st is not None and st[0] == message["term"] else 0
        if ents[0][1] > hi:
            return message
        k = min(len(ents), hi - ents[0][1] + 1)
        self.stats["dedup_entries"] += k
        if k < len(ents):
            return dict(message, prevLogIdx=ents[k - 1][1], prevLogTerm=ents[k - 1][2], entries=ents[k:])
        if self._heartbeat_too_soon(nid, message):
            self.stats["dedup_msgs_dropped"] += 1
            return None
        return dict(message, prevLogIdx=ents[-1][1], prevLogTerm=ents[-1][2], entries=[])

    def _heartbeat_too_soon(self, nid: str, message: dict) -> bool:
        """An append with nothing new for `nid` within `heartbeat_s` of the last one (seam 4)."""
        last = self.last_append.get(nid)
        return (
            last is not None
            and last[0] == message["term"]
            and self.clock() - last[1] < self.heartbeat_s
            and message["commit_index"] <= self.commit_sent.get(nid, 0)
        )

    def _hint_floor(self, f: int) -> int:
        """The leader answers "from f" with prevLogIdx f - 1, which this log must still hold:
        never at or below the first entry kept after a compaction (it and everything before it
        were committed, so the conflict cannot begin there). Pointing there was a livelock
        (jepsen seed 300, 2026-12-01): a member whose conflicting run began before its snapshot
        answered every append "from my first entry", the leader's append from there named an
        entry the member no longer had, pysyncobj answered "from my end", clamped back to the
        first entry: that shard never replicated to the member again."""
        return max(f, self.log.first_index + 1)

    def _clamp(self, message: dict) -> dict:
        if self.hint is None:
            return message
        f, t = self.hint
        if self.log.term_at(f) != t:
            self.hint = None  # the conflicting run was truncated: resolved
            return message
        f = self._hint_floor(f)  # (a compaction since the hint was taken may have reached it)
        if message["next_node_idx"] > f:
            self.stats["hint_clamps"] += 1
            message["next_node_idx"] = f
        return message

    def _ack_floor(self, nid: str, message: dict) -> dict:
        term = message["term"]
        idx = message["next_node_idx"] - 1
        fl = self.floor.get(nid)
        if fl is not None and fl[0] == term and fl[1] > idx and self.log.term_at(fl[1]) == fl[2]:
            self.stats["ack_floor_raised"] += 1
            message["next_node_idx"] = fl[1] + 1
            return message
        t = self.log.term_at(idx)
        if t is not None:
            self.floor[nid] = (term, idx, t)
        return message

    def _on_truncate(self, first_index: int, count: int) -> None:
        term, idx = self.acked
        if term == self.so._getTerm() and first_index <= idx:
            n = idx - first_index + 1
            self.stats["acked_entries_truncated"] += n  # a Raft safety violation: must stay 0
            log.critical(
                "group %s: truncating %d entries already acknowledged in term %d (from index %d)",
                self.group,
                n,
                term,
                first_index,
            )

    # ------------------------------------------------------------------------- incoming

    def receive(self, nid: str, message: dict) -> None:
        """A decoded message from peer nid (hub thread)."""
        node = self.nodes.get(nid)
        if node is None:
            self.stats["dropped_non_member"] += 1
            if self.on_non_member is not None:
                self.on_non_member(nid)
            return
        t = message["type"]
        if nid in self.learners and t not in ("next_node_idx", "snapshot_ack"):
            # A learner only acknowledges: a vote request from it (it restarted and forgot it was
            # one, or it is broken) must not reach pysyncobj, which would count it as a member's.
            self.stats["learner_messages_dropped"] += 1
            return
        if t == "snapshot_chunk":
            self._on_snapshot_chunk(nid, message)
            return
        if t == "snapshot_ack":
            sender = self.installs.get(nid)
            if sender is not None and self.so._isLeader():
                sender.on_ack(message)
                if sender.done:
                    self._install_finished(nid)
                else:
                    self.pump_installs()
            return
        if t == "next_node_idx" and self.seams:
            if self.so._isLeader() and message["term"] != self.so._getTerm():
                self.stats["acks_other_term_dropped"] += 1
                return
            if not 2 <= message["next_node_idx"] <= self.log.last_index + 1:
                # index 1 would send pysyncobj down its snapshot path; beyond our log would count
                # entries nobody has: no correct follower says either
                self.stats["acks_out_of_range_dropped"] += 1
                return
            if message["reset"]:
                self._forget(nid, message["next_node_idx"] - 1)  # the follower asks for a re-send
            elif message["success"] and self._caught_up_with_the_wire(nid, message["next_node_idx"] - 1):
                self.so._SyncObj__newAppendEntriesTime = 0.0  # (7): the tick sends the next batch
                self.stats["catch_up_sends"] += 1
        elif t == "append_entries":
            if not self.joined:
                self.joined = True  # a leader replicates to us: we are a member now
                self.sync_connections()
            if self.seams and message["term"] >= self.so._getTerm():
                if message["entries"] and self.log.undurable_bytes > HELD_BYTES_MAX // 2:
                    self.stats["appends_dropped_disk_behind"] += 1  # the leader re-sends after a reset
                    return
                message, ack = self._guard(message)
                self._onMessageReceived(node, message)
                if ack is not None:
                    self.send(
                        node, {"type": "next_node_idx", "next_node_idx": ack + 1, "reset": False, "success": True}
                    )
                return
        self._onMessageReceived(node, message)

    def _guard(self, msg: dict) -> tuple[dict, int | None]:
        """(message for pysyncobj, index to ack ourselves or None)."""
        rl = self.log
        p, pt = msg["prevLogIdx"], msg["prevLogTerm"]
        tp = rl.term_at(p)
        if tp is None:
            return msg, None  # a gap: pysyncobj answers reset (clamped)
        if tp != pt:
            f = self._hint_floor(rl.run_start(p))
            if self.hint is None or f < self.hint[0]:
                self.hint = (f, tp)
            self.stats["guard_prev_mismatch"] += 1
            return msg, None
        ents = msg["entries"]
        last = rl.last_index
        k = 0
        n = len(ents)
        while k < n and ents[k][1] <= last and rl.term_at(ents[k][1]) == ents[k][2]:
            k += 1
        if k:
            self.stats["guard_skipped_entries"] += k
        if k < n:
            if ents[k][1] <= last:
                self.stats["guard_conflicts"] += 1  # a real term conflict: pysyncobj truncates from here
            if k == 0:
                return msg, None
            return dict(msg, prevLogIdx=ents[k - 1][1], prevLogTerm=ents[k - 1][2], entries=ents[k:]), None
        verified = ents[-1][1] if ents else p
        if verified == last:
            if not ents:
                return msg, None
            return dict(msg, prevLogIdx=verified, prevLogTerm=ents[-1][2], entries=[]), None
        if rl.last_term == msg["term"]:
            self.stats["guard_extended"] += 1
            return dict(msg, prevLogIdx=last, prevLogTerm=rl.last_term, entries=[]), None
        # A longer tail from an older term: neither truncate it nor claim it.
        self.stats["guard_stripped"] += 1
        m2 = {k2: v for k2, v in msg.items() if k2 not in ("prevLogIdx", "prevLogTerm", "entries")}
        m2["commit_index"] = min(msg["commit_index"], verified)
        return m2, verified

    def after_tick(self) -> None:
        """Answer commands pysyncobj tried to forward to another leader (hub thread)."""
        if self.rejected_requests:
            ids, self.rejected_requests = self.rejected_requests, []
            for rid in ids:
                self._onMessageReceived(
                    self.self_node,
                    {"type": "apply_command_response", "request_id": rid, "error": FAIL_REASON.NOT_LEADER},
                )

    # ------------------------------------------------------------------------ snapshots

    def begin_install(self, node: Node) -> None:
        """pysyncobj (leader) found `node` behind its compacted log: send it our snapshot."""
        nid = node.id
        if nid in self.installs or self.silent or nid not in self.nodes:
            return
        header = self.snapshot_source() if self.snapshot_source is not None else None
        if header is None:
            self.stats["install_without_snapshot"] += 1
            log.error("group %s: %s needs entries this log no longer has, and there is no snapshot", self.group, nid)
            return
        try:
            sender = InstallSender(nid, header, self.so._getTerm(), clock=self.clock)
        except OSError as exc:
            log.error("group %s: cannot open snapshot %s for %s: %s", self.group, header.path, nid, exc)
            return
        self.installs[nid] = sender
        self.stats["installs_started"] += 1
        log.info("group %s: sending snapshot at index %d (%d bytes) to %s", self.group, header.index, sender.size, nid)
        if nid in self.connected:  # pysyncobj sends it nothing while the install runs
            self._tell_disconnected(nid, self.nodes[nid])

    def pump_installs(self) -> None:
        """Leader: put the next chunks of each install on the wire (hub thread, every tick)."""
        if not self.installs:
            return
        leader, term = self.so._isLeader(), self.so._getTerm()
        for nid, sender in list(self.installs.items()):
            if not leader or sender.term != term or sender.stalled():
                self._install_abandoned(nid, "leadership changed" if not leader or sender.term != term else "stalled")
                continue
            if not self.link.peer_is_up(nid):
                continue
            try:
                messages = sender.next_messages()
            except OSError as exc:
                log.error("group %s: reading snapshot for %s: %s", self.group, nid, exc)
                self._install_abandoned(nid, "read error")
                continue
            for m in messages:
                if not self.link.send_raft(nid, wire.encode_raft(self.group, m, self.membership_cache)):
                    sender.sent = m["offset"]  # the link is full: this chunk goes again later
                    break
                self.stats["install_bytes_sent"] += len(m["data"])

    def _install_abandoned(self, nid: str, why: str) -> None:
        sender = self.installs.pop(nid, None)
        if sender is None:
            return
        sender.close()
        self.stats["installs_abandoned"] += 1
        log.warning("group %s: snapshot install to %s abandoned (%s); pysyncobj starts over", self.group, nid, why)
        if self.joined and self.link.peer_is_up(nid):
            self._tell_connected(nid)

    def _install_finished(self, nid: str) -> None:
        sender = self.installs.pop(nid)
        sender.close()
        index = sender.header.index
        node = self.nodes.get(nid)
        self.stats["installs_done"] += 1
        log.info(
            "group %s: %s installed the snapshot at index %d (%.1f s)",
            self.group,
            nid,
            index,
            self.clock() - sender.started,
        )
        if node is None:
            return
        self._forget(nid)
        if self.joined and self.link.peer_is_up(nid):
            self._tell_connected(nid)  # (a learner's indexes are made afresh here: set them after)
        # pysyncobj's per-follower progress: its log now ends at the snapshot's index (durably).
        self.so._SyncObj__raftNextIndex[node] = index + 1
        match = self.so._SyncObj__raftMatchIndex
        if match.get(node, 0) < index:
            match[node] = index

    def _on_snapshot_chunk(self, nid: str, m: dict) -> None:
        so = self.so
        if m["term"] != so._getTerm() or so._isLeader() or self.snap_dir is None or self.on_installed is None:
            self.stats["snapshot_chunks_ignored"] += 1  # another term's leader: it gives up and starts over
            return
        if not self.joined:
            self.joined = True
            self.sync_connections()
        # The leader sends us no heartbeats meanwhile: its chunks are its sign of life.
        so._SyncObj__raftElectionDeadline = time.monotonic() + so._SyncObj__generateRaftTimeout()
        r = self.receiver
        if r is None or r.index != m["index"] or r.term != m["term"]:
            if r is not None:
                r.close()
                self.receiver = r = None
            if m["offset"] != 0:
                self._send_install_ack(nid, m["term"], m["index"], 0, False)
                return
            r = self.receiver = InstallReceiver(self.snap_dir, m["index"], m["term"])
        try:
            offset, header = r.on_chunk(m)
        except (SnapshotError, OSError) as exc:
            log.error("group %s: snapshot from %s dropped: %s", self.group, nid, exc)
            r.close()
            self.receiver = None
            self._send_install_ack(nid, m["term"], m["index"], 0, False)
            return
        if header is None:
            self._send_install_ack(nid, m["term"], m["index"], offset, False)
            return
        self.receiver = None
        self.stats["installs_received"] += 1
        self.on_installed(header, nid, m["term"])  # the group acks `done` once the new base is durable

    def _send_install_ack(self, nid: str, term: int, index: int, offset: int, done: bool) -> None:
        body = wire.encode_raft(
            self.group,
            {"type": "snapshot_ack", "term": term, "index": index, "offset": offset, "done": done},
            self.membership_cache,
        )
        self.link.send_raft(nid, body)
