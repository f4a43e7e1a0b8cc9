"""The rebalance and drain plans (machines/replica_moves.py): properties over any placement."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines.replica_moves import Move, applied, first_placement, loads, plan_moves

MEMBER_NAMES = [f"n{i}" for i in range(1, 9)]


@st.composite
def layouts(draw):
    """(placement, members, factor, leaving): any replicas on any members, some of them gone
    from the member list (a member that died), some leaving (a drain)."""
    members = draw(st.lists(st.sampled_from(MEMBER_NAMES), min_size=1, max_size=8, unique=True))
    known = members + draw(st.lists(st.sampled_from(MEMBER_NAMES), max_size=2, unique=True))
    groups = [f"g{i}" for i in range(draw(st.integers(1, 12)))]
    placement = {g: draw(st.lists(st.sampled_from(known), min_size=1, max_size=5, unique=True)) for g in groups}
    factor = draw(st.integers(1, 5))
    leaving = draw(st.lists(st.sampled_from(members), max_size=len(members) - 1, unique=True))
    return placement, members, factor, leaving


@settings(max_examples=400, deadline=None)
@given(layouts())
def test_a_plan_reaches_the_factor_off_the_leaving_members_spread_within_one(layout):
    placement, members, factor, leaving = layout
    moves = plan_moves(placement, members, factor, leaving)
    after = applied(placement, moves)
    eligible = sorted(set(members) - set(leaving))
    width = min(factor, len(eligible))
    for g, replicas in after.items():
        assert len(replicas) == len(set(replicas)) == width, (g, replicas)
        assert set(replicas) <= set(eligible), (g, replicas)
    held = loads(after, eligible)
    assert max(held.values()) - min(held.values()) <= 1, held
    assert plan_moves(after, members, factor, leaving) == []  # a balanced placement stays put


@settings(max_examples=400, deadline=None)
@given(layouts())
def test_each_move_changes_one_replica_and_shrinks_a_group_only_when_it_must(layout):
    placement, members, factor, leaving = layout
    eligible = set(members) - set(leaving)
    width = min(factor, len(eligible))
    state = {g: list(r) for g, r in placement.items()}
    for mv in plan_moves(placement, members, factor, leaving):
        replicas = state[mv.group]
        assert mv.add is not None or mv.remove is not None, mv
        assert mv.add is None or (mv.add not in replicas and mv.add in eligible), mv
        assert mv.remove is None or mv.remove in replicas, mv
        if mv.add is None:  # a removal alone: too many replicas, or off a member that goes
            assert len(replicas) > width or mv.remove not in eligible, (mv, replicas)
        state = applied(state, [mv])


def test_a_drain_moves_every_replica_of_the_member_and_nothing_else():
    placement = first_placement([f"g{i}" for i in range(10)], ["n1", "n2", "n3", "n4", "n5"], 3)
    assert loads(placement, ["n1", "n2", "n3", "n4", "n5"]) == {"n1": 6, "n2": 6, "n3": 6, "n4": 6, "n5": 6}
    moves = plan_moves(placement, ["n1", "n2", "n3", "n4", "n5"], 3, leaving=["n3"])
    assert len(moves) == 6 and all(mv.remove == "n3" and mv.add is not None for mv in moves), moves
    after = applied(placement, moves)
    assert sorted(loads(after, ["n1", "n2", "n4", "n5"]).values()) == [7, 7, 8, 8]  # 30 replicas over 4
    assert all("n3" not in replicas for replicas in after.values())


def test_a_new_member_gets_its_share_and_the_plan_is_the_dry_run():
    members = ["n1", "n2", "n3"]
    placement = first_placement([f"g{i}" for i in range(6)], members, 3)
    assert all(len(r) == 3 for r in placement.values())
    moves = plan_moves(placement, [*members, "n4"], 3)
    after = applied(placement, moves)
    # 18 replicas over 4 members: 4 or 5 each; n4 got its share by moves from the others
    assert sorted(loads(after, [*members, "n4"]).values()) == [4, 4, 5, 5]
    assert len(moves) == loads(after, ["n4"])["n4"] and all(mv.add == "n4" for mv in moves)
    assert moves == plan_moves(placement, [*members, "n4"], 3)  # deterministic: a dry run shows the run
    assert plan_moves(placement, members, 3) == []


def test_a_group_short_of_replicas_grows_and_one_with_too_many_shrinks():
    moves = plan_moves({"g0": ["n1"], "g1": ["n1", "n2", "n3", "n4"]}, ["n1", "n2", "n3", "n4"], 3)
    after = applied({"g0": ["n1"], "g1": ["n1", "n2", "n3", "n4"]}, moves)
    assert all(len(r) == 3 for r in after.values()), after
    # g0 first (by name) grows onto n2 and n3 (the least loaded, ties by name); then n1, n2 and
    # n3 hold two replicas each and g1 leaves the most loaded, the last by name
    assert [mv for mv in moves if mv.group == "g1"] == [Move("g1", None, "n3")]
    assert [mv.add for mv in moves if mv.group == "g0"] == ["n2", "n3"] and len(moves) == 3, moves


@st.composite
def hosted_layouts(draw):
    """(placement, members, factor, leaving, host_of): members on 1 to 4 hosts, any number each."""
    placement, members, factor, leaving = draw(layouts())
    known = sorted({*members, *(m for r in placement.values() for m in r)})
    host_of = {m: f"h{draw(st.integers(1, 4))}" for m in known}
    return placement, members, factor, leaving, host_of


@settings(max_examples=400, deadline=None)
@given(hosted_layouts())
def test_with_hosts_each_group_is_on_as_many_hosts_as_it_can_be(layout):
    placement, members, factor, leaving, host_of = layout
    moves = plan_moves(placement, members, factor, leaving, host_of)
    after = applied(placement, moves)
    eligible = sorted(set(members) - set(leaving))
    width = min(factor, len(eligible))
    hosts = {host_of[m] for m in eligible}
    for g, replicas in after.items():
        assert len(replicas) == len(set(replicas)) == width and set(replicas) <= set(eligible), (g, replicas)
        assert len({host_of[m] for m in replicas}) == min(width, len(hosts)), (g, replicas, host_of)
    assert plan_moves(after, members, factor, leaving, host_of) == []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5), st.integers(1, 24))
def test_the_first_placement_spreads_groups_over_hosts_and_loads_within_one(hosts, per_host, factor, groups):
    host_of = {f"n{h}-{k}": f"h{h}" for h in range(hosts) for k in range(per_host)}
    placement = first_placement([f"g{i}" for i in range(groups)], list(host_of), factor, host_of)
    width = min(factor, len(host_of))
    for replicas in placement.values():
        assert len(set(replicas)) == width
        assert len({host_of[m] for m in replicas}) == min(width, hosts), (replicas, host_of)
    held = loads(placement, host_of)
    assert max(held.values()) - min(held.values()) <= 1, held


def test_three_hosts_of_two_members_each_lose_no_group_with_a_host():
    host_of = {f"n{i}": f"10.0.0.{(i - 1) // 2 + 1}" for i in range(1, 7)}  # n1 n2 | n3 n4 | n5 n6
    placement = first_placement([f"g{i}" for i in range(12)], list(host_of), 3, host_of)
    for replicas in placement.values():  # any one host down leaves two of each group's three
        assert sorted(host_of[m] for m in replicas) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"], replicas
    assert set(loads(placement, host_of).values()) == {6}
    # a drain of n3 moves its replicas onto n4, the one other member on its host
    moves = plan_moves(placement, list(host_of), 3, ["n3"], host_of)
    assert moves and all(mv.remove == "n3" and mv.add == "n4" for mv in moves), moves
    # a fourth host's member gets its share, and every group stays on three hosts
    host_of["n7"] = "10.0.0.4"
    after = applied(placement, plan_moves(placement, list(host_of), 3, (), host_of))
    assert all(len({host_of[m] for m in r}) == 3 for r in after.values())
    assert sorted(loads(after, host_of).values()) == [5, 5, 5, 5, 5, 5, 6], after


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(MEMBER_NAMES), min_size=1, max_size=8, unique=True), st.data())
def test_the_first_placement_depends_on_how_members_group_not_on_what_names_the_hosts(members, data) -> None:
    """Members that resolved a peer's host name and members that could not (an address on one,
    the name on another) must place alike: only the grouping counts."""
    grouping = {m: data.draw(st.integers(0, 3)) for m in members}
    as_addresses = {m: f"10.0.0.{g}" for m, g in grouping.items()}
    as_names = {m: f"host-{9 - g}.example" for m, g in grouping.items()}  # (sorts the other way)
    groups = [f"g{i}" for i in range(data.draw(st.integers(1, 12)))]
    factor = data.draw(st.integers(1, 4))
    assert first_placement(groups, members, factor, as_addresses) == first_placement(groups, members, factor, as_names)
    assert first_placement(groups, members, factor, {m: m for m in members}) == first_placement(groups, members, factor)
