"""Where a group's replicas go: the first placement, and the moves of a rebalance or a drain.

Pure functions of a placement (group -> the members holding a replica of it), the members and
the replication factor, deterministic (ties broken by name), so that a dry run prints exactly
what the run does (issue #19: `maxqctl rebalance [--dry-run]`, `drain NODE`).

A move is one replica changing member: `Move(group, add, remove)`, made as two Raft membership
changes, the addition first (the engine's `move_group`), so a group never has fewer replicas
than it started the move with; `add` or `remove` alone grows or shrinks a group that has too
few or too many. The plan, in order:

1. every replica on a member that is leaving (a drain) goes to the least loaded member that does
   not hold the group;
2. a group with fewer replicas than the factor (or than there are members, if fewer) gains some
   on the least loaded members; one with more loses those on the most loaded;
3. while the most loaded member holds two replicas more than the least loaded, one of its
   groups that the least loaded does not hold moves there (one always exists: it holds at least
   two more groups).

A member's load is the number of replicas it holds: groups are taken as equal (several per
member keep each step small). Leaders are not placed here: the membership watchdog spreads them
over each group's members (server/watchdog.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

Placement = Mapping[str, Sequence[str]]


class Move(NamedTuple):
    group: str
    add: str | None  # the member that gains a replica of `group` (None: it only loses one)
    remove: str | None  # the member that loses one (None: it only gains one)


def first_placement(groups: Sequence[str], members: Sequence[str], factor: int) -> dict[str, list[str]]:
    """Group i on `factor` consecutive members from member i (members sorted by name): each
    member holds len(groups) * factor / len(members) replicas, give or take one."""
    if factor < 1:
        raise ValueError(f"the replication factor must be at least 1, not {factor}")
    ordered = sorted(set(members))
    if not ordered:
        raise ValueError("no members to place groups on")
    width = min(factor, len(ordered))
    return {g: [ordered[(i + k) % len(ordered)] for k in range(width)] for i, g in enumerate(groups)}


def loads(placement: Placement, members: Iterable[str]) -> dict[str, int]:
    """Replicas per member (every member of `members` listed, holding none or more)."""
    out = {m: 0 for m in members}
    for replicas in placement.values():
        for m in replicas:
            out[m] = out.get(m, 0) + 1
    return out


def plan_moves(placement: Placement, members: Sequence[str], factor: int, leaving: Iterable[str] = ()) -> list[Move]:
    """The moves that take `placement` to `factor` replicas per group, none on a member in
    `leaving`, spread over the other members within one replica of each other (see above)."""
    if factor < 1:
        raise ValueError(f"the replication factor must be at least 1, not {factor}")
    gone = set(leaving)
    eligible = sorted(set(members) - gone)
    if not eligible:
        raise ValueError("no member would be left to hold the groups")
    width = min(factor, len(eligible))
    state = {g: list(replicas) for g, replicas in sorted(placement.items())}
    load = {m: n for m, n in loads(state, eligible).items() if m in eligible}  # (only these count)
    moves: list[Move] = []

    def least_loaded(excluded: Iterable[str]) -> str | None:
        taken = set(excluded)
        free = [m for m in eligible if m not in taken]
        return min(free, key=lambda m: (load[m], m)) if free else None

    def move(group: str, add: str | None, remove: str | None) -> None:
        replicas = state[group]
        if add is not None:
            replicas.append(add)
            load[add] += 1
        if remove is not None:
            replicas.remove(remove)
            if remove in load:
                load[remove] -= 1
        moves.append(Move(group, add, remove))

    for group, replicas in state.items():  # 1. off the leaving members
        for member in sorted(m for m in replicas if m in gone or m not in load):
            others = [m for m in replicas if m not in gone and m in load]
            move(group, least_loaded(replicas) if len(others) < width else None, member)
    for group, replicas in state.items():  # 2. to the factor
        while len(replicas) < width:
            move(group, least_loaded(replicas), None)
        while len(replicas) > width:
            move(group, None, max(replicas, key=lambda m: (load[m], m)))
    for _ in range(len(state) * width + 1):  # 3. spread (each move narrows the spread: bounded)
        most = max(eligible, key=lambda m: (load[m], m))
        fewest = min(eligible, key=lambda m: (load[m], m))
        if load[most] - load[fewest] < 2:
            break
        group = next(g for g, replicas in state.items() if most in replicas and fewest not in replicas)
        move(group, fewest, most)
    return moves


def applied(placement: Placement, moves: Iterable[Move]) -> dict[str, list[str]]:
    """The placement after `moves` (for a dry run's "after", and the tests)."""
    state = {g: list(replicas) for g, replicas in placement.items()}
    for mv in moves:
        replicas = state[mv.group]
        if mv.add is not None and mv.add not in replicas:
            replicas.append(mv.add)
        if mv.remove is not None and mv.remove in replicas:
            replicas.remove(mv.remove)
    return state
