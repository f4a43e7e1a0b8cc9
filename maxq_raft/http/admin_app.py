"""The admin API as an ASGI app, served by hypercorn on the HTTP and HTTPS ports (asgi_server.py).

Theory of operation: hypercorn reads the request head (h11: framing, malformed requests, a head
over REQUEST_MAX_BYTES answered 431) and the app reads the rest in the order the API has always
checked it: the head is within REQUEST_MAX_BYTES (431), the Host names this node (403 otherwise, DNS rebinding), a body has a Content-Length
(411 for chunked), the request fits its route's limit (413: 16 KiB, or 16 MiB for a definitions
import) before any of the body is read, the body arrives in time (408: REQUEST_TIMEOUT_S, or
DEFINITIONS_READ_TIMEOUT_S for a large one, from the request's start), it is declared JSON (415),
the method is one the API knows (405). Then `dispatch` authenticates (401, as RabbitMQ answers),
routes (404, 405), checks the caller's tags (401) and runs the handler (admin.py's views and
changes), whose deadlines bound the engine's answers. A handler's HttpError is its status with a
JSON body; any other exception is logged and answered 500, and the connection lives on.

Connections are kept alive between requests (hypercorn's idle timeout ends them); a refusal made
before the body was read closes the connection (asgi_app.drain_body says why it drains first).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trio
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from . import auth, listing, ui_files
from .admin import (
    DEFINITIONS_READ_TIMEOUT_S,
    METHODS,
    REQUEST_MAX_BYTES,
    REQUEST_TIMEOUT_S,
    ROUTES,
    body_limit_bytes,
    route,
)
from .asgi_app import (
    answered_other_than_http,
    check_head_size,
    check_host,
    closing,
    drain_body,
    head_size_bytes,
    status_code,
)
from .asgi_server import Limits, bind_sockets, serve_asgi
from .listing import LIST_PARAMETERS
from .requests import HttpError, NotFoundHere, Reply, Request, metadata_caught_up

log = logging.getLogger("maxq.http")

LIMITS = Limits(
    head_max_bytes=REQUEST_MAX_BYTES,
    idle_timeout_s=int(REQUEST_TIMEOUT_S),
    send_stall_timeout_s=int(REQUEST_TIMEOUT_S),
    # one read; a large body's whole read is bounded by the app (DEFINITIONS_READ_TIMEOUT_S)
    read_timeout_s=int(DEFINITIONS_READ_TIMEOUT_S),
)


FORBIDDEN_ERROR = "not_authorised"


class Refused(Exception):
    """An HttpError raised before the request's body was read: drained, answered, closed."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(str(error))
        self.error = error


def json_response(status: str, body: Any, headers: dict[str, str] | None = None) -> Response:
    payload = json.dumps(body, indent=1).encode()
    return Response(payload, status_code(status), headers, media_type="application/json")


def error_response(error: HttpError) -> Response:
    return json_response(error.status, {"error": str(error), **error.extra})


def _unauthorized(reason: str, error: str = "not_authorized", challenge: bool = True) -> Response:
    # RabbitMQ answers 401 both without valid credentials ("not_authorized") and for a user
    # without the tag, vhost or permission a route needs ("not_authorised", its spelling there).
    # As RabbitMQ 3.10 (checked side by side), the challenge goes with the first only, with or
    # without credentials sent; it makes browsers and curl ask. The web UI's fetch() sends
    # credentials "omit", so a browser leaves that 401 to the page's login form (Fetch: no
    # prompt for such a request).
    headers = {"WWW-Authenticate": f'Basic realm="{auth.REALM}"'} if challenge else None
    return json_response("401 Unauthorized", {"error": error, "reason": reason}, headers)


def _reply_response(value: Any) -> Response:
    if type(value) is Reply:
        if value.body is None:
            return Response(b"", status_code(value.status))
        return json_response(value.status, value.body)
    return json_response("200 OK", value)


async def _authenticate(broker: Any, request: Request) -> auth.Caller:
    """The caller; a login that fails or lacks a management tag on a cluster member is checked
    again once it has applied what the metadata group had committed (a user, password or tag
    just set through another member: server/metadata_sync.py)."""
    try:
        return auth.authenticate(broker.meta, request.authorization, request.peer_host)
    except (auth.LoginFailed, auth.Forbidden):
        if not broker.log.metadata_may_lag():
            raise
    await metadata_caught_up(broker)
    return auth.authenticate(broker.meta, request.authorization, request.peer_host)


