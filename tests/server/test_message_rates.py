"""message_rates.py: RabbitMQ's message_stats from counts sampled with a given clock."""

from __future__ import annotations

from maxq_raft.server.message_rates import (
    QUEUE_COUNTS,
    SAMPLE_INTERVAL_S,
    KeyedRates,
    MessageRates,
    exchange_counts,
    queue_counts,
)


def test_rates_over_the_last_interval():
    rates = MessageRates(samples_kept=3)
    assert rates.message_stats(0.0, {"publish": 0}) == {"publish": 0, "publish_details": {"rate": 0.0}}
    rates.sample(0.0, {"publish": 0, "ack": 0})
    rates.sample(5.0, {"publish": 500, "ack": 100})
    # Read 1 s after the last sample: the span goes back to a sample at least 5 s old.
    stats = rates.message_stats(6.0, {"publish": 560, "ack": 160})
    assert stats["publish"] == 560 and stats["publish_details"] == {"rate": round(560 / 6.0, 1)}
    assert stats["ack_details"] == {"rate": round(160 / 6.0, 1)}
    stats = rates.message_stats(10.0 + SAMPLE_INTERVAL_S, {"publish": 1500, "ack": 100, "confirm": 7})
    assert stats["publish_details"] == {"rate": 100.0}  # (1500 - 500) / 10 s since the 5 s sample
    assert stats["confirm_details"] == {"rate": 0.7}  # a name the samples did not have counts from 0


def test_the_ring_is_bounded_and_rates_never_go_negative():
    rates = MessageRates(samples_kept=3)
    for second in range(0, 100, 5):
        rates.sample(float(second), {"publish": second})
    assert len(rates.samples) == 3
    assert rates.message_stats(100.0, {"publish": 0})["publish_details"] == {"rate": 0.0}  # a restart's counts


class _Queue:
    def __init__(self) -> None:
        self.stats_published = self.stats_delivered = self.stats_got = 0
        self.stats_redelivered = self.stats_acked = 0


def test_queue_rates_keep_two_samples_per_queue_and_forget_gone_queues():
    rates = KeyedRates(QUEUE_COUNTS)
    q, other = _Queue(), _Queue()
    assert rates.message_stats(0.0, "q", queue_counts(q))["publish_details"] == {"rate": 0.0}  # never sampled
    rates.sample(0.0, {"q": queue_counts(q), "other": queue_counts(other)})
    q.stats_published, q.stats_delivered, q.stats_got, q.stats_acked = 100, 40, 10, 30
    rates.sample(5.0, {"q": queue_counts(q), "other": queue_counts(other)})
    q.stats_published = 130
    rates.sample(10.0, {"q": queue_counts(q)})  # "other" is gone
    assert set(rates.samples) == {"q"} and len(rates.samples["q"]) == 2
    stats = rates.message_stats(12.0, "q", queue_counts(q))
    # 2 s after the last sample: the span goes back to the one at 5 s (7 s)
    assert stats["publish"] == 130 and stats["publish_details"] == {"rate": round(30 / 7.0, 1)}
    assert stats["deliver_get"] == 50 and stats["deliver_get_details"] == {"rate": 0.0}
    assert stats["ack"] == 30 and set(stats) == {name + suffix for name in QUEUE_COUNTS for suffix in ("", "_details")}


class _Session:
    def __init__(self, vhost: str, published: dict[str, int], routed: dict[str, int]) -> None:
        self.vhost, self.exchange_in, self.exchange_out = vhost, published, routed


class _Broker:
    def __init__(self) -> None:
        self.exchange_counts = {("/", "x"): [10, 4]}  # closed connections' and HTTP publishes'
        self.sessions = {
            "a": _Session("/", {"x": 5, "": 2}, {"x": 5}),
            "b": _Session("v", {"x": 1}, {}),
        }


def test_exchange_counts_add_the_kept_ones_and_each_open_connections():
    assert exchange_counts(_Broker()) == {("/", "x"): (15, 9), ("/", ""): (2, 0), ("v", "x"): (1, 0)}
