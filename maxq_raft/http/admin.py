"""The HTTP admin API every node serves (`maxqctl` talks to it).

Theory of operation: JSON in and out over HTTP/1.1 (admin_app.py reads and answers requests as
an ASGI app, hypercorn serves it with keep-alive: asgi_server.py). GET endpoints are views: functions from the broker's state to a JSON-able value,
so the same views serve `maxqctl` and scripts. POST and DELETE endpoints change the cluster's
membership or move leadership: they hand the change to the replication engine and wait
(bounded) for its one answer, which comes from the engine's hub thread and is carried back into
trio with `run_sync_soon`. Reading a request is bounded in bytes (head and body, 16 KiB) and in
time (admin_app.py); every change is bounded by its own deadline, so a bad client or a stuck change cannot
hold the node. One route takes more: a definitions import (POST /api/definitions, the only
body that grows with the broker's topology) may send up to 16 MiB, read within 60 s.

PUT and DELETE /api/policies/{vhost}/{name} set and clear a policy (RabbitMQ's path and body:
pattern, definition, priority, apply-to), committed like any metadata change. GET and POST
/api/definitions export and import RabbitMQ's definitions (definitions_api.py).

A single node (started without --raft-addr/--peer: its log has no replication engine) reports
itself as a one-member cluster and refuses membership commands with 409.
"""

from __future__ import annotations

import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any
from urllib.parse import unquote, urlsplit

import trio

from ..machines import metadata as md
from ..machines.maintenance import SetMaintenance
from ..machines.metadata import META_GROUP
from ..machines.queue_types import Rejected
from ..server.hosts import is_ip
from ..server.message_rates import exchange_counts
from . import (
    access_api,
    auth,
    cluster_lists,
    definitions_api,
    feature_flags_api,
    fresh_stats,
    health_api,
    maintenance_api,
    management_views,
    messages_api,
    objects_api,
    placement_api,
    trace_api,
)
from .engine_status import engine_status
from .requests import HttpError, Reply, Request, commit, json_safe

log = logging.getLogger("maxq.http")
RESOLVE_TIMEOUT_S = 5.0  # a new member's raft_addr host looked up before anything else

REQUEST_MAX_BYTES = 16384  # request line + headers + body
REQUEST_TIMEOUT_S = 5.0  # to read a request's head (and between requests), and its body
DEFINITIONS_PATH = "/api/definitions"  # a POST here (or under it) may carry a larger body ...
DEFINITIONS_MAX_BYTES = 16 << 20  # ... up to this (RabbitMQ's management.http.max_body_size is 20 MB) ...
DEFINITIONS_READ_TIMEOUT_S = 60.0  # ... read within this, counted from the request's start
MEMBER_CHANGE_TIMEOUT_S = 35.0  # the engine's own deadline is 30 s
TRANSFER_TIMEOUT_S = 10.0  # a group's transfer gives up after 3 s itself
NODE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as config.NODE_ID
NOT_A_MEMBER = "this node is not a cluster member (started without --raft-addr/--peer)"


# ------------------------------------------------------------------------------ views (GET)


async def view_overview(broker, request: Request) -> dict:
    clients: dict[str, int] = {}

    async def gather_clients() -> None:
        clients.update(await cluster_lists.client_totals(broker))  # (every member's clients)

    async with trio.open_nursery() as nursery:  # (both ask other members: side by side)
        nursery.start_soon(gather_clients)
        # queue_totals: the counts of now of queues whose groups are held elsewhere, too
        nursery.start_soon(fresh_stats.refresh, broker, [key for key, _ in broker.shown_queues()])
    extras = management_views.overview_extras(broker)
    extras["object_totals"].update(clients)
    return {
        **extras,
        "node": broker.node_id,
        "uptime_s": round(time.time() - broker.started_at, 1),
        "queues": len(broker.queues),
        "connections": len(broker.sessions),
        "consumers": len(broker.consumers),
        "messages_published": broker.messages_published,
        "messages_delivered": broker.messages_delivered,
    }


def view_status_single(broker) -> dict:
    # A single node is a one-member cluster: it leads its only group.
    return {
        "node": broker.node_id,
        "clustered": False,
        "members": [{"node": broker.node_id, "state": "up", "role": "leader"}],
        "groups": [
            {
                "group": "metadata",
                "leader": broker.node_id,
                "commit_index": broker.log.index,
                "applied_index": broker.log.index,
                "members": [{"node": broker.node_id, "lag": 0}],
            }
        ],
    }


def _group_order(name: str) -> tuple:
    # meta first, then shard-0, shard-1, ... shard-10 in numeric order
    head, _, tail = name.rpartition("-")
    return (name != META_GROUP, head, int(tail) if tail.isdigit() else -1, name)


