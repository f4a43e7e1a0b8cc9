"""A simulated cluster node's proposing side: its lives, sequence numbers, retries and tombstones.

Theory of operation: this is the `Proposer` (server/proposer.py) without trio, driven by
the simulation's steps instead of the engine's callbacks:

- a node runs one life at a time ("n1@3fa0c2d1"); each of its entries names the life and a
  sequence number per group (`submit`, as `_propose` numbers them);
- `answer(proposal, error)` is `_proposed`: "committed" waits for the entry to be applied here
  (`applied_own`, as `_apply_entry` completes it); "not leader" or "timeout" puts it on the
  retry list while `outcome_wait_ms` lasts (a tombstone forever); after that it is given up: its
  caller hears the error ("timeout" when an attempt may have been appended), a tombstone takes
  its seq, and its channel and connection clean-ups (`Down` of an owner) and its consumers' acks,
  requeues, rejects and credit go again in a new entry, in their order;
- `cut_off()` is `Proposer.new_life`: the cluster declared this life down, so a new one starts, what was
  in flight hears "timeout", and the channels close (their `Down`s go from the new life);
- `restart()` is a crash and a start: the process is gone with its retries; the member's state
  comes back from its last snapshot plus the log after it; the new life commits its barrier
  (`Down("n@")` in every group, `ClusterLog.barrier`) before it serves clients again;
- an entry of a group the node holds no replica of (`holds`, layout.py) is done when the
  group's leader says it was applied ("e", elsewhere.py), or at its commit when nothing in it
  waits for a reply; the commands whose callers wait (`REQUESTED`, and the barrier) carry request
  numbers, answered by the leader's "r" (`replied`); an entry whose end does not come within
  REPLIES_WAIT_S of its commit is given up (`expire_elsewhere`).

The node's view of the world (which queues exist, what its consumers hold) is the witness
replica's (runner.py): every member applies the same log, so any one will do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .api import ALL_QUEUES, META_GROUP, Rejected, encode_entry, md, qc, remote
from .checks import NO_ACK_ACROSS_LEADERS, RESYNC_AFTER_LATER, SimFailure
from .fake_log import Proposal
from .replica import message_number

if TYPE_CHECKING:
    from .runner import World

CLEANUP_COMMANDS = (qc.Down, md.OwnerDown)  # server/cluster.py's: proposed again when given up
CONSUMER_COMMANDS = (qc.Settle, qc.Discard, qc.Requeue, qc.Credit)  # likewise (server/proposer.py)


# The commands whose callers wait for their reply (the server submits them with a `then`): in a
# group held elsewhere, they carry a request number for the leader's reply.
def end_awaited(items: list, requested: bool) -> bool:
    """Proposer._proposed's test (server/remote.py `end_awaited`, with the publish_ends feature
    on): an entry of a group held elsewhere is done at the leader's "e" when a caller waits for a
    reply or when it carries a publish; otherwise at its commit."""
    return requested or remote.end_awaited(items)


REQUESTED = (qc.Checkout, qc.Get, qc.Cancel, qc.Create, qc.Tick)
RETRYABLE = ("not leader", "timeout", "busy")


class ConsumerView:
    """What a channel knows of one of its consumers: its queue, and the deliveries it holds."""

    __slots__ = (
        "key",
        "no_ack",
        "active",
        "confirmed",
        "checkout_at",
        "unacked",
        "settled",
        "delivered",
        "last_written",
        "last_sender",
        "reused",
    )

    def __init__(self, key: tuple[str, str], no_ack: bool) -> None:
        self.key = key
        self.no_ack = no_ack
        self.active = True
        self.confirmed = False  # its Checkout was applied by the node's replica (consume-ok)
        self.checkout_at: tuple[str, str, int] | None = None  # (life, group, seq) of that Checkout
        self.reused = False  # a cancelled tag consumed again (workload.py): maybe in another mode
        self.unacked: dict[int, None] = {}  # queue seqs delivered, not yet acked or returned
        self.settled: dict[int, None] = {}  # queue seqs acked, rejected or returned since their last delivery
        self.delivered: dict[tuple[int, int], None] = {}  # (seq, delivery count) of each delivery written
        self.last_written = 0  # the place among the machines' deliveries of the last one written
        self.last_sender = ""  # the node whose "d" brought that one ("": performed where applied)


class Channel:
    __slots__ = ("owner", "consumers", "got", "keys")

    def __init__(self, owner: str) -> None:
        self.owner = owner  # "node@session/channel", as server/channel.py names it
        self.consumers: dict[str, ConsumerView] = {}
        self.got: dict[tuple[str, str], dict[int, None]] = {}  # basic.get deliveries not yet acked, per queue
        self.keys: dict[tuple[str, str], None] = {}  # queues it consumed from (its Down goes to each)

    @property
    def get_holder(self) -> str:
        return f"get:{self.owner}"


class Node:
    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.life = ""
        self.lives: list[str] = []
        self.seqs: dict[str, int] = {}
        self.in_flight: dict[tuple[str, int], Proposal] = {}
        self.retries: list[Proposal] = []
        self.barrier_waiting: dict[str, None] = {}
        self.sessions = 0  # server/session.py's process-wide counter: it starts again with the process
        self.process = ""  # server/session.py's _PROCESS_TOKEN: this process's own, in its session ids
        self.channels: dict[str, Channel] = {}
        self.skew_ms = 0
        self.replica: Any = None  # runner.py sets it
        self.paused = False  # its replica does not apply for now (slow, or cut off from the leader)
        self.snapshot: dict | None = None  # its replica's last snapshot
        self.cut_offs = 0
        self.held: frozenset[str] | None = None  # the groups its replica holds (None: all of them)
        self.elsewhere: Any = None  # its part in serving groups held elsewhere (elsewhere.py), if any
        # Requests of this process's entries in groups held elsewhere: number -> (group, seq, target, command)
        self.requests: dict[int, tuple[str, int, Any, Any]] = {}
        self.next_request = 1
        # Channels open when the node installed a snapshot: the server closes them then (clients
        # reconnect); here they stay, so the deliveries they missed are not held against them.
        self.stale_channels: dict[str, None] = {}

    @property
    def serving(self) -> bool:
        return not self.barrier_waiting

    def clock_ms(self) -> int:
        return self.world.now_ms + self.skew_ms

    def holds(self, group: str) -> bool:
        """Proposer.holds: whether this node's replica applies `group`."""
        return self.held is None or group in self.held

    def new_session(self) -> str:
        """Session's id for the process's next connection: "node@process.n"."""
        self.sessions += 1
        return self.session_id()

    def session_id(self) -> str:
        """The id of the process's latest connection."""
        return f"{self.name}@{self.process}.{self.sessions}"

    # ------------------------------------------------------------------ lives

    def new_life(self) -> None:
        rng = self.world.rng
        for _ in range(100):  # bounded: a 32-bit token repeats once in billions
            life = f"{self.name}@{rng.getrandbits(32):08x}"
            if life not in self.lives:
                break
        else:
            raise AssertionError("no fresh life token")
        self.life = life
        self.lives.append(life)
        self.seqs = {}

    def start(self) -> None:
        """A process starts: a new life that commits its barrier before it serves."""
        self.sessions = 0
        self.channels = {}
        self.new_life()
        self.process = self.life.partition("@")[2]  # (the life's token: no draw of its own)
        self.world.trace(f"{self.name}: starts as {self.life}")
        self.barrier_waiting = {group: None for group in self.world.groups}
        for group in self.world.groups:
            self._barrier(group)

    def _barrier(self, group: str) -> None:
        command = md.OwnerDown(self.name + "@") if group == META_GROUP else qc.Down(self.name + "@")
        target = None if group == META_GROUP else ALL_QUEUES
        proposal = self.submit(group, [(target, command)])
        proposal.barrier = True

    def restart(self) -> None:
        """The process crashes and starts again: its callers hear nothing more (their connections
        went), its attempts in flight may still commit, its retries are gone."""
        for proposal in self.in_flight.values():
            proposal.outcome = "crashed"
            self.world.ledger.on_outcome(proposal)
        self.in_flight = {}
        self.retries = []
        self.barrier_waiting = {}
        self.requests = {}
        self.world.trace(f"{self.name}: crashes ({self.life})")
        self.start()

    def cut_off(self, why: str) -> None:
        """Proposer.new_life: this life was declared down; the process goes on with a new one."""
        self.cut_offs += 1
        old = self.life
        channels, self.channels = self.channels, {}
        self.new_life()
        self.world.trace(f"{self.name}: {old} cut off ({why}); now {self.life}")
        in_flight, self.in_flight = self.in_flight, {}
        for proposal in in_flight.values():
            self._complete(proposal, "timeout")
        # The sessions close (server/session.py): each releases its consumers in the queues it
        # used, `Down("node@session/channel")`, proposed by the new life; and the clean-ups that
        # were in flight go again (Proposer.new_life).
        by_group: dict[str, list] = {}
        for proposal in in_flight.values():
            for target, command in proposal.items:
                if type(command) in CLEANUP_COMMANDS and not command.owner.endswith("@"):
                    by_group.setdefault(proposal.group, []).append((target, command))
        for group, items in by_group.items():
            self.submit(group, items)
        by_group = {}
        for channel in channels.values():
            for group, target, command in self.closing(channel):
                by_group.setdefault(group, []).append((target, command))
        for group, items in by_group.items():
            self.submit(group, items)

    def closing(self, channel: Channel) -> list[tuple[str, tuple[str, str], qc.Down]]:
        """A channel closes: (group, queue, Down(owner)) for each queue it used."""
        return [(self.world.group_of(key), key, qc.Down(channel.owner)) for key in channel.keys]

    # --------------------------------------------------------------- proposing

    def submit(self, group: str, items: list, publishes: tuple[int, ...] = ()) -> Proposal:
        seq = self.seqs.get(group, 0) + 1
        self.seqs[group] = seq
        world = self.world
        requests = [] if self.holds(group) else self._requests(group, seq, items)
        payload = encode_entry(
            self.clock_ms(),
            items if not requests else [(t, c, r) for (t, c), r in zip(items, requests, strict=True)],
            self.life,
            seq,
        )
        proposal = Proposal(
            world.next_pid(), self, group, self.life, seq, items, payload, publishes, False, world.now_ms
        )
        proposal.requests = [r for r in requests if r]
        self.in_flight[(group, seq)] = proposal
        world.ledger.on_proposed(proposal)
        world.log.append(proposal)
        if world.tracing:
            world.trace(f"  propose {proposal} {_describe(items)}")
        return proposal

    def _requests(self, group: str, seq: int, items: list) -> list[int]:
        """A request number for each command whose caller waits for its reply (0: none)."""
        barrier = self.name + "@"
        requests = []
        for target, command in items:
            if type(command) in REQUESTED or (type(command) in CLEANUP_COMMANDS and command.owner == barrier):
                request = self.next_request
                self.next_request += 1
                self.requests[request] = (group, seq, target, command)
                requests.append(request)
            else:
                requests.append(0)
        return requests

    def answer(self, proposal: Proposal, error: str | None) -> None:
        """Proposer._proposed: the log's answer to one attempt."""
        if proposal.outcome is not None or proposal.origin != self.life:
            return
        if error is None:
            if not proposal.committed:
                proposal.committed = True
                proposal.committed_ms = self.world.now_ms
            if not self.holds(proposal.group) and not end_awaited(
                [(t, c, 0) for t, c in proposal.items], bool(proposal.requests)
            ):
                # A group held elsewhere, and nothing to hear back: committed is all (server/remote.py).
                proposal.done_at_commit = True
                self._complete(proposal, None)
            return
        if error == "timeout":
            proposal.maybe_appended = True
        if proposal.committed:
            return
        world = self.world
        if error in RETRYABLE and (
            proposal.tombstone or world.now_ms - proposal.first_proposed_ms < world.outcome_wait_ms
        ):
            self.retries.append(proposal)
            return
        if proposal.tombstone:
            return
        self._complete(proposal, "timeout" if proposal.maybe_appended else error)
        filler = Proposal(
            world.next_pid(),
            self,
            proposal.group,
            proposal.origin,
            proposal.seq,
            [],
            encode_entry(self.clock_ms(), [], proposal.origin, proposal.seq),
            (),
            True,
            world.now_ms,
        )
        if world.tracing:
            world.trace(f"  give up {proposal}: tombstone {filler}")
        world.log.append(filler)
        again = [
            (target, command)
            for target, command in proposal.items
            if (type(command) in CLEANUP_COMMANDS and not command.owner.endswith("@"))
            or type(command) in CONSUMER_COMMANDS
        ]
        if again:
            self.submit(proposal.group, again)

    def retry(self) -> int:
        """Proposer.retry_proposals: the entries on the list are proposed again, but those of
        a life cut off since."""
        retries, self.retries = self.retries, []
        for proposal in retries:
            if proposal.origin == self.life:
                self.world.log.append(proposal)
        return len(retries)

    def expire_elsewhere(self, committed_before_ms: int) -> None:
        """Proposer.expire_elsewhere: entries of groups held elsewhere, committed before the time
        given, whose end never came from the group's leader, fail ("timeout")."""
        for proposal in [p for p in self.in_flight.values() if p.committed and p.committed_ms < committed_before_ms]:
            if not self.holds(proposal.group):
                self.world.trace(f"  {self.name}: the end of {proposal} never came from its leader")
                self._complete(proposal, "timeout")

    def replied(self, request: int, reply: Any) -> None:
        """The leader's reply to a request of this process (a group held elsewhere): what the
        replica's observer does for a group held here (runner.py)."""
        waiting = self.requests.pop(request, None)
        if waiting is None:
            return
        group, seq, target, command = waiting
        kind = type(command)
        if kind is qc.Checkout:
            self.on_checkout(group, seq, command.consumer_id, reply is True)
        elif kind is qc.Get and type(reply) is tuple and not command.no_ack:
            self.on_get(command.consumer_id, target, reply[0].seq)

    def applied_own(self, group: str, seq: int) -> None:
        """An entry of this life was applied (on the member's replica): it is done."""
        proposal = self.in_flight.get((group, seq))
        if proposal is not None:
            self._complete(proposal, None)

    def _complete(self, proposal: Proposal, error: str | None) -> None:
        self.in_flight.pop((proposal.group, proposal.seq), None)
        if proposal.outcome is not None:
            return
        for request in proposal.requests:
            if request in self.requests and error is None:
                # Proposer.complete: applied, and no reply came: the caller hears a refusal.
                self.replied(request, Rejected(541, "command was not applied"))
            self.requests.pop(request, None)  # (on an error, the channel closes below)
        proposal.outcome = error or "ok"
        self.world.ledger.on_outcome(proposal)
        if error is not None and proposal.origin == self.life:
            # A caller waiting on it hears `Unavailable`, which closes its connection (channel.py).
            for _target, command in proposal.items:
                if type(command) in (qc.Checkout, qc.Get, qc.Cancel):
                    channel = self.channels.get(
                        command.owner if type(command) is not qc.Cancel else command.consumer_id.rsplit("/", 1)[0]
                    )
                    if channel is not None:
                        self.close(channel, f"{proposal} failed: {error}")
        if proposal.barrier:
            if error is None:
                self.barrier_waiting.pop(proposal.group, None)
            elif proposal.group in self.barrier_waiting:
                self._barrier(proposal.group)  # ClusterLog.barrier submits it again

    # -------------------------------------------------------------- deliveries

    def on_deliver(self, consumer_id: str, message: Any, after_gap: str = "", sender: str = "") -> None:
        """A delivery written to its consumer's channel, which must come after every one written
        before it in the queue's order (checks.py, 1). `after_gap`: it came in a resync to a
        node that found a message of those senders missing (a known finding, to a no-ack
        consumer, if out of order); `sender`: the node whose "d" it came in (a known finding, to
        a no-ack consumer, if the later one written came from another). Out of order to a
        consumer that acks is a failure whatever the road."""
        channel = self.channels.get(consumer_id.rsplit("/", 1)[0])
        consumer = None if channel is None else channel.consumers.get(consumer_id)
        if consumer is not None:
            ledger = self.world.ledger
            key = (consumer_id, message.seq, message.delivery_count)
            place = ledger.delivery_order[key]
            # (made to a no-ack consumer: this one, or one before it with the same id, cancelled)
            made_no_ack = key in ledger.made_no_ack
            if place < consumer.last_written:
                what = (
                    f"{self.name} wrote m{message_number(message.body)} (seq {message.seq}, delivery "
                    f"{message.delivery_count}) to {consumer_id} after a delivery its queue made later"
                )
                if after_gap and made_no_ack:
                    # KNOWN FINDING (left after remote.GapHold: 2 of 20,000 seeds): a resync, or
                    # deliveries held since a gap, written after deliveries their queue made later,
                    # made to a no-ack consumer (nothing is checked out to it for a resync to carry;
                    # it may since have been cancelled, and its tag consumed again with acks).
                    ledger.known.append(f"{RESYNC_AFTER_LATER}: {what} (a resync, after a gap from {after_gap})")
                elif made_no_ack and sender and sender != consumer.last_sender:
                    # KNOWN FINDING: two leaders in turn sent this consumer's deliveries on two
                    # links: the old one's came after the new one's, or were lost on the way and
                    # sent again by the new leader applying their entries late. A resync covers
                    # what is checked out, and nothing is for a no-ack consumer.
                    ledger.known.append(
                        f"{NO_ACK_ACROSS_LEADERS}: {what} (from {sender}, the later from "
                        f"{consumer.last_sender or 'here'}, to a no-ack consumer)"
                    )
                else:
                    raise SimFailure(what)
                self.world.trace(f"  KNOWN FINDING: {ledger.known[-1]}")
            if place > consumer.last_written:
                consumer.last_written, consumer.last_sender = place, sender
            consumer.delivered[(message.seq, message.delivery_count)] = None
            consumer.settled.pop(message.seq, None)
            if not consumer.no_ack:
                consumer.unacked[message.seq] = None

    def _consumer(self, consumer_id: str) -> ConsumerView | None:
        channel = self.channels.get(consumer_id.rsplit("/", 1)[0])
        return None if channel is None else channel.consumers.get(consumer_id)

    def has_consumer(self, consumer_id: str) -> bool:
        """Whether a channel of this node has the consumer (the broker's `consumers`)."""
        return self._consumer(consumer_id) is not None

    def acking(self, consumer_id: str) -> bool:
        """ClusterLog._acking: whether a channel of this node has the consumer, acknowledging.
        A cancelled tag consumed again counts once its Checkout was applied: this workload does so
        at once, where a server's channel does so only once the Cancel is applied, which its member
        hears after the cancelled consumer's deliveries; until then the channel still has the one
        cancelled (for a tag that was no-ack, its late deliveries are not the new consumer's)."""
        consumer = self._consumer(consumer_id)
        return consumer is not None and not consumer.no_ack and (consumer.confirmed or not consumer.reused)

    def held_by(self, consumer_id: str) -> set[int]:
        """ClusterLog._held_by: the seqs the consumer's channel holds (delivered, not acked)."""
        consumer = self._consumer(consumer_id)
        return set() if consumer is None else set(consumer.unacked)

    def on_checkout(self, group: str, seq: int, consumer_id: str, ok: bool) -> None:
        """The node's replica applied a Checkout of this life: the channel's basic.consume gets
        consume-ok, or its channel error (the channel closes)."""
        channel = self.channels.get(consumer_id.rsplit("/", 1)[0])
        consumer = None if channel is None else channel.consumers.get(consumer_id)
        if consumer is None or consumer.checkout_at != (self.life, group, seq):
            return  # (an earlier consume of the same tag, answered already)
        if ok:
            consumer.confirmed = True
        else:
            self.close(channel, "channel error on basic.consume")

    def close(self, channel: Channel, why: str) -> None:
        """A channel (its connection: one channel each here) closes: Down of its owner."""
        if self.channels.pop(channel.owner, None) is None:
            return
        self.world.trace(f"  {channel.owner} closes: {why}")
        by_group: dict[str, list] = {}
        for group, target, command in self.closing(channel):
            by_group.setdefault(group, []).append((target, command))
        for group, items in by_group.items():
            self.submit(group, items)

    def on_get(self, holder: str, key: tuple[str, str], seq: int) -> None:
        channel = self.channels.get(holder[4:])
        if channel is not None:
            channel.got.setdefault(key, {})[seq] = None


def _describe(items: list) -> str:
    parts = []
    for target, command in items:
        kind = type(command)
        where = "meta" if target is None else "*" if target == ALL_QUEUES else target[1]
        if kind is qc.Enqueue:
            detail = ",".join(m.body.decode() for m in command.messages)
        elif kind in (qc.Settle, qc.Requeue, qc.Discard):
            detail = f"{command.consumer_id} {list(command.seqs)}"
        elif kind in (qc.Checkout,):
            detail = (
                f"{command.consumer_id} prefetch={command.prefetch} no_ack={command.no_ack} credit={command.credit}"
            )
        elif kind in (qc.Cancel, qc.Credit):
            detail = " ".join(str(v) for v in command)
        elif kind in (qc.Down, md.OwnerDown):
            detail = command.owner
        elif kind is qc.Get:
            detail = f"{command.consumer_id} no_ack={command.no_ack}"
        else:
            detail = ""
        parts.append(f"{kind.__name__}({where}{' ' + detail if detail else ''})")
    return " ".join(parts)
