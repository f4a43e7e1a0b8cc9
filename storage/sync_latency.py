"""How long fsyncs take, kept as a Prometheus histogram's buckets.

Theory of operation: the thread that syncs (a Raft group's journal writer, the message store's
WalSyncer) calls `observe(seconds)` after each fdatasync or fsync of a batch; a scrape on the
loop thread reads `snapshot()`. The bounds are fixed (a disk's fsync runs from tens of
microseconds on a cache-backed device to seconds on a saturated one), so observing is one
bisect and two additions. A lock makes one snapshot's buckets, count and sum agree (Prometheus
requires the buckets to add up); it is taken once per fsync, next to a syscall that costs far
more.
"""

from __future__ import annotations

import bisect
import threading

# The upper bounds of the buckets, in seconds (Prometheus's `le`); one more bucket is +Inf.
BOUNDS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class SyncLatency:
    def __init__(self, bounds_s: tuple[float, ...] = BOUNDS_S) -> None:
        self.bounds_s = bounds_s
        self._counts = [0] * (len(bounds_s) + 1)  # per bucket, not cumulative; the last is +Inf
        self._sum_s = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        i = bisect.bisect_left(self.bounds_s, seconds)  # the first bound >= seconds: le semantics
        with self._lock:
            self._counts[i] += 1
            self._sum_s += seconds

    def snapshot(self) -> tuple[list[tuple[float, int]], float]:
        """(cumulative counts per upper bound, +Inf as float("inf") last; the sum of seconds)."""
        with self._lock:
            counts = list(self._counts)
            sum_s = self._sum_s
        cumulative: list[tuple[float, int]] = []
        running = 0
        for bound, count in zip((*self.bounds_s, float("inf")), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return cumulative, sum_s
