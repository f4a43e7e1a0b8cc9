"""x-queue-leader-locator on a cluster whose groups are on 3 of 5 members (machines/placement.py):
client-local puts a new queue in a group the declaring member leads (else holds), so its clients
skip the hop to another member; declares of one new queue racing on several members end in one
group with one machine."""

from __future__ import annotations

import sys
import threading
import urllib.parse
from pathlib import Path

import pika
import pytest

from maxq_raft.machines.placement import LOCATOR_FEATURE, hash_group

from ..helpers import api, wait_until
from .conftest import Cluster, running_cluster
from .test_held_groups import FACTOR, MEMBERS, SHARDS, held_by, queue_elsewhere

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # (as tests/jepsen: jepsen-style/ only, the repo root stays off)
from maxq_jepsen.lab import Lab, Node  # noqa: E402

GROUPS = [f"shard-{i}" for i in range(SHARDS)]


@pytest.fixture
def local_cluster(tmp_path: Path):
    """Groups on 3 of 5 members started without --queue-leader-locator: client-local is the
    default for queues declared without the argument (as RabbitMQ's)."""
    extra = ["--shards", str(SHARDS), "--replication-factor", str(FACTOR)]
    with running_cluster(tmp_path, extra, MEMBERS, hashed=False) as c:
        assert wait_until(
            lambda: all(
                any(f["name"] == LOCATOR_FEATURE and f["state"] == "enabled" for f in m.admin("/api/feature-flags"))
                for m in c.alive()
            ),
            30,
        )
        yield c


def group_of(cluster: Cluster, member: str, name: str) -> str:
    return cluster[member].admin(f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}")["group"]


def led_by(cluster: Cluster, member: str) -> set[str]:
    status = cluster[member].admin("/api/cluster/status")
    return {g["group"] for g in status["groups"] if g.get("leader") == member and g["group"] in GROUPS}


def confirmed_round_trip(cluster: Cluster, member: str, name: str, count: int = 20) -> None:
    """`count` confirmed publishes to `name` through `member`, then each consumed once there."""
    conn = cluster[member].connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        for i in range(count):
            ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        got = []
        for _ in range(count * 10):
            method, _props, body = ch.basic_get(name, auto_ack=True)
            if method is None:
                break
            got.append(body)
        assert got == [b"m%d" % i for i in range(count)]
    finally:
        conn.close()


def test_a_queue_declared_client_local_goes_in_a_group_its_member_leads_else_holds(local_cluster: Cluster) -> None:
    for member in ("n1", "n4"):
        name, hashed = queue_elsewhere(local_cluster, member, prefix=f"local-{member}-")
        led_before = led_by(local_cluster, member)
        conn = local_cluster[member].connect()
        try:
            conn.channel().queue_declare(name, durable=True)  # (the members' default: client-local)
        finally:
            conn.close()
        group = group_of(local_cluster, member, name)
        assert group != hashed and group in held_by(local_cluster[member])
        # the jepsen-style harness aims its faults at this group, not at the one the name hashes to
        assert harness_view(local_cluster).queue_group("/", name) == group
        if led_before and led_before == led_by(local_cluster, member):  # (no leadership moved meanwhile)
            assert group in led_before
            # the management API names the leader and the replicas, as RabbitMQ's quorum queues
            # (n3 may hold no replica of the group: it hears who leads it from the leader's reports
            # of the group's queues, every 5 s; CI once read n1 for node and n4 for leader)
            path = f"/api/queues/%2F/{urllib.parse.quote(name, safe='')}"
            agreed = wait_until(lambda: _naming(local_cluster["n3"].admin(path), member), 10)
            if led_before == led_by(local_cluster, member):  # (still no leadership moved)
                assert agreed, local_cluster["n3"].admin(path)
                assert len(agreed["members"]) == FACTOR and member in agreed["members"]
        assert wait_until(
            lambda: all(group_of(local_cluster, other, name) == group for other in ("n2", "n3", "n5")), 10
        )
        confirmed_round_trip(local_cluster, member, name)


def harness_view(cluster: Cluster) -> Lab:
    """The cluster as the jepsen-style harness sees it (maxq_jepsen.lab): its members' admin APIs."""
    lab = Lab()
    lab.nodes = []
    for member in cluster.alive():
        node = Node(member.name, "127.0.0.1", member.amqp_port, member.data_dir, member.log_path, [], member.http_port)
        node.proc = member.proc  # (alive: the harness asks only live members)
        lab.nodes.append(node)
    return lab


