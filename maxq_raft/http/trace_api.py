"""GET /api/trace/{vhost}: the message trace's records (x-trace, server/tracer.py) as JSON.

Exactly one of `message_id`, `correlation_id` or `queue` says which records; `since` and
`until` bound their time (with `queue`: the scan's range; otherwise a filter), each either ms
since the epoch or a duration back from now ("90s", "10m", "2h", "7d"); `limit` (1-10000,
default 1000) caps the answer. Records come oldest first. The caller needs the monitoring (or
administrator) tag, as for every view that reads across users: a trace names users, connections
and, with x-trace-bodies, message bodies. The records of a group are alike on every member
holding it (derived from the replicated log), so any member answers: where groups are held by a
few members, from its own records and those of the groups it does not hold, asked of members
that hold them (server/trace_gather.py; 503 when some are out of its reach).
"""

from __future__ import annotations

import re
from typing import Any

from ..server.trace_gather import TraceQuery, TraceUnavailable, gather, run_query
from ..server.trace_store import QUERY_LIMIT_DEFAULT, QUERY_LIMIT_MAX
from .listing import LIST_PARAMETERS
from .objects_api import _vhost, vhost_not_found
from .requests import HttpError, Request

_DURATION = re.compile(r"^(\d{1,12})(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_KEYS = ("message_id", "correlation_id", "queue")
_PARAMETERS = frozenset((*_KEYS, "since", "until", "limit", *LIST_PARAMETERS))


def _bad(reason: str) -> HttpError:
    return HttpError("400 Bad Request", "bad_request", reason=reason)


def parse_time_ms(text: str, now_ms: int, name: str) -> int:
    """`since`/`until`: ms since the epoch (all digits) or a duration back from `now_ms`."""
    if text.isdigit() and len(text) <= 16:
        return int(text)
    match = _DURATION.match(text)
    if match is None:
        raise _bad(f"{name} must be ms since the epoch or a duration like 90s, 10m, 2h, 7d; got {text[:64]!r}")
    return now_ms - int(match.group(1)) * _UNIT_MS[match.group(2)]


def _one(request: Request, name: str) -> str | None:
    values = request.query.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise _bad(f"{name} given {len(values)} times")
    return values[0]


async def get_trace(broker: Any, request: Request) -> list[dict[str, Any]]:
    vhost = _vhost(broker, request, vhost_not_found)
    # (the list parameters, sort, columns, page..., shape the answer as for every list: listing.py)
    unknown = sorted(key for key in request.query if key not in _PARAMETERS)
    if unknown:
        raise _bad(f"unknown parameter {unknown[0]!r}: use message_id, correlation_id or queue, since, until, limit")
    given = {key: value for key in _KEYS if (value := _one(request, key)) is not None}
    if len(given) != 1:
        raise _bad("give exactly one of message_id, correlation_id or queue")
    ((key, value),) = given.items()
    if not value:
        raise _bad(f"{key} must not be empty")
    now_ms = broker.clock_ms()
    since = _one(request, "since")
    until = _one(request, "until")
    since_ms = parse_time_ms(since, now_ms, "since") if since is not None else 0
    until_ms = parse_time_ms(until, now_ms, "until") if until is not None else None
    if until_ms is not None and until_ms < since_ms:
        raise _bad("until is before since")
    limit_text = _one(request, "limit")
    limit = QUERY_LIMIT_DEFAULT
    if limit_text is not None:
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= QUERY_LIMIT_MAX:
            raise _bad(f"limit must be an integer 1-{QUERY_LIMIT_MAX}; got {limit_text[:32]!r}")
        limit = int(limit_text)
    query = TraceQuery(key, vhost, value, since_ms, until_ms, limit)
    if broker.log.replication_node is None:  # a single node
        return run_query(broker.tracer.log, query)
    try:
        return await gather(broker.log, query)
    except TraceUnavailable as exc:
        raise HttpError("503 Service Unavailable", "unavailable", reason=str(exc)) from None
