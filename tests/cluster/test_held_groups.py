"""Groups held by a few members (issue #19): 5 members, 5 shard groups, 3 replicas of each.

A member that holds no replica of a queue's group serves that queue's clients all the same:
its commands go to the group's leader, whose replies and deliveries come back to it
(server/remote.py). Every test here works through such a member, with real pika clients.
"""

from __future__ import annotations

import collections
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pika
import pika.exceptions
import pytest

from maxq_raft.machines.features import FRESH_QUEUE_STATS, SHORT_DELIVERIES, TXN_HOLDERS
from maxq_raft.machines.maintenance import FEATURE as MAINTENANCE
from maxq_raft.machines.partitions import FEATURE as PARTITIONS
from maxq_raft.server.cluster import shard_of
from maxq_raft.server.proposer import OUTCOME_WAIT_S
from tests.conftest import free_port

from ..helpers import api, publish_confirmed, wait_for, wait_until
from ..integration.test_sqs import client as sqs_client
from .conftest import Cluster, ConfirmingPublisher, Member, drain, running_cluster
from .test_maintenance import feature_enabled
from .test_partitioned_cluster import flag_enabled

MEMBERS = 5
SHARDS = 5
FACTOR = 3


@pytest.fixture
def held_cluster(tmp_path: Path):
    with running_cluster(tmp_path, ["--shards", str(SHARDS), "--replication-factor", str(FACTOR)], MEMBERS) as c:
        yield c


def held_by(member: Member) -> dict[str, list[str]]:
    """The groups `member` holds, each with its members (as its own engine has them)."""
    status = member.admin("/api/cluster/status")
    return {g["group"]: sorted(m["node"] for m in g["members"]) for g in status["groups"]}


def queue_elsewhere(cluster: Cluster, member: str, prefix: str = "q") -> tuple[str, str]:
    """A queue name whose group `member` holds no replica of, and that group."""
    held = held_by(cluster[member])
    for i in range(1000):
        name = f"{prefix}{i}"
        group = shard_of(("/", name), SHARDS)
        if group not in held:
            return name, group
    raise AssertionError("no such queue name")


def leaders_balanced(member: Member) -> bool:
    """Every group has a leader and none leads two more than another (the balancing's rule,
    machines/leader_balance.py): it moves no leadership then."""
    leads = [row["leads"] for row in member.admin("/api/cluster/status")["members"]]
    return sum(leads) == SHARDS + 1 and max(leads) - min(leads) <= 1


def recorded_replicas(member: Member, group: str) -> list[str] | None:
    """The replicas of `group` (held by `member`) as the metadata group records them."""
    status = member.admin("/api/cluster/status")
    replicas = {g["group"]: g["replicas"] for g in status["groups"]}.get(group)
    return None if replicas is None else sorted(replicas)


def holders(cluster: Cluster, group: str) -> list[str]:
    for member in cluster.alive():
        held = held_by(member)
        if group in held:
            return held[group]
    raise AssertionError(f"no member holds {group}")


def test_each_group_has_three_replicas_and_each_member_three_fifths(held_cluster: Cluster) -> None:
    replicas: dict[str, set[str]] = collections.defaultdict(set)
    for name, member in held_cluster.members.items():
        held = held_by(member)
        assert sorted(held["meta"]) == sorted(held_cluster.members)  # every member holds the metadata
        shards = [g for g in held if g != "meta"]
        assert len(shards) == SHARDS * FACTOR // MEMBERS, (name, shards)
        for group in shards:
            assert name in held[group] and len(held[group]) == FACTOR, (name, group, held[group])
            replicas[group].add(name)
    assert {g: len(m) for g, m in replicas.items()} == {f"shard-{i}": FACTOR for i in range(SHARDS)}
    # `maxqctl status`'s members, asked of any member, count every group of the cluster (they
    # counted those the answering member holds: "4/4" for each, and 0 leads for some leaders).
    wait_for(lambda: held_cluster["n1"].admin("/api/cluster/status")["placement_recorded"], 30, "placement recorded")
    for member in held_cluster.members.values():
        rows = {row["node"]: row for row in member.admin("/api/cluster/status")["members"]}
        assert {n: row["groups"] for n, row in rows.items()} == {
            n: f"{1 + SHARDS * FACTOR // MEMBERS}/{1 + SHARDS}" for n in held_cluster.members
        }, (member.name, rows)

        def leads_counted(member=member) -> bool:  # (a group held elsewhere: once its leader has said so)
            rows = member.admin("/api/cluster/status")["members"]
            return sum(row["leads"] for row in rows) == 1 + SHARDS

        wait_for(leads_counted, 15, f"every group's leader counted in {member.name}'s status")


def test_a_leadership_transfer_asked_of_a_member_without_the_group_names_its_members(held_cluster: Cluster) -> None:
    """Not 404 "no group": the group exists; the answer says where to ask (before: "no group
    'shard-3' (groups: meta, shard-0, shard-2)")."""
    _name, group = queue_elsewhere(held_cluster, "n1")
    members = holders(held_cluster, group)
    status, body, _ = api(
        held_cluster["n1"], "POST", "/api/cluster/transfer-leadership", {"group": group, "node": members[0]}
    )
    assert status == 409 and body["reason"] == "not held here" and body["members"] == members, body
    assert f"node n1 holds no replica of {group} (its members: {', '.join(members)})" in body["error"]
    refused = run_maxqctl(held_cluster["n1"], "transfer-leadership", group, members[0])
    assert refused.returncode != 0 and "holds no replica of" in refused.stderr, (refused.stdout, refused.stderr)
    assert held_by(held_cluster["n1"]).get(group) is None  # (nothing changed)
    status, body, _ = api(
        held_cluster["n1"], "POST", "/api/cluster/transfer-leadership", {"group": "shard-99", "node": "n2"}
    )
    assert status == 404 and group in body["error"].split("groups: ", 1)[1], body  # (every group of the cluster)


