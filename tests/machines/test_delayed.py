"""Delayed messages (x-delay) in the queue machine: examples, and a model test with a tiny window.

The model: a delayed message is released at the first command at or after its due time, in order
of (due time, publish order), and then queued like a message published at that moment (FIFO
after what is there). The machine keeps at most 3 delayed messages in memory here, so most live
only in the backing and are loaded as they fall due; `restart` rebuilds the machine from the
backing alone. Identity is the body: a delayed message gets its queue seq when released.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from maxq_raft.machines.commands import Enqueue, Get, Purge, Tick
from maxq_raft.machines.delayed import DELAYED_BASE, slot_start_ms
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import Meta

from .test_queue_machine import DictBacking


def machine_with(backing=None, window: int = 3, **settings) -> QueueMachine:
    return make_queue_machine(
        "/",
        "q",
        settings=QueueSettings(**settings),
        backing=backing,
        durable=backing is not None,
        delayed_window_max=window,
    )


def test_delayed_message_is_invisible_until_due():
    q = machine_with()
    q.apply(Meta(1, 1000), Enqueue([Message("", "q", b"", b"later", delay_ms=500), Message("", "q", b"", b"now")]))
    assert q.ready_count == 1 and q.delayed.count == 1 and q.next_deadline_ms == 1500
    assert q.apply(Meta(2, 1001), Get("g", "o", True))[0][0].body == b"now"
    assert q.apply(Meta(3, 1499), Get("g", "o", True))[0] is None
    q.apply(Meta(4, 1500), Tick())
    assert q.ready_count == 1 and q.delayed.count == 0
    q.check_invariants()


def test_ttl_counts_from_the_release():
    q = machine_with(message_ttl_ms=100)
    q.apply(Meta(1, 0), Enqueue([Message("", "q", b"", b"m", delay_ms=1000)]))
    q.apply(Meta(2, 1050), Tick())
    assert q.ready_count == 1 and q.ready[0].expires_at_ms == 1150


def test_many_delayed_keep_little_in_memory_and_come_out_in_due_order():
    backing = DictBacking()
    q = machine_with(backing, window=16)
    # Publish 2,000 with delays in a scrambled order.
    delays = [(i * 7919) % 2000 + 1 for i in range(2000)]
    for i, delay in enumerate(delays):
        q.apply(Meta(i + 1, 0), Enqueue([Message("", "q", b"", b"%d" % i, persistent=True, delay_ms=delay)]))
    assert q.delayed.count == 2000 and len(q.delayed.window) <= 16
    q.check_invariants()
    got = []
    now = 0
    index = 10_000
    while q.delayed.count or q.ready_count:
        now = q.next_deadline_ms if q.delayed.count else now
        index += 1
        q.apply(Meta(index, now), Tick())
        while True:
            index += 1
            reply, _ = q.apply(Meta(index, now), Get("g", "o", True))
            if reply is None:
                break
            got.append((now, int(reply[0].body)))
        assert len(q.delayed.window) <= 32 or all(slot_start_ms(key) <= now for key in q.delayed.keys)
    assert [i for _, i in got] == sorted(range(2000), key=lambda i: (delays[i], i))
    assert all(now == delays[i] for now, i in got), "each released exactly when due"
    assert backing.records == {}


def test_delayed_survive_a_restart_and_new_keys_do_not_collide():
    backing = DictBacking()
    q = machine_with(backing)
    q.apply(Meta(1, 0), Enqueue([Message("", "q", b"", b"a%d" % i, persistent=True, delay_ms=100) for i in range(5)]))
    q2 = machine_with(backing)
    q2.recover(next_seq=q.next_seq, spilled_count=len(backing.records), spill_cursor=min(backing.records))
    assert q2.delayed.count == 5 and q2.ready_count == 0
    q2.apply(Meta(2, 5), Enqueue([Message("", "q", b"", b"b", persistent=True, delay_ms=95)]))  # same slot
    assert len(backing.records) == 6
    q2.apply(Meta(3, 100), Tick())
    bodies = [q2.apply(Meta(4 + i, 100), Get("g", "o", True))[0][0].body for i in range(6)]
    assert bodies == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b"]


def test_purge_leaves_delayed_messages():
    q = machine_with()
    q.apply(Meta(1, 0), Enqueue([Message("", "q", b"", b"d", delay_ms=10), Message("", "q", b"", b"r")]))
    assert q.apply(Meta(2, 1), Purge()) == (1, [])
    assert q.delayed.count == 1


class DelayedModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.index = 0
        self.counter = 0
        self.pending: list[tuple[int, int, bytes]] = []  # (due, publish number, body)
        self.ready: list[bytes] = []

    @initialize(max_priority=st.sampled_from([None, 3]))
    def setup(self, max_priority) -> None:
        self.backing = DictBacking()
        self.max_priority = max_priority
        self.machine = machine_with(self.backing, max_priority=max_priority)

    def apply(self, command):
        self.index += 1
        # The model releases first, as the machine does at the start of every command.
        for _due, _, body in sorted(p for p in self.pending if p[0] <= self.now):
            self.ready.append(body)
        self.pending = [p for p in self.pending if p[0] > self.now]
        return self.machine.apply(Meta(self.index, self.now), command)

    @rule(delays=st.lists(st.sampled_from([0, 0, 5, 10, 11, 30, 100, 2500]), min_size=1, max_size=4))
    def publish(self, delays) -> None:
        batch = []
        for delay in delays:
            self.counter += 1
            body = b"m%d" % self.counter
            batch.append(Message("", "q", b"", body, persistent=True, delay_ms=delay))
        reply, _ = self.apply(Enqueue(batch))
        assert reply == len(delays)
        for delay, message in zip(delays, batch, strict=True):
            if delay:
                self.pending.append(
                    (self.now + delay, self.counter - len(delays) + 1 + batch.index(message), message.body)
                )
            else:
                self.ready.append(message.body)

    @rule(ms=st.sampled_from([1, 4, 9, 10, 50, 1000]))
    def advance(self, ms) -> None:
        self.now += ms

    @rule()
    def tick(self) -> None:
        self.apply(Tick())

    @rule()
    def get(self) -> None:
        reply, _ = self.apply(Get("g", "o", True))
        if reply is None:
            assert not self.ready
        else:
            assert reply[0].body == self.ready.pop(0)

    @rule()
    def restart(self) -> None:
        old = self.machine
        self.machine = machine_with(self.backing, max_priority=self.max_priority)
        fifo = [s for s in self.backing.records if s < DELAYED_BASE]
        self.machine.recover(
            next_seq=old.next_seq, spilled_count=len(self.backing.records), spill_cursor=min(fifo) if fifo else 0
        )

    @invariant()
    def agrees(self) -> None:
        if not hasattr(self, "machine"):
            return
        m = self.machine
        m.check_invariants()
        assert m.delayed.count == len(self.pending)
        assert m.ready_count == len(self.ready)
        if self.pending:
            # The ticker never oversleeps: the deadline is at or before the earliest due.
            assert m.next_deadline_ms is not None and m.next_deadline_ms <= min(p[0] for p in self.pending)
        # The window, and one load beyond it; more only with messages of slots that have come.
        assert len(m.delayed.window) <= 3 + 3 or all(slot_start_ms(key) <= self.now for key in m.delayed.keys)
        delayed_keys = [s for s in self.backing.records if s >= DELAYED_BASE]
        assert len(delayed_keys) == len(self.pending), "every delayed message is stored, once"


DelayedModel.TestCase.settings = settings(max_examples=1500, stateful_step_count=60, deadline=None)
test_delayed_against_model = DelayedModel.TestCase


def test_regression_an_earlier_due_message_stored_behind_a_full_window_of_its_slot():
    """Shrunk by test_delayed_against_model (window 3): at t=5, three messages due at 15, then
    three more due at 15 and one due at 10, all in the slot 10-19 ms. The window held the first
    three; the others were stored, the one due at 10 last in the slot's key order. The window (3
    + one load of 3) filled with messages due at 15, so the one due at 10 stayed on disk until 15."""
    q = machine_with(DictBacking())
    q.apply(Meta(1, 5), Enqueue([Message("", "q", b"", b"m%d" % i, delay_ms=10) for i in range(1, 4)]))
    q.apply(
        Meta(2, 5),
        Enqueue(
            [Message("", "q", b"", b"m%d" % i, delay_ms=10) for i in range(4, 7)]
            + [Message("", "q", b"", b"early", delay_ms=5)]
        ),
    )
    q.apply(Meta(3, 10), Tick())
    assert q.ready_count == 1 and q.ready[0].body == b"early"
    q.check_invariants()


def test_regression_due_order_across_memory_and_store_in_one_slot():
    """Shrunk by test_delayed_against_model (window 3): at t=5, four messages due at 15, then two
    due at 15 and one due at 10, all in the slot 10-19 ms; one command at t=15. The first three
    were in memory, the rest stored; the one due at 10 came out after some due at 15 because the
    window was released before the rest of the slot was loaded."""
    q = machine_with(DictBacking())
    q.apply(Meta(1, 5), Enqueue([Message("", "q", b"", b"m%d" % i, delay_ms=10) for i in range(1, 5)]))
    q.apply(
        Meta(2, 5),
        Enqueue(
            [
                Message("", "q", b"", b"m5", delay_ms=10),
                Message("", "q", b"", b"m6", delay_ms=10),
                Message("", "q", b"", b"early", delay_ms=5),
            ]
        ),
    )
    q.apply(Meta(3, 15), Tick())
    assert [m.body for m in q.ready] == [b"early", b"m1", b"m2", b"m3", b"m4", b"m5", b"m6"]
    q.check_invariants()
