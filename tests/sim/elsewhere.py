"""A node's part in serving shard groups it holds no replica of: ClusterLog's section "groups held
elsewhere" (server/cluster.py) around the real server/remote.py `Sender` and `Receiver`.

Theory of operation (server/remote.py's docstring is the design). In a run whose layout places
groups on a few nodes (layout.py), each node has one `Elsewhere` per process:

- as a holder that leads a group, while its replica applies (runner.py's observer): the replies
  to the requests of a non-holder's entry go to it (`Sender.reply`), then the entry's end
  (`entry_done`); an entry of a non-holder's dead life, or a Down that ended its lives, "x"
  (`Sender.dead`, `Sender.lives_ended`: runner.py); a command's deliveries to consumers of
  non-holders go to them (`deliveries_here`: `take_deliveries`, after a resync of each of them
  when the node has come to lead the group in a new term: `Sender.newly_led`);
  the rest are performed here, each once (`local_deliveries`). A holder that does not lead
  performs only its own consumers' deliveries. What was gathered goes out at the end of the
  batch (`flush`), one message per member, on the link between them (links.py);
- as a receiver (`receive`: `_on_remote`): numbers are checked per sender, a gap asks it for a
  resync ("?"); replies answer this life's requests, "e" completes its entry (Node.applied_own),
  deliveries are performed once (`Receiver.fresh`), a resync's also not if the consumer's
  channel holds the message; "x" cuts the life off; "?" sends a resync of each group led here;
- now and then (`watch`: `_watch_remote`): a group it has come to lead (a new term) sends a resync; the
  queues' counts ("qs") go to the non-holders every STATS_EVERY_S (what makes a quiet link's
  lost last message show as a gap); entries whose end never came in REPLIES_WAIT_S are given
  up (`Node.expire_elsewhere`); deliveries remembered for consumers gone are forgotten.

The ReplicationNode that `Sender` reads (`_led_holders`) is `EngineView`: who leads and who
holds each group, from the layout. Replica moves (`_group_left`, `_promoted`) and learners are
left out: a node holds the same groups for the whole run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import META_GROUP, STATS_EVERY_S, STATS_PER_ITEM, Deliver, QueueStats, remote
from .checks import SimFailure

if TYPE_CHECKING:
    from .layout import Layout
    from .proposer import Node
    from .runner import World

STATS_EVERY_MS = int(STATS_EVERY_S * 1000)
REPLIES_WAIT_MS = int(remote.REPLIES_WAIT_S * 1000)


class GroupView:
    """One replicated group as a node's engine has it: whether the node leads it, its members."""

    __slots__ = ("layout", "node", "name", "members", "learning")

    def __init__(self, layout: Layout, node: str, name: str, members: tuple[str, ...]) -> None:
        self.layout = layout
        self.node = node
        self.name = name
        self.members = members
        self.learning = False  # (no replica moves here)

    @property
    def is_leader(self) -> bool:
        return self.layout.leads(self.node, self.name)

    @property
    def term(self) -> int:
        return self.layout.terms[self.name]

    @property
    def term_from(self) -> int | None:
        return self.layout.term_from[self.name] if self.is_leader else None

    def member_ids(self) -> list[str]:
        return list(self.members)


class EngineView:
    """What server/remote.py and ClusterLog read of the ReplicationNode: whether groups are on a
    few members (`partial`), the groups this node holds (`groups`), what the others announce
    holding (`peer_held`: every node is linked here; a link loses messages, not the peer)."""

    def __init__(self, layout: Layout, node: str, nodes: list[str]) -> None:
        self.partial = layout.partial
        self.groups: dict[str, GroupView] = {META_GROUP: GroupView(layout, node, META_GROUP, tuple(nodes))}
        for group in layout.held_by(node):
            self.groups[group] = GroupView(layout, node, group, layout.holders[group])
        self._announced = {other: (META_GROUP, *layout.held_by(other)) for other in nodes if other != node}

    def peer_held(self) -> dict[str, tuple[str, ...]]:
        return self._announced

    def is_leader(self, group: str) -> bool:
        g = self.groups.get(group)
        return g is not None and g.is_leader


