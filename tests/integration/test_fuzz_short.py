"""The seeded short version of scripts/fuzz (the full run's figures are in docs/reliability.md):
a node of its own takes 20,000 AMQP frames of mutated client sessions and 1,500 malformed admin
requests while a pika client makes round trips, and every check of the full run must pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[2] / "scripts" / "fuzz"
SEED = 20240601
RUN_TIMEOUT_S = 150.0


def test_a_short_seeded_fuzz_run_passes_every_check(tmp_path):
    out = tmp_path / "summary.json"
    args = [
        sys.executable,
        str(FUZZ),
        "--seed",
        str(SEED),
        "--frames",
        "20000",
        "--admin-requests",
        "1500",
        "--duration-s",
        "90",
        "--rss-every-s",
        "0.05",  # the run may take only a couple of seconds: enough samples to judge memory
        "--out",
        str(out),
    ]
    # cwd outside the repo: its root on sys.path would let our amqp/ shadow py-amqp
    result = subprocess.run(args, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    summary = json.loads(out.read_text())
    failed = {name: passed for name, passed in summary["checks"].items() if passed is not True}
    assert not failed, (failed, result.stdout[-6000:])  # None would be a check that could not run
    assert summary["amqp"]["frames_sent"] >= 20000 and summary["amqp"]["mutated_frames_sent"] > 0
    assert summary["admin"]["requests"] >= 1500
    assert summary["probe"]["ok"] >= 3 and summary["probe"]["failed"] == 0
