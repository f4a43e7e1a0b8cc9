"""Delivery rate limits (consume_rate.py): the bucket alone, then a queue machine driven by the
shell's 50 ms Ticks in log time, for a queue limit, a consumer limit and both."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines import consume_rate as cr
from maxq_raft.machines.commands import Checkout, Enqueue, Settle, Tick, UpdateSettings
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import Deliver, Meta, Rejected

TICK_MS = 50  # the shell's tick (server/command_log.py)


@settings(max_examples=300, deadline=None)
@given(rate=st.integers(1, cr.RATE_MAX), seconds=st.integers(1, 20), step_ms=st.integers(1, 2 * TICK_MS))
def test_a_bucket_allows_its_rate_plus_one_burst(rate, seconds, step_ms) -> None:
    """Taking everything allowed at each step (up to two of the shell's Ticks apart) for
    `seconds`: rate x time, plus at most the burst, and nothing lost to the steps."""
    tat, total, now = 0, 0, 0
    while now <= seconds * 1000:
        n = cr.allowance(rate, tat, now)
        if n:
            tat = cr.taken(rate, tat, now, n)
            total += n
        else:
            assert cr.next_allowed_ms(rate, tat) > now  # it says when, and that is later
        now += step_ms
    step = cr.interval_us(rate)
    elapsed_us = (now - step_ms) * 1000
    assert elapsed_us // step - 1 <= total <= elapsed_us // step + cr.tolerance_us(step) // step + 1


def test_next_allowed_ms_is_the_first_time_it_allows() -> None:
    for rate in (1, 3, 7, 100, 999, 1000, 12_345, cr.RATE_MAX):
        tat = cr.taken(rate, 0, 1000, cr.tolerance_us(cr.interval_us(rate)) // cr.interval_us(rate) + 3)
        due = cr.next_allowed_ms(rate, tat)
        assert cr.allowance(rate, tat, due) >= 1
        assert cr.allowance(rate, tat, due - 1) == 0


class Driver:
    """Applies commands at advancing log indexes; counts deliveries per consumer and acks them
    at once (`ack`), as a consumer that keeps up would."""

    def __init__(self, machine: QueueMachine, ack: bool = True) -> None:
        self.machine, self.ack, self.index = machine, ack, 100
        self.counts: dict[str, int] = {}

    def apply(self, time_ms: int, command) -> None:
        self.index += 1
        _, effects = self.machine.apply(Meta(self.index, time_ms), command)
        self.machine.check_invariants()
        for effect in effects:
            if type(effect) is Deliver:
                self.counts[effect.consumer_id] = self.counts.get(effect.consumer_id, 0) + 1
                if self.ack:
                    self.apply(time_ms, Settle(effect.consumer_id, [effect.message.seq]))

    def tick_for(self, seconds: float, start_ms: int = 10_000) -> dict[str, int]:
        """Ticks every 50 ms of log time, as the shell applies them."""
        for tick in range(int(seconds * 1000 / TICK_MS)):
            self.apply(start_ms + tick * TICK_MS, Tick())
        return self.counts


def filled(settings: QueueSettings | None = None, n: int = 5000) -> QueueMachine:
    machine = QueueMachine("/", "q", settings=settings or QueueSettings())
    machine.apply(Meta(1, 10_000), Enqueue([Message("", "q", b"\x00\x00", b"m", False) for _ in range(n)]))
    return machine


def test_a_queue_limit_of_100_a_second_gives_100_a_second_over_10_seconds() -> None:
    driver = Driver(filled(QueueSettings(consume_rate_limit=100)))
    driver.apply(10_000, Checkout("a", "o", 0, False, 0, False, 100_000))
    driver.apply(10_000, Checkout("b", "o", 0, False, 0, False, 100_000))
    counts = driver.tick_for(10)
    assert 990 <= counts["a"] + counts["b"] <= 1_100, counts  # the queue's, shared
    assert abs(counts["a"] - counts["b"]) <= 12  # round robin within the limit, after a took the burst (11) alone


def test_a_consumer_limit_holds_for_that_consumer_only() -> None:
    driver = Driver(filled())
    driver.apply(10_000, Checkout("slow", "o", 0, False, 0, False, 100_000, 100))
    driver.apply(10_000, Checkout("fast", "o", 10, False, 0, False, 100_000, 300))
    counts = driver.tick_for(10)
    assert 990 <= counts["slow"] <= 1_100, counts
    assert 2_970 <= counts["fast"] <= 3_100, counts


def test_a_deadline_is_set_only_while_messages_wait_for_a_bucket() -> None:
    machine = filled(QueueSettings(consume_rate_limit=10), n=5)
    assert machine.next_deadline_ms is None  # no consumer: nothing to wait for
    _, effects = machine.apply(Meta(2, 10_000), Checkout("a", "o", 0, True, 0, False, 100))
    assert len(effects) == 2  # 10/s: a burst of two intervals
    assert machine.next_deadline_ms == 10_100
    _, effects = machine.apply(Meta(3, 10_100), Tick())
    assert len(effects) == 1 and machine.next_deadline_ms == 10_200
    Driver(machine, ack=False).tick_for(1, start_ms=10_150)
    assert machine.ready_count == 0 and machine.next_deadline_ms is None


def test_a_policy_change_sets_and_lifts_the_limit_live() -> None:
    machine = filled(n=50)
    machine.apply(Meta(2, 10_000), UpdateSettings(QueueSettings(consume_rate_limit=10)))
    _, effects = machine.apply(Meta(3, 10_000), Checkout("a", "o", 0, True, 0, False, 1000))
    assert len(effects) == 2
    _, effects = machine.apply(Meta(4, 10_000), UpdateSettings(QueueSettings()))
    assert len(effects) == 48  # lifted: the rest at once
    reply, _ = machine.apply(Meta(5, 10_000), UpdateSettings(QueueSettings(consume_rate_limit=0)))
    assert type(reply) is Rejected and reply.reply_code == 541
    reply, _ = machine.apply(Meta(6, 10_000), Checkout("b", "o", 0, True, 0, False, 10, -1))
    assert type(reply) is Rejected and reply.reply_code == 541