def status_from_engine(node_id: str, groups: dict[str, dict]) -> dict:
    """The cluster as this node sees it, from ReplicationNode.status() (group.Group.status).

    A member's match index and lag are known only to the group's leader: asked elsewhere they
    are None. "connected" is this node's view of its link to the member."""
    out_groups = []
    seen: dict[str, dict] = {}
    for name in sorted(groups, key=_group_order):
        g = groups[name]
        members = []
        for mid, m in sorted(g.get("members", {}).items()):
            up = bool(m.get("self")) or bool(m.get("connected"))
            members.append(
                {
                    "node": mid,
                    "connected": up,
                    "match_index": m.get("match_index"),
                    "next_index": m.get("next_index"),
                    "lag": m.get("lag"),
                }
            )
            record = seen.setdefault(mid, {"node": mid, "up": up, "groups": 0, "leads": []})
            record["up"] = record["up"] or up
            record["groups"] += 1
        leader = g.get("leader")
        if leader is not None:
            seen.setdefault(leader, {"node": leader, "up": leader == node_id, "groups": 0, "leads": []})[
                "leads"
            ].append(name)
        out_groups.append(
            {
                "group": name,
                "leader": leader,
                "role": g.get("role"),
                "term": g.get("term"),
                "commit_index": g.get("commit_index"),
                "applied_index": g.get("applied_index"),
                "last_index": g.get("last_index"),
                "durable_index": g.get("durable_index"),
                "first_index": g.get("first_index"),
                "snapshot_index": g.get("snapshot_index"),
                "membership_change_pending": bool(g.get("membership_change_pending")),
                "removed": bool(g.get("removed")),
                "failed": g.get("failed"),
                "members": members,
            }
        )
    meta = groups.get(META_GROUP, {})
    total = len(groups)
    out_members = []
    for mid in sorted(seen):
        r = seen[mid]
        out_members.append(
            {
                "node": mid,
                "state": "up" if r["up"] else "unreachable",
                "role": "leader" if meta.get("leader") == mid else "follower",
                "leads": len(r["leads"]),
                "groups": f"{r['groups']}/{total}",
            }
        )
    return {
        "node": node_id,
        "clustered": True,
        "removed": any(g.get("removed") for g in groups.values()),
        "membership_change_pending": any(g.get("membership_change_pending") for g in groups.values()),
        "members": out_members,
        "groups": out_groups,
    }


async def view_nodes(broker, request: Request) -> list:
    groups = None if broker.log.replication_node is None else await engine_status(broker)
    nodes = management_views.node_views(broker, groups)
    # Each other member's own figures, from it (those that did not answer keep what this node sees).
    figures = {n.get("name"): n for n in await cluster_lists.gather(broker, "node", mine=False)}
    return [{**node, **figures[node["name"]]} if node["name"] in figures else node for node in nodes]


async def view_node(broker, request: Request) -> dict:
    for node in await view_nodes(broker, request):
        if node["name"] == request.params["name"]:
            return node
    raise HttpError("404 Not Found", "Object Not Found", reason="Not Found")


async def view_status(broker, request: Request) -> dict:
    node = broker.log.replication_node
    if node is None:
        return view_status_single(broker)
    status = with_placement(status_from_engine(broker.node_id, await engine_status(broker)), broker.meta)
    return with_members_over_placement(status, broker.meta, node.leader)


def with_members_over_placement(status: dict, meta, leader_of) -> dict:
    """`status` with each member's "groups" and "leads" counted over every group of the cluster
    once placement is recorded: the groups held elsewhere by their recorded replicas, their
    leaders as `leader_of` (ReplicationNode.leader: for a group held elsewhere, as its leader
    last said) names them. Counted over the groups held here only, a member of 7 at factor 3
    showed "7/7" and one leading a group held elsewhere "leads 0"."""
    if not meta.shard_groups:
        return status
    holders = {g["group"]: [m["node"] for m in g["members"]] for g in status["groups"]}
    leaders = {g["group"]: g["leader"] for g in status["groups"]}
    for name, replicas in meta.shard_groups.items():
        if name not in holders:
            holders[name] = list(replicas)
            leaders[name] = leader_of(name)
    for member in status["members"]:
        node = member["node"]
        member["groups"] = f"{sum(node in held for held in holders.values())}/{len(holders)}"
        member["leads"] = sum(leader == node for leader in leaders.values())
    return status


def with_placement(status: dict, meta) -> dict:
    """`status` with what the metadata group records of each shard group (machines/placement.py):
    its replicas and how many queues it holds; both None while nothing is recorded."""
    status["placement_recorded"] = bool(meta.shard_groups)
    queues = meta.queues_per_group() if meta.shard_groups else {}
    for group in status["groups"]:
        replicas = meta.shard_groups.get(group["group"])
        group["replicas"] = list(replicas) if replicas is not None else None
        group["queues"] = queues.get(group["group"], 0) if replicas is not None else None
    return status


def view_exchanges(broker) -> list:
    counts = exchange_counts(broker)
    return [
        objects_api.exchange_view(broker, vhost, record, counts)
        for vhost, v in broker.meta.vhosts.items()
        for record in v.exchanges.values()
    ]


def view_bindings(broker) -> list:
    return [binding for vhost in broker.meta.vhosts for binding in objects_api.bindings_of(broker, vhost)]


# ------------------------------------------------------------------- changes (POST, PUT, DELETE)


def _policy_rows(broker, kind: str) -> list:
    """`kind` ("policies" or "operator_policies") of every vhost, in RabbitMQ's shape."""
    return [
        {
            "vhost": vhost_name,
            "name": p.name,
            "pattern": p.pattern,
            "apply-to": p.apply_to,
            "definition": json_safe(p.definition),
            "priority": p.priority,
        }
        for vhost_name, vhost in broker.meta.vhosts.items()
        for p in getattr(vhost, kind).values()
    ]


def view_policies(broker) -> list:
    return _policy_rows(broker, "policies")