async def dispatch(broker: Any, request: Request) -> Response:
    # Authenticated before anything else is said, the list of endpoints included.
    try:
        request.caller = await _authenticate(broker, request)
    except auth.Unauthorized as exc:
        return _unauthorized(str(exc))
    except auth.Forbidden as exc:
        return _unauthorized(str(exc), FORBIDDEN_ERROR, challenge=False)
    methods, params = route(request.path)
    if methods is None:
        endpoints = sorted(f"{m} {p}" for p, ms in ROUTES.items() for m in ms)
        return json_response("404 Not Found", {"error": f"no such endpoint {request.path}", "endpoints": endpoints})
    entry = methods.get(request.method)
    if entry is None:
        return json_response(
            "405 Method Not Allowed",
            {"error": f"method {request.method} not allowed on {request.path}", "allowed": list(methods)},
            {"Allow": ", ".join(methods)},
        )
    need, handler = entry
    request.params = params
    vhost = params.get("vhost") if need is auth.Need.POLICYMAKER else None
    try:
        try:
            auth.check(request.caller, need, broker.meta, vhost)
        except auth.Forbidden:
            if not broker.log.metadata_may_lag():
                raise
            await metadata_caught_up(broker)  # (tags or permissions just set elsewhere)
            request.caller = auth.authenticate(broker.meta, request.authorization, request.peer_host)
            auth.check(request.caller, need, broker.meta, vhost)
    except auth.Unauthorized as exc:  # (deleted meanwhile)
        return _unauthorized(str(exc))
    except auth.Forbidden as exc:
        return _unauthorized(str(exc), FORBIDDEN_ERROR, challenge=False)
    try:
        try:
            value = await handler(broker, request)
        except HttpError as exc:
            # Found nothing on a cluster member: again once it has applied what the metadata
            # group committed before now (an object just made through another member is found:
            # server/metadata_sync.py). A GET changes nothing, and a lookup's 404 comes before any
            # change (NotFoundHere), so either may run twice.
            if not (
                exc.status.startswith("404")
                and (request.method == "GET" or type(exc) is NotFoundHere)
                and broker.log.metadata_may_lag()
            ):
                raise
            await metadata_caught_up(broker)
            value = await handler(broker, request)
        if type(value) is list and request.query.keys() & LIST_PARAMETERS:
            value = listing.shape(value, request.query)  # sort, columns, pages (listing.py)
        elif type(value) is dict and request.method == "GET" and "columns" in request.query:
            value = listing.shape_one(value, request.query)  # one object: columns too, as RabbitMQ
        return _reply_response(value)
    except HttpError as exc:
        return error_response(exc)
    except auth.Forbidden as exc:  # a handler's own check: a vhost, a resource permission
        return _unauthorized(str(exc), FORBIDDEN_ERROR, challenge=False)


