"""The queue machine against a small reference model.

The stateful test drives `QueueMachine.apply` with random command sequences and replays each
`Deliver` effect against `Model`, a deliberately naive queue (lists, sorts, linear scans): the
model says which message must come next, whether the chosen consumer was allowed to get it
(active, credit, prefetch, no higher-priority consumer with room) and whose turn it was (round
robin within a priority; new and re-attached consumers join at the back). After every step: `check_invariants()`, every sequence number is in exactly one place, the
machine's state equals the model's, and a twin machine fed equal (not identical: the machine
owns the `Message` objects it is given) commands produced equal replies, effects and state.

SQS receives share the queue (receives.py): the model keeps what is in flight, under which
receive and until when; handles are drawn from current, stale (an earlier receive of a message
received again) and unknown ones. Time stands still except in the `advance` rule, and entries
from a proposer whose clock is behind (`clock_back`) must not move the queue's time back; a
deadline that has come is released by a Tick of its own before the next rule's command (the
machine would release it at the start of that command), so each rule sees only its own effects.

Failing examples found while writing this file are kept as `test_regression_*`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from maxq_raft.machines.commands import (
    Cancel,
    ChangeVisibility,
    Checkout,
    Credit,
    DeleteQueue,
    DeleteReceived,
    Discard,
    Down,
    Enqueue,
    Get,
    Purge,
    Receive,
    Requeue,
    Settle,
    Tick,
)
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import Deliver, HandleResult, Meta, Rejected

# Identities as the shell makes them: a consumer or a channel's basic.get holder belongs to one
# connection (its owner), so the owner is a function of the id.
OWNER = {"c0": "o0", "c1": "o0", "c2": "o1", "c3": "o1", "c4": "o2", "g0": "o0", "g1": "o1", "g2": "o2"}
CONSUMER_IDS = ["c0", "c1", "c2", "c3", "c4"]
GET_IDS = ["g0", "g1", "g2"]
OWNERS = ["o0", "o1", "o2", "o3"]  # o3 owns nothing


def body_of(seq: int) -> bytes:
    return b"body-%d" % seq


def messages(first_seq: int, n: int) -> list[Message]:
    """Fresh messages whose body names the sequence number the machine should give them."""
    # some persistent, some not: a durable backing stores only the persistent ones until it spills
    return [
        Message("ex", "rk", b"\x00\x00", body_of(seq), persistent=seq % 3 != 0)
        for seq in range(first_seq, first_seq + n)
    ]


def norm(value):
    """A value-comparable form of replies, effects and state (Message has identity equality)."""
    if type(value) is Message:
        return (
            "Message",
            value.seq,
            value.exchange,
            value.routing_key,
            value.props_raw,
            value.body,
            value.delivery_count,
            value.redelivered,
        )
    if isinstance(value, tuple):
        return (type(value).__name__, *(norm(v) for v in value))
    if isinstance(value, list):
        return [norm(v) for v in value]
    return value


def digest(machine: QueueMachine):
    """The whole state of a machine, by value (all but `last_index`, which every apply sets)."""
    return (
        machine.vhost,
        machine.name,
        machine.next_seq,
        machine.deleted,
        machine.ever_had_consumer,
        machine.exclusive_consumer,
        [norm(m) for m in machine.ready],
        [(seq, norm(m)) for seq, m in machine.returned],
        [
            (
                c.consumer_id,
                c.owner,
                c.prefetch,
                c.no_ack,
                c.priority,
                c.credit,
                c.active,
                [(seq, norm(m)) for seq, m in c.checked_out.items()],
            )
            for c in machine.consumers.values()
        ],
        [(p, list(ring)) for p, ring in machine._rings.items()],
        list(machine._priorities),
        machine.spilled_count,
        machine.spill_cursor if machine.spilled_count else None,
        machine.delivered_upto,
        sorted(machine.backing.records.items()) if machine.backing is not None else None,
        [(seq, f.receive_id, f.deadline_ms, norm(f.message)) for seq, f in machine.in_flight.items()],
        machine.next_receive_id,
    )


def ready_seqs(machine: QueueMachine) -> list[int]:
    """Ready messages in the order the machine will hand them out (spilled ones last, from the backing)."""
    spilled = []
    if machine.spilled_count:
        spilled = sorted(seq for seq in machine.backing.records if seq >= machine.spill_cursor)
        assert len(spilled) == machine.spilled_count
    return [seq for seq, _ in sorted(machine.returned, key=lambda e: e[0])] + [m.seq for m in machine.ready] + spilled


# ---------------------------------------------------------------------------- the model


@dataclass
class ModelConsumer:
    owner: str
    prefetch: int
    no_ack: bool
    priority: int
    credit: int
    active: bool
    held: dict = field(default_factory=dict)  # seq -> None, in delivery order
    held_max: int = 0  # the unacked bound: prefetch, or what it still held when re-attached

    def room(self) -> bool:
        if not self.active or self.credit <= 0:
            return False
        return self.no_ack or self.prefetch == 0 or len(self.held) < self.prefetch


class Model:
    """A queue written for obviousness, not speed."""

    def __init__(self) -> None:
        self.next_seq = 0
        self.fresh: list[int] = []  # never delivered, in sequence order
        self.returned: list[int] = []  # given back; kept sorted, served first
        self.ever_returned: set[int] = set()
        self.delivery_count: dict[int, int] = {}
        self.consumers: dict[str, ModelConsumer] = {}
        self.exclusive: str | None = None
        # Round robin: per priority, active consumer ids in turn order; a consumer (re)attaching
        # joins at the back, one served goes to the back.
        self.rings: dict[int, list[str]] = {}
        self.finished: set[int] = set()  # settled, discarded, delivered no-ack, purged
        # SQS receives: seq -> (receive id, deadline ms), in receive order; every handle given out
        self.in_flight: dict[int, tuple[int, int]] = {}
        self.issued: list[tuple[int, int]] = []
        self.first_received: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.now = 0  # the queue's time: the latest entry time

    def ready(self) -> list[int]:
        return sorted(self.returned) + self.fresh

    def due(self) -> list[int]:
        return [seq for seq, (_, deadline) in self.in_flight.items() if deadline <= self.now]

    def release_due(self) -> None:
        for seq in self.due():
            del self.in_flight[seq]
            self.give_back(seq)

    def pop(self) -> int | None:
        if self.returned:
            self.returned.sort()
            return self.returned.pop(0)
        if self.fresh:
            return self.fresh.pop(0)
        return None

    def give_back(self, seq: int) -> None:
        self.returned.append(seq)
        self.returned.sort()
        self.ever_returned.add(seq)

    def active_count(self) -> int:
        return sum(1 for c in self.consumers.values() if c.active)

    def attach(self, consumer_id: str, consumer: ModelConsumer) -> None:
        self.consumers[consumer_id] = consumer
        self.rings.setdefault(consumer.priority, []).append(consumer_id)

    def deactivate(self, consumer_id: str) -> None:
        consumer = self.consumers[consumer_id]
        consumer.active = False
        ring = self.rings[consumer.priority]
        ring.remove(consumer_id)
        if not ring:
            del self.rings[consumer.priority]
        if self.exclusive == consumer_id:
            self.exclusive = None

    def forget_if_idle(self, consumer_id: str) -> None:
        c = self.consumers.get(consumer_id)
        if c is not None and not c.active and not c.held:
            del self.consumers[consumer_id]

    def check_deliveries(self, effects: list) -> None:
        """Replay the machine's deliveries: each must be allowed, and be the right message."""
        for effect in effects:
            assert type(effect) is Deliver, effect
            consumer = self.consumers.get(effect.consumer_id)
            assert consumer is not None, f"delivery to unknown consumer {effect.consumer_id}"
            assert consumer.active, f"delivery to cancelled consumer {effect.consumer_id}"
            assert consumer.credit > 0, f"delivery to {effect.consumer_id} without credit"
            assert consumer.room(), f"delivery to {effect.consumer_id} beyond its prefetch"
            for other_id, other in self.consumers.items():
                assert not (other.priority > consumer.priority and other.room()), (
                    f"delivery to {effect.consumer_id} (priority {consumer.priority}) while {other_id} "
                    f"(priority {other.priority}) had room"
                )
            ring = self.rings[consumer.priority]
            turn = [cid for cid in ring if self.consumers[cid].room()][0]
            assert effect.consumer_id == turn, f"delivery to {effect.consumer_id}, but it was {turn}'s turn ({ring})"
            i = ring.index(turn)
            self.rings[consumer.priority] = ring[i + 1 :] + ring[: i + 1]
            seq = self.pop()
            assert seq is not None, "delivery from an empty queue"
            message = effect.message
            assert message.seq == seq, f"delivered seq {message.seq}, expected {seq} (ready: {self.ready()})"
            assert message.body == body_of(seq)
            assert effect.redelivered == (seq in self.ever_returned)
            self.delivery_count[seq] = self.delivery_count.get(seq, 0) + 1
            assert message.delivery_count == self.delivery_count[seq]
            consumer.credit -= 1
            if consumer.no_ack:
                self.finished.add(seq)
            else:
                consumer.held[seq] = None
        # Nothing stuck: after any command the machine has served all it could.
        assert not (self.fresh or self.returned) or not any(c.room() for c in self.consumers.values()), (
            "ready messages left while a consumer had room"
        )


