"""What must hold after every step, and at the end of a run.

Theory of operation: two kinds of checks, in pairs.

1. Agreement: every replica that applied the same prefix of a group's log has the same digest
   for it (replica.py: the apply order and every queue's dumped state, or the metadata), and
   every queue machine passes its own `check_invariants()`.
   And a node writes a consumer's deliveries in the order its queue made them (the witness's
   apply order; Node.on_deliver), whether its replica made them or a group's leader sent them.

2. The ledger, kept from the witness replica (it applies every committed entry at once, never
   restarts; the others agree with it by 1). Every published message has a number; the ledger
   follows each number:
   - enqueued at most once, ever (a repeated or overtaking proposal must not enqueue again);
   - after each committed entry, every number the entry's queues held before or got from it is
     still held exactly once (in any place of the queue: ready, returned, with a consumer ...)
     or it left with a licence from that entry: an ack or reject naming its seq, a delivery to a
     no-ack consumer or a no-ack basic.get, a purge, a delete by an SQS receive's current handle, or the queue's own count of what it dropped
     (expired, over x-max-length or x-delivery-limit) going up as much; and a number that left
     never comes back;
   - what callers heard: a proposal answered "ok" had its messages enqueued (exactly once); one
     answered with a definite error ("not leader", "busy": no attempt can have been appended)
     never has them enqueued;
   - at the end, once everything in flight has committed: a number whose entry's seq was first
     committed by the original (not a tombstone), of a life that is still its node's and not
     dead in that group, was enqueued exactly once; one never committed, or whose seq a tombstone took first, never.
   Which lives are dead is the ledger's own reckoning, from the design rather than from
   ApplyOrder: a node's `Down("n@")` applied in a group kills every life of that node that had
   committed an entry there, but the life that proposed it; no entry of a dead life is applied
   there afterwards.

3. Consumers, at the end: every consumer a queue holds belongs to a channel its node has open
   (no consumer outlives its channel or its life), and every consumer a node's open channel
   attached, and did not cancel, is attached in its queue; and every message a queue has
   checked out to a consumer reached its node's channel (that delivery, or the channel holds
   the message still): on a node holding the group, from its replica; on one that does not,
   from the group's leader (elsewhere.py), through lost messages, resyncs and leader changes.

Violations raise `SimFailure` with what diverged; the runner prints the seed and the step log.
But for the server's bugs the simulation found with groups on a few nodes and the server has
not fixed yet (`KNOWN_FINDINGS`, each where it is told apart, marked KNOWN FINDING): the
violation that matches one, and only it, is counted in `Ledger.known`, so that the rest of the
run still checks everything else.
"""

from __future__ import annotations

from typing import Any

from .api import ALL_QUEUES, DEDUP_WINDOW_MS, Deliver, HandleResult, LivesDown, Message, qc
from .fake_log import FakeLog, Proposal
from .replica import Replica, message_number


class SimFailure(AssertionError):
    pass


# Bugs of the server the simulation found and counts instead of failing on, until they are fixed
# (then the count goes, and a regression seed comes: plants.py).
RESYNC_AFTER_LATER = "a lost message's deliveries written after later ones"  # (made to a no-ack consumer)
RESYNC_ASK_LOST = "a resync request lost, never asked again"
NO_ACK_ACROSS_LEADERS = "a no-ack delivery written after a later one another leader sent"
KNOWN_FINDINGS = (
    RESYNC_AFTER_LATER,
    RESYNC_ASK_LOST,
    NO_ACK_ACROSS_LEADERS,
)


def check_agreement(witness: Replica, others: list[Replica]) -> None:
    """Replicas at the witness's index for a group have its digest for it (those holding it)."""
    for group, index in witness.applied.items():
        digest = None
        for replica in others:
            if replica.applied.get(group) != index:
                continue
            if digest is None:
                digest = witness.digest(group)
            theirs = replica.digest(group)
            if theirs != digest:
                raise SimFailure(
                    f"{replica.name} diverged from the witness in {group} at index {index}: "
                    f"{theirs.hex()} != {digest.hex()}{_explain(witness, replica, group)}"
                )


