"""The admin API's and the Prometheus port's HTTP transport (hypercorn, http/asgi_server.py) against
the shared node, over real sockets: connections are kept alive, pipelined requests are answered
in order, a slow or oversize request is answered or dropped within a bound and its connection
closed, and a malformed request never takes the server down."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import time

import pytest

from ..helpers import GUEST_AUTH

TIMEOUT_S = 10.0
IDLE_TIMEOUT_S = 5.0  # admin.REQUEST_TIMEOUT_S: to a complete head, and between requests
BODY_TIMEOUT_S = 5.0  # admin.REQUEST_TIMEOUT_S: a body's read, from the request's start
SLACK_S = 3.0  # scheduling on a loaded machine


def _get(connection: http.client.HTTPConnection, path: str) -> tuple[int, object]:
    connection.request("GET", path, headers=GUEST_AUTH)
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def _read_to_close(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took; AssertionError if
    it does not close within `timeout_s`."""
    started = time.monotonic()
    data = b""
    sock.settimeout(timeout_s)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        except TimeoutError:
            raise AssertionError(f"the server did not close within {timeout_s} s; got {data[:200]!r}") from None
        if not chunk:
            break
        data += chunk
    return data, time.monotonic() - started


def _replies(data: bytes) -> list[tuple[str, dict[str, str], bytes]]:
    """The HTTP/1.1 replies in `data`, in order: (status line, headers, body)."""
    replies = []
    for _ in range(100):  # bounded
        if not data:
            return replies
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, data[:200]
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        replies.append((lines[0], headers, rest[:length]))
        data = rest[length:]
    raise AssertionError("too many replies")


def _request(method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_two_requests_on_one_admin_connection(broker):
    connection = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=TIMEOUT_S)
    try:
        status, overview = _get(connection, "/api/overview")
        assert status == 200 and "node" in overview
        sock = connection.sock
        assert sock is not None  # http.client keeps it while the server keeps the connection
        status, queues = _get(connection, "/api/queues")
        assert status == 200 and isinstance(queues, list)
        assert connection.sock is sock  # the same connection: not reopened
        # an answer with an error keeps the connection too, once the request was read whole
        status, answer = _get(connection, "/api/nothing")
        assert status == 404 and connection.sock is sock, answer
    finally:
        connection.close()


def test_two_scrapes_on_one_prometheus_connection(broker):
    connection = http.client.HTTPConnection("127.0.0.1", broker.prometheus_port, timeout=TIMEOUT_S)
    try:
        for _ in range(2):
            connection.request("GET", "/metrics")
            response = connection.getresponse()
            assert response.status == 200 and b"rabbitmq_identity_info" in response.read()
            assert response.getheader("connection") is None  # kept alive
    finally:
        connection.close()


def test_pipelined_requests_are_answered_in_order(broker):
    auth = {"Authorization": GUEST_AUTH["Authorization"]}
    paths = ["/api/overview", "/api/nothing", "/api/queues", "/api/whoami"]
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
        sock.sendall(b"".join(_request("GET", path, auth) for path in paths))
        sock.shutdown(socket.SHUT_WR)  # the server answers all four, then sees the end and closes
        data, _took = _read_to_close(sock, TIMEOUT_S)
    replies = _replies(data)
    assert [line.split(" ")[1] for line, _, _ in replies] == ["200", "404", "200", "200"], replies
    assert all(headers["content-type"] == "application/json" for _, headers, _ in replies)
    assert json.loads(replies[3][2])["name"] == "guest"


