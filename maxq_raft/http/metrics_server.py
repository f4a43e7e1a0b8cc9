"""The Prometheus port (RabbitMQ's 15692): GET /metrics and /metrics/per-object, nothing else.

Theory of operation: a small HTTP/1.1 server on trio, one request per connection, like the
admin API's (admin.py) and bounded the same way: the request head in bytes, reading it and
sending the answer in time, the Raft engine's status in time. It asks for no credentials, as
RabbitMQ's plugin does not (docs/security.md): it serves counts and names, never message
content, and answers only to this node's names (the admin API's Host check, against DNS
rebinding). What it serves is rendered by metrics.py; what needs the operating system (memory,
file descriptors, free disk) or the engine's hub thread is read here.
"""

from __future__ import annotations

import logging
import os
import resource
from functools import partial
from typing import Any

import trio

from ..server.alarms import disk_free_bytes, rss_bytes
from .admin import read_head
from .metrics import CONTENT_TYPE, ProcessSample, render
from .requests import HttpError

log = logging.getLogger("maxq.metrics")

REQUEST_HEAD_MAX_BYTES = 8192  # a scrape is a GET with a few headers
REQUEST_TIMEOUT_S = 5.0  # to read a request, and again to send the answer
STATUS_TIMEOUT_S = 5.0  # the Raft groups' status; past it the scrape goes without them
PATHS = {"/metrics": False, "/metrics/per-object": True}  # path -> per-object


async def open_metrics_listeners(settings: Any) -> list[trio.SocketListener]:
    """Bind the Prometheus port on --http-host (before anything is served: a busy port fails
    the start cleanly)."""
    return await trio.open_tcp_listeners(settings.prometheus_port, host=settings.http_host)


async def serve_metrics(
    broker: Any,
    listeners: list[trio.SocketListener],
    allowed: frozenset[str],
    data_dir: str,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    task_status.started(listeners[0].socket.getsockname())
    await trio.serve_listeners(partial(_handle, broker, allowed, data_dir), listeners)


def sample_process(data_dir: str) -> ProcessSample:
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    return ProcessSample(
        resident_memory_bytes=rss_bytes(),
        open_fds=open_fds,
        max_fds=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        disk_free_bytes=disk_free_bytes(data_dir),
    )


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


async def _read_head(stream: trio.abc.Stream, allowed: frozenset[str]) -> tuple[str, str]:
    """The method and path of one scrape (its head within REQUEST_HEAD_MAX_BYTES)."""
    method, target, headers, _head_bytes, _body = await read_head(stream, REQUEST_HEAD_MAX_BYTES, allowed)
    if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
        raise HttpError("400 Bad Request", "a scrape has no body")
    path = target.split("?", 1)[0].rstrip("/") or "/"
    if method not in ("GET", "HEAD"):
        raise HttpError("405 Method Not Allowed", "only GET and HEAD")
    if path not in PATHS:
        raise HttpError("404 Not Found", "no such path: /metrics or /metrics/per-object")
    return method, path


def _answer(status: str, content_type: str, body: bytes, head_only: bool = False) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + (b"" if head_only else body)


async def _handle(broker: Any, allowed: frozenset[str], data_dir: str, stream: trio.abc.Stream) -> None:
    try:
        reply = None
        method = path = None
        with trio.move_on_after(REQUEST_TIMEOUT_S):
            try:
                method, path = await _read_head(stream, allowed)
            except HttpError as exc:
                reply = _answer(exc.status, "text/plain; charset=utf-8", f"{exc}\n".encode())
        if path is not None:
            try:
                groups = await raft_status(broker)  # (bounded by STATUS_TIMEOUT_S)
                body = render(broker, sample_process(data_dir), groups, per_object=PATHS[path])
                reply = _answer("200 OK", CONTENT_TYPE, body, head_only=method == "HEAD")
            except Exception:
                log.exception("metrics: rendering failed")
                reply = _answer("500 Internal Server Error", "text/plain; charset=utf-8", b"internal error\n")
        if reply is not None:
            with trio.move_on_after(REQUEST_TIMEOUT_S):
                await stream.send_all(reply)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        pass
    except Exception:
        log.exception("metrics request failed")
    finally:
        with trio.move_on_after(1.0):
            await stream.aclose()
