"""The connection handshake over real sockets: protocol header, login, vhost, heartbeats and the
handshake timeout, against a real `maxq-server`. Every read has a deadline."""

from __future__ import annotations

import socket
import time

import pika
import pytest

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER, FrameReader, encode_method_frame

READ_TIMEOUT_S = 5.0


class RawClient:
    """A blocking AMQP client on a bare socket; every wait is bounded."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.reader = FrameReader(0)
        self.pending: list = []
        self.raw = b""  # bytes before the first frame (a protocol header reply)
        self.eof = False

    def close(self) -> None:
        self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def method(self, channel: int, method) -> None:
        self.send(encode_method_frame(channel, method))

    def _fill(self, deadline: float) -> bool:
        """Read once; False on EOF (or reset) or when the deadline passes."""
        remaining = deadline - time.monotonic()
        if remaining <= 0 or self.eof:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.reader.feed(data)
        self.pending += self.reader.read_frames()
        return True

    def next_frame(self, timeout_s: float = READ_TIMEOUT_S):
        """(type, channel, method-or-payload), or None on EOF/timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.pending:
            if not self._fill(deadline):
                return None
        frame_type, channel, payload = self.pending.pop(0)
        if frame_type == spec.FRAME_METHOD:
            return frame_type, channel, spec.decode_method(payload)
        return frame_type, channel, bytes(payload)

    def expect(self, cls, timeout_s: float = READ_TIMEOUT_S):
        frame = self.next_frame(timeout_s)
        assert frame is not None and isinstance(frame[2], cls), frame
        return frame[2]

    def read_until_eof(self, timeout_s: float = READ_TIMEOUT_S) -> bytes:
        """All raw bytes until the server closes the socket; fails if it does not in time."""
        deadline = time.monotonic() + timeout_s
        data = b""
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                return data
            if not chunk:
                return data
            data += chunk
        raise AssertionError(f"server did not close the socket within {timeout_s}s (got {data!r})")

    def handshake(
        self,
        heartbeat: int = 0,
        frame_max: int = 131072,
        vhost: str = "/",
        user: str = "guest",
        password: str = "guest",
        capabilities: dict | None = None,
    ):
        """Up to connection.open; returns connection.tune, or whatever came instead (None: EOF)."""
        self.send(PROTOCOL_HEADER)
        self.expect(spec.ConnectionStart)
        props = {
            "product": "raw-test",
            "capabilities": {"authentication_failure_close": True} if capabilities is None else capabilities,
        }
        self.method(
            0,
            spec.ConnectionStartOk(
                client_properties=props,
                mechanism="PLAIN",
                response=b"\x00" + user.encode() + b"\x00" + password.encode(),
                locale="en_US",
            ),
        )
        tune = self.next_frame()
        if tune is None or not isinstance(tune[2], spec.ConnectionTune):
            return None if tune is None else tune[2]
        self.method(0, spec.ConnectionTuneOk(channel_max=tune[2].channel_max, frame_max=frame_max, heartbeat=heartbeat))
        self.method(0, spec.ConnectionOpen(virtual_host=vhost))
        return tune[2]


@pytest.fixture
def raw(broker):
    clients: list[RawClient] = []

    def connect(port: int | None = None) -> RawClient:
        client = RawClient(port or broker.amqp_port)
        clients.append(client)
        return client

    yield connect
    for client in clients:
        client.close()


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x09\x00",  # 0-9-0
        b"AMQP\x00\x00\x08\x00",  # 0-8
        b"AMQP\x03\x01\x00\x00",  # AMQP 1.0 SASL
        b"HTTP/1.1 200 OK\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x16\x03\x01\x00\xa5\x01\x00\x00",  # a TLS client hello
    ],
)
def test_wrong_protocol_header_gets_ours_then_close(raw, header):
    client = raw()
    client.send(header)
    assert client.read_until_eof() == PROTOCOL_HEADER


def test_amqp_0_9_header_is_accepted(raw):
    client = raw()
    client.send(b"AMQP\x01\x01\x00\x09")
    start = client.expect(spec.ConnectionStart)
    assert (start.version_major, start.version_minor) == (0, 9)


