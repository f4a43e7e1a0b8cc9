"""Real 3-node clusters for tests: separate maxq-server processes on loopback.

`cluster` starts n1, n2, n3 (free ports, data in tmp_path) and stops every process it started,
also when the test fails; a test may kill, stop and restart members through it.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pika
import pytest

from tests.conftest import BrokerProcess, free_port

CLUSTER_READY_S = 60.0
SECRET = "test-cluster-secret"


class Member(BrokerProcess):
    def __init__(self, name: str, root: Path, raft_port: int, peers: dict[str, int], extra: list[str]) -> None:
        self.name = name
        self.raft_port = raft_port
        args = ["--node-id", name, "--raft-addr", f"127.0.0.1:{raft_port}", "--cluster-secret", SECRET, "--shards", "2"]
        for peer, port in peers.items():
            args += ["--peer", f"{peer}@127.0.0.1:{port}"]
        super().__init__(root / name, root / f"{name}.log", args + extra)

    def connect(self, **params) -> pika.BlockingConnection:
        return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.amqp_port, **params))

    def admin(self, path: str):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as response:
            return json.load(response)


class Cluster:
    def __init__(self, root: Path, size: int = 3, extra: list[str] | None = None) -> None:
        names = [f"n{i + 1}" for i in range(size)]
        ports = {name: free_port() for name in names}
        self.members = {name: Member(name, root, ports[name], {p: ports[p] for p in names if p != name}, extra or [])
                        for name in names}

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def start(self) -> "Cluster":
        for member in self.members.values():
            member.launch()
        for member in self.members.values():
            member.wait_ready(CLUSTER_READY_S)
        return self

    def restart(self, name: str) -> Member:
        member = self.members[name]
        member.stop()
        member.launch()
        return member.wait_ready(CLUSTER_READY_S)

    def alive(self) -> list[Member]:
        return [m for m in self.members.values() if m.alive()]

    def leader_of(self, group: str, via: Member | None = None) -> str | None:
        status = (via or self.alive()[0]).admin("/api/cluster/status")
        for g in status["groups"]:
            if g["group"] == group:
                return g["leader"]
        return None

    def stop(self) -> None:
        for member in self.members.values():
            if member.proc is not None:
                member.stop()


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        for member in c.members.values():
            if "Traceback" in member.log_text():
                print(f"\n--- {member.name} log has a traceback ---\n{member.log_text()[-15000:]}")
