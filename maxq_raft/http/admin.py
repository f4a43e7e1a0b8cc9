"""The HTTP admin API every node serves (`maxqctl` talks to it).

Theory of operation: a deliberately small HTTP/1.1 server on trio: one request per connection,
JSON in and out. GET endpoints are views: functions from the broker's state to a JSON-able value,
so the same views serve `maxqctl` and scripts. POST and DELETE endpoints change the cluster's
membership or move leadership: they hand the change to the replication engine and wait
(bounded) for its one answer, which comes from the engine's hub thread and is carried back into
trio with `run_sync_soon`. Reading a request is bounded in bytes (head and body, 16 KiB) and in
time; every change is bounded by its own deadline, so a bad client or a stuck change cannot
hold the node.

PUT and DELETE /api/policies/{vhost}/{name} set and clear a policy (RabbitMQ's path and body:
pattern, definition, priority, apply-to), committed like any metadata change.

A single node (started without --raft-addr/--peer: its log has no replication engine) reports
itself as a one-member cluster and refuses membership commands with 409.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import trio

from ..machines import metadata as md
from ..machines.queue_types import Rejected
from ..server.confirms import Unavailable
from ..server.errors import ChannelError

log = logging.getLogger("maxq.http")

REQUEST_MAX_BYTES = 16384  # request line + headers + body
REQUEST_TIMEOUT_S = 5.0  # to read a request, and again to send the reply
STATUS_TIMEOUT_S = 10.0  # node.status() gives up after 5 s itself
MEMBER_CHANGE_TIMEOUT_S = 35.0  # the engine's own deadline is 30 s
TRANSFER_TIMEOUT_S = 10.0  # a group's transfer gives up after 3 s itself
DRAIN_TIMEOUT_S = 1.0  # after refusing a request, unread input is read and dropped ...
DRAIN_BYTES_MAX = 1 << 20  # ... up to this much
NODE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # as config.NODE_ID
META_GROUP = "meta"
NOT_A_MEMBER = "this node is not a cluster member (started without --raft-addr/--peer)"
POLICY_TIMEOUT_S = 15.0


class HttpError(Exception):
    """Answered as `status` with {"error": message, **extra}."""

    def __init__(self, status: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)  # from the path (e.g. a member's name)

    def json(self) -> dict:
        if not self.body:
            raise HttpError("400 Bad Request", "a JSON object body is required")
        try:
            value = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError("400 Bad Request", f"malformed JSON body: {exc}") from None
        except RecursionError:
            # 16 KiB of "[" nests deeper than the decoder recurses (~1000 levels): bad input, not a 500
            raise HttpError("400 Bad Request", "malformed JSON body: nested too deeply") from None
        if not isinstance(value, dict):
            raise HttpError("400 Bad Request", "the JSON body must be an object")
        return value


def _text(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


# ------------------------------------------------------------------------------ views (GET)


def view_overview(broker) -> dict:
    return {
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


async def _engine_status(broker) -> dict[str, dict]:
    node = broker.log.replication_node
    try:
        with trio.fail_after(STATUS_TIMEOUT_S):
            # status() runs in the engine's hub thread and blocks (at most 5 s): never on trio's.
            return await trio.to_thread.run_sync(node.status)
    except (TimeoutError, trio.TooSlowError) as exc:
        raise HttpError("503 Service Unavailable", f"the replication engine did not answer: {exc}") from None


async def view_status(broker, request: Request) -> dict:
    if broker.log.replication_node is None:
        return view_status_single(broker)
    return status_from_engine(broker.node_id, await _engine_status(broker))


def view_queues(broker) -> list:
    out = []
    for (vhost, name), queue in broker.queues.items():
        record = broker.meta.queue(vhost, name)
        out.append(
            {
                "vhost": vhost,
                "name": name,
                "durable": bool(record and record.durable),
                "exclusive": bool(record and record.exclusive_owner),
                "auto_delete": bool(record and record.auto_delete),
                "arguments": _text(record.arguments if record else {}),
                "messages_ready": queue.ready_count,
                "messages_unacknowledged": queue.unacked_count,
                "consumers": queue.active_consumer_count,
            }
        )
    return out


def view_exchanges(broker) -> list:
    return [
        {
            "vhost": vhost,
            "name": ex.name,
            "type": ex.type,
            "durable": ex.durable,
            "auto_delete": ex.auto_delete,
            "internal": ex.internal,
            "arguments": _text(ex.arguments),
        }
        for vhost, v in broker.meta.vhosts.items()
        for ex in v.exchanges.values()
    ]


def view_bindings(broker) -> list:
    return [
        {
            "vhost": vhost,
            "source": source,
            "destination_type": kind,
            "destination": dest,
            "routing_key": key,
            "arguments": _text(args),
        }
        for vhost in broker.meta.vhosts
        for source, kind, dest, key, args in broker.meta.bindings(vhost)
    ]


def view_connections(broker) -> list:
    return [
        {
            "name": s.id,
            "peer_host": s.peer_host,
            "user": s.user,
            "vhost": s.vhost,
            "channels": len(s.channels),
            "client": _text(s.client_properties.get("product", "")),
            "messages_in": s.messages_in,
            "messages_out": s.messages_out,
        }
        for s in broker.sessions.values()
    ]


def view_consumers(broker) -> list:
    return [
        {
            "consumer_tag": h.tag,
            "queue": h.queue_key[1],
            "vhost": h.queue_key[0],
            "channel": h.channel.number,
            "connection": h.channel.session.id,
            "ack_required": not h.no_ack,
        }
        for h in broker.consumers.values()
    ]


# ------------------------------------------------------------------- changes (POST, PUT, DELETE)


def view_policies(broker) -> list:
    return [
        {
            "vhost": vhost_name,
            "name": p.name,
            "pattern": p.pattern,
            "apply-to": p.apply_to,
            "definition": _text(p.definition),
            "priority": p.priority,
        }
        for vhost_name, vhost in broker.meta.vhosts.items()
        for p in vhost.policies.values()
    ]


async def _meta_change(broker, command) -> dict:
    """Commit a metadata command (through the metadata group in a cluster) and wait, bounded."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list = []

    def then(reply) -> None:
        box.append(reply)
        done.set()

    try:
        broker.meta_call(command, lambda reply: token.run_sync_soon(then, reply))
    except ChannelError as err:  # a single node refuses at once
        box.append(Rejected(err.reply_code, err.reply_text))
        done.set()
    with trio.move_on_after(POLICY_TIMEOUT_S):
        await done.wait()
    if not box:
        raise HttpError(
            "504 Gateway Timeout", f"no answer within {POLICY_TIMEOUT_S:.0f} s (the change may still happen)"
        )
    reply = box[0]
    if type(reply) is Unavailable:
        raise HttpError("503 Service Unavailable", f"the cluster cannot commit now ({reply.reason})")
    if type(reply) is Rejected:
        raise HttpError("404 Not Found" if reply.reply_code == 404 else "400 Bad Request", reply.reply_text)
    return {"ok": True}