def _explain(witness: Replica, replica: Replica, group: str) -> str:
    """Which part differs (for the failure message)."""
    mine, theirs = witness.broker.groups[group], replica.broker.groups[group]
    if mine.order.digest() != theirs.order.digest():
        return f"\n  apply order: witness {mine.order.digest()}\n           vs {replica.name} {theirs.order.digest()}"
    if group == "meta":
        return "\n  (metadata records differ)"
    keys = list(mine.queues)
    if keys != list(theirs.queues):
        return f"\n  queues: witness {keys} vs {list(theirs.queues)}"
    for key in keys:
        a, b = witness.queue_state(group, key), replica.queue_state(group, key)
        if a != b:
            return f"\n  queue {key[1]}: numbers witness {sorted(a[1])} vs {sorted(b[1])}"
    return ""


class Ledger:
    def __init__(self, log: FakeLog) -> None:
        self.log = log
        self.enqueued: dict[int, int] = {}  # number -> times enqueued (by the witness)
        self.proposal_of: dict[int, Proposal] = {}  # number -> the proposal carrying it
        self.numbers: dict[tuple[tuple[str, str], int], int] = {}  # (queue, seq) -> number
        self.queue_of: dict[int, tuple[str, str]] = {}  # number -> its queue
        self.held: dict[tuple[str, str], frozenset] = {}  # queue -> numbers it held after the last entry
        self.gone: dict[int, str] = {}  # number -> why it left
        self.dropped: dict[tuple[str, str], int] = {}  # queue -> its count of dropped messages
        self.no_ack: dict[tuple[tuple[str, str], str], bool] = {}  # (queue, consumer id) -> no-ack?
        # Within one committed entry (and the held ones it releases):
        self.touched: dict[tuple[str, str], None] = {}
        self.entered: dict[tuple[str, str], list[int]] = {}
        self.licences: dict[int, str] = {}
        self.purged: dict[tuple[str, str], None] = {}
        self.all_touched: dict[str, bool] = {}  # group -> a command for every queue (Down of an owner)
        # The design's reckoning of lives: group -> lives with an entry committed there; -> dead ones.
        self.seen: dict[str, dict[str, None]] = {}
        self.dead: dict[str, dict[str, str]] = {}  # group -> life -> who declared it dead
        self.known: list[str] = []  # known findings seen (not failures: see KNOWN_FINDINGS)
        # (consumer id, seq, delivery count) -> its place among the machines' deliveries (Node.on_deliver)
        self.delivery_order: dict[tuple[str, int, int], int] = {}
        # the deliveries made to a no-ack consumer (keyed as delivery_order): a consumer id may
        # come again, as one that acks, after a cancel on the same channel with the same tag
        self.made_no_ack: set[tuple[str, int, int]] = set()
        self.deliveries = 0
        # SQS FIFO queues: (queue, deduplication id) -> (message id, queue time) of its enqueue
        self.dedup_first: dict[tuple[tuple[str, str], str], tuple[str, int]] = {}

    # ---------------------------------------------------------------- proposals

    def on_proposed(self, proposal: Proposal) -> None:
        for number in proposal.publishes:
            self.proposal_of[number] = proposal

    def on_outcome(self, proposal: Proposal) -> None:
        outcome = proposal.outcome
        if outcome == "ok":
            if proposal.done_at_commit:
                return  # (done at its commit, maybe not applied yet: `final` checks it)
            for number in proposal.publishes:
                if self.enqueued.get(number, 0) != 1:
                    raise SimFailure(
                        f"{proposal} was answered ok but m{number} was enqueued {self.enqueued.get(number, 0)} times"
                    )
        elif outcome not in ("timeout", "crashed") and proposal.commits:
            raise SimFailure(f"{proposal} was answered {outcome!r} (never appended) but a copy committed")

    def on_commit(self, group: str, proposal: Proposal) -> None:
        self.seen.setdefault(group, {})[proposal.origin] = None

    # ------------------------------------------------------- the witness applies

    def on_entry(self, group: str, index: int, entry: Any) -> None:
        """Every entry the witness applies (Replica.on_entry)."""
        declared = self.dead.get(group, {}).get(entry.origin)
        if entry.seq and declared:
            raise SimFailure(
                f"{group} entry {index} of {entry.origin}#{entry.seq} was applied, but that life was "
                f"declared dead there ({declared})"
            )

    def observe(
        self, group: str, index: int, entry: Any, target: Any, command: Any, request: int, reply: Any, effects: list
    ) -> None:
        """Every command the witness applies (Replica.observer)."""
        if target is None:
            for effect in effects:
                if type(effect) is LivesDown:
                    self._lives_down(group, index, effect)
            return
        kind = type(command)
        if target == ALL_QUEUES:
            self.all_touched[group] = True
        else:
            self.touched[target] = None
        if kind is qc.EnqueueFifo:
            self._fifo_sent(target, command, reply)
        elif kind is qc.Receive and type(reply) is list:
            last: dict[str, int] = {}
            for received in reply:
                group_id, number = received.message.group_id, received.message.sequence_number
                if group_id is not None:
                    if number is None or number <= last.get(group_id, -1):
                        raise SimFailure(f"a receive from {target[1]} gave group {group_id} out of order")
                    last[group_id] = number
        elif kind is qc.DeleteQueue:
            for dedup_key in [k for k in self.dedup_first if k[0] == target]:
                del self.dedup_first[dedup_key]
        if kind is qc.Enqueue or kind is qc.EnqueueFifo:
            for message in command.messages:
                if message.seq == -1:
                    continue  # not queued (refused): the ledger expects it nowhere
                number = message_number(message.body)
                times = self.enqueued[number] = self.enqueued.get(number, 0) + 1
                if times > 1:
                    raise SimFailure(
                        f"m{number} enqueued twice (second time in {group} entry {index} from "
                        f"{entry.origin}#{entry.seq})"
                    )
                self.numbers[(target, message.seq)] = number
                self.queue_of[number] = target
                self.entered.setdefault(target, []).append(number)
        elif kind is qc.Checkout:
            if reply is True:
                self.no_ack[(target, command.consumer_id)] = command.no_ack
        elif kind in (qc.Settle, qc.Discard):
            for seq in command.seqs:
                number = self.numbers.get((target, seq))
                if number is not None:
                    self.licences[number] = "acked" if kind is qc.Settle else "rejected"
        elif kind is qc.Get:
            if type(reply) is tuple and command.no_ack:
                self.licences[message_number(reply[0].body)] = "got no-ack"
        elif kind is qc.Purge:
            self.purged[target] = None
        elif kind is qc.DeleteReceived and type(reply) is list:
            for (seq, _receive_id), result in zip(command.handles, reply, strict=True):
                number = self.numbers.get((target, seq))
                if number is not None and result is HandleResult.DONE:
                    self.licences[number] = "deleted by its handle"
        for effect in effects:
            kind = type(effect)
            if kind is Deliver:
                self.deliveries += 1
                key = (effect.consumer_id, effect.message.seq, effect.message.delivery_count)
                self.delivery_order[key] = self.deliveries
                number = message_number(effect.message.body)
                if self.no_ack.get((self.queue_of[number], effect.consumer_id)):
                    self.licences[number] = "delivered no-ack"
                    self.made_no_ack.add(key)
            elif kind is LivesDown:
                self._lives_down(group, index, effect)

    def _fifo_sent(self, target: tuple[str, str], command: qc.EnqueueFifo, reply: Any) -> None:
        """A FIFO send: a new deduplication id (or one whose window is over) is enqueued under
        its own message id; a repeat within the window is not, and is answered with the first
        send's id."""
        if type(reply) is not list:
            return
        for message, (_group, dedup_id, message_id), result in zip(command.messages, command.fifo, reply, strict=True):
            first = self.dedup_first.get((target, dedup_id))
            if message.seq != -1:
                if first is not None and message.sent_ms < first[1] + DEDUP_WINDOW_MS:
                    raise SimFailure(
                        f"{message_id} to {target[1]} repeats {dedup_id} of {first[0]} within its window, "
                        "yet it was enqueued"
                    )
                if result is None or result[0] != message_id:
                    raise SimFailure(f"{message_id} to {target[1]} was enqueued but answered {result}")
                self.dedup_first[(target, dedup_id)] = (message_id, message.sent_ms)
            elif result is not None and (first is None or result[0] != first[0]):
                raise SimFailure(
                    f"{message_id} to {target[1]} was taken for a duplicate ({result}) of {first} "
                    f"(deduplication id {dedup_id})"
                )

    def _lives_down(self, group: str, index: int, effect: LivesDown) -> None:
        dead = self.dead.setdefault(group, {})
        for life in self.seen.get(group, ()):
            if life.startswith(effect.prefix) and life != effect.origin and life not in dead:
                dead[life] = f"Down({effect.prefix}) of {effect.origin} at {group}:{index}"

    def after_entry(self, witness: Replica, group: str) -> None:
        """After the witness applied one committed entry of `group` (with the held ones it released)."""
        if self.all_touched.pop(group, False):
            keys = list(witness.queues(group))
        else:
            keys = [key for key in self.touched if key in witness.queues(group)]
        for key in keys:
            _digest, numbers, dropped = witness.queue_state(group, key)
            now = frozenset(numbers)
            if len(now) != len(numbers):
                doubles = sorted(n for n in now if numbers.count(n) > 1)
                raise SimFailure(f"queue {key[1]} holds the same message twice: {doubles}")
            before = self.held.get(key, frozenset())
            entered = self.entered.get(key, ())
            for number in now.difference(before, entered):
                why = self.gone.get(number)
                raise SimFailure(
                    f"m{number} appeared in queue {key[1]} from nowhere" + (f" (it had left: {why})" if why else "")
                )
            drops = dropped - self.dropped.get(key, 0)  # what the queue says it dropped in this entry
            unlicensed = []
            for number in before.union(entered).difference(now):
                licence = self.licences.get(number)
                if licence is None:
                    if key in self.purged:
                        licence = "purged"
                    else:
                        unlicensed.append(number)
                        licence = "dropped"
                if number in self.gone:
                    raise SimFailure(f"m{number} left queue {key[1]} twice")
                self.gone[number] = licence
            if len(unlicensed) > drops:
                raise SimFailure(
                    f"{sorted(unlicensed)} left queue {key[1]} with no ack, no-ack delivery, delete by handle or purge, "
                    f"and the queue dropped only {drops} (expired, over a limit): lost"
                )
            self.held[key] = now
            self.dropped[key] = dropped
        self.touched.clear()
        self.entered.clear()
        self.licences.clear()
        self.purged.clear()

    # ------------------------------------------------------------------ the end

    def final(self, witness: Replica, current_lives: list[str]) -> None:
        """Once everything in flight has committed and been applied. (A life its node left, cut
        off or crashed, may have entries held for good behind a seq that never came: their
        callers heard "timeout" or nothing, so they may or may not be applied.)"""
        current = dict.fromkeys(current_lives)
        for number, proposal in self.proposal_of.items():
            times = self.enqueued.get(number, 0)
            first = self.log.first.get((proposal.origin, proposal.group, proposal.seq))
            if first is None:
                if times:
                    raise SimFailure(f"m{number} of {proposal} was enqueued, but no copy of it committed")
                continue
            if first.tombstone:
                if times:
                    raise SimFailure(
                        f"m{number} of {proposal} was enqueued although the tombstone {first} took its seq first"
                    )
                continue
            dead = proposal.origin in self.dead.get(proposal.group, ())
            if times != 1 and not dead and proposal.origin in current:
                raise SimFailure(
                    f"m{number} of {proposal} committed (first copy {first}), its life is alive, "
                    f"but it was enqueued {times} times"
                )
            if proposal.outcome == "ok" and times != 1:
                raise SimFailure(f"m{number} of {proposal} was confirmed but enqueued {times} times")
            if proposal.outcome not in (None, "ok", "timeout", "crashed") and times:
                raise SimFailure(f"m{number} of {proposal} was refused ({proposal.outcome}) yet enqueued")