async def _write_policy(broker, command: Any, refused: Any, kind: str) -> Reply:
    """Commit a policy or operator policy `command` that its record check did not refuse;
    RabbitMQ's answer: 201 Created for a new one, 204 No Content for a change. `kind` is the
    vhost record's dict of them ("policies" or "operator_policies")."""
    if isinstance(refused, Rejected):  # before anything is proposed: a refusal leaves the log as it was
        raise HttpError("400 Bad Request", refused.reply_text)
    record = broker.meta.vhosts.get(command.vhost)
    existed = record is not None and command.name in getattr(record, kind)
    await commit(broker, command)
    return Reply("204 No Content" if existed else "201 Created")


async def put_policy(broker, request: Request) -> Reply:
    spec = request.json()
    if "pattern" not in spec or "definition" not in spec:
        raise HttpError("400 Bad Request", "a policy is a JSON object with pattern and definition")
    command = md.SetPolicy(
        request.params["vhost"],
        request.params["name"],
        spec["pattern"],
        spec["definition"],
        spec.get("priority", 0),
        spec.get("apply-to", "all"),
    )
    return await _write_policy(broker, command, md.policy_record(command), "policies")


async def delete_policy(broker, request: Request) -> Reply:
    await commit(broker, md.ClearPolicy(request.params["vhost"], request.params["name"]))
    return Reply("204 No Content")


def view_operator_policies(broker) -> list:
    return _policy_rows(broker, "operator_policies")


async def put_operator_policy(broker, request: Request) -> Reply:
    """RabbitMQ's PUT /api/operator-policies/{vhost}/{name}: a policy's body; apply-to is
    "queues" (the default), the keys OPERATOR_POLICY_KEYS."""
    spec = request.json()
    if not isinstance(spec, dict) or "pattern" not in spec or "definition" not in spec:
        raise HttpError("400 Bad Request", "an operator policy is a JSON object with pattern and definition")
    command = md.SetOperatorPolicy(
        request.params["vhost"],
        request.params["name"],
        spec["pattern"],
        spec["definition"],
        spec.get("priority", 0),
        spec.get("apply-to", "queues"),
    )
    return await _write_policy(broker, command, md.operator_policy_record(command), "operator_policies")


async def delete_operator_policy(broker, request: Request) -> Reply:
    await commit(broker, md.ClearOperatorPolicy(request.params["vhost"], request.params["name"]))
    return Reply("204 No Content")


async def _engine_answer(start: Callable[[Callable[[str | None], None]], None], timeout_s: float) -> str | None:
    """Start an engine change whose callback(error) comes once from the hub thread (or at once,
    in this thread); wait for it, bounded. The answer after a timeout is dropped."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list[str | None] = []

    def deliver(err: str | None) -> None:
        if not box:
            box.append(err)
            done.set()

    def callback(err: str | None) -> None:
        try:
            token.run_sync_soon(deliver, err)
        except trio.RunFinishedError:
            pass  # the server is gone; nobody waits

    start(callback)
    with trio.move_on_after(timeout_s):
        await done.wait()
    return box[0] if box else f"timeout: no answer within {timeout_s:.0f} s (the change may still complete)"


def _engine_error(err: str, **extra: Any) -> HttpError:
    """Map an engine error string to an HTTP status."""
    if err.startswith("busy") or "pending" in err:
        return HttpError(
            "409 Conflict",
            f"a membership change is already in progress ({err}); wait and retry",
            reason="pending",
            **extra,
        )
    if err.startswith("not leader"):
        return HttpError("409 Conflict", err, reason="not leader", **extra)
    if err.startswith("unreachable"):
        return HttpError("502 Bad Gateway", err, reason="unreachable", **extra)
    if err.startswith("timeout"):
        return HttpError("504 Gateway Timeout", err, reason="timeout", **extra)
    return HttpError("503 Service Unavailable", err, reason=err.split(":", 1)[0], **extra)


def _cluster_node(broker):
    node = broker.log.replication_node
    if node is None:
        raise HttpError("409 Conflict", NOT_A_MEMBER, reason="not clustered")
    return node


def _node_name(value: Any, what: str = "node") -> str:
    if not isinstance(value, str) or not NODE_NAME.match(value):
        raise HttpError("400 Bad Request", f"{what} must be 1-64 of letters, digits, '_', '.', '-', got {value!r}")
    return value


def _raft_addr(value: Any) -> tuple[str, int]:
    text = value if isinstance(value, str) else ""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) <= 65535 or any(c.isspace() for c in text):
        raise HttpError("400 Bad Request", f"raft_addr must be HOST:PORT with a port 1-65535, got {value!r}")
    return host, int(port)


def _pending_groups(groups: dict[str, dict]) -> list[str]:
    return sorted((n for n, g in groups.items() if g.get("membership_change_pending")), key=_group_order)


def quorum_after_removal(groups: dict[str, dict], target: str) -> list[str]:
    """Groups that, without `target`, would have fewer reachable members (as this node sees
    them) than a majority of their new configuration: the removal would leave them unable to
    commit. Empty: safe."""
    lost = []
    for name in sorted(groups, key=_group_order):
        members = groups[name].get("members", {})
        if target not in members:
            continue
        rest = {mid: m for mid, m in members.items() if mid != target}
        up = sum(1 for m in rest.values() if m.get("self") or m.get("connected"))
        if not rest or up <= len(rest) // 2:
            lost.append(f"{name}: {up} of {len(rest)} remaining members reachable")
    return lost


async def _resolvable(addr: tuple[str, int]) -> tuple[str, int]:
    """`addr` if its host resolves here, else a 400: this member opens the first link to a new
    one, so a name it cannot resolve would only end in "unreachable" after the handshake's wait
    (found by scripts/fuzz on a cluster member: raft_addr "x:1" was a 502 after 5 s)."""
    try:
        with trio.fail_after(RESOLVE_TIMEOUT_S):
            await trio.socket.getaddrinfo(addr[0], addr[1], type=socket.SOCK_STREAM)
    except (OSError, trio.TooSlowError) as exc:  # (socket.gaierror is an OSError)
        why = "no answer" if isinstance(exc, trio.TooSlowError) else str(exc)
        raise HttpError("400 Bad Request", f"raft_addr host {addr[0]!r} does not resolve here: {why}") from None
    return addr


def _layout_mismatch(name: str, held: frozenset[str] | None, groups: set[str], partial: bool) -> str | None:
    """Why node `name`, holding `held` as it announced (None: not heard), must not be added to a
    cluster whose members hold every group (not `partial`) or a few: it would be added to groups
    it does not run (a voter that never answers: the groups' majority then has one failure less
    to spare, and the node never gets ready), or run groups it is never added to. Its layout is
    its --replication-factor's (server/main.py, `_first_placement`), decided before it is added."""
    if held is None or not held <= groups:
        return None  # (not heard, or it runs other groups: the engine cuts it off, or it takes ours)
    if not partial and held != groups:
        return (
            f"node {name} holds only {', '.join(sorted(held)) or 'no group'} (started with --join on and "
            "--replication-factor, for a cluster whose groups are on a few members), but every member of this "
            "cluster holds every group (its --replication-factor is at least its number of members, or 0): "
            f"start {name} again on an empty --data-dir with --join on and --replication-factor 0 (it then holds "
            "every group), then add it"
        )
    if partial and held != {META_GROUP}:
        return (
            f"node {name} holds {', '.join(sorted(held))} (started with --join on and --replication-factor 0, "
            f"or on a folder that held groups), but this cluster's groups are on a few members and a new member "
            f"holds the metadata group only until a rebalance: start {name} again on an empty --data-dir with "
            "--join on and the cluster's --replication-factor, add it, then rebalance"
        )
    return None