async def read_request(http: HttpRequest, allowed: frozenset[str], started_s: float) -> Request:
    """The request with its body, checked in the API's order (see the module's docstring).
    Refused before the body was read; HttpError after; ClientDisconnect when the client left."""
    scope = http.scope
    try:
        check_head_size(scope, REQUEST_MAX_BYTES)
        check_host(http, allowed)
    except HttpError as exc:
        raise Refused(exc) from None
    method: str = scope["method"]
    query: bytes = scope["query_string"]
    target = scope["raw_path"].decode("latin-1") + ("?" + query.decode("latin-1") if query else "")
    try:
        url = urlsplit(target)
    except ValueError as exc:  # e.g. "http://[::1/": an unclosed IPv6 literal
        raise Refused(HttpError("400 Bad Request", f"malformed request target: {exc}")) from None
    if "chunked" in http.headers.get("transfer-encoding", "").lower():  # (h11 lets only chunked through)
        raise Refused(HttpError("411 Length Required", "send the body with a Content-Length, not chunked"))
    # HTTP/1.1 frames a body by its Content-Length (h11 has checked it is digits); HTTP/2 may
    # send one without: then the limit is enforced as it arrives.
    declared_text = http.headers.get("content-length")
    if declared_text is not None and not declared_text.isdecimal():
        raise Refused(HttpError("400 Bad Request", f"bad Content-Length {declared_text[:40]!r}"))
    declared = int(declared_text) if declared_text is not None else None
    limit = body_limit_bytes(method, target)
    body_max_bytes = limit - head_size_bytes(scope)
    if declared is not None and declared > body_max_bytes:
        raise Refused(HttpError("413 Content Too Large", f"request over {limit} bytes"))
    large = limit > REQUEST_MAX_BYTES and (declared is None or declared > REQUEST_MAX_BYTES)
    read_timeout_s = DEFINITIONS_READ_TIMEOUT_S if large else REQUEST_TIMEOUT_S
    received = bytearray()  # (appending to bytes would copy the whole body at every chunk)
    with trio.move_on_at(started_s + read_timeout_s) as deadline:
        async for chunk in http.stream():
            received += chunk
            if len(received) > body_max_bytes:
                raise Refused(HttpError("413 Content Too Large", f"request over {limit} bytes"))
    if deadline.cancelled_caught:
        raise Refused(
            HttpError("408 Request Timeout", f"the body did not arrive within {read_timeout_s:.0f} s of the request")
        )
    if received and http.headers.get("content-type", "").split(";", 1)[0].strip().lower() != "application/json":
        # A body is JSON, and said to be: a page's form post (text/plain, form-urlencoded) cannot
        # send application/json across origins without a preflight this API never answers.
        raise HttpError(
            "415 Unsupported Media Type", "a request body must be JSON, sent as Content-Type: application/json"
        )
    if method not in METHODS:
        raise HttpError("405 Method Not Allowed", f"method {method} not allowed")
    client = scope.get("client")
    return Request(
        method,
        url.path.rstrip("/") or "/",
        parse_qs(url.query),
        bytes(received),
        authorization=http.headers.get("authorization"),
        peer_host=str(client[0]) if client else "",
        headers=dict(http.headers),  # lower-case names; within the head's size limit
    )


class AdminApp:
    """The admin API for one broker, answering to the `allowed` host names."""

    def __init__(self, broker: Any, allowed: frozenset[str]) -> None:
        self.broker = broker
        self.allowed = allowed

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_other_than_http(scope, receive, send):
            return
        http = HttpRequest(scope, receive)
        try:
            response = await self._answer(http)
        except ClientDisconnect:
            return  # nobody to answer
        await response(scope, receive, send)

    async def _answer(self, http: HttpRequest) -> Response:
        try:
            request = await read_request(http, self.allowed, trio.current_time())
        except Refused as refused:
            await drain_body(http)
            return closing(error_response(refused.error))
        except HttpError as exc:
            return error_response(exc)
        except ClientDisconnect:
            raise
        except Exception:  # a bug in reading: answered, logged, and the server goes on
            log.exception("admin request %s %s could not be read", http.scope["method"], http.scope["raw_path"][:200])
            return closing(json_response("500 Internal Server Error", {"error": "internal error (see the node's log)"}))
        if ui_files.is_ui_path(request.path):
            # The web UI's files: no data, so no credentials (ui_files.py); the checks above
            # (Host, sizes) were made as for the API.
            return ui_files.answer(request.method, request.path)
        try:
            # Views answer at once; changes bound themselves (MEMBER_CHANGE_TIMEOUT_S ...).
            return await dispatch(self.broker, request)
        except Exception:
            log.exception("admin request %s %s failed", request.method, request.path)
            return json_response("500 Internal Server Error", {"error": "internal error (see the node's log)"})


async def open_admin_listeners(settings: Any) -> list[socket.socket]:
    """Bind the admin port (before anything is served, so a busy port fails the start cleanly)."""
    return await bind_sockets(settings.http_port, settings.http_host)


async def open_admin_tls_listeners(settings: Any) -> list[socket.socket]:
    """Bind the HTTPS admin port: the same routes over TLS (RabbitMQ's 15671), served with the
    node's TLS context (`serve_admin`); the handshake is bounded by LIMITS."""
    return await bind_sockets(settings.https_port, settings.http_host)


async def serve_admin(
    broker: Any,
    sockets: list[socket.socket],
    allowed: frozenset[str] = frozenset({"localhost"}),
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[tuple[Any, ...]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API on the bound `sockets` (over TLS with `ssl_context`) until cancelled;
    started() with the address of the first."""
    await serve_asgi(AdminApp(broker, allowed), sockets, LIMITS, ssl_context, task_status=task_status)
