"""jepsen-style/run --workload txn for real, short: transactional halves under faults (issue #21).

Publishers send 1-3 halves per transaction to a deduplicating queue, then commit, roll back, or
leave the transaction to the broker's check-back, which a responder answers; a half whose
confirm was lost is published again (same id, same transaction) before the decision. The
checker must find no rolled-back message delivered, no confirmed half of a confirmed commit
lost, and no second copy of a half delivered; and the run must have done each of the three
(commits, rollbacks, check-backs answered) and retried some halves.

One node with kill -9/restart and pauses longer than the confirm timeout (a pause is what makes
a stored half's confirm late, so its retry meets the deduplication window: before halves were
deduplicated this run failed with txn_duplicates, docs/reliability.md); and a 3-node cluster
with kill-leader and partition-leader (in network namespaces when this machine allows them, else
kill-leader and pause-leader on loopback).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cluster_run import JEPSEN_DIR, RUN, SUMMARY_RE, _netns_ok


def test_cli_workload_txn_declares_a_deduplicating_queue_and_a_checks_queue():
    sys.path.insert(0, str(JEPSEN_DIR))
    try:
        from maxq_jepsen import cli
        from maxq_jepsen.profiles import CI_WORKLOAD, TXN_CHECKS_QUEUE
        from maxq_jepsen.txn_workload import half_body
        from maxq_jepsen.workload import queue_arguments
    finally:
        sys.path.remove(str(JEPSEN_DIR))
    (spec,) = cli.build_specs(cli.parse_args(["--runs", "1", "--workload", "txn", "--nemesis", "kill"]))
    w = spec.workload
    assert spec.workload_kind == "txn" and w.deduplication and w.checks_queue == TXN_CHECKS_QUEUE
    assert w.rate_per_publisher_hz == CI_WORKLOAD.rate_per_publisher_hz / 3  # transactions of ~2 publishes
    assert w.queues() == [w.queue]  # the drain and the settle leave the checks queue alone
    assert queue_arguments(w, w.queue)["x-message-deduplication"] is True
    assert "x-message-deduplication" not in queue_arguments(w, TXN_CHECKS_QUEUE)
    assert spec.to_dict()["workload"]["checks_queue"] == TXN_CHECKS_QUEUE  # in the meta record
    assert half_body("pub0-1", 1, 3, 64) != half_body("pub0-1", 2, 3, 64)  # a delivery names its attempt
    assert len(half_body("pub0-1", 1, 3, 64)) == 64


def run_txn(tmp_path: Path, *args: str, timeout_s: float) -> dict:
    done = subprocess.run(
        [str(RUN), "--store", str(tmp_path / "store"), "--runs", "1", "--workload", "txn", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    match = SUMMARY_RE.match(lines[-1])
    assert match, f"last line is not the summary:\n{done.stdout}\n{done.stderr}"
    (results_path,) = [p for p in (tmp_path / "store").glob("*/results.json") if p.parent.name != "latest"]
    (r,) = json.loads(results_path.read_text())["runs"]
    assert r["fatal"] == {}, (r.get("examples"), done.stdout + done.stderr)
    assert r["verdict"] == "PASS" and match.group(6) == "PASS" and done.returncode == 0, done.stdout + done.stderr
    assert r["drain_complete"] is True
    c = r["counts"]
    assert c["rolled_back_delivered"] == c["committed_lost"] == c["txn_duplicates"] == 0
    # Each way a transaction ends happened, and some more than a few times.
    assert c["txns"] > 50 and c["txns_committed"] > 10 and c["txns_rolled_back"] > 10, c
    assert c["txns_checked_back"] > 5 and c["checks"] >= c["txns_checked_back"], c
    assert c["delivered"] > 20, c
    return r


@pytest.mark.timeout(150)
def test_a_short_single_node_txn_run_with_kills_and_pauses_passes(tmp_path):
    # Seed 5 with these ranges: kill, pause, kill, pause (pauses of 3-5 s, confirm timeout 3 s).
    r = run_txn(
        tmp_path,
        "--seed",
        "5",
        "--nemesis",
        "kill,pause",
        "--time",
        "24",
        "--quiet-s",
        "1.5:2.5",
        "--fault-s",
        "3:5",
        timeout_s=120,
    )
    assert r["counts"]["half_retries"] > 0, r["counts"]
    assert r["findings"] == [], r["findings"]


@pytest.mark.timeout(300)
def test_a_short_cluster_txn_run_with_leader_faults_passes(tmp_path):
    netns = _netns_ok()
    nemeses = "kill-leader," + ("partition-leader" if netns else "pause-leader")
    run_txn(
        tmp_path,
        "--profile",
        "cluster",
        "--seed",
        "10",
        "--nemesis",
        nemeses,
        "--time",
        "30",
        "--quiet-s",
        "2:3",
        "--fault-s",
        "4:5",
        "--lab",
        "netns" if netns else "local",
        timeout_s=260,
    )