async def add_member(broker, request: Request) -> dict:
    body = request.json()
    name = _node_name(body.get("node"))
    addr = await _resolvable(_raft_addr(body.get("raft_addr")))
    node = _cluster_node(broker)
    groups = await engine_status(broker)
    # (groups placed on a few members: a member is one of the metadata group, which every member holds)
    if all(name in g.get("members", {}) for group, g in groups.items() if group == META_GROUP or not node.partial):
        raise HttpError("409 Conflict", f"node {name} is already a member of the cluster", reason="already a member")
    pending = _pending_groups(groups)
    if pending:
        raise HttpError(
            "409 Conflict",
            f"a membership change is already in progress in {', '.join(pending)}; wait and retry",
            reason="pending",
        )
    missing = await feature_flags_api.missing_features(broker, name)
    if missing is None:
        raise HttpError(
            "409 Conflict",
            f"node {name} is linked to {broker.node_id} but announced no features within "
            f"{feature_flags_api.ANNOUNCE_WAIT_S:.0f} s: it runs a release from before feature flags, and a "
            "release without feature flags cannot join this cluster; run this release on it first",
            reason="missing feature flags",
        )
    if missing:
        raise HttpError(
            "409 Conflict",
            f"node {name} does not support feature flags enabled in this cluster ({', '.join(missing)}): it runs "
            "an earlier release and would stop at their first command; run this release on it first",
            reason="missing feature flags",
            missing=missing,
        )
    held = None if name in node.mismatched_peers() else node.peer_held().get(name)  # (other groups: its own check)
    mismatch = _layout_mismatch(name, held, set(node.group_names), node.partial)
    if mismatch is not None:
        raise HttpError("409 Conflict", mismatch, reason="layout mismatch")
    knows = node.peer_knows().get(name)
    current = sorted({m for g in groups.values() for m in g.get("members", {})} - {name})
    unknown = [m for m in current if knows is not None and m not in knows]
    if unknown:
        # Its groups take frames only from the members they started with until the log tells
        # them more: started with a --peer list naming a member since removed and not the one
        # that replaced it, it never heard the leader and never got ready (a cluster test).
        raise HttpError(
            "409 Conflict",
            f"node {name} was started with --peer naming {', '.join(sorted(knows or ())) or 'no member'}, not "
            f"{', '.join(unknown)}: it would not hear the members it is added to. Start it again on an empty "
            f"--data-dir with --join on and --peer for each member now ({', '.join(current)}), then add it",
            reason="peers unknown",
            members=current,
        )
    log.info("admin: adding member %s at %s:%d", name, addr[0], addr[1])
    # Groups on a few members (--replication-factor): a new member joins the metadata group only
    # and holds no shard group until a rebalance moves replicas onto it (maxqctl rebalance).
    only = [META_GROUP] if node.partial else None
    err = await _engine_answer(partial(node.add_member, name, addr, groups=only), MEMBER_CHANGE_TIMEOUT_S)
    if err is not None:
        log.warning("admin: adding member %s failed: %s", name, err)
        raise _engine_error(err, node=name)
    return {"ok": True, "action": "added", "node": name, "raft_addr": f"{addr[0]}:{addr[1]}"}


