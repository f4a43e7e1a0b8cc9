"""The priority queue machine (x-max-priority): examples, and a model test with spilling and restarts.

The model is a list sorted by (priority descending, publish order): every delivery and basic.get
must take its first element; a requeued message goes back to the front of its own priority
(RabbitMQ's priority queues). The machine runs with a backing and a window of 3 messages, so
lanes spill and refill; `restart` rebuilds the machine from its backing alone, as a node restart.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from maxq_raft.machines.commands import Cancel, Checkout, Credit, Discard, Enqueue, Get, Purge, Requeue, Settle
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import PriorityQueueMachine, make_queue_machine
from maxq_raft.machines.queue import SEQ_MASK, QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import Deliver, Meta

from .test_queue_machine import DictBacking


def pq(max_priority: int = 10, backing=None, window_max: int = 1 << 20) -> PriorityQueueMachine:
    machine = make_queue_machine(
        "/",
        "q",
        settings=QueueSettings(max_priority=max_priority),
        backing=backing,
        durable=backing is not None,
        window_max=window_max,
        window_bytes_max=1 << 20,
    )
    assert type(machine) is PriorityQueueMachine
    return machine


def publish(machine, index: int, *pairs) -> list:
    reply, effects = machine.apply(
        Meta(index, 0), Enqueue([Message("", "q", b"", body, priority=p) for body, p in pairs])
    )
    machine.check_invariants()
    return effects


def drain(machine, index: int) -> list[bytes]:
    out = []
    while True:
        index += 1
        reply, _ = machine.apply(Meta(index, 0), Get("g", "o", True))
        machine.check_invariants()
        if reply is None:
            return out
        out.append(reply[0].body)


def test_plain_queue_without_max_priority():
    assert type(make_queue_machine("/", "q", settings=QueueSettings())) is QueueMachine


def test_strict_priority_then_fifo():
    machine = pq()
    publish(machine, 1, (b"a0", 0), (b"b5", 5), (b"c0", 0), (b"d9", 9), (b"e5", 5), (b"f", None))
    assert drain(machine, 10) == [b"d9", b"b5", b"e5", b"a0", b"c0", b"f"]


def test_priority_above_the_maximum_is_capped():
    machine = pq(max_priority=3)
    publish(machine, 1, (b"low", 1), (b"max", 3), (b"over", 200), (b"max2", 3))
    # 200 counts as 3: FIFO among the three at the maximum
    assert drain(machine, 10) == [b"max", b"over", b"max2", b"low"]


def test_requeue_order_with_priorities():
    machine = pq()
    publish(machine, 1, (b"m1", 1), (b"m2", 1), (b"h", 5))
    got = [machine.apply(Meta(2 + i, 0), Get("g", "o", False))[0][0] for i in range(2)]
    assert [m.body for m in got] == [b"h", b"m1"]
    publish(machine, 5, (b"h2", 5))
    machine.apply(Meta(6, 0), Requeue("g", [m.seq for m in got]))
    machine.check_invariants()
    assert drain(machine, 10) == [b"h", b"h2", b"m1", b"m2"]


def test_spilled_lanes_keep_strict_order():
    machine = pq(backing=DictBacking(), window_max=3)
    publish(machine, 1, *[(b"low%d" % i, 0) for i in range(5)])
    publish(machine, 2, *[(b"high%d" % i, 7) for i in range(5)])
    publish(machine, 3, (b"mid", 3))
    assert machine.window_count <= 3
    assert drain(machine, 10) == [b"high%d" % i for i in range(5)] + [b"mid"] + [b"low%d" % i for i in range(5)]
    assert machine.backing.records == {}


# ---------------------------------------------------------------------------- model


class PriorityModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = 0
        self.bodies = 0
        self.priority: dict[int, int] = {}  # seq -> effective priority
        self.ready: list[int] = []  # seqs, sorted by (priority desc, counter)
        self.held: dict[str, list[int]] = {}
        self.no_ack: dict[str, bool] = {}

    @initialize(max_priority=st.sampled_from([1, 2, 5, 255]))
    def setup(self, max_priority) -> None:
        self.max_priority = max_priority
        self.backing = DictBacking()
        self.machine = pq(max_priority, backing=self.backing, window_max=3)

    def key(self, seq: int):
        return (-self.priority[seq], seq & SEQ_MASK)

    def apply(self, command):
        self.index += 1
        reply, effects = self.machine.apply(Meta(self.index, 0), command)
        return reply, effects

    def take(self, seq: int) -> None:
        assert self.ready, "delivered from an empty queue"
        assert seq == self.ready[0], f"got {seq}, expected {self.ready[0]} of {self.ready}"
        self.ready.pop(0)

    def observe(self, effects) -> None:
        for effect in effects:
            assert type(effect) is Deliver
            self.take(effect.message.seq)
            if not self.no_ack[effect.consumer_id]:
                self.held.setdefault(effect.consumer_id, []).append(effect.message.seq)

    def give_back(self, seqs) -> None:
        self.ready = sorted(self.ready + list(seqs), key=self.key)

    @rule(priorities=st.lists(st.sampled_from([None, 0, 1, 2, 3, 9, 300]), min_size=1, max_size=4))
    def enqueue(self, priorities) -> None:
        batch = []
        for p in priorities:
            self.bodies += 1
            batch.append(Message("", "q", b"", b"m%d" % self.bodies, persistent=True, priority=p))
        reply, effects = self.apply(Enqueue(batch))
        for message, p in zip(batch, priorities, strict=True):
            self.priority[message.seq] = min(p or 0, self.max_priority)
            assert self.max_priority - (message.seq >> 48) == self.priority[message.seq]
        self.give_back([m.seq for m in batch])
        self.observe(effects)

    @rule(
        consumer=st.sampled_from(["c0", "c1"]),
        prefetch=st.integers(0, 2),
        no_ack=st.booleans(),
        credit=st.integers(0, 3),
    )
    def checkout(self, consumer, prefetch, no_ack, credit) -> None:
        if consumer in self.machine.consumers:
            return
        self.no_ack[consumer] = no_ack
        self.observe(self.apply(Checkout(consumer, "o", prefetch, no_ack, 0, False, credit))[1])

    @rule(consumer=st.sampled_from(["c0", "c1"]))
    def cancel(self, consumer) -> None:
        self.apply(Cancel(consumer))

    @rule(consumer=st.sampled_from(["c0", "c1"]), n=st.integers(1, 3))
    def credit(self, consumer, n) -> None:
        self.observe(self.apply(Credit(consumer, n))[1])

    @rule(holder=st.sampled_from(["c0", "c1", "g"]), kind=st.sampled_from([Settle, Requeue, Discard]), data=st.data())
    def settle(self, holder, kind, data) -> None:
        held = self.held.get(holder, [])
        seqs = data.draw(st.lists(st.sampled_from(held), unique=True, max_size=3) if held else st.just([]))
        for seq in seqs:
            held.remove(seq)
        if kind is Requeue:
            self.give_back(seqs)
        reply, effects = self.apply(kind(holder, list(seqs)))
        assert reply == len(seqs)
        self.observe(effects)

    @rule(no_ack=st.booleans())
    def get(self, no_ack) -> None:
        reply, _ = self.apply(Get("g", "o", no_ack))
        if reply is None:
            assert not self.ready
            return
        self.take(reply[0].seq)
        if not no_ack:
            self.held.setdefault("g", []).append(reply[0].seq)

    @rule()
    def purge(self) -> None:
        reply, _ = self.apply(Purge())
        assert reply == len(self.ready)
        self.ready = []

    @rule()
    def restart(self) -> None:
        """Only the backing survives: every unsettled message comes back ready, in order."""
        old = self.machine
        held = [seq for seqs in self.held.values() for seq in seqs]
        self.machine = pq(self.max_priority, backing=self.backing, window_max=3)
        self.machine.recover(next_seq=old.next_seq, spilled_count=len(self.backing.records), spill_cursor=0)
        self.held = {}
        self.no_ack = {}
        self.give_back(held)
        assert self.machine.ready_count == len(self.ready)

    @invariant()
    def agrees(self) -> None:
        if not hasattr(self, "machine"):
            return
        machine = self.machine
        machine.check_invariants()
        assert machine.ready_count == len(self.ready)
        stored = set(self.backing.records)
        unsettled = set(self.ready) | {s for seqs in self.held.values() for s in seqs}
        assert stored == unsettled, "the backing holds exactly the unsettled (all persistent) messages"
        assert self.backing.range_claimed == self.backing.range_removed


PriorityModel.TestCase.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
test_priority_queue_against_model = PriorityModel.TestCase
