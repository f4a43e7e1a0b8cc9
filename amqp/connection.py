"""The server side of one AMQP 0-9-1 connection, sans-IO.

Theory of operation: the owner feeds received bytes with `receive_data(data, now)`, asks for
`next_events()` and writes whatever `data_to_send(now)` returns. The connection never touches a
socket or a clock; time comes in as an argument (the latest `now` seen by `receive_data`,
`tick` or `data_to_send` is the connection's idea of the present). It answers the protocol's own
methods itself (protocol header, start/start-ok, tune/tune-ok, open, close both ways,
heartbeats, channel open/close/flow, update-secret) and assembles content (method + header +
body frames), so the broker sees only `ConnectionOpened`, `ChannelOpened`, `MethodReceived`,
`ContentReceived` (or runs of whole publishes, `PublishesReceived`, when asked for),
`ChannelClosed` and finally `ConnectionClosed`. One answer is the shell's:
the close-ok of a channel the peer closed (`finish_peer_close`), because what the broker still
owes that channel (the confirms of its publishes) must reach the peer before it. And the shell
may leave a login or a connection.open undecided (its Authenticator or VhostCheck returns
LATER: a cluster member whose users may lag what another member committed); nothing more is
taken from the peer until it calls `decide_login` or `decide_open`.

Errors follow the spec and RabbitMQ: a hard error (bad frame, unexpected frame, a method on a
closed channel) sends connection.close with the reply code and then ignores everything but
close/close-ok; a soft error closes one channel (`close_channel`) and discards that channel's
frames until the peer's close-ok. The broker raises `ChannelError`/`HardError` and calls
`close_channel`/`close` with them. If the peer does not answer our close within
CLOSE_TIMEOUT_S, `tick` drops it.

Reply codes and texts follow RabbitMQ (deps/rabbit/src/rabbit_reader.erl: handle_frame,
handle_method0, handle_exception, validate_negotiated_integer_value, auth_fail; and
deps/rabbit_common/src/rabbit_command_assembler.erl for content assembly). Errors that lose the
frame sync (bad end marker, unknown frame type, a frame above frame_max) are "fatal frame
errors" there: RabbitMQ sends connection.close, reads no further frames and drops the socket
after a grace period. We do the same (FATAL_CLOSE_GRACE_S), discarding input meanwhile.
Before connection.open only some errors are reported with connection.close, as in RabbitMQ:
a refused login (if the client has the authentication_failure_close capability), a refused
tune-ok (530) and anything after tune-ok; the rest just closes the socket.

Hot path: one `receive_data` may hold hundreds of frames; `next_events` parses them in one pass
and returns a list, so the shell does no `await` per frame.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Sequence
from typing import Any, cast

from . import spec
from .errors import AMQPError, DecodeError, FrameError
from .events import (
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ContentReceived,
    Event,
    MethodReceived,
    PublishesReceived,
)
from .frames import (
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    PUBLISH_RUN,
    PUBLISH_TRIPLE,
    FrameReader,
    encode_content,
    encode_frame,
    unfold_publish,
    unfold_publish_run,
)
from .properties import decode_content_header
from .values import FieldTable, FieldValue, decode_table, with_shared_strings


class Later:
    """What an Authenticator or a VhostCheck returns when it cannot decide yet (a cluster member
    whose users and vhosts may be behind what another member committed): the handshake waits,
    reading nothing further, until the shell calls `decide_login` or `decide_open`."""

    def __repr__(self) -> str:
        return "LATER"


LATER = Later()
Authenticator = Callable[[str, str, str], "bool | Later"]  # (mechanism, username, password) -> allowed
VhostCheck = Callable[[str, str], "str | None | Later"]  # (username, vhost) -> why refused (530), or None
ChannelCheck = Callable[[], str | None]  # before a channel opens: why refused (530), or None

FRAME_MAX_BEFORE_TUNE = 131072  # generous: some clients send large client_properties
CLOSE_TIMEOUT_S = 3.0  # RabbitMQ's NORMAL_TIMEOUT: how long we wait for close-ok after our close
# RabbitMQ waits SILENT_CLOSE_DELAY (3 s) after a fatal frame error so that its close reaches
# the peer before the socket goes; 1 s does that on any network we serve and keeps a flood of
# bad peers cheap.
FATAL_CLOSE_GRACE_S = 1.0
# rabbit_reader:version_negotiation serves AMQP 0-9 ("AMQP" 1 1 0 9) as 0-9-1.
PROTOCOL_HEADER_0_9 = b"AMQP\x01\x01\x00\x09"
# analyze_frame's pattern for a content header: class u16, weight u16, body size u64.
CONTENT_HEADER_MIN_BYTES = 12
PUBLISH_METHODS_CACHED_MAX = 256
METHOD_MIN_BYTES = 4  # class u16, method u16
FRAME_SIZE_FUDGE_BYTES = 8  # see _tune_ok
CONNECTION_TUNE = (10, 30)  # RabbitMQ names connection.tune in a refused tune-ok's close
CHANNEL_OPEN = (20, 10)


class State(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close, waiting for close-ok
    CLOSED = "closed"


# RabbitMQ's connection_state names, used in its "unexpected method" texts.
_RABBIT_STATE = {
    State.AWAIT_START_OK: "starting",
    State.AWAIT_TUNE_OK: "tuning",
    State.AWAIT_OPEN: "opening",
    State.OPEN: "running",
}


class _ConnectionError(AMQPError):
    """A hard error that names the method that caused it in connection.close."""

    def __init__(self, reply_code: int, reply_text: str, class_id: int, method_id: int) -> None:
        super().__init__(reply_code, reply_text)
        self.class_id = class_id
        self.method_id = method_id


class _Channel:
    """Per-channel protocol state: open/closing, and a partly assembled content."""

    __slots__ = (
        "number",
        "closing",
        "peer_closed",
        "content_method",
        "content_props",
        "content_size",
        "content_parts",
        "content_got",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.closing = False  # we sent channel.close; frames are dropped until close-ok
        # The peer sent channel.close: its frames are dropped, and our close-ok waits for the
        # shell's `finish_peer_close` (confirms of its publishes go first, as RabbitMQ's).
        self.peer_closed = False
        self.content_method: spec.BasicPublish | None = None  # awaiting its header/body frames
        self.content_props = b""
        self.content_size = -1  # -1 until the header frame arrived
        self.content_parts: list[bytes | memoryview] = []
        self.content_got = 0


def _plain_credentials(response: bytes) -> tuple[str, str]:
    # RFC 4616: [authzid] NUL authcid NUL passwd
    parts = bytes(response).split(b"\x00")
    if len(parts) != 3:
        raise ValueError("malformed PLAIN response")
    return parts[1].decode("utf-8"), parts[2].decode("utf-8")


def _amqplain_credentials(response: bytes) -> tuple[str, str]:
    # AMQPLAIN is a field table without its length prefix.
    raw = bytes(response)
    table, _ = decode_table(struct.pack(">I", len(raw)) + raw, 0)
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if login is None or password is None:
        raise ValueError("AMQPLAIN response lacks LOGIN or PASSWORD")
    return _as_text(login), _as_text(password)


def _as_text(value: FieldValue) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


MECHANISMS: dict[str, Callable[[bytes], tuple[str, str]]] = {
    "PLAIN": _plain_credentials,
    "AMQPLAIN": _amqplain_credentials,
}
DEFAULT_MECHANISMS = ("PLAIN", "AMQPLAIN")
# SASL EXTERNAL (RFC 4422 appendix A), as RabbitMQ's rabbit_auth_mechanism_ssl: the identity is
# established outside AMQP (the shell passes the verified client certificate's name in as
# `external_user`); the response is ignored, and the authenticator gets that name, password "".
EXTERNAL = "EXTERNAL"


class ServerConnection:
    # Slots: CPython shares an instance dict's keys between instances only up to 30 attributes;
    # past that each connection paid for a dict of its own (~1.6 KiB; docs/benchmarks.md,
    # "RSS per connection"). An attribute set anywhere must be named here.
    __slots__ = (
        "state",
        "publish_runs",
        "mechanisms",
        "_external_user",
        "_authenticate",
        "_vhost_allowed",
        "_channel_allowed",
        "_server_properties",
        "channel_max",
        "frame_max",
        "heartbeat_s",
        "max_message_size_bytes",
        "user",
        "vhost",
        "client_properties",
        "client_capabilities",
        "_mechanism",
        "_reader",
        "_header_buf",
        "_out",
        "_out_bytes",
        "_events",
        "_channels",
        "_now",
        "_last_recv",
        "_last_send",
        "_close_deadline",
        "_close_reason",
        "_lost_sync",
        "_publish_methods",
        "_deciding",
        "_held_frames",
    )

    def __init__(
        self,
        *,
        authenticate: Authenticator,
        vhost_allowed: VhostCheck,
        server_properties: FieldTable,
        channel_max: int = 2047,
        channel_allowed: ChannelCheck | None = None,
        frame_max: int = 131072,
        heartbeat_s: int = 60,
        max_message_size_bytes: int = 128 * 1024 * 1024,
        now: float = 0.0,
        mechanisms: Sequence[str] = DEFAULT_MECHANISMS,
        external_user: str = "",
        publish_runs: bool = False,
    ) -> None:
        self.state = State.AWAIT_HEADER
        self.publish_runs = publish_runs  # whole publishes as PublishesReceived runs (events.py)
        # offered in connection.start, in this order; EXTERNAL only with `external_user`
        self.mechanisms = tuple(m for m in mechanisms if m in MECHANISMS or (m == EXTERNAL and external_user))
        self._external_user = external_user
        self._authenticate = authenticate
        self._vhost_allowed = vhost_allowed
        self._channel_allowed = channel_allowed
        self._server_properties = server_properties
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat_s = heartbeat_s
        self.max_message_size_bytes = max_message_size_bytes
        self.user = ""
        self.vhost = ""
        self.client_properties: FieldTable = {}
        self.client_capabilities: FieldTable = {}
        self._mechanism = ""
        self._reader = FrameReader(FRAME_MAX_BEFORE_TUNE)
        self._header_buf = b""
        self._out: list[bytes] = []
        self._out_bytes = 0  # len of what `_out` holds: see pending_output_bytes
        self._events: list[Event] = []
        self._channels: dict[int, _Channel] = {}
        self._now = now
        self._last_recv = now
        self._last_send = now
        self._close_deadline: float | None = None  # while CLOSING: drop the peer at this time
        self._close_reason: tuple[int, str] = (spec.REPLY_SUCCESS, "")
        self._lost_sync = False  # a fatal frame error: input is discarded until we drop the peer
        self._publish_methods: dict[bytes, spec.BasicPublish] = {}  # see _publish_whole
        # A login or a connection.open the shell decides later (LATER): what it waits on, and the
        # frames read after it, taken once it is decided.
        self._deciding: tuple[str, str] | None = None  # ("login", username) or ("open", vhost)
        self._held_frames: list[tuple[int, int, Any]] = []

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes | bytearray, now: float = 0.0) -> None:
        """Buffer bytes from the peer; an empty `data` means the peer closed the socket."""
        self._now = now
        self._last_recv = now
        if not data:
            if self.state is not State.CLOSED:
                if self.state is State.CLOSING:
                    self._terminate(*self._close_reason, by_peer=False)
                else:
                    self._terminate(spec.CONNECTION_FORCED, "peer closed the socket", by_peer=True)
            return
        if self.state is State.CLOSED or self._lost_sync:
            return
        if self.state is State.AWAIT_HEADER:
            self._header_buf += data
            header = self._header_buf[:8]
            if len(header) < 8 and (PROTOCOL_HEADER.startswith(header) or PROTOCOL_HEADER_0_9.startswith(header)):
                return
            rest = self._header_buf[8:]
            self._header_buf = b""
            if header != PROTOCOL_HEADER and header != PROTOCOL_HEADER_0_9:
                # Spec 4.2.2: answer a bad header with the header we support, then close. A
                # header that cannot be ours is refused at once, without waiting for 8 bytes.
                self._out.append(PROTOCOL_HEADER)
                self._out_bytes += len(PROTOCOL_HEADER)
                self._terminate(spec.FRAME_ERROR, f"bad protocol header {bytes(header)!r}", by_peer=False)
                return
            self._send_method(
                0,
                spec.ConnectionStart(
                    version_major=0,
                    version_minor=9,
                    server_properties=self._server_properties,
                    mechanisms=" ".join(self.mechanisms).encode(),
                    locales=b"en_US",
                ),
            )
            self.state = State.AWAIT_START_OK
            data = rest
            if not data:
                return
        self._reader.feed(data)

    def next_events(self) -> list[Event]:
        """Parse everything buffered and return the events it produced (possibly none). While a
        login or a connection.open waits for the shell's decision, nothing more is read."""
        if self._held_frames and self._deciding is None and self.state is not State.CLOSED and not self._lost_sync:
            held, self._held_frames = self._held_frames, []
            self._take_frames(held)
        if self.state is not State.CLOSED and not self._lost_sync and self._deciding is None:
            try:
                frames = self._reader.read_frames(fuse_publishes=True)
            except FrameError as err:
                self._fatal_frame_error(err.reply_code, err.reply_text)
                frames = []
            self._take_frames(frames)
            if (
                self._reader.failed
                and self._deciding is None
                and self.state is not State.CLOSED  # type: ignore[comparison-overlap]
                and not self._lost_sync
            ):
                # The frames before a broken one were handled above; now the error itself.
                try:
                    self._reader.read_frames()
                except FrameError as err:
                    self._fatal_frame_error(err.reply_code, err.reply_text)
        events, self._events = self._events, []
        return events

    def _take_frames(self, frames: list[tuple[int, int, Any]]) -> None:
        """Handle `frames` in order; those after one that leaves a decision to the shell are
        held until it is made (`decide_login`, `decide_open`)."""
        for i, (frame_type, channel, payload) in enumerate(frames):
            if self._deciding is not None:
                self._held_frames = frames[i:]
                return
            if self.state is State.CLOSED or self._lost_sync:
                break
            if frame_type in (PUBLISH_TRIPLE, PUBLISH_RUN):
                if frame_type == PUBLISH_TRIPLE:
                    key, header, body = payload
                    if self._publish_whole(channel, key, header, [b"" if body is None else body]):
                        continue
                    unfolded = unfold_publish(channel, payload)
                else:
                    if self._publish_whole(channel, *payload):
                        continue
                    unfolded = unfold_publish_run(channel, payload)
                # (declined: a channel not open, a message too big, ...: its frames as they came)
                for one_type, one_channel, one_payload in unfolded:
                    # (the ignore: mypy keeps self.state narrowed by the test above across the
                    # calls below, which change it)
                    if self.state is State.CLOSED or self._lost_sync:  # type: ignore[comparison-overlap]
                        break
                    self._take_frame(one_type, one_channel, one_payload)
                continue
            self._take_frame(frame_type, channel, payload)

    # ----------------------------------------------------------------- output

    def data_to_send(self, now: float | None = None) -> bytes:
        if now is not None:
            self._now = now
        if not self._out:
            return b""
        self._last_send = self._now
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out = []
        self._out_bytes = 0
        return data

    def unsent(self, data: bytes) -> None:
        """What a `data_to_send` returned and the socket did not take: it goes first."""
        self._out.insert(0, data)
        self._out_bytes += len(data)

    # Output for a channel goes only while it is open for us: never on a channel we are closing
    # (its frames would be discarded), and never on one whose close-ok was sent (the peer has
    # forgotten it, and some clients treat a frame on an unknown channel as fatal).

    def send_method(self, channel: int, method: spec.Method) -> None:
        if self.state is State.OPEN and self._writable(channel):
            self._send_method(channel, method)

    def send_content(self, channel: int, method: spec.Method, props_raw: bytes, body: bytes) -> None:
        if self.state is State.OPEN and self._writable(channel):
            data = encode_content(channel, method, props_raw, body, self.frame_max)
            self._out.append(data)
            self._out_bytes += len(data)

    def send_raw(self, channel: int, data: bytes) -> None:
        """Pre-encoded frames on `channel` (the delivery fast path builds them itself; once per
        delivery, so `_writable` is written out here: channel 0 never carries a delivery)."""
        if self.state is State.OPEN:
            ch = self._channels.get(channel)
            if ch is not None and not ch.closing:
                self._out.append(data)
                self._out_bytes += len(data)

    def finish_peer_close(self, channel: int) -> None:
        """Send the close-ok of a channel the peer closed (its `ChannelClosed` event came), now
        that everything owed to it was written; its number may be opened again after this. A
        no-op for any other channel."""
        ch = self._channels.get(channel)
        if ch is None or not ch.peer_closed:
            return
        del self._channels[channel]
        if self.state is State.OPEN:
            self._send_method(channel, spec.ChannelCloseOk())

    def close(
        self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0, now: float | None = None
    ) -> None:
        """Start a server-initiated connection close (a hard error, or shutdown)."""
        if now is not None:
            self._now = now
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state in (State.AWAIT_HEADER, State.AWAIT_START_OK) or (
            self.state is State.AWAIT_TUNE_OK and reply_code != spec.NOT_ALLOWED
        ):
            # rabbit_reader:handle_exception: before tune-ok the peer gets no connection.close
            # (a refused login is handled in _refuse_login); the socket just closes.
            self._terminate(reply_code, reply_text, by_peer=False)
            return
        self._send_close(reply_code, reply_text, class_id, method_id, CLOSE_TIMEOUT_S)

    def close_channel(
        self, channel: int, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0
    ) -> None:
        """A soft error: close one channel; its frames are dropped until the peer's close-ok."""
        ch = self._channels.get(channel)
        if ch is None or ch.closing or ch.peer_closed or self.state is not State.OPEN:
            return  # (a channel the peer closed is answered with its close-ok, never a close)
        ch.closing = True
        ch.content_method = None
        ch.content_size = -1
        ch.content_parts = []
        ch.content_got = 0
        self._send_method(
            channel,
            spec.ChannelClose(
                reply_code=reply_code,
                reply_text=_reply_text(reply_code, reply_text),
                class_id=class_id,
                method_id=method_id,
            ),
        )

    def note_peer_alive(self, now: float) -> None:
        """The owner is deliberately not reading (flow control): do not count the silence."""
        self._last_recv = now

    def tick(self, now: float) -> bool:
        """Heartbeats and close timeouts. Returns False when the connection must be dropped."""
        self._now = now
        if self.state is State.CLOSED:
            return False
        if self.state is State.CLOSING and self._close_deadline is not None and now >= self._close_deadline:
            self._terminate(*self._close_reason, by_peer=False)
            return False
        if self.heartbeat_s and self.state in (State.OPEN, State.CLOSING):
            if now - self._last_recv > 2 * self.heartbeat_s:
                # rabbit_heartbeat: the receiver gives up after two silent intervals; RabbitMQ
                # logs "missed heartbeats from client, timeout: Ns" and just closes the socket.
                self._terminate(
                    spec.CONNECTION_FORCED, f"missed heartbeats from client, timeout: {self.heartbeat_s}s", by_peer=True
                )
                return False
            if now - self._last_send >= self.heartbeat_s / 2 and not self._out:
                self._out.append(HEARTBEAT_FRAME)
                self._out_bytes += len(HEARTBEAT_FRAME)
        return True

    @property
    def content_bytes_in_progress(self) -> int:
        """Body bytes taken for messages not complete yet (O(channels): the owner asks only
        while a resource alarm is on, to stop reading a body that never ends)."""
        return sum(ch.content_got for ch in self._channels.values() if ch.content_method is not None)

    @property
    def pending_output_bytes(self) -> int:
        """Bytes produced and not yet taken by `data_to_send`: the owner stops reading a peer
        that does not read its replies once this grows too large."""
        return self._out_bytes

    @property
    def open_channels(self) -> list[int]:
        return list(self._channels)

    # -------------------------------------------------------------- internals

    def _send_method(self, channel: int, method: spec.Method) -> None:
        frame = encode_frame(spec.FRAME_METHOD, channel, method.encode())
        self._out.append(frame)
        self._out_bytes += len(frame)

    def _send_close(self, reply_code: int, reply_text: str, class_id: int, method_id: int, timeout_s: float) -> None:
        text = _reply_text(reply_code, reply_text)
        self._send_method(
            0, spec.ConnectionClose(reply_code=reply_code, reply_text=text, class_id=class_id, method_id=method_id)
        )
        self.state = State.CLOSING
        self._deciding = None  # (a login or open left to the shell: the close decided it)
        self._close_deadline = self._now + timeout_s
        self._close_reason = (reply_code, text)
        # The channels are gone for the broker the moment the connection closes.
        self._channels.clear()

    def _fatal_frame_error(self, reply_code: int, reply_text: str) -> None:
        """rabbit_reader:fatal_frame_error: report, then read no more frames."""
        if self.state in (State.OPEN, State.AWAIT_OPEN):
            self._send_close(reply_code, reply_text, 0, 0, FATAL_CLOSE_GRACE_S)
            self._lost_sync = True
        elif self.state is State.CLOSING:
            # Waiting for close-ok, but the stream is broken: no close-ok can be read any more.
            self._close_deadline = min(self._close_deadline or self._now, self._now + FATAL_CLOSE_GRACE_S)
            self._lost_sync = True
        else:
            self._terminate(reply_code, reply_text, by_peer=False)

    def _writable(self, channel: int) -> bool:
        if channel == 0:
            return True
        ch = self._channels.get(channel)
        return ch is not None and not ch.closing

    def _terminate(self, reply_code: int, reply_text: str, by_peer: bool) -> None:
        self.state = State.CLOSED
        self._deciding = None
        self._held_frames = []
        self._channels.clear()
        self._events.append(ConnectionClosed(reply_code, reply_text, by_peer))

    def _handle_frame(self, frame_type: int, channel: int, payload: bytes | memoryview) -> None:
        if frame_type == spec.FRAME_HEARTBEAT:
            # rabbit_command_assembler:analyze_frame accepts only an empty heartbeat (else
            # frame_error); rabbit_reader:handle_frame calls one on a channel unexpected_frame.
            if len(payload):
                raise FrameError(spec.FRAME_ERROR, f"heartbeat frame with a payload of {len(payload)} octets")
            if channel != 0 and self.state is not State.CLOSING:
                raise AMQPError(spec.UNEXPECTED_FRAME, f"heartbeat frame on channel {channel}")
            return
        if self.state is State.CLOSING:
            # Spec 2.2.4 / rabbit_reader: after sending close, discard everything but close
            # and close-ok on channel 0.
            if frame_type == spec.FRAME_METHOD and channel == 0:
                method = spec.decode_method(payload)
                if isinstance(method, spec.ConnectionCloseOk):
                    self._terminate(*self._close_reason, by_peer=False)
                elif isinstance(method, spec.ConnectionClose):
                    self._send_method(0, spec.ConnectionCloseOk())
                    self._terminate(*self._close_reason, by_peer=False)
            return
        if frame_type == spec.FRAME_METHOD and len(payload) < METHOD_MIN_BYTES:
            # analyze_frame: a method frame shorter than its class and method ids is a frame error.
            raise AMQPError(spec.FRAME_ERROR, f"method frame of {len(payload)} octets on channel {channel}")
        if frame_type == spec.FRAME_HEADER and len(payload) < CONTENT_HEADER_MIN_BYTES:
            raise AMQPError(spec.FRAME_ERROR, f"content header frame of {len(payload)} octets on channel {channel}")
        if self.state is not State.OPEN:
            self._handle_handshake(frame_type, channel, payload)
            return
        if channel == 0:
            if frame_type != spec.FRAME_METHOD:
                raise AMQPError(spec.UNEXPECTED_FRAME, f"unexpected frame type {frame_type} on channel 0")
            self._handle_connection_method(spec.decode_method(payload))
            return
        ch = self._channels.get(channel)
        if frame_type == spec.FRAME_METHOD:
            method = spec.decode_method(payload)
            if ch is None:
                if isinstance(method, spec.ChannelOpen):
                    self._open_channel(channel)
                elif not isinstance(method, spec.ChannelCloseOk):
                    # rabbit_channel:handle_method in state 'starting'
                    raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'")
                return
            if ch.peer_closed:
                # Spec 2.2.4: after its close the peer sends nothing on the channel until our
                # close-ok; what it sends is dropped, but an open of the same number is an error
                # there (as RabbitMQ's: its channel process is still there).
                if isinstance(method, spec.ChannelOpen):
                    raise _ConnectionError(spec.CHANNEL_ERROR, "second 'channel.open' seen", *CHANNEL_OPEN)
                return
            if ch.closing:
                if isinstance(method, spec.ChannelCloseOk):
                    del self._channels[channel]
                    self._events.append(ChannelClosed(channel, spec.REPLY_SUCCESS, "closed by broker"))
                elif isinstance(method, spec.ChannelClose):
                    # Both sides closed at once: answer and consider it closed.
                    self._send_method(channel, spec.ChannelCloseOk())
                    del self._channels[channel]
                    self._events.append(ChannelClosed(channel, method.reply_code, method.reply_text))
                return
            if ch.content_method is not None:
                # rabbit_command_assembler:process with a method frame mid-content
                if ch.content_size < 0:
                    raise AMQPError(
                        spec.UNEXPECTED_FRAME,
                        f"expected content header for class {ch.content_method.CLASS_ID}, "
                        "got non content header frame instead",
                    )
                raise AMQPError(spec.UNEXPECTED_FRAME, "expected content body, got non content body frame instead")
            self._handle_channel_method(ch, method)
            return
        if ch is None:
            # RabbitMQ creates the channel on any frame; its assembler then wants a method.
            raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
        if ch.closing or ch.peer_closed:
            return
        if frame_type == spec.FRAME_HEADER:
            if ch.content_method is None:
                raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
            if ch.content_size >= 0:
                raise AMQPError(spec.UNEXPECTED_FRAME, "expected content body, got non content body frame instead")
            class_id, body_size, props_raw = decode_content_header(payload)
            if class_id != ch.content_method.CLASS_ID:
                raise AMQPError(
                    spec.UNEXPECTED_FRAME,
                    f"expected content header for class {ch.content_method.CLASS_ID}, "
                    f"got one for class {class_id} instead",
                )
            if body_size > self.max_message_size_bytes:
                # rabbit_channel: max_message_size is a channel error on basic.publish.
                self.close_channel(
                    channel,
                    spec.PRECONDITION_FAILED,
                    f"message size {body_size} is larger than configured max size {self.max_message_size_bytes}",
                    60,
                    40,
                )
                return
            ch.content_props = props_raw
            ch.content_size = body_size
            if body_size == 0:
                self._finish_content(ch, ch.content_method)
        elif frame_type == spec.FRAME_BODY:
            if ch.content_method is None:
                raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
            if ch.content_size < 0:
                raise AMQPError(
                    spec.UNEXPECTED_FRAME,
                    f"expected content header for class {ch.content_method.CLASS_ID}, "
                    "got non content header frame instead",
                )
            if ch.content_got + len(payload) > ch.content_size:
                raise AMQPError(spec.FRAME_ERROR, "content body frame exceeds remaining content size")
            ch.content_parts.append(payload)
            ch.content_got += len(payload)
            if ch.content_got == ch.content_size:
                self._finish_content(ch, ch.content_method)
        else:
            raise FrameError(spec.FRAME_ERROR, f"unknown frame type {frame_type}")

    def _take_frame(self, frame_type: int, channel: int, payload: bytes | memoryview) -> None:
        try:
            self._handle_frame(frame_type, channel, payload)
        except _ConnectionError as err:
            self.close(err.reply_code, err.reply_text, err.class_id, err.method_id)
        except AMQPError as err:
            self.close(err.reply_code, err.reply_text)

    def _publish_whole(self, channel: int, key: bytes, header: bytes, bodies: list[bytes]) -> bool:
        """Basic.publishes the reader found whole with their content (frames.py: a
        PUBLISH_TRIPLE, or a PUBLISH_RUN of publishes alike but for their bodies, which have
        one size, so that what holds for the first holds for each), on an open channel with no
        content pending: their events at once (False: anything unusual, and `_handle_frame`
        takes their frames one by one, errors included).

        Publishing is most of what a broker reads; this skips the general per-frame checks
        that cannot fail for such publishes. The publish method is decoded once per distinct
        exchange, routing key and flags on this connection (publishers repeat them)."""
        if self.state is not State.OPEN:
            return False
        ch = self._channels.get(channel)
        if ch is None or ch.closing or ch.peer_closed or ch.content_method is not None:
            return False
        if len(bodies[0]) > self.max_message_size_bytes:
            return False
        method = self._publish_methods.get(key) or self._publish_method(key)
        if method is None:
            return False
        props_raw = header[12:]
        events = self._events
        if not self.publish_runs:
            events.extend([ContentReceived(channel, method, props_raw, body) for body in bodies])
            return True
        if events:
            last = events[-1]
            if (
                last.__class__ is PublishesReceived
                and last.method is method  # (one object per distinct method: the cache)
                and last.channel == channel
                and last.props_raw == props_raw
            ):
                last.bodies.extend(bodies)
                return True
        events.append(PublishesReceived(channel, method, props_raw, bodies))
        return True

    def _publish_method(self, key: bytes) -> spec.BasicPublish | None:
        """basic.publish's method payload decoded, once per distinct payload on this connection
        (publishers repeat it); None when it does not decode."""
        method = self._publish_methods.get(key)
        if method is None:
            try:
                method = cast(spec.BasicPublish, spec.decode_method(key))
            except DecodeError:
                return None
            if len(self._publish_methods) >= PUBLISH_METHODS_CACHED_MAX:
                self._publish_methods.clear()
            self._publish_methods[key] = method
        return method

    def _finish_content(self, ch: _Channel, method: spec.BasicPublish) -> None:
        """`method` is `ch.content_method`, which the caller found set."""
        parts = ch.content_parts
        body = b"" if not parts else bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
        self._events.append(ContentReceived(ch.number, method, ch.content_props, body))
        ch.content_method = None
        ch.content_size = -1
        ch.content_parts = []
        ch.content_got = 0

    def _open_channel(self, channel: int) -> None:
        # rabbit_reader:create_channel: channel_max bounds how many channels are open at once
        # (closing ones included, until their close-ok), not their numbers; 0 is no limit.
        if self.channel_max and len(self._channels) >= self.channel_max:
            raise AMQPError(
                spec.NOT_ALLOWED,
                f"number of channels opened ({len(self._channels)}) has reached the "
                f"negotiated channel_max ({self.channel_max})",
            )
        refused = self._channel_allowed() if self._channel_allowed is not None else None
        if refused:
            raise AMQPError(spec.NOT_ALLOWED, refused)  # e.g. a user's max-channels
        self._channels[channel] = _Channel(channel)
        self._send_method(channel, spec.ChannelOpenOk())
        self._events.append(ChannelOpened(channel))

    def _handle_channel_method(self, ch: _Channel, method: spec.Method) -> None:
        if method.HAS_CONTENT:
            if not isinstance(method, spec.BasicPublish):
                raise AMQPError(spec.COMMAND_INVALID, f"method {method.NAME} is not allowed from a client")
            ch.content_method = method
            ch.content_size = -1
            return
        # One type() for the chain (a basic.ack runs all of it); the rare branches tell the type
        # checker what `cls is` proved with a cast, which costs nothing on the common path.
        cls = type(method)
        if cls is spec.ChannelClose:
            close = cast(spec.ChannelClose, method)
            ch.peer_closed = True  # the close-ok waits for finish_peer_close
            self._events.append(ChannelClosed(ch.number, close.reply_code, close.reply_text))
        elif cls is spec.ChannelOpen:
            raise _ConnectionError(spec.CHANNEL_ERROR, "second 'channel.open' seen", *CHANNEL_OPEN)
        elif cls is spec.ChannelFlow:
            # rabbit_channel: a client may not pause the server's deliveries this way (basic.qos
            # does it); active=false is a connection error, active=true a no-op.
            if not cast(spec.ChannelFlow, method).active:
                raise _ConnectionError(spec.NOT_IMPLEMENTED, "active=false", method.CLASS_ID, method.METHOD_ID)
            self._send_method(ch.number, spec.ChannelFlowOk(active=True))
        elif cls is spec.ChannelCloseOk or cls is spec.ChannelFlowOk:
            pass  # replies to nothing we sent; harmless
        elif method.CLASS_ID == 10:
            # rabbit_channel:handle_method's catch-all
            raise _ConnectionError(spec.COMMAND_INVALID, "unimplemented method", method.CLASS_ID, method.METHOD_ID)
        else:
            self._events.append(MethodReceived(ch.number, method))

    def _handle_connection_method(self, method: spec.Method) -> None:
        if type(method) is spec.ConnectionClose:
            self._send_method(0, spec.ConnectionCloseOk())
            self._terminate(method.reply_code, method.reply_text, by_peer=True)
        elif type(method) is spec.ConnectionUpdateSecret:
            # rabbit_reader:handle_method0: the user's backend takes the new secret; ours (the
            # internal one) checked the credentials at login and keeps no token that expires.
            self._send_method(0, spec.ConnectionUpdateSecretOk())
        else:
            # rabbit_reader:handle_method0's catch-all (a stray close-ok included)
            raise _ConnectionError(
                spec.CHANNEL_ERROR, "unexpected method in connection state running", method.CLASS_ID, method.METHOD_ID
            )

    def _handle_handshake(self, frame_type: int, channel: int, payload: bytes | memoryview) -> None:
        if frame_type != spec.FRAME_METHOD or channel != 0:
            raise AMQPError(
                spec.UNEXPECTED_FRAME, f"unexpected frame type {frame_type} on channel {channel} during the handshake"
            )
        method = spec.decode_method(payload)
        if type(method) is spec.ConnectionClose:
            self._send_method(0, spec.ConnectionCloseOk())
            self._terminate(method.reply_code, method.reply_text, by_peer=True)
            return
        if self.state is State.AWAIT_START_OK and type(method) is spec.ConnectionStartOk:
            self._start_ok(method)
        elif self.state is State.AWAIT_TUNE_OK and type(method) is spec.ConnectionTuneOk:
            self._tune_ok(method)
        elif self.state is State.AWAIT_OPEN and type(method) is spec.ConnectionOpen:
            self._open(method)
        else:
            raise _ConnectionError(
                spec.CHANNEL_ERROR,
                f"unexpected method in connection state {_RABBIT_STATE[self.state]}",
                method.CLASS_ID,
                method.METHOD_ID,
            )

    def _start_ok(self, method: spec.ConnectionStartOk) -> None:
        self.client_properties = with_shared_strings(method.client_properties or {})
        caps = self.client_properties.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism
        parse = MECHANISMS.get(mechanism)
        if parse is None and mechanism != EXTERNAL:
            raise AMQPError(spec.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'")
        if mechanism not in self.mechanisms:  # (rabbit_reader:auth_mechanism_to_module's two texts)
            raise AMQPError(spec.COMMAND_INVALID, f"invalid authentication mechanism '{mechanism}'")
        response = method.response
        if isinstance(response, str):  # only a locally made start-ok; a decoded one has bytes
            response = response.encode()
        password: str | None
        if parse is None:  # EXTERNAL
            username, password = self._external_user, ""
        else:
            try:
                username, password = parse(response)
            except (ValueError, UnicodeDecodeError, DecodeError):
                username, password = "", None
        self._mechanism = mechanism
        allowed = False if password is None else self._authenticate(mechanism, username, password)
        if allowed is LATER:
            self._deciding = ("login", username)
            return
        self._login_decided(username, allowed is True)

    def decide_login(self, allowed: bool) -> None:
        """The shell's decision on a login its Authenticator left for later (LATER); then the
        frames read after the start-ok are taken (`next_events`). Nothing if the connection
        closed meanwhile."""
        if self._deciding is None or self._deciding[0] != "login":
            return
        username = self._deciding[1]
        self._deciding = None
        if self.state is State.AWAIT_START_OK:
            self._login_decided(username, allowed)

    def _login_decided(self, username: str, allowed: bool) -> None:
        if not allowed:
            self._refuse_login(self._mechanism)
            return
        self.user = username
        self.state = State.AWAIT_TUNE_OK
        self._send_method(
            0, spec.ConnectionTune(channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat_s)
        )

    def _refuse_login(self, mechanism: str) -> None:
        # rabbit_reader:auth_fail: with the authentication_failure_close capability the client
        # gets connection.close 403 with a text that reveals nothing; then, as after any close
        # we send, we wait (bounded) for its close-ok. Without it the socket just closes.
        text = f"Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
        if self.client_capabilities.get("authentication_failure_close") is True:
            self._send_close(spec.ACCESS_REFUSED, text, 0, 0, CLOSE_TIMEOUT_S)
        else:
            self._terminate(spec.ACCESS_REFUSED, text, by_peer=False)

    def _tune_ok(self, method: spec.ConnectionTuneOk) -> None:
        # rabbit_reader:validate_negotiated_integer_value: a value below the minimum, or (when
        # we have a maximum) zero or above what we offered, is a 530 naming connection.tune.
        for field, minimum, ours, theirs in (
            ("frame_max", spec.FRAME_MIN_SIZE, self.frame_max, method.frame_max),
            ("channel_max", 1, self.channel_max, method.channel_max),
        ):
            if theirs != 0 and theirs < minimum:
                raise _ConnectionError(
                    spec.NOT_ALLOWED,
                    f"negotiated {field} = {theirs} is lower than the minimum allowed value ({minimum})",
                    *CONNECTION_TUNE,
                )
            if ours != 0 and (theirs == 0 or theirs > ours):
                raise _ConnectionError(
                    spec.NOT_ALLOWED,
                    f"negotiated {field} = {theirs} is higher than the maximum allowed value ({ours})",
                    *CONNECTION_TUNE,
                )
        self.frame_max = method.frame_max
        self.channel_max = method.channel_max
        self.heartbeat_s = method.heartbeat
        # rabbit_reader's FRAME_SIZE_FUDGE: "We allow clients to exceed the frame size a little
        # bit since quite a few get it wrong - off-by 1 or 8": a payload up to frame_max passes.
        self._reader.frame_max = self.frame_max + FRAME_SIZE_FUDGE_BYTES if self.frame_max else 0
        self.state = State.AWAIT_OPEN

    def _open(self, method: spec.ConnectionOpen) -> None:
        vhost = method.virtual_host
        refused = self._vhost_allowed(self.user, vhost)
        if refused is LATER:
            self._deciding = ("open", vhost)
            return
        self._open_decided(vhost, refused)

    def decide_open(self, refused: str | None) -> None:
        """The shell's decision on a connection.open its VhostCheck left for later (LATER): why
        it is refused (530), or None; then the frames read after it are taken (`next_events`).
        Nothing if the connection closed meanwhile."""
        if self._deciding is None or self._deciding[0] != "open":
            return
        vhost = self._deciding[1]
        self._deciding = None
        if self.state is State.AWAIT_OPEN:
            try:
                self._open_decided(vhost, refused)
            except AMQPError as err:  # (as a refusal read from the frame itself: `_take_frame`)
                self.close(err.reply_code, err.reply_text)

    def _open_decided(self, vhost: str, refused: str | Later | None) -> None:
        if refused:
            raise AMQPError(spec.NOT_ALLOWED, str(refused))
        self.vhost = vhost
        self.state = State.OPEN
        self._send_method(0, spec.ConnectionOpenOk())
        self._events.append(
            ConnectionOpened(
                self.user, vhost, self.client_properties, self.channel_max, self.frame_max, self.heartbeat_s
            )
        )


def _reply_text(reply_code: int, text: str) -> str:
    """RabbitMQ prefixes reply texts with the reply code's name: 'NOT_FOUND - no queue 'x' ...',
    and cuts one longer than a shortstr to its first 252 bytes and "..."
    (rabbit_binary_generator:amqp_exception_explanation). We cut at a character boundary."""
    name = spec.REPLY_NAMES.get(reply_code)
    if name and not text.startswith(name):
        text = f"{name} - {text}"
    raw = text.encode("utf-8")
    if len(raw) > 255:
        text = raw[:252].decode("utf-8", "ignore") + "..."
    return text
