"""Connections, channels and consumers of the whole cluster, as RabbitMQ's management API lists
them from any node.

Why: each member holds only its own clients' sessions, so GET /api/connections through one
member of three listed a third of the cluster's connections, and a connection of another
member could not be looked at or closed there (rabbitmqadmin, the web UI and `maxqctl list`
showed each member alone; RabbitMQ's lists have every node's, each item naming its node). The
overview's object_totals count them the same way, and GET /api/health/checks/alarms lists every
member's resource alarms (it answered for the member asked only, so a probe of n1 passed while
n2's disk was full); GET /api/nodes gives each member's own figures (memory, disk, descriptors).

How: the member answering asks every other member linked to it for its own items over the
members' message channel (server/remote.py: "lv" with the list's kind, "lvr" with the items;
"lx" to close one of its connections, "lxr" with the outcome) and lists them after its own. A
member that does not answer within ASK_WAIT_S is left out, as RabbitMQ leaves out a node that
is down, and the log says so. A connection's name starts with its member's name
(`session.id`), which is how GET and DELETE /api/connections/{name} find the member to ask.

Behind the feature flag `cluster_lists`: a member of an earlier release would drop the question
and be waited for in vain. A single node, or a cluster before the flag, lists its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import trio

from ..machines.features import CLUSTER_LISTS
from . import auth, management_views
from .requests import HttpError, Reply, Request

log = logging.getLogger("maxq.http")

ASK_WAIT_S = 2.0
KINDS: dict[str, Callable[[Any], list[dict]]] = {
    "connections": management_views.connection_views,
    "channels": management_views.channel_views,
    "consumers": management_views.consumer_views,
    "totals": management_views.client_totals,
    "alarms": management_views.alarm_list,
    "node": lambda broker: [management_views.this_node(broker)],
}
# DELETE /api/connections/{name} for another member's connection: what its answer means
CLOSED, NOT_FOUND, FORBIDDEN = "closed", "not found", "forbidden"


def local(broker: Any, kind: str) -> list[dict]:
    """This member's own items of `kind` (one of KINDS); ValueError for another kind."""
    views = KINDS.get(kind) if type(kind) is str else None
    if views is None:
        raise ValueError(f"no list {kind!r}"[:100])
    return views(broker)


def other_members(broker: Any) -> list[str]:
    """The members to ask: every other member linked to this one, once every member can answer
    (none on a single node)."""
    cluster = broker.log
    node = cluster.replication_node
    if node is None or not broker.meta.feature_enabled(CLUSTER_LISTS):
        return []
    return sorted(m for m in cluster.members() if m != broker.node_id and node.peer_is_up(m))


async def gather(broker: Any, kind: str, mine: bool = True) -> list[dict]:
    """Every member's items of `kind`: this member's (unless not `mine`), then each linked
    member's that answered."""
    items = local(broker, kind) if mine else []
    members = other_members(broker)
    if not members:
        return items
    answers: dict[str, Any] = {}

    async def ask(member: str) -> None:
        answers[member] = await broker.log.ask_member(member, ["lv", kind], ASK_WAIT_S)

    async with trio.open_nursery() as nursery:
        for member in members:
            nursery.start_soon(ask, member)
    for member in members:  # (in the cluster's order, not the answers')
        answer = answers.get(member)
        if answer is None or len(answer) != 2 or type(answer[0]) is not list:
            why = "no answer" if answer is None else (answer[1] if len(answer) == 2 else "a malformed answer")
            log.warning("%s left out of the %s listed: %s within %.0f s", member, kind, why, ASK_WAIT_S)
            continue
        items.extend(item for item in answer[0] if type(item) is dict)
    return items


async def client_totals(broker: Any) -> dict[str, int]:
    """The overview's object_totals of clients: every member's that answered, summed."""
    summed = {"connections": 0, "channels": 0, "consumers": 0}
    for counts in await gather(broker, "totals"):
        for key in summed:
            value = counts.get(key)
            summed[key] += value if type(value) is int else 0
    return summed


def member_of(broker: Any, connection: str) -> str | None:
    """The other member whose connection `connection` names, if it is one to ask."""
    member = connection.partition("@")[0]
    return member if member in other_members(broker) else None


async def connection_elsewhere(broker: Any, member: str, connection: str) -> dict | None:
    """`member`'s view of its connection `connection`, or None (not there, or no answer)."""
    answer = await broker.log.ask_member(member, ["lv", "connections"], ASK_WAIT_S)
    if answer is None or len(answer) != 2 or type(answer[0]) is not list:
        return None
    return next((c for c in answer[0] if type(c) is dict and c.get("name") == connection), None)


async def close_elsewhere(broker: Any, member: str, connection: str, reason: str, user: str | None) -> str | None:
    """Ask `member` to close its connection `connection` (only if its user is `user`, unless
    None): CLOSED, NOT_FOUND or FORBIDDEN; None when it did not answer."""
    answer = await broker.log.ask_member(member, ["lx", connection, reason, user], ASK_WAIT_S)
    return answer[0] if answer is not None and len(answer) == 1 and type(answer[0]) is str else None


async def get_connection(broker: Any, request: Request) -> dict:
    """GET /api/connections/{name}: this member's, or the member's its name starts with."""
    name = request.params["name"]
    member = member_of(broker, name)
    if member is None:
        return management_views.get_connection(broker, request)
    view = await connection_elsewhere(broker, member, name)
    caller = request.caller
    if view is None or caller is None or not (caller.sees_everything or view.get("user") == caller.name):
        raise HttpError("404 Not Found", "Object Not Found", reason="Not Found")
    return view


async def close_connection(broker: Any, request: Request) -> Reply:
    """DELETE /api/connections/{name} (management_views.close_connection), of a connection of
    any member: its member closes it, if the caller may (an administrator any, a user its own)."""
    name = request.params["name"]
    member = member_of(broker, name)
    if member is None:
        return management_views.close_connection(broker, request)
    caller = request.caller
    if caller is None:
        raise HttpError("404 Not Found", "Object Not Found", reason="Not Found")
    user = None if caller.has(auth.Need.ADMINISTRATOR) else caller.name
    outcome = await close_elsewhere(broker, member, name, management_views.close_reason(request), user)
    if outcome == CLOSED:
        return Reply("204 No Content")
    if outcome == FORBIDDEN and caller.sees_everything:
        raise auth.Forbidden("Access refused.")
    if outcome is None:
        raise HttpError("503 Service Unavailable", "unavailable", reason=f"{member} did not answer")
    raise HttpError("404 Not Found", "Object Not Found", reason="Not Found")


def answer(broker: Any, kind: str, asked: list) -> list:
    """What this member answers to another's question: "lv" [kind] -> [items, None] or [None,
    why]; "lx" [name, reason, user] -> [outcome]. ValueError for a malformed one."""
    if kind == "lv":
        try:
            return [local(broker, asked[0]), None]
        except (ValueError, IndexError) as exc:
            return [None, str(exc)]
    if len(asked) != 3 or type(asked[0]) is not str or type(asked[1]) is not str:
        raise ValueError(f"bad close request {asked!r}"[:200])
    name, reason, user = asked
    session = broker.sessions.get(name)
    if session is None:
        return [NOT_FOUND]
    if user is not None and session.user != user:
        return [FORBIDDEN]
    bounded = reason.encode("utf-8", "replace")[: management_views.CLOSE_REASON_MAX_BYTES]
    session.force_close(bounded.decode("utf-8", "ignore"))  # (bytes: it goes into a shortstr)
    return [CLOSED]
