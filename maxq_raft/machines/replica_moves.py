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

Hosts. With several members on one machine (issue #19: one member per core), two replicas of a
group on one machine would let the loss of that machine take the group's majority. Given each
member's host (`host_of`; the broker takes the host of its Raft address), a group's replicas go
on as many different hosts as there are (up to the factor): the first placement walks the
members interleaved by host, every step above prefers a member on a host the group is not on
yet, and a step between 2 and 3 moves a replica off a host the group is on twice while the group
is on no replica of an eligible host. Step 3 then makes only moves that keep each group on as
many hosts, so the loads may stay further apart where the hosts leave no other choice. Without
`host_of` every member is its own host: the plans are those of one member per host.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

Placement = Mapping[str, Sequence[str]]


class Move(NamedTuple):
    group: str
    add: str | None  # the member that gains a replica of `group` (None: it only loses one)
    remove: str | None  # the member that loses one (None: it only gains one)


def first_placement(
    groups: Sequence[str], members: Sequence[str], factor: int, host_of: Mapping[str, str] | None = None
) -> dict[str, list[str]]:
    """Group i on the `factor` members from position i * factor of the members interleaved by
    host (one of each host in turn, names sorted; one position further after each len(members)
    groups, which took the ring `factor` times round, so that the replica sets differ and a
    member's loss spreads over several others), skipping a
    member on a host the group is already on while others remain: the groups take the ring in
    turn, so each member holds len(groups) * factor / len(members) replicas, give or take one
    (with as many members on every host), and each group is on min(factor, hosts) hosts."""
    if factor < 1:
        raise ValueError(f"the replication factor must be at least 1, not {factor}")
    ring = interleaved(members, host_of)
    if not ring:
        raise ValueError("no members to place groups on")
    host = _hosts(ring, host_of)
    width = min(factor, len(ring))
    placement: dict[str, list[str]] = {}
    for i, g in enumerate(groups):
        start = i * width + i // len(ring)  # one further after each len(ring) groups
        walk = [ring[(start + k) % len(ring)] for k in range(len(ring))]
        chosen: list[str] = []
        for m in walk:
            if len(chosen) < width and host[m] not in {host[c] for c in chosen}:
                chosen.append(m)
        chosen += [m for m in walk if m not in chosen][: width - len(chosen)]
        placement[g] = chosen
    return placement


def interleaved(members: Iterable[str], host_of: Mapping[str, str] | None = None) -> list[str]:
    """The members one host at a time: the first of each host, then the second... Hosts are
    ordered by their first member's name, not by what names the host: two members that name a
    host differently (one resolved a peer's name, the other could not) but group the members
    alike order them alike, and with every member its own host this is the members by name."""
    by_host: dict[str, list[str]] = {}
    host = _hosts(sorted(set(members)), host_of)
    for m in sorted(host):
        by_host.setdefault(host[m], []).append(m)
    columns = sorted(by_host.values(), key=lambda on_host: on_host[0])
    return [column[row] for row in range(max(map(len, columns), default=0)) for column in columns if row < len(column)]


def _hosts(members: Iterable[str], host_of: Mapping[str, str] | None) -> dict[str, str]:
    """Each member's host: `host_of`'s, or the member itself (its own host) when not given."""
    return {m: host_of.get(m, m) if host_of is not None else m for m in members}


def loads(placement: Placement, members: Iterable[str]) -> dict[str, int]:
    """Replicas per member (every member of `members` listed, holding none or more)."""
    out = {m: 0 for m in members}
    for replicas in placement.values():
        for m in replicas:
            out[m] = out.get(m, 0) + 1
    return out


def plan_moves(
    placement: Placement,
    members: Sequence[str],
    factor: int,
    leaving: Iterable[str] = (),
    host_of: Mapping[str, str] | None = None,
) -> list[Move]:
    """The moves that take `placement` to `factor` replicas per group, none on a member in
    `leaving`, each group on as many hosts as it can be, spread over the other members within one
    replica of each other where the hosts allow it (see above)."""
    if factor < 1:
        raise ValueError(f"the replication factor must be at least 1, not {factor}")
    gone = set(leaving)
    eligible = sorted(set(members) - gone)
    if not eligible:
        raise ValueError("no member would be left to hold the groups")
    width = min(factor, len(eligible))
    state = {g: list(replicas) for g, replicas in sorted(placement.items())}
    host = _hosts({*members, *(m for r in state.values() for m in r)}, host_of)
    load = {m: n for m, n in loads(state, eligible).items() if m in eligible}  # (only these count)
    moves: list[Move] = []

    def hosts_of(replicas: Iterable[str]) -> set[str]:
        return {host[m] for m in replicas}

    def least_loaded(replicas: Sequence[str], staying: Iterable[str]) -> str | None:
        """The member to add to a group now on `replicas`, of which `staying` remain: not one
        of them, on a host none of `staying` is on if there is one, then the least loaded."""
        taken, used = set(replicas), hosts_of(staying)
        free = [m for m in eligible if m not in taken]
        return min(free, key=lambda m: (host[m] in used, load[m], m)) if free else None

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

    def crowded(replicas: Sequence[str]) -> list[str]:
        """Replicas of a group on a host it has another replica on (most loaded first)."""
        count = Counter(host[m] for m in replicas)
        return sorted((m for m in replicas if count[host[m]] > 1), key=lambda m: (load.get(m, 0), m), reverse=True)

    for group, replicas in state.items():  # 1. off the leaving members
        for member in sorted(m for m in replicas if m in gone or m not in load):
            others = [m for m in replicas if m not in gone and m in load]
            move(group, least_loaded(replicas, others) if len(others) < width else None, member)
    for group, replicas in state.items():  # 2. to the factor
        while len(replicas) < width:
            move(group, least_loaded(replicas, replicas), None)
        while len(replicas) > width:
            surplus = crowded(replicas) or [max(replicas, key=lambda m: (load[m], m))]
            move(group, None, surplus[0])
    for group, replicas in state.items():  # 2b. onto the hosts a group is not on
        for _ in range(width):
            extra = crowded(replicas)
            target = least_loaded(replicas, replicas)  # on a host the group is not on, if any
            if not extra or target is None or host[target] in hosts_of(replicas):
                break
            move(group, target, extra[0])
    for _ in range(len(state) * width + 1):  # 3. spread (each move narrows the spread: bounded)
        step = _spreading_move(state, eligible, load, host)
        if step is None:
            break
        move(*step)
    return moves


def _spreading_move(
    state: Mapping[str, Sequence[str]], eligible: Sequence[str], load: Mapping[str, int], host: Mapping[str, str]
) -> tuple[str, str, str] | None:
    """(group, to, from): a replica from a member holding two more than another to that one,
    the widest gap first, on a group the move keeps on as many hosts; None when there is none."""
    rank = {m: i for i, m in enumerate(sorted(eligible))}  # most loaded, then the last by name
    pairs = sorted(
        ((a, b) for a in eligible for b in eligible if load[a] - load[b] >= 2),
        key=lambda ab: (-load[ab[0]], -rank[ab[0]], load[ab[1]], rank[ab[1]]),
    )
    for most, fewest in pairs:
        for group, replicas in state.items():
            if most not in replicas or fewest in replicas:
                continue
            after = [fewest if m == most else m for m in replicas]
            if len({host[m] for m in after}) >= len({host[m] for m in replicas}):
                return group, fewest, most
    return None


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
