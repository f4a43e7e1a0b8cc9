"""The SQS endpoint as an ASGI app, served by hypercorn on `--sqs-port` (asgi_server.py; docs/sqs.md).

Theory of operation: a request is checked in this order, each failure answered with SQS's error
shape (sqs/protocol.py's `error_response`): it is a POST (405 otherwise, as a plain HTTP error),
its body has a Content-Length within the protocol's limit (413) and arrives within
REQUEST_TIMEOUT_S (408); its AWS Signature V4 verifies against the access key it names
(sqs/sigv4.py, the metadata machine's access keys: InvalidClientTokenId for an unknown key,
SignatureDoesNotMatch for a wrong secret, both 403); its action and parameters are what SQS
accepts (sqs/protocol.py); then the action runs as the key's user (sqs_actions.py). An error
of ours that is not an SqsError is logged and answered InternalError (500), and the server goes on.

The endpoint's path names the vhost for the actions that take no queue URL: `/` is "/", and
`/<vhost, percent-encoded>` (or a queue URL's path, whose first segment is the vhost) another.
Queue URLs are built from the scheme and the Host header the client sent (a proxy in front keeps
them right), and over TLS a request may sign UNSIGNED-PAYLOAD instead of its body's hash.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import socket
import ssl
import time
import uuid
from typing import Any
from urllib.parse import unquote

import trio
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from ..machines.maintenance import DRAINING_TEXT
from ..sqs import sigv4
from ..sqs.errors import SqsError
from ..sqs.protocol import Limits, error_response, parse_request, success_response
from .asgi_app import answered_other_than_http, check_head_size, drain_body
from .asgi_server import Limits as ServerLimits
from .asgi_server import bind_sockets, serve_asgi
from .requests import HttpError, metadata_caught_up
from .sqs_actions import Caller, SqsActions

log = logging.getLogger("maxq.sqs")

HEAD_MAX_BYTES = 16 * 1024
REQUEST_TIMEOUT_S = 30.0  # the body's arrival; a long poll's answer takes up to 20 s more
SERVER_LIMITS = ServerLimits(
    head_max_bytes=HEAD_MAX_BYTES,
    idle_timeout_s=60,  # SDKs keep connections for the next poll
    send_stall_timeout_s=30,
    read_timeout_s=int(REQUEST_TIMEOUT_S),
)
# SQS's limits but for delays: up to 7 days, as the seed's service allows (issue #18), where SQS
# stops at 15 minutes; the queue machine holds delayed messages in its store (machines/delayed.py)
ENDPOINT_LIMITS = Limits(max_delay_s=7 * 24 * 3600)
RECEIPT_KEY_FILE = "sqs-receipt.key"
RECEIPT_KEY_BYTES = 32
_HOST = re.compile(r"[A-Za-z0-9.-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


def _answer(response: tuple[int, list[tuple[str, str]], bytes]) -> Response:
    status, headers, body = response
    out = Response(body, status)
    for name, value in headers:
        if name.lower() != "content-length":  # (starlette sets it from the body)
            out.headers[name] = value
    return out


def _error(error: SqsError) -> Response:
    return _answer(error_response(error, str(uuid.uuid4())))


class SqsApp:
    def __init__(self, broker: Any, receipt_keys: list[bytes], tls: bool, limits: Limits = ENDPOINT_LIMITS) -> None:
        self.broker = broker
        self.tls = tls
        self.limits = limits
        self.actions = SqsActions(broker, receipt_keys, limits)
        self.scheme = "https" if tls else "http"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answered_other_than_http(scope, receive, send):
            return
        http = HttpRequest(scope, receive)
        try:
            response = await self._answer(http)
        except ClientDisconnect:
            return
        await response(scope, receive, send)

    async def _answer(self, http: HttpRequest) -> Response:
        scope = http.scope
        try:
            check_head_size(scope, HEAD_MAX_BYTES)
        except HttpError:
            await drain_body(http)
            return _error(SqsError("RequestEntityTooLarge", "The request's headers are too large."))
        if scope["method"] != "POST":
            await drain_body(http)
            return Response(b"", 405, {"Allow": "POST", "Connection": "close"})
        try:
            body = await self._body(http)
        except SqsError as error:
            await drain_body(http)
            response = _error(error)
            response.headers["connection"] = "close"
            return response
        try:
            return await self._run(http, body)
        except SqsError as error:
            return _error(error)
        except ClientDisconnect:
            raise
        except Exception:
            log.exception("SQS request %s failed", http.headers.get("x-amz-target", "")[:100])
            return _error(SqsError("InternalError", "We encountered an internal error. Please try again."))

    async def _body(self, http: HttpRequest) -> bytes:
        declared = http.headers.get("content-length")
        if declared is None or not declared.isdecimal():
            raise SqsError("MissingParameter", "The request must have a Content-Length.")
        if int(declared) > self.limits.max_request_bytes:
            raise SqsError("RequestEntityTooLarge", "The request is too large.")
        received = bytearray()
        with trio.move_on_after(REQUEST_TIMEOUT_S) as deadline:
            async for chunk in http.stream():
                received += chunk
                if len(received) > self.limits.max_request_bytes:
                    raise SqsError("RequestEntityTooLarge", "The request is too large.")
        if deadline.cancelled_caught:
            raise SqsError("MissingParameter", f"The request's body did not arrive within {REQUEST_TIMEOUT_S:.0f} s.")
        return bytes(received)

    async def _run(self, http: HttpRequest, body: bytes) -> Response:
        scope = http.scope
        raw_path: bytes = scope["raw_path"]
        path = raw_path.decode("latin-1")
        query = scope["query_string"].decode("latin-1")
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        meta = self.broker.meta
        unknown: list[str] = []  # key ids this member does not have (yet)

        def secret_for(key_id: str) -> str | None:
            secret = self.broker.meta.access_key_secret(key_id)  # (the machine as it is now)
            if secret is None:
                unknown.append(key_id)
            return secret

        def verify() -> str:
            return sigv4.verify_request(
                method="POST",
                path=path,
                query=query,
                headers=headers,
                body=body,
                now_s=time.time(),
                secret_for=secret_for,
                allow_unsigned_payload=self.tls,
            )

        try:
            key_id = verify()
        except sigv4.SignatureError:
            if not unknown or not self.broker.log.metadata_may_lag():
                raise
            # A key made through another member a moment ago: again once this member has applied
            # what the metadata group had committed (server/metadata_sync.py).
            await metadata_caught_up(self.broker)
            key_id = verify()
            meta = self.broker.meta  # (a snapshot installed meanwhile replaces the machine)
        record = meta.access_keys.get(key_id)
        if record is None:  # deleted meanwhile
            raise SqsError("InvalidClientTokenId", sigv4.MSG_UNKNOWN_KEY)
        if self.broker.node_id in meta.draining:  # (maxqctl drain: its clients go to other members)
            raise SqsError("ServiceUnavailable", DRAINING_TEXT)
        request = parse_request(http.headers, body, self.limits)
        caller = Caller(record.user, _endpoint_vhost(path), self._base_url(http))
        result = await self.actions.run(request, caller)
        return _answer(success_response(result, str(uuid.uuid4())))

    def _base_url(self, http: HttpRequest) -> str:
        hosts = http.headers.getlist("host")
        if len(hosts) == 1 and _HOST.fullmatch(hosts[0]):
            return f"{self.scheme}://{hosts[0]}"
        server = http.scope.get("server") or ("localhost", 0)
        return f"{self.scheme}://{server[0]}:{server[1]}"


def _endpoint_vhost(path: str) -> str:
    """The vhost the endpoint's path names: "/" for `/`, else the first segment, decoded."""
    segments = [segment for segment in path.split("?", 1)[0].split("/") if segment]
    if not segments:
        return "/"
    try:
        return unquote(segments[0], errors="strict")
    except UnicodeDecodeError:
        raise SqsError("InvalidAddress", "The endpoint's path is not a vhost name.") from None


