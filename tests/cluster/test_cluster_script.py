"""`scripts/cluster up --hosts 3 --members-per-host 2` (issue #19: several members per machine).

Six real members, two on each of three "machines" (Raft addresses 127.0.0.1, .2, .3): every
shard group's three replicas are on three different machines, so a machine's loss (both its
members killed with -9) leaves each group two of its three and loses no confirmed message.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest

from ..helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster"
MAXQCTL = [sys.executable, "-m", "maxq_raft.cli.maxqctl"]
MEMBERS, QUEUES = 6, 24


def _base() -> int:
    """A MAXQ_CLUSTER_BASE whose ports (AMQP 5681+, admin 15681+, Prometheus 15693+, Raft 7101+)
    are free on every machine's address: below the 20000-29999 the other tests take ports from,
    one range per pytest-xdist worker."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = 2000 + 100 * (int(worker[2:]) if worker[2:].isdigit() else 0) % 2000
    for base in range(start, start + 2000, 20):  # bounded: 100 tries
        ports = [p + base + i for p in (5680, 15680, 15692, 7100) for i in range(1, MEMBERS + 1)]
        if all(_free(f"127.0.0.{h}", port) for port in ports for h in (1, 2, 3)):
            return base
    raise AssertionError("no free port range for scripts/cluster")


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@pytest.fixture
def six_members(tmp_path: Path):
    env = {**os.environ, "MAXQ_CLUSTER_DIR": str(tmp_path / "cluster"), "MAXQ_CLUSTER_BASE": str(_base())}
    try:
        up = subprocess.run(
            [str(SCRIPT), "up", "--hosts", "3", "--members-per-host", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert up.returncode == 0, up.stdout + up.stderr
        yield env
    finally:
        subprocess.run([str(SCRIPT), "down"], env=env, capture_output=True, timeout=60)


def _port(env: dict[str, str], first: int, member: int) -> int:
    return first + int(env["MAXQ_CLUSTER_BASE"]) + member


def _pids(env: dict[str, str]) -> dict[str, int]:
    lines = (Path(env["MAXQ_CLUSTER_DIR"]) / "pids").read_text().split("\n")
    return {name: int(pid) for name, pid in (line.split() for line in lines if line.strip())}


def _confirmed(env: dict[str, str], queues: list[str], body: bytes) -> None:
    """Publish `body` to each queue through n1 with confirms (a nack or an error raises)."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", _port(env, 5680, 1)))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for name in queues:
            channel.queue_declare(name, durable=True)
            channel.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2), mandatory=True)
    finally:
        connection.close()


def test_each_group_on_three_machines_and_a_machine_lost_loses_nothing(six_members: dict[str, str]) -> None:
    env = six_members
    shown = subprocess.run(
        [*MAXQCTL, "--node", f"127.0.0.1:{_port(env, 15680, 1)}", "--json", "placement"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    layout = json.loads(shown.stdout)
    machines = layout["hosts"]
    assert machines == {f"n{i}": f"127.0.0.{(i - 1) // 2 + 1}" for i in range(1, MEMBERS + 1)}
    groups = layout["groups"]
    assert len(groups) == 2 * MEMBERS
    for group, members in groups.items():
        assert sorted(machines[m] for m in members) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"], (group, members)
    held = [m for members in groups.values() for m in members]
    assert {m: held.count(m) for m in machines} == {m: 6 for m in machines}
    assert len({tuple(sorted(m)) for m in groups.values()}) > 2  # the replica sets differ

    queues = [f"spread-{i}" for i in range(QUEUES)]
    _confirmed(env, queues, b"before")
    pids = _pids(env)
    for name in ("n5", "n6"):  # the machine 127.0.0.3, both its members
        os.kill(pids[name], signal.SIGKILL)

    def published_again() -> bool:
        try:
            _confirmed(env, queues, b"after")
        except (pika.exceptions.AMQPError, OSError):
            return False
        return True

    wait_for(published_again, 60, "a confirmed publish to every queue with a machine down", 1.0)
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", _port(env, 5680, 2)))
    try:
        channel = connection.channel()
        for name in queues:
            bodies = []
            for _ in range(4):  # bounded: at most one more than the two published
                _method, _props, body = channel.basic_get(name, auto_ack=True)
                if body is None:
                    break
                bodies.append(body)
            # "after" may be there twice when a publish timed out mid-election and was retried
            assert bodies[0] == b"before" and set(bodies[1:]) == {b"after"}, (name, bodies)
    finally:
        connection.close()
