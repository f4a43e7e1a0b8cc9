"""scripts/bench_wakeup_cost.py: its measurements end and are positive, a bad gap is refused."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_wakeup_cost.py"


def load_script():
    """The script as a module (scripts/ is not a package), as test_soak_drift loads scripts/soak,
    without putting scripts/ on sys.path for every other test."""
    loader = importlib.machinery.SourceFileLoader("bench_wakeup_cost", str(SCRIPT))
    spec = importlib.util.spec_from_loader("bench_wakeup_cost", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


bench_wakeup_cost = load_script()


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
