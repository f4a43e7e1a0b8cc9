"""The sqs workload for real, short: one node with its SQS endpoint, boto3 senders and receivers,
a kill -9/restart and a pause. It must pass (lost=0, received_after_delete=0) with deletes that
count (certain ones) and with messages received again after their visibility ran out (the
receivers leave some alone on purpose). Through the real entry point, as CI would call it; the
harness stops the broker it starts. The checker's sqs rule on synthetic histories:
test_sqs_checker.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

RUN = Path(__file__).resolve().parents[2] / "jepsen-style" / "run"

pytestmark = pytest.mark.timeout(150)


def test_a_short_sqs_run_with_a_kill_and_a_pause_passes(tmp_path):
    done = subprocess.run(
        [
            str(RUN),
            "--store",
            str(tmp_path / "store"),
            "--runs",
            "1",
            "--seed",
            "3",
            "--workload",
            "sqs",
            "--nemesis",
            "kill,pause",
            "--time",
            "16",
            "--quiet-s",
            "1.5:2.5",
            "--fault-s",
            "1.5:2.5",
        ],
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].endswith("verdict=PASS")
    (r,) = json.loads(next((tmp_path / "store").glob("*/results.json")).read_text())["runs"]
    counts = r["counts"]
    assert r["workload"] == "sqs" and r["verdict"] == "PASS"
    assert counts["confirmed"] > 50 and counts["lost"] == 0 and counts["received_after_delete"] == 0
    assert counts["deletes_certain"] > 50
    assert counts["duplicates"] > 0  # abandoned messages came back after their visibility timeout