def test_an_idle_or_unfinished_head_is_dropped_in_time(broker):
    for sent in (b"", b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n"):  # (no blank line: unfinished)
        with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
            sock.sendall(sent)
            data, took = _read_to_close(sock, IDLE_TIMEOUT_S + SLACK_S)
        assert data == b"" and took >= IDLE_TIMEOUT_S - 1.0, (sent, data, took)


def test_a_slow_body_is_answered_408_in_time_and_closed(broker):
    headers = {**GUEST_AUTH, "Content-Type": "application/json", "Content-Length": "100"}
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
        sock.sendall(_request("PUT", "/api/policies/%2F/slow", headers, b'{"pattern": '))  # 12 of 100 bytes
        data, took = _read_to_close(sock, BODY_TIMEOUT_S + SLACK_S)
    [(line, reply_headers, body)] = _replies(data)
    assert line.startswith("HTTP/1.1 408") and reply_headers["connection"] == "close", data
    assert "did not arrive" in json.loads(body)["error"] and took < BODY_TIMEOUT_S + SLACK_S


def test_an_oversize_head_is_431_and_closed(broker):
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
        sock.sendall(_request("GET", "/api/overview", {"X-Big": "v" * 20000, **GUEST_AUTH}))
        data, _took = _read_to_close(sock, TIMEOUT_S)
    [(line, headers, _body)] = _replies(data)
    assert line.startswith("HTTP/1.1 431") and headers["connection"] == "close", data


def test_an_oversize_body_is_413_and_closed(broker):
    body = b"x" * 40000
    headers = {**GUEST_AUTH, "Content-Type": "application/json", "Content-Length": str(len(body))}
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
        sock.sendall(_request("PUT", "/api/users/big", headers, body))
        data, _took = _read_to_close(sock, TIMEOUT_S)
    [(line, reply_headers, reply_body)] = _replies(data)
    assert line.startswith("HTTP/1.1 413") and reply_headers["connection"] == "close", data
    assert json.loads(reply_body) == {"error": "request over 16384 bytes"}
    # ... and a declared length over the limit is refused before any of it is sent
    headers["Content-Length"] = str(1 << 30)
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
        sock.sendall(_request("PUT", "/api/users/big", headers))
        data, took = _read_to_close(sock, TIMEOUT_S)
    assert _replies(data)[0][0].startswith("HTTP/1.1 413") and took < 3.0, data


def test_malformed_requests_get_a_4xx_or_a_close_and_the_server_lives_on(broker):
    bad = [
        b"GET\r\n\r\n",
        b"GET /api/overview HTTP/1.1 extra\r\nHost: 127.0.0.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n",
        _request("GET", "/api/overview", {"Content-Length": "abc"}),
        _request("PUT", "/api/policies/%2F/p", {"Transfer-Encoding": "chunked"}, b"5\r\nhello\r\n0\r\n\r\n"),
        _request("GET", "/api/overview", {"Host": "evil.example"}),  # a second Host
        b"GET /api/overview HTTP/1.1\nHost: 127.0.0.1\n\n",  # bare line feeds
        _request("GET", "http://[::1/api/overview", GUEST_AUTH),  # urlsplit raises on it (was a traceback)
        # transfer codings h11 does not implement: 400, as RabbitMQ's port answers (h11 hints 501)
        _request("PUT", "/api/policies/%2F/p", {"Transfer-Encoding": "gzip, chunked"}, b"0\r\n\r\n"),
        _request("PUT", "/api/policies/%2F/p", {"Transfer-Encoding": "identity"}),
    ]
    for request in bad:
        with socket.create_connection(("127.0.0.1", broker.http_port), timeout=TIMEOUT_S) as sock:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            data, _took = _read_to_close(sock, TIMEOUT_S)
        for line, _headers, _body in _replies(data):
            assert line.split(" ")[1][0] in "24", (request, data)
    connection = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=TIMEOUT_S)
    try:
        assert _get(connection, "/api/overview")[0] == 200
    finally:
        connection.close()


def test_a_client_that_stops_reading_is_dropped(broker):
    # Pipelined scrapes whose answers (~8 KiB each, megabytes in all) the client never reads: the
    # server's write stalls on a zero window, and the kernel aborts the connection after
    # asgi_server.Limits.send_stall_timeout_s (TCP_USER_TIMEOUT) instead of holding it forever.
    scrape = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    count = 900  # (under the 1,000 requests a connection may make)
    sock = socket.socket()
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, set before connecting
        sock.settimeout(TIMEOUT_S)
        sock.connect(("127.0.0.1", broker.prometheus_port))
        sock.sendall(scrape * count)
        time.sleep(IDLE_TIMEOUT_S + SLACK_S)  # not reading
        data, took = _read_to_close(sock, TIMEOUT_S)
    finally:
        sock.close()
    assert data.count(b"HTTP/1.1 200") < count and took < TIMEOUT_S
    connection = http.client.HTTPConnection("127.0.0.1", broker.prometheus_port, timeout=TIMEOUT_S)
    try:
        connection.request("GET", "/metrics")
        assert connection.getresponse().status == 200
    finally:
        connection.close()


@pytest.mark.skipif(shutil.which("ss") is None, reason="iproute2's ss is not installed")
def test_every_http_listener_keeps_a_deep_accept_queue(broker):
    # hypercorn listens again with a backlog of its own (100 by default): 5,000 SQS long polls
    # connecting at once overflowed it and waited for SYN retransmissions (asgi_server.py).
    for port in (broker.http_port, broker.prometheus_port, broker.sqs_port):
        shown = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=10)
        backlogs = {int(line.split()[2]) for line in shown.stdout.splitlines() if line.startswith("LISTEN")}
        assert backlogs and min(backlogs) >= 1024, (port, shown.stdout)
