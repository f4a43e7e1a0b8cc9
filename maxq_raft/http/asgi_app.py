"""What the admin API's and the Prometheus port's ASGI apps share (admin_app.py, metrics_server.py).

Theory of operation: hypercorn (asgi_server.py) hands each request to an app as an ASGI scope with
a receive and a send; the apps read it with starlette's Request and answer with its Response. Both
apps answer a lifespan scope at once (they hold nothing to start or stop), refuse a WebSocket,
and refuse a request whose Host does not name this node (DNS rebinding: admin.host_allowed).

When an app refuses a request before reading its body (too large, chunked, too slow), it reads
and drops a bounded amount of it first and answers with Connection: close: closing a socket with
unread bytes resets the connection, and the client could lose the answer. (The old servers did the
same after answering; ASGI ends the connection with the answer, so the draining comes first.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from .admin import host_allowed
from .requests import HttpError

DRAIN_TIMEOUT_S = 1.0  # a refused request's unread body is read and dropped for this long ...
DRAIN_BYTES_MAX = 1 << 20  # ... up to this much
LIFESPAN_MESSAGES_MAX = 2  # startup, shutdown


def status_code(status: str) -> int:
    """200 from "200 OK" (HttpError and Reply carry the status line's words)."""
    return int(status.split(" ", 1)[0])


def closing(response: Response) -> Response:
    """The response, with Connection: close: the server ends the connection after it."""
    response.headers["connection"] = "close"
    return response


async def answer_lifespan(receive: Any, send: Any) -> None:
    for _ in range(LIFESPAN_MESSAGES_MAX):
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def refuse_websocket(receive: Any, send: Any) -> None:
    """Close a WebSocket before accepting it (hypercorn answers the upgrade 403)."""
    await receive()  # websocket.connect
    await send({"type": "websocket.close", "code": 1008})


async def answered_other_than_http(scope: dict[str, Any], receive: Any, send: Any) -> bool:
    """Answer what is not an HTTP request (hypercorn's lifespan messages, a WebSocket); True if
    it was one, so the app has nothing more to do."""
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return True
    if scope["type"] != "http":
        await refuse_websocket(receive, send)
        return True
    return False


def check_host(request: Request, allowed: frozenset[str]) -> None:
    """HttpError 400 without exactly one Host header (RFC 9112 §3.2), 403 for a foreign one."""
    hosts = request.headers.getlist("host")
    if not hosts:
        raise HttpError("400 Bad Request", "a Host header is required (HTTP/1.1)")
    if len(hosts) > 1:
        raise HttpError("400 Bad Request", "more than one Host header")
    host = hosts[0]
    if not host_allowed(host, allowed):
        raise HttpError(
            "403 Forbidden",
            f"host {host[:80]!r} is not this node's: use its IP address or localhost, or list the name with "
            "--http-allowed-hosts",
        )


def head_size_bytes(scope: Mapping[str, Any]) -> int:
    """The request line and headers as sent, near enough (h11 strips the whitespace around values)."""
    query: bytes = scope.get("query_string", b"")
    line = len(scope["method"]) + 1 + len(scope["raw_path"]) + (len(query) + 1 if query else 0) + len(" HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in scope["headers"]) + 2


def check_head_size(scope: Mapping[str, Any], head_max_bytes: int) -> None:
    """HttpError 431 for a head over `head_max_bytes`. (h11 refuses a head that grows past it while
    incomplete; one that arrives whole in a single read reaches the app, and is refused here.)"""
    if head_size_bytes(scope) > head_max_bytes:
        raise HttpError("431 Request Header Fields Too Large", f"request head over {head_max_bytes} bytes")


async def drain_body(request: Request) -> None:
    """Read and drop what is left of the request's body, bounded in bytes and time."""
    drained_bytes = 0
    with trio.move_on_after(DRAIN_TIMEOUT_S):
        try:
            async for chunk in request.stream():
                drained_bytes += len(chunk)
                if drained_bytes > DRAIN_BYTES_MAX:
                    break
        except (ClientDisconnect, RuntimeError):  # gone, or the body was already read
            pass
