"""The ticker's index of queues (server/queue_timers.py): against a model that reads every queue,
as the ticker did before it, and on real queue machines.

The contract: a queue changes only with a `touch` (the apply path's); after `refresh`, the
dead-letter and transaction sets are what a pass over every queue finds, and `due(now)` returns
each queue whose deadline has come once per touch."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import settings_or_default
from maxq_raft.machines.queue_types import Meta
from maxq_raft.server.queue_timers import STALE_ENTRIES_SLACK, QueueTimers

KEYS = [("/", f"q{i}") for i in range(6)]


class FakeQueue:
    def __init__(self) -> None:
        self.next_deadline_ms: int | None = None
        self.dead_lettering: dict[int, object] = {}
        self.txns: dict[str, object] = {}


class TimersAgainstAFullScan(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.timers = QueueTimers()
        self.queues: dict[tuple[str, str], FakeQueue] = {}
        self.now_ms = 0
        self.touched: set[tuple[str, str]] = set()  # since the last refresh
        self.armed: set[tuple[str, str]] = set()  # touched since `due` last returned them

    def _touch(self, key: tuple[str, str]) -> None:
        self.timers.touch(key)
        self.touched.add(key)

    @rule(key=st.sampled_from(KEYS), ahead_ms=st.none() | st.integers(-50, 500))
    def set_deadline(self, key: tuple[str, str], ahead_ms: int | None) -> None:
        queue = self.queues.setdefault(key, FakeQueue())
        queue.next_deadline_ms = None if ahead_ms is None else self.now_ms + ahead_ms
        self._touch(key)

    @rule(key=st.sampled_from(KEYS), held=st.booleans(), txns=st.booleans())
    def hold(self, key: tuple[str, str], held: bool, txns: bool) -> None:
        queue = self.queues.setdefault(key, FakeQueue())
        queue.dead_lettering = {1: object()} if held else {}
        queue.txns = {"t": object()} if txns else {}
        self._touch(key)

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: tuple[str, str]) -> None:
        self.queues.pop(key, None)
        self._touch(key)

    @rule(key=st.sampled_from(KEYS))
    def touch_unchanged(self, key: tuple[str, str]) -> None:
        self._touch(key)  # (the ticker's re-arm of a queue it could not tick)

    @rule()
    def touch_all(self) -> None:
        self.timers.touch_all()
        self.touched.update(KEYS)

    @rule(elapsed_ms=st.integers(0, 200))
    def tick(self, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms
        self.timers.refresh(self.queues)
        self.armed |= self.touched
        self.touched.clear()
        expected = {
            key
            for key in self.armed
            if key in self.queues
            and self.queues[key].next_deadline_ms is not None
            and self.queues[key].next_deadline_ms <= self.now_ms
        }
        found = self.timers.due(self.now_ms)
        assert len(found) == len(set(found)), "a queue returned twice"
        assert set(found) == expected
        self.armed -= expected
        # what a full scan finds, after a refresh
        assert set(self.timers.dead_lettering) == {k for k, q in self.queues.items() if q.dead_lettering}
        assert set(self.timers.with_txns) == {k for k, q in self.queues.items() if q.txns}

    @invariant()
    def heap_bounded(self) -> None:
        assert len(self.timers._heap) <= 2 * self.timers.timed() + STALE_ENTRIES_SLACK + len(KEYS)


TestTimersAgainstAFullScan = TimersAgainstAFullScan.TestCase
TestTimersAgainstAFullScan.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


def test_a_queue_whose_deadline_keeps_moving_leaves_a_bounded_heap() -> None:
    timers = QueueTimers()
    queue = FakeQueue()
    queues = {KEYS[0]: queue}
    for step in range(10_000):  # an x-expires queue used all the time: its deadline moves on
        queue.next_deadline_ms = 3_600_000 + step
        timers.touch(KEYS[0])
        timers.refresh(queues)
    assert len(timers._heap) <= 2 + STALE_ENTRIES_SLACK
    assert timers.due(3_600_000 + 9_998) == []
    assert timers.due(3_600_000 + 9_999) == [KEYS[0]]


def test_real_machines_only_a_queue_with_a_deadline_is_due() -> None:
    """A queue holding a message with a TTL comes out when the message is due; an idle queue,
    and one whose messages have no TTL, never do."""
    timers = QueueTimers()
    queues = {}
    for name, arguments in (("idle", {}), ("plain", {}), ("ttl", {"x-message-ttl": 100})):
        queue = QueueMachine("/", name, settings=settings_or_default("/", name, arguments))
        queue.apply(Meta(1, 1_000), qc.Enqueue([Message("", name, b"\x00\x00", b"m")]) if name != "idle" else qc.Tick())
        queues[("/", name)] = queue
        timers.touch(("/", name))
    timers.refresh(queues)
    assert timers.timed() == 1
    assert timers.due(1_099) == []
    assert timers.due(1_100) == [("/", "ttl")]
    assert timers.due(10_000) == [], "forgotten until touched again"
    queues[("/", "ttl")].apply(Meta(2, 1_100), qc.Tick())  # the Tick expires it: nothing left to wait for
    timers.touch(("/", "ttl"))
    timers.refresh(queues)
    assert timers.timed() == 0 and timers.due(10**12) == []
