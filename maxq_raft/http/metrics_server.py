"""The Prometheus port (RabbitMQ's 15692): GET /metrics and /metrics/per-object, nothing else.

Theory of operation: a tiny ASGI app of its own, served by hypercorn like the admin API's
(asgi_server.py, with keep-alive, as Prometheus scrapes) and bounded the same way: the request head
in bytes, the time to a complete head and between requests, the Raft engine's status in time. It
asks for no credentials, as RabbitMQ's plugin does not (docs/security.md): it serves counts and
names, never message content, and answers only to this node's names (the admin API's Host check,
against DNS rebinding). What it serves is rendered by metrics.py; what needs the operating system
(memory, file descriptors, free disk) or the engine's hub thread is read here.
"""

from __future__ import annotations

import logging
import socket
from typing import Any

import trio
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from .asgi_app import answered_other_than_http, check_head_size, check_host, closing, drain_body, status_code
from .asgi_server import Limits, bind_sockets, serve_asgi
from .metrics import CONTENT_TYPE, render, render_detailed
from .process_sample import sample_process
from .requests import HttpError

log = logging.getLogger("maxq.metrics")

REQUEST_HEAD_MAX_BYTES = 8192  # a scrape is a GET with a few headers
REQUEST_TIMEOUT_S = 5  # to read a request's head, between requests, and a stalled answer
STATUS_TIMEOUT_S = 5.0  # the Raft groups' status; past it the scrape goes without them
PATHS = {"/metrics": False, "/metrics/per-object": True, "/metrics/detailed": True}  # path -> per-object
DETAILED_PATH = "/metrics/detailed"  # only the families asked for (?family=...&vhost=...)
LIMITS = Limits(
    head_max_bytes=REQUEST_HEAD_MAX_BYTES,
    idle_timeout_s=REQUEST_TIMEOUT_S,
    read_timeout_s=REQUEST_TIMEOUT_S,
    send_stall_timeout_s=REQUEST_TIMEOUT_S,
)
TEXT = "text/plain; charset=utf-8"


async def open_metrics_listeners(settings: Any) -> list[socket.socket]:
    """Bind the Prometheus port on --http-host (before anything is served: a busy port fails
    the start cleanly)."""
    return await bind_sockets(settings.prometheus_port, settings.http_host)


async def serve_metrics(
    broker: Any,
    sockets: list[socket.socket],
    allowed: frozenset[str],
    data_dir: str,
    task_status: trio.TaskStatus[tuple[Any, ...]] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve_asgi(MetricsApp(broker, allowed, data_dir), sockets, LIMITS, task_status=task_status)


async def raft_status(broker: Any) -> dict[str, dict] | None:
    """The Raft groups' status, or None (a single node, or an engine that did not answer in time)."""
    node = getattr(broker.log, "replication_node", None)
    if node is None:
        return None
    with trio.move_on_after(STATUS_TIMEOUT_S):
        try:
            # status() runs in the engine's hub thread and blocks: never on trio's.
            return await trio.to_thread.run_sync(node.status, abandon_on_cancel=True)
        except Exception as exc:  # a stopping engine: the scrape still answers
            log.warning("metrics: the replication engine's status failed: %s", exc)
            return None
    log.warning("metrics: the replication engine did not answer within %.0f s", STATUS_TIMEOUT_S)
    return None


def check_scrape(http: HttpRequest, allowed: frozenset[str]) -> str:
    """The path of a scrape; HttpError for a foreign Host, a body, another method or path."""
    check_head_size(http.scope, REQUEST_HEAD_MAX_BYTES)
    check_host(http, allowed)
    if http.headers.get("content-length", "0") != "0" or "transfer-encoding" in http.headers:
        raise HttpError("400 Bad Request", "a scrape has no body")
    if http.scope["method"] not in ("GET", "HEAD"):
        raise HttpError("405 Method Not Allowed", "only GET and HEAD")
    path = http.scope["raw_path"].decode("latin-1").rstrip("/") or "/"
    if path not in PATHS:
        raise HttpError("404 Not Found", "no such path: /metrics, /metrics/per-object or /metrics/detailed")
    return path


class MetricsApp:
    """The Prometheus endpoint for one broker, answering to the `allowed` host names."""

    def __init__(self, broker: Any, allowed: frozenset[str], data_dir: str) -> None:
        self.broker = broker
        self.allowed = allowed
        self.data_dir = data_dir

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_other_than_http(scope, receive, send):
            return
        response = await self._answer(HttpRequest(scope, receive))
        await response(scope, receive, send)  # (hypercorn sends no body for a HEAD)

    async def _answer(self, http: HttpRequest) -> Response:
        try:
            path = check_scrape(http, self.allowed)
        except HttpError as exc:
            await drain_body(http)  # (a scrape has none; anything else ends the connection)
            return closing(Response(f"{exc}\n".encode(), status_code(exc.status), media_type=TEXT))
        try:
            if path == DETAILED_PATH:
                query = http.query_params
                body = render_detailed(self.broker, query.getlist("family"), query.getlist("vhost"))
                return Response(body, 200, media_type=CONTENT_TYPE)
            groups = await raft_status(self.broker)  # (bounded by STATUS_TIMEOUT_S)
            body = render(self.broker, sample_process(self.data_dir, self.broker.store), groups, per_object=PATHS[path])
        except Exception:
            log.exception("metrics: rendering failed")
            return Response(b"internal error\n", 500, media_type=TEXT)
        return Response(body, 200, media_type=CONTENT_TYPE)