def test_a_member_without_the_replica_shows_a_queues_counts_and_pauses_of_now(held_cluster: Cluster) -> None:
    """Read through n1, which holds no replica of the queue's group, right after each change: the
    counts and pause rules are its leader's of now, in the queue, the vhost's list, the whole
    list, the overview's totals and `maxqctl list queues`. Before, they were the leader's last 5 s report: no message,
    no consumer and no pause rule, where a member holding the group showed them. A frozen
    leader makes the read wait at most fresh_stats.ASK_WAIT_S, then the last report is shown."""
    n1 = held_cluster["n1"]
    wait_for(lambda: flag_enabled(n1, FRESH_QUEUE_STATS), 30, "the fresh_queue_stats feature")
    name, group = queue_elsewhere(held_cluster, "n1", "fresh")
    path = f"/api/queues/%2F/{name}"
    conn = n1.connect()
    ch = conn.channel()
    ch.queue_declare(name, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, str(i).encode(), pika.BasicProperties(delivery_mode=2))
    shown = n1.admin(path)
    assert (shown["messages_ready"], shown["consumers"], shown["group"]) == (3, 0, group), shown
    assert n1.admin("/api/overview")["queue_totals"]["messages_ready"] == 3  # (the only queue with messages)

    other = held_cluster[next(m for m in holders(held_cluster, group))]  # a consumer on a holder
    consumer_conn = other.connect()
    consumer_conn.channel().basic_consume(name, lambda *_: None)  # (no ack: the 3 stay unacked)
    shown = n1.admin(path)
    assert (shown["consumers"], shown["messages_unacknowledged"]) == (1, 3), shown

    status, body, _ = api(n1, "POST", f"{path}/actions", {"action": "pause_consumers", "consumer_tag": "t"})
    assert status == 204, body
    assert n1.admin(path)["consumer_pauses"] == [{"scope": "tag", "key": "t"}]
    listed = {q["name"]: q for q in n1.admin("/api/queues")}
    assert listed[name]["consumer_pauses"] == [{"scope": "tag", "key": "t"}] and listed[name]["consumers"] == 1
    in_vhost = {q["name"]: q for q in n1.admin("/api/queues/%2F")}
    assert in_vhost[name]["messages_unacknowledged"] == 3
    status, body, _ = api(n1, "POST", f"{path}/actions", {"action": "resume_consumers", "consumer_tag": "t"})
    assert status == 204, body
    assert n1.admin(path)["consumer_pauses"] == []
    consumer_conn.close()
    table = run_maxqctl(n1, "--json", "list", "queues")
    assert table.returncode == 0, table.stderr
    row = next(q for q in json.loads(table.stdout) if q["name"] == name)
    assert (row["messages_ready"], row["consumers"]) == (3, 0), row

    leader = held_cluster[n1.admin(path)["leader"]]  # (the member n1 asks: its view of the leader)
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        status, body, _ = api(n1, "GET", path)
        waited_s = time.monotonic() - started
    finally:
        leader.proc.send_signal(signal.SIGCONT)
    assert status == 200 and body["messages_ready"] == 3, body
    assert waited_s < 3.0, waited_s
    wait_for(lambda: "did not give the counts of" in n1.log_text(), 10, "n1 to log the leader's silence")
    conn.close()


def test_a_member_without_the_replica_names_the_groups_leader_after_it_moved(held_cluster: Cluster) -> None:
    """n1 learned who leads its queue's group when it declared the queue; that leader is then
    killed and n1 proposes nothing more there. Its management API must name the new leader, as
    clients connect there (RabbitMQ's `node`/`leader`): before, the hint changed only with an
    answer to one of n1's proposals, and n1 named the dead leader for good (a CI run of the
    locator test: n3 named the leader before a balancing move, 10 s on). It hears the leader
    from the leader's reports of the group's queues (every 5 s)."""
    n1 = held_cluster["n1"]
    name, group = queue_elsewhere(held_cluster, "n1", prefix="hint")
    with n1.connect() as conn:
        conn.channel().queue_declare(name, durable=True)
    path = f"/api/queues/%2F/{name}"
    first = wait_for(lambda: n1.admin(path)["leader"], 10, "n1 names a leader")
    held_cluster[first].kill()
    survivor = held_cluster[next(m for m in holders(held_cluster, group) if m != first)]

    def named() -> dict | None:
        shown, leader = n1.admin(path), held_cluster.leader_of(group, via=survivor)
        return shown if leader not in (None, first) and shown["leader"] == shown["node"] == leader else None

    wait_for(named, 20, "n1 names the group's new leader")


def test_a_member_holding_no_replica_serves_every_basic_operation(held_cluster: Cluster) -> None:
    name, group = queue_elsewhere(held_cluster, "n1")
    conn = held_cluster["n1"].connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True)
        ch.queue_declare(name, passive=True)
        for i in range(10):
            ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        method, _props, body = ch.basic_get(name, auto_ack=False)
        assert body == b"m0" and method.message_count == 9 and not method.redelivered
        ch.basic_nack(method.delivery_tag, requeue=True)
        method, _props, body = ch.basic_get(name, auto_ack=True)
        assert body == b"m0" and method.redelivered  # it came back, flagged
        got: list[tuple[bytes, bool]] = []
        ch.basic_qos(prefetch_count=3)
        tag = ch.basic_consume(name, lambda c, m, _p, b: (got.append((b, m.redelivered)), c.basic_ack(m.delivery_tag)))
        deadline = time.monotonic() + 20
        while len(got) < 9 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert [b for b, _ in got] == [b"m%d" % i for i in range(1, 10)]
        ch.basic_cancel(tag)
        for i in range(4):
            ch.basic_publish("", name, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
        assert ch.queue_purge(name).method.message_count == 4
        assert ch.basic_get(name, auto_ack=True) == (None, None, None)
        # A full reject-publish queue refuses with a nack: the leader's reply says so.
        full, _ = queue_elsewhere(held_cluster, "n1", prefix="full")
        ch.queue_declare(full, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
        ch.basic_publish("", full, b"first")
        with pytest.raises(pika.exceptions.NackError):
            ch.basic_publish("", full, b"second")
        ch.queue_delete(full)
        # A refusal of the queue's machine comes back as the channel error it is.
        ch.basic_consume(name, lambda *_: None, exclusive=True)
        other = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            other.basic_consume(name, lambda *_: None)
        assert refused.value.reply_code == 403
        ch.queue_delete(name)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            conn.channel().queue_declare(name, passive=True)
        assert gone.value.reply_code == 404
    finally:
        conn.close()
    assert group not in held_by(held_cluster["n1"])  # (it was served through the group's leader)


def test_the_management_api_of_a_member_without_the_replica_shows_the_queue_and_its_counts(
    held_cluster: Cluster,
) -> None:
    name, group = queue_elsewhere(held_cluster, "n1")
    holder = holders(held_cluster, group)[0]
    conn = held_cluster["n1"].connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True)
        for i in range(7):
            ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=2)
        got: list[bytes] = []
        ch.basic_consume(name, lambda _c, _m, _p, b: got.append(b))  # never acked: 2 stay unacked
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert len(got) == 2
        path = f"/api/queues/%2F/{name}"

        def counts(member: str) -> tuple | None:
            view = held_cluster[member].admin(path)
            shown = (view["messages"], view["messages_ready"], view["messages_unacknowledged"], view["consumers"])
            return shown if shown == (7, 5, 2, 1) else None

        wait_for(lambda: counts(holder), 10, "the counts on a member holding the queue's group")
        # n1 holds no replica: its leader sends the counts every 5 s (server/queue_stats.py)
        wait_for(lambda: counts("n1"), 15, "the counts on a member without the queue's replica")
        view = held_cluster["n1"].admin(path)
        assert view["node"] in holders(held_cluster, group) and view["group"] == group
        listed = {q["name"]: q for q in held_cluster["n1"].admin("/api/queues")}
        assert listed[name]["messages_ready"] == 5
        assert name in {q["name"] for q in held_cluster["n1"].admin("/api/queues/%2F")}
        totals = held_cluster["n1"].admin("/api/overview")
        assert totals["queue_totals"]["messages"] >= 7 and totals["object_totals"]["queues"] >= 1
    finally:
        conn.close()
    with held_cluster["n1"].connect() as closing:
        closing.channel().queue_delete(name)
    wait_for(lambda: name not in {q["name"] for q in held_cluster["n1"].admin("/api/queues")}, 10, "the queue gone")