def new_messages(numbers: list[int], queue: str, ttl_ms: int | None = None, priority: int = 0) -> list:
    return [Message("", queue, b"", b"m%d" % n, ttl_ms=ttl_ms, priority=priority) for n in numbers]


def check_consumers(witness: Replica, nodes: list, known: list[str]) -> None:
    """At the end: consumers in the queues and the channels of the nodes agree (checks.py, 3)."""
    by_name = {node.name: node for node in nodes}
    attached: dict[tuple[tuple[str, str], str], bool] = {}
    for group in witness.shards:
        for key in witness.queues(group):
            for consumer_id, owner, active, held in witness.consumers(group, key):
                attached[(key, consumer_id)] = active
                node = by_name.get(owner.split("@", 1)[0])
                if node is None or owner not in node.channels:
                    raise SimFailure(
                        f"queue {key[1]} keeps consumer {consumer_id} (active={active}, holding {held}) "
                        f"but its channel {owner} is gone" + ("" if node is None else f" ({node.name} is {node.life})")
                    )
    for node in nodes:
        for channel in node.channels.values():
            for consumer_id, view in channel.consumers.items():
                if view.active and view.confirmed and not attached.get((view.key, consumer_id)):
                    raise SimFailure(
                        f"{node.name}'s channel {channel.owner} has consumer {consumer_id} on "
                        f"{view.key[1]}, which the queue no longer has: it will never get a message"
                    )


