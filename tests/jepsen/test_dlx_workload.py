"""The dead-letter workload's pure parts: the queue arguments (TTL and dead-letter target on the
work queue only), reading x-death as pika hands it over, which queue each consumer takes from,
`--workload dlx` / `--ttl-ms` on the command line, and the long profile's dlx run (the ci profile
unchanged). No broker here; the checker's dlx verdicts are in test_checker.py."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen import cli  # noqa: E402
from maxq_jepsen.profiles import CI_CLUSTER_WORKLOAD, DLX_QUEUE, get_profile, workload_for  # noqa: E402
from maxq_jepsen.workload import WorkloadConfig, queue_arguments, x_death  # noqa: E402


def test_the_work_queue_has_the_ttl_and_the_dead_letter_target_the_other_queue_none():
    config = workload_for("dlx", WorkloadConfig(consumers=1))
    assert config.queues() == ["jepsen", DLX_QUEUE] and config.consumers == 2
    assert queue_arguments(config, "jepsen") == {
        "x-queue-type": "quorum",
        "x-message-ttl": 300,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": DLX_QUEUE,
    }
    assert queue_arguments(config, DLX_QUEUE) == {"x-queue-type": "quorum"}
    plain = WorkloadConfig()
    assert plain.queues() == ["jepsen"] and queue_arguments(plain, "jepsen") == queue_arguments()
    assert [config.consumer_queue(i) for i in range(4)] == ["jepsen", DLX_QUEUE, "jepsen", DLX_QUEUE]
    assert [plain.consumer_queue(i) for i in range(3)] == ["jepsen"] * 3


def test_x_death_is_read_as_pika_delivers_it():
    props = SimpleNamespace(
        headers={
            "x-death": [
                {
                    "count": 1,
                    "reason": b"expired",
                    "queue": "jepsen",
                    "time": 1,
                    "exchange": "",
                    "routing-keys": [b"jepsen"],
                }
            ]
        }
    )
    assert x_death(props) == [{"queue": "jepsen", "reason": "expired", "count": 1}]
    assert x_death(SimpleNamespace(headers=None)) is None and x_death(SimpleNamespace(headers={})) is None
    assert x_death(SimpleNamespace(headers={"x-death": "junk"})) == [{"malformed": "'junk'"}]


def test_cli_workload_dlx_and_ttl():
    (spec,) = cli.build_specs(
        cli.parse_args(
            [
                "--profile",
                "cluster",
                "--workload",
                "dlx",
                "--nemesis",
                "kill-leader",
                "--ttl-ms",
                "150",
                "--lab",
                "local",
            ]
        )
    )
    assert spec.workload_kind == "dlx" and spec.workload.dead_letter_queue == DLX_QUEUE
    assert spec.workload.message_ttl_ms == 150
    assert spec.workload.rate_per_publisher_hz == CI_CLUSTER_WORKLOAD.rate_per_publisher_hz
    assert spec.to_dict()["workload"]["dead_letter_queue"] == DLX_QUEUE  # in the history's meta, for the checker
    with pytest.raises(ValueError, match="ttl-ms"):
        cli.build_specs(cli.parse_args(["--profile", "cluster", "--ttl-ms", "150", "--lab", "local"]))


def test_the_long_profile_has_one_dlx_cluster_run_and_ci_has_none():
    runs = get_profile("long").runs
    dlx = [i for i, r in enumerate(runs) if r.workload_kind == "dlx"]
    assert len(dlx) == 1 and runs[dlx[0]].nodes == 5 and "clock-skew" in runs[dlx[0]].nemeses
    assert all(r.nodes == 5 for r in runs[: dlx[0] + 1])  # among the cluster runs, which come first
    assert [r.seed for r in runs[:10]] == list(range(2001, 2011))  # the first ten keep their seeds
    assert all(r.workload_kind != "dlx" for name in ("ci", "cluster") for r in get_profile(name).runs)