def test_checks_and_counts_through_a_member_without_the_replicas_read_them_as_of_a_commit(
    held_cluster: Cluster,
) -> None:
    """A delete if-empty or if-unused, and a partitioned queue's declare-ok and get-ok counts,
    read what a member holding no replica of the queue's group (of a partition's) last heard of
    it: the leader's report every 5 s, or the last Sync. Before they were synced first, the admin
    API deleted a queue holding 5 confirmed messages "if empty", and a partition's messages were
    missing from the counts (found with the AMQP suite against 5 members at factor 3)."""
    n1 = held_cluster["n1"]
    name, _group = queue_elsewhere(held_cluster, "n1", prefix="checked")
    path = f"/api/queues/%2F/{name}"
    conn = n1.connect()
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True)  # (its count, 0, is what n1 last heard)
        for i in range(5):
            ch.basic_publish("", name, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        status, body, _ = api(n1, "DELETE", path + "?if-empty=true")
        assert status == 400 and "not empty" in body["reason"], (status, body)
        ch.basic_consume(name, lambda *_: None)
        status, body, _ = api(n1, "DELETE", path + "?if-unused=true")
        assert status == 400 and "in use" in body["reason"], (status, body)
        assert ch.queue_declare(name, passive=True).method.message_count == 0  # (all 5 with the consumer)

        wait_for(lambda: flag_enabled(n1, PARTITIONS), 60, "the partitions flag")
        partitioned = f"parts-{name}"
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(partitioned, durable=True, arguments={"x-partitions": 4})
        names = [partitioned] + [f"amq.partition-{i}.{partitioned}" for i in range(1, 4)]
        groups = {n1.admin("/api/queues/%2F/" + q)["group"] for q in names}
        assert groups - set(held_by(n1)), groups  # (4 groups of 5, n1 holds 3: one at least elsewhere)
        for i in range(40):
            props = pika.BasicProperties(delivery_mode=2, headers={"x-partition-key": f"k{i % 8}"})
            ch.basic_publish("", partitioned, b"p%d" % i, props)
        assert ch.queue_declare(partitioned, passive=True).method.message_count == 40
        method, _props, _body = ch.basic_get(partitioned, auto_ack=True)
        assert method.message_count == 39
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.queue_delete(partitioned, if_empty=True)
        assert refused.value.reply_code == 406 and "not empty" in refused.value.reply_text
        status, body, _ = api(n1, "DELETE", f"/api/queues/%2F/{partitioned}?if-empty=true")
        assert status == 400 and "not empty" in body["reason"], (status, body)
        assert conn.channel().queue_declare(partitioned, passive=True).method.message_count == 39
    finally:
        conn.close()


def test_a_transaction_decided_through_a_member_without_its_queues_replica_reaches_the_queue(
    held_cluster: Cluster,
) -> None:
    """A commit through n1 of halves in a queue whose group n1 holds no replica of: n1 sees no
    queue holding them, so it answered 404 to a connection that had not published them, and a
    confirmed commit left the halves unresolved until the group's leader came to them (found
    with the transactions suite against 5 members at factor 3). It asks the groups it does not
    hold (TxnHolders), and the confirm waits for their queues as for its own."""
    n1 = held_cluster["n1"]
    wait_for(lambda: flag_enabled(n1, TXN_HOLDERS), 60, "the txn_holders flag")
    name, group = queue_elsewhere(held_cluster, "n1", prefix="txn")
    holder = held_cluster[holders(held_cluster, group)[0]]

    def half(channel, body: bytes, txn_id: str) -> None:
        channel.basic_publish(
            "", name, body, pika.BasicProperties(delivery_mode=2, headers={"x-transaction-id": txn_id})
        )

    def commit(channel, txn_id: str) -> None:
        props = pika.BasicProperties(headers={"x-transaction-action": "commit"})
        channel.basic_publish("amq.maxq.transaction", txn_id, b"", props)

    on_holder, on_n1 = holder.connect(), n1.connect()
    try:
        h = on_holder.channel()
        h.confirm_delivery()
        h.queue_declare(name, durable=True)
        half(h, b"a1", "txn-a")
        half(h, b"a2", "txn-a")
        ch = on_n1.channel()
        ch.confirm_delivery()
        assert ch.queue_declare(name, passive=True).method.message_count == 0  # (halves are not ready)
        commit(ch, "txn-a")  # n1's connection published none of its halves
        assert ch.queue_declare(name, passive=True).method.message_count == 2
        half(ch, b"b1", "txn-b")  # halves through n1 itself
        commit(ch, "txn-b")
        assert ch.queue_declare(name, passive=True).method.message_count == 3
        got = [ch.basic_get(name, auto_ack=True)[2] for _ in range(3)]
        assert got == [b"a1", b"a2", b"b1"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as unknown:
            commit(ch, "txn-never-published")
        assert unknown.value.reply_code == 404
    finally:
        on_holder.close()
        on_n1.close()


def leaders_and_members(cluster: Cluster) -> dict[str, tuple[str, list[str]]]:
    """Each shard group's leader and members, as a member holding it sees them."""
    seen: dict[str, tuple[str, list[str]]] = {}
    for member in cluster.alive():
        for g in member.admin("/api/cluster/status")["groups"]:
            if g["group"] != "meta" and g.get("leader"):
                seen.setdefault(g["group"], (g["leader"], sorted(m["node"] for m in g["members"])))
    return seen


def test_a_transaction_in_queues_of_groups_whose_leaders_see_only_their_own_is_checked_once_per_attempt(
    held_cluster: Cluster,
) -> None:
    """Halves in queues A and B (A first by name) of two groups, where B's group's leader holds
    no replica of A's: each leader saw only its own queue, took it for the transaction's first,
    and both sent every check (two per attempt). A leader holding fewer groups asks the others
    (TxnHolders) before it sends."""
    n1 = held_cluster["n1"]
    wait_for(lambda: flag_enabled(n1, TXN_HOLDERS), 60, "the txn_holders flag")
    layout = wait_for(
        lambda: (lambda s: s if len(s) == SHARDS else None)(leaders_and_members(held_cluster)), 30, "leaders"
    )
    names = [f"txc{i}" for i in range(200)]
    pair = next(
        (a, b)
        for a in names
        for b in names
        if a < b
        and shard_of(("/", a), SHARDS) != shard_of(("/", b), SHARDS)
        and layout[shard_of(("/", b), SHARDS)][0] not in layout[shard_of(("/", a), SHARDS)][1]
    )
    checks = "txc-checks"
    conn = n1.connect()
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for name in (*pair, checks):
            channel.queue_declare(name, durable=True)
        txn_id = "txn-checked-once"
        headers = {"x-transaction-id": txn_id, "x-transaction-timeout": 1500, "x-transaction-checks": 10}
        for name in pair:
            properties = pika.BasicProperties(delivery_mode=2, headers=headers, reply_to=checks)
            channel.basic_publish("", name, name.encode(), properties)
        attempts: list[tuple[int, str]] = []
        deadline = time.monotonic() + 30
        while len({a for a, _q in attempts}) < 3 and time.monotonic() < deadline:
            method, props, _body = channel.basic_get(checks, auto_ack=True)
            if method is None:
                time.sleep(0.1)
                continue
            attempts.append((props.headers["x-transaction-check-attempt"], props.headers["x-transaction-queue"]))
        time.sleep(0.5)  # (a second copy of the last attempt would be here by now)
        while (got := channel.basic_get(checks, auto_ack=True))[0] is not None:
            attempts.append((got[1].headers["x-transaction-check-attempt"], got[1].headers["x-transaction-queue"]))
        numbers = [a for a, _q in attempts]
        assert numbers[:3] == [1, 2, 3] and len(numbers) == len(set(numbers)), (pair, attempts)
        assert {q for _a, q in attempts} == {pair[0]}, (pair, attempts)  # (from the first holder, by name)
        channel.basic_publish(
            "amq.maxq.transaction", txn_id, b"", pika.BasicProperties(headers={"x-transaction-action": "rollback"})
        )
    finally:
        conn.close()


def test_an_auto_delete_queue_goes_when_its_consumers_member_is_declared_down(held_cluster: Cluster) -> None:
    """The metadata group's leader declares a silent member down and then deletes the auto-delete
    queues its consumers leave without one. It looked only at the queues of groups it holds: one
    in a group it holds no replica of stayed for good (found reading server/cluster.py for what
    else sees only the groups a member holds)."""
    leader = held_cluster.leader_of("meta")
    assert leader is not None
    name, _group = queue_elsewhere(held_cluster, leader, prefix="auto")
    member = next(m.name for m in held_cluster.alive() if m.name != leader)
    conn = held_cluster[member].connect()
    ch = conn.channel()
    ch.queue_declare(name, auto_delete=True)
    ch.basic_consume(name, lambda *_: None)
    conn.process_data_events(0.2)
    assert name in {q["name"] for q in held_cluster[leader].admin("/api/queues")}
    held_cluster[member].kill()
    wait_for(
        lambda: name not in {q["name"] for q in held_cluster[leader].admin("/api/queues")},
        30,
        f"the auto-delete queue gone after {member} was declared down",
    )


def test_queue_settings_act_through_a_member_without_the_replica(held_cluster: Cluster) -> None:
    """A policy set on n1 reaches a queue whose group n1 does not hold; a redeclare on n1
    restarts its x-expires; n1 holds its publishers to its x-publish-rate-limit."""
    n1 = held_cluster["n1"]
    capped, _ = queue_elsewhere(held_cluster, "n1", prefix="capped-")
    expiring, _ = queue_elsewhere(held_cluster, "n1", prefix="expiring-")
    limited, _ = queue_elsewhere(held_cluster, "n1", prefix="limited-")
    # Publishes through n1 are confirmed once their group's leader says they were applied; one
    # whose leadership the balancing moved between commit and apply is in doubt (320, by
    # design). Seen in a fresh-clone CI run: a move 5 s after the start closed this connection.
    wait_for(lambda: leaders_balanced(n1), 30, "the leaders spread")
    with n1.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(capped, durable=True)
        for i in range(5):
            ch.basic_publish("", capped, b"%d" % i, pika.BasicProperties(delivery_mode=2))
        policy = {"pattern": "^capped-", "definition": {"max-length": 2}}
        status, _body, _auth = api(n1, "PUT", "/api/policies/%2F/cap", policy)
        assert status in (201, 204)
        # the policy's max-length (drop-head), set after the queue was made: its machine, on other
        # members, drops to 2
        wait_for(lambda: ch.queue_declare(capped, passive=True).method.message_count == 2, 10, "the policy applied")

        ch.queue_declare(expiring, arguments={"x-expires": 3000})
        ch.basic_publish("", expiring, b"kept")  # (a queue made again after expiring would be empty)
        got, _props, _body = ch.basic_get(expiring)  # a get: the queue was last used now
        ch.basic_nack(got.delivery_tag, requeue=True)
        for _ in range(6):  # 6 s of redeclares, each restarting the 3 s
            time.sleep(1.0)
            ch.queue_declare(expiring, arguments={"x-expires": 3000})
        assert ch.queue_declare(expiring, passive=True).method.message_count == 1  # the same queue

        ch.queue_declare(limited, arguments={"x-publish-rate-limit": 20})
        started = time.monotonic()
        for i in range(60):
            ch.basic_publish("", limited, b"%d" % i)
        took = time.monotonic() - started
        # 60 at 20 per second (a bucket of one second's worth first): at least about 2 s
        assert took >= 1.5, took
        ch.queue_delete(capped)
        ch.queue_delete(limited)
    api(n1, "DELETE", "/api/policies/%2F/cap")


def test_a_consumer_without_a_replica_gets_a_prefetch_window_of_large_messages(held_cluster: Cluster) -> None:
    # 100 x 64 KiB in one window: the leader's message to n1 is 6.4 MB, over the engine's cap of
    # about 1 MiB per message; before fragments it was dropped (and its resync too), and the
    # consumer got nothing.
    name, _group = queue_elsewhere(held_cluster, "n1")
    body = bytes(range(256)) * 256
    with held_cluster["n1"].connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True)
        for _ in range(100):
            ch.basic_publish("", name, body, pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=100)
        got: list[bytes] = []
        ch.basic_consume(name, lambda c, m, _p, b: (got.append(b), c.basic_ack(m.delivery_tag)))
        deadline = time.monotonic() + 20
        while len(got) < 100 and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        assert len(got) == 100 and set(got) == {body}
        ch.queue_delete(name)


def test_a_consumer_without_a_replica_gets_the_properties_and_the_delivery_count_header(held_cluster: Cluster) -> None:
    """Deliveries cross as short records (SHORT_DELIVERIES, enabled once every member runs this
    release): what the channel writes is all there, x-delivery-count of a returned message too."""
    n1 = held_cluster["n1"]
    wait_for(
        lambda: any(f["name"] == SHORT_DELIVERIES and f["state"] == "enabled" for f in n1.admin("/api/feature-flags")),
        20,
        "short_deliveries enabled",
    )
    name, _group = queue_elsewhere(held_cluster, "n1")
    props = pika.BasicProperties(delivery_mode=2, content_type="text/plain", headers={"k": "v"}, message_id="id-1")
    with n1.connect() as conn:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(name, durable=True, arguments={"x-delivery-limit": 5})
        ch.basic_publish("", name, b"body", props)
        got: list[tuple] = []
        ch.basic_qos(prefetch_count=1)
        ch.basic_consume(name, lambda _c, m, p, b: got.append((m, p, b)))
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        method, first, body = got.pop()
        assert (body, method.exchange, method.routing_key, method.redelivered) == (b"body", "", name, False)
        assert (first.content_type, first.message_id, first.headers) == ("text/plain", "id-1", {"k": "v"})
        ch.basic_nack(method.delivery_tag, requeue=True)
        while not got and time.monotonic() < deadline:
            conn.process_data_events(0.1)
        method, again, body = got.pop()
        assert body == b"body" and method.redelivered
        assert again.headers == {"k": "v", "x-delivery-count": 1} and again.message_id == "id-1"
        ch.basic_ack(method.delivery_tag)
        ch.queue_delete(name)


def test_a_consumer_without_a_replica_gets_every_message_across_a_kill_of_the_groups_leader(
    held_cluster: Cluster,
) -> None:
    name, group = queue_elsewhere(held_cluster, "n1")
    publisher_member = next(m for m in holders(held_cluster, group) if m != "n1")
    conn = held_cluster["n1"].connect(heartbeat=0)
    got: list[tuple[bytes, bool]] = []
    try:
        ch = conn.channel()
        ch.queue_declare(name, durable=True)
        ch.basic_qos(prefetch_count=20)
        ch.basic_consume(name, lambda c, m, _p, b: (got.append((b, m.redelivered)), c.basic_ack(m.delivery_tag)))
        publisher = ConfirmingPublisher([m for n, m in held_cluster.members.items() if n != "n1"], name, pause_s=0.002)
        publisher.start()
        deadline = time.monotonic() + 10
        while len(got) < 200 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        leader = held_cluster.leader_of(group, via=held_cluster[publisher_member])
        assert leader is not None and leader != "n1"
        held_cluster[leader].kill()
        deadline = time.monotonic() + 15
        before = len(got)
        while len(got) < before + 300 and time.monotonic() < deadline:
            conn.process_data_events(0.05)
        publisher.stop_flag.set()
        publisher.join(30)
        confirmed = publisher.confirmed_numbers()
        deadline = time.monotonic() + 30
        while not confirmed <= {int(b) for b, _ in got} and time.monotonic() < deadline:
            conn.process_data_events(0.1)
    finally:
        conn.close()
    numbers = [int(b) for b, _ in got]
    assert confirmed and confirmed <= set(numbers), sorted(confirmed - set(numbers))[:20]
    counts = collections.Counter(numbers)
    # A second copy is a redelivery (the new leader's resync, or a message the killed leader had
    # sent that was requeued), flagged so; none comes twice unflagged.
    seen: set[int] = set()
    for number, redelivered in [(int(b), r) for b, r in got]:
        assert number not in seen or redelivered, f"{number} came again unflagged"
        seen.add(number)
    assert len(got) - len(counts) <= 40, counts.most_common(5)


def test_acks_a_member_gave_up_while_the_group_had_no_quorum_are_applied_once_it_has(held_cluster: Cluster) -> None:
    """Acks are cast (no caller waits for them): when their entry could not commit for
    OUTCOME_WAIT_S it was given up and they were lost, so the acked messages stayed checked out
    to a consumer that lived on; its prefetch stayed full and it got nothing more until its
    channel closed (then they came again). Given up, they are proposed again now."""
    name, group = queue_elsewhere(held_cluster, "n1")
    stopped = [held_cluster[m] for m in holders(held_cluster, group)[:2]]  # (n1 holds none of it)
    conn = held_cluster["n1"].connect(heartbeat=0)
    got: list[tuple[bytes, int]] = []
    try:
        ch = conn.channel()
        ch.queue_declare(name, durable=True)
        ch.confirm_delivery()
        for i in range(5):
            ch.basic_publish("", name, b"before %d" % i, pika.BasicProperties(delivery_mode=2))
        ch.basic_qos(prefetch_count=5)
        ch.basic_consume(name, lambda _c, m, _p, b: got.append((b, m.delivery_tag)))
        wait_for(lambda: len(got) == 5, 15, "the first five", connections=[conn])
        for member in stopped:
            member.proc.send_signal(signal.SIGSTOP)
        try:
            # (the metadata group, on all five members, keeps its majority: n1 keeps its clients)
            ch.basic_ack(got[-1][1], multiple=True)
            before = held_cluster["n1"].log_text().count("commands not committed")
            # Given up at the first failed attempt after OUTCOME_WAIT_S; an attempt made just
            # before it ends may wait up to the engine's own deadline for a proposal (10 s) for
            # its answer (CI, 2026-12-07: nothing given up 13 s after the ack, where this waited 12)
            wait_for(
                lambda: held_cluster["n1"].log_text().count("commands not committed") > before,
                OUTCOME_WAIT_S + 10.0 + 5.0,
                "n1 to give the acks up",
                step_s=0.2,
                connections=[conn],
            )
        finally:
            for member in stopped:
                member.proc.send_signal(signal.SIGCONT)
        assert conn.is_open
        with held_cluster["n1"].connect() as other:
            publisher = other.channel()
            publisher.confirm_delivery()
            publisher.basic_publish("", name, b"after", pika.BasicProperties(delivery_mode=2))
        wait_for(lambda: len(got) == 6, 30, "a delivery after the acks", connections=[conn])
        assert got[5][0] == b"after"
        ch.basic_ack(got[5][1])
        conn.process_data_events(0.5)
    finally:
        conn.close()
    assert drain(held_cluster["n1"], name, quiet_s=2.0) == [], "the acked messages came again"


def test_a_kill_of_any_member_under_confirmed_load_loses_nothing(held_cluster: Cluster) -> None:
    name, group = queue_elsewhere(held_cluster, "n1")
    with held_cluster["n1"].connect() as conn:
        conn.channel().queue_declare(name, durable=True)
    members = list(held_cluster.members.values())
    publisher = ConfirmingPublisher(members, name, pause_s=0.002)
    publisher.start()
    try:
        for victim in ["n1", *holders(held_cluster, group)]:
            time.sleep(1.5)
            held_cluster[victim].kill()
            time.sleep(1.5)
            held_cluster[victim].launch()
            held_cluster[victim].wait_ready(60)
        time.sleep(1.0)
    finally:
        publisher.stop_flag.set()
        publisher.join(30)
    confirmed = publisher.confirmed_numbers()
    assert len(confirmed) > 100, (len(confirmed), publisher.errors[-5:])

    got = drain(held_cluster["n1"], name)
    numbers = {int(b) for b, _ in got}
    assert confirmed <= numbers, sorted(confirmed - numbers)[:20]


def test_direct_reply_to_and_an_sqs_long_poll_on_a_member_without_a_replica(held_cluster: Cluster) -> None:
    # Direct reply-to: a reply passes through the shard its key hashes to (cluster.reply_elsewhere);
    # channels are opened until a key lands in one n1 holds no replica of, whose leader sends it on.
    held = held_by(held_cluster["n1"])
    requests, _ = queue_elsewhere(held_cluster, "n2", prefix="rpc")
    with held_cluster["n2"].connect() as server_conn, held_cluster["n1"].connect() as client_conn:
        server = server_conn.channel()
        server.queue_declare(requests)
        routed_elsewhere = 0
        for attempt in range(40):
            client = client_conn.channel()
            replies: list[bytes] = []
            client.basic_consume("amq.rabbitmq.reply-to", lambda _c, _m, _p, b: replies.append(b), auto_ack=True)
            client.basic_publish(
                "", requests, b"ping %d" % attempt, pika.BasicProperties(reply_to="amq.rabbitmq.reply-to")
            )
            method, props, body = None, None, None
            deadline = time.monotonic() + 10
            while method is None and time.monotonic() < deadline:
                method, props, body = server.basic_get(requests, auto_ack=True)
            assert method is not None
            key = props.reply_to.removeprefix("amq.rabbitmq.reply-to.")
            server.basic_publish("", props.reply_to, b"pong " + body)
            deadline = time.monotonic() + 10
            while not replies and time.monotonic() < deadline:
                client_conn.process_data_events(0.05)
            assert replies == [b"pong ping %d" % attempt]
            client.close()
            if f"shard-{zlib.crc32(key.encode()) % SHARDS}" not in held:
                routed_elsewhere += 1
                if routed_elsewhere == 2:
                    break
        assert routed_elsewhere == 2  # (the case that matters came up)
    # An SQS long poll on n1 for a queue whose group n1 does not hold gets a message sent later
    # on another member within the poll's wait.
    status, key, _ = api(held_cluster["n1"], "POST", "/api/users/guest/access-keys")
    assert status == 201, key
    polled, _ = queue_elsewhere(held_cluster, "n1", prefix="poll")
    n1 = sqs_client(held_cluster["n1"], key["access_key_id"], key["secret_access_key"])
    n2 = sqs_client(held_cluster["n2"], key["access_key_id"], key["secret_access_key"])
    url = n1.create_queue(QueueName=polled)["QueueUrl"]
    sent_at: list[float] = []

    def send_later() -> None:
        time.sleep(1.5)
        sent_at.append(time.monotonic())
        n2.send_message(QueueUrl=n2.get_queue_url(QueueName=polled)["QueueUrl"], MessageBody="late")

    sender = threading.Thread(target=send_later)
    sender.start()
    started = time.monotonic()
    got = n1.receive_message(QueueUrl=url, WaitTimeSeconds=10, MaxNumberOfMessages=1)
    sender.join()
    assert [m["Body"] for m in got.get("Messages", [])] == ["late"]
    assert time.monotonic() - started < 8  # (answered on the message, not at the poll's end)
    # Its attributes on n1 at once: the counts its group's leader has now (http/fresh_stats.py),
    # not its last 5 s report (server/queue_stats.py)
    for body in ("a", "b", "c"):
        n2.send_message(QueueUrl=url, MessageBody=body)
    n2.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=60)

    def approximate() -> dict | None:
        attributes = n1.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        counts = {k: attributes[k] for k in attributes if k.startswith("ApproximateNumberOf")}
        wanted = {
            "ApproximateNumberOfMessages": "3",
            "ApproximateNumberOfMessagesNotVisible": "1",  # "late", received and not deleted
            "ApproximateNumberOfMessagesDelayed": "1",
        }
        return counts if counts == wanted else None

    assert approximate() is not None, n1.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])


