"""GET /api/cluster/placement and POST /api/cluster/move-group: where the shard groups' replicas
are, and moving one (issue #19; docs/operations.md, "Groups on a few members").

The placement is the asked member's view (server/cluster.py, `placement`): the groups it holds
with their members as its replicas have them, the others as its linked peers announce them, the
replicas per member, and each member's host (that of its Raft address: the plans keep a group's
replicas on different hosts). A move adds one member to a group and/or removes one
(replication/group_moves.py: the new one catches up as a learner first), asked of any member:
one that does not hold the group asks one that does. The answer comes once the move is done
(or why not: 409), with the group's members after it. `maxqctl move-group`, `rebalance` and
`drain --replicas` are plans of such moves (cli/replicas.py). Refused before anything changes:
on a single node or the metadata group (409), an unknown group or node (404), a node that
already holds the group or one that does not (409), neither `add` nor `remove` (400), an
addition to a group with more replicas than most (409 busy: a move's addition made, its
removal not yet).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..config import NODE_ID
from ..machines.replica_moves import loads
from .requests import HttpError, Request


def _cluster(broker: Any) -> Any:
    if broker.log.replication_node is None:
        raise HttpError("409 Conflict", "a single node holds every group: there is no placement to change")
    return broker.log


async def view_placement(broker: Any, request: Request) -> dict:
    cluster = _cluster(broker)
    placement, unknown = await cluster.known_placement()
    members = sorted(cluster.members())
    return {
        "node": broker.node_id,
        "groups": [{"group": group, "members": replicas} for group, replicas in placement.items()],
        "replicas": loads(placement, members),
        "hosts": cluster.hosts(),
        # the asked member's --replication-factor: a rebalance brings each group to it, or to
        # every member when there are fewer. 0 in the layout of every group (a folder started so
        # keeps it whatever the option says now: no replica moves there)
        "factor": cluster.replication_factor if cluster.node.partial else 0,
        # whether every member holds every group as the asked one knows (the layout of every
        # group, or as many members as the factor): no member is served through another's group
        "held_everywhere": not cluster.node.partial or cluster.node.held_everywhere,
        # members the asked one has no link with now, while some group it does not hold has no
        # linked holder that told its members: their replicas there may be missing above (a
        # plan made from this view would add replicas that exist: maxqctl refuses to plan while
        # any is listed). A member down whose groups' other holders answered is not listed: its
        # replicas are shown, and a drain can move them off it.
        "unreachable": cluster.unseen_members() if unknown else [],
        "unknown_groups": unknown,
    }


def _optional_node(value: Any, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not NODE_ID.match(value):
        raise HttpError("400 Bad Request", f"{what} must be a node name or null, got {value!r}")
    return value


async def move_group(broker: Any, request: Request) -> dict:
    cluster = _cluster(broker)
    body = request.json()
    group = body.get("group")
    add = _optional_node(body.get("add"), "add")
    remove = _optional_node(body.get("remove"), "remove")
    if not isinstance(group, str):
        raise HttpError("400 Bad Request", f"group must be a shard group's name, got {group!r}")
    if add is None and remove is None:
        raise HttpError("400 Bad Request", "give add, remove or both: the member to gain and the one to lose a replica")
    if group not in cluster.shards:
        if group == cluster.meta_group:
            raise HttpError("409 Conflict", "the metadata group is held by every member: it does not move")
        raise HttpError("404 Not Found", f"no group {group!r} (shard groups: {', '.join(cluster.shards)})")
    members = cluster.members()
    for name in (add, remove):
        if name is not None and name not in members:
            raise HttpError("404 Not Found", f"node {name} is not a member of the cluster")
    placement, unknown = await cluster.known_placement()
    if group in unknown:
        # The replicas of a group not held here are asked of a linked holder; with none linked
        # or answering, what the members linked now say they hold is not enough: one out of
        # reach may hold it (a move asked right after a partition healed was refused as "n5
        # does not hold shard-3" while n5 led it: jepsen-style run, seed 2006).
        unseen = cluster.unseen_members()
        raise HttpError(
            "409 Conflict",
            f"the members of {group} are not known whole here: {', '.join(unseen) or 'no holder'} not reachable "
            f"from {cluster.node_id}; ask again once they are, or ask a member holding {group}",
            reason="not reachable",
        )
    replicas = placement[group]
    if add is not None and add in replicas:
        raise HttpError("409 Conflict", f"{add} holds {group} already (its members: {', '.join(replicas)})")
    if remove is not None and remove not in replicas:
        raise HttpError("409 Conflict", f"{remove} does not hold {group} (its members: {', '.join(replicas)})")
    if add is None and len(replicas) <= 1:
        raise HttpError("409 Conflict", f"{remove} holds the only replica of {group}: add another first")
    usual = Counter(len(r) for r in placement.values()).most_common(1)[0][0]
    if add is not None and len(replicas) > usual:
        # Between a move's addition and its removal the group has one replica more than the
        # others: a second move planned from that view would take off the replica the first is
        # about to remove (a jepsen-style run left a group with 2 that way). Only a removal now.
        raise HttpError(
            "409 Conflict",
            f"busy: {group} has {len(replicas)} replicas, the other groups {usual}: a move may be under way; "
            "ask again once it is done (or remove one of its replicas)",
        )
    error = await cluster.move_group(group, add, remove)
    if error is not None:
        raise HttpError("409 Conflict", f"the move of {group} did not complete: {error}", reason="move failed")
    return {"group": group, "added": add, "removed": remove, "members": cluster.placement()[group]}
