"""jepsen-style/run for real, short: one node, kill -9/restart and pause, a few seconds each.

A safe run must pass with lost=0, and so must a short run of the TTL + dead-letter workload
(`--workload dlx`), by both routes. A run whose client is deliberately wrong (it counts a publish
as confirmed when it sends it, `--unsafe-confirm-early`) while the broker is killed under load
must be caught: lost > 0, verdict FAIL, non-zero exit. (`--fsync off` would not do: a process
kill leaves the page cache, so nothing is lost.) Plus the cheap paths: a cluster-only nemesis is
refused with a reason (a majorities ring on 3 members; a cluster or network nemesis on a lab
that cannot run it), and `--check` re-judges a history file offline. The cluster runs are in
test_cluster_run.py.

Each run goes through the real entry point (`jepsen-style/run`, as CI would call it) into
pytest's tmp_path; the harness stops every broker it starts, and each subprocess has a timeout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
RUN = JEPSEN_DIR / "run"
SUMMARY_RE = re.compile(r"^runs=(\d+) confirmed=(\d+) lost=(\d+) unexpected=(\d+) duplicates=(\d+) verdict=(\w+)$")

pytestmark = pytest.mark.timeout(120)


def run(tmp_path: Path, *args: str, timeout_s: float = 90) -> tuple[subprocess.CompletedProcess, dict | None]:
    done = subprocess.run(
        [str(RUN), "--store", str(tmp_path / "store"), *args], capture_output=True, text=True, timeout=timeout_s
    )
    results = sorted((tmp_path / "store").glob("*/results.json"))
    return done, (json.loads(results[-1].read_text()) if results else None)


def last_line(done: subprocess.CompletedProcess) -> re.Match:
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    match = SUMMARY_RE.match(lines[-1])
    assert match, f"last line is not the summary:\n{done.stdout}\n{done.stderr}"
    return match


def test_a_short_run_with_kills_and_a_pause_passes(tmp_path):
    # Seed 3 with these ranges: kill, pause, kill.
    done, results = run(
        tmp_path,
        "--runs",
        "1",
        "--seed",
        "3",
        "--nemesis",
        "kill,pause",
        "--time",
        "16",
        "--quiet-s",
        "1.5:2.5",
        "--fault-s",
        "1.5:2.5",
    )
    match = last_line(done)
    assert done.returncode == 0, done.stdout + done.stderr
    assert match.group(1) == "1" and int(match.group(2)) > 100 and match.group(3) == "0" and match.group(4) == "0"
    assert match.group(6) == "PASS"
    (r,) = results["runs"]
    assert [c["nemesis"] for c in r["schedule"]] == ["kill", "pause", "kill"]
    assert r["verdict"] == "PASS" and r["fatal"] == {} and r["drain_complete"] is True
    assert r["counts"]["delivered"] >= r["counts"]["confirmed"]
    assert r["findings"] == [], r["findings"]  # no traceback or critical line in the node's log
    run_dir = Path(r["run_dir"])
    assert (run_dir / "history.jsonl").stat().st_size > 0 and (run_dir / "timeline.html").exists()
    assert "<svg" in (run_dir.parent / "report.html").read_text()
    assert not (run_dir / "n1" / "data").exists()  # a passing run keeps history and logs, not data
    kills = [line for line in (run_dir / "history.jsonl").read_text().splitlines() if '"f":"kill"' in line]
    assert len(kills) == 4  # two kills, each an invoke and an ok


def test_a_short_dead_letter_run_with_kills_passes_by_both_routes(tmp_path):
    """--workload dlx on one node: a 300 ms TTL on the work queue, dead letters to jepsen-dlq,
    a pausing work consumer; kills in between. Every confirmed message arrives by one of the two
    routes, every dead letter carries x-death (work queue, expired), and both routes are used."""
    done, results = run(
        tmp_path,
        "--runs",
        "1",
        "--seed",
        "5",
        "--workload",
        "dlx",
        "--nemesis",
        "kill",
        "--time",
        "14",
        "--quiet-s",
        "1.5:2.5",
        "--fault-s",
        "1.5:2.5",
    )
    match = last_line(done)
    assert done.returncode == 0 and match.group(6) == "PASS", done.stdout + done.stderr
    (r,) = results["runs"]
    c = r["counts"]
    assert r["workload"] == "dlx" and r["fatal"] == {} and r["drain_complete"] is True
    assert c["dead_letter_without_x_death"] == 0 and c["lost"] == 0
    assert c["by_work_queue_only"] > 0 and c["by_dead_letter_only"] > 0, c
    assert "routes:" in done.stdout


def test_an_unsafe_client_under_kills_is_caught_losing_messages(tmp_path):
    # Seed 2 with these ranges: four kills while three publishers push 300 msg/s each.
    done, results = run(
        tmp_path,
        "--runs",
        "1",
        "--seed",
        "2",
        "--unsafe-confirm-early",
        "--nemesis",
        "kill",
        "--time",
        "12",
        "--rate",
        "300",
        "--quiet-s",
        "1:2",
        "--fault-s",
        "0.5:1",
    )
    match = last_line(done)
    assert done.returncode == 1, done.stdout + done.stderr
    assert int(match.group(3)) > 0 and match.group(6) == "FAIL"
    (r,) = results["runs"]
    assert r["verdict"] == "FAIL" and r["fatal"]["lost"] == r["counts"]["lost"] > 0
    assert set(r["fatal"]) == {"lost"}  # the broker did nothing else wrong
    assert "lost=" in done.stdout and "e.g." in done.stdout  # the details name lost ids


def test_a_nemesis_the_lab_shape_cannot_run_is_refused_with_a_reason(tmp_path):
    done, _ = run(tmp_path, "--profile", "cluster", "--nemesis", "partition-majorities-ring", timeout_s=60)
    assert done.returncode == 2
    assert "needs 5 or more nodes" in done.stderr


def test_a_cluster_nemesis_on_one_node_is_refused_with_a_reason(tmp_path):
    done, _ = run(tmp_path, "--nemesis", "kill-leader", "--runs", "1", timeout_s=60)
    assert done.returncode == 2
    assert "needs a cluster" in done.stderr
    done, _ = run(tmp_path, "--profile", "cluster", "--nemesis", "partition-one", "--lab", "local", timeout_s=60)
    assert done.returncode == 2
    assert "needs the namespace lab" in done.stderr


def test_check_judges_a_history_file_offline(tmp_path):
    sys.path.insert(0, str(JEPSEN_DIR))
    try:
        from maxq_jepsen.history import write_history
    finally:
        sys.path.remove(str(JEPSEN_DIR))
    records = [
        {"time": 0.0, "process": "runner", "type": "meta", "f": "meta", "value": {"spec": {"seed": 9}}},
        {"time": 0.1, "process": "pub0", "type": "invoke", "f": "publish", "id": "pub0-1", "seq": 1, "session": 1},
        {"time": 0.2, "process": "pub0", "type": "ok", "f": "publish", "id": "pub0-1", "seq": 1, "session": 1},
        {"time": 0.3, "process": "drain", "type": "ok", "f": "drain", "value": {"remaining": 0}},
    ]
    history = tmp_path / "history.jsonl"
    write_history(history, records)
    done = subprocess.run([str(RUN), "--check", str(history)], capture_output=True, text=True, timeout=60)
    match = last_line(done)
    assert done.returncode == 1 and match.group(3) == "1" and match.group(6) == "FAIL"
    assert (tmp_path / "timeline.html").exists()
