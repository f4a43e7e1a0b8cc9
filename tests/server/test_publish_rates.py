"""x-publish-rate-limit's bucket on the node (server/publish_rates.py), without a server."""

from __future__ import annotations

from types import SimpleNamespace

from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.server.publish_rates import PublishRates

KEY = ("/", "q")


def machine(limit: int | None) -> SimpleNamespace:
    return SimpleNamespace(settings=QueueSettings(publish_rate_limit=limit))


def test_an_unlimited_queue_never_waits_and_is_not_tracked() -> None:
    rates = PublishRates()
    rates.settings_changed(KEY, machine(None))
    assert rates.limits == {} and rates.take(KEY, 1_000_000, 0.0) == 0.0


def test_a_publisher_at_the_rate_waits_for_what_it_took_beyond_the_tolerance() -> None:
    rates = PublishRates()
    rates.settings_changed(KEY, machine(100))  # 10 ms apart; tolerance 110 ms
    assert rates.take(KEY, 11, 10.0) == 0.0  # within the tolerance: no wait
    assert abs(rates.take(KEY, 100, 10.0) - 1.0) < 1e-6  # a read of 100 more: 1 s
    # time catching up: a second later the bucket is where it should be
    assert abs(rates.take(KEY, 1, 11.0) - 0.01) < 1e-6


def test_over_a_long_run_the_rate_is_the_limit() -> None:
    rates = PublishRates()
    rates.settings_changed(KEY, machine(250))
    now, sent = 0.0, 0
    while now < 20.0:  # a publisher that sends 10 per read and obeys each wait
        wait_s = rates.take(KEY, 10, now)
        sent += 10
        now += max(wait_s, 0.001)
    assert 250 * 20 <= sent <= 250 * 20 + 40


def test_a_changed_limit_starts_afresh_and_a_deleted_queue_is_forgotten() -> None:
    rates = PublishRates()
    rates.settings_changed(KEY, machine(1))
    assert rates.take(KEY, 10, 0.0) > 8
    rates.settings_changed(KEY, machine(1))  # the same limit: the bucket stays
    assert rates.take(KEY, 1, 0.0) > 9
    rates.settings_changed(KEY, machine(1000))
    assert rates.take(KEY, 1, 0.0) == 0.0
    rates.settings_changed(KEY, None)
    assert rates.limits == {} and rates.take(KEY, 10**6, 0.0) == 0.0
