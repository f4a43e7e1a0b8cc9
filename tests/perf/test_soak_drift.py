"""scripts/soak's drift rule: medians compared by --drift, and the largest group log (a sawtooth
cut by snapshots) a rise only above the top a log that is cut reaches."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import load_script

SOAK = Path(__file__).resolve().parents[2] / "scripts" / "soak"


soak = load_script("soak_script", SOAK)


def summary(**changed: list) -> dict:
    flat = {key: [100.0, 100.0] for key in soak.SERIES}
    flat.update(changed)
    return flat


def test_a_flat_run_has_no_drift() -> None:
    assert soak.drifted(summary(), 0.10, 16.0) == []


def test_a_median_that_rose_more_than_the_allowance_drifted() -> None:
    assert soak.drifted(summary(rss_mb_sum=[360.0, 400.0]), 0.10, 16.0) == ["rss_mb_sum"]
    assert soak.drifted(summary(rss_mb_sum=[360.0, 395.0]), 0.10, 16.0) == []


def test_a_group_log_peak_under_the_cut_logs_top_is_no_drift() -> None:
    # 2026-12-03's aligned soak: 67.84 -> 76.84 MiB, both under 64 + 16 (the top of a cut log)
    assert soak.drifted(summary(group_log_mb_max=[67.84, 76.84]), 0.10, 16.0) == []


def test_a_group_log_that_is_not_cut_any_more_drifted() -> None:
    assert soak.drifted(summary(group_log_mb_max=[67.84, 90.0]), 0.10, 16.0) == ["group_log_mb_max"]
    # with snapshots every 64 MiB the top is 128 MiB, and a first peak above it is the reference
    assert soak.drifted(summary(group_log_mb_max=[120.0, 135.0]), 0.10, 64.0) == []
    assert soak.drifted(summary(group_log_mb_max=[150.0, 170.0]), 0.10, 64.0) == ["group_log_mb_max"]


def test_a_series_with_no_samples_is_not_compared() -> None:
    assert soak.drifted(summary(group_log_mb_max=[None, 90.0]), 0.10, 16.0) == []