# ----------------------------------------------------------------- garbage commands

GARBAGE = [
    lambda m: None,
    lambda m: 42,
    lambda m: "Enqueue",
    lambda m: object(),
    lambda m: ("c0", [0]),  # the shape of a Settle but not one
    lambda m: type("Settle", (Settle,), {})("c0", [0]),  # a subclass is not the command
    lambda m: Enqueue(None),
    lambda m: Enqueue("abc"),
    lambda m: Enqueue([1, 2]),
    lambda m: Enqueue(messages(m.next_seq, 2) + ["not a message"]),
    lambda m: Enqueue([Message("ex", "rk", b"", b"x"), None]),
    lambda m: Checkout("c0", "o0", "5", False, 0, False, 3),
    lambda m: Checkout("c0", "o0", -1, False, 0, False, 3),
    lambda m: Checkout("c0", "o0", 1, False, 0, False, -2),
    lambda m: Checkout("c0", "o0", 1, "yes", 0, False, 3),
    lambda m: Checkout("c0", "o0", 1, False, "high", False, 3),
    lambda m: Checkout("c0", "o0", 1, False, 1.5, False, 3),
    lambda m: Checkout("c0", "o0", 1, False, 0, None, 3),
    lambda m: Checkout("c0", "o0", 1.0, False, 0, False, 3),
    lambda m: Checkout(None, "o0", 1, False, 0, False, 3),
    lambda m: Checkout(["c0"], "o0", 1, False, 0, False, 3),
    lambda m: Checkout("c0", 7, 1, False, 0, False, 3),
    lambda m: Cancel(None),
    lambda m: Cancel(["c0"]),
    lambda m: Settle(None, [0]),
    lambda m: Settle("c0", None),
    lambda m: Settle("c0", 3),
    lambda m: Settle("c0", [[0]]),
    lambda m: Settle("c0", [*_held_by(m, "c0"), "x"]),
    lambda m: Requeue("c0", [*_held_by(m, "c0"), None]),
    lambda m: Requeue("c1", [*_held_by(m, "c1"), 1.0]),
    lambda m: Discard("g0", [*_held_by(m, "g0"), b"0"]),
    lambda m: Discard({}, [0]),
    lambda m: Credit("c0", "5"),
    lambda m: Credit("c0", -3),
    lambda m: Credit("c0", 1.5),
    lambda m: Credit("c0", None),
    lambda m: Credit(None, 1),
    lambda m: Get(None, "o0", False),
    lambda m: Get("g0", "o0", "no"),
    lambda m: Get("g0", None, False),
    lambda m: Down(None),
    lambda m: Down(5),
    lambda m: Purge(1),
    lambda m: Receive(0, 10),
    lambda m: Receive(11, 10),
    lambda m: Receive(1, -1),
    lambda m: Receive(None, 10),
    lambda m: Receive(1, "10"),
    lambda m: DeleteReceived(None),
    lambda m: DeleteReceived([(0,)]),
    lambda m: DeleteReceived([*_handles_of(m), (0, "1")]),
    lambda m: DeleteReceived([*_handles_of(m), *[(0, 1)] * 11]),
    lambda m: ChangeVisibility([(*h, 5) for h in _handles_of(m)] + [(0, 0, -1)]),
    lambda m: ChangeVisibility([(0, 0)]),
    lambda m: ChangeVisibility("x"),
]