def _naming(shown: dict, member: str) -> dict | None:
    """A queue as the management API shows it, if it names `member` as its node and leader."""
    return shown if shown["node"] == shown["leader"] == member else None


def test_a_server_named_queue_goes_in_its_members_group_without_a_placement_first(local_cluster: Cluster) -> None:
    # (amq.gen- names are this member's own: nothing to agree on with other members first)
    for member in ("n2", "n5"):
        conn = local_cluster[member].connect()
        try:
            ch = conn.channel()
            name = ch.queue_declare("", exclusive=True).method.queue
            assert name.startswith("amq.gen-")
            assert group_of(local_cluster, member, name) in held_by(local_cluster[member])
            ch.confirm_delivery()
            ch.basic_publish("", name, b"reply")
            assert ch.basic_get(name, auto_ack=True)[2] == b"reply"
        finally:
            conn.close()


def test_balanced_by_argument_or_by_policy_keeps_the_hash(
    local_cluster: Cluster,
) -> None:
    name, hashed = queue_elsewhere(local_cluster, "n2", prefix="spread-")
    conn = local_cluster["n2"].connect()
    try:
        ch = conn.channel()
        ch.queue_declare(name, arguments={"x-queue-leader-locator": "balanced"})
        assert group_of(local_cluster, "n2", name) == hashed
        confirmed_round_trip(local_cluster, "n2", name)  # (through the group's leader elsewhere)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_declare("bad-locator", arguments={"x-queue-leader-locator": "nearest"})
        assert refused.value.reply_code == 406
        assert "invalid arg 'x-queue-leader-locator' for queue 'bad-locator'" in refused.value.reply_text
        assert "invalid_queue_locator_arg" in refused.value.reply_text
    finally:
        conn.close()
    policy = {"pattern": "^policy-spread-", "definition": {"queue-leader-locator": "balanced"}}
    status, _body, _ = api(local_cluster["n2"], "PUT", "/api/policies/%2F/spread", policy)
    assert status == 201
    name, hashed = queue_elsewhere(local_cluster, "n2", prefix="policy-spread-")
    conn = local_cluster["n2"].connect()
    try:
        conn.channel().queue_declare(name)
    finally:
        conn.close()
    assert group_of(local_cluster, "n2", name) == hashed


def test_one_new_queue_declared_at_once_on_several_members_lives_in_one_group(local_cluster: Cluster) -> None:
    # n1 and n3 client-local (groups of their own), n2 balanced (the hash): the first placement
    # committed stands for all three, so no member makes the queue's machine in another group.
    declarers = {"n1": {}, "n2": {"x-queue-leader-locator": "balanced"}, "n3": {}}
    names = [f"raced-{i}" for i in range(6)]
    conns = {member: local_cluster[member].connect() for member in declarers}
    try:
        for name in names:
            start = threading.Barrier(len(declarers))
            failures: list[BaseException] = []

            def declare(member: str, arguments: dict, name: str = name, start: threading.Barrier = start) -> None:
                try:
                    channel = conns[member].channel()
                    start.wait(10)
                    channel.queue_declare(name, durable=True, arguments=arguments)
                    channel.close()
                except BaseException as exc:  # (reported below)
                    failures.append(exc)

            # pika's connections are not thread-safe: each is used by its own thread only
            threads = [threading.Thread(target=declare, args=(m, a)) for m, a in declarers.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not failures and not any(t.is_alive() for t in threads)
        for name in names:
            assert wait_until(
                lambda name=name: len({group_of(local_cluster, m, name) for m in ("n1", "n2", "n3", "n4", "n5")}) == 1,
                10,
            )
            assert group_of(local_cluster, "n1", name) in GROUPS
        # every message of each queue comes out once, through any member
        for name in names:
            confirmed_round_trip(local_cluster, "n5", name, count=10)
        queues = {q["name"]: q for q in local_cluster["n4"].admin("/api/queues/%2F") if q["name"].startswith("raced-")}
        assert sorted(queues) == names and all(q["messages"] == 0 for q in queues.values())
    finally:
        for conn in conns.values():
            conn.close()


def test_a_partitioned_queue_keeps_its_partitions_in_as_many_groups(local_cluster: Cluster) -> None:
    conn = local_cluster["n1"].connect()
    try:
        conn.channel().queue_declare("orders", durable=True, arguments={"x-partitions": 3})
    finally:
        conn.close()
    names = ["orders", "amq.partition-1.orders", "amq.partition-2.orders"]
    groups = [group_of(local_cluster, "n1", name) for name in names]
    assert groups == [hash_group("/", name, GROUPS) for name in names] and len(set(groups)) == 3
