"""TLS for client connections: the server's SSL context, and the handshake of one connection.

Theory of operation: with `--tls-cert` the node builds one `ssl.SSLContext` at start (a missing or
unreadable certificate, key or CA file fails the start with a message, before any port is
bound) and serves AMQP over TLS on its own port (RabbitMQ's 5671) and the admin API over HTTPS
(15671). An accepted socket is wrapped in a `trio.SSLStream`; the handshake runs under the
same deadline as the AMQP handshake (`handshake_timeout_s`), so a client that connects and
never finishes it cannot hold a task. A failed handshake is one log line, no traceback: a scan
or a client with the wrong CA is routine.

Client certificates (`--tls-verify-peer`) follow RabbitMQ's verify_peer and
fail_if_no_peer_cert: `optional` asks for one and checks it against `--tls-ca` when sent,
`required` refuses a client without one. Only `--tls-ca` is trusted for them, never the system's
CAs (else any publicly issued certificate could log in with EXTERNAL). A verified certificate's
subject CN is the user name offered to EXTERNAL (RabbitMQ's ssl_cert_login_from = common_name).
"""

from __future__ import annotations

import logging
import os
import ssl

import trio

from ..config import Settings

log = logging.getLogger("maxq.tls")

VERIFY_MODES = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
MIN_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}


class TLSConfigError(Exception):
    """A certificate, key or CA file that cannot be used; the message says which and why."""


def server_context(settings: Settings) -> ssl.SSLContext | None:
    """The context for every TLS listener of this node, or None without `--tls-cert`."""
    if not settings.tls_cert:
        return None
    for what, path in (("certificate", settings.tls_cert), ("key", settings.tls_key), ("CA", settings.tls_ca)):
        if path and not os.path.isfile(path):  # (ssl's own error names no file)
            raise TLSConfigError(f"TLS {what} file not found: {path}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_VERSIONS[settings.tls_min_version]
    try:
        context.load_cert_chain(settings.tls_cert, settings.tls_key or None)
    except (ssl.SSLError, OSError) as exc:
        files = settings.tls_cert + (f" / {settings.tls_key}" if settings.tls_key else "")
        raise TLSConfigError(f"cannot use the TLS certificate and key {files}: {_reason(exc)}") from None
    if settings.tls_ca:
        try:
            context.load_verify_locations(cafile=settings.tls_ca)
        except (ssl.SSLError, OSError) as exc:
            raise TLSConfigError(f"cannot use the TLS CA file {settings.tls_ca}: {_reason(exc)}") from None
    context.verify_mode = VERIFY_MODES[settings.tls_verify_peer]
    return context


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return getattr(exc, "strerror", None) or str(exc)


async def accept(
    stream: trio.SocketStream, context: ssl.SSLContext, timeout_s: float, peer_host: str
) -> trio.SSLStream[trio.SocketStream] | None:
    """The TLS stream of an accepted connection once its handshake is done; None (the socket
    closed, one line logged) if the handshake fails or takes longer than `timeout_s`."""
    tls_stream = trio.SSLStream(stream, context, server_side=True)
    reason = "timed out"
    with trio.move_on_after(timeout_s):
        try:
            await tls_stream.do_handshake()
            return tls_stream
        except trio.BrokenResourceError as exc:
            reason = _reason(exc.__cause__) if exc.__cause__ is not None else "connection lost"
    log.info("connection from %s: TLS handshake failed: %s", peer_host, reason)
    with trio.CancelScope(shield=True):
        await stream.aclose()  # (the raw socket: a failed TLS stream has nothing to say)
    return None


def peer_common_name(tls_stream: trio.SSLStream) -> str | None:
    """The subject CN of the client's certificate if it sent one and it was verified; else None.
    (With verification off, Python reports no certificate at all.)"""
    cert = tls_stream.getpeercert()
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None