def receipt_keys(settings: Any) -> list[bytes]:
    """The key receipt handles are signed with. A cluster's members must share it (a handle may
    come back to any member): derived from the cluster secret. A single node keeps a random one
    in its data folder, so handles outlive a restart."""
    if settings.clustered:
        return [hmac.new(settings.cluster_secret.encode("utf-8"), b"maxq-raft sqs receipts", hashlib.sha256).digest()]
    path = os.path.join(settings.data_dir, RECEIPT_KEY_FILE)
    try:
        with open(path, "rb") as file:
            key = file.read()
        if len(key) == RECEIPT_KEY_BYTES:
            return [key]
    except FileNotFoundError:
        pass
    key = os.urandom(RECEIPT_KEY_BYTES)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key)
        file.flush()
        os.fsync(file.fileno())
    return [key]


async def open_sqs_listeners(settings: Any) -> list[socket.socket]:
    return await bind_sockets(settings.sqs_port, settings.sqs_host or settings.http_host)


async def serve_sqs(
    broker: Any,
    sockets: list[socket.socket],
    keys: list[bytes],
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[tuple[Any, ...]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the SQS endpoint on the bound `sockets` (HTTPS with `ssl_context`) until cancelled."""
    app = SqsApp(broker, keys, tls=ssl_context is not None)
    await serve_asgi(app, sockets, SERVER_LIMITS, ssl_context, task_status=task_status)