async def remove_member(broker, request: Request) -> dict:
    name = _node_name(request.params.get("name", ""))
    node = _cluster_node(broker)
    force = request.query.get("force", ["0"])[-1].lower() in ("1", "true", "yes", "on")
    groups = await engine_status(broker)
    members = sorted({m for g in groups.values() for m in g.get("members", {})})
    if name not in members:
        raise HttpError(
            "404 Not Found",
            f"node {name} is not a member of the cluster (members: {', '.join(members)})",
            reason="unknown node",
            members=members,
        )
    if name == broker.node_id:
        # The member that carries a removal out tells the removed node afterwards; a node that
        # removed itself never hears it and would keep campaigning.
        raise HttpError(
            "409 Conflict", f"node {name} cannot remove itself: ask another member's admin API", reason="self removal"
        )
    pending = _pending_groups(groups)
    if pending:
        raise HttpError(
            "409 Conflict",
            f"a membership change is already in progress in {', '.join(pending)}; wait and retry",
            reason="pending",
        )
    lost = quorum_after_removal(groups, name)
    if lost and not force:
        raise HttpError(
            "409 Conflict",
            f"removing {name} would leave groups without a quorum ({'; '.join(lost)}); use --force to remove it anyway",
            reason="would lose quorum",
            groups=lost,
        )
    only = None
    if node.partial:
        # Groups on a few members: the member leaves the metadata group once it holds no replica
        # of a shard group (which this member may not hold, so could not remove it from).
        placement, unknown = await broker.log.known_placement()
        if unknown and name in broker.log.unseen_members():
            # Whether it holds a replica of a group whose holders none answered is not known: a
            # member just back from a partition was removed while it still led a group
            # (jepsen-style run, seed 2006), which was left with a replica gone for good. The
            # groups' other holders answering (`known_placement`) say it: a dead member's
            # replicas are then moved off it (drain-replicas), and it is removed.
            raise HttpError(
                "409 Conflict",
                f"node {name} is not reachable from {broker.node_id}, nor is any holder of {', '.join(unknown)}: "
                "whether it holds replicas is not known here; ask again once it is (or ask a member linked to it)",
                reason="not reachable",
            )
        held = sorted(g for g, members in placement.items() if name in members)
        staying = [m for m in members if m != name]
        if any(m not in placement[g] for g in held for m in staying):
            raise HttpError(
                "409 Conflict",
                f"node {name} still holds replicas of {', '.join(held)}: move them first (maxqctl drain-replicas {name})",
                reason="holds replicas",
                groups=held,
            )
        # Every other member holds every group it holds (a cluster of as many members as the
        # replication factor, or fewer): no replica can move, so the groups shrink to the members
        # left, as in the layout of every group ("or all members when fewer"). This member holds
        # them all (it is one of the others), so it can remove it from each.
        only = [META_GROUP, *held]
    log.info("admin: removing member %s%s", name, " (forced)" if force else "")
    err = await _engine_answer(partial(node.remove_member, name, groups=only), MEMBER_CHANGE_TIMEOUT_S)
    if err is not None:
        log.warning("admin: removing member %s failed: %s", name, err)
        raise _engine_error(err, node=name)
    if name in broker.meta.draining:
        # Drained, then removed (the usual order): the record goes with it, or a member added
        # back later under the same name would start drained.
        try:
            await commit(broker, SetMaintenance(name, False))
        except HttpError as exc:
            log.warning("admin: %s removed, but its maintenance record stays (revive it): %s", name, exc)
    return {"ok": True, "action": "removed", "node": name, "forced": force and bool(lost)}


async def transfer_leadership(broker, request: Request) -> dict:
    """Move the leadership of one group (or, with "all", of every group this node leads) to a
    member. Only a group's leader can hand it over: asked elsewhere, the answer names the leader."""
    body = request.json()
    target = _node_name(body.get("node"))
    group = body.get("group")
    if not isinstance(group, str) or not group:
        raise HttpError("400 Bad Request", f"group must be a group name or 'all', got {group!r}")
    node = _cluster_node(broker)
    groups = await engine_status(broker)
    if group != "all" and group not in groups:
        placement = broker.log.placement()
        holders = placement.get(group)
        if holders:  # a group of the cluster that this member holds no replica of
            leader = node.leader(group)
            ask = f"{leader}'s admin API" if leader in holders else f"the admin API of one of {', '.join(holders)}"
            raise HttpError(
                "409 Conflict",
                f"node {broker.node_id} holds no replica of {group} (its members: {', '.join(holders)}); ask {ask}",
                reason="not held here",
                members=holders,
                leader=leader if leader in holders else None,
            )
        raise HttpError(
            "404 Not Found",
            f"no group {group!r} (groups: {', '.join(sorted({*groups, *placement}, key=_group_order))})",
            reason="unknown group",
        )
    chosen = sorted(groups, key=_group_order) if group == "all" else [group]
    for name in chosen:
        if target not in groups[name].get("members", {}):
            raise HttpError("404 Not Found", f"node {target} is not a member of group {name}", reason="unknown node")
    results: dict[str, str] = {}
    todo = []
    for name in chosen:
        leader = groups[name].get("leader")
        if leader == target:
            results[name] = "already leads"
        elif leader != broker.node_id:
            results[name] = f"led by {leader}" if leader else "no leader"
        else:
            todo.append(name)
    if group != "all" and not todo and results[group] != "already leads":
        leader = groups[group].get("leader")
        where = f"{leader} leads it: ask {leader}'s admin API" if leader else "it has no leader right now; retry"
        raise HttpError(
            "409 Conflict", f"node {broker.node_id} does not lead {group}; {where}", reason="not leader", leader=leader
        )
    answers: dict[str, str | None] = {}

    async def move(name: str) -> None:
        answers[name] = await _engine_answer(partial(node.transfer_leadership, name, target), TRANSFER_TIMEOUT_S)

    async with trio.open_nursery() as nursery:
        for name in todo:
            nursery.start_soon(move, name)
    failed = {}
    for name in todo:
        err = answers[name]
        results[name] = "moved" if err is None else f"failed: {err}"
        if err is not None:
            failed[name] = err
    if failed:
        if group != "all":
            raise _engine_error(failed[group], group=group, node=target)
        raise HttpError(
            "503 Service Unavailable",
            f"leadership of {', '.join(failed)} did not move to {target}",
            reason="transfer failed",
            results=results,
        )
    log.info("admin: leadership of %s moved to %s", ", ".join(todo) or "no group", target)
    return {"ok": True, "node": target, "results": results}


