"""The first placement of groups on a few members is chosen in the metadata group (issue #19,
server/first_placement.py): members that would work out different placements from their own
settings still start one, and a member that starts after the others takes the one recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pika

from maxq_raft.server.cluster import shard_of

from .conftest import CLUSTER_READY_S, Cluster, Member
from .test_held_groups import held_by

SHARDS = 5


@contextlib.contextmanager
def five_members(tmp_path: Path, factors: dict[str, int]) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, 5, extra=["--shards", str(SHARDS)])
    for name, member in cluster.members.items():
        member.extra_args += ["--replication-factor", str(factors.get(name, 3))]
    try:
        yield cluster
    finally:
        cluster.stop()
        for member in cluster.members.values():
            if "Traceback" in member.log_text():
                print(f"\n--- {member.name} log has a traceback ---\n{member.log_text()[-15000:]}")


def placement_as_held(members: list[Member]) -> tuple[dict[str, set[str]], dict[str, set[frozenset[str]]]]:
    """Per group: who holds a replica of it, and the member lists those holders' engines have."""
    holders: dict[str, set[str]] = {}
    views: dict[str, set[frozenset[str]]] = {}
    for member in members:
        for group, its_members in held_by(member).items():
            if group == "meta":
                continue
            holders.setdefault(group, set()).add(member.name)
            views.setdefault(group, set()).add(frozenset(its_members))
    return holders, views


def recorded(member: Member) -> dict[str, list[str]]:
    """The metadata group's record of the groups `member` holds: group -> its replicas."""
    status = member.admin("/api/cluster/status")
    assert status["placement_recorded"] is True
    return {g["group"]: sorted(g["replicas"]) for g in status["groups"] if g["group"] != "meta"}


def test_members_whose_settings_would_place_groups_differently_start_one_placement(tmp_path: Path) -> None:
    # n5 alone would put each group on 2 members, the others on 3: without the metadata
    # group's choice n5 started 2-member groups the others' 3-member groups did not count it in.
    with five_members(tmp_path, {"n5": 2}) as cluster:
        cluster.start()
        holders, views = placement_as_held(list(cluster.members.values()))
        assert sorted(holders) == [f"shard-{i}" for i in range(SHARDS)]
        sizes = {len(h) for h in holders.values()}
        assert sizes in ({2}, {3}), holders  # the factor of whichever member's proposal came first
        for group, held in holders.items():
            assert views[group] == {frozenset(held)}, (group, held, views[group])
        for member in cluster.members.values():
            record = recorded(member)
            assert {g: set(m) for g, m in record.items()} == {g: h for g, h in holders.items() if member.name in h}, (
                member.name
            )


def test_a_member_started_after_the_others_takes_the_recorded_placement(tmp_path: Path) -> None:
    with five_members(tmp_path, {}) as cluster:
        first_four = [cluster[f"n{i}"] for i in range(1, 5)]
        for member in first_four:
            member.launch()
        for member in first_four:
            member.wait_ready(CLUSTER_READY_S)
        holders, _views = placement_as_held(first_four)
        n5_groups = {g for g, held in holders.items() if len(held) == 2}  # the others hold 3 each
        assert n5_groups, holders
        # Messages queued in one of those groups while n5 was down come through n5 once it is up.
        name = next(f"q{i}" for i in range(1000) if shard_of(("/", f"q{i}"), SHARDS) in n5_groups)
        connection = first_four[0].connect()
        channel = connection.channel()
        channel.queue_declare(name, durable=True)
        channel.confirm_delivery()
        for n in range(20):
            channel.basic_publish("", name, str(n).encode(), pika.BasicProperties(delivery_mode=2))
        connection.close()

        n5 = cluster["n5"]
        n5.launch()
        n5.wait_ready(CLUSTER_READY_S)
        assert set(held_by(n5)) - {"meta"} == n5_groups
        holders, views = placement_as_held(list(cluster.members.values()))
        for group, held in holders.items():
            assert len(held) == 3 and views[group] == {frozenset(held)}, (group, held, views[group])

        connection = n5.connect()
        channel = connection.channel()
        bodies = []
        for _ in range(20):
            method, _props, body = channel.basic_get(name, auto_ack=True)
            assert method is not None, bodies
            bodies.append(int(body))
        assert bodies == list(range(20))
        connection.close()
