"""Which leadership a member hands over to spread the groups' leaders (server/watchdog.py).

Pure: the watchdog passes what its member knows, the same rule runs on every member. A member
leading two groups more than another member that holds one of those groups hands that group's
leadership to it (the one leading fewest of those that hold it). Each such move lowers the sum
of the squares of the members' counts by 2 or more, so with every member counting alike the
moves stop.

They did not when each member counted only the groups it holds a replica of (groups on a few
members): with 7 members at factor 3 and 14 groups, n1 counted itself at 3 and n7 at 1 and
handed shard-13 to n7, which counted itself at 3 and n1 at 1 and handed it back, every 5 s for
good, each move an election (an idle cluster's terms rose by 6-8 a group in 25 s). Every member
now counts every group: its leader as this member's replica knows it, or, for a group held
elsewhere, as its leader last said (ReplicationNode.leader's hint, from the counts of its queues
that a leader sends every member without a replica, server/queue_stats.py).

Of the groups it may hand over, a member hands over the one holding the fewest queues: a
leadership moved takes its queues' leader off the member their clients may use (the
client-local locator put them there, machines/placement.py) and pauses them for an election,
while an empty group's move costs no client anything. (RabbitMQ moves no quorum queue's leader by
itself; `rabbitmq-queues rebalance` is run by hand.) Which group is chosen does not change
the bound above.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from .metadata import META_GROUP


def leadership_to_hand_over(
    me: str,
    leaders: Mapping[str, str | None],
    holders: Mapping[str, Collection[str]],
    others: Collection[str],
    queues: Mapping[str, int] | None = None,
) -> tuple[str, str] | None:
    """(group, member) for `me` to hand over, or None.

    `leaders`: every group, the metadata group too, -> its leader as `me` knows it, in the
    order to consider them (the last of its own first); None for a group whose leader is not
    known (an election, or no word yet from a group held elsewhere): nothing moves then.
    `holders`: the members of each group `me` leads. `others`: the members it may hand to.
    `queues`: how many queues each group holds (a group absent: none); of the groups that may
    go, the one with the fewest goes, ties by the order above.
    The metadata group's leadership is counted, never moved."""
    if any(leader is None for leader in leaders.values()):
        return None
    leads = {member: 0 for member in [me, *others]}
    for leader in leaders.values():
        if leader is not None:
            leads[leader] = leads.get(leader, 0) + 1
    mine = [group for group, leader in leaders.items() if leader == me and group != META_GROUP]
    counts = queues or {}
    # (sorted() keeps the order of equals: reversed, the last of `mine` first among them)
    for group in sorted(reversed(mine), key=lambda group: counts.get(group, 0)):
        candidates = [member for member in others if member in holders.get(group, ())]
        if not candidates:
            continue
        target = min(candidates, key=lambda member: leads[member])
        if leads[me] - leads[target] >= 2:
            return group, target
    return None