# ----------------------------------------------------------------------------------- routing


def _view(fn: Callable[[Any], Any]) -> Callable[[Any, Request], Awaitable[Any]]:
    """A GET of `fn(broker)`; a list is filtered to what the caller may see (auth.visible)."""

    async def handler(broker, request: Request) -> Any:
        value = fn(broker)
        if isinstance(value, list) and request.caller is not None:
            return auth.visible(request.caller, broker.meta, value)
        return value

    return handler


def _listed(kind: str, in_vhost: bool = False) -> Callable[[Any, Request], Awaitable[Any]]:
    """A GET of every member's `kind` (http/cluster_lists.py), filtered as `_view`'s; with
    `in_vhost`, those of the path's vhost (404 if none such, 401 if not the caller's)."""

    async def handler(broker, request: Request) -> Any:
        vhost = objects_api.readable_vhost(broker, request) if in_vhost else None
        items = await cluster_lists.gather(broker, kind)
        if vhost is not None:
            items = [item for item in items if item.get("vhost") == vhost]
        return items if request.caller is None else auth.visible(request.caller, broker.meta, items)

    return handler


async def connection_channels(broker, request: Request) -> list:
    """GET /api/connections/{name}/channels: 404 unless the caller may see the connection."""
    await cluster_lists.get_connection(broker, request)
    name = request.params["name"]
    return [c for c in await _listed("channels")(broker, request) if c["connection_details"]["name"] == name]


async def view_channel(broker, request: Request) -> dict:
    """GET /api/channels/{name}: a channel of any member, named "connection (number)"."""
    name = request.params["name"]
    for channel in await _listed("channels")(broker, request):
        if channel["name"] == name:
            return channel
    raise HttpError("404 Not Found", "Object Not Found", reason="Not Found")


def _sync(fn: Callable[[Any, Request], Any]) -> Callable[[Any, Request], Awaitable[Any]]:
    async def handler(broker, request: Request) -> Any:
        return fn(broker, request)

    return handler


async def _all_queues(broker, request: Request) -> list:
    """GET /api/queues, filtered as `_view`'s."""
    queues = await objects_api.list_queues(broker)
    return queues if request.caller is None else auth.visible(request.caller, broker.meta, queues)


async def _whoami(broker, request: Request) -> Any:
    return access_api.whoami(broker, request.caller)


