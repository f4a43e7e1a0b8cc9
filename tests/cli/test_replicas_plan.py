"""maxqctl's replica verbs' pure parts (cli/replicas.py): the factor a plan keeps, and the moves
that give a group the members asked for. The verbs themselves run against real clusters in
tests/cluster/test_held_groups.py."""

from __future__ import annotations

import pytest

from maxq_raft.cli.admin_client import CtlError
from maxq_raft.cli.replicas import _to_moves, settled_factor
from maxq_raft.machines.replica_moves import Move


def test_the_factor_is_the_groups_replica_count() -> None:
    assert settled_factor({"g0": ["n1", "n2", "n3"], "g1": ["n2", "n3", "n4"], "g2": ["n1", "n4"]}) == 3


def test_a_group_with_more_replicas_than_the_others_stops_a_plan() -> None:
    """Added and not yet removed: a move is under way, and a plan now would remove a replica
    that move removes too."""
    with pytest.raises(CtlError) as refused:
        settled_factor({"g0": ["n1", "n2", "n3"], "g1": ["n2", "n3", "n4"], "g2": ["n1", "n2", "n3", "n4"]})
    assert refused.value.code == 5 and "g2 has more than 3 replicas" in str(refused.value)


def test_move_group_pairs_each_member_gained_with_one_lost() -> None:
    assert _to_moves("g0", ["n1", "n2", "n3"], ["n1", "n4", "n5"]) == [
        Move("g0", "n4", "n2"),
        Move("g0", "n5", "n3"),
    ]
    assert _to_moves("g0", ["n1", "n2"], ["n1", "n2", "n3"]) == [Move("g0", "n3", None)]
    assert _to_moves("g0", ["n1", "n2", "n3"], ["n1", "n2"]) == [Move("g0", None, "n3")]
    assert _to_moves("g0", ["n1", "n2", "n3"], ["n3", "n2", "n1"]) == []
