"""scripts/bench_wakeup_cost.py: its measurements end and are positive, a bad gap is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_wakeup_cost.py"


bench_wakeup_cost = load_script("bench_wakeup_cost", SCRIPT)


def test_a_hand_off_round_trip_costs_some_cpu_and_returns() -> None:
    assert bench_wakeup_cost.handoff_cpu_us(0.0, 200) > 0
    assert bench_wakeup_cost.handoff_cpu_us(0.001, 20) > 0


def test_the_call_count_is_bounded_both_ways() -> None:
    assert bench_wakeup_cost.calls_for(0.0) == 20_000
    assert bench_wakeup_cost.calls_for(1.0) == 50  # a long gap still gets a mean of 50 calls
    assert bench_wakeup_cost.calls_for(0.001) == 2000


def test_a_bad_gap_is_refused_with_a_message() -> None:
    for gaps in ("x", "0", "5000", ""):
        run = subprocess.run(
            [sys.executable, str(SCRIPT), "--gaps-ms", gaps], capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 2, (gaps, run.stdout, run.stderr)
        assert "bench_wakeup_cost:" in run.stderr