Handler = Callable[[Any, Request], Awaitable[Any]]
MANAGEMENT, POLICYMAKER, MONITORING, ADMINISTRATOR = (
    auth.Need.MANAGEMENT,
    auth.Need.POLICYMAKER,
    auth.Need.MONITORING,
    auth.Need.ADMINISTRATOR,
)
# path -> method -> (what the caller needs, handler). A policymaker's change is also checked
# against the vhost in its path (auth.check).
ROUTES: dict[str, dict[str, tuple[auth.Need, Handler]]] = {
    "/api/whoami": {"GET": (MANAGEMENT, _whoami)},
    "/api/overview": {"GET": (MANAGEMENT, view_overview)},
    "/api/cluster-name": {"GET": (MANAGEMENT, _sync(health_api.cluster_name))},
    "/api/feature-flags": {
        "GET": (ADMINISTRATOR, _sync(lambda broker, _request: feature_flags_api.feature_flags(broker)))
    },
    "/api/nodes": {"GET": (MONITORING, view_nodes)},
    "/api/nodes/{name}": {"GET": (MONITORING, view_node)},
    "/api/channels": {"GET": (MANAGEMENT, _listed("channels"))},
    "/api/channels/{name}": {"GET": (MANAGEMENT, view_channel)},
    "/api/connections/{name}/channels": {"GET": (MANAGEMENT, connection_channels)},
    "/api/vhosts/{vhost}/connections": {"GET": (MANAGEMENT, _listed("connections", in_vhost=True))},
    "/api/vhosts/{vhost}/channels": {"GET": (MANAGEMENT, _listed("channels", in_vhost=True))},
    "/api/connections/{name}": {
        "GET": (MANAGEMENT, cluster_lists.get_connection),
        "DELETE": (MANAGEMENT, cluster_lists.close_connection),
    },
    # No runtime parameters (federation, shovels) here: empty lists.
    "/api/parameters": {"GET": (POLICYMAKER, _view(lambda broker: []))},
    "/api/operator-policies": {"GET": (ADMINISTRATOR, _view(view_operator_policies))},
    "/api/operator-policies/{vhost}/{name}": {
        "PUT": (ADMINISTRATOR, put_operator_policy),
        "DELETE": (ADMINISTRATOR, delete_operator_policy),
    },
    "/api/health/checks/alarms": {"GET": (MANAGEMENT, health_api.check_alarms)},
    "/api/health/checks/local-alarms": {"GET": (MANAGEMENT, _sync(health_api.check_local_alarms))},
    "/api/health/checks/port-listener/{name}": {"GET": (MANAGEMENT, _sync(health_api.check_port_listener))},
    "/api/health/checks/protocol-listener/{name}": {"GET": (MANAGEMENT, _sync(health_api.check_protocol_listener))},
    "/api/health/checks/virtual-hosts": {"GET": (MANAGEMENT, _sync(health_api.check_virtual_hosts))},
    "/api/health/checks/node-is-quorum-critical": {"GET": (MANAGEMENT, health_api.check_quorum_critical)},
    "/api/health/checks/node-is-mirror-sync-critical": {
        "GET": (MANAGEMENT, _sync(health_api.check_mirror_sync_critical))
    },
    "/api/cluster/status": {"GET": (MONITORING, view_status)},
    "/api/cluster/members": {"POST": (ADMINISTRATOR, add_member)},
    "/api/cluster/members/{name}": {"DELETE": (ADMINISTRATOR, remove_member)},
    "/api/cluster/transfer-leadership": {"POST": (ADMINISTRATOR, transfer_leadership)},
    "/api/cluster/drain": {"POST": (ADMINISTRATOR, maintenance_api.drain)},
    "/api/cluster/placement": {"GET": (MONITORING, placement_api.view_placement)},
    "/api/cluster/move-group": {"POST": (ADMINISTRATOR, placement_api.move_group)},
    "/api/cluster/revive": {"POST": (ADMINISTRATOR, maintenance_api.revive)},
    "/api/queues": {"GET": (MANAGEMENT, _all_queues)},
    "/api/queues/{vhost}": {"GET": (MANAGEMENT, objects_api.list_in_vhost)},
    "/api/queues/{vhost}/{name}": {
        "GET": (MANAGEMENT, objects_api.get_queue),
        "PUT": (MANAGEMENT, objects_api.put_queue),
        "DELETE": (MANAGEMENT, objects_api.delete_queue),
    },
    "/api/queues/{vhost}/{name}/contents": {"DELETE": (MANAGEMENT, objects_api.purge_queue)},
    "/api/queues/{vhost}/{name}/actions": {"POST": (MANAGEMENT, objects_api.queue_action)},
    "/api/queues/{vhost}/{name}/get": {"POST": (MANAGEMENT, messages_api.get)},
    "/api/exchanges/{vhost}/{name}/publish": {"POST": (MANAGEMENT, messages_api.publish)},
    "/api/aliveness-test/{name}": {"GET": (MANAGEMENT, messages_api.aliveness_test)},  # {name}: a vhost
    "/api/exchanges": {"GET": (MANAGEMENT, _view(view_exchanges))},
    "/api/exchanges/{vhost}": {"GET": (MANAGEMENT, _sync(objects_api.exchanges_in_vhost))},
    "/api/exchanges/{vhost}/{name}": {
        "GET": (MANAGEMENT, _sync(objects_api.get_exchange)),
        "PUT": (MANAGEMENT, objects_api.put_exchange),
        "DELETE": (MANAGEMENT, objects_api.delete_exchange),
    },
    "/api/exchanges/{vhost}/{name}/bindings/source": {
        "GET": (MANAGEMENT, _sync(partial(objects_api.exchange_bindings, as_source=True)))
    },
    "/api/exchanges/{vhost}/{name}/bindings/destination": {
        "GET": (MANAGEMENT, _sync(partial(objects_api.exchange_bindings, as_source=False)))
    },
    "/api/queues/{vhost}/{name}/bindings": {"GET": (MANAGEMENT, _sync(objects_api.queue_bindings))},
    "/api/bindings/{vhost}": {"GET": (MANAGEMENT, _sync(objects_api.bindings_in_vhost))},
    "/api/bindings/{vhost}/e/{source}/{kind}/{destination}": {
        "GET": (MANAGEMENT, _sync(objects_api.bindings_between)),
        "POST": (MANAGEMENT, objects_api.post_binding),
    },
    "/api/bindings/{vhost}/e/{source}/{kind}/{destination}/{props}": {
        "GET": (MANAGEMENT, _sync(objects_api.get_binding)),
        "DELETE": (MANAGEMENT, objects_api.delete_binding),
    },
    "/api/bindings": {"GET": (MANAGEMENT, _view(view_bindings))},
    "/api/connections": {"GET": (MANAGEMENT, _listed("connections"))},
    "/api/consumers": {"GET": (MANAGEMENT, _listed("consumers"))},
    "/api/consumers/{vhost}": {"GET": (MANAGEMENT, _listed("consumers", in_vhost=True))},
    "/api/policies": {"GET": (MANAGEMENT, _view(view_policies))},
    "/api/policies/{vhost}/{name}": {"PUT": (POLICYMAKER, put_policy), "DELETE": (POLICYMAKER, delete_policy)},
    "/api/definitions": {
        "GET": (ADMINISTRATOR, _sync(definitions_api.get_all)),
        "POST": (ADMINISTRATOR, definitions_api.post),
    },
    "/api/definitions/{name}": {  # {name} is a vhost
        "GET": (ADMINISTRATOR, _sync(definitions_api.get_vhost)),
        "POST": (ADMINISTRATOR, definitions_api.post),
    },
    "/api/users": {"GET": (ADMINISTRATOR, _view(access_api.list_users))},
    "/api/users/{name}": {
        "GET": (ADMINISTRATOR, _sync(access_api.get_user)),
        "PUT": (ADMINISTRATOR, access_api.put_user),
        "DELETE": (ADMINISTRATOR, access_api.delete_user),
    },
    "/api/users/{name}/access-keys": {
        "GET": (ADMINISTRATOR, _sync(access_api.user_access_keys)),
        "POST": (ADMINISTRATOR, access_api.create_access_key),
    },
    "/api/access-keys": {"GET": (ADMINISTRATOR, _view(access_api.list_access_keys))},
    "/api/access-keys/{name}": {"DELETE": (ADMINISTRATOR, access_api.delete_access_key)},
    "/api/vhosts": {"GET": (MANAGEMENT, _view(access_api.list_vhosts))},
    "/api/vhosts/{name}": {
        "GET": (MANAGEMENT, _sync(access_api.get_vhost)),
        "PUT": (ADMINISTRATOR, access_api.put_vhost),
        "DELETE": (ADMINISTRATOR, access_api.delete_vhost),
    },
    "/api/permissions": {"GET": (ADMINISTRATOR, _view(access_api.list_permissions))},
    "/api/permissions/{vhost}/{name}": {
        "GET": (ADMINISTRATOR, _sync(access_api.get_permissions)),
        "PUT": (ADMINISTRATOR, access_api.put_permissions),
        "DELETE": (ADMINISTRATOR, access_api.delete_permissions),
    },
    "/api/topic-permissions": {"GET": (ADMINISTRATOR, _view(access_api.list_topic_permissions))},
    "/api/topic-permissions/{vhost}/{name}": {
        "GET": (ADMINISTRATOR, _sync(access_api.get_topic_permissions)),
        "PUT": (ADMINISTRATOR, access_api.put_topic_permissions),
        "DELETE": (ADMINISTRATOR, access_api.delete_topic_permissions),
    },
    "/api/vhost-limits": {"GET": (MONITORING, _view(access_api.list_vhost_limits))},
    "/api/vhost-limits/{vhost}/{name}": {
        "PUT": (ADMINISTRATOR, access_api.put_vhost_limit),
        "DELETE": (ADMINISTRATOR, access_api.delete_vhost_limit),
    },
    "/api/trace/{vhost}": {"GET": (MONITORING, trace_api.get_trace)},  # x-trace (server/tracer.py)
    "/api/user-limits": {"GET": (ADMINISTRATOR, _view(access_api.list_user_limits))},
    "/api/user-limits/{vhost}/{name}": {  # {vhost} is the user's name here
        "PUT": (ADMINISTRATOR, access_api.put_user_limit),
        "DELETE": (ADMINISTRATOR, access_api.delete_user_limit),
    },
}
METHODS = ("GET", "POST", "PUT", "DELETE")