def _handles_of(model: Model) -> list[tuple[int, int]]:
    return [(seq, receive_id) for seq, (receive_id, _) in model.in_flight.items()]


def _held_by(model: Model, consumer_id: str) -> list[int]:
    c = model.consumers.get(consumer_id)
    return list(c.held) if c else []


# ---------------------------------------------------------------------- stateful


class QueueMachineStateful(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machine = QueueMachine("/", "q")
        self.twin = QueueMachine("/", "q")
        self.model = Model()
        self.log_index = 0
        self.time_ms = 1_000  # the entry time; moved by `advance` only

    def apply(self, make_command, time_ms: int | None = None):
        """Apply a freshly made command to the machine and an equal one to its twin (after a
        Tick for the deadlines that have come, which the command would release first)."""
        self.release_due(time_ms)
        return self._apply(make_command, time_ms)

    def _apply(self, make_command, time_ms: int | None = None):
        self.log_index += 1
        meta = Meta(self.log_index, self.time_ms if time_ms is None else time_ms)
        self.model.now = max(self.model.now, meta.time_ms)
        reply, effects = self.machine.apply(meta, make_command())
        twin_reply, twin_effects = self.twin.apply(meta, make_command())
        assert norm(reply) == norm(twin_reply)
        assert norm(effects) == norm(twin_effects)
        assert type(effects) is list
        return reply, effects

    def release_due(self, time_ms: int | None = None) -> None:
        model = self.model
        model.now = max(model.now, self.time_ms if time_ms is None else time_ms)
        if not model.due():
            return
        reply, effects = self._apply(Tick, time_ms)
        assert reply is False
        model.release_due()
        model.check_deliveries(effects)

    @rule(n=st.integers(1, 4))
    def enqueue(self, n: int) -> None:
        first = self.model.next_seq
        reply, effects = self.apply(lambda: Enqueue(messages(first, n)))
        assert reply == n
        self.model.next_seq += n
        self.model.fresh.extend(range(first, first + n))
        self.model.sent.update(dict.fromkeys(range(first, first + n), self.model.now))
        self.model.check_deliveries(effects)

    @rule(
        consumer_id=st.sampled_from(CONSUMER_IDS),
        prefetch=st.integers(0, 3),
        no_ack=st.booleans(),
        priority=st.sampled_from([0, 0, 0, 1, -1]),
        credit=st.integers(0, 4),
        exclusive=st.sampled_from([False] * 9 + [True]),
    )
    def checkout(
        self, consumer_id: str, prefetch: int, no_ack: bool, priority: int, credit: int, exclusive: bool
    ) -> None:
        model = self.model
        owner = OWNER[consumer_id]
        reply, effects = self.apply(lambda: Checkout(consumer_id, owner, prefetch, no_ack, priority, exclusive, credit))
        existing = model.consumers.get(consumer_id)
        if existing is not None and existing.active:
            assert reply == Rejected(530, f"attempt to reuse consumer tag '{consumer_id}'") and effects == []
            return
        if model.exclusive is not None or (exclusive and model.active_count()):
            assert type(reply) is Rejected and reply.reply_code == 403 and effects == []
            return
        assert reply is True
        # A tag may be reused after basic.cancel while the old consumer's deliveries are still
        # unacked (RabbitMQ allows it): the consumer comes back holding them.
        held = existing.held if existing is not None else {}
        model.attach(
            consumer_id, ModelConsumer(owner, prefetch, no_ack, priority, credit, True, held, max(prefetch, len(held)))
        )
        if exclusive:
            model.exclusive = consumer_id
        model.check_deliveries(effects)

    @rule(consumer_id=st.sampled_from(CONSUMER_IDS + GET_IDS + ["nobody"]))
    def cancel(self, consumer_id: str) -> None:
        reply, effects = self.apply(lambda: Cancel(consumer_id))
        c = self.model.consumers.get(consumer_id)
        if c is not None and c.active:
            self.model.deactivate(consumer_id)
            self.model.forget_if_idle(consumer_id)
        assert reply == self.model.active_count() and effects == []

    @rule(
        kind=st.sampled_from([Settle, Requeue, Discard]),
        consumer_id=st.sampled_from(CONSUMER_IDS + GET_IDS + ["nobody"]),
        data=st.data(),
    )
    def settle(self, kind, consumer_id: str, data) -> None:
        model = self.model
        own = _held_by(model, consumer_id)
        # Also seqs it does not hold: another consumer's, finished ones, ready ones, nonsense.
        others = [seq for c in model.consumers.values() for seq in c.held]
        pool = own + others + sorted(model.finished)[:3] + model.ready()[:2] + [-1, model.next_seq + 7]
        seqs = data.draw(st.lists(st.sampled_from(pool), max_size=6), label="seqs")
        reply, effects = self.apply(lambda: kind(consumer_id, list(seqs)))
        known = [seq for seq in dict.fromkeys(seqs) if seq in own]
        assert reply == len(known)
        for seq in known:
            del model.consumers[consumer_id].held[seq]
            if kind is Requeue:
                model.give_back(seq)
            else:
                model.finished.add(seq)
        model.forget_if_idle(consumer_id)
        model.check_deliveries(effects)

    @rule(consumer_id=st.sampled_from(CONSUMER_IDS + ["nobody"]), n=st.integers(0, 3))
    def credit(self, consumer_id: str, n: int) -> None:
        reply, effects = self.apply(lambda: Credit(consumer_id, n))
        c = self.model.consumers.get(consumer_id)
        if c is None:
            assert reply == 0
        else:
            c.credit += n
            assert reply == c.credit
        self.model.check_deliveries(effects)

    @rule(holder_id=st.sampled_from(GET_IDS), no_ack=st.booleans())
    def get(self, holder_id: str, no_ack: bool) -> None:
        model = self.model
        owner = OWNER[holder_id]
        reply, effects = self.apply(lambda: Get(holder_id, owner, no_ack))
        assert effects == []
        seq = model.pop()
        if seq is None:
            assert reply is None
            return
        message, redelivered, remaining = reply
        assert message.seq == seq and message.body == body_of(seq)
        assert redelivered == (seq in model.ever_returned)
        assert remaining == len(model.ready())
        model.delivery_count[seq] = model.delivery_count.get(seq, 0) + 1
        assert message.delivery_count == model.delivery_count[seq]
        if no_ack:
            model.finished.add(seq)
        else:
            holder = model.consumers.setdefault(holder_id, ModelConsumer(owner, 0, False, 0, 0, False))
            holder.held[seq] = None

    @rule(in_flight=st.booleans())
    def purge(self, in_flight: bool) -> None:
        reply, effects = self.apply(lambda: Purge(in_flight))
        model = self.model
        ready = model.ready()
        assert reply == len(ready) + (len(model.in_flight) if in_flight else 0) and effects == []
        model.finished.update(ready)
        model.fresh, model.returned = [], []
        if in_flight:
            model.finished.update(model.in_flight)
            model.in_flight.clear()

    # ------------------------------------------------------------- SQS receives

    @rule(max_count=st.sampled_from([1, 1, 2, 3, 10]), visibility_ms=st.sampled_from([0, 1, 5, 30]))
    def receive(self, max_count: int, visibility_ms: int) -> None:
        model = self.model
        reply, effects = self.apply(lambda: Receive(max_count, visibility_ms))
        assert type(reply) is list and effects == []
        expected = []
        while len(expected) < max_count:
            seq = model.pop()
            if seq is None:
                break
            expected.append(seq)
        assert [r.seq for r in reply] == expected
        last = max((rid for _, rid in model.issued), default=-1)
        for r in reply:
            seq = r.seq
            assert r.message.seq == seq and r.message.body == body_of(seq)
            assert r.receive_id > last, "receive ids count up"
            last = r.receive_id
            model.delivery_count[seq] = model.delivery_count.get(seq, 0) + 1
            model.first_received.setdefault(seq, model.now)
            assert r.receive_count == r.message.delivery_count == model.delivery_count[seq]
            assert r.first_received_ms == model.first_received[seq]
            # (a message read back from a backing has no sent time: the store keeps none)
            assert r.sent_ms == model.sent[seq] or (r.sent_ms is None and self.machine.backing is not None)
            model.in_flight[seq] = (r.receive_id, model.now + visibility_ms)
            model.issued.append((seq, r.receive_id))

    def _draw_handles(self, data) -> list[tuple[int, int]]:
        model = self.model
        pool = _handles_of(model) + model.issued[-6:] + [(model.next_seq + 3, 0), (0, 0)]
        return data.draw(st.lists(st.sampled_from(pool), max_size=4), label="handles")

    def _judge(self, seq: int, receive_id: int) -> HandleResult:
        flight = self.model.in_flight.get(seq)
        if flight is None:
            return HandleResult.NOT_IN_FLIGHT
        return HandleResult.DONE if flight[0] == receive_id else HandleResult.STALE

    @rule(data=st.data())
    def delete_received(self, data) -> None:
        model = self.model
        chosen = self._draw_handles(data)
        reply, effects = self.apply(lambda: DeleteReceived(list(chosen)))
        assert effects == []
        expected = []
        for seq, receive_id in chosen:
            expected.append(self._judge(seq, receive_id))
            if expected[-1] is HandleResult.DONE:
                del model.in_flight[seq]
                model.finished.add(seq)
        assert reply == expected

    @rule(data=st.data(), visibility_ms=st.sampled_from([0, 1, 10, 40]))
    def change_visibility(self, data, visibility_ms: int) -> None:
        model = self.model
        chosen = [(*handle, visibility_ms) for handle in self._draw_handles(data)]
        reply, effects = self.apply(lambda: ChangeVisibility(list(chosen)))
        expected = []
        for seq, receive_id, _ in chosen:
            expected.append(self._judge(seq, receive_id))
            if expected[-1] is HandleResult.DONE:
                model.in_flight[seq] = (receive_id, model.now + visibility_ms)
        assert reply == expected
        model.release_due()  # a deadline of now: visible in the same command
        model.check_deliveries(effects)

    @rule(ms=st.sampled_from([1, 5, 20, 50]))
    def advance(self, ms: int) -> None:
        self.time_ms += ms
        reply, effects = self.apply(Tick)  # (the due ones were released by a Tick before it)
        assert reply is False and effects == []

    @rule(ms=st.sampled_from([1, 30]))
    def clock_back(self, ms: int) -> None:
        """An entry stamped earlier (a proposer whose clock is behind): the queue's time stays."""
        before = self.machine.now_ms
        reply, effects = self.apply(Tick, self.time_ms - ms)
        assert reply is False and effects == []
        assert self.machine.now_ms == max(before, self.time_ms - ms)

    @rule(owner=st.sampled_from(OWNERS))
    def down(self, owner: str) -> None:
        model = self.model
        reply, effects = self.apply(lambda: Down(owner))
        returned = 0
        for consumer_id in [cid for cid, c in model.consumers.items() if c.owner == owner]:
            if model.consumers[consumer_id].active:
                model.deactivate(consumer_id)
            for seq in model.consumers.pop(consumer_id).held:
                model.give_back(seq)
                returned += 1
        assert reply == returned
        model.check_deliveries(effects)

    @rule(make=st.sampled_from(GARBAGE))
    def garbage(self, make) -> None:
        self.release_due()
        before = digest(self.machine)
        reply, effects = self.apply(lambda: make(self.model))
        assert type(reply) is Rejected, reply
        assert effects == []
        assert digest(self.machine) == before

    @invariant()
    def agrees_with_model(self) -> None:
        machine, model = self.machine, self.model
        machine.check_invariants()
        self.twin.check_invariants()
        assert digest(machine) == digest(self.twin)
        assert machine.next_seq == model.next_seq
        # Every message is in exactly one place: ready, held by one consumer, or finished.
        ready = ready_seqs(machine)
        held = [seq for c in machine.consumers.values() for seq in c.checked_out]
        in_flight = list(machine.in_flight)
        assert len(ready) + len(held) + len(in_flight) + len(model.finished) == model.next_seq
        assert set(ready) | set(held) | set(in_flight) | model.finished == set(range(model.next_seq))
        assert ready == model.ready()
        assert machine.ready_count == len(ready)
        assert machine.unacked_count == len(held) + len(in_flight)
        assert {seq: (f.receive_id, f.deadline_ms) for seq, f in machine.in_flight.items()} == model.in_flight
        assert in_flight == list(model.in_flight), "in receive order"
        # (a command of no queue type is refused before the machine looks at its time)
        assert machine.now_ms <= model.now
        deadlines = [deadline for _, deadline in model.in_flight.values()]
        assert machine.next_deadline_ms == (min(deadlines) if deadlines else None)
        assert machine.active_consumer_count == model.active_count()
        assert machine.exclusive_consumer == model.exclusive
        assert sorted(machine.consumers) == sorted(model.consumers)
        for consumer_id, c in machine.consumers.items():
            m = model.consumers[consumer_id]
            assert (c.owner, c.prefetch, c.no_ack, c.priority, c.credit, c.active) == (
                m.owner,
                m.prefetch,
                m.no_ack,
                m.priority,
                m.credit,
                m.active,
            ), consumer_id
            assert list(c.checked_out) == list(m.held), consumer_id
            for seq, message in c.checked_out.items():
                assert message.seq == seq and message.body == body_of(seq)
            if m.prefetch > 0:
                assert len(c.checked_out) <= m.held_max, consumer_id


QueueMachineStateful.TestCase.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
test_queue_machine_against_model = QueueMachineStateful.TestCase


# ------------------------------------------------------- with a backing store


class DictBacking:
    """A backing that copies what it stores, as a real store does (nothing shared with the machine)."""

    def __init__(self) -> None:
        self.records: dict[int, tuple] = {}
        self.range_claimed = self.range_removed = 0
        self.delayed_next = 0
        self.delivered_upto = -1
        self.dropped = False
        self.pause_rules: list[tuple[str, str]] = []
        # A deduplication window's records (an SQS FIFO queue's, fifo.py, or an
        # x-message-deduplication queue's, dedup.py): sequence number -> entry
        self.dedup: dict[int, tuple[int, int, str, str]] = {}
        self.next_sequence_number = 1

    def dedup_write(self, entries: list, next_sequence_number: int | None) -> None:
        # (None: the entries of an exchange window, numbered from its store base: dedup.py)
        assert next_sequence_number is None or next_sequence_number >= self.next_sequence_number
        for entry in entries:
            assert entry[0] not in self.dedup
            assert next_sequence_number is None or entry[0] < next_sequence_number or entry[0] >= 1 << 40
            self.dedup[entry[0]] = entry
        if next_sequence_number is not None:
            self.next_sequence_number = next_sequence_number

    def dedup_forget(self, below_sequence_number: int, from_sequence_number: int = 0) -> None:
        for sequence in [s for s in self.dedup if from_sequence_number <= s < below_sequence_number]:
            del self.dedup[sequence]

    def dedup_stored(self, from_sequence_number: int = 0, below_sequence_number: int | None = None) -> tuple[list, int]:
        chosen = [
            s
            for s in self.dedup
            if from_sequence_number <= s and (below_sequence_number is None or s < below_sequence_number)
        ]
        return [self.dedup[s] for s in sorted(chosen)], self.next_sequence_number

    def write(self, messages: list) -> None:
        for m in messages:
            assert m.seq not in self.records, "a message is written once"
            if m.seq >= 1 << 63:
                self.delayed_next = max(self.delayed_next, m.delay_counter + 1)
            self.records[m.seq] = (
                m.exchange,
                m.routing_key,
                m.props_raw,
                m.body,
                m.persistent,
                m.expires_at_ms,
                m.due_ms,
                m.ttl_ms,
                m.priority,
                m.delivery_count if m.count_header else 0,
            )

    def rewrite(self, messages: list) -> None:
        for m in messages:
            assert m.seq in self.records, "only a stored message is stored again"
            record = self.records[m.seq]
            self.records[m.seq] = record[:9] + (m.delivery_count if m.count_header else 0,)

    def remove(self, messages: list) -> None:
        for m in messages:
            del self.records[m.seq]  # removing what was never stored is a machine bug

    def remove_from(self, seq_from: int, persistent: int, seq_below: int | None = None) -> None:
        tail = [s for s in self.records if s >= seq_from and (seq_below is None or s < seq_below)]
        if seq_below is None:
            assert persistent == sum(self.records[s][4] for s in tail)
        else:
            # A priority queue purges lane by lane; it knows the persistent count of recovered
            # messages only as a total, so the claims are checked as a sum (by its test).
            self.range_claimed += persistent
            self.range_removed += sum(self.records[s][4] for s in tail)
        for seq in tail:
            del self.records[seq]

    def load(self, seq_from: int, limit: int, seq_below: int | None = None) -> list:
        out = []
        for seq in sorted(s for s in self.records if s >= seq_from and (seq_below is None or s < seq_below))[:limit]:
            exchange, routing_key, props_raw, body, persistent, expires_at_ms, due_ms, ttl_ms, priority, returns = (
                self.records[seq]
            )
            m = Message(exchange, routing_key, props_raw, body, persistent)
            m.seq = seq
            m.expires_at_ms = expires_at_ms
            if returns:  # returned before (x-delivery-limit): the count comes back with it
                m.delivery_count, m.count_header = returns, True
            if due_ms is not None:  # a delayed one: its TTL and priority are kept for its release
                m.due_ms, m.ttl_ms, m.priority = due_ms, ttl_ms, priority
            m.redelivered = seq & ((1 << 48) - 1) <= self.delivered_upto
            out.append(m)
        return out

    @property
    def delayed_stored(self) -> int:
        return sum(1 for seq, record in self.records.items() if seq >= 1 << 63 and record[4])

    def delivered(self, seq: int) -> None:
        assert seq > self.delivered_upto
        self.delivered_upto = seq

    def pauses_write(self, rules: list[tuple[str, str]]) -> None:
        self.pause_rules = list(rules)

    def pauses_stored(self) -> list[tuple[str, str]]:
        return list(self.pause_rules)

    # Half messages of open transactions (transactions.py): number -> (id, timeout, checks, record)
    def txn_write(self, entries: list) -> None:
        halves = self.__dict__.setdefault("halves", {})
        for number, txn_id, timeout_ms, checks, m in entries:
            assert number not in halves, "a half is written once"
            halves[number] = (txn_id, timeout_ms, checks, m.exchange, m.routing_key, m.props_raw, m.body, m.persistent)

    def txn_remove(self, numbers: list) -> None:
        halves = self.__dict__.setdefault("halves", {})
        for number in numbers:
            del halves[number]

    def txn_stored(self) -> list:
        halves = self.__dict__.get("halves", {})
        return [(n, *h[:3], Message(*h[3:])) for n, h in sorted(halves.items())]

    def drop(self) -> None:
        self.records.clear()
        self.pause_rules = []
        self.dropped = True


def in_memory_stored(machine: QueueMachine) -> int:
    held = [m for c in machine.consumers.values() for m in c.checked_out.values()]
    held += [f.message for f in machine.in_flight.values()]
    return sum(m.stored for m in list(machine.ready) + [m for _, m in machine.returned] + held)


class QueueMachineWithBackingStateful(QueueMachineStateful):
    """The same model test with a tiny window and a backing: spilling must change nothing visible."""

    def __init__(self) -> None:
        super().__init__()
        # A window of 3 messages or 12 body bytes, whichever is reached first.
        self.machine = QueueMachine("/", "q", backing=DictBacking(), durable=True, window_max=3, window_bytes_max=12)
        self.twin = QueueMachine("/", "q", backing=DictBacking(), durable=True, window_max=3, window_bytes_max=12)

    @invariant()
    def backing_holds_exactly_the_stored_messages(self) -> None:
        machine = self.machine
        if machine.deleted:
            return
        records = machine.backing.records
        assert len(records) == in_memory_stored(machine) + machine.spilled_count
        assert all(
            seq >= machine.spill_cursor
            for seq in records
            if machine.spilled_count
            and seq
            not in {m.seq for m in machine.ready}
            | {s for s, _ in machine.returned}
            | {q for c in machine.consumers.values() for q in c.checked_out}
            | set(machine.in_flight)
        )
        assert len(machine.ready) <= 3 or not machine.spilled_count


QueueMachineWithBackingStateful.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
test_queue_machine_with_backing_against_model = QueueMachineWithBackingStateful.TestCase


def test_spilled_queue_recovers_from_its_backing_after_a_restart():
    """A durable queue's persistent messages come back from the backing alone, in order."""
    backing = DictBacking()
    before = QueueMachine("/", "q", backing=backing, durable=True, window_max=3)
    batch = [Message("", "q", b"", b"m%d" % i, persistent=i % 2 == 0) for i in range(10)]
    before.apply(Meta(1, 0), Enqueue(batch))
    before.apply(Meta(2, 0), Checkout("c", "conn", 2, False, 0, False, 100))
    # m0 and m1 delivered; m0 acked, which lets m2 go out; m1 and m2 unacked at the "crash"
    before.apply(Meta(3, 0), Settle("c", [0]))
    assert backing.delivered_upto == 2
    # Transient messages in the window were never stored; spilled ones were (not durable: lost on a real restart).
    after = QueueMachine("/", "q", backing=backing, durable=True, window_max=3)
    seqs = sorted(backing.records)
    after.recover(next_seq=before.next_seq, spilled_count=len(seqs), spill_cursor=seqs[0])
    assert after.ready_count == len(seqs)
    _, effects = after.apply(Meta(4, 0), Checkout("c2", "conn2", 0, True, 0, False, 100))
    delivered = [e.message.body for e in effects]
    assert delivered == [b"m%d" % s for s in seqs]
    assert [e.redelivered for e in effects] == [s <= 2 for s in seqs]
    assert backing.records == {} and after.ready_count == 0
    after.check_invariants()


# ---------------------------------------------------------------------- examples


class Driver:
    """A machine with a log index that counts up, for the example tests."""

    def __init__(self) -> None:
        self.machine = QueueMachine("/", "q")
        self.log_index = 0

    def __call__(self, command):
        self.log_index += 1
        reply, effects = self.machine.apply(Meta(self.log_index, 1_000 + self.log_index), command)
        self.machine.check_invariants()
        return reply, effects

    def enqueue(self, n: int) -> list:
        first = self.machine.next_seq
        reply, effects = self(Enqueue(messages(first, n)))
        assert reply == n
        return effects

    def checkout(
        self,
        consumer_id: str,
        prefetch: int = 0,
        no_ack: bool = False,
        priority: int = 0,
        credit: int = 100,
        owner: str = "o0",
        exclusive: bool = False,
    ) -> list:
        reply, effects = self(Checkout(consumer_id, owner, prefetch, no_ack, priority, exclusive, credit))
        assert reply is True, reply
        return effects


def delivered(effects: list) -> list[tuple[str, int, bool]]:
    return [(e.consumer_id, e.message.seq, e.redelivered) for e in effects]


def test_round_robin_between_equal_priority_consumers() -> None:
    q = Driver()
    q.checkout("a")
    q.checkout("b")
    q.checkout("c")
    assert [cid for cid, _, _ in delivered(q.enqueue(7))] == ["a", "b", "c", "a", "b", "c", "a"]
    # The ring carries on where it stopped, across commands.
    assert [cid for cid, _, _ in delivered(q.enqueue(2))] == ["b", "c"]


def test_round_robin_skips_consumers_without_room() -> None:
    q = Driver()
    q.checkout("a", prefetch=1)
    q.checkout("b", prefetch=3)
    assert [cid for cid, _, _ in delivered(q.enqueue(4))] == ["a", "b", "b", "b"]


def test_higher_priority_consumer_served_first_then_lower_when_full() -> None:
    q = Driver()
    q.checkout("low", priority=0)
    q.checkout("high", priority=5, prefetch=2)
    assert [cid for cid, _, _ in delivered(q.enqueue(4))] == ["high", "high", "low", "low"]
    reply, effects = q(Settle("high", [0]))
    assert reply == 1 and effects == []  # nothing ready: the low one took the rest
    assert delivered(q.enqueue(1)) == [("high", 4, False)]


def test_credit_exhaustion_stops_delivery_and_credit_resumes_it() -> None:
    q = Driver()
    q.checkout("a", no_ack=True, credit=2)
    assert delivered(q.enqueue(5)) == [("a", 0, False), ("a", 1, False)]
    assert q.machine.ready_count == 3
    assert q.enqueue(1) == []  # no credit, no delivery
    reply, effects = q(Credit("a", 3))
    assert reply == 0 + 3
    assert delivered(effects) == [("a", 2, False), ("a", 3, False), ("a", 4, False)]
    reply, effects = q(Credit("a", 5))
    assert reply == 5 and delivered(effects) == [("a", 5, False)]
    assert q.machine.ready_count == 0


def test_credit_bounds_a_manual_ack_consumer_too() -> None:
    q = Driver()
    q.checkout("a", prefetch=10, credit=1)
    assert delivered(q.enqueue(3)) == [("a", 0, False)]
    reply, effects = q(Settle("a", [0]))  # room in prefetch, but no credit
    assert reply == 1 and effects == []
    reply, effects = q(Credit("a", 1))
    assert delivered(effects) == [("a", 1, False)]


def test_cancel_keeps_unacked_until_settled() -> None:
    q = Driver()
    q.checkout("a", prefetch=2)
    q.enqueue(3)
    reply, effects = q(Cancel("a"))
    assert reply == 0 and effects == []
    assert q.machine.unacked_count == 2 and q.machine.ready_count == 1
    assert q.enqueue(1) == []  # a cancelled consumer gets nothing new
    assert q(Settle("a", [0]))[0] == 1
    assert "a" in q.machine.consumers
    reply, effects = q(Requeue("a", [1]))
    assert reply == 1 and effects == []
    assert "a" not in q.machine.consumers  # forgotten once it holds nothing
    assert ready_seqs(q.machine) == [1, 2, 3]
    # A new consumer gets the returned message first, flagged.
    assert delivered(q.checkout("b")) == [("b", 1, True), ("b", 2, False), ("b", 3, False)]


def test_down_returns_unacked_in_order() -> None:
    q = Driver()
    q.checkout("a1", prefetch=3, owner="conn-a")
    q.checkout("b", prefetch=1, owner="conn-b")
    q.checkout("a2", prefetch=3, owner="conn-a")
    q.enqueue(8)  # a1: 0 3 5, b: 1, a2: 2 4 6; 7 ready
    assert q(Get("get-a", "conn-a", False))[0][0].seq == 7
    reply, effects = q(Down("conn-a"))
    assert reply == 7 and effects == []  # b is full
    assert ready_seqs(q.machine) == [0, 2, 3, 4, 5, 6, 7]
    assert list(q.machine.consumers) == ["b"]
    reply, effects = q(Settle("b", [1]))
    assert delivered(effects) == [("b", 0, True)]
    q.checkout("c")
    assert q.machine.ready_count == 0
    assert [seq for _, seq, _ in delivered(q(Down("conn-x"))[1])] == []


def test_down_returned_messages_go_before_never_delivered_ones() -> None:
    q = Driver()
    q.checkout("a", prefetch=2, owner="conn-a")
    q.enqueue(4)
    q(Down("conn-a"))
    assert delivered(q.checkout("b", owner="conn-b")) == [
        ("b", 0, True),
        ("b", 1, True),
        ("b", 2, False),
        ("b", 3, False),
    ]


def test_get_with_manual_ack_then_requeue() -> None:
    q = Driver()
    q.enqueue(3)
    reply, effects = q(Get("ch1", "conn", False))
    message, redelivered, remaining = reply
    assert (message.seq, redelivered, remaining, effects) == (0, False, 2, [])
    assert q.machine.unacked_count == 1 and q.machine.active_consumer_count == 0
    reply, effects = q(Requeue("ch1", [0]))
    assert reply == 1 and effects == []
    assert "ch1" not in q.machine.consumers
    message, redelivered, remaining = q(Get("ch1", "conn", True))[0]
    assert (message.seq, redelivered, remaining, message.delivery_count) == (0, True, 2, 2)
    assert q.machine.unacked_count == 0  # no_ack: gone
    message, redelivered, remaining = q(Get("ch1", "conn", False))[0]
    assert (message.seq, redelivered, remaining) == (1, False, 1)
    assert q(Settle("ch1", [1]))[0] == 1
    assert q(Get("ch1", "conn", False))[0][2] == 0
    assert q(Get("ch1", "conn", False))[0] is None


def test_purge_leaves_unacked_alone() -> None:
    q = Driver()
    q.checkout("a", prefetch=2)
    q.enqueue(5)
    q(Requeue("a", [1]))  # back, and at once to a again (it has room)
    assert q.machine.unacked_count == 2 and q.machine.ready_count == 3
    reply, effects = q(Purge())
    assert reply == 3 and effects == []
    assert q.machine.ready_count == 0
    assert sorted(q.machine.consumers["a"].checked_out) == [0, 1]
    # The unacked ones can still be returned, and come back.
    reply, effects = q(Cancel("a"))
    reply, effects = q(Requeue("a", [0, 1]))
    assert reply == 2 and ready_seqs(q.machine) == [0, 1]


def test_delete_queue_rejects_everything_after() -> None:
    q = Driver()
    q.checkout("a", prefetch=1)
    q.enqueue(3)
    reply, effects = q(DeleteQueue())
    assert reply == 2 and effects == []
    for command in (Enqueue(messages(3, 1)), Settle("a", [0]), Get("g", "o", True), DeleteQueue()):
        reply, effects = q(command)
        assert type(reply) is Rejected and reply.reply_code == 404 and effects == []


def test_exclusive_consumer() -> None:
    q = Driver()
    q.checkout("a")
    reply, _ = q(Checkout("x", "o0", 0, False, 0, True, 10))
    assert type(reply) is Rejected and reply.reply_code == 403
    q(Cancel("a"))
    q.checkout("x", exclusive=True)
    reply, _ = q(Checkout("b", "o0", 0, False, 0, False, 10))
    assert type(reply) is Rejected and reply.reply_code == 403
    q(Down("o0"))
    q.checkout("b")


@pytest.mark.parametrize("make", GARBAGE)
def test_apply_never_raises_on_garbage(make) -> None:
    """A bad command gets a Rejected reply and changes nothing, on a queue with some state."""
    q = Driver()
    q.checkout("c0", prefetch=2)
    q.checkout("c1", prefetch=1, priority=1)
    q.enqueue(5)
    q(Get("g0", "o0", False))
    model = Model()
    model.next_seq = q.machine.next_seq
    for consumer_id, c in q.machine.consumers.items():
        model.consumers[consumer_id] = ModelConsumer(
            c.owner, c.prefetch, c.no_ack, c.priority, c.credit, c.active, dict.fromkeys(c.checked_out)
        )
    before = digest(q.machine)
    reply, effects = q(make(model))
    assert type(reply) is Rejected, reply
    assert effects == [] and digest(q.machine) == before
    # And the queue still works.
    q(Settle("c0", list(q.machine.consumers["c0"].checked_out)))
    assert q.machine.ready_count == 0


def test_apply_never_raises_on_garbage_meta() -> None:
    q = Driver()
    q.enqueue(1)
    before = digest(q.machine)
    for meta in (None, 5, (), Meta("x", None)):
        reply, effects = q.machine.apply(meta, Purge())
        assert type(reply) is Rejected and effects == [] and digest(q.machine) == before


# ------------------------------------------------------------------- cost model


class CountingDict(dict):
    """A dict that counts whole-dict walks."""

    walks = 0

    def __iter__(self):
        CountingDict.walks += 1
        return super().__iter__()

    def values(self):
        CountingDict.walks += 1
        return super().values()

    def items(self):
        CountingDict.walks += 1
        return super().items()


class CountingDeque(deque):
    """A deque that counts walks and searches."""

    walks = 0

    def __iter__(self):
        CountingDeque.walks += 1
        return super().__iter__()

    def __contains__(self, item):
        CountingDeque.walks += 1
        return super().__contains__(item)

    def remove(self, item):
        CountingDeque.walks += 1
        return super().remove(item)

    def index(self, *args):
        CountingDeque.walks += 1
        return super().index(*args)


def test_one_consumer_path_never_walks_consumers_or_the_ready_deque() -> None:
    """Enqueue, deliver and ack with one consumer cost O(1) per message: no walk over all
    consumers (here also 50 cancelled ones still holding a message) nor over the ready deque
    (here 10,000 deep). Counts walks instead of timing, so it cannot flake."""
    q = Driver()
    for i in range(50):
        q.checkout(f"old{i}", prefetch=1)
        q.enqueue(1)
        q(Cancel(f"old{i}"))
    q.enqueue(10_000)
    q.machine.consumers = CountingDict(q.machine.consumers)
    q.machine.ready = CountingDeque(q.machine.ready)
    q.machine.check_invariants = lambda: None  # it walks everything, on purpose
    CountingDict.walks = CountingDeque.walks = 0
    effects = q.checkout("a", prefetch=100, credit=1_000)
    assert len(effects) == 100
    for _ in range(100):  # ack one, get one: the steady state of a prefetch-bound consumer
        reply, effects = q(Settle("a", [effects[0].message.seq]))
        assert reply == 1 and len(effects) == 1
    reply, effects = q(Credit("a", 1_000))
    reply, effects = q(Settle("a", list(q.machine.consumers["a"].checked_out)))
    assert reply == 100 and len(effects) == 100
    assert (CountingDict.walks, CountingDeque.walks) == (0, 0)
    # A no-ack consumer: enqueues go straight out.
    q(Cancel("a"))
    q(Purge())
    q.checkout("b", no_ack=True, credit=10_000)
    CountingDict.walks = CountingDeque.walks = 0
    for _ in range(100):
        assert len(q.enqueue(3)) == 3
    assert (CountingDict.walks, CountingDeque.walks) == (0, 0)


# ------------------------------------------------------------------- regressions


def test_regression_round_robin_with_one_message_per_enqueue() -> None:
    """Found by test_round_robin_between_equal_priority_consumers. After handing out the last
    ready message, `_service` picked (and rotated past) one more consumer before it saw the queue
    was empty, so that consumer lost its turn: with one publish per Enqueue, which is what a
    read with one basic.publish makes, every message went to the first consumer."""
    q = Driver()
    q.checkout("a", no_ack=True)
    q.checkout("b", no_ack=True)
    assert [delivered(q.enqueue(1))[0][0] for _ in range(4)] == ["a", "b", "a", "b"]


def test_regression_consumer_tag_reused_after_cancel_with_unacked() -> None:
    """Shrunk: checkout(c0, credit=1), enqueue(1), cancel(c0), checkout(c0) -> Rejected(530).
    The channel frees a tag at basic.cancel and AMQP lets the client reuse it, but the consumer
    id (connection/channel/tag) was still taken by the cancelled consumer holding its unacked
    message, so basic.consume failed with a channel error. Now the consumer comes back holding
    its unacked messages, which still settle under the same id."""
    q = Driver()
    q.checkout("c0", credit=1)
    q.enqueue(1)
    q(Cancel("c0"))
    effects = q.checkout("c0", prefetch=1, credit=5)
    assert effects == []  # it still holds seq 0: its prefetch of 1 is used
    assert q.machine.active_consumer_count == 1
    q.enqueue(1)
    reply, effects = q(Settle("c0", [0]))
    assert reply == 1 and delivered(effects) == [("c0", 1, False)]


def test_regression_malformed_checkout_stalled_the_queue() -> None:
    """Shrunk: garbage Checkout('c0', 'o0', '5', ...) -> reply True. The consumer was registered
    with prefetch '5'; later `has_room` compared an int with a str inside every `_service`, so
    every Enqueue after it was Rejected (541) *and* kept its messages, undelivered: a stalled
    queue whose replies lied. Commands are now validated before anything changes."""
    q = Driver()
    reply, effects = q(Checkout("c0", "o0", "5", False, 0, False, 3))
    assert type(reply) is Rejected and "c0" not in q.machine.consumers
    q.checkout("c1", credit=3)
    assert len(q.enqueue(2)) == 2


def test_regression_half_applied_enqueue() -> None:
    """Shrunk: Enqueue([Message, Message, 'not a message']) -> Rejected, yet the two messages
    were in the queue (seq 0 and 1): a refused command changed the state."""
    q = Driver()
    reply, effects = q(Enqueue(messages(0, 2) + ["not a message"]))
    assert type(reply) is Rejected and effects == []
    assert q.machine.ready_count == 0 and q.machine.next_seq == 0
    batch = messages(0, 2)
    assert q(Enqueue(batch + [batch[0]]))[0].reply_code == 541  # the same object twice
    assert [m.seq for m in batch] == [-1, -1]  # undone: it may be enqueued again
    assert q(Enqueue(batch))[0] == 2


def test_regression_half_applied_settle() -> None:
    """Shrunk: Settle('c0', [0, 'x']) -> Rejected, yet seq 0 was settled (gone for good)."""
    q = Driver()
    q.checkout("c0")
    q.enqueue(1)
    reply, effects = q(Settle("c0", [0, "x"]))
    assert type(reply) is Rejected
    assert list(q.machine.consumers["c0"].checked_out) == [0]
    reply, effects = q(Settle("c0", [True]))  # bool is not a seq (True == 1)
    assert type(reply) is Rejected


def test_regression_negative_credit() -> None:
    """Credit('c0', -3) was accepted and drove the window below zero."""
    q = Driver()
    q.checkout("c0", credit=1)
    assert type(q(Credit("c0", -3))[0]) is Rejected
    assert q.machine.consumers["c0"].credit == 1
