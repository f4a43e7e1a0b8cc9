"""x-message-deduplication (a queue's window, and an exchange's window kept in its queues) on a real
3-node cluster: the window is replicated state of the queue
machine, so it survives the death of the shard's leader, and a member restarted from its own
snapshot (--snapshot-every-mb 1) has it too (machines/dedup.py, docs/queue-features.md)."""

from __future__ import annotations

import pika
import pytest

from maxq_raft.server.cluster import shard_of

from ..helpers import wait_for
from .conftest import drain, running_cluster

SHARDS = 2
BODY = b"x" * 4000


def publish_ids(member, queue: str, ids, body: bytes = b"", exchange: str = "") -> None:
    """One confirmed persistent publish per id (a nack or a lost connection fails the test),
    to `queue` or, when given, to `exchange`."""
    conn = member.connect(socket_timeout=10)
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for dedup_id in ids:
            props = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": dedup_id})
            channel.basic_publish(exchange, "" if exchange else queue, body or str(dedup_id).encode(), props)
    finally:
        conn.close()


def declare(member, queue: str, exchange: str = "") -> None:
    """A queue deduplicating by its own window or, with `exchange`, a plain queue bound to an
    x-message-deduplication exchange of that name (the window is the exchange's)."""
    conn = member.connect()
    try:
        channel = conn.channel()
        if not exchange:
            channel.queue_declare(
                queue, durable=True, arguments={"x-message-deduplication": True, "x-cache-size": 1000}
            )
            return
        channel.exchange_declare(exchange, "x-message-deduplication", durable=True, arguments={"x-cache-size": 1000})
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange)
    finally:
        conn.close()


@pytest.mark.parametrize("exchange", ["", "dedup-exchange"], ids=["queue window", "exchange window"])
def test_the_window_survives_the_shard_leaders_death(cluster, exchange):
    queue = "dedup-failover-" + (exchange or "queue")
    declare(cluster["n1"], queue, exchange)
    group = shard_of(("/", queue), SHARDS)
    leader = cluster.leader_of(group)
    survivors = [m for m in cluster.members.values() if m.name != leader]
    publish_ids(cluster[leader], queue, range(100), exchange=exchange)  # through the leader itself
    cluster[leader].kill()

    def new_leader() -> str | None:  # (a survivor may name the dead one until it notices)
        named = cluster.leader_of(group, via=survivors[0])
        return named if named != leader else None

    wait_for(new_leader, 20, "a new leader")
    # Every id again, through both survivors, and new ones: all confirmed, only the new queued.
    publish_ids(survivors[0], queue, range(50), exchange=exchange)
    publish_ids(survivors[1], queue, range(50, 150), exchange=exchange)
    got = drain(survivors[1], queue)
    assert sorted(int(body) for body, _ in got) == list(range(150)), "each id exactly once"


@pytest.fixture
def snap_cluster(tmp_path):
    with running_cluster(tmp_path, ["--snapshot-every-mb", "1"]) as c:
        yield c


@pytest.mark.parametrize("exchange", ["", "dedup-exchange"], ids=["queue window", "exchange window"])
def test_a_member_restarted_from_its_snapshot_keeps_the_window(snap_cluster, exchange):
    queue = "dedup-snapshot"
    n1 = snap_cluster["n1"]
    declare(n1, queue, exchange)
    group = shard_of(("/", queue), SHARDS)
    publish_ids(n1, queue, range(400), BODY, exchange)  # ~1.6 MB through the queue's shard
    assert len(drain(n1, queue, quiet_s=1.0)) == 400

    def first_index() -> int:
        return {g["group"]: g for g in n1.admin("/api/cluster/status")["groups"]}[group]["first_index"]

    # Past the first 200 publishes: their entries are gone from n1's log, only its snapshot has them.
    wait_for(lambda: first_index() > 200, 30, f"n1 compacts {group}'s log")
    snap_cluster.restart("n1")
    assert "starting from the snapshot" in n1.log_text()
    # Deliveries come from the consumer's member's own replica: n1's, restored from its snapshot.
    publish_ids(n1, queue, [*range(100), 400], exchange=exchange)
    got = drain(n1, queue)
    assert [body for body, _ in got] == [b"400"]