async def put_policy(broker, request: Request) -> dict:
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
    refused = md.policy_record(command)  # before anything is proposed: a refusal leaves the log as it was
    if isinstance(refused, Rejected):
        raise HttpError("400 Bad Request", refused.reply_text)
    return await _meta_change(broker, command)


async def delete_policy(broker, request: Request) -> dict:
    return await _meta_change(broker, md.ClearPolicy(request.params["vhost"], request.params["name"]))


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


async def add_member(broker, request: Request) -> dict:
    body = request.json()
    name = _node_name(body.get("node"))
    addr = _raft_addr(body.get("raft_addr"))
    node = _cluster_node(broker)
    groups = await _engine_status(broker)
    if all(name in g.get("members", {}) for g in groups.values()):
        raise HttpError("409 Conflict", f"node {name} is already a member of the cluster", reason="already a member")
    pending = _pending_groups(groups)
    if pending:
        raise HttpError(
            "409 Conflict",
            f"a membership change is already in progress in {', '.join(pending)}; wait and retry",
            reason="pending",
        )
    log.info("admin: adding member %s at %s:%d", name, addr[0], addr[1])
    err = await _engine_answer(partial(node.add_member, name, addr), MEMBER_CHANGE_TIMEOUT_S)
    if err is not None:
        log.warning("admin: adding member %s failed: %s", name, err)
        raise _engine_error(err, node=name)
    return {"ok": True, "action": "added", "node": name, "raft_addr": f"{addr[0]}:{addr[1]}"}


