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
from maxq_raft.server.session import Session


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


def _session(vhost: str, publishes: list[tuple[str, bool]]) -> Session:
    """A connection's per-exchange counting alone (the publish path's few lines), without a socket."""
    session = Session.__new__(Session)
    session.vhost, session.run_exchange, session.run_in, session.run_out, session.exchange_counts = vhost, "", 0, 0, {}
    for exchange, routed in publishes:
        if exchange != session.run_exchange:
            session._next_run(exchange)
        session.run_in += 1
        session.run_out += routed
    return session


class _Broker:
    def __init__(self, sessions: dict[str, Session]) -> None:
        self.exchange_counts = {("/", "x"): [10, 4]}  # closed connections' and HTTP publishes'
        self.sessions = sessions


def test_a_connection_counts_runs_of_publishes_per_exchange():
    session = _session("/", [("x", True), ("x", True), ("", False), ("", True), ("x", True), ("y", False)])
    assert session.exchange_totals() == {"x": (3, 3), "": (2, 1), "y": (1, 0)}
    session.forget_exchanges({"y", "x"})
    assert session.exchange_totals() == {"": (2, 1)}
    assert _session("/", []).exchange_totals() == {}
    assert _session("/", [("", True)]).exchange_totals() == {"": (1, 1)}  # the default exchange's run


def test_exchange_counts_add_the_kept_ones_and_each_open_connections():
    broker = _Broker({"a": _session("/", [("x", True)] * 5 + [("", False)] * 2), "b": _session("v", [("x", False)])})
    assert exchange_counts(broker) == {("/", "x"): (15, 9), ("/", ""): (2, 0), ("v", "x"): (1, 0)}
