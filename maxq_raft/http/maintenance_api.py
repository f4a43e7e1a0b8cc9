"""POST /api/cluster/drain and /api/cluster/revive: maintenance mode (machines/maintenance.py).

Body `{"node": NAME}` (and `"dry_run": true` to see the plan and change nothing). Asked on any
member, for any member: the record is replicated through the metadata group, and the member
named acts on it by itself (server/watchdog.py). The answer names the groups the member leads
now (the leaderships it hands over). Refused: on a single node (409: no other member could take
its clients), before every member supports it (409, the `maintenance_mode` feature flag), for a
node that is not a member (404), and when no other member would be left serving (409).
"""

from __future__ import annotations

from typing import Any

from ..config import NODE_ID
from ..machines.maintenance import FEATURE, SetMaintenance, drain_refusal
from .engine_status import engine_status
from .requests import HttpError, Request, commit


async def drain(broker: Any, request: Request) -> dict:
    return await _set_maintenance(broker, request, draining=True)


async def revive(broker: Any, request: Request) -> dict:
    return await _set_maintenance(broker, request, draining=False)


async def _set_maintenance(broker: Any, request: Request, draining: bool) -> dict:
    body = request.json()
    name = body.get("node")
    if not isinstance(name, str) or not NODE_ID.match(name):
        raise HttpError("400 Bad Request", f"node must be 1-64 of letters, digits, '_', '.', '-', got {name!r}")
    dry_run = body.get("dry_run", False)
    if type(dry_run) is not bool:
        raise HttpError("400 Bad Request", f"dry_run must be true or false, got {dry_run!r}")
    if broker.log.replication_node is None:
        raise HttpError(
            "409 Conflict",
            "a single node cannot be drained: no other member would take its clients",
            reason="single node",
        )
    meta = broker.meta
    if not meta.feature_enabled(FEATURE):
        raise HttpError(
            "409 Conflict",
            f"the feature flag {FEATURE} is not enabled: a member runs an earlier release or is not linked "
            "(GET /api/feature-flags)",
            reason="feature flag disabled",
        )
    members = broker.log.members()
    if draining:
        refusal = drain_refusal(name, members, meta.draining)
        if refusal is not None:
            status = "404 Not Found" if name not in members else "409 Conflict"
            raise HttpError(status, refusal, reason="unknown node" if name not in members else "last member")
    elif name not in members and name not in meta.draining:
        raise HttpError("404 Not Found", f"node {name} is not a member of the cluster", reason="unknown node")
    groups = await engine_status(broker)
    leads = sorted(group for group, status in groups.items() if status.get("leader") == name)
    answer = {"ok": True, "node": name, "draining": draining, "leads": leads, "dry_run": dry_run}
    if dry_run:
        return {**answer, "changed": False}
    reply = await commit(broker, SetMaintenance(name, draining))
    return {**answer, "changed": reply is True}
