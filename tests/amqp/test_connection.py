"""ServerConnection, sans-IO: a tiny client written here with our codec talks to it over a fake
wire (bytes in, bytes out), with time passed as an argument.

Codes and texts are RabbitMQ's (rabbit_reader.erl, rabbit_command_assembler.erl); each test
names the case it pins down.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxq_raft.amqp import spec
from maxq_raft.amqp.connection import (
    CLOSE_TIMEOUT_S,
    FATAL_CLOSE_GRACE_S,
    LATER,
    PROTOCOL_HEADER_0_9,
    ServerConnection,
    State,
)
from maxq_raft.amqp.events import (
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ContentReceived,
    MethodReceived,
)
from maxq_raft.amqp.frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    FrameReader,
    encode_content,
    encode_frame,
    encode_method_frame,
)
from maxq_raft.amqp.properties import BasicProperties, encode_content_header, encode_properties
from maxq_raft.amqp.values import encode_table

USERS = {"guest": "guest", "ann": "s3cret"}
PUBLISH = spec.BasicPublish(exchange="", routing_key="q")
PROPS = encode_properties(BasicProperties(content_type="text/plain", delivery_mode=2))


def make_conn(**kwargs) -> ServerConnection:
    return ServerConnection(
        authenticate=lambda mechanism, user, password: USERS.get(user) == password,
        vhost_allowed=lambda user, vhost: None if vhost == "/" else f"vhost {vhost} not found",
        server_properties={"product": "test-server"},
        **kwargs,
    )


class Peer:
    """The client end of the fake wire."""

    def __init__(self, **kwargs) -> None:
        self.conn = make_conn(**kwargs)
        self.reader = FrameReader(0)
        self.now = 0.0
        self.events: list = []

    def send(self, data: bytes) -> list:
        self.conn.receive_data(data, self.now)
        events = self.conn.next_events()
        self.events += events
        return events

    def method(self, channel: int, method) -> list:
        return self.send(encode_method_frame(channel, method))

    def received(self) -> list:
        """What the server sent since the last call: ("header", bytes), (channel, method) or
        (frame type, channel, payload)."""
        data = self.conn.data_to_send(self.now)
        out: list = []
        if data.startswith(b"AMQP"):
            out.append(("header", data[:8]))
            data = data[8:]
        self.reader.feed(data)
        for frame_type, channel, payload in self.reader.read_frames():
            if frame_type == spec.FRAME_METHOD:
                out.append((channel, spec.decode_method(payload)))
            else:
                out.append((frame_type, channel, bytes(payload)))
        return out

    def one_method(self, cls, channel: int | None = None):
        """Exactly one frame was sent, a method of class `cls`; return it."""
        got = self.received()
        assert len(got) == 1 and isinstance(got[0][-1], cls), got
        if channel is not None:
            assert got[0][0] == channel
        return got[0][-1]

    def tick(self, now: float) -> bool:
        self.now = now
        alive = self.conn.tick(now)
        self.events += self.conn.next_events()
        return alive

    def closed_events(self) -> list:
        return [e for e in self.events if isinstance(e, ConnectionClosed)]


def start_ok(mechanism="PLAIN", user="guest", password="guest", capabilities=None) -> spec.ConnectionStartOk:
    if mechanism == "AMQPLAIN":
        response = encode_table({"LOGIN": user, "PASSWORD": password})[4:]  # a table without its length
    else:
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
    props = {
        "product": "test-client",
        "capabilities": capabilities if capabilities is not None else {"authentication_failure_close": True},
    }
    return spec.ConnectionStartOk(client_properties=props, mechanism=mechanism, response=response, locale="en_US")


def client_handshake_bytes(frame_max=131072, channel_max=2047, heartbeat=0, vhost="/", mechanism="PLAIN") -> bytes:
    """Everything a client sends up to connection.open, in one stream (a pipelining client)."""
    return b"".join(
        (
            PROTOCOL_HEADER,
            encode_method_frame(0, start_ok(mechanism)),
            encode_method_frame(
                0, spec.ConnectionTuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat)
            ),
            encode_method_frame(0, spec.ConnectionOpen(virtual_host=vhost)),
        )
    )


def open_peer(frame_max=131072, heartbeat=0, **kwargs) -> Peer:
    peer = Peer(**kwargs)
    peer.send(PROTOCOL_HEADER)
    peer.one_method(spec.ConnectionStart, 0)
    peer.method(0, start_ok())
    tune = peer.one_method(spec.ConnectionTune, 0)
    peer.method(0, spec.ConnectionTuneOk(channel_max=tune.channel_max, frame_max=frame_max, heartbeat=heartbeat))
    assert peer.received() == []
    peer.method(0, spec.ConnectionOpen(virtual_host="/"))
    peer.one_method(spec.ConnectionOpenOk, 0)
    assert peer.conn.state is State.OPEN
    return peer


def open_channel(peer: Peer, number: int = 1) -> None:
    assert peer.method(number, spec.ChannelOpen()) == [ChannelOpened(number)]
    peer.one_method(spec.ChannelOpenOk, number)


def assert_hard_close(
    peer: Peer, code: int, text_part: str = "", class_id: int | None = None, method_id: int | None = None
):
    """The server sent connection.close with `code`, and then honours the closing handshake."""
    close = peer.one_method(spec.ConnectionClose, 0)
    assert close.reply_code == code, close
    assert close.reply_text.startswith(spec.REPLY_NAMES[code] + " - "), close
    assert text_part in close.reply_text, close
    if class_id is not None:
        assert (close.class_id, close.method_id) == (class_id, method_id), close
    assert peer.conn.state is State.CLOSING
    return close


# ----------------------------------------------------------------------------- handshake


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_full_handshake(mechanism):
    peer = Peer(heartbeat_s=30, frame_max=65536, channel_max=100)
    assert peer.send(PROTOCOL_HEADER) == []
    start = peer.one_method(spec.ConnectionStart, 0)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(bytes(start.mechanisms).split()) == {b"PLAIN", b"AMQPLAIN"}
    assert start.server_properties["product"] == "test-server"
    peer.method(0, start_ok(mechanism, user="ann", password="s3cret"))
    tune = peer.one_method(spec.ConnectionTune, 0)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (100, 65536, 30)
    assert peer.method(0, spec.ConnectionTuneOk(channel_max=50, frame_max=8192, heartbeat=10)) == []
    events = peer.method(0, spec.ConnectionOpen(virtual_host="/"))
    peer.one_method(spec.ConnectionOpenOk, 0)
    assert len(events) == 1 and isinstance(events[0], ConnectionOpened)
    opened = events[0]
    assert (opened.user, opened.vhost, opened.channel_max, opened.frame_max, opened.heartbeat_s) == (
        "ann",
        "/",
        50,
        8192,
        10,
    )
    assert opened.client_properties["product"] == "test-client"
    # The negotiated frame_max now bounds what the server sends: a big body is split.
    open_channel(peer)
    peer.conn.send_content(
        1,
        spec.BasicDeliver(consumer_tag="c", delivery_tag=1, redelivered=False, exchange="", routing_key="q"),
        PROPS,
        b"x" * 20000,
    )
    frames = peer.received()
    bodies = [f for f in frames if f[0] == spec.FRAME_BODY]
    assert len(bodies) == 3 and all(len(f[2]) <= 8192 - 8 for f in bodies)
    assert b"".join(f[2] for f in bodies) == b"x" * 20000


def test_pipelined_handshake_in_one_read():
    peer = Peer()
    events = peer.send(client_handshake_bytes())
    assert [type(e) for e in events] == [ConnectionOpened]
    got = peer.received()
    assert [type(m) for _, m in got] == [spec.ConnectionStart, spec.ConnectionTune, spec.ConnectionOpenOk]


def test_amqp_0_9_header_is_served_as_0_9_1():
    # rabbit_reader:version_negotiation({1, 1, 0, 9}) starts a 0-9-1 connection.
    peer = Peer()
    peer.send(PROTOCOL_HEADER_0_9)
    peer.one_method(spec.ConnectionStart, 0)


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x09\x00",
        b"AMQP\x01\x01\x00\x0a",
        b"HTTP/1.1 200",
        b"GET / HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01",
    ],
)
def test_wrong_protocol_header_gets_our_header_and_close(header):
    peer = Peer()
    # Fed a byte at a time: the header is refused as soon as it cannot be ours.
    for i in range(len(header)):
        peer.send(header[i : i + 1])
        if peer.closed_events():
            break
    assert peer.received() == [("header", PROTOCOL_HEADER)]
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.FRAME_ERROR and not closed.by_peer
    assert peer.conn.state is State.CLOSED
    # Nothing more is read or sent.
    peer.send(PROTOCOL_HEADER)
    assert peer.received() == [] and len(peer.closed_events()) == 1


def test_partial_header_waits():
    peer = Peer()
    peer.send(b"AMQP\x00\x00")
    assert peer.received() == [] and peer.conn.state is State.AWAIT_HEADER
    peer.send(b"\x09\x01")
    peer.one_method(spec.ConnectionStart, 0)


def _login(peer: Peer, **kwargs) -> None:
    peer.send(PROTOCOL_HEADER)
    peer.one_method(spec.ConnectionStart, 0)
    peer.method(0, start_ok(**kwargs))


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_bad_credentials_with_authentication_failure_close(mechanism):
    peer = Peer()
    _login(peer, mechanism=mechanism, password="wrong")
    close = assert_hard_close(peer, spec.ACCESS_REFUSED)
    assert (
        close.reply_text
        == f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
    )
    assert peer.closed_events() == []
    peer.method(0, spec.ConnectionCloseOk())
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.ACCESS_REFUSED and peer.conn.state is State.CLOSED


def test_bad_credentials_close_times_out_without_close_ok():
    peer = Peer()
    peer.now = 100.0
    _login(peer, user="nobody", password="x")
    assert_hard_close(peer, spec.ACCESS_REFUSED)
    assert peer.tick(100.0 + CLOSE_TIMEOUT_S / 2)
    assert not peer.tick(100.0 + CLOSE_TIMEOUT_S + 0.01)
    assert peer.conn.state is State.CLOSED and len(peer.closed_events()) == 1


def test_bad_credentials_without_capability_just_closes():
    peer = Peer()
    _login(peer, password="wrong", capabilities={})
    assert peer.received() == []
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.ACCESS_REFUSED and peer.conn.state is State.CLOSED


@pytest.mark.parametrize("response", [b"", b"guest", b"\x00guest", b"a\x00b\x00c\x00d", b"\x00\xff\xfe\x00x"])
def test_malformed_plain_response_is_refused(response):
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    peer.received()
    peer.method(
        0,
        spec.ConnectionStartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN",
            response=response,
            locale="en_US",
        ),
    )
    assert_hard_close(peer, spec.ACCESS_REFUSED)


def test_unknown_mechanism_closes_silently():
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    peer.received()
    peer.method(0, spec.ConnectionStartOk(client_properties={}, mechanism="EXTERNAL", response=b"", locale="en_US"))
    assert peer.received() == []
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.COMMAND_INVALID and "EXTERNAL" in closed.reply_text


def test_mechanisms_offered_are_plain_and_amqplain_by_default():
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    assert peer.one_method(spec.ConnectionStart, 0).mechanisms == b"PLAIN AMQPLAIN"


def test_external_is_offered_only_with_a_name_from_the_shell():
    # (the shell passes the verified client certificate's CN; without one EXTERNAL is dropped)
    peer = Peer(mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL"))
    peer.send(PROTOCOL_HEADER)
    assert peer.one_method(spec.ConnectionStart, 0).mechanisms == b"PLAIN AMQPLAIN"
    peer = Peer(mechanisms=("PLAIN", "AMQPLAIN", "EXTERNAL"), external_user="ann")
    peer.send(PROTOCOL_HEADER)
    assert peer.one_method(spec.ConnectionStart, 0).mechanisms == b"PLAIN AMQPLAIN EXTERNAL"


def test_external_login_asks_the_shell_with_the_name_it_passed_in():
    asked = []
    conn = ServerConnection(
        authenticate=lambda mechanism, user, password: asked.append((mechanism, user, password)) or True,
        vhost_allowed=lambda user, vhost: True,
        server_properties={},
        mechanisms=("PLAIN", "EXTERNAL"),
        external_user="ann",
    )
    conn.receive_data(PROTOCOL_HEADER)
    # the response is ignored (RabbitMQ's rabbit_auth_mechanism_ssl): the name is the certificate's
    start_ok = spec.ConnectionStartOk(client_properties={}, mechanism="EXTERNAL", response=b"bob", locale="en_US")
    conn.receive_data(encode_method_frame(0, start_ok))
    conn.next_events()
    assert asked == [("EXTERNAL", "ann", "")]
    assert conn.state is State.AWAIT_TUNE_OK and conn.user == "ann"


def test_external_refused_by_the_shell_is_403():
    peer = Peer(mechanisms=("PLAIN", "EXTERNAL"), external_user="nobody")
    _login(peer, mechanism="EXTERNAL")
    close = assert_hard_close(peer, spec.ACCESS_REFUSED)
    assert "authentication mechanism EXTERNAL" in close.reply_text


# A login or a connection.open the shell decides later (a cluster member waiting until its users
# and vhosts have caught up with what another member committed: server/session.py).


def later_peer(login=LATER, vhost_refusal=LATER) -> Peer:
    peer = Peer()
    peer.conn._authenticate = lambda mechanism, user, password: login
    peer.conn._vhost_allowed = lambda user, vhost: vhost_refusal
    return peer


def test_a_login_left_for_later_holds_the_frames_after_it_until_decided():
    peer = later_peer(vhost_refusal=None)
    peer.send(client_handshake_bytes())  # a pipelining client: start-ok, tune-ok, open at once
    assert [type(m) for _, m in peer.received()] == [spec.ConnectionStart]
    assert peer.conn.state is State.AWAIT_START_OK and peer.events == []
    peer.send(encode_method_frame(1, spec.ChannelOpen()))  # read later, not taken yet
    assert peer.received() == [] and peer.events == []
    peer.conn.decide_login(True)
    peer.events += peer.conn.next_events()
    got = [m for _, m in peer.received()]
    assert [type(m) for m in got] == [spec.ConnectionTune, spec.ConnectionOpenOk, spec.ChannelOpenOk]
    assert [type(e) for e in peer.events] == [ConnectionOpened, ChannelOpened]
    assert peer.conn.user == "guest"


def test_a_login_refused_later_is_403_and_what_followed_is_dropped():
    peer = later_peer()
    peer.send(client_handshake_bytes())
    peer.received()
    peer.conn.decide_login(False)
    peer.events += peer.conn.next_events()
    assert_hard_close(peer, spec.ACCESS_REFUSED, "Login was refused using authentication mechanism PLAIN")
    assert not any(isinstance(e, ConnectionOpened) for e in peer.events)
    peer.conn.decide_login(True)  # a second decision changes nothing
    assert peer.conn.state is State.CLOSING and peer.received() == []


@pytest.mark.parametrize("refusal", [None, "vhost x not found"])
def test_an_open_left_for_later_is_answered_when_decided(refusal):
    peer = later_peer(login=True)
    _login(peer)
    peer.one_method(spec.ConnectionTune, 0)
    peer.method(0, spec.ConnectionTuneOk(channel_max=10, frame_max=4096, heartbeat=0))
    peer.send(
        encode_method_frame(0, spec.ConnectionOpen(virtual_host="x")) + encode_method_frame(1, spec.ChannelOpen())
    )
    assert peer.received() == [] and peer.conn.state is State.AWAIT_OPEN
    peer.conn.decide_login(True)  # (not what it waits for: nothing)
    assert peer.received() == [] and peer.conn.state is State.AWAIT_OPEN
    peer.conn.decide_open(refusal)
    peer.events += peer.conn.next_events()
    if refusal is None:
        assert [type(m) for _, m in peer.received()] == [spec.ConnectionOpenOk, spec.ChannelOpenOk]
        assert [type(e) for e in peer.events] == [ConnectionOpened, ChannelOpened]
    else:
        close = assert_hard_close(peer, spec.NOT_ALLOWED, refusal)
        assert (close.class_id, close.method_id) == (0, 0)
        assert not any(isinstance(e, ConnectionOpened) for e in peer.events)


def test_a_close_while_an_open_waits_for_its_decision_reads_the_close_ok():
    peer = later_peer(login=True)
    _login(peer)
    peer.one_method(spec.ConnectionTune, 0)
    peer.method(0, spec.ConnectionTuneOk(channel_max=10, frame_max=4096, heartbeat=0))
    peer.method(0, spec.ConnectionOpen(virtual_host="/"))
    peer.conn.close(spec.CONNECTION_FORCED, "shutdown")  # the node stops meanwhile
    assert_hard_close(peer, spec.CONNECTION_FORCED, "shutdown")
    peer.conn.decide_open(None)  # too late: nothing
    assert peer.received() == []
    peer.method(0, spec.ConnectionCloseOk())
    assert peer.conn.state is State.CLOSED


def test_a_known_mechanism_not_offered_is_invalid():
    peer = Peer(mechanisms=("AMQPLAIN",))
    peer.send(PROTOCOL_HEADER)
    peer.received()
    peer.method(0, start_ok(mechanism="PLAIN"))
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.COMMAND_INVALID
    assert closed.reply_text == "invalid authentication mechanism 'PLAIN'"


@pytest.mark.parametrize(
    "frame_max, channel_max, text",
    [
        (131073, 2047, "negotiated frame_max = 131073 is higher than the maximum allowed value (131072)"),
        (4095, 2047, "negotiated frame_max = 4095 is lower than the minimum allowed value (4096)"),
        (0, 2047, "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
        (131072, 2048, "negotiated channel_max = 2048 is higher than the maximum allowed value (2047)"),
    ],
)
def test_tune_ok_out_of_range_is_530(frame_max, channel_max, text):
    peer = Peer()
    _login(peer)
    peer.one_method(spec.ConnectionTune)
    peer.method(0, spec.ConnectionTuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0))
    close = assert_hard_close(peer, spec.NOT_ALLOWED, text, 10, 30)
    assert close.reply_text == "NOT_ALLOWED - " + text
    peer.method(0, spec.ConnectionCloseOk())
    assert peer.conn.state is State.CLOSED


def test_unknown_vhost_is_530():
    peer = Peer()
    _login(peer)
    peer.received()
    peer.method(0, spec.ConnectionTuneOk(channel_max=10, frame_max=4096, heartbeat=0))
    peer.method(0, spec.ConnectionOpen(virtual_host="x"))
    close = assert_hard_close(peer, spec.NOT_ALLOWED)
    assert close.reply_text == "NOT_ALLOWED - vhost x not found"
    assert not any(isinstance(e, ConnectionOpened) for e in peer.events)


def test_out_of_order_handshake_method():
    # In state 'opening' RabbitMQ answers with connection.close 504 ...
    peer = Peer()
    _login(peer)
    peer.received()
    peer.method(0, spec.ConnectionTuneOk(channel_max=10, frame_max=4096, heartbeat=0))
    peer.method(0, spec.ConnectionTuneOk(channel_max=10, frame_max=4096, heartbeat=0))
    close = assert_hard_close(peer, spec.CHANNEL_ERROR, class_id=10, method_id=31)
    assert close.reply_text == "CHANNEL_ERROR - unexpected method in connection state opening"
    # ... in 'starting' it just drops the socket.
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    peer.received()
    peer.method(0, spec.ConnectionOpen(virtual_host="/"))
    assert peer.received() == [] and peer.conn.state is State.CLOSED


def test_content_frame_during_handshake_is_dropped():
    peer = Peer()
    peer.send(PROTOCOL_HEADER)
    peer.received()
    peer.send(encode_frame(spec.FRAME_BODY, 1, b"x"))
    assert peer.received() == []
    assert peer.closed_events()[0].reply_code == spec.UNEXPECTED_FRAME


def test_client_close_during_handshake():
    peer = Peer()
    _login(peer)
    peer.received()
    peer.method(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    peer.one_method(spec.ConnectionCloseOk, 0)
    [closed] = peer.closed_events()
    assert closed.by_peer and closed.reply_code == 200


# ------------------------------------------------------------------------------- channels


def test_channel_open_and_close_by_client():
    peer = open_peer()
    open_channel(peer, 1)
    open_channel(peer, 7)
    assert sorted(peer.conn.open_channels) == [1, 7]
    events = peer.method(7, spec.ChannelClose(reply_code=200, reply_text="ok", class_id=0, method_id=0))
    assert events == [ChannelClosed(7, 200, "ok")]
    # The close-ok is the shell's to send (after what it still owes the channel: confirms);
    # until then the number is taken and the peer's frames on it are dropped.
    assert peer.received() == []
    peer.conn.send_method(7, spec.BasicAck(delivery_tag=1, multiple=False))
    assert peer.method(7, spec.QueueDeclare(queue="q")) == []
    peer.one_method(spec.BasicAck, 7)
    peer.conn.finish_peer_close(7)
    peer.one_method(spec.ChannelCloseOk, 7)
    assert peer.conn.open_channels == [1]
    # Nothing is written on it any more, and the number can be reused.
    peer.conn.send_method(7, spec.BasicAck(delivery_tag=2, multiple=False))
    peer.conn.finish_peer_close(7)
    assert peer.received() == []
    open_channel(peer, 7)


def test_no_close_of_our_own_on_a_channel_the_peer_closed():
    peer = open_peer()
    open_channel(peer, 1)
    peer.method(1, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    peer.conn.close_channel(1, spec.NOT_FOUND, "no queue 'q' in vhost '/'")
    assert peer.received() == []
    peer.conn.finish_peer_close(1)
    peer.one_method(spec.ChannelCloseOk, 1)


def test_finish_peer_close_is_a_no_op_for_other_channels():
    peer = open_peer()
    open_channel(peer, 1)
    peer.conn.finish_peer_close(1)  # open, not closed by the peer
    peer.conn.finish_peer_close(9)  # never opened
    assert peer.received() == [] and peer.conn.open_channels == [1]


def test_channel_close_by_server_drops_frames_until_close_ok():
    peer = open_peer()
    open_channel(peer, 1)
    peer.conn.close_channel(1, spec.NOT_FOUND, "no queue 'x' in vhost '/'", 50, 10)
    close = peer.one_method(spec.ChannelClose, 1)
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        404,
        "NOT_FOUND - no queue 'x' in vhost '/'",
        50,
        10,
    )
    # Methods and content on the closing channel are discarded; nothing is sent there.
    assert peer.method(1, spec.QueueDeclare(queue="q")) == []
    assert peer.send(encode_content(1, PUBLISH, PROPS, b"body", 4096)) == []
    peer.conn.send_method(1, spec.BasicQosOk())
    assert peer.received() == []
    assert peer.method(1, spec.ChannelCloseOk()) == [ChannelClosed(1, spec.REPLY_SUCCESS, "closed by broker")]
    open_channel(peer, 1)


def test_simultaneous_channel_close():
    peer = open_peer()
    open_channel(peer, 2)
    peer.conn.close_channel(2, spec.PRECONDITION_FAILED, "nope")
    peer.received()
    events = peer.method(2, spec.ChannelClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert events == [ChannelClosed(2, 200, "bye")]
    peer.one_method(spec.ChannelCloseOk, 2)


def test_method_on_unopened_channel_is_504():
    peer = open_peer()
    peer.method(3, spec.QueueDeclare(queue="q"))
    assert_hard_close(peer, spec.CHANNEL_ERROR, "expected 'channel.open'")


def test_second_channel_open_is_504():
    peer = open_peer()
    open_channel(peer, 1)
    peer.method(1, spec.ChannelOpen())
    assert_hard_close(peer, spec.CHANNEL_ERROR, "second 'channel.open' seen", class_id=20, method_id=10)


def test_channel_max_bounds_how_many_channels_are_open_not_their_numbers():
    peer = open_peer(channel_max=2)
    open_channel(peer, 65535)
    open_channel(peer, 11)
    peer.method(1, spec.ChannelOpen())
    close = assert_hard_close(peer, spec.NOT_ALLOWED, class_id=0, method_id=0)
    assert close.reply_text == "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"


def test_a_channel_closing_still_counts_against_channel_max():
    peer = open_peer(channel_max=2)
    open_channel(peer, 1)
    open_channel(peer, 2)
    peer.method(2, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    peer.method(3, spec.ChannelOpen())  # 2's close-ok is not sent yet
    assert_hard_close(peer, spec.NOT_ALLOWED, "channel_max (2)")


def test_channel_flow():
    peer = open_peer()
    open_channel(peer, 1)
    assert peer.method(1, spec.ChannelFlow(active=True)) == []
    assert peer.one_method(spec.ChannelFlowOk, 1).active is True
    peer.method(1, spec.ChannelFlow(active=False))  # RabbitMQ: not implemented, a hard error
    close = assert_hard_close(peer, spec.NOT_IMPLEMENTED, class_id=20, method_id=20)
    assert close.reply_text == "NOT_IMPLEMENTED - active=false"


def test_update_secret_is_answered():
    peer = open_peer()
    assert peer.method(0, spec.ConnectionUpdateSecret(new_secret=b"s", reason="rotation")) == []
    peer.one_method(spec.ConnectionUpdateSecretOk, 0)
    assert peer.conn.state is State.OPEN


def test_channel_methods_become_events():
    peer = open_peer()
    open_channel(peer, 1)
    declare = spec.QueueDeclare(queue="q", durable=True, arguments={"x-max-length": 10})
    [event] = peer.method(1, declare)
    assert event == MethodReceived(1, declare)


def test_connection_method_on_a_channel_is_503():
    peer = open_peer()
    open_channel(peer, 1)
    peer.method(1, spec.ConnectionUpdateSecret(new_secret=b"s", reason=""))
    close = assert_hard_close(peer, spec.COMMAND_INVALID, class_id=10, method_id=70)
    assert close.reply_text == "COMMAND_INVALID - unimplemented method"  # RabbitMQ 3.10's, side by side


def test_channel_open_again_before_our_close_ok_is_504():
    peer = open_peer()
    open_channel(peer, 1)
    peer.method(1, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    peer.method(1, spec.ChannelOpen())
    assert_hard_close(peer, spec.CHANNEL_ERROR, "second 'channel.open' seen", class_id=20, method_id=10)


def test_other_methods_on_channel_0_are_504():
    peer = open_peer()
    peer.method(0, spec.QueueDeclare(queue="q"))
    close = assert_hard_close(peer, spec.CHANNEL_ERROR, class_id=50, method_id=10)
    assert close.reply_text == "CHANNEL_ERROR - unexpected method in connection state running"


def test_content_method_other_than_publish_is_503():
    peer = open_peer()
    open_channel(peer, 1)
    peer.method(1, spec.BasicDeliver(consumer_tag="c", delivery_tag=1, redelivered=False, exchange="", routing_key="q"))
    assert_hard_close(peer, spec.COMMAND_INVALID)


# -------------------------------------------------------------------------------- content


def publish_bytes(channel: int, body: bytes, frame_max: int = 4096, props: bytes = PROPS) -> bytes:
    return encode_content(channel, PUBLISH, props, body, frame_max)


@pytest.mark.parametrize("body_size", [0, 1, 4088, 4089, 10000])
def test_content_assembled_across_frames_split_anywhere(body_size):
    body = bytes(random.Random(body_size).randbytes(body_size))
    wire = publish_bytes(1, body) + publish_bytes(1, b"second")
    rng = random.Random(7)
    for _ in range(20):
        peer = open_peer(frame_max=4096)
        open_channel(peer)
        cuts = sorted(rng.sample(range(1, len(wire)), min(6, len(wire) - 1)))
        events = []
        for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            events += peer.send(wire[start:end])
        assert events == [ContentReceived(1, PUBLISH, PROPS, body), ContentReceived(1, PUBLISH, PROPS, b"second")]
        assert isinstance(events[0].body, bytes)


def test_content_interleaved_between_channels():
    peer = open_peer(frame_max=4096)
    open_channel(peer, 1)
    open_channel(peer, 2)
    a = publish_bytes(1, b"a" * 5000)
    b = publish_bytes(2, b"b" * 10)
    # method+header of 1, all of 2, bodies of 1: channels assemble independently.
    split = a.index(bytes([spec.FRAME_BODY, 0, 1]))
    events = peer.send(a[:split] + b + a[split:])
    assert [(e.channel, len(e.body)) for e in events] == [(2, 10), (1, 5000)]


def test_header_frame_without_method_is_505():
    peer = open_peer()
    open_channel(peer)
    peer.send(encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, 3, PROPS)))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")


def test_body_frame_without_method_is_505():
    peer = open_peer()
    open_channel(peer)
    peer.send(encode_frame(spec.FRAME_BODY, 1, b"abc"))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME, "expected method frame")


def test_content_frame_on_unopened_channel_is_505():
    peer = open_peer()
    peer.send(encode_frame(spec.FRAME_HEADER, 5, encode_content_header(60, 3, PROPS)))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME)


def test_method_frame_when_header_expected_is_505():
    peer = open_peer()
    open_channel(peer)
    peer.method(1, PUBLISH)
    peer.method(1, spec.BasicQos(prefetch_count=1))
    assert_hard_close(
        peer, spec.UNEXPECTED_FRAME, "expected content header for class 60, got non content header frame instead"
    )


def test_method_frame_when_body_expected_is_505():
    peer = open_peer()
    open_channel(peer)
    peer.method(1, PUBLISH)
    peer.send(encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, 3, PROPS)))
    peer.method(1, spec.BasicQos(prefetch_count=1))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME, "expected content body, got non content body frame instead")


def test_body_frame_when_header_expected_is_505():
    peer = open_peer()
    open_channel(peer)
    peer.method(1, PUBLISH)
    peer.send(encode_frame(spec.FRAME_BODY, 1, b"abc"))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME, "expected content header for class 60")


def test_header_for_other_class_is_505():
    peer = open_peer()
    open_channel(peer)
    peer.method(1, PUBLISH)
    peer.send(encode_frame(spec.FRAME_HEADER, 1, encode_content_header(50, 3, PROPS)))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME, "expected content header for class 60, got one for class 50 instead")


def test_body_larger_than_declared_is_501():
    peer = open_peer()
    open_channel(peer)
    peer.method(1, PUBLISH)
    peer.send(encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, 3, PROPS)))
    peer.send(encode_frame(spec.FRAME_BODY, 1, b"ab"))
    peer.send(encode_frame(spec.FRAME_BODY, 1, b"cd"))
    assert_hard_close(peer, spec.FRAME_ERROR, "content body frame exceeds remaining content size")
    assert not any(isinstance(e, ContentReceived) for e in peer.events)


def test_message_above_max_size_closes_the_channel():
    peer = open_peer(max_message_size_bytes=100)
    open_channel(peer)
    peer.send(publish_bytes(1, b"x" * 101))
    close = peer.one_method(spec.ChannelClose, 1)
    assert close.reply_code == spec.PRECONDITION_FAILED and "larger than configured max size 100" in close.reply_text
    assert not any(isinstance(e, ContentReceived) for e in peer.events)
    assert peer.conn.state is State.OPEN


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"", spec.FRAME_ERROR),
        (b"\x00\x3c", spec.FRAME_ERROR),
        (b"\x00\x3c\x00\x28\x00", spec.SYNTAX_ERROR),
        (b"\x00\x63\x00\x01", spec.NOT_IMPLEMENTED),
    ],
)
def test_short_or_unknown_method_frames(payload, code):
    peer = open_peer()
    open_channel(peer)
    peer.send(encode_frame(spec.FRAME_METHOD, 1, payload))
    assert_hard_close(peer, code)


def test_short_content_header_is_501():
    peer = open_peer()
    open_channel(peer)
    peer.method(1, PUBLISH)
    peer.send(encode_frame(spec.FRAME_HEADER, 1, b"\x00\x3c\x00\x00"))
    assert_hard_close(peer, spec.FRAME_ERROR)


@pytest.mark.parametrize("frame_type", [spec.FRAME_HEADER, spec.FRAME_BODY])
def test_content_frame_on_channel_0_is_505(frame_type):
    peer = open_peer()
    peer.send(encode_frame(frame_type, 0, b"\x00" * 14))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME)


# ----------------------------------------------------------------- fatal frame errors


@pytest.mark.parametrize(
    "wire, text",
    [
        (b"\x01\x00\x01\x00\x00\x00\x04\x00\x3c\x00\x28\x00", "frame end marker missing"),  # bad end octet
        (b"\x07\x00\x01\x00\x00\x00\x00\xce", "unknown frame type 7"),
        (b"\x03\x00\x01\x00\x00\x10\x01" + b"x" * 10, "exceeds frame_max"),  # a payload of 4097 > frame_max 4096
    ],
)
def test_fatal_frame_errors_close_and_stop_reading(wire, text):
    peer = open_peer(frame_max=4096)
    open_channel(peer)
    peer.now = 50.0
    peer.send(wire)
    assert_hard_close(peer, spec.FRAME_ERROR, text)
    # The stream is out of sync: nothing more is parsed, not even a close-ok ...
    assert peer.method(0, spec.ConnectionCloseOk()) == []
    assert peer.conn.state is State.CLOSING
    # ... and the socket is dropped after a short grace.
    assert peer.tick(50.0 + FATAL_CLOSE_GRACE_S / 2)
    assert not peer.tick(50.0 + FATAL_CLOSE_GRACE_S)
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.FRAME_ERROR and not closed.by_peer


def test_frames_up_to_8_bytes_over_frame_max_are_tolerated():
    # rabbit_reader FRAME_SIZE_FUDGE: clients that count frame_max as the payload size still work.
    peer = open_peer(frame_max=4096)
    open_channel(peer)
    body = b"b" * 4096  # a body frame of 4096 + 8 bytes
    wire = (
        encode_method_frame(1, PUBLISH)
        + encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, len(body), PROPS))
        + encode_frame(spec.FRAME_BODY, 1, body)
    )
    assert peer.send(wire) == [ContentReceived(1, PUBLISH, PROPS, body)]
    assert peer.conn.state is State.OPEN


def test_peer_going_away_after_fatal_error_ends_it_at_once():
    peer = open_peer()
    peer.send(b"\x09\x00\x00\x00\x00\x00\x00\xce")
    assert_hard_close(peer, spec.FRAME_ERROR)
    peer.send(b"")
    assert peer.conn.state is State.CLOSED and peer.closed_events()[0].reply_code == spec.FRAME_ERROR


def test_heartbeat_with_payload_is_501_and_on_a_channel_505():
    peer = open_peer()
    peer.send(encode_frame(spec.FRAME_HEARTBEAT, 0, b"x"))
    assert_hard_close(peer, spec.FRAME_ERROR)
    peer = open_peer()
    peer.send(encode_frame(spec.FRAME_HEARTBEAT, 1, b""))
    assert_hard_close(peer, spec.UNEXPECTED_FRAME)


def test_frames_before_a_fatal_error_are_still_handled():
    peer = open_peer()
    open_channel(peer)
    events = peer.send(publish_bytes(1, b"kept") + b"\x09\x00\x00\x00\x00\x00\x00\xce")
    assert ContentReceived(1, PUBLISH, PROPS, b"kept") in events


# ---------------------------------------------------------------- closing handshake


def test_after_our_close_only_close_and_close_ok_count():
    peer = open_peer()
    open_channel(peer)
    peer.conn.close(spec.CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'", now=0.0)
    close = assert_hard_close(peer, spec.CONNECTION_FORCED)
    assert close.reply_text == "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
    # Everything else is ignored: methods, content, channel opens, garbage methods.
    quiet = [
        encode_method_frame(1, spec.QueueDeclare(queue="q")),
        publish_bytes(1, b"x"),
        encode_method_frame(2, spec.ChannelOpen()),
        encode_frame(spec.FRAME_METHOD, 1, b"\x00\x63\x00\x01"),
        encode_frame(spec.FRAME_BODY, 0, b"zz"),
        HEARTBEAT_FRAME,
    ]
    for wire in quiet:
        assert peer.send(wire) == []
    peer.conn.send_method(1, spec.BasicQosOk())
    peer.conn.send_content(1, PUBLISH, PROPS, b"x")
    assert peer.received() == []
    assert peer.conn.state is State.CLOSING
    peer.method(0, spec.ConnectionCloseOk())
    [closed] = peer.closed_events()
    assert closed.reply_code == spec.CONNECTION_FORCED and not closed.by_peer


def test_close_crossing_our_close_is_answered():
    peer = open_peer()
    peer.conn.close(spec.CONNECTION_FORCED, "shutdown")
    peer.received()
    peer.method(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    peer.one_method(spec.ConnectionCloseOk, 0)
    assert peer.conn.state is State.CLOSED


def test_hard_error_close_times_out_without_close_ok():
    peer = open_peer()
    peer.now = 10.0
    peer.method(4, spec.BasicQos())  # unopened channel: 504
    assert_hard_close(peer, spec.CHANNEL_ERROR)
    assert peer.tick(10.0 + CLOSE_TIMEOUT_S - 0.1)
    assert not peer.tick(10.0 + CLOSE_TIMEOUT_S)
    assert peer.conn.state is State.CLOSED


def test_client_close():
    peer = open_peer()
    open_channel(peer)
    events = peer.method(0, spec.ConnectionClose(reply_code=200, reply_text="Normal shutdown", class_id=0, method_id=0))
    peer.one_method(spec.ConnectionCloseOk, 0)
    assert events == [ConnectionClosed(200, "Normal shutdown", True)]


def test_socket_closed_by_peer():
    peer = open_peer()
    assert peer.send(b"") == [ConnectionClosed(spec.CONNECTION_FORCED, "peer closed the socket", True)]
    assert peer.send(b"") == []


def test_reply_texts_are_truncated_to_a_shortstr_like_rabbitmq():
    # rabbit_binary_generator:amqp_exception_explanation: over 255 bytes -> first 252 + "...".
    peer = open_peer()
    open_channel(peer)
    peer.conn.close_channel(1, spec.NOT_FOUND, "x" * 300)
    close = peer.one_method(spec.ChannelClose, 1)
    assert close.reply_text == ("NOT_FOUND - " + "x" * 300)[:252] + "..."
    peer.conn.close(spec.INTERNAL_ERROR, "é" * 300)
    close = peer.one_method(spec.ConnectionClose, 0)
    assert len(close.reply_text.encode()) <= 255 and close.reply_text.startswith("INTERNAL_ERROR - ")
    assert close.reply_text.endswith("é...")
    peer = open_peer()
    peer.conn.close(spec.INTERNAL_ERROR, "y" * 238)  # exactly 255 bytes: kept whole
    assert peer.one_method(spec.ConnectionClose, 0).reply_text == "INTERNAL_ERROR - " + "y" * 238


# ----------------------------------------------------------------------------- heartbeats


def test_heartbeat_sent_after_half_the_interval_of_silence():
    peer = open_peer(heartbeat=10)
    peer.now = 100.0
    peer.send(HEARTBEAT_FRAME)
    assert peer.tick(100.0)  # silent since the handshake at 0: a heartbeat goes at once
    assert peer.received() == [(spec.FRAME_HEARTBEAT, 0, b"")]
    assert peer.tick(104.9) and peer.received() == []
    assert peer.tick(105.0)
    assert peer.received() == [(spec.FRAME_HEARTBEAT, 0, b"")]
    # Sending anything counts as a sign of life: no heartbeat right after other data.
    peer.now = 106.0
    peer.conn.send_method(0, spec.ConnectionOpenOk())  # any frame
    peer.received()
    assert peer.tick(110.9) and peer.received() == []
    assert peer.tick(111.0) and peer.received() == [(spec.FRAME_HEARTBEAT, 0, b"")]


def test_peer_dropped_after_two_silent_intervals():
    peer = open_peer(heartbeat=5)
    peer.now = 20.0
    peer.send(HEARTBEAT_FRAME)  # a heartbeat counts as data
    for t in (22.0, 25.0, 28.0, 30.0):
        assert peer.tick(t)
        peer.received()
    assert not peer.tick(30.01)
    [closed] = peer.closed_events()
    assert (
        closed.reply_code == spec.CONNECTION_FORCED
        and "missed heartbeats from client, timeout: 5s" == closed.reply_text
    )
    assert peer.received() == []  # RabbitMQ sends nothing: the socket just closes


def test_any_data_keeps_the_peer_alive():
    peer = open_peer(heartbeat=2)
    open_channel(peer)
    for second in range(1, 30):
        peer.now = float(second)
        peer.method(1, spec.BasicQos(prefetch_count=1))
        assert peer.tick(second + 0.5)


def test_heartbeat_zero_disables_both_directions():
    peer = open_peer(heartbeat=0)
    assert peer.tick(10_000.0)
    assert peer.received() == []


def test_no_heartbeats_during_handshake():
    peer = Peer(heartbeat_s=1)
    peer.send(PROTOCOL_HEADER)
    peer.received()
    assert peer.tick(100.0) and peer.received() == []


# ------------------------------------------------------------------------ random splits


def _client_stream() -> tuple[bytes, list]:
    """A valid session from a client, and the events the server must produce for it."""
    declare = spec.QueueDeclare(queue="q", arguments={"x-queue-type": "quorum", "nested": {"a": [1, 2.5, None]}})
    consume = spec.BasicConsume(queue="q", consumer_tag="ctag")
    bodies = [b"", b"a", b"b" * 4088, bytes(range(256)) * 40]
    parts = [
        client_handshake_bytes(frame_max=4096, heartbeat=0),
        encode_method_frame(1, spec.ChannelOpen()),
        encode_method_frame(2, spec.ChannelOpen()),
        encode_method_frame(1, declare),
        HEARTBEAT_FRAME,
    ]
    for i, body in enumerate(bodies):
        parts.append(publish_bytes(1 + i % 2, body))
    parts += [
        encode_method_frame(2, consume),
        encode_method_frame(2, spec.ChannelFlow(active=True)),
        encode_method_frame(2, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0)),
        encode_method_frame(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
    ]
    expected = [ChannelOpened(1), ChannelOpened(2), MethodReceived(1, declare)]
    expected += [ContentReceived(1 + i % 2, PUBLISH, PROPS, body) for i, body in enumerate(bodies)]
    expected += [
        MethodReceived(2, consume),
        ChannelClosed(2, 200, ""),
        ConnectionClosed(200, "bye", True),
    ]
    return b"".join(parts), expected


STREAM, STREAM_EVENTS = _client_stream()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=len(STREAM) - 1), max_size=40, unique=True))
def test_random_splits_produce_the_same_events(cuts):
    peer = Peer()
    events: list = []
    sent = b""
    bounds = sorted(cuts)
    for start, end in zip([0, *bounds], [*bounds, len(STREAM)], strict=True):
        events += peer.send(STREAM[start:end])
        sent += peer.conn.data_to_send(0.0)
    opened = [e for e in events if isinstance(e, ConnectionOpened)]
    assert len(opened) == 1 and opened[0].frame_max == 4096
    assert [e for e in events if not isinstance(e, ConnectionOpened)] == STREAM_EVENTS
    assert sent == _whole_stream_output()


_OUTPUT: list[bytes] = []


def _whole_stream_output() -> bytes:
    if not _OUTPUT:
        peer = Peer()
        peer.send(STREAM)
        _OUTPUT.append(peer.conn.data_to_send(0.0))
    return _OUTPUT[0]


def test_what_the_socket_did_not_take_goes_out_first_and_counts_as_pending():
    peer = open_peer()
    open_channel(peer, 1)
    open_channel(peer, 2)
    conn = peer.conn
    conn.send_method(1, spec.BasicQosOk())
    data = conn.data_to_send(peer.now)
    assert conn.pending_output_bytes == 0
    conn.unsent(data[3:])  # a socket took 3 bytes of it
    assert conn.pending_output_bytes == len(data) - 3
    conn.send_method(2, spec.BasicQosOk())
    peer.reader.feed(data[:3])
    assert [(channel, type(method)) for channel, method in peer.received()] == [
        (1, spec.BasicQosOk),
        (2, spec.BasicQosOk),
    ]
    assert conn.pending_output_bytes == 0
