"""SyncLatency: an fsync's time lands in the first bucket whose bound is at least it (Prometheus's
`le`), the buckets are cumulative, and the exposition parses as a histogram."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.storage.sync_latency import BOUNDS_S, SyncLatency


def test_each_time_counts_in_the_buckets_at_or_above_it():
    latency = SyncLatency()
    for seconds in (0.00005, 0.0001, 0.0003, 0.002, 3.0):
        latency.observe(seconds)
    cumulative, sum_s = latency.snapshot()
    by_bound = dict(cumulative)
    assert by_bound[0.0001] == 2  # 50 µs and exactly 100 µs: le 0.0001
    assert by_bound[0.00025] == 2
    assert by_bound[0.0005] == 3
    assert by_bound[0.0025] == 4
    assert by_bound[2.5] == 4
    assert by_bound[float("inf")] == 5  # 3 s: above every finite bound
    assert abs(sum_s - 3.00245) < 1e-9


@given(st.lists(st.floats(min_value=0.0, max_value=10.0), max_size=200))
def test_buckets_are_cumulative_and_end_at_the_count(times):
    latency = SyncLatency()
    for seconds in times:
        latency.observe(seconds)
    cumulative, sum_s = latency.snapshot()
    counts = [count for _bound, count in cumulative]
    assert [bound for bound, _count in cumulative] == [*BOUNDS_S, float("inf")]
    assert counts == sorted(counts)
    assert counts[-1] == len(times)
    for bound, count in cumulative:
        assert count == sum(1 for t in times if t <= bound)
    assert abs(sum_s - sum(times)) < 1e-6
