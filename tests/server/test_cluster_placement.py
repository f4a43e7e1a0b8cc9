"""ClusterLog.placement: the shard groups' members as a member sees them."""

from __future__ import annotations

from types import SimpleNamespace

from maxq_raft.server.cluster import ClusterLog


class Group:
    def __init__(self, others: list[str], learning: bool) -> None:
        self.others = others
        self.learning = learning

    def member_ids(self) -> list[str]:
        return ["n4", *self.others]  # (pysyncobj's view: this node, then the others)


def test_a_learner_does_not_list_itself_among_the_members_of_a_group_it_catches_up_on() -> None:
    log = SimpleNamespace(
        node=SimpleNamespace(
            node_id="n4",
            groups={
                "shard-0": Group(["n1", "n2", "n3"], learning=True),
                "shard-1": Group(["n2", "n1"], learning=False),
            },
            peer_held=lambda: {"n1": frozenset({"shard-2"}), "n3": frozenset({"shard-2", "meta"})},
        ),
        shards=["shard-0", "shard-1", "shard-2"],
    )
    assert ClusterLog.placement(log) == {  # type: ignore[arg-type]
        "shard-0": ["n1", "n2", "n3"],
        "shard-1": ["n1", "n2", "n4"],
        "shard-2": ["n1", "n3"],
    }


def test_members_without_a_link_are_unseen_unless_every_group_is_held_here() -> None:
    def log(held: dict) -> SimpleNamespace:
        fake = SimpleNamespace(
            node=SimpleNamespace(node_id="n4", groups=held, peer_held=lambda: {"n1": frozenset(), "n2": frozenset()}),
            shards=["shard-0", "shard-1"],
            node_id="n4",
            members=lambda: ["n1", "n2", "n3", "n4"],
        )
        return fake

    assert ClusterLog.unseen_members(log({"shard-0": None})) == ["n3"]  # type: ignore[arg-type]
    assert ClusterLog.unseen_members(log({"shard-0": None, "shard-1": None})) == []  # type: ignore[arg-type]
