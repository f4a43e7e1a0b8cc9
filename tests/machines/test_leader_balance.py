"""Leader balancing's rule (machines/leader_balance.py): the moves stop, and none goes back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines.leader_balance import leadership_to_hand_over
from maxq_raft.machines.metadata import META_GROUP


@st.composite
def clusters(draw) -> tuple[list[str], dict[str, list[str]], dict[str, str], dict[str, int]]:
    """Members, each group's holders (the metadata group on all, the shards on up to 3), a
    leader among each group's holders, and how many queues each shard holds."""
    members = [f"n{i}" for i in range(1, draw(st.integers(2, 9)) + 1)]
    factor = min(3, len(members))
    holders = {META_GROUP: members}
    for i in range(draw(st.integers(1, 20))):
        holders[f"shard-{i}"] = sorted(draw(st.permutations(members))[:factor])
    leaders = {group: draw(st.sampled_from(held)) for group, held in holders.items()}
    queues = {group: draw(st.integers(0, 3)) for group in holders if group != META_GROUP}
    return members, holders, leaders, queues


def move_of(
    member: str,
    members: list[str],
    holders: dict[str, list[str]],
    leaders: dict[str, str],
    queues: dict[str, int] | None = None,
):
    mine = {group: holders[group] for group, leader in leaders.items() if leader == member}
    return leadership_to_hand_over(member, dict(leaders), mine, [m for m in members if m != member], queues)


@settings(max_examples=300, deadline=None)
@given(clusters())
def test_with_every_member_counting_every_group_the_moves_stop(cluster) -> None:
    """Round after round each member makes its move, if any: they stop within the bound that
    each move lowering the sum of the squared counts by 2 gives, a move is never undone at once,
    and at the end no member leads two more than a member holding one of its groups."""
    members, holders, leaders, queues = cluster

    def squares() -> int:
        return sum(list(leaders.values()).count(m) ** 2 for m in members)

    bound = squares() // 2
    moves = 0
    last: tuple[str, str, str] | None = None
    for _round in range(bound + 1):
        moved = False
        for member in members:
            move = move_of(member, members, holders, leaders, queues)
            if move is None:
                continue
            group, target = move
            assert target in holders[group] and target != member and group != META_GROUP
            assert last != (group, target, member), f"{group} handed back from {target} to {member}"
            before = squares()
            leaders[group] = target
            assert squares() <= before - 2
            last = (group, member, target)
            moves += 1
            moved = True
        if not moved:
            break
    assert moves <= bound
    for member in members:
        assert move_of(member, members, holders, leaders, queues) is None
        mine = [g for g, leader in leaders.items() if leader == member and g != META_GROUP]
        for group in mine:
            for other in holders[group]:
                assert list(leaders.values()).count(member) - list(leaders.values()).count(other) < 2


def test_the_seven_member_cluster_that_handed_one_group_to_and_fro() -> None:
    """7 members at factor 3, 14 shards (`scripts/cluster up --hosts 7 --replication-factor 3`,
    2026-12-06): counted from its own replicas, n1 saw itself at 3 and n7 at 1 and handed
    shard-13 over; n7 then saw itself at 3 and n1 at 1 and handed it back, every 5 s. Counting
    every group, the one move made is not undone."""
    holders = {
        META_GROUP: [f"n{i}" for i in range(1, 8)],
        "shard-0": ["n1", "n2", "n3"],
        "shard-1": ["n4", "n5", "n6"],
        "shard-2": ["n1", "n2", "n7"],
        "shard-3": ["n3", "n4", "n5"],
        "shard-4": ["n1", "n6", "n7"],
        "shard-5": ["n2", "n3", "n4"],
        "shard-6": ["n5", "n6", "n7"],
        "shard-7": ["n2", "n3", "n4"],
        "shard-8": ["n5", "n6", "n7"],
        "shard-9": ["n1", "n2", "n3"],
        "shard-10": ["n4", "n5", "n6"],
        "shard-11": ["n1", "n2", "n7"],
        "shard-12": ["n3", "n4", "n5"],
        "shard-13": ["n1", "n6", "n7"],
    }
    leaders = {
        META_GROUP: "n4",
        "shard-0": "n3",
        "shard-1": "n6",
        "shard-2": "n1",
        "shard-3": "n4",
        "shard-4": "n6",
        "shard-5": "n3",
        "shard-6": "n7",
        "shard-7": "n2",
        "shard-8": "n5",
        "shard-9": "n1",
        "shard-10": "n5",
        "shard-11": "n7",
        "shard-12": "n5",
        "shard-13": "n1",
    }
    members = holders[META_GROUP]
    # Counted from n1's replicas only (the old rule): n1 leads 3 of them, n6 and n7 (shard-13's
    # other holders) 1 each, so shard-13 went to one of them, which saw it the same way back.
    seen_by_n1 = [leader for g, leader in leaders.items() if "n1" in holders[g]]
    assert (seen_by_n1.count("n1"), seen_by_n1.count("n6"), seen_by_n1.count("n7")) == (3, 1, 1)
    # Every group counted: n1 leads 3, n6 and n7 2 each, n2 1. shard-13 stays; what moves (to
    # n2) is not handed back.
    assert move_of("n1", members, holders, leaders) == ("shard-9", "n2")
    for member in members:
        move = move_of(member, members, holders, leaders)
        if move is not None:
            group, target = move
            leaders[group] = target
            assert move_of(target, members, holders, leaders) != (group, member)


def test_nothing_moves_while_a_leader_is_not_known() -> None:
    holders = {META_GROUP: ["n1", "n2", "n3"], "shard-0": ["n1", "n2", "n3"], "shard-1": ["n1", "n2", "n3"]}
    leaders: dict[str, str | None] = {META_GROUP: "n1", "shard-0": "n1", "shard-1": "n1"}
    mine = {g: holders[g] for g in ("shard-0", "shard-1")}
    assert leadership_to_hand_over("n1", leaders, mine, ["n2", "n3"]) == ("shard-1", "n2")
    leaders["shard-0"] = None  # (an election, or a group held elsewhere not heard from yet)
    assert leadership_to_hand_over("n1", leaders, mine, ["n2", "n3"]) is None


def test_of_the_groups_that_may_go_the_one_holding_fewest_queues_goes() -> None:
    """A leadership moved takes its queues' leader off the member their clients use (the
    client-local locator put it there): the empty group goes, whatever its place in the order."""
    holders = {META_GROUP: ["n1", "n2", "n3"], **{f"shard-{i}": ["n1", "n2", "n3"] for i in range(3)}}
    leaders = {META_GROUP: "n2", "shard-0": "n1", "shard-1": "n1", "shard-2": "n1"}
    mine = {g: holders[g] for g in ("shard-0", "shard-1", "shard-2")}
    # without counts (or all equal) the last goes, as before
    assert leadership_to_hand_over("n1", leaders, mine, ["n2", "n3"]) == ("shard-2", "n3")
    assert leadership_to_hand_over("n1", leaders, mine, ["n2", "n3"], {"shard-2": 1, "shard-1": 1}) == (
        "shard-0",
        "n3",
    )
    assert leadership_to_hand_over("n1", leaders, mine, ["n2", "n3"], {"shard-0": 2, "shard-1": 5, "shard-2": 3}) == (
        "shard-0",
        "n3",
    )
    # one that no other member holds cannot go, however empty: the next fewest does
    mine["shard-0"] = ["n1"]
    assert leadership_to_hand_over("n1", leaders, mine, ["n2", "n3"], {"shard-0": 0, "shard-1": 5, "shard-2": 3}) == (
        "shard-2",
        "n3",
    )