async def remove_member(broker, request: Request) -> dict:
    name = _node_name(request.params.get("name", ""))
    node = _cluster_node(broker)
    force = request.query.get("force", ["0"])[-1].lower() in ("1", "true", "yes", "on")
    groups = await _engine_status(broker)
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
    log.info("admin: removing member %s%s", name, " (forced)" if force else "")
    err = await _engine_answer(partial(node.remove_member, name), MEMBER_CHANGE_TIMEOUT_S)
    if err is not None:
        log.warning("admin: removing member %s failed: %s", name, err)
        raise _engine_error(err, node=name)
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
    groups = await _engine_status(broker)
    if group != "all" and group not in groups:
        raise HttpError(
            "404 Not Found",
            f"no group {group!r} (groups: {', '.join(sorted(groups, key=_group_order))})",
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
    async def handler(broker, request: Request) -> Any:
        return fn(broker)

    return handler


Handler = Callable[[Any, Request], Awaitable[Any]]
ROUTES: dict[str, dict[str, Handler]] = {
    "/api/overview": {"GET": _view(view_overview)},
    "/api/cluster/status": {"GET": view_status},
    "/api/cluster/members": {"POST": add_member},
    "/api/cluster/members/{name}": {"DELETE": remove_member},
    "/api/cluster/transfer-leadership": {"POST": transfer_leadership},
    "/api/queues": {"GET": _view(view_queues)},
    "/api/exchanges": {"GET": _view(view_exchanges)},
    "/api/bindings": {"GET": _view(view_bindings)},
    "/api/connections": {"GET": _view(view_connections)},
    "/api/consumers": {"GET": _view(view_consumers)},
    "/api/policies": {"GET": _view(view_policies)},
    "/api/policies/{vhost}/{name}": {"PUT": put_policy, "DELETE": delete_policy},
}
METHODS = ("GET", "POST", "PUT", "DELETE")


def route(path: str) -> tuple[dict[str, Handler] | None, dict[str, str]]:
    methods = ROUTES.get(path)
    if methods is not None:
        return methods, {}
    head, _, last = path.rpartition("/")
    methods = ROUTES.get(head + "/{name}")
    if methods is not None and last:
        return methods, {"name": unquote(last)}
    top, _, vhost = head.rpartition("/")
    methods = ROUTES.get(top + "/{vhost}/{name}")
    if methods is not None and vhost and last:
        return methods, {"vhost": unquote(vhost), "name": unquote(last)}
    return None, {}


def _response(status: str, body: dict | list, extra_headers: str = "") -> bytes:
    payload = json.dumps(body, indent=1).encode()
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        f"{extra_headers}Connection: close\r\n\r\n"
    )
    return head.encode() + payload


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
        return bool(bracket) and _is_ip(literal)
    name, _, port = host.rpartition(":") if host.count(":") == 1 else (host, "", "")
    if port and not port.isdigit():
        return False
    return _is_ip(name) or name.rstrip(".") in allowed


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


