"""The message trace of a cluster whose groups are held by a few members: a query answered from
every group (issue #19).

Why: each member writes the trace records of the groups it applies (server/tracer.py), so a
member holding no replica of a traced queue's group has none of its records: GET /api/trace
there answered [] for a queue whose records exist, and a message id found only the records of
the queues in groups it held. Now a member answers from its own records and asks, for the
groups it does not hold, members that hold them (over server/remote.py's channel: "tq" with the
query, "tqr" with the records or why not), as few as it can: the linked member holding most of
the groups still to cover, then the next. The records of a group are alike on each of its
holders (derived from its log), so the answers are merged and each record kept once. A group
none of whose holders is linked, or a member that does not answer within ASK_WAIT_S, fails the
query (`TraceUnavailable`, a 503) rather than answer a trace with holes.

Nothing here runs on a single node, nor where every member holds every group.
"""

from __future__ import annotations

import json
import logging
from typing import Any, NamedTuple

import trio

from .trace_store import QUERY_LIMIT_MAX, records_of

log = logging.getLogger("maxq.trace")

ASK_WAIT_S = 5.0
KEYS = ("queue", "message_id", "correlation_id")


class TraceQuery(NamedTuple):
    key: str  # one of KEYS
    vhost: str
    value: str
    since_ms: int
    until_ms: int | None
    limit: int


class TraceUnavailable(Exception):
    """Some groups' records are on members out of reach: the trace would have holes."""


def run_query(trace: Any, query: TraceQuery) -> list[dict[str, Any]]:
    """The records of this member's trace store (a TraceLog) that `query` asks for, oldest first."""
    if query.key == "queue":
        return trace.by_queue(query.vhost, query.value, query.since_ms, query.until_ms, query.limit)
    if query.key == "message_id":
        found = trace.by_message_id(query.vhost, query.value, QUERY_LIMIT_MAX)
    else:
        found = trace.by_correlation_id(query.vhost, query.value, QUERY_LIMIT_MAX)
    found = [
        record
        for record in found
        if record["time_ms"] >= query.since_ms and (query.until_ms is None or record["time_ms"] <= query.until_ms)
    ]
    return records_of(found)[: query.limit]


def query_from_item(item: Any) -> TraceQuery:
    """A "tq" item's query; ValueError when malformed (another member's message)."""
    if type(item) is not list or len(item) != 6:
        raise ValueError(f"bad trace query {item!r}"[:200])
    key, vhost, value, since_ms, until_ms, limit = item
    if (
        key not in KEYS
        or type(vhost) is not str
        or type(value) is not str
        or type(since_ms) is not int
        or not (until_ms is None or type(until_ms) is int)
        or type(limit) is not int
        or not 1 <= limit <= QUERY_LIMIT_MAX
    ):
        raise ValueError(f"bad trace query {item!r}"[:200])
    return TraceQuery(key, vhost, value, since_ms, until_ms, limit)


def merged(answers: list[list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """The records of several members' answers, each once, oldest first, at most `limit`."""
    seen: set[str] = set()
    out = []
    for records in answers:
        for record in records:
            identity = json.dumps(record, sort_keys=True, default=str)
            if identity not in seen:
                seen.add(identity)
                out.append(record)
    return records_of(out)[:limit]


def members_to_ask(groups: list[str], holders: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """Few members that between them hold every group of `groups` (`holders`: group -> the
    linked members holding it), and the groups none of them holds."""
    left = set(groups)
    uncovered = sorted(g for g in left if not holders.get(g))
    left -= set(uncovered)
    chosen = []
    while left:
        counts: dict[str, int] = {}
        for group in left:
            for member in holders[group]:
                counts[member] = counts.get(member, 0) + 1
        best = min(counts, key=lambda m: (-counts[m], m))
        chosen.append(best)
        left = {g for g in left if best not in holders[g]}
    return chosen, uncovered


async def gather(cluster: Any, query: TraceQuery) -> list[dict[str, Any]]:
    """`query`'s records from every shard group: this member's, and those of the groups it does
    not hold from members that do. Raises TraceUnavailable."""
    local = run_query(cluster.broker.tracer.log, query)
    node = cluster.node
    if node is None or not cluster.remote_out.active:
        return local
    placement = cluster.placement()
    elsewhere = [g for g in cluster.shards if g not in node.groups]
    holders = {g: [m for m in placement.get(g, []) if m != cluster.node_id and node.peer_is_up(m)] for g in elsewhere}
    members, uncovered = members_to_ask(elsewhere, holders)
    if uncovered:
        raise TraceUnavailable(
            f"the trace records of {', '.join(uncovered)} are on members not reachable from {cluster.node_id}"
        )
    answers = [local]
    async with trio.open_nursery() as nursery:
        results: dict[str, Any] = {}

        async def ask(member: str) -> None:
            results[member] = await cluster.ask_trace(member, list(query), ASK_WAIT_S)

        for member in members:
            nursery.start_soon(ask, member)
    for member in members:
        answer = results.get(member)
        if type(answer) is not list:
            raise TraceUnavailable(f"{member} did not give its trace records: {answer}")
        answers.append(answer)
    return merged(answers, query.limit)


def answer(cluster: Any, peer: str, request: Any, item: Any) -> None:
    """A member asks this one for its trace records ("tq"): the answer goes back ("tqr")."""
    try:
        query = query_from_item(item)
        reply: list[Any] = ["tqr", request, run_query(cluster.broker.tracer.log, query), None]
    except ValueError as exc:
        reply = ["tqr", request, None, str(exc)]
    except Exception as exc:  # the store (a read failed): said, not raised into the link's handler
        log.exception("a trace query from %s failed", peer)
        reply = ["tqr", request, None, f"the trace store failed: {exc}"]
    cluster.remote_out.outgoing.setdefault(peer, []).append(reply)
    cluster.remote_out.flush()
