"""The metadata leader records the shard groups and their members (`SetGroups`) from its own
replicas and its peers' word, but not while a group it holds has no leader known: that replica
may be one a move removed while this member was cut off, with the members of a configuration
the group has left (a jepsen-style run, seed 7671, recorded shard-1 on n1, n4, n5 from n4's)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from maxq_raft.machines.placement import SetGroups
from maxq_raft.server.watchdog import MembershipWatchdog

RECORDED = {"shard-0": ["n1", "n2", "n3"], "shard-1": ["n2", "n3", "n5"]}
N4_VIEW = {"shard-0": ["n1", "n2", "n3"], "shard-1": ["n1", "n4", "n5"]}  # its replica of shard-1, left behind


class Meta:
    shard_groups = RECORDED

    def feature_enabled(self, _name: str) -> bool:
        return True


class Node:
    def __init__(self, leaders: dict[str, str | None]) -> None:
        # shard-0 is held elsewhere; a held group's replica knows its leader (`Group.leader_id`)
        self.groups = {g: SimpleNamespace(leader_id=leaders.get(g)) for g in ("meta", "shard-1")}

    def peers_awaiting_placement(self) -> list[str]:
        return []


class Cluster:
    shards = ["shard-0", "shard-1"]

    def __init__(self, leaders: dict[str, str | None]) -> None:
        self.broker = SimpleNamespace(meta=Meta())
        self.node = Node(leaders)
        self.submitted: list[Any] = []

    def unseen_members(self) -> list[str]:
        return []

    def placement(self) -> dict[str, list[str]]:
        return N4_VIEW

    def submit(self, target: Any, command: Any, then: Any) -> None:
        self.submitted.append((target, command))


def test_a_held_group_without_a_leader_known_is_not_recorded_from_this_replica() -> None:
    cluster = Cluster({"meta": "n4", "shard-1": None})  # n4 campaigns in shard-1, alone
    MembershipWatchdog(cluster)._record_placement(100.0)
    assert cluster.submitted == []


def test_with_a_leader_known_the_view_that_differs_is_recorded() -> None:
    cluster = Cluster({"meta": "n4", "shard-1": "n5"})
    MembershipWatchdog(cluster)._record_placement(100.0)
    assert cluster.submitted == [(None, SetGroups([[g, members] for g, members in N4_VIEW.items()]))]
