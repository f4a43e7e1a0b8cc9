"""A cluster member's watch on the membership: members gone, quorum lost, leaders spread.

Theory of operation: every WATCH_INTERVAL_S, from what the replication engine sees of its peers:

- on the metadata leader, a member silent for NODE_DOWN_AFTER_S is declared down: its consumers
  and exclusive queues are released everywhere (`OwnerDown` in the metadata group, `Down` in every
  shard, then its auto-delete queues left without a consumer go), so its unacked messages come
  back to the others; when it returns, its start-up barrier begins a new life;
- on every member, cut off from a majority for QUORUM_LOST_AFTER_S, it closes its clients'
  connections (they should go to a member that can commit) and refuses new ones until a majority
  is reachable again (`quorum_ok`); removed from the cluster, it stops (SIGTERM to itself);
- every BALANCE_EVERY_S, a member leading two groups more than another hands one of its shards
  (the one holding the fewest queues) to the member leading fewest (one move per round, only
  when every member is up), so the leaders' work is spread; a member under maintenance is never
  given one. It counts every group, those held elsewhere by their leaders' word
  (machines/leader_balance.py);
- on a member under maintenance (machines/maintenance.py, `maxqctl drain`), it closes its
  clients' connections once (new ones are refused at connection.open: session.py), and hands
  the leadership of every group it leads (after an election too) to the member up and not
  drained that leads fewest;
- on the metadata leader, once the `placement` feature is enabled, the shard groups and their
  members as this node's engine has them (groups held elsewhere: as their holders announce them,
  once every member is linked, and every group held here has a leader known) are recorded in the
  metadata group whenever the record differs (`SetGroups`, machines/placement.py; one proposal
  out at a time).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

import trio

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.leader_balance import leadership_to_hand_over
from ..machines.maintenance import DRAINING_TEXT, leader_target
from ..machines.metadata import META_GROUP
from ..machines.placement import FEATURE as PLACEMENT
from ..machines.placement import SetGroups
from ..machines.shard import ALL_QUEUES

log = logging.getLogger("maxq.cluster")

NODE_DOWN_AFTER_S = 3.0
BALANCE_EVERY_S = 5.0
QUORUM_LOST_AFTER_S = 1.5
HAND_OVER_WAIT_S = 5.0  # a leadership transfer under way is not asked again before this
WATCH_INTERVAL_S = 0.5
RECORD_WAIT_S = 10.0  # a SetGroups not answered by then may be proposed again


class MembershipWatchdog:
    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster  # the ClusterLog: its node, members, submit, sessions
        self._down_since: dict[str, float] = {}
        self._declared_down: dict[str, None] = {}
        self._quorum_lost_at: float | None = None
        self._next_balance_at = 0.0
        self._handing_over: dict[str, float] = {}  # group -> when its transfer may be asked again
        self._no_target_said = False
        self._draining = False  # this member is under maintenance (sessions refuse new clients then)
        self._recording_until = 0.0  # a SetGroups is out until then (or its answer)

    async def run(self) -> None:
        cluster = self.cluster
        while True:  # for the life of the node; each turn sleeps
            await trio.sleep(WATCH_INTERVAL_S)
            now = trio.current_time()
            node = cluster.node
            try:
                leading = node.is_leader(META_GROUP)
                members = [m for m in cluster.members() if m != cluster.node_id]
                meta_group = node.groups.get(META_GROUP)
                # (a member removed from the cluster leaves the metadata group: once gone, it was
                # removed; a KeyError here kept it from stopping, in a jepsen-style run)
                removed = meta_group is None or meta_group.removed
            except Exception:
                log.exception("watchdog: cannot read the membership")
                continue
            if now >= self._next_balance_at:
                self._next_balance_at = now + BALANCE_EVERY_S
                self._balance_leaders(members)
            if removed:
                log.warning("this node was removed from the cluster: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            self._watch_quorum(now, members)
            self._watch_members(now, members, leading)
            self._watch_maintenance(now, members)
            if leading:
                self._record_placement(now)

    def _watch_quorum(self, now: float, members: list[str]) -> None:
        cluster = self.cluster
        connected = 1 + sum(1 for m in members if cluster.node.peer_is_up(m))
        if connected * 2 > len(members) + 1:
            if not cluster.quorum_ok:
                log.info("a majority of the cluster is reachable again: serving clients")
            cluster.quorum_ok = True
            self._quorum_lost_at = None
        elif cluster.quorum_ok:
            if self._quorum_lost_at is None:
                self._quorum_lost_at = now
            elif now - self._quorum_lost_at >= QUORUM_LOST_AFTER_S:
                cluster.quorum_ok = False
                log.warning(
                    "cut off from the majority (%d of %d members reachable): closing client connections",
                    connected,
                    len(members) + 1,
                )
                cluster.close_sessions("this node is cut off from the cluster majority; reconnect to another node")

    def _watch_members(self, now: float, members: list[str], leading: bool) -> None:
        cluster = self.cluster
        for member in members:
            if cluster.node.peer_is_up(member):
                self._down_since.pop(member, None)
                self._declared_down.pop(member, None)
                continue
            since = self._down_since.setdefault(member, now)
            if leading and member not in self._declared_down and now - since >= NODE_DOWN_AFTER_S:
                self._declared_down[member] = None
                log.warning(
                    "member %s silent for %.1f s: releasing its consumers and exclusive queues", member, now - since
                )
                cluster.submit(None, md.OwnerDown(member + "@"), None)
                for group in cluster.shards:
                    cluster.submit(
                        ALL_QUEUES, qc.Down(member + "@"), lambda _r, g=group: cluster.auto_delete_idle(g), group=group
                    )

    def _watch_maintenance(self, now: float, others: list[str]) -> None:
        cluster = self.cluster
        draining = cluster.broker.meta.draining
        under = cluster.node_id in draining
        if under != self._draining:
            self._draining = under
            if under:
                log.warning("this node is being drained: closing client connections, handing over its leaderships")
                cluster.close_sessions(DRAINING_TEXT)
            else:
                log.info("this node is revived: serving clients and leading again")
                self._handing_over.clear()
        if not under:
            return
        node = cluster.node
        groups = [META_GROUP, *cluster.shards]
        leaders = {group: node.leader(group) for group in groups}
        leads: dict[str, int] = {}
        for leader in leaders.values():
            if leader is not None:
                leads[leader] = leads.get(leader, 0) + 1
        up = [m for m in others if node.peer_is_up(m)]
        for group in groups:
            if leaders[group] != cluster.node_id or self._handing_over.get(group, 0.0) > now:
                continue
            holders = node.groups[group].member_ids()  # (a group led here is held here)
            target = leader_target([m for m in others if m in holders], draining, up, leads)
            if target is None:
                if not self._no_target_said:
                    log.warning("draining: no member is up and not drained to take the leadership of %s", group)
                    self._no_target_said = True
                return
            self._no_target_said = False
            log.info("draining: moving the leadership of %s to %s", group, target)
            self._handing_over[group] = now + HAND_OVER_WAIT_S
            leads[target] = leads.get(target, 0) + 1
            node.transfer_leadership(group, target)

    def _record_placement(self, now: float) -> None:
        cluster = self.cluster
        meta = cluster.broker.meta
        if now < self._recording_until or not meta.feature_enabled(PLACEMENT):
            return
        if any(group not in cluster.node.groups for group in cluster.shards):
            # Groups on a few members: those held elsewhere as their holders announce them, once
            # every member is linked (one out of reach could hold any of them).
            if not meta.shard_groups or cluster.unseen_members() or cluster.node.peers_awaiting_placement():
                # (the first record is the first placement, first_placement.py: a member yet to
                # take it, or one out of reach that may, must find itself where it was placed)
                return
            held = dict(cluster.node.groups)  # (the hub thread may change it meanwhile)
            if any(held[group].leader_id is None for group in cluster.shards if group in held):
                # A group held here without a leader known: this replica's members may be those
                # of a configuration the group has left (a move removed this member while it was
                # cut off, and it has not heard yet). A jepsen-style run (seed 7671) recorded
                # shard-1 on n1, n4, n5 from n4's such replica, for 16 s, after it had moved.
                return
            placement = cluster.placement()
            groups = [[group, placement.get(group, [])] for group in cluster.shards]
            if any(not members for _group, members in groups):
                return
        else:
            groups = [[group, sorted(cluster.node.groups[group].member_ids())] for group in cluster.shards]
        if groups == [[group, members] for group, members in meta.shard_groups.items()]:
            return
        self._recording_until = now + RECORD_WAIT_S

        def done(reply: Any) -> None:
            self._recording_until = 0.0
            if reply is not True and reply is not False:
                log.warning("the shard groups were not recorded (%s): trying again", reply)

        log.info("recording the shard groups and their members: %s", groups)
        cluster.submit(None, SetGroups(groups), done)

    def _balance_leaders(self, others: list[str]) -> None:
        """Spread group leaders over the members: a member leading two groups more than another
        hands one of its shards, the one holding the fewest queues, to the member leading fewest
        (machines/leader_balance.py; one move per round, all up; never to or from a member
        under maintenance, whose leaderships `_watch_maintenance` moves)."""
        cluster = self.cluster
        node = cluster.node
        if not others or not all(node.peer_is_up(m) for m in others):
            return
        draining = cluster.broker.meta.draining
        if cluster.node_id in draining:
            return
        others = [m for m in others if m not in draining]
        if not others:
            return
        # Every group, held here or not: counted from this member's replicas only, each member
        # saw itself ahead of the others and two handed one group to and fro for good.
        groups = [META_GROUP, *cluster.shards]
        leaders = {group: node.leader(group) for group in groups}
        mine = [g for g, leader in leaders.items() if leader == cluster.node_id]
        holders = {g: node.groups[g].member_ids() for g in mine if g in node.groups}
        if leadership_to_hand_over(cluster.node_id, leaders, holders, others) is None:
            return  # (balanced: the queues are not counted, a walk over every queue record)
        queues = cluster.broker.meta.queues_per_group()
        move = leadership_to_hand_over(cluster.node_id, leaders, holders, others, queues)
        if move is None:
            return
        group, target = move
        log.info(
            "moving the leadership of %s to %s (this node leads %d of %d groups)",
            group,
            target,
            len(mine),
            len(groups),
        )
        node.transfer_leadership(group, target)