def _pattern_order(pattern: str) -> tuple[int, int]:
    # Among patterns of one length, more literal segments first: "/api/nodes/{name}" is tried
    # before a "/api/{vhost}/{name}" would be.
    parts = pattern.split("/")
    return len(parts), -sum(1 for part in parts if not part.startswith("{"))


_PATTERNS: list[tuple[list[str], str]] = [
    (pattern.split("/"), pattern) for pattern in sorted(ROUTES, key=_pattern_order)
]


def route(path: str) -> tuple[dict[str, tuple[auth.Need, Handler]] | None, dict[str, str]]:
    """The methods of the route `path` (raw, percent-encoded) matches, and its parameters, each
    segment decoded on its own (a vhost "/" arrives as %2F)."""
    methods = ROUTES.get(path)
    if methods is not None:
        return methods, {}
    segments = path.split("/")
    for parts, pattern in _PATTERNS:
        if len(parts) != len(segments):
            continue
        params: dict[str, str] = {}
        for part, segment in zip(parts, segments, strict=True):
            if part.startswith("{"):
                if not segment:
                    break
                params[part[1:-1]] = unquote(segment)
            elif part != segment:
                break
        else:
            return ROUTES[pattern], params
    return None, {}


def allowed_hosts(configured: str) -> frozenset[str]:
    """The host names (lower case) the API answers to: localhost, this machine's name and the
    configured ones. IP literals are always allowed (`host_allowed`)."""
    names = {"localhost", socket.gethostname().lower(), socket.getfqdn().lower()}
    names.update(name.strip().lower() for name in configured.split(",") if name.strip())
    return frozenset(names)


def host_allowed(host_header: str, allowed: frozenset[str]) -> bool:
    """A Host header naming this node: an IP address (a page cannot rebind a literal) or an
    allowed name, with or without a port. A web page the operator opens can make the browser
    send requests to 127.0.0.1 under a name of its own that resolves there (DNS rebinding);
    that name is not on the list."""
    host = host_header.strip().lower()
    if host.startswith("["):  # [v6]:port
        literal, bracket, _rest = host[1:].partition("]")
        return bool(bracket) and is_ip(literal)
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    if port and not port.isdigit():
        return False
    return is_ip(name) or name.rstrip(".") in allowed


def body_limit_bytes(method: str, target: str) -> int:
    """How large a request may be: REQUEST_MAX_BYTES, or DEFINITIONS_MAX_BYTES for a
    definitions import."""
    path = urlsplit(target).path.rstrip("/")
    if method == "POST" and (path == DEFINITIONS_PATH or path.startswith(DEFINITIONS_PATH + "/")):
        return DEFINITIONS_MAX_BYTES
    return REQUEST_MAX_BYTES