def test_raw_handshake_and_client_close(raw):
    client = raw()
    tune = client.handshake()
    assert tune.frame_max == 131072 and tune.channel_max == 2047 and tune.heartbeat == 60
    client.expect(spec.ConnectionOpenOk)
    client.method(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    client.expect(spec.ConnectionCloseOk)
    assert client.read_until_eof() == b""


def test_wrong_password_raw_gets_403(raw):
    client = raw()
    close = client.handshake(password="wrong")
    assert isinstance(close, spec.ConnectionClose), close
    assert close.reply_code == 403
    assert (
        close.reply_text
        == "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. For details see the broker logfile."
    )
    client.method(0, spec.ConnectionCloseOk())
    assert client.read_until_eof() == b""


def test_wrong_password_without_capability_just_closes(raw):
    client = raw()
    result = client.handshake(password="wrong", capabilities={})
    assert result is None and client.eof


@pytest.mark.parametrize("user, password", [("guest", "wrong"), ("nobody", "guest")])
def test_pika_bad_credentials(broker, user, password):
    params = pika.ConnectionParameters(
        port=broker.amqp_port,
        credentials=pika.PlainCredentials(user, password),
        connection_attempts=1,
        socket_timeout=5,
        blocked_connection_timeout=5,
    )
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(params)
    assert "403" in str(info.value) and "ACCESS_REFUSED" in str(info.value)


def test_unknown_vhost_is_530(raw, broker):
    client = raw()
    client.handshake(vhost="x")
    close = client.expect(spec.ConnectionClose)
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - vhost x not found")
    params = pika.ConnectionParameters(
        port=broker.amqp_port, virtual_host="nope", connection_attempts=1, socket_timeout=5
    )
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as info:
        pika.BlockingConnection(params)
    assert "530" in str(info.value) and "vhost nope not found" in str(info.value)


def test_tune_ok_above_our_frame_max_is_530(raw):
    client = raw()
    client.handshake(frame_max=1 << 20)
    close = client.expect(spec.ConnectionClose)
    assert close.reply_code == 530 and (close.class_id, close.method_id) == (10, 30)
    assert "negotiated frame_max = 1048576 is higher than the maximum allowed value (131072)" in close.reply_text


def test_silent_peer_after_heartbeat_1_is_dropped_in_about_2s(start_broker):
    server = start_broker(["--heartbeat-s", "1"])
    client = RawClient(server.amqp_port)
    try:
        tune = client.handshake(heartbeat=1)
        assert tune.heartbeat == 1
        client.expect(spec.ConnectionOpenOk)
        silent_since = time.monotonic()
        heartbeats = 0
        while True:  # bounded: next_frame returns None on EOF, and the loop on time
            frame = client.next_frame(timeout_s=6.0 - (time.monotonic() - silent_since))
            if frame is None:
                break
            assert frame == (spec.FRAME_HEARTBEAT, 0, b""), frame
            heartbeats += 1
        elapsed_s = time.monotonic() - silent_since
        assert client.eof, "the server kept a silent peer for 6 s"
        assert 1.5 <= elapsed_s <= 4.0, elapsed_s
        assert heartbeats >= 2
    finally:
        client.close()


def test_heartbeating_peer_stays(start_broker):
    server = start_broker(["--heartbeat-s", "1"])
    client = RawClient(server.amqp_port)
    try:
        client.handshake(heartbeat=1)
        client.expect(spec.ConnectionOpenOk)
        end = time.monotonic() + 2.6  # past the 2 s a silent peer gets
        while time.monotonic() < end:
            client.send(HEARTBEAT_FRAME)
            frame = client.next_frame(timeout_s=0.4)
            assert frame is None or frame[0] == spec.FRAME_HEARTBEAT
            assert not client.eof
        client.method(0, spec.ConnectionClose(reply_code=200, reply_text="", class_id=0, method_id=0))
        client.expect(spec.ConnectionCloseOk)
    finally:
        client.close()


def test_silent_and_stalled_clients_are_dropped_after_the_handshake_timeout(start_broker):
    server = start_broker(["--handshake-timeout-s", "1"])
    silent = RawClient(server.amqp_port)  # never sends the header
    stalled = RawClient(server.amqp_port)  # stops after the header
    try:
        started = time.monotonic()
        stalled.send(PROTOCOL_HEADER)
        stalled.expect(spec.ConnectionStart)
        assert silent.read_until_eof(timeout_s=5.0) == b""
        assert stalled.read_until_eof(timeout_s=5.0) == b""
        assert 0.8 <= time.monotonic() - started <= 3.0
        assert "handshake timeout" in server.log_text()
    finally:
        silent.close()
        stalled.close()


def test_default_handshake_timeout_is_10s():
    from maxq_raft.config import load_settings

    settings, _ = load_settings([], environ={})
    assert settings.handshake_timeout_s == 10.0
