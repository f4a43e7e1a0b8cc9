"""Fixtures that run real `maxq-server` processes for integration tests.

Every server a test starts is stopped by the fixture that started it, also when the test
fails: `BrokerProcess.stop` sends SIGTERM, waits, then SIGKILLs. Ports are chosen free by the
OS; data goes to pytest's tmp_path. Tests use `broker.amqp_port` with any client.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from maxq_raft.perf.ports import free_port_in, kernel_port
from tests.helpers import api

READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 10.0


def _ephemeral_ports() -> range:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return range(low, high + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


_EPHEMERAL = _ephemeral_ports()
_port_rng = random.Random()  # (its own: tests that seed `random` must not make every run pick the same ports)
# Ports already handed out by this test process: a free port is only free until its server binds
# it, so two picks in one fixture (a cluster takes some fifteen) could return the same number, and
# the second server would then fail "the port is in use" (a CI run met it). Never the same twice.
_handed_out: set[int] = set()


# Ports for the brokers tests start: 20000-29999, below the jepsen-style lab's (maxq_jepsen/lab.py:
# 30000-32000), and split between pytest-xdist's workers (scripts/test runs two), so that no two
# processes of one run ever pick the same port.
TEST_PORTS = (20000, 30000)


def _worker_ports() -> tuple[int, int]:
    low, high = TEST_PORTS
    high = min(high, _EPHEMERAL.start, 32768)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count < 2:
        return low, high
    size = (high - low) // count
    start = low + int(worker[2:]) % count * size
    return start, start + size


def free_port() -> int:
    """A port free now, and outside the kernel's ephemeral range. A port the kernel hands out
    for bind(0) comes from that range, and between this call and the server's bind any
    outgoing connection (the members' Raft links, the clients') may take it as its local port:
    "Address already in use" at start-up under load. Below the range only listeners compete."""
    bottom, top = _worker_ports()
    port = free_port_in(bottom, top, _handed_out, _port_rng) if top > bottom + 1000 else None
    return port if port is not None else kernel_port()  # (a crowded range, or none below the ephemeral one)


class BrokerProcess:
    """One real maxq-server process on loopback."""

    def __init__(
        self, data_dir: Path, log_path: Path, extra_args: list[str] | None = None, env: dict | None = None
    ) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = extra_args or []
        self.env = env
        self.amqp_port = free_port()
        self.http_port = free_port()
        # Each its own (the default 15692 would be one port for every node on the machine).
        self.prometheus_port = free_port()
        self.sqs_port = free_port()  # the SQS endpoint (tests/integration/test_sqs.py)
        self.proc: subprocess.Popen | None = None

    def start(self) -> BrokerProcess:
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        """Start the process without waiting for it (cluster members wait for each other)."""
        args = [
            sys.executable,
            "-m",
            "maxq_raft",
            "--data-dir",
            str(self.data_dir),
            "--amqp-port",
            str(self.amqp_port),
            "--http-port",
            str(self.http_port),
            "--prometheus-port",
            str(self.prometheus_port),
            "--sqs-port",
            str(self.sqs_port),
            *self.extra_args,
        ]
        env = dict(os.environ if self.env is None else self.env)
        self._log = open(self.log_path, "ab")
        # A restart appends to the same log: only a ready line written after this point counts.
        self._log_offset = self.log_path.stat().st_size
        # cwd outside the repo: the repo root must not be on sys.path (our amqp/ would shadow py-amqp).
        self.proc = subprocess.Popen(
            args, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=str(self.data_dir.parent)
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> BrokerProcess:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"maxq-server exited with {self.proc.returncode}:\n{self.log_text()}")
            if b"maxq-server ready" in self.log_path.read_bytes()[self._log_offset :]:
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"maxq-server not ready after {timeout_s}s:\n{self.log_text()}")

    def logs_text(self) -> str:
        """This server's log, or every member's when it is the first member of a test cluster
        (effects such as dead-letter cycles are logged by the member leading the queue's shard)."""
        return "".join(member.log_text() for member in getattr(self, "members", [self]))

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def connect(self, **params) -> pika.BlockingConnection:
        """A pika connection to this server; `params` go to pika.ConnectionParameters (a test
        that kills or pauses the server passes heartbeat=0, so no heartbeat times out meanwhile)."""
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.amqp_port, **params))

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        self._log.close()
        return self.proc.returncode


# A queue's group by the hash of its name (--queue-leader-locator balanced): for cluster tests
# that find a queue's group by that hash or exist for the paths to a leader on another member;
# the default, client-local, puts a queue in a group its declaring member leads.
HASHED = ["--queue-leader-locator", "balanced"]


