"""message_rates.py: RabbitMQ's message_stats from counts sampled with a given clock."""

from __future__ import annotations

from maxq_raft.server.message_rates import SAMPLE_INTERVAL_S, MessageRates


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