class Elsewhere:
    def __init__(self, world: World, node: Node) -> None:
        self.world = world
        self.node = node
        self.engine = EngineView(world.layout, node.name, [n.name for n in world.nodes])
        self.shards = [group for group in self.engine.groups if group != META_GROUP]
        self.start()

    def start(self) -> None:
        """A process starts: a new sending life, nothing received yet, no group led yet."""
        self.sender = remote.Sender(self.node.name, self._send)
        self.sender.life = self.world.next_sender_life(self.node.name)  # (not a random token: replays)
        self.sender.node = self.engine
        self.sender.short_deliveries = lambda: True  # (a cluster of this release: SHORT_DELIVERIES)
        self.receiver = remote.Receiver()
        self.gap_hold = remote.GapHold()  # ClusterLog.gap_hold: deliveries after a gap wait for the resync
        self.gapped: set[str] = set()  # the senders one of whose messages went missing (for the checks)
        self.stats_due_ms = 0

    def _send(self, member: str, payload: bytes) -> None:
        if not self.world.links.send(self.node.name, member, payload):
            self.world.trace(f"  {self.node.name} sends a message to {member!r}, no member: dropped")

    def flush(self) -> None:
        self.sender.flush()

    # ------------------------------------------------- the leader's side, while applying

    def replies_to(self, group: str, origin: str) -> str | None:
        """ClusterLog._apply_entry's `elsewhere`: the non-holder an entry's replies go to."""
        if origin == self.node.life:
            return None
        return self.sender.remote_node(group, origin)

    def deliveries_here(self, group: str, effects: list, index: int) -> list:
        """ClusterLog.deliveries_here: an entry of an earlier term sends no delivery; a group led
        here in a new term resyncs first (and so does a holder gone since the last batch led here:
        none in a run, whose holders do not change)."""
        out = self.sender
        gone = out.holders_gone(group)
        if out.catching_up(group, index):
            out.owe_resync(group)
            return self.local_deliveries(out.not_sent(group, effects))
        if out.newly_led(group):
            self.resync_as_new_leader(group)
        elif gone:
            out.resync_consumers_of(group, self._queues_of(group), gone)
        return self.local_deliveries(out.take_deliveries(group, effects))

    def local_deliveries(self, effects: list) -> list:
        """ClusterLog.local_deliveries: each delivery to a consumer here is written once."""
        first_time = self.receiver.first_time
        has_consumer = self.node.has_consumer
        return [
            e
            for e in effects
            if type(e) is not Deliver
            or not has_consumer(e.consumer_id)
            or first_time(e.consumer_id, e.message.seq, e.message.delivery_count)
        ]

    def _queues_of(self, group: str) -> list:
        machines = self.node.replica.broker.groups.get(group)
        return list(machines.queues.values()) if machines is not None else []

    def resync_as_new_leader(self, group: str) -> None:
        self.sender.resync_consumers_of(group, self._queues_of(group))

    # ------------------------------------------------------------- the receiving side

    def receive(self, peer: str, payload: bytes) -> None:
        """ClusterLog._on_remote: one message from `peer`."""
        try:
            items, gap = self.receiver.take(peer, payload)
        except remote.ReplyError as exc:  # the simulation's senders write no malformed message
            raise SimFailure(f"{self.node.name} could not read a message from {peer}: {exc}") from None
        if self.world.tracing:
            self.world.trace(f"  {self.node.name} takes {_describe(items)} from {peer}")
        if gap:
            self.gapped.add(peer)
            self.world.trace(f"  {self.node.name}: a message from {peer} went missing: asks it for a resync")
            self.sender.ask_resync(peer)
        arrived = {id(item) for item in items}
        for item in self.gap_hold.order(peer, items, gap, self.world.now_ms / 1000, self.node.acking):
            self._item(peer, item, held=id(item) not in arrived)
        self.flush()

    def _item(self, peer: str, item: list, held: bool = False) -> None:
        """One item from `peer`; `held`: deliveries GapHold kept back since a gap (for the checks)."""
        kind = item[0]
        node = self.node
        if kind == "r":
            _kind, _group, origin, request, reply = item
            if origin == node.life:
                node.replied(request, remote.decoded_reply(reply))
        elif kind == "e":
            _kind, group, origin, seq = item
            if origin == node.life:
                node.applied_own(group, seq)
        elif kind == "d":
            self._remote_deliveries(item[1], sender=peer, after_gap=peer if held else "")
        elif kind == "s":
            # (which sender's message went missing: the one asked, or one that led before this one)
            self._remote_deliveries(item[2], resync=True, after_gap=",".join(sorted(self.gapped)))
        elif kind == "x":
            _kind, group, origin = item
            if origin == node.life:
                node.cut_off(f"{peer} says the life is dead in {group}")
        elif kind == "qs":
            pass  # the counts of the queues `peer` leads, and the group: the management API's and the leader hint
        elif kind == "?":
            led = [g for g in self.engine.groups if g != META_GROUP and self.engine.is_leader(g)]
            self.sender.answer_resync_ask(peer, [(g, self._queues_of(g)) for g in led])
        else:  # ("t", "q", moves: the workload sends no direct reply-to, deletes no queue, moves nothing)
            raise SimFailure(f"{node.name} got an item it does not expect from {peer}: {item[0]!r}")

    def _remote_deliveries(self, run: list, resync: bool = False, after_gap: str = "", sender: str = "") -> None:
        """ClusterLog._remote_deliveries: written unless written before; for a resync, also unless
        the consumer's channel holds the message."""
        fresh = self.receiver.fresh
        holding: dict[str, set[int]] = {}
        for consumer_id, record, _redelivered in run:  # (the flag is the client's)
            if resync:
                seqs = holding.get(consumer_id)
                if seqs is None:
                    seqs = holding[consumer_id] = self.node.held_by(consumer_id)
                if record[0] in seqs:
                    continue
            message = fresh(consumer_id, record)
            if message is not None:
                self.node.on_deliver(consumer_id, message, after_gap, sender)

    # ----------------------------------------------------------------- now and then

    def watch(self) -> None:
        """ClusterLog._watch_remote, one turn (no moves: the held groups never change)."""
        out = self.sender
        ask, release = self.gap_hold.due(self.world.now_ms / 1000)
        for peer in ask:
            out.ask_resync(peer)
        for peer, waited in release:
            for item in waited:
                self._item(peer, item, held=True)
        out.flush()  # (who leads what is read afresh below)
        led = {group for group in self.shards if self.engine.is_leader(group)}
        applied = self.node.replica.applied
        for group in sorted(led):
            # (ClusterLog._caught_up: every entry is a command here, no no-op)
            caught_up = applied.get(group, 0) >= self.world.layout.term_from[group] - 1
            if caught_up and out.newly_led(group):
                self.resync_as_new_leader(group)
        now_ms = self.world.now_ms
        if now_ms >= self.stats_due_ms:
            self.stats_due_ms = now_ms + STATS_EVERY_MS
            self._send_queue_stats(sorted(led))
        out.flush()
        self.node.expire_elsewhere(now_ms - REPLIES_WAIT_MS)
        seen = self.receiver.seen
        for consumer_id in [c for c in seen if not self.node.has_consumer(c)]:
            self.receiver.forget(consumer_id)

    def _send_queue_stats(self, led: list[str]) -> None:
        members = [n.name for n in self.world.nodes if n is not self.node]
        for group in led:
            targets = [m for m in members if self.sender.remote_node(group, m + "@") is not None]
            if not targets:
                continue
            records: list[Any] = [
                QueueStats.of(self.node.name, q).record(q.vhost, q.name) for q in self._queues_of(group)
            ]
            for start in range(0, len(records), STATS_PER_ITEM):
                chunk = records[start : start + STATS_PER_ITEM]
                for member in targets:
                    self.sender.outgoing.setdefault(member, []).append(["qs", chunk, group])
                self.sender.flush()


def _describe(items: list) -> str:
    """A message's items for the step log: kinds, and the messages of deliveries and resyncs."""
    parts = []
    for item in items:
        if item[0] == "d":
            parts.append("d(" + " ".join(f"{c.rsplit('/', 1)[1]}:{r[4].decode()}#{r[5]}" for c, r, _ in item[1]) + ")")
        elif item[0] == "s":
            parts.append(
                f"s:{item[1]}(" + " ".join(f"{c.rsplit('/', 1)[1]}:{r[4].decode()}#{r[5]}" for c, r, _ in item[2]) + ")"
            )
        elif item[0] in ("r", "e", "x"):
            parts.append(f"{item[0]}:{item[1]}")
        else:
            parts.append(item[0])
    return "[" + ", ".join(parts) + "]"