def cluster_args(name: str, raft_ports: dict[str, int]) -> list[str]:
    # Snapshots every ~5 KB of a group's log: the AMQP suites then run across many of them.
    args = [
        "--node-id",
        name,
        "--raft-addr",
        f"127.0.0.1:{raft_ports[name]}",
        "--cluster-secret",
        "test",
        "--shards",
        os.environ.get("MAXQ_TEST_SHARDS", "2"),
        "--snapshot-every-mb",
        os.environ.get("MAXQ_TEST_SNAPSHOT_MB", "0.005"),
    ]
    if os.environ.get("MAXQ_TEST_FACTOR"):
        args += ["--replication-factor", os.environ["MAXQ_TEST_FACTOR"]]
    # The passes are there for the paths a queue's work takes to its group's leader on another
    # member: the default (client-local) would put every queue n1 declares in a group it leads.
    args += HASHED
    for peer, port in raft_ports.items():
        if peer != name:
            args += ["--peer", f"{peer}@127.0.0.1:{port}"]
    return args


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The jepsen-style runs go to one pytest-xdist worker, one after another (each runs brokers
    and clients of its own: two at once on 2 cores would starve both).

    In the cluster pass (MAXQ_TEST_CLUSTER: scripts/test's second run), a test that uses only
    brokers of its own (start_broker starts plain single nodes) and not the shared one would run
    exactly as in the first pass: skip it there (a deep priority queue's restart alone took 42 s)."""
    for item in items:
        if "/tests/jepsen/" in str(item.path):
            item.add_marker(pytest.mark.xdist_group("jepsen"))
    if not os.environ.get("MAXQ_TEST_CLUSTER"):
        return
    skip = pytest.mark.skip(reason="single-node test (only start_broker's nodes): it ran in the first pass")
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "start_broker" in names and not names & {"broker", "env"}:
            item.add_marker(skip)


def wait_for_feature_flags(process: BrokerProcess, timeout_s: float) -> None:
    """Until the cluster has enabled every feature flag: its metadata leader does it once every
    member announced them, a moment after they are ready; a partitioned declare before it is a
    406 (seen when the suite's partitioned tests ran first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # bounded by the deadline
        status, flags, _ = api(process, "GET", "/api/feature-flags")
        if status == 200 and flags and all(flag["state"] == "enabled" for flag in flags):
            return
        time.sleep(0.1)
    raise AssertionError(f"the cluster did not enable every feature flag in {timeout_s:.0f} s")


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """One broker shared by the tests that do not restart or break it.

    MAXQ_TEST_CLUSTER=1 makes it a one-member Raft cluster and MAXQ_TEST_CLUSTER=3 the first
    member of a 3-node cluster: every command then goes through the replicated path (proposed,
    forwarded to its group's leader, committed, applied from the log on every member). With
    MAXQ_TEST_FACTOR (and MAXQ_TEST_SHARDS groups) each group is on that many members only, so
    the shared member serves some queues through other members' groups (scripts/test's third
    pass: 5 members, 5 groups of 3)."""
    root = tmp_path_factory.mktemp("broker")
    size = int(os.environ.get("MAXQ_TEST_CLUSTER") or 0)
    names = [f"n{i + 1}" for i in range(size)] or ["maxq1"]
    raft_ports = {name: free_port() for name in names}
    processes = [
        BrokerProcess(root / name, root / f"{name}.log", cluster_args(name, raft_ports) if size else [])
        for name in names
    ]
    try:
        for process in processes:
            process.launch()
        for process in processes:
            process.wait_ready(60.0)
        if size > 1:
            wait_for_feature_flags(processes[0], 60.0)
        processes[0].members = processes  # for tests that read every member's log
        yield processes[0]
    finally:
        for process in processes:
            if process.proc is not None:
                process.stop()
        for process in processes:
            if "Traceback" in process.log_text():
                # A server-side bug the tests did not catch by name: show it in the CI output.
                print(
                    f"\n--- shared broker log ({process.log_path}) has a traceback ---\n{process.log_text()[-20000:]}"
                )


@pytest.fixture
def start_broker(tmp_path):
    """Factory for brokers a test owns (restarts, kills, special settings); all are stopped after it."""
    started: list[BrokerProcess] = []

    def start(
        extra_args: list[str] | None = None, data_dir: Path | None = None, env: dict | None = None
    ) -> BrokerProcess:
        n = len(started)
        process = BrokerProcess(data_dir or tmp_path / f"data{n}", tmp_path / f"server{n}.log", extra_args, env)
        started.append(process)
        return process.start()

    try:
        yield start
    finally:
        for process in started:
            process.stop()
