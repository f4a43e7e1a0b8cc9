"""Moving one replica of a group between members, and leaving a group: the engine's side of
issue #19's moves (rebalance, drain and move-group are plans of such moves:
machines/replica_moves.py).

Theory of operation: `GroupMoves` belongs to a `ReplicationNode` (engine.py) and runs in its
hub thread, on its groups, hub and membership changes. A move of group g, asked of a member that
holds it, is a small state machine stepped on every tick and on every answer:

  join      the new node starts g as a learner (`join_group`, with g's current members as its
            first members: group_set.py; it does not campaign) and says so (`join_reply`);
            asked again if no answer comes;
  catchup   every member of g sends it the log as to pysyncobj's read-only nodes (`learner_add`,
            sent again every ASK_AGAIN_S: a member that restarts forgets it), which count for
            no commit and no vote: while the learner catches up through the log or a snapshot,
            the group's majority is what it was. The learner is asked how far it has applied g
            (`group_index`) until it has applied what was committed when it joined;
  add       a Raft membership change makes it a member (group_transport.py, `addNode`, on every
            member as it appends the change; the learner starts campaigning like any member once
            it applies its own addition: group.py);
  remove    a membership change removes the old member (leadership moves off it first); the
            removed node is told, closes g and deletes its folder (`leave_removed_groups`).

Each phase's failure is retried until the move's deadline; what was done stays done (a plan made
again afterwards completes it: replica_moves.py reaches the factor from any placement). A node
removed from a group while it was down never hears of it; when it comes back and sends to the
group, the group's leader tells it (`on_non_member`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from typing import Any

from . import group_set, wire
from .group import Group, call_safely

log = logging.getLogger(__name__)

MOVE_TIMEOUT_S = 300.0  # a group move's default bound (a new member may catch up through a big log)
MOVE_POLL_S = 0.1  # how often a move asks the new member how far it has applied
ASK_AGAIN_S = 2.0  # a question of a move not answered within this is asked again
RETRY_S = 0.1  # a phase that failed is tried again after this
REMOVED_NOTICE_EVERY_S = 5.0  # a non-member that keeps sending to a group is told again this often
# A learner asked for within this long: a move of its group is under way (a coordinator asks again
# every ASK_AGAIN_S while its learner catches up, and drops it when the move ends).
MOVE_ELSEWHERE_S = 3 * ASK_AGAIN_S


class GroupMoves:
    def __init__(self, engine: Any) -> None:
        self.engine = engine  # the ReplicationNode that owns this (engine.py: it imports us)
        self._move: dict | None = None  # the move in progress, one at a time
        self._joins: dict[int, Callable[[str | None], None]] = {}  # join_group requests sent: req -> answer
        self._progress_asks: dict[int, Callable[[int | None], None]] = {}  # group_index requests sent
        # (group, node) -> next notice allowed; ("report", group, node) -> next report to the leader
        self._removed_notices: dict[tuple, float] = {}

    def stop(self) -> None:
        move, self._move = self._move, None
        if move is not None:
            call_safely(move["callback"], "stopped")

    def on_control(self, peer: str, op: str, m: dict) -> bool:
        """The control ops of moves (hub thread); False: not one of them."""
        e = self.engine
        if op == "join_group":
            self.on_join_group(peer, m)
        elif op == "join_reply":
            req, err = m.get("req"), m.get("error")
            answer = self._joins.pop(req, None) if type(req) is int else None
            if answer is not None:
                answer(err if err is None or type(err) is str else "bad answer")
        elif op == "group_index":
            req, name = m.get("req"), m.get("group")
            if type(req) is not int or type(name) is not str:
                raise wire.WireError(f"bad group_index request {m!r}")
            g = e.groups.get(name)
            index = None if g is None or g.failed is not None or g.removed else g.applied
            reply_body = {"op": "group_index_reply", "req": req, "applied": index}
            e.hub.send(peer, wire.KIND_CONTROL, wire.encode_control(reply_body))
        elif op == "group_index_reply":
            req, index = m.get("req"), m.get("applied")
            asked = self._progress_asks.pop(req, None) if type(req) is int else None
            if asked is not None:
                asked(index if type(index) is int else None)
        elif op == "non_member":  # a member of g heard from a node not in it, and this one leads g
            name, nid = m.get("group"), m.get("node")
            if type(name) is not str or type(nid) is not str:
                raise wire.WireError(f"bad non_member report {m!r}"[:200])
            g = e.groups.get(name)
            if g is not None and not g.removed and nid not in (e.node_id, peer):
                self.on_non_member(g, nid, reported=True)
        elif op in ("learner_add", "learner_drop"):
            name, nid = m.get("group"), m.get("node")
            if type(name) is not str or type(nid) is not str:
                raise wire.WireError(f"bad {op} request {m!r}"[:200])
            g = e.groups.get(name)
            if g is None or g.removed:
                return True  # (not held here any more: nothing to send)
            if op == "learner_drop":
                g.transport.drop_learner(nid)
            else:
                host, port = m.get("host"), m.get("port")
                if type(host) is not str or type(port) is not int:
                    raise wire.WireError(f"bad learner_add address {m!r}"[:200])
                g.transport.add_learner(wire.RaftNode(nid, (host, port)))
                e._touched.add(g)
        else:
            return False
        return True

    def start(
        self,
        name: str,
        add: tuple[str, tuple[str, int]] | None,
        remove: str | None,
        callback: Callable[[str | None], None],
        timeout_s: float,
    ) -> None:
        if self._move is not None or self.engine._member_change is not None:
            call_safely(callback, "busy: another membership change is in progress")
            return
        g = self.engine.groups.get(name)
        if g is None:
            call_safely(callback, f"{name} is not held here: ask a member that holds it")
            return
        now = time.monotonic()
        moving = sorted(n for n, at in g.transport.learner_asked_at.items() if now - at < MOVE_ELSEWHERE_S)
        if moving or g.membership_change_pending():
            # Another member is moving a replica of this group (a learner it asked for is catching
            # up, or a membership change is not committed yet). Two moves of one group planned
            # apart interleave their steps: a jepsen-style run's rebalance, asked again after a
            # timeout while the first still ran, left its group with 2 replicas.
            why = f"{', '.join(moving)} catching up" if moving else "a membership change not committed yet"
            call_safely(callback, f"busy: a move of {name} is in progress ({why})")
            return
        if add is not None and add[0] == remove:
            call_safely(callback, "the node to add is the node to remove")
            return
        members = set(g.member_ids())
        phase = "join" if add is not None and add[0] not in members else "remove"
        # (a move that failed after its new member was added: add=None now, or add again: that
        # member is one already, and only the removal is left)
        if phase == "remove" and (remove is None or remove not in members):
            call_safely(callback, None)  # nothing to do: the move is already made
            return
        self._move = {
            "group": name,
            "add": add,
            "remove": remove,
            "callback": callback,
            "deadline": now + timeout_s,
            "phase": phase,
            "asked_at": None,  # when the pending question of this phase was asked
            "next_at": now,
            "caught_up_at": 0,  # the commit index the new member must have applied
            "error": None,
        }
        self.step(now)

    def _done(self, error: str | None) -> None:
        mv, self._move = self._move, None
        self._joins.clear()
        self._progress_asks.clear()
        if mv is not None and error is not None and mv["add"] is not None:
            self._drop_learner(mv["group"], mv["add"][0])
        if mv is not None:
            if error is None:
                log.info(
                    "group %s: moved (%s added, %s removed)", mv["group"], mv["add"] and mv["add"][0], mv["remove"]
                )
            call_safely(mv["callback"], error)

    def step(self, now: float) -> None:
        """One step of the move in progress (hub thread; on every tick and after each answer)."""
        mv = self._move
        if mv is None:
            return
        if now > mv["deadline"]:
            self._done(f"timeout: the move of {mv['group']} did not finish ({mv['phase']}: {mv['error']})")
            return
        if now < mv["next_at"] or (mv["asked_at"] is not None and now - mv["asked_at"] < ASK_AGAIN_S):
            return  # waiting for an answer (asked again once it is overdue) or for the next try
        name, phase = mv["group"], mv["phase"]
        g = self.engine.groups.get(name)
        mv["asked_at"] = now
        if phase == "join":
            if g is None:
                self._done(f"{name} is no longer held here")
                return
            nid, addr = mv["add"]
            self.engine.hub.set_address(nid, addr)
            self.engine.hub.want(nid)
            if not self.engine.hub.is_up(nid):
                mv.update(asked_at=None, next_at=now + RETRY_S, error=f"{nid} not linked at {addr}")
                return
            members = {self.engine.node_id: self.engine.raft_addr}
            for n in list(g.so.otherNodes):
                at = getattr(n, "raft_addr", None) or self.engine.peers.get(n.id)
                if at is not None:
                    members[n.id] = (at[0], int(at[1]))
            req = next(self.engine._req_ids)

            def joined(err: str | None) -> None:
                if err is None:  # what the learner must have applied before it is made a member
                    g_now = self.engine.groups.get(name)
                    mv["caught_up_at"] = g_now.so.raftCommitIndex if g_now is not None else 0
                    mv["taught_at"] = None
                self._answer(mv, "catchup" if err is None else None, err)

            self._joins[req] = joined
            body = {
                "op": "join_group",
                "req": req,
                "group": name,
                "members": {k: list(v) for k, v in members.items()},
                "learner": True,
            }
            self.engine.hub.send(nid, wire.KIND_CONTROL, wire.encode_control(body))
        elif phase in ("add", "remove"):
            change = ("add", *mv["add"]) if phase == "add" else ("rem", mv["remove"], None)

            def changed(err: str | None) -> None:
                nxt = (
                    (("remove" if mv["remove"] is not None else "done") if phase == "add" else "done")
                    if err is None
                    else None
                )
                self._answer(mv, nxt, err)

            if self.engine._member_change is not None:
                mv.update(asked_at=None, next_at=now + RETRY_S, error="another membership change")
                return
            self.engine._member_start(change, changed, groups=[name])
        elif phase == "catchup":
            if g is None:
                self._done(f"{name} is no longer held here")
                return
            nid, addr = mv["add"]
            if mv.get("taught_at") is None or now - mv["taught_at"] >= ASK_AGAIN_S:
                mv["taught_at"] = now
                self._teach(g, nid, addr)
            req = next(self.engine._req_ids)

            def progress(applied: int | None) -> None:
                if applied is None:  # it does not hold g (it restarted, and left it): again
                    self._answer(mv, "join", f"{nid} does not hold {name}")
                elif applied >= mv["caught_up_at"]:
                    self._answer(mv, "add", None)
                else:
                    self._answer(mv, None, f"{nid} has applied {applied} of {mv['caught_up_at']}")

            self._progress_asks[req] = progress
            self.engine.hub.send(
                nid, wire.KIND_CONTROL, wire.encode_control({"op": "group_index", "req": req, "group": name})
            )

    def _teach(self, g: Group, nid: str, addr: tuple[str, int]) -> None:
        """Every member of g, this one too, sends g's log to the learner `nid`."""
        g.transport.add_learner(wire.RaftNode(nid, addr))
        body = wire.encode_control(
            {"op": "learner_add", "group": g.name, "node": nid, "host": addr[0], "port": addr[1]}
        )
        for member in g.member_ids():
            if member not in (self.engine.node_id, nid):
                self.engine.hub.send(member, wire.KIND_CONTROL, body)

    def _drop_learner(self, name: str, nid: str) -> None:
        """A move that ends without making `nid` a member: no member sends it the log any more."""
        g = self.engine.groups.get(name)
        if g is None or nid in g.member_ids():
            return
        g.transport.drop_learner(nid)
        body = wire.encode_control({"op": "learner_drop", "group": name, "node": nid})
        for member in g.member_ids():
            if member != self.engine.node_id:
                self.engine.hub.send(member, wire.KIND_CONTROL, body)
        # and the learner leaves g (it is no member: nothing of it is kept)
        self.engine.hub.send(nid, wire.KIND_CONTROL, wire.encode_control({"op": "removed", "groups": [name]}))

    def _answer(self, mv: dict, next_phase: str | None, error: str | None) -> None:
        """An answer for the move's current phase: on to `next_phase`, or the same phase again
        shortly (the error is kept for a timeout's message)."""
        if self._move is not mv:
            return  # an answer for a move that ended
        now = time.monotonic()
        mv.update(asked_at=None, error=error)
        if next_phase == "done":
            self._done(None)
            return
        if next_phase is None:
            mv["next_at"] = now + (MOVE_POLL_S if mv["phase"] == "catchup" else RETRY_S)
            return
        mv.update(phase=next_phase, next_at=now)
        self.step(now)

    def on_join_group(self, peer: str, m: dict) -> None:
        """A move asks this node to start a group, as a member to be added (hub thread)."""
        req, name, members = m.get("req"), m.get("group"), m.get("members")
        if type(req) is not int or type(name) is not str or type(members) is not dict:
            raise wire.WireError(f"bad join_group request from {peer}")
        first: dict[str, tuple[str, int]] = {}
        for nid, addr in members.items():
            if type(addr) is not list or len(addr) != 2 or type(addr[0]) is not str or type(addr[1]) is not int:
                raise wire.WireError(f"bad join_group address from {peer}: {addr!r}"[:200])
            first[nid] = (addr[0], addr[1])

        def answer(error: str | None) -> None:
            self.engine.hub.send(
                peer, wire.KIND_CONTROL, wire.encode_control({"op": "join_reply", "req": req, "error": error})
            )

        g = self.engine.groups.get(name)
        if name not in self.engine.group_names:
            answer(f"{name} is not one of this node's groups")
        elif g is not None:
            answer("leaving it now: ask again" if g.removed else None)
        elif self.engine._stopping or self.engine.fatal is not None:
            answer("stopped")
        else:
            # A folder of a group not held is what a departure left behind (a crash before its
            # deletion): nothing in it is this member's any more.
            shutil.rmtree(self.engine.raft_dir / name, ignore_errors=True)
            try:
                g = self.engine._make_group(name, True, first, learner=m.get("learner") is True)
            except (OSError, ValueError) as exc:
                answer(f"cannot start {name}: {exc}")
                return
            self.engine.groups[name] = g
            self.engine.partial = True
            group_set.write_held(
                self.engine.raft_dir, list(self.engine.groups), self.engine.fsync
            )  # after its first members
            log.info(
                "node %s: joined group %s (members before: %s)", self.engine.node_id, name, ", ".join(sorted(first))
            )
            self.engine.announce_held()
            self.engine._touched.add(g)
            answer(None)

    def on_non_member(self, g: Group, nid: str, reported: bool = False) -> None:
        """A Raft message for `g` from a node that is not one of its members (hub thread), or a
        member's report of one (`reported`). On a node holding only some groups, the group's
        leader tells it that it was removed (at most every REMOVED_NOTICE_EVERY_S): a member that
        was down when a move or a drain removed it starts again holding the group and would
        campaign in it for ever. Only the leader says so, with no membership change pending and
        a majority of its members linked: its configuration is the latest in its log, a node
        being added is in it from the moment the addition is appended, and a leader cut off from
        the majority (which may have moved on and added the sender) does not say it. (Left: a
        leader linked to the majority that has not yet noticed it was replaced, for the few
        heartbeats that takes.)

        A follower reports it to the leader it knows (once per REMOVED_NOTICE_EVERY_S), which
        judges it as above: the removed node campaigns only among the members of its own last
        configuration, and when none of them leads any more the leader never hears from it (a
        jepsen-style run, seed 7671: n4 partitioned while a drain moved shard-1 off it, the
        leader's notice lost with the link, then leadership moved to a member n4 never had; n4
        campaigned up to term 103 and its clients of shard-1's queues got 320 for good)."""
        if not self.engine.partial:
            return
        now = time.monotonic()
        if not g.so._isLeader():
            leader = g.leader_id
            if reported or leader is None or leader in (self.engine.node_id, nid):
                return
            if now < self._removed_notices.get(("report", g.name, nid), 0.0):
                return
            self._removed_notices[("report", g.name, nid)] = now + REMOVED_NOTICE_EVERY_S
            self.engine.stats["non_members_reported"] += 1
            body = wire.encode_control({"op": "non_member", "group": g.name, "node": nid})
            self.engine.hub.send(leader, wire.KIND_CONTROL, body)
            return
        if g.membership_change_pending():
            return
        others = [n.id for n in g.so.otherNodes]
        if reported and (nid in g.transport.nodes or nid in others):
            return  # a member or a learner here (a follower that restarted forgets a move's learner)
        if 2 * (1 + sum(1 for o in others if o in g.transport.connected)) <= 1 + len(others):
            return
        key = (g.name, nid)
        if now < self._removed_notices.get(key, 0.0):
            return
        self._removed_notices[key] = now + REMOVED_NOTICE_EVERY_S
        self.engine.stats["removed_notices_sent"] += 1
        log.info("node %s: %s is not a member of group %s: telling it so", self.engine.node_id, nid, g.name)
        self.engine.hub.send(nid, wire.KIND_CONTROL, wire.encode_control({"op": "removed", "groups": [g.name]}))

    def leave_removed_groups(self) -> None:
        """Close and delete the groups this node was removed from (hub thread; on nodes that hold
        only some groups: a node of the old layout keeps a removed group's files, silent)."""
        if not self.engine.partial:
            return
        for name, g in list(self.engine.groups.items()):
            if not g.removed:
                continue
            del self.engine.groups[name]
            g.hand_off()
            g.close()
            group_set.write_held(
                self.engine.raft_dir, list(self.engine.groups), self.engine.fsync
            )  # first: no return after a crash
            shutil.rmtree(self.engine.raft_dir / name, ignore_errors=True)
            self.engine._leader_hint.pop(name, None)
            log.info("node %s: left group %s", self.engine.node_id, name)
            self.engine.announce_held()
