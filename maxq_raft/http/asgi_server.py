"""The HTTP server under the admin API and the Prometheus port: hypercorn's trio worker.

Theory of operation: the node binds its HTTP ports itself, before anything is served
(`bind_sockets`, from server/main.py's `_bind`: a busy port fails the start cleanly, and port
numbers resolve as trio resolves them), and hands the bound sockets to hypercorn.trio.serve
through its config (`_BoundConfig.create_sockets`, as hypercorn's own fd:// binds do), which
serves an ASGI app on them in the caller's nursery until cancelled (`serve_asgi`). Hypercorn
parses HTTP/1.1 with h11 (keep-alive, pipelining, Content-Length and chunked framing, malformed
requests answered 400, a head that grows past `head_max_bytes` unfinished answered 431) and
HTTP/2 where a client asks for it; TLS is the node's own context (server/tls.py), wrapped around
each accepted stream by hypercorn.

What bounds a connection here: the head in bytes (h11's incomplete-event limit; a head that
arrives whole in one read is measured by the app: asgi_app.check_head_size), the time before a
request's head is complete and between requests (the keep-alive timeout: a slowloris client is
dropped after it), each read (the read timeout), a write the client does not take (the kernel's
TCP_USER_TIMEOUT), the TLS handshake, how many requests one connection may make, and what
hypercorn reads ahead of an app that does not read (its queue of body chunks). The body's size
and the time to read it belong to the app, which knows the route.
"""

from __future__ import annotations

import logging
import socket
import ssl
from dataclasses import dataclass
from typing import Any

import trio
from hypercorn.config import Config, Sockets
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio import serve

# hypercorn's own lines: its errors, not its "Running on" (the node's ready line names the ports)
log = logging.getLogger("maxq.http.hypercorn")
log.setLevel(logging.WARNING)
LISTEN_BACKLOG = 4096  # connections waiting for accept (what trio.open_tcp_listeners would ask)

# hypercorn seam 1 (hypercorn 0.18, protocol/h11.py): a request h11 cannot parse is answered with
# h11's status hint, which is 501 for a Transfer-Encoding other than one `chunked` (RFC 9112
# §6.1). Our rule is a 4xx for every bad request, and RabbitMQ's management port (cowboy)
# answers 400 there too (checked side by side with `gzip`, `identity`, `gzip, chunked`). The
# method that sends that answer is wrapped so that a 5xx hint becomes 400; nothing else changes.
_send_h11_refusal = H11Protocol._send_error_response


async def _send_refusal_as_4xx(self: H11Protocol, status_code: int) -> None:
    await _send_h11_refusal(self, 400 if status_code >= 500 else status_code)


H11Protocol._send_error_response = _send_refusal_as_4xx  # type: ignore[method-assign]


@dataclass(frozen=True)
class Limits:
    """What hypercorn bounds for one server (the app bounds the body: see the module's docstring)."""

    head_max_bytes: int  # request line and headers (h11's max_incomplete_event_size)
    idle_timeout_s: int  # from accept, or from the last answer, to a complete request head
    read_timeout_s: int  # one read from the socket
    # An answer the client stops reading: hypercorn's write has no deadline of its own, so the
    # kernel aborts a connection whose sent data stays unacknowledged (a zero window included)
    # this long (TCP_USER_TIMEOUT, inherited by every accepted socket; Linux).
    send_stall_timeout_s: int
    tls_handshake_timeout_s: int = 5
    requests_per_connection_max: int = 1000  # then the answer says Connection: close
    body_chunks_queued_max: int = 4  # read ahead of the app, each at most 64 KiB (hypercorn's MAX_RECV)


class _BoundConfig(Config):
    """Hypercorn's config, serving sockets bound beforehand with the given TLS context."""

    def __init__(self, sockets: list[socket.socket], ssl_context: ssl.SSLContext | None) -> None:
        super().__init__()
        self._sockets = sockets
        self._ssl_context = ssl_context

    def create_sockets(self) -> Sockets:
        if self._ssl_context is not None:
            return Sockets(secure_sockets=self._sockets, insecure_sockets=[], quic_sockets=[])
        return Sockets(secure_sockets=[], insecure_sockets=self._sockets, quic_sockets=[])

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._ssl_context

    @property
    def ssl_enabled(self) -> bool:
        return self._ssl_context is not None


async def bind_sockets(port: int, host: str | None) -> list[socket.socket]:
    """Listening sockets on `port` (0: a free one) for every address of `host`, bound as
    trio.open_tcp_listeners binds them (dual stack, SO_REUSEADDR); OSError when it cannot."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    # (hypercorn takes standard sockets and wraps them for trio itself)
    return [socket.socket(fileno=listener.socket.detach()) for listener in listeners]


def _set_send_stall_timeout(sock: socket.socket, timeout_s: int) -> None:
    option = getattr(socket, "TCP_USER_TIMEOUT", None)
    if option is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, option, timeout_s * 1000)


def bound_address(sockets: list[socket.socket]) -> tuple[Any, ...]:
    """The address the first socket listens on: (host, port, ...) as getsockname gives it."""
    return tuple(sockets[0].getsockname())


async def serve_asgi(
    app: Any,
    sockets: list[socket.socket],
    limits: Limits,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[tuple[Any, ...]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `sockets` until cancelled; started() with the first socket's address. The
    sockets are closed when the server stops."""
    for sock in sockets:
        _set_send_stall_timeout(sock, limits.send_stall_timeout_s)
    config = _BoundConfig(sockets, ssl_context)
    config.h11_max_incomplete_size = limits.head_max_bytes
    config.keep_alive_timeout = limits.idle_timeout_s
    config.read_timeout = limits.read_timeout_s
    config.ssl_handshake_timeout = limits.tls_handshake_timeout_s
    config.keep_alive_max_requests = limits.requests_per_connection_max
    config.max_app_queue_size = limits.body_chunks_queued_max
    config.include_server_header = False  # (as before: the node does not name its software)
    # hypercorn listens again with its own backlog (100 by default): thousands of clients
    # connecting at once (SQS long polls) overflowed it, and each dropped SYN waited for the
    # client's retransmission (1 s, then 3 s, ...). The kernel caps this at net.core.somaxconn.
    config.backlog = LISTEN_BACKLOG
    config.errorlog = log
    config.accesslog = None
    address = bound_address(sockets)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, app, config)
            task_status.started(address)
    finally:
        for sock in sockets:
            sock.close()
