"""x-publish-rate-limit (issue #20, item 3): publishes per second into a queue, enforced by this
node on the connections that publish to it.

Theory of operation: a publish is never refused or dropped for its rate. Each limited queue has a
GCRA bucket (machines/consume_rate.py's arithmetic, on this node's monotonic clock); a publish
routed to the queue moves the bucket on, and when the bucket is more than its tolerance ahead of
now, the publishing connection is not read until it is not (`Session._reader`), as flow control
does: TCP then slows the publisher. A read already taken is handled whole, so a publisher is over
its rate by at most one read's worth of messages, and over a longer time it gets the rate.

The limit is the queue's setting (argument or policy), read from the queue's machine whenever its
settings may have changed (`settings_changed`): a policy change applies at once. Each member
limits the publishers connected to it: N members admit up to N times the rate into one queue.
"""

from __future__ import annotations

from typing import Any

from ..machines.consume_rate import interval_us, tolerance_us

QueueKey = tuple[str, str]


class PublishRates:
    def __init__(self) -> None:
        self.limits: dict[QueueKey, int] = {}  # only the limited queues: empty is the common case
        self._tat_us: dict[QueueKey, int] = {}

    def settings_changed(self, key: QueueKey, machine: Any) -> None:
        """The queue was made, deleted (None) or its settings may have changed."""
        limit = None if machine is None else machine.settings.publish_rate_limit
        if limit is None:
            self.limits.pop(key, None)
            self._tat_us.pop(key, None)
        elif self.limits.get(key) != limit:
            self.limits[key] = limit
            self._tat_us.pop(key, None)  # a new limit starts with a full bucket

    def take(self, key: QueueKey, count: int, now_s: float) -> float:
        """`count` publishes into `key` now: the seconds its publisher should now wait (0.0: none)."""
        limit = self.limits.get(key)
        if limit is None:
            return 0.0
        step = interval_us(limit)
        now_us = int(now_s * 1_000_000)
        tat = max(self._tat_us.get(key, 0), now_us) + count * step
        self._tat_us[key] = tat
        ahead_us = tat - tolerance_us(step) - now_us
        return ahead_us / 1_000_000 if ahead_us > 0 else 0.0
