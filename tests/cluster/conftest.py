"""Real 3-node clusters for tests: separate maxq-server processes on loopback.

`cluster` starts n1, n2, n3 (free ports, data in tmp_path) and stops every process it started,
also when the test fails; a test may kill, stop and restart members through it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
from pathlib import Path

import pika
import pika.exceptions
import pytest

from tests.conftest import HASHED, BrokerProcess, free_port
from tests.helpers import GUEST_AUTH

CLUSTER_READY_S = 60.0
SECRET = "test-cluster-secret"


# These tests find a queue's group by the hash of its name (cluster.shard_of), or pick names by
# it: their members place new queues so (HASHED). The default, client-local (a group the
# declaring member leads), has its own tests (test_queue_locator_cluster.py: hashed=False).


class Member(BrokerProcess):
    def __init__(
        self, name: str, root: Path, raft_port: int, peers: dict[str, int], extra: list[str], hashed: bool = True
    ) -> None:
        self.name = name
        self.raft_port = raft_port
        args = ["--node-id", name, "--raft-addr", f"127.0.0.1:{raft_port}", "--cluster-secret", SECRET, "--shards", "2"]
        args += HASHED if hashed else []
        for peer, port in peers.items():
            args += ["--peer", f"{peer}@127.0.0.1:{port}"]
        super().__init__(root / name, root / f"{name}.log", args + extra)

    def admin(self, path: str):
        with urllib.request.urlopen(
            urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", headers=GUEST_AUTH), timeout=5
        ) as response:
            return json.load(response)


class Cluster:
    def __init__(self, root: Path, size: int = 3, extra: list[str] | None = None, hashed: bool = True) -> None:
        names = [f"n{i + 1}" for i in range(size)]
        ports = {name: free_port() for name in names}
        self.members = {
            name: Member(name, root, ports[name], {p: ports[p] for p in names if p != name}, extra or [], hashed)
            for name in names
        }

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def start(self) -> Cluster:
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
            member.stop()  # a member never started (or stopped already) is passed over


class ConfirmingPublisher(threading.Thread):
    """Publishes numbered persistent messages with confirms, one at a time, to the given members
    in turn: a connection that fails (the member died, or cannot commit) moves it to the next.
    Only what was confirmed is promised; `confirmed` holds (number, time confirmed).

    Mandatory, as a producer that must know is told to publish: a publish nothing routes (the
    queue deleted, or the metadata barrier given up on: docs/replication.md) comes back as a
    basic.return (`unroutable`, not confirmed) instead of being confirmed as dropped."""

    def __init__(self, members: list, queue: str, pause_s: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.members = members
        self.queue = queue
        self.pause_s = pause_s  # between publishes: a little load, not a flood
        self.confirmed: list[tuple[int, float]] = []
        self.in_doubt = 0
        self.doubted: list[int] = []  # numbers published and neither confirmed nor returned
        self.unroutable = 0
        self.errors: list[str] = []
        self.stop_flag = threading.Event()

    def message(self, n: int) -> tuple[bytes, pika.BasicProperties]:
        """The body and properties of publish number n."""
        return str(n).encode(), pika.BasicProperties(delivery_mode=2)

    def confirmed_numbers(self) -> set[int]:
        return {n for n, _ in self.confirmed}

    def run(self) -> None:
        n = 0
        turn = 0
        while not self.stop_flag.is_set() and len(self.errors) < 1000:
            member = self.members[turn % len(self.members)]
            turn += 1
            if not member.alive():
                time.sleep(0.05)
                continue
            try:
                conn = member.connect(socket_timeout=10, blocked_connection_timeout=20)
            except Exception as exc:
                self.errors.append(f"connect {member.name}: {exc!r}")
                time.sleep(0.2)
                continue
            answered = n  # every number up to this one was confirmed, nacked or returned
            try:
                channel = conn.channel()
                channel.confirm_delivery()
                while not self.stop_flag.is_set():
                    n += 1
                    try:
                        channel.basic_publish("", self.queue, *self.message(n), mandatory=True)
                    except pika.exceptions.NackError:
                        self.in_doubt += 1
                        self.doubted.append(n)
                        answered = n
                        continue
                    except pika.exceptions.UnroutableError:
                        self.unroutable += 1
                        answered = n
                        continue
                    answered = n
                    self.confirmed.append((n, time.monotonic()))
                    if self.pause_s:
                        time.sleep(self.pause_s)
            except Exception as exc:  # the member went away or closed us: in doubt, not confirmed
                self.in_doubt += 1
                self.doubted.extend(range(answered + 1, n + 1))
                self.errors.append(f"{member.name}: {exc!r}")
            finally:
                try:
                    conn.close()
                except Exception:
                    pass


def drain(member, queue: str, *, quiet_s: float = 3.0, limit_s: float = 60.0) -> list[tuple[bytes, bool]]:
    """Consume (and ack) until nothing came for quiet_s: [(body, redelivered)]."""
    conn = member.connect(socket_timeout=10)
    try:
        channel = conn.channel()
        channel.basic_qos(prefetch_count=500)
        got = []
        deadline = time.monotonic() + limit_s
        for method, _props, body in channel.consume(queue, inactivity_timeout=quiet_s):
            if method is None or time.monotonic() > deadline:
                break
            got.append((body, method.redelivered))
            channel.basic_ack(method.delivery_tag)
        channel.cancel()
        return got
    finally:
        conn.close()


@contextlib.contextmanager
def running_cluster(root: Path, extra: list[str] | None = None, size: int = 3, hashed: bool = True):
    """A started cluster of `size` members, always stopped after (a member's traceback is printed);
    `hashed`: its members started with --queue-leader-locator balanced (HASHED)."""
    c = Cluster(root, size, extra=extra, hashed=hashed)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        for member in c.members.values():
            if "Traceback" in member.log_text():
                print(f"\n--- {member.name} log has a traceback ---\n{member.log_text()[-15000:]}")


@pytest.fixture
def cluster(tmp_path):
    with running_cluster(tmp_path) as c:
        yield c
