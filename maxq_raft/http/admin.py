"""The HTTP admin API every node serves (`maxqctl` talks to it).

Theory of operation: a deliberately small HTTP/1.1 server on trio: one request per connection,
GET for the views, PUT/DELETE for policies (`/api/policies/{vhost}/{name}`, RabbitMQ's path and
body: pattern, definition, priority, apply-to), JSON out. Each endpoint is a pure function from the broker's state to a
JSON-able value, so the same views serve `maxqctl` and scripts. Requests are bounded in size
and time so a bad client cannot hold the node.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.parse
from functools import partial

import trio

from ..machines import metadata as md
from ..server.errors import ChannelError

log = logging.getLogger("maxq.http")

REQUEST_MAX_BYTES = 16384
REQUEST_TIMEOUT_S = 5.0


def _text(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _text(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_text(v) for v in value]
    return value if isinstance(value, (str, int, float, bool)) or value is None else str(value)


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


def view_status(broker) -> dict:
    # A single node is a one-member cluster: it leads its only group.
    return {
        "node": broker.node_id,
        "members": [{"node": broker.node_id, "state": "up", "role": "leader"}],
        "groups": [{"group": "metadata", "leader": broker.node_id, "commit_index": broker.log.index,
                    "applied_index": broker.log.index, "members": [{"node": broker.node_id, "lag": 0}]}],
    }


def view_queues(broker) -> list:
    out = []
    for (vhost, name), queue in broker.queues.items():
        record = broker.meta.queue(vhost, name)
        out.append({"vhost": vhost, "name": name, "durable": bool(record and record.durable),
                    "exclusive": bool(record and record.exclusive_owner), "auto_delete": bool(record and record.auto_delete),
                    "arguments": _text(record.arguments if record else {}), "messages_ready": queue.ready_count,
                    "messages_unacknowledged": queue.unacked_count, "consumers": queue.active_consumer_count})
    return out


def view_exchanges(broker) -> list:
    return [{"vhost": vhost, "name": ex.name, "type": ex.type, "durable": ex.durable, "auto_delete": ex.auto_delete,
             "internal": ex.internal, "arguments": _text(ex.arguments)}
            for vhost, v in broker.meta.vhosts.items() for ex in v.exchanges.values()]


def view_bindings(broker) -> list:
    return [{"vhost": vhost, "source": source, "destination_type": kind, "destination": dest, "routing_key": key,
             "arguments": _text(args)}
            for vhost in broker.meta.vhosts for source, kind, dest, key, args in broker.meta.bindings(vhost)]


def view_connections(broker) -> list:
    return [{"name": s.id, "peer_host": s.peer_host, "user": s.user, "vhost": s.vhost, "channels": len(s.channels),
             "client": _text(s.client_properties.get("product", "")), "messages_in": s.messages_in,
             "messages_out": s.messages_out} for s in broker.sessions.values()]


def view_consumers(broker) -> list:
    return [{"consumer_tag": h.tag, "queue": h.queue_key[1], "vhost": h.queue_key[0], "channel": h.channel.number,
             "connection": h.channel.session.id, "ack_required": not h.no_ack} for h in broker.consumers.values()]


def view_policies(broker) -> list:
    return [{"vhost": vhost_name, "name": p.name, "pattern": p.pattern, "apply-to": p.apply_to,
             "definition": _text(p.definition), "priority": p.priority}
            for vhost_name, vhost in broker.meta.vhosts.items() for p in vhost.policies.values()]


def change_policy(broker, method: str, path: str, body: bytes) -> tuple[str, dict]:
    """PUT or DELETE /api/policies/{vhost}/{name}: (HTTP status, JSON body)."""
    parts = path.split("/")
    if len(parts) != 5 or parts[:3] != ["", "api", "policies"]:
        return "404 Not Found", {"error": "use /api/policies/{vhost}/{name} (the vhost URL-encoded: %2F is /)"}
    vhost, name = urllib.parse.unquote(parts[3]), urllib.parse.unquote(parts[4])
    if method == "DELETE":
        command = md.ClearPolicy(vhost, name)
    else:
        try:
            spec = json.loads(body or b"{}")
            command = md.SetPolicy(vhost, name, spec["pattern"], spec["definition"], spec.get("priority", 0),
                                   spec.get("apply-to", "all"))
        except (ValueError, KeyError, TypeError) as exc:
            return "400 Bad Request", {"error": f"a policy is JSON with pattern and definition: {exc!r}"}
    try:
        broker.apply_meta(command)
    except ChannelError as err:
        status = "404 Not Found" if err.reply_code == 404 else "400 Bad Request"
        return status, {"error": err.reply_text}
    return "200 OK", {"ok": True}


ROUTES = {
    "/api/policies": view_policies,
    "/api/overview": view_overview,
    "/api/cluster/status": view_status,
    "/api/queues": view_queues,
    "/api/exchanges": view_exchanges,
    "/api/bindings": view_bindings,
    "/api/connections": view_connections,
    "/api/consumers": view_consumers,
}


def _response(status: str, body: dict | list) -> bytes:
    payload = json.dumps(body, indent=1).encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    return head.encode() + payload


async def _handle(broker, stream: trio.SocketStream) -> None:
    try:
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            data = b""
            while b"\r\n\r\n" not in data and len(data) < REQUEST_MAX_BYTES:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                data += chunk
            line = data.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split()
            head, _, body = data.partition(b"\r\n\r\n")
            length = 0
            for header in head.split(b"\r\n")[1:]:
                key, _, value = header.partition(b":")
                if key.strip().lower() == b"content-length" and value.strip().isdigit():
                    length = int(value.strip())
            while len(body) < min(length, REQUEST_MAX_BYTES):
                chunk = await stream.receive_some(4096)
                if not chunk:
                    break
                body += chunk
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                reply = _response("400 Bad Request", {"error": "malformed request line"})
            elif parts[0] in ("PUT", "DELETE"):
                reply = _response(*change_policy(broker, parts[0], parts[1].split("?", 1)[0], body[:length]))
            elif parts[0] != "GET":
                reply = _response("405 Method Not Allowed", {"error": f"method {parts[0]} not allowed"})
            else:
                path = parts[1].split("?", 1)[0].rstrip("/") or "/"
                view = ROUTES.get(path)
                if view is None:
                    reply = _response("404 Not Found", {"error": f"no such endpoint {path}", "endpoints": sorted(ROUTES)})
                else:
                    reply = _response("200 OK", view(broker))
            await stream.send_all(reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:
        log.exception("admin request failed")
    finally:
        await stream.aclose()


async def open_admin_listeners(settings) -> list:
    """Bind the admin port (before anything is served, so a busy port fails the start cleanly)."""
    return await trio.open_tcp_listeners(settings.http_port, host=settings.http_host)


async def serve_admin(broker, listeners: list, task_status=trio.TASK_STATUS_IGNORED) -> None:
    task_status.started(listeners[0].socket.getsockname())
    await trio.serve_listeners(partial(_handle, broker), listeners)