class Consumer:
    """A consumer on one member, pumped by the test thread: every delivery as (number, redelivered)."""

    def __init__(self, member: Member, queue: str) -> None:
        self.conn = member.connect(heartbeat=0)
        channel = self.conn.channel()
        channel.basic_qos(prefetch_count=20)
        self.got: list[tuple[int, bool]] = []
        channel.basic_consume(
            queue, lambda c, m, _p, b: (self.got.append((int(b), m.redelivered)), c.basic_ack(m.delivery_tag))
        )

    def pump_while(self, busy: Callable[[], bool], limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while busy() and time.monotonic() < deadline:
            self.conn.process_data_events(0.05)

    def check(self, confirmed: set[int], cluster: Cluster, queue: str, doubted: Sequence[int] = ()) -> None:
        """Every confirmed number came; a second copy of one only flagged redelivered. (What did
        not come is looked for in the queue, once this consumer is closed: held, or lost.)"""
        self.pump_while(lambda: not confirmed <= {n for n, _ in self.got}, 30)
        numbers = {n for n, _ in self.got}
        if not confirmed <= numbers:
            self.conn.close()
            # (through n1, the consumer's member: the test may have drained or stopped another,
            # and a drained one closes new connections, which hid this assertion once in CI)
            left = {int(b): redelivered for b, redelivered in drain(cluster["n1"], queue)}
            missing = confirmed - numbers
            queued = missing & left.keys()
            raise AssertionError(
                f"{len(missing)} confirmed not delivered ({sorted(missing)[:10]}); "
                f"{len(queued)} of them still queued once the consumer closed, "
                f"{sum(left[n] for n in queued)} of those redelivered (checked out to it, then)"
            )
        assert confirmed and confirmed <= numbers, sorted(confirmed - numbers)[:20]
        seen: set[int] = set()
        for number, redelivered in self.got:
            assert number not in seen or redelivered, f"{number} came again unflagged"
            seen.add(number)
        behind, excused = fifo_breaks(self.got, confirmed)
        assert not behind, (
            f"{len(behind)} confirmed delivered after a later one, e.g. {behind[:5]} "
            f"({len(excused)} unconfirmed so, e.g. {excused[:5]}; the publisher's in doubt: {list(doubted)[:10]})"
        )


def fifo_breaks(got: list[tuple[int, bool]], confirmed: set[int]) -> tuple[list, list]:
    """Pairs (higher, lower) where `lower` was first delivered after `higher`: those whose
    `lower` was confirmed, which broke the queue's FIFO, and the others.

    A confirmed number was confirmed before any higher one was published, so its first delivery
    (not flagged redelivered) after a higher number's broke FIFO. One in doubt promised nothing:
    the connection it went out on closed before its confirm (a drain closes its member's
    clients), its forward could still be on the way while the publisher went on through another
    member, and be enqueued after the next ones."""
    highest = -1
    behind: list[tuple[int, int]] = []
    excused: list[tuple[int, int]] = []
    for number, redelivered in got:
        if redelivered:
            continue
        if number < highest:
            (behind if number in confirmed else excused).append((highest, number))
        highest = max(highest, number)
    return behind, excused


def test_fifo_breaks_are_confirmed_numbers_first_delivered_after_a_higher_one() -> None:
    got = [(1, False), (3, False), (2, False), (3, True), (2, True), (4, False), (6, False), (5, False)]
    assert fifo_breaks(got, {1, 2, 3, 4, 6}) == ([(3, 2)], [(6, 5)])  # 5 was in doubt
    assert fifo_breaks(got, {1, 2, 3, 4, 5, 6}) == ([(3, 2), (6, 5)], [])
    # redeliveries are not first deliveries: a higher one redelivered first breaks nothing
    assert fifo_breaks([(2, True), (1, False), (2, False)], {1, 2}) == ([], [])


@contextlib.contextmanager
def confirmed_load(cluster: Cluster, queue: str) -> Iterator[Consumer]:
    """A consumer on n1 and a confirming publisher through the other members for the block;
    after it, every confirmed message must have reached the consumer (Consumer.check)."""
    consumer = Consumer(cluster["n1"], queue)
    publisher = ConfirmingPublisher([m for n, m in cluster.members.items() if n != "n1"], queue, pause_s=0.002)
    publisher.start()
    try:
        consumer.pump_while(lambda: len(consumer.got) < 100, 20)
        yield consumer
        consumer.pump_while(lambda: True, 2)
    finally:
        publisher.stop_flag.set()
        publisher.join(30)
    consumer.check(publisher.confirmed_numbers(), cluster, queue, publisher.doubted)
    consumer.conn.close()


def run_maxqctl(member: Member, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "maxqctl"), "--node", f"127.0.0.1:{member.http_port}", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def in_background(consumer: Consumer, call: Callable[[], subprocess.CompletedProcess]) -> subprocess.CompletedProcess:
    """`call()` on a thread while the consumer is pumped here (maxqctl waits for the moves)."""
    box: list = []
    worker = threading.Thread(target=lambda: box.append(call()))
    worker.start()
    consumer.pump_while(worker.is_alive, 300)
    worker.join(1)
    return box[0]


def move_onto_and_off_the_consumers_member(cluster: Cluster) -> tuple[str, list[str]]:
    """Under confirmed load with a consumer on n1, a queue's group is moved onto n1 and back:
    the consumer's connection stays open and it gets every confirmed message (`confirmed_load`).
    Returns the group and its members before."""
    name, group = queue_elsewhere(cluster, "n1")
    before = holders(cluster, group)
    with cluster["n1"].connect() as conn:
        conn.channel().queue_declare(name, durable=True)
    with confirmed_load(cluster, name) as consumer:
        target = [before[0], before[1], "n1"]
        dry = run_maxqctl(cluster["n1"], "move-group", group, "--to", ",".join(target), "--dry-run")
        assert dry.returncode == 0 and f"{group}: {before[2]} -> n1" in dry.stdout, dry
        assert holders(cluster, group) == before  # (a dry run changes nothing)
        moved = in_background(
            consumer, lambda: run_maxqctl(cluster["n2"], "move-group", group, "--to", ",".join(target))
        )
        assert moved.returncode == 0, (moved.stdout, moved.stderr)
        assert sorted(held_by(cluster["n1"])[group]) == sorted(target)  # n1 applies it now
        consumer.pump_while(lambda: True, 2)
        # The metadata group's record follows the move (server/watchdog.py, `_record_placement`).
        wait_for(lambda: recorded_replicas(cluster["n1"], group) == sorted(target), 15, "the move recorded")
        back = in_background(
            consumer, lambda: run_maxqctl(cluster["n1"], "move-group", group, "--to", ",".join(before))
        )
        assert back.returncode == 0, (back.stdout, back.stderr)
        assert group not in held_by(cluster["n1"]) and holders(cluster, group) == sorted(before)
    return group, before


def test_a_queues_group_moves_onto_and_off_its_consumers_member_under_load(held_cluster: Cluster) -> None:
    group, before = move_onto_and_off_the_consumers_member(held_cluster)
    refused = run_maxqctl(held_cluster["n1"], "move-group", group, "--to", "n1,n2,n9")
    assert refused.returncode == 4 and "not members of the cluster: n9" in refused.stderr, refused
    status, answer, _ = api(held_cluster["n1"], "POST", "/api/cluster/move-group", {"group": "meta", "add": "n1"})
    assert status == 409, answer
    status, answer, _ = api(held_cluster["n1"], "POST", "/api/cluster/move-group", {"group": group, "add": before[0]})
    assert status == 409 and "holds" in json.dumps(answer), answer
    # As between a move's addition and its removal: a fourth replica; a second addition now is
    # refused (busy), the removal that ends it is not.
    status, answer, _ = api(held_cluster["n1"], "POST", "/api/cluster/move-group", {"group": group, "add": "n1"})
    assert status == 200 and sorted(answer["members"]) == sorted([*before, "n1"]), answer
    others = [m for m in held_cluster.members if m not in before and m != "n1"]
    status, answer, _ = api(held_cluster["n2"], "POST", "/api/cluster/move-group", {"group": group, "add": others[0]})
    assert status == 409 and "busy" in json.dumps(answer), answer
    status, answer, _ = api(
        held_cluster[before[0]], "POST", "/api/cluster/move-group", {"group": group, "remove": "n1"}
    )
    assert status == 200 and sorted(answer["members"]) == sorted(before), answer


def test_a_group_with_a_compacted_log_moves_onto_its_consumers_member_without_closing_its_clients(
    tmp_path: Path,
) -> None:
    """A learner whose group's log was compacted catches up from a snapshot; its member went on
    serving its clients from other groups and from the group's leader meanwhile, so it must not
    close them (it did: every move of such a group onto a member closed all that member's
    connections with 320 "caught up from a snapshot")."""
    extra = ["--shards", str(SHARDS), "--replication-factor", str(FACTOR), "--snapshot-every-mb", "0.02"]
    with running_cluster(tmp_path, extra, MEMBERS) as cluster:
        bystander = cluster["n1"].connect(heartbeat=0)  # a client of nothing in the moved group
        bystander.channel().queue_declare("bystander", durable=True)
        group, _before = move_onto_and_off_the_consumers_member(cluster)
        assert f"group {group}: installing the snapshot at index" in cluster["n1"].log_text()
        assert bystander.is_open
        bystander.channel().queue_declare("bystander", durable=True, passive=True)
        bystander.close()


def test_a_drain_under_confirmed_load_leaves_the_member_no_group_and_no_client(held_cluster: Cluster) -> None:
    name, group = queue_elsewhere(held_cluster, "n1")
    victim = next(m for m in holders(held_cluster, group) if m != "n1")
    with held_cluster["n1"].connect() as conn:
        conn.channel().queue_declare(name, durable=True)
    # (the metadata leader enables maintenance mode once every member announced it: on a busy
    # machine that can take longer than the cluster's start; a drain before it is refused, 409)
    wait_for(lambda: feature_enabled(held_cluster["n1"]), 60, f"the {MAINTENANCE} flag")
    idle = held_cluster[victim].connect()  # a client of the drained member: closed by the drain
    with confirmed_load(held_cluster, name) as consumer:
        refused = run_maxqctl(held_cluster["n1"], "remove-node", victim)
        assert refused.returncode == 4 and "drain-replicas" in refused.stderr, refused
        dry = run_maxqctl(held_cluster["n1"], "drain", victim, "--dry-run")
        assert dry.returncode == 0 and "its replicas would move" in dry.stdout, dry
        assert victim in holders(held_cluster, group)
        drained = in_background(consumer, lambda: run_maxqctl(held_cluster["n1"], "drain", victim))
        assert drained.returncode == 0, (drained.stdout, drained.stderr)
        assert "holds no replica" in drained.stdout
    assert not idle.is_open or not _alive(idle)
    if group in held_by(held_cluster["n1"]):
        # The drain moved the queue's group onto its consumer's member: a learner there for less
        # than the watch's 0.2 s went unseen, and a delivery it applied as a learner (which its
        # leader left to it) never came (cluster.py `_promoted`; this test failed so in CI once,
        # and 2 runs in 13 beside another cluster test).
        assert f"{group}: this member now holds a replica of it" in held_cluster["n1"].log_text()
    held = held_by(held_cluster[victim])
    assert list(held) == ["meta"], held
    status = held_cluster["n1"].admin("/api/cluster/status")
    assert not [g["group"] for g in status["groups"] if g["leader"] == victim]
    loads = held_cluster["n1"].admin("/api/cluster/placement")["replicas"]
    assert loads[victim] == 0 and sorted(v for n, v in loads.items() if n != victim) == [3, 4, 4, 4], loads
    removed = run_maxqctl(held_cluster["n1"], "remove-node", victim)
    assert removed.returncode == 0, (removed.stdout, removed.stderr)
    # Removed from the cluster, it left the metadata group and stops itself, as a member of
    # the layout with every group everywhere does (its watchdog looked the metadata group up and
    # failed every 0.5 s instead: it ran on, in a jepsen-style run; earlier still, it replaced its
    # metadata machine and crashed on the next counts sent).
    proc = held_cluster[victim].proc
    assert proc is not None
    wait_for(lambda: proc.poll() is not None, 15, "the removed member to stop")
    assert proc.returncode == 0, held_cluster[victim].log_text()[-3000:]
    log_text = held_cluster[victim].log_text()
    assert "removed from the cluster: stopping" in log_text and "Traceback" not in log_text


def _alive(connection: pika.BlockingConnection) -> bool:
    try:
        connection.process_data_events(0.5)
        return connection.is_open
    except pika.exceptions.AMQPError:
        return False


def test_a_new_member_holds_nothing_until_a_rebalance_moves_its_share_onto_it(held_cluster: Cluster, tmp_path) -> None:
    name, _group = queue_elsewhere(held_cluster, "n1")
    with held_cluster["n1"].connect() as conn:
        conn.channel().queue_declare(name, durable=True)
    peers = {n: m.raft_port for n, m in held_cluster.members.items()}
    new = Member(
        "n6",
        tmp_path,
        free_port(),
        peers,
        ["--shards", str(SHARDS), "--join", "on", "--replication-factor", str(FACTOR)],
    )
    new.launch()
    try:
        with confirmed_load(held_cluster, name) as consumer:
            added = in_background(
                consumer,
                lambda: run_maxqctl(held_cluster["n2"], "add-node", "n6", "--raft-addr", f"127.0.0.1:{new.raft_port}"),
            )
            assert added.returncode == 0 and "holds no shard group until" in added.stdout, (added.stdout, added.stderr)
            new.wait_ready(90)
            assert list(held_by(new)) == ["meta"]
            before = held_cluster["n1"].admin("/api/cluster/placement")
            dry = run_maxqctl(held_cluster["n1"], "rebalance", "--dry-run")
            # (15 replicas over 6 members: 3, 3, 3, 2, 2, 2)
            assert dry.returncode == 0 and "-> n6" in dry.stdout and "n6 2" in dry.stdout, dry.stdout
            assert held_cluster["n1"].admin("/api/cluster/placement") == before  # (a dry run changes nothing)
            done = in_background(consumer, lambda: run_maxqctl(held_cluster["n1"], "rebalance"))
            assert done.returncode == 0, (done.stdout, done.stderr)
            loads = held_cluster["n1"].admin("/api/cluster/placement")["replicas"]
            assert loads["n6"] == 2 and max(loads.values()) - min(loads.values()) <= 1, loads
            assert len(held_by(new)) == 1 + 2
    finally:
        new.stop()


def test_a_dead_members_replicas_are_read_from_their_other_holders_moved_off_and_it_is_removed(
    held_cluster: Cluster,
) -> None:
    """n5 killed for good. n1 holds some groups only; it asks a linked holder of each other group
    for its members (cluster.py, `known_placement`), so n5's replicas are still seen: the plans
    count them (a plan made from what the linked members announce would add replicas that exist:
    a jepsen-style drain did), drain-replicas moves them onto the live members, and remove-node
    takes n5 out. Before, with n5 out of reach, every plan, a hand-made move of a group n1 does
    not hold, and n5's removal were refused ("n5 not reachable from n1") for as long as n5 was
    down: a dead member could never leave a cluster whose groups are on a few members."""
    n1 = held_cluster["n1"]
    name, _group = queue_elsewhere(held_cluster, "n1")
    publish_confirmed(n1, name, b"kept")
    before = {g["group"]: sorted(g["members"]) for g in n1.admin("/api/cluster/placement")["groups"]}
    assert any("n5" in members for members in before.values())
    held_cluster["n5"].kill()
    wait_for(
        lambda: [m["state"] for m in n1.admin("/api/cluster/status")["members"] if m["node"] == "n5"] != ["up"],
        30,
        "n1 to see n5 down",
    )
    seen = n1.admin("/api/cluster/placement")
    assert seen["unreachable"] == [] and seen["unknown_groups"] == [], seen
    assert {g["group"]: sorted(g["members"]) for g in seen["groups"]} == before, seen
    planned = run_maxqctl(n1, "rebalance", "--dry-run")
    assert planned.returncode == 0 and "nothing to move" in planned.stdout, planned
    refused = run_maxqctl(n1, "remove-node", "n5")
    assert refused.returncode == 4 and "still holds replicas of" in refused.stderr, refused

    drained = run_maxqctl(n1, "drain-replicas", "n5")
    assert drained.returncode == 0, (drained.stdout, drained.stderr)
    after = {g["group"]: sorted(g["members"]) for g in n1.admin("/api/cluster/placement")["groups"]}
    assert all(len(members) == FACTOR and "n5" not in members for members in after.values()), after
    removed = run_maxqctl(n1, "remove-node", "n5")
    assert removed.returncode == 0, (removed.stdout, removed.stderr)
    assert "n5" not in [m["node"] for m in n1.admin("/api/cluster/status")["members"]]
    with held_cluster["n2"].connect() as connection:
        method, _props, body = connection.channel().basic_get(name, auto_ack=True)
    assert method is not None and body == b"kept"


def test_the_trace_read_through_a_member_without_a_replica_has_every_groups_records(held_cluster: Cluster) -> None:
    n1 = held_cluster["n1"]
    elsewhere, group = queue_elsewhere(held_cluster, "n1", prefix="traced")
    held_here = next(f"here{i}" for i in range(1000) if shard_of(("/", f"here{i}"), SHARDS) in held_by(n1))
    with n1.connect() as conn:
        channel = conn.channel()
        channel.exchange_declare("trace-fan", "fanout")
        for queue in (elsewhere, held_here):
            channel.queue_declare(queue, arguments={"x-trace": True})
            channel.queue_bind(queue, "trace-fan")
        channel.confirm_delivery()
        channel.basic_publish("trace-fan", "", b"traced", pika.BasicProperties(message_id="m-1"))
        for queue in (elsewhere, held_here):
            method, _props, _body = channel.basic_get(queue)
            assert method is not None, queue
            channel.basic_ack(method.delivery_tag)

    def events(member: Member, **query: str) -> dict[str, list[str]]:
        status, body, _ = api(member, "GET", "/api/trace/%2F?" + "&".join(f"{k}={v}" for k, v in query.items()))
        assert status == 200, body
        out: dict[str, list[str]] = {}
        for record in body:
            out.setdefault(record["queue"], []).append(record["event"])
        return out

    steps = ["published", "enqueued", "delivered", "acked"]
    holder = held_cluster[holders(held_cluster, group)[0]]
    # Before: n1 had only the records of the group it holds ({held_here: steps}), and nobody had
    # the "published" record of `elsewhere` (n1's publish did not carry its context).
    wanted = {elsewhere: steps, held_here: steps}
    wait_until(lambda: events(n1, message_id="m-1") == wanted, 10)
    assert events(n1, message_id="m-1") == wanted, events(holder, message_id="m-1")
    status, on_holder, _ = api(holder, "GET", f"/api/trace/%2F?queue={elsewhere}")
    status_n1, on_n1, _ = api(n1, "GET", f"/api/trace/%2F?queue={elsewhere}")
    assert status == status_n1 == 200 and on_n1 == on_holder and len(on_n1) == 4, (on_n1, on_holder)
