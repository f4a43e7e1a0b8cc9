"""Latency histogram: log-linear buckets with about 0.8 % precision, mergeable across processes.

Theory of operation: the same bucketing as amqpload's (so the two tools' percentiles can be
compared digit for digit): values below 256 ns have a bucket each; above, every power of two
is split into 128 linear buckets, and a percentile is reported as its bucket's midpoint, the
maximum exactly. The hot path never buckets: a worker appends raw nanosecond values to an
`array('q')` (tens of nanoseconds per value) and folds them into the bucket counts when the
array reaches `RAW_SAMPLES_MAX` and at the end, which bounds its memory. Folded histograms are
plain dicts (bucket -> count) that pickle cheaply through a pipe and merge by addition.
"""

from __future__ import annotations

from array import array
from collections import Counter

SUB_BUCKETS = 128
LINEAR_LIMIT_NS = 256
BUCKETS_MAX = LINEAR_LIMIT_NS + 48 * SUB_BUCKETS
RAW_SAMPLES_MAX = 1 << 21  # 16 MiB of raw int64 values per recorder before a fold


def bucket_of(value_ns: int) -> int:
    if value_ns < LINEAR_LIMIT_NS:
        return value_ns if value_ns > 0 else 0
    exponent = value_ns.bit_length() - 8  # value >> exponent is in [128, 256)
    index = LINEAR_LIMIT_NS + (exponent - 1) * SUB_BUCKETS + ((value_ns >> exponent) - SUB_BUCKETS)
    return index if index < BUCKETS_MAX else BUCKETS_MAX - 1


def bucket_mid_ns(index: int) -> int:
    if index < LINEAR_LIMIT_NS:
        return index
    exponent = (index - LINEAR_LIMIT_NS) // SUB_BUCKETS + 1
    mantissa = (index - LINEAR_LIMIT_NS) % SUB_BUCKETS + SUB_BUCKETS
    return (mantissa << exponent) + ((1 << exponent) >> 1)


class Histogram:
    """Bucket counts, the sample count and the exact maximum, in nanoseconds."""

    __slots__ = ("counts", "n", "max_ns")

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.n = 0
        self.max_ns = 0

    def add(self, value_ns: int, count: int = 1) -> None:
        if value_ns < 0 or count <= 0:
            return
        self.counts[bucket_of(value_ns)] += count
        self.n += count
        if value_ns > self.max_ns:
            self.max_ns = value_ns

    def add_raw(self, values: array) -> None:
        """Fold a batch of raw values (negative ones, from clock skew across cores, are dropped)."""
        if not values:
            return
        kept = [v for v in values if v >= 0]
        if not kept:
            return
        self.counts.update(map(bucket_of, kept))
        self.n += len(kept)
        top = max(kept)
        if top > self.max_ns:
            self.max_ns = top

    def merge(self, other: Histogram) -> None:
        self.counts.update(other.counts)
        self.n += other.n
        if other.max_ns > self.max_ns:
            self.max_ns = other.max_ns

    def percentile_us(self, pct: float) -> float | None:
        if not self.n:
            return None
        want = min(int(pct / 100.0 * self.n), self.n - 1)
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen > want:
                return min(bucket_mid_ns(index), self.max_ns) / 1000.0
        return self.max_ns / 1000.0

    def summary(self) -> dict | None:
        """amqpload's shape: {"n", "p50", "p90", "p99", "p999", "max"} in microseconds."""
        if not self.n:
            return None
        out: dict = {"n": self.n}
        for key, pct in (("p50", 50), ("p90", 90), ("p99", 99), ("p999", 99.9)):
            out[key] = round(self.percentile_us(pct), 1)
        out["max"] = round(self.max_ns / 1000.0, 1)
        return out

    def to_wire(self) -> tuple[dict, int, int]:
        return dict(self.counts), self.n, self.max_ns

    @classmethod
    def from_wire(cls, wire: tuple[dict, int, int]) -> Histogram:
        h = cls()
        counts, h.n, h.max_ns = wire
        h.counts.update(counts)
        return h


class Recorder:
    """Raw samples for the hot path; `samples.append` is all a worker calls per message."""

    __slots__ = ("samples", "histogram")

    def __init__(self) -> None:
        self.samples = array("q")
        self.histogram = Histogram()

    def fold_if_full(self) -> None:
        if len(self.samples) >= RAW_SAMPLES_MAX:
            self.fold()

    def fold(self) -> Histogram:
        self.histogram.add_raw(self.samples)
        self.samples = array("q")
        return self.histogram