def check_deliveries(witness: Replica, nodes: list, known: list[str], asks_lost: set[str]) -> None:
    """At the end: what the queues have checked out reached the consumers' channels (checks.py, 3).
    (Not a channel open when its node installed a snapshot: the server closes those then.)"""
    by_name = {node.name: node for node in nodes}
    for group in witness.shards:
        for key in witness.queues(group):
            for consumer_id, held in witness.checked_out(group, key).items():
                if consumer_id.startswith("get:"):
                    continue  # (a basic.get's: its message came with the reply)
                node = by_name[consumer_id.split("@", 1)[0]]
                owner = consumer_id.rsplit("/", 1)[0]
                if owner in node.stale_channels:
                    continue
                view = node.channels[owner].consumers[consumer_id]
                for seq, delivery_count, number in held:
                    if seq in view.settled:
                        raise SimFailure(
                            f"{key[1]} has m{number} (seq {seq}, delivery {delivery_count}) checked out to "
                            f"{consumer_id}, whose channel on {node.name} settled it: the settle was lost, "
                            "and the message fills that consumer's prefetch for good"
                        )
                    if (seq, delivery_count) not in view.delivered and seq not in view.unacked:
                        if not node.holds(group) and node.name in asks_lost:
                            # KNOWN FINDING (server/cluster.py `_on_remote`): a member that finds a
                            # message missing asks its sender for a resync once ("?"), over the
                            # same link; if that is lost too, nothing asks again, and what the
                            # lost message delivered never comes.
                            known.append(
                                f"{RESYNC_ASK_LOST}: m{number} checked out to {consumer_id} in {group} "
                                f"never reached {node.name}"
                            )
                            continue
                        raise SimFailure(
                            f"{key[1]} has m{number} (seq {seq}, delivery {delivery_count}) checked out to "
                            f"{consumer_id}, but {node.name} never wrote it to the channel: that consumer "
                            "waits for it for good"
                            + ("" if node.holds(group) else f" ({node.name} holds no replica of {group})")
                        )
