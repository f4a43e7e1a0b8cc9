"""A member serving queues of groups it holds no replica of: what a group's leader sends it.

Theory of operation (docs/scale-out-plan.md, "Step 3: the design"; RabbitMQ's quorum queues
do the same: rabbit_fifo's effects are sent by the leader to consumer processes on any node).
A member M that holds no replica of group g proposes its commands for g as any member does
(the engine carries them to g's leader and answers at commit), but applies nothing of g, so
its channels cannot take the machine's replies, nor its consumers their deliveries, from
its own machines. The member that leads g when it applies an entry (L) sends them instead:

- for an entry of M's: each request's reply ("r"), then the entry's end ("e"), which
  completes it in M's proposer (its confirms go out, server/proposer.py). Sent for an entry
  with a request or a publish (`end_awaited`); M completes any other at its commit. A publish
  is confirmed only once applied: a committed entry may still be skipped, its life declared
  dead in the group before it (the seeded simulation found such publishes confirmed at their
  commit and never enqueued: tests/sim);
- each `Deliver` to a consumer whose connection M holds ("d"), in apply order, after the
  replies of the same command (a consume-ok before the first delivery); as the short record of
  what M's channel writes (`delivery_record`) once every member reads it (SHORT_DELIVERIES);
- an entry of M's skipped because its life was declared dead in g, or a Down that ended M's
  lives in g ("x", `lives_ended`): M starts a new life, as a member holding g does when it
  applies that Down;
- a queue of g deleted ("q"): M's consumers of it are told (basic.cancel), unless M's metadata
  places that name in another group now (declared again since); for an entry of an earlier
  term, with the resync below, and only if the name is not in g again by then;
- a direct reply-to reply for a requester on M, passing through g ("t"; cluster.reply_elsewhere);
  not for an entry of an earlier term;
- when it becomes g's leader, once per Raft term (`newly_led`: before the first deliveries it
  sends M as leader, ClusterLog.deliveries_here), at the first batch after M stopped applying g
  while L led it (`holders_gone`: a move removed M), and when M asks (below), a resync ("s"):
  every message checked out to M's consumers in g, which M delivers unless it delivered it
  already; to an ask from M when L leads no group M holds no replica of, an empty one.

What L gathers while it applies a batch goes out at the batch's end, one engine message per
member (ReplicationNode.send_message: in order over one link, dropped when the link is down),
as msgpack `[life, number, [item, ...]]`: numbered from 1 per sending life, so a member that
finds a number missing asks that sender for a resync ("?"). One above FRAGMENT_BYTES (a
prefetch window of large messages: 200 of 16 KiB came to 3.2 MB, over the engine's cap of about
1 MiB per message, and was dropped again at each resync, so that consumer never got a message)
goes as fragments `[life, number, part, parts, bytes]` sent in a row; the member joins them,
and a fragment missing or out of turn counts as a missing message. A reply that never comes (lost
with a link, or the leader changed between commit and apply) fails its request after
REPLIES_WAIT_S (server/proposer.py). Deliveries are keyed by (consumer, seq, delivery count),
which names one delivery of one message: one that comes twice (two leaders in turn, or a
resync) is written once (`Receiver.seen`, the last DELIVERIES_SEEN_MAX per consumer).

Nothing here runs unless groups are placed and some member holds fewer than every group
(`ReplicationNode.partial`, `held_everywhere`).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from itertools import islice
from typing import Any

import msgpack

from ..machines import commands as qc
from ..machines.message import Message
from ..machines.queue_types import Deliver, Rejected
from ..machines.snapshot import message_from_record, message_record
from ..replication.replies import ReplyError, decode_reply, encode_reply

log = logging.getLogger("maxq.remote")

RESYNC_ASKS_MAX = 3  # a resync not come after a gap is asked again (GapHold), this many asks in all
REPLIES_WAIT_S = 5.0  # after its commit, an entry of a group held elsewhere waits this long for "e"
# Per consumer: deliveries remembered to drop a second copy, which comes within moments (two
# leaders in turn, a replica's hand-over); a resync is checked against what the channel holds.
# Memory, only on a member of a cluster whose groups are on a few members: ~110 KiB per consumer
# (tracemalloc, a Receiver after 5,000 deliveries to one consumer; the OrderedDict this was until
# 2026-12-07 took ~170 KiB). The oldest go in steps (a plain dict, whose inserts cost less than
# an OrderedDict's: scripts/bench_remote_records.py), so up to an eighth more are held between
# two steps.
DELIVERIES_SEEN_MAX = 1024
LEADERSHIP_CHECK_S = 0.2  # how often a member looks whether it became the leader of a group
# A message above this goes in fragments of it: below the engine's cap on one message
# (replication/group.py PAYLOAD_BYTES_MAX + engine.MESSAGE_ENVELOPE_BYTES, 1.06 MiB).
FRAGMENT_BYTES = 512 * 1024
FRAGMENTS_MAX = 8192  # 4 GiB: a larger message is malformed (what a member's consumers hold)


_PUBLISHES = (qc.Enqueue, qc.EnqueueFifo)
_new_tuple = tuple.__new__


def end_awaited(items: list) -> bool:
    """Whether an entry of a member holding no replica of its group is done only at the leader's
    "e" (its items: (target, command, request)): a request waits for its reply, a publish for
    being applied (a confirm means enqueued, and a committed entry may still be skipped)."""
    return any(request or type(command) in _PUBLISHES for _target, command, request in items)


# A delivery's message as the member holding the consumer's channel writes it: [seq, exchange,
# routing key, properties, body, delivery count, count header] (the channel reads nothing else:
# Channel.deliver_run, Session.write_deliveries), a third of the fields of a full record
# (snapshot.message_record). scripts/bench_remote_records.py, 1,000 deliveries of 128 B: the
# leader encodes them in 1.23 ms against 1.96, the member decodes them in 1.48 ms against 1.66,
# 177 bytes each against 201.
DELIVERY_FIELDS = 7


def delivery_record(message: Message) -> list:
    return [
        message.seq,
        message.exchange,
        message.routing_key,
        message.props_raw,  # (msgpack packs a view or a bytearray as bytes too: no copy here)
        message.body,
        message.delivery_count,
        message.count_header,
    ]


def message_of_delivery(record: list) -> Message:
    """The message of a delivery record: a short one (`delivery_record`) or a full one (a
    resync's, or from a leader of an earlier release). Raises TypeError/ValueError if malformed."""
    if type(record) is not list:
        raise TypeError(f"a record is a list, not {type(record).__name__}")
    if len(record) != DELIVERY_FIELDS:
        return message_from_record(record)
    seq, exchange, routing_key, props_raw, body, delivery_count, count_header = record
    if (
        type(seq) is not int
        or type(exchange) is not str
        or type(routing_key) is not str
        or type(props_raw) is not bytes
        or type(body) is not bytes
        or type(delivery_count) is not int
    ):
        raise ValueError("malformed delivery record")
    message = Message(exchange, routing_key, props_raw, body)
    message.seq = seq
    message.delivery_count = delivery_count
    message.count_header = bool(count_header)
    return message


def _forget_oldest(seen: dict) -> None:
    """Keep a consumer's last DELIVERIES_SEEN_MAX deliveries: the oldest go (a dict keeps its
    insertion order)."""
    for key in list(islice(seen, len(seen) - DELIVERIES_SEEN_MAX)):
        del seen[key]


def node_of(owner: str) -> str:
    """The node an origin ("n1@3fa0c2d1"), session ("n1@5be0a7c3.7") or consumer id names."""
    return owner.partition("@")[0]


class Sender:
    """The leader's side: items gathered per member while entries are applied, sent by `flush`."""

    def __init__(self, node_id: str, send: Callable[[str, bytes], None]) -> None:
        self.node_id = node_id
        self.send = send  # ReplicationNode.send_message
        self.life = secrets.token_hex(6)
        self.numbers: dict[str, int] = {}  # member -> number of the last message sent to it
        self.outgoing: dict[str, list] = {}
        self.node: Any = None  # the ReplicationNode: who leads and who holds each group
        self._holders: dict[str, frozenset[str] | None] = {}  # group -> its members if led here, per batch
        self._terms_resynced: dict[str, int] = {}  # group -> the Raft term of its last `newly_led`
        self._holders_before: dict[str, frozenset[str]] = {}  # group -> its holders at its last batch led here
        # group -> queue key -> the cluster's members: deleted by an entry of an earlier term
        # applied here as leader (`queue_removed`), told with the resync of this leadership
        self._removals_owed: dict[str, dict[tuple[str, str], list[str]]] = {}
        self.short_deliveries: Callable[[], bool] = lambda: False  # whether every member reads them

    @property
    def active(self) -> bool:
        node = self.node
        # (groups placed, but every member holds every group: 3 members at the default factor)
        return node is not None and node.partial and not node.held_everywhere

    def _led_holders(self, group: str) -> frozenset[str] | None:
        """The members that apply the group when this node leads it (cached until the next
        flush), else None: its members but those that say they hold no replica of it (their
        announcement, ReplicationNode.peer_held). A member whose replica went while the
        configuration still names it (seen in a jepsen-style run after two moves of one group
        interleaved) would otherwise never hear the replies to its requests."""
        try:
            return self._holders[group]
        except KeyError:
            pass
        g = self.node.groups.get(group)
        holders = None
        if g is not None and g.is_leader:
            announced = self.node.peer_held()
            holders = frozenset(m for m in g.member_ids() if group in announced.get(m, (group,)))
        self._holders[group] = holders
        return holders

    def leads(self, group: str) -> bool:
        """Whether this node leads `group` as this batch's deliveries are taken (the same answer
        `take_deliveries` goes by)."""
        return self._led_holders(group) is not None

    def newly_led(self, group: str) -> bool:
        """Whether this node leads `group` in a Raft term it has not said so for yet (then the
        members holding no replica of it are to be resynced first: `ClusterLog.deliveries_here`).
        By term, not by whether it led when last looked: a leadership lost and taken back between
        two looks had another leader in between, whose deliveries may be lost with it (the
        simulation: 16 of 20,000 seeds of --partial). A term won without a leader between costs
        one resync more."""
        if self._led_holders(group) is None:
            return False
        term = self.node.groups[group].term
        if self._terms_resynced.get(group) == term:
            return False
        self._terms_resynced[group] = term
        return True

    def catching_up(self, group: str, index: int) -> bool:
        """Whether this node leads `group` and the entry at `index` was appended before its
        leadership began (its Raft log's entries of earlier terms: a restarted member's replay,
        or what a lagging follower had not applied when it was elected). Their deliveries to
        members holding no replica are not sent: the leader of the time sent them, or (applied
        there last, or never there) they are owed, and the resync this leader sends once it has
        applied them carries those still checked out (ClusterLog.deliveries_here). Sent, a member
        wrote again what its consumer had acked long before, where the deliveries outran its
        memory of those written: 1,816 of 3,000 after the three holders of a group restarted
        (a /tmp script, 7 members at factor 3), none flagged redelivered."""
        if self._led_holders(group) is None:
            return False
        start = getattr(self.node.groups.get(group), "term_from", None)
        return start is not None and index < start

    def owe_resync(self, group: str) -> None:
        """An entry of an earlier term was applied here as leader: `newly_led` is True again, so
        the resync goes after it (one went already if the watch took this member for caught up
        just before this entry came)."""
        self._terms_resynced.pop(group, None)

    def not_sent(self, group: str, effects: list) -> list:
        """`effects` without the deliveries to consumers of members holding no replica of `group`
        (an entry of an earlier term applied by its leader: `catching_up`)."""
        return [e for e in effects if type(e) is not Deliver or self.remote_node(group, e.consumer_id) is None]

    def holders_gone(self, group: str) -> list[str]:
        """The members that applied `group` at the last batch this node led it and apply it no
        more (a move removed them, or they say they hold no replica now): before this batch's
        deliveries to their consumers go to them, they are to be resynced (ClusterLog.deliveries_here).
        Such a member may not have applied the last entries before its removal (pysyncobj's
        leader stops sending to it as it appends the removal, so the commit of those entries may
        never reach it), though this leader counted on it for their deliveries: sent up to
        LEADERSHIP_CHECK_S later by the watch, they came after this batch's."""
        holders = self._led_holders(group)
        if holders is None:
            self._holders_before.pop(group, None)
            return []
        before = self._holders_before.get(group)
        self._holders_before[group] = holders
        if before is None or before == holders:
            return []
        return sorted(before - holders - {self.node_id})

    def remote_node(self, group: str, owner: str) -> str | None:
        """The member `owner` names when this node leads `group` and that member holds no replica
        of it: this node sends it what its own machines would have told it."""
        holders = self._led_holders(group)
        if holders is None:
            return None
        node = node_of(owner)
        return None if node in holders else node

    def reply(self, node: str, group: str, origin: str, request: int, reply: Any) -> None:
        try:
            encoded = encode_reply(reply)
        except ReplyError as exc:
            log.error("%s: a reply to %s cannot be sent: %s", group, origin, exc)
            encoded = encode_reply(Rejected(541, f"internal error: {exc}"))
        self.outgoing.setdefault(node, []).append(["r", group, origin, request, encoded])

    def entry_done(self, node: str, group: str, origin: str, seq: int) -> None:
        self.outgoing.setdefault(node, []).append(["e", group, origin, seq])

    def dead(self, group: str, origin: str) -> None:
        node = self.remote_node(group, origin)
        if node is not None:
            self.outgoing.setdefault(node, []).append(["x", group, origin])

    def lives_ended(self, group: str, prefix: str, lives: tuple[str, ...]) -> None:
        """A `Down` ended `lives` (of the node `prefix` names) in `group`: when this node leads
        it and that node holds no replica, it is told ("x", as for an entry of a dead life). Its
        consumers there are gone from the queues; without this it learned it only at its next
        entry in the group, and a consumer that only waits for messages proposes none (the
        simulation: 6 of 20,000 seeds of --partial)."""
        node = self.remote_node(group, prefix)
        if node is not None:
            self.outgoing.setdefault(node, []).extend(["x", group, life] for life in lives)

    def take_deliveries(self, group: str, effects: list) -> list:
        """The deliveries to consumers of members holding no replica of `group` (when this node
        leads it) go into their members' next message; the rest are returned, to be performed."""
        holders = self._led_holders(group)
        if holders is None:
            return effects
        rest = []
        runs: dict[str, list] = {}
        nodes: dict[str, str | None] = {}  # consumer id -> its member if that holds no replica (`remote_node`)
        record = delivery_record if self.short_deliveries() else message_record
        for effect in effects:
            if type(effect) is Deliver:
                consumer_id = effect[0]
                try:
                    node = nodes[consumer_id]
                except KeyError:
                    name = node_of(consumer_id)
                    node = nodes[consumer_id] = None if name in holders else name
                if node is not None:
                    run = runs.get(node)
                    if run is None:
                        run = runs[node] = []
                    run.append([consumer_id, record(effect[1]), effect[2]])
                    continue
            rest.append(effect)
        for node, run in runs.items():
            self.outgoing.setdefault(node, []).append(["d", run])
        return rest

    def reply_to(self, group: str, command: Any, index: int) -> None:
        """A direct reply-to reply passing through `group` (the entry at `index`) for a requester
        on a member that holds no replica of it (the requester's key starts with its node's name).
        Not sent for an entry of an earlier term (`catching_up`): the leader of the time sent
        it, and a reply is sent at most once, as RabbitMQ's are."""
        if self.catching_up(group, index):
            return
        node = self.remote_node(group, command.key.partition("~")[0] + "@")
        if node is not None:
            self.outgoing.setdefault(node, []).append(
                ["t", command.key, command.exchange, command.routing_key, command.props_raw, command.body]
            )

    def queue_removed(self, group: str, key: tuple[str, str], members: list[str], index: int) -> None:
        """The queue was deleted (by the entry at `index`): every member (of `members`, the
        cluster's) holding no replica of its group is told, for its consumers of it (the machine
        has dropped them by now).

        For an entry of an earlier term (`catching_up`: a restarted leader's replay) it is told
        with this leadership's resync, and only if no queue of that name is in the group by then
        (`resync_consumers_of`): sent at once, it cancelled the consumers of the queue declared
        again under that name since, whose machine kept them, so the messages checked out to
        them were stuck (tests/cluster/test_group_restart.py)."""
        if self.catching_up(group, index):
            self._removals_owed.setdefault(group, {})[key] = members
            return
        self._tell_removed(group, key, members)

    def _tell_removed(self, group: str, key: tuple[str, str], members: list[str]) -> None:
        for node in members:
            if self.remote_node(group, node + "@") is not None:
                self.outgoing.setdefault(node, []).append(["q", key[0], key[1], group])

    def resync(self, node: str, group: str, queues: list) -> None:
        """Everything `queues` (the group's machines) have checked out to `node`'s consumers."""
        held = []
        for queue in queues:
            for consumer_id, consumer in queue.consumers.items():
                if node_of(consumer_id) == node:
                    for message in consumer.checked_out.values():
                        held.append([consumer_id, message_record(message), message.redelivered])
        self.outgoing.setdefault(node, []).append(["s", group, held])

    def resync_consumers_of(self, group: str, queues: list, nodes: list[str] | None = None) -> None:
        """A resync (`resync`) to each member holding no replica of `group` (of `nodes`, if given)
        with a consumer of `queues` (the group's machines). For every member (`nodes` None: this
        leadership's resync), first the deletions it owes (`queue_removed`) of queues not in
        `queues`."""
        if nodes is None:
            owed = self._removals_owed.pop(group, {})
            present = {(queue.vhost, queue.name) for queue in queues}
            for key in sorted(owed.keys() - present):
                self._tell_removed(group, key, owed[key])
        with_consumers = {node_of(c) for queue in queues for c in queue.consumers} - {self.node_id}
        for node in sorted(with_consumers if nodes is None else with_consumers.intersection(nodes)):
            if self.remote_node(group, node + "@") is not None:
                self.resync(node, group, queues)

    def answer_resync_ask(self, node: str, led: list[tuple[str, list]]) -> None:
        """`node` missed a message of this sender's ("?"): a resync of each group of `led` (the
        groups led here, with their machines) it holds no replica of. If there is none, an empty
        one (no group): its GapHold then acts on what it holds of this sender's at once. Each
        delivery it holds came from a group this sender led then, whose leader since resyncs
        `node` itself (`newly_led`); it held them RESYNC_ASKS_MAX asks (15 s) before."""
        sent = False
        for group, queues in led:
            if self.remote_node(group, node + "@") is not None:
                self.resync(node, group, queues)
                sent = True
        if not sent:
            self.outgoing.setdefault(node, []).append(["s", None, []])

    def ask_resync(self, node: str) -> None:
        self.outgoing.setdefault(node, []).append(["?"])

    def flush(self) -> None:
        """Send what was gathered; who leads and holds each group is read afresh after it (the
        answers are kept only while a batch is applied: a member that becomes a group's leader
        must not go on taking itself for a follower)."""
        self._holders = {}
        if not self.outgoing:
            return
        outgoing, self.outgoing = self.outgoing, {}
        for node, items in outgoing.items():
            number = self.numbers.get(node, 0) + 1
            self.numbers[node] = number
            payload = msgpack.packb([self.life, number, items], use_bin_type=True)
            try:
                if len(payload) <= FRAGMENT_BYTES:
                    self.send(node, payload)
                    continue
                parts = -(-len(payload) // FRAGMENT_BYTES)
                for part in range(parts):
                    chunk = payload[part * FRAGMENT_BYTES : (part + 1) * FRAGMENT_BYTES]
                    self.send(node, msgpack.packb([self.life, number, part, parts, chunk], use_bin_type=True))
            except ValueError as exc:  # over the engine's size cap: the member resyncs at the gap
                log.error("a message to %s was not sent: %s", node, exc)


class Receiver:
    """The member's side: numbers checked per sender, deliveries written once."""

    def __init__(self) -> None:
        self.last: dict[str, tuple[str, int]] = {}  # sender -> (its life, the last number taken)
        # sender -> (life, number, the fragments of that message so far)
        self.fragments: dict[str, tuple[str, int, list[bytes]]] = {}
        # consumer id -> its deliveries written, (seq, delivery count), oldest first
        self.seen: dict[str, dict[tuple[int, int], None]] = {}
        self.gaps = 0
        self.duplicates_dropped = 0

    def take(self, peer: str, payload: bytes) -> tuple[list, bool]:
        """The items of one message from `peer`, and whether one before it went missing (then
        the caller asks `peer` for a resync). Raises ReplyError on a malformed message."""
        try:
            message = msgpack.unpackb(payload, raw=False)
        except Exception as exc:
            raise ReplyError(f"malformed message from {peer}: {exc}") from None
        if type(message) is list and len(message) == 5:
            whole = self._joined(peer, message)
            if whole is None:  # more fragments to come; or one went missing: the message is lost
                return [], peer not in self.fragments and self._lost(peer, message)
            try:
                message = msgpack.unpackb(whole, raw=False)
            except Exception as exc:
                raise ReplyError(f"malformed message from {peer}: {exc}") from None
        if type(message) is not list or len(message) != 3:
            raise ReplyError(f"malformed message from {peer}")
        life, number, items = message
        if type(life) is not str or type(number) is not int or type(items) is not list:
            raise ReplyError(f"malformed message from {peer}")
        self.fragments.pop(peer, None)
        last = self.last.get(peer)
        gap = number != (1 if last is None or last[0] != life else last[1] + 1)
        self.last[peer] = (life, number)
        if gap:
            self.gaps += 1
        return items, gap

    def _joined(self, peer: str, fragment: list) -> bytes | None:
        """The whole message once its last fragment came in turn, else None (kept, or, out of
        turn, dropped with the fragments before it)."""
        life, number, part, parts, chunk = fragment
        if (
            type(life) is not str
            or type(number) is not int
            or type(part) is not int
            or type(parts) is not int
            or type(chunk) is not bytes
            or not 0 <= part < parts <= FRAGMENTS_MAX
        ):
            raise ReplyError(f"malformed fragment from {peer}")
        kept = self.fragments.pop(peer, None)
        if part == 0:
            kept = (life, number, [])
        elif kept is None or kept[:2] != (life, number) or len(kept[2]) != part:
            return None
        kept[2].append(chunk)
        if part + 1 < parts:
            self.fragments[peer] = kept
            return None
        return b"".join(kept[2])

    def _lost(self, peer: str, fragment: list) -> bool:
        """A fragment came out of turn: its message is lost. Counted as a gap (the caller asks
        for a resync) once per message: the next numbers follow on from it."""
        life, number = fragment[0], fragment[1]
        if fragment[2] == 0 or self.last.get(peer) == (life, number):
            return False  # (a first fragment only starts a message; this one was counted)
        self.last[peer] = (life, number)
        self.gaps += 1
        return True

    def fresh(self, consumer_id: str, record: list) -> Any:
        """The message of a delivery record if this member has not written it to the consumer yet
        (None: a second copy). Raises ReplyError on a malformed record."""
        try:
            message = message_of_delivery(record)
        except (TypeError, ValueError) as exc:
            raise ReplyError(f"malformed delivery: {exc}") from None
        return message if self.first_time(consumer_id, message.seq, message.delivery_count) else None

    def first_time(self, consumer_id: str, seq: int, delivery_count: int) -> bool:
        """Whether this delivery (of message `seq`, its `delivery_count`-th) to the consumer is
        new here; it is remembered as written."""
        seen = self.seen.get(consumer_id)
        if seen is None:
            seen = self.seen[consumer_id] = {}
        key = (seq, delivery_count)
        if key in seen:
            self.duplicates_dropped += 1
            return False
        seen[key] = None
        if len(seen) > DELIVERIES_SEEN_MAX + (DELIVERIES_SEEN_MAX >> 3):
            _forget_oldest(seen)
        return True

    def deliveries(self, run: list) -> list:
        """The `Deliver` effects of a run of delivery records ([consumer id, record, redelivered])
        that this member has not written yet (`fresh`, in one pass: this is the path of every
        message a consumer here gets from a group held elsewhere). A routing repeated from the
        record before is given that record's strings, as a publish's messages share theirs: the
        channel encodes a routing once per run of the same objects (Session.write_deliveries).
        Raises ReplyError on a malformed record (the run is dropped: `fresh`)."""
        out = []
        seen_of = self.seen
        consumer_last: str | None = None
        seen: dict[tuple[int, int], None] = {}
        exchange_last = routing_key_last = ""  # (a value of another type is never equal to it: checked)
        for consumer_id, record, redelivered in run:
            if type(record) is not list or len(record) != DELIVERY_FIELDS or type(consumer_id) is not str:
                message = self.fresh(consumer_id, record)  # a full record (a leader of an earlier release)
                if message is not None:
                    out.append(Deliver(consumer_id, message, bool(redelivered)))
                consumer_last = None
                continue
            seq, exchange, routing_key, props_raw, body, delivery_count, count_header = record
            if exchange != exchange_last:
                if type(exchange) is not str:
                    raise ReplyError("malformed delivery: malformed delivery record")
                exchange_last = exchange
            if routing_key != routing_key_last:
                if type(routing_key) is not str:
                    raise ReplyError("malformed delivery: malformed delivery record")
                routing_key_last = routing_key
            if (
                type(seq) is not int
                or type(props_raw) is not bytes
                or type(body) is not bytes
                or type(delivery_count) is not int
            ):
                raise ReplyError("malformed delivery: malformed delivery record")
            if consumer_id != consumer_last:
                found = seen_of.get(consumer_id)
                if found is None:
                    found = seen_of[consumer_id] = {}
                seen = found
                consumer_last = consumer_id
            key = (seq, delivery_count)
            if key in seen:
                self.duplicates_dropped += 1
                continue
            seen[key] = None
            if len(seen) > DELIVERIES_SEEN_MAX + (DELIVERIES_SEEN_MAX >> 3):
                _forget_oldest(seen)
            message = Message(exchange_last, routing_key_last, props_raw, body)
            message.seq = seq
            message.delivery_count = delivery_count
            message.count_header = bool(count_header)
            out.append(_new_tuple(Deliver, (consumer_id, message, redelivered is True)))  # Deliver(...) minus a call
        return out

    def forget(self, consumer_id: str) -> None:
        self.seen.pop(consumer_id, None)


class GapHold:
    """A member's order of acting on a sender's items after a gap in its messages: the
    deliveries ("d") wait for the resync it asked for ("s", which carries every message the
    sender's groups have checked out to this member's consumers, those lost in the gap among
    them), and come after it; the rest is acted on at once. Without it the deliveries of the
    message that showed the gap were written before the resync's earlier ones: a consumer's
    order broke (the seeded simulation, 52 of 20,000 seeds; the jepsen-style run of seed 2008,
    21 messages after a partition healed). A resync that does not come within REPLIES_WAIT_S
    (its "?" lost, or slow) is asked again, up to RESYNC_ASKS_MAX times; then the deliveries go
    (`due`): late rather than never (the sender may lead none of this member's groups now).

    Of the deliveries that waited (and those before the resync in its own message), those to a
    consumer that acknowledged when they came (`acking`, asked of this member's channels) are
    dropped once the resync comes. Each was made before the resync by a leader of its group:
    if the sender still leads it, the resync has it if it is still checked out to that
    consumer (else it was acked, returned or redelivered since: writing it after the resync's
    later ones broke the consumer's order, the simulation's seed 421196, a message requeued
    again by a repeated Requeue); if the sender leads it no more, the group's leader since
    resyncs this member once it has applied what the sender had (`Sender.newly_led`), and
    writing it after that leader's later deliveries broke the order too (seed 428946). A no-ack
    consumer's are in no resync and still go, after it (at most once, but not lost here; a tag
    of a no-ack consumer consumed again with acks is why it is asked as each delivery comes)."""

    def __init__(self) -> None:
        # sender -> (until when, its deliveries held with the consumers that acknowledged as
        # they came, how many times the resync was asked)
        self.held: dict[str, tuple[float, list[tuple[list, frozenset]], int]] = {}

    def order(self, peer: str, items: list, gap: bool, now: float, acking: Callable[[str], bool] | None = None) -> list:
        """The items of `peer`'s message to act on now, in the order to act on them."""
        if gap:
            _until, kept, _asks = self.held.get(peer, (0.0, [], 0))
            self.held[peer] = (now + REPLIES_WAIT_S, kept, 1)
        waiting = self.held.get(peer)
        if waiting is None:
            return items
        first = next((i for i, item in enumerate(items) if item[0] == "s"), None)
        if first is None:
            waiting[1].extend((item, _acking_in(item, acking)) for item in items if item[0] == "d")
            return [item for item in items if item[0] != "d"]
        del self.held[peer]
        resyncs = [item for item in items if item[0] == "s"]
        earlier = [*waiting[1], *((item, _acking_in(item, acking)) for item in items[:first] if item[0] == "d")]
        still = [d for d in (_not_to(acked, item) for item, acked in earlier) if d is not None]
        later = [item for i, item in enumerate(items) if item[0] != "s" and not (i < first and item[0] == "d")]
        return [*resyncs, *still, *later]

    def due(self, now: float) -> tuple[list[str], list[tuple[str, list]]]:
        """The waits that ran out: the senders to ask again for a resync, and (sender, its held
        deliveries) of those asked RESYNC_ASKS_MAX times, to be written now."""
        ask, release = [], []
        for peer, (until, kept, asks) in sorted(self.held.items()):
            if until > now:
                continue
            if asks < RESYNC_ASKS_MAX:
                self.held[peer] = (now + REPLIES_WAIT_S, kept, asks + 1)
                ask.append(peer)
            else:
                del self.held[peer]
                release.append((peer, [item for item, _acked in kept]))
        return ask, release


def _acking_in(item: list, acking: Callable[[str], bool] | None) -> frozenset:
    """The consumers of a "d" item's deliveries that acknowledge now, by `acking`."""
    run = item[1] if len(item) > 1 else None
    if acking is None or type(run) is not list:
        return frozenset()
    return frozenset(d[0] for d in run if type(d) is list and d and type(d[0]) is str and acking(d[0]))


def _not_to(consumers: frozenset, item: list) -> list | None:
    """A "d" item without its deliveries to `consumers` (itself if it has none; None if it had
    only those). A malformed one is kept as it is, to be refused where it is read."""
    run = item[1] if len(item) > 1 else None
    if type(run) is not list:
        return item
    kept = [d for d in run if not (type(d) is list and d and type(d[0]) is str and d[0] in consumers)]
    if len(kept) == len(run):
        return item
    return ["d", kept] if kept else None


def decoded_reply(value: Any) -> Any:
    """A reply item's reply, or a refusal of the request if it cannot be read."""
    try:
        return decode_reply(value)
    except ReplyError as exc:
        log.error("a reply from the group's leader cannot be read: %s", exc)
        return Rejected(541, f"internal error: {exc}")
