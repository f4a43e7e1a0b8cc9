"""Delivery rate limits in the queue machine (issue #20, item 3): per queue (`x-consume-rate-limit`,
argument or policy `consume-rate-limit`) and per consumer (the basic.consume argument of the same
name), in deliveries per second.

Theory of operation: each limit is a GCRA bucket ("generic cell rate algorithm", the virtual
scheduling form of a token bucket): a theoretical arrival time `tat_us` that each delivery moves
on by the interval 1/rate. A delivery is allowed while `tat_us` is at most a burst tolerance
ahead of now: one interval and 100 ms more, so that a delivery that comes due up to 100 ms
(two Ticks) before it is handed out is not lost to a full bucket; a limited consumer starts at
once with that burst and then gets a steady rate. Everything is integer microseconds of queue time (the log's), so every
replica allows the same deliveries at the same entries.

When messages wait only for a bucket, `rate_deadline_ms` says when one allows a delivery again;
it is part of the queue's `next_deadline_ms`, so the shell's Tick (every 50 ms) hands them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue_args import QueueSettings

RATE_MAX = 1_000_000  # deliveries per second: the interval stays at least 1 us
BURST_US = 100_000  # the tolerance beyond one interval: 100 ms of deliveries at the limit
UNLIMITED = 1 << 62


def interval_us(rate: int) -> int:
    return 1_000_000 // rate


def tolerance_us(step_us: int) -> int:
    return step_us + BURST_US


def allowance(rate: int, tat_us: int, now_ms: int) -> int:
    """How many deliveries the bucket allows at `now_ms`."""
    step = interval_us(rate)
    now_us = now_ms * 1000
    return max(0, (now_us + tolerance_us(step) - max(tat_us, now_us)) // step)


def taken(rate: int, tat_us: int, now_ms: int, count: int) -> int:
    """The bucket's `tat_us` after `count` deliveries at `now_ms`."""
    return max(tat_us, now_ms * 1000) + count * interval_us(rate)


def next_allowed_ms(rate: int, tat_us: int) -> int:
    """The first queue time at which the bucket allows a delivery again."""
    step = interval_us(rate)
    return -(-(tat_us - tolerance_us(step) + step) // 1000)  # ceiling division


class QueueConsumeRate:
    """The rate half of `QueueMachine` (a mixin over its `settings`, `consumers`, `now_ms`)."""

    if TYPE_CHECKING:
        settings: QueueSettings
        consumers: dict[str, Consumer]
        now_ms: int

    def _init_consume_rate(self) -> None:
        self.rate_tat_us = 0  # the queue's bucket (x-consume-rate-limit)
        self._rate_on = self.settings.consume_rate_limit is not None  # or an attached consumer with a limit

    def _update_rate_on(self) -> None:
        self._rate_on = self.settings.consume_rate_limit is not None or any(
            c.rate_limit and c.active for c in self.consumers.values()
        )

    def _queue_allowance(self) -> int:
        rate = self.settings.consume_rate_limit
        return UNLIMITED if rate is None else allowance(rate, self.rate_tat_us, self.now_ms)

    def _consumer_allowance(self, consumer: Consumer) -> int:
        rate = consumer.rate_limit
        return UNLIMITED if not rate else allowance(rate, consumer.rate_tat_us, self.now_ms)

    def _rate_take(self, consumer: Consumer, count: int) -> None:
        rate = self.settings.consume_rate_limit
        if rate is not None:
            self.rate_tat_us = taken(rate, self.rate_tat_us, self.now_ms, count)
        if consumer.rate_limit:
            consumer.rate_tat_us = taken(consumer.rate_limit, consumer.rate_tat_us, self.now_ms, count)

    def rate_deadline_ms(self) -> int | None:
        """When a bucket that now allows nothing allows a delivery again (None: none is empty).
        Asked only while messages are ready and a consumer is attached."""
        deadline = None
        rate = self.settings.consume_rate_limit
        if rate is not None and not allowance(rate, self.rate_tat_us, self.now_ms):
            deadline = next_allowed_ms(rate, self.rate_tat_us)
        for consumer in self.consumers.values():
            rate = consumer.rate_limit
            if (
                rate
                and consumer.active
                and not consumer.paused
                and not allowance(rate, consumer.rate_tat_us, self.now_ms)
            ):
                due = next_allowed_ms(rate, consumer.rate_tat_us)
                if deadline is None or due < deadline:
                    deadline = due
        return deadline