async def _read_request(stream: trio.SocketStream, allowed: frozenset[str] = frozenset({"localhost"})) -> Request:
    """One request, head and body within REQUEST_MAX_BYTES (the caller bounds the time)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) >= REQUEST_MAX_BYTES:
            raise HttpError("431 Request Header Fields Too Large", f"request head over {REQUEST_MAX_BYTES} bytes")
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    head, sep, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if not sep or len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise HttpError("400 Bad Request", "malformed request line")
    method, target = parts[0], parts[1]
    headers = {}
    for line in lines[1:]:
        key, colon, value = line.partition(":")
        if not colon:
            raise HttpError("400 Bad Request", f"malformed header line {line[:80]!r}")
        headers[key.strip().lower()] = value.strip()
    host = headers.get("host")
    if host is None:
        raise HttpError("400 Bad Request", "a Host header is required (HTTP/1.1)")
    if not host_allowed(host, allowed):
        raise HttpError(
            "403 Forbidden",
            f"host {host[:80]!r} is not this node's: use its IP address or localhost, or list the name with "
            "--http-allowed-hosts",
        )
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError("411 Length Required", "send the body with a Content-Length, not chunked")
    length_text = headers.get("content-length", "0")
    if not length_text.isdigit():
        raise HttpError("400 Bad Request", f"bad Content-Length {length_text[:40]!r}")
    length = int(length_text)
    if len(head) + 4 + length > REQUEST_MAX_BYTES:
        raise HttpError("413 Content Too Large", f"request over {REQUEST_MAX_BYTES} bytes")
    while len(body) < length:
        chunk = await stream.receive_some(length - len(body))
        if not chunk:
            raise HttpError("400 Bad Request", f"body ended after {len(body)} of {length} bytes")
        body += chunk
    if length and headers.get("content-type", "").split(";", 1)[0].strip().lower() != "application/json":
        # A body is JSON, and said to be: a page's form post (text/plain, form-urlencoded) cannot
        # send application/json across origins without a preflight this API never answers.
        raise HttpError(
            "415 Unsupported Media Type", "a request body must be JSON, sent as Content-Type: application/json"
        )
    url = urlsplit(target)
    path = url.path.rstrip("/") or "/"
    return Request(method, path, parse_qs(url.query), body[:length])


async def _dispatch(broker, request: Request) -> bytes:
    methods, params = route(request.path)
    if methods is None:
        endpoints = sorted(f"{m} {p}" for p, ms in ROUTES.items() for m in ms)
        return _response("404 Not Found", {"error": f"no such endpoint {request.path}", "endpoints": endpoints})
    handler = methods.get(request.method)
    if handler is None:
        allowed = ", ".join(methods)
        return _response(
            "405 Method Not Allowed",
            {"error": f"method {request.method} not allowed on {request.path}", "allowed": list(methods)},
            f"Allow: {allowed}\r\n",
        )
    request.params = params
    try:
        return _response("200 OK", await handler(broker, request))
    except HttpError as exc:
        return _response(exc.status, {"error": str(exc), **exc.extra})


async def _handle(broker, allowed: frozenset[str], stream: trio.SocketStream) -> None:
    try:
        request: Request | None = None
        reply: bytes | None = None
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            try:
                request = await _read_request(stream, allowed)
            except HttpError as exc:
                reply = _response(exc.status, {"error": str(exc)})
        if request is not None:
            if request.method not in METHODS:
                reply = _response("405 Method Not Allowed", {"error": f"method {request.method} not allowed"})
            else:
                try:
                    # Views answer at once; changes bound themselves (MEMBER_CHANGE_TIMEOUT_S ...).
                    reply = await _dispatch(broker, request)
                except Exception:
                    log.exception("admin request %s %s failed", request.method, request.path)
                    reply = _response("500 Internal Server Error", {"error": "internal error (see the node's log)"})
        if reply is not None:
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await stream.send_all(reply)
        if request is None:
            # A refused request may leave unread bytes: closing on them would reset the
            # connection, and the client could lose the answer. Drain a little, briefly.
            with trio.move_on_after(DRAIN_TIMEOUT_S):
                await stream.send_eof()
                drained = 0
                while drained < DRAIN_BYTES_MAX:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    drained += len(chunk)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:
        log.exception("admin request failed")
    finally:
        await stream.aclose()


async def open_admin_listeners(settings) -> list:
    """Bind the admin port (before anything is served, so a busy port fails the start cleanly)."""
    return await trio.open_tcp_listeners(settings.http_port, host=settings.http_host)


async def serve_admin(
    broker, listeners: list, allowed: frozenset[str] = frozenset({"localhost"}), task_status=trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started(listeners[0].socket.getsockname())
    await trio.serve_listeners(partial(_handle, broker, allowed), listeners)
