"""Transactional half messages on a real 3-node cluster (machines/transactions.py,
server/transactions.py, docs/queue-features.md): the halves, their check-back state and the
decision are replicated, so killing the leader of the halves' shard between the half publish
and the commit loses nothing and shows nothing early, the check-backs go on from the
attempt the dead leader had reached, and a member restarted from its snapshot (format 5) keeps
the open transactions."""

from __future__ import annotations

import time
import uuid

import pika
import pytest

from maxq_raft.server.cluster import shard_of

from ..helpers import wait_for
from .conftest import drain, running_cluster

SHARDS = 2
BODY = b"x" * 4000


def queue_in(group: str, prefix: str) -> str:
    """A queue name whose shard is `group` (bounded: half of all names hash to each of two)."""
    for i in range(1000):
        name = f"{prefix}-{i}"
        if shard_of(("/", name), SHARDS) == group:
            return name
    raise AssertionError(f"no name for {group}")


def publish_halves(member, queues: list[str], txn_id: str, count: int, **props) -> None:
    conn = member.connect(socket_timeout=10)
    extra_headers = props.pop("headers", {})  # (for every half, not only the first)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for queue in queues:
            for i in range(count):
                headers = {"x-transaction-id": txn_id, **extra_headers}
                properties = pika.BasicProperties(delivery_mode=2, headers=headers, **props)
                channel.basic_publish("", queue, f"{queue}/{i}".encode(), properties)
    finally:
        conn.close()


def commit(member, txn_id: str) -> None:
    conn = member.connect(socket_timeout=10)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish(
            "amq.maxq.transaction", txn_id, b"", pika.BasicProperties(headers={"x-transaction-action": "commit"})
        )
    finally:
        conn.close()


def ready(member, queue: str) -> int:
    conn = member.connect(socket_timeout=10)
    try:
        return conn.channel().queue_declare(queue, passive=True).method.message_count
    finally:
        conn.close()


def new_leader(cluster, group: str, dead: str, via) -> None:
    def named() -> str | None:  # (a survivor may name the dead one until it notices)
        leader = cluster.leader_of(group, via=via)
        return leader if leader != dead else None

    wait_for(named, 20, f"a new leader of {group}")


def test_a_leader_kill_between_half_and_commit_loses_nothing_and_shows_nothing_early(cluster):
    n1 = cluster["n1"]
    group = shard_of(("/", "probe"), SHARDS)
    leader = cluster.leader_of(group)
    other = "shard-1" if group == "shard-0" else "shard-0"
    queues = [queue_in(group, "txk"), queue_in(other, "txo")]  # two shard groups, one transaction
    conn = n1.connect()
    try:
        channel = conn.channel()
        for queue in queues:
            channel.queue_declare(queue, durable=True)
    finally:
        conn.close()
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    publish_halves(cluster[leader], queues, txn_id, 50)  # through the leader itself
    cluster[leader].kill()
    survivors = [m for m in cluster.members.values() if m.name != leader]
    new_leader(cluster, group, leader, survivors[0])
    for member in survivors:
        for queue in queues:
            assert ready(member, queue) == 0, "nothing shows before the commit"
    commit(survivors[0], txn_id)
    for queue in queues:
        got = drain(survivors[1], queue, quiet_s=1.5)
        assert sorted(body for body, _ in got) == sorted(f"{queue}/{i}".encode() for i in range(50)), queue


def test_check_backs_go_on_after_the_leader_dies(cluster):
    n1 = cluster["n1"]
    group = shard_of(("/", "probe"), SHARDS)
    queue, checks = queue_in(group, "txcb"), queue_in(group, "txcb-checks")
    conn = n1.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_declare(checks, durable=True)
    finally:
        conn.close()
    leader = cluster.leader_of(group)
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    publish_halves(
        cluster[leader],
        [queue],
        txn_id,
        1,
        reply_to=checks,
        headers={"x-transaction-timeout": 1500, "x-transaction-checks": 10},
    )
    survivors = [m for m in cluster.members.values() if m.name != leader]
    time.sleep(1.7)  # one check from the first leader
    cluster[leader].kill()
    new_leader(cluster, group, leader, survivors[0])
    conn = survivors[0].connect(socket_timeout=10)
    try:
        channel = conn.channel()
        attempts: list[int] = []
        deadline = time.monotonic() + 30
        while (not attempts or max(attempts) < 3) and time.monotonic() < deadline:
            method, props, _body = channel.basic_get(checks, auto_ack=True)
            if method is None:
                time.sleep(0.2)
                continue
            assert props.headers["x-transaction-id"] == txn_id
            attempts.append(props.headers["x-transaction-check-attempt"])
        assert attempts and max(attempts) >= 3, attempts
        # Counted on from the dead leader's attempt 1 (sent before it died): each number once.
        assert attempts == list(range(1, len(attempts) + 1)), attempts
        assert ready(survivors[0], queue) == 0
        channel.confirm_delivery()
        channel.basic_publish(
            "amq.maxq.transaction", txn_id, b"", pika.BasicProperties(headers={"x-transaction-action": "commit"})
        )
    finally:
        conn.close()
    assert [body for body, _ in drain(survivors[1], queue, quiet_s=1.5)] == [f"{queue}/0".encode()]


@pytest.fixture
def snap_cluster(tmp_path):
    with running_cluster(tmp_path, ["--snapshot-every-mb", "1"]) as c:
        yield c


def test_a_member_restarted_from_its_snapshot_keeps_open_transactions(snap_cluster):
    """The halves are in the queue's snapshot (format 5): a member whose log was compacted past
    them and that restarts from its snapshot still holds them, shows none, and commits them."""
    n1 = snap_cluster["n1"]
    group = shard_of(("/", "probe"), SHARDS)
    queue, filler = queue_in(group, "txsnap"), queue_in(group, "txfill")
    conn = n1.connect()
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        channel.queue_declare(filler, durable=True)
    finally:
        conn.close()
    txn_id = f"txn-{uuid.uuid4().hex[:8]}"
    publish_halves(n1, [queue], txn_id, 20)
    conn = n1.connect(socket_timeout=10)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for _ in range(400):  # ~1.6 MB through the same shard: a snapshot, the log compacted
            channel.basic_publish("", filler, BODY, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()
    assert len(drain(n1, filler, quiet_s=1.0)) == 400

    def first_index() -> int:
        return {g["group"]: g for g in n1.admin("/api/cluster/status")["groups"]}[group]["first_index"]

    wait_for(lambda: first_index() > 200, 30, f"n1 compacts {group}'s log")
    snap_cluster.restart("n1")
    assert "starting from the snapshot" in n1.log_text()
    assert ready(n1, queue) == 0
    commit(n1, txn_id)
    got = drain(n1, queue, quiet_s=1.5)
    assert [body for body, _ in got] == [f"{queue}/{i}".encode() for i in range(20)]
