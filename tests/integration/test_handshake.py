"""The connection handshake over real sockets: protocol header, login, vhost, heartbeats and the
handshake timeout, against a real `maxq-server`. Every read has a deadline."""

from __future__ import annotations

import time

import pika
import pytest

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER

from ..raw_client import RawClient


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
