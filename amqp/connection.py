"""The server side of one AMQP 0-9-1 connection, sans-IO.

Theory of operation: the owner feeds received bytes with `receive_data(data, now)`, asks for
`next_events()` and writes whatever `data_to_send(now)` returns. The connection never touches a
socket or a clock; time comes in as an argument. It answers the protocol's own methods itself
(protocol header, start/start-ok, tune/tune-ok, open, close both ways, heartbeats, channel
open/close/flow) and assembles content (method + header + body frames), so the broker sees only
`ConnectionOpened`, `ChannelOpened`, `MethodReceived`, `ContentReceived`, `ChannelFlow`,
`ChannelClosed` and finally `ConnectionClosed`.

Errors follow the spec and RabbitMQ: a hard error (bad frame, unexpected frame, a method on a
closed channel) sends connection.close with the reply code and then ignores everything but
close/close-ok; a soft error closes one channel (`close_channel`) and discards that channel's
frames until the peer's close-ok. The broker raises `ChannelError`/`HardError` and calls
`close_channel`/`close` with them.

Hot path: one `receive_data` may hold hundreds of frames; `next_events` parses them in one pass
and returns a list, so the shell does no `await` per frame.
"""

from __future__ import annotations

import enum
import struct
from typing import Callable

from . import spec
from .errors import AMQPError, DecodeError, FrameError
from .events import (
    ChannelClosed,
    ChannelFlow,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ContentReceived,
    MethodReceived,
)
from .frames import HEARTBEAT_FRAME, PROTOCOL_HEADER, FrameReader, encode_content, encode_frame
from .properties import decode_content_header
from .values import decode_table

Authenticator = Callable[[str, str, str], bool]  # (mechanism, username, password) -> allowed
VhostCheck = Callable[[str, str], bool]  # (username, vhost) -> allowed

FRAME_MAX_BEFORE_TUNE = 131072  # generous: some clients send large client_properties
CLOSE_TIMEOUT_S = 3.0


class State(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close, waiting for close-ok
    CLOSED = "closed"


class _Channel:
    """Per-channel protocol state: open/closing, and a partly assembled content."""

    __slots__ = ("number", "closing", "content_method", "content_props", "content_size", "content_parts", "content_got")

    def __init__(self, number: int) -> None:
        self.number = number
        self.closing = False  # we sent channel.close; frames are dropped until close-ok
        self.content_method = None  # basic.publish awaiting its header/body frames
        self.content_props = b""
        self.content_size = -1  # -1 until the header frame arrived
        self.content_parts: list = []
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
    as_text = lambda v: v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else str(v)  # noqa: E731
    return as_text(login), as_text(password)


MECHANISMS = {"PLAIN": _plain_credentials, "AMQPLAIN": _amqplain_credentials}


class ServerConnection:
    def __init__(
        self,
        *,
        authenticate: Authenticator,
        vhost_allowed: VhostCheck,
        server_properties: dict,
        channel_max: int = 2047,
        frame_max: int = 131072,
        heartbeat_s: int = 60,
        max_message_size_bytes: int = 128 * 1024 * 1024,
        now: float = 0.0,
    ) -> None:
        self.state = State.AWAIT_HEADER
        self._authenticate = authenticate
        self._vhost_allowed = vhost_allowed
        self._server_properties = server_properties
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat_s = heartbeat_s
        self.max_message_size_bytes = max_message_size_bytes
        self.user = ""
        self.vhost = ""
        self.client_properties: dict = {}
        self.client_capabilities: dict = {}
        self._mechanism = ""
        self._reader = FrameReader(FRAME_MAX_BEFORE_TUNE)
        self._header_buf = b""
        self._out: list[bytes] = []
        self._events: list = []
        self._channels: dict[int, _Channel] = {}
        self._last_recv = now
        self._last_send = now
        self._closing_since = 0.0

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes, now: float = 0.0) -> None:
        """Buffer bytes from the peer; an empty `data` means the peer closed the socket."""
        self._last_recv = now
        if not data:
            if self.state is not State.CLOSED:
                self._terminate(spec.CONNECTION_FORCED, "peer closed the socket", by_peer=True)
            return
        if self.state is State.CLOSED:
            return
        if self.state is State.AWAIT_HEADER:
            self._header_buf += data
            if len(self._header_buf) < 8:
                return
            header, rest = self._header_buf[:8], self._header_buf[8:]
            self._header_buf = b""
            if header != PROTOCOL_HEADER:
                # Spec 4.2.2: answer a bad header with the header we support, then close.
                self._out.append(PROTOCOL_HEADER)
                self._terminate(spec.FRAME_ERROR, "bad protocol header", by_peer=False)
                return
            self._send_method(0, spec.ConnectionStart(
                version_major=0, version_minor=9, server_properties=self._server_properties,
                mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US"))
            self.state = State.AWAIT_START_OK
            data = rest
            if not data:
                return
        self._reader.feed(data)

    def next_events(self) -> list:
        """Parse everything buffered and return the events it produced (possibly none)."""
        if self.state is not State.CLOSED:
            try:
                frames = self._reader.read_frames()
            except FrameError as err:
                self.close(err.reply_code, err.reply_text)
                frames = []
            for frame_type, channel, payload in frames:
                if self.state is State.CLOSED:
                    break
                try:
                    self._handle_frame(frame_type, channel, payload)
                except AMQPError as err:
                    self.close(err.reply_code, err.reply_text)
        events, self._events = self._events, []
        return events

    # ----------------------------------------------------------------- output

    def data_to_send(self, now: float = 0.0) -> bytes:
        if not self._out:
            return b""
        self._last_send = now
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out = []
        return data

    def send_method(self, channel: int, method) -> None:
        if self.state is State.OPEN and not self._channel_closing(channel):
            self._send_method(channel, method)

    def send_content(self, channel: int, method, props_raw: bytes, body: bytes) -> None:
        if self.state is State.OPEN and not self._channel_closing(channel):
            self._out.append(encode_content(channel, method, props_raw, body, self.frame_max))

    def send_raw(self, data: bytes) -> None:
        """Pre-encoded frames (the delivery fast path builds them itself)."""
        if self.state is State.OPEN:
            self._out.append(data)

    def close(self, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0, now: float = 0.0) -> None:
        """Start a server-initiated connection close (a hard error, or shutdown)."""
        if self.state in (State.CLOSING, State.CLOSED):
            return
        if self.state in (State.AWAIT_HEADER, State.AWAIT_START_OK, State.AWAIT_TUNE_OK) and reply_code != spec.ACCESS_REFUSED:
            # Before open the peer may not understand connection.close; RabbitMQ just drops it.
            self._terminate(reply_code, reply_text, by_peer=False)
            return
        text = _reply_text(reply_code, reply_text)
        self._send_method(0, spec.ConnectionClose(reply_code=reply_code, reply_text=text, class_id=class_id, method_id=method_id))
        self.state = State.CLOSING
        self._closing_since = now
        self._close_reason = (reply_code, text)

    def close_channel(self, channel: int, reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> None:
        """A soft error: close one channel; its frames are dropped until the peer's close-ok."""
        ch = self._channels.get(channel)
        if ch is None or ch.closing or self.state is not State.OPEN:
            return
        ch.closing = True
        ch.content_method = None
        self._send_method(channel, spec.ChannelClose(
            reply_code=reply_code, reply_text=_reply_text(reply_code, reply_text), class_id=class_id, method_id=method_id))

    def tick(self, now: float) -> bool:
        """Heartbeats and close timeouts. Returns False when the connection must be dropped."""
        if self.state is State.CLOSED:
            return False
        if self.state is State.CLOSING and now - self._closing_since > CLOSE_TIMEOUT_S and self._closing_since:
            self._terminate(*self._close_reason, by_peer=False)
            return False
        if self.heartbeat_s and self.state in (State.OPEN, State.CLOSING):
            if now - self._last_recv > 2 * self.heartbeat_s:
                # RabbitMQ: "missed heartbeats from client, timeout: Ns"; the socket just closes.
                self._terminate(spec.CONNECTION_FORCED, f"missed heartbeats from client, timeout: {self.heartbeat_s}s", by_peer=True)
                return False
            if now - self._last_send >= self.heartbeat_s / 2 and not self._out:
                self._out.append(HEARTBEAT_FRAME)
        return True

    @property
    def open_channels(self) -> list[int]:
        return list(self._channels)

    # -------------------------------------------------------------- internals

    def _send_method(self, channel: int, method) -> None:
        self._out.append(encode_frame(spec.FRAME_METHOD, channel, method.encode()))

    def _channel_closing(self, channel: int) -> bool:
        ch = self._channels.get(channel)
        return ch is not None and ch.closing

    def _terminate(self, reply_code: int, reply_text: str, by_peer: bool) -> None:
        self.state = State.CLOSED
        self._channels.clear()
        self._events.append(ConnectionClosed(reply_code, reply_text, by_peer))

    def _handle_frame(self, frame_type: int, channel: int, payload) -> None:
        if frame_type == spec.FRAME_HEARTBEAT:
            if channel != 0:
                raise FrameError(spec.FRAME_ERROR, "heartbeat frame on non-zero channel")
            return
        if self.state is State.CLOSING:
            # Spec: after sending close, discard everything until close or close-ok.
            if frame_type == spec.FRAME_METHOD and channel == 0:
                method = spec.decode_method(payload)
                if isinstance(method, spec.ConnectionCloseOk):
                    self._terminate(*self._close_reason, by_peer=False)
                elif isinstance(method, spec.ConnectionClose):
                    self._send_method(0, spec.ConnectionCloseOk())
                    self._terminate(*self._close_reason, by_peer=False)
            return
        if self.state is not State.OPEN:
            self._handle_handshake(frame_type, channel, payload)
            return
        if channel == 0:
            if frame_type != spec.FRAME_METHOD:
                raise FrameError(spec.UNEXPECTED_FRAME, f"unexpected frame type {frame_type} on channel 0")
            self._handle_connection_method(spec.decode_method(payload))
            return
        ch = self._channels.get(channel)
        if frame_type == spec.FRAME_METHOD:
            method = spec.decode_method(payload)
            if ch is None:
                if isinstance(method, spec.ChannelOpen):
                    self._open_channel(channel)
                elif not isinstance(method, spec.ChannelCloseOk):
                    raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'")
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
                raise AMQPError(spec.UNEXPECTED_FRAME, f"expected content header for class 60, got non content header frame instead")
            self._handle_channel_method(ch, method)
            return
        if ch is None:
            raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'")
        if ch.closing:
            return
        if frame_type == spec.FRAME_HEADER:
            if ch.content_method is None or ch.content_size >= 0:
                raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
            class_id, body_size, props_raw = decode_content_header(payload)
            if class_id != ch.content_method.CLASS_ID:
                raise AMQPError(spec.UNEXPECTED_FRAME, f"expected content header for class {ch.content_method.CLASS_ID}, got one for class {class_id} instead")
            if body_size > self.max_message_size_bytes:
                ch.content_method = None
                self.close_channel(channel, spec.PRECONDITION_FAILED,
                                   f"message size {body_size} is larger than configured max size {self.max_message_size_bytes}", 60, 40)
                return
            ch.content_props = props_raw
            ch.content_size = body_size
            if body_size == 0:
                self._finish_content(ch)
        elif frame_type == spec.FRAME_BODY:
            if ch.content_method is None or ch.content_size < 0:
                raise AMQPError(spec.UNEXPECTED_FRAME, "expected method frame, got non method frame instead")
            ch.content_parts.append(payload)
            ch.content_got += len(payload)
            if ch.content_got >= ch.content_size:
                if ch.content_got > ch.content_size:
                    raise AMQPError(spec.FRAME_ERROR, f"content body larger than its declared size {ch.content_size}")
                self._finish_content(ch)
        else:
            raise FrameError(spec.FRAME_ERROR, f"unknown frame type {frame_type}")

    def _finish_content(self, ch: _Channel) -> None:
        parts = ch.content_parts
        body = bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
        self._events.append(ContentReceived(ch.number, ch.content_method, ch.content_props, body))
        ch.content_method = None
        ch.content_size = -1
        ch.content_parts = []
        ch.content_got = 0

    def _open_channel(self, channel: int) -> None:
        if channel > self.channel_max > 0:
            raise AMQPError(spec.CHANNEL_ERROR, f"channel number {channel} exceeds channel_max {self.channel_max}")
        self._channels[channel] = _Channel(channel)
        self._send_method(channel, spec.ChannelOpenOk())
        self._events.append(ChannelOpened(channel))

    def _handle_channel_method(self, ch: _Channel, method) -> None:
        if method.HAS_CONTENT:
            if not isinstance(method, spec.BasicPublish):
                raise AMQPError(spec.COMMAND_INVALID, f"method {method.NAME} is not allowed from a client")
            ch.content_method = method
            ch.content_size = -1
            return
        cls = type(method)
        if cls is spec.ChannelClose:
            del self._channels[ch.number]
            self._send_method(ch.number, spec.ChannelCloseOk())
            self._events.append(ChannelClosed(ch.number, method.reply_code, method.reply_text))
        elif cls is spec.ChannelOpen:
            raise AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen")
        elif cls is spec.ChannelFlow:
            self._send_method(ch.number, spec.ChannelFlowOk(active=method.active))
            self._events.append(ChannelFlow(ch.number, method.active))
        elif cls is spec.ChannelCloseOk or cls is spec.ChannelFlowOk:
            pass  # replies to nothing we sent; harmless
        elif method.CLASS_ID == 10:
            raise AMQPError(spec.COMMAND_INVALID, f"connection method {method.NAME} on channel {ch.number}")
        else:
            self._events.append(MethodReceived(ch.number, method))

    def _handle_connection_method(self, method) -> None:
        cls = type(method)
        if cls is spec.ConnectionClose:
            self._send_method(0, spec.ConnectionCloseOk())
            self._terminate(method.reply_code, method.reply_text, by_peer=True)
        elif cls is spec.ConnectionCloseOk:
            self._terminate(spec.REPLY_SUCCESS, "", by_peer=True)
        elif cls.__name__ in ("ConnectionBlocked", "ConnectionUnblocked", "ConnectionUpdateSecret"):
            pass  # advisory from clients; nothing to do
        else:
            raise AMQPError(spec.COMMAND_INVALID, f"unexpected method {method.NAME} on channel 0")

    def _handle_handshake(self, frame_type: int, channel: int, payload) -> None:
        if frame_type != spec.FRAME_METHOD or channel != 0:
            raise AMQPError(spec.UNEXPECTED_FRAME, "expected a connection method on channel 0 during the handshake")
        method = spec.decode_method(payload)
        cls = type(method)
        if cls is spec.ConnectionClose:
            self._send_method(0, spec.ConnectionCloseOk())
            self._terminate(method.reply_code, method.reply_text, by_peer=True)
            return
        if self.state is State.AWAIT_START_OK and cls is spec.ConnectionStartOk:
            self._start_ok(method)
        elif self.state is State.AWAIT_TUNE_OK and cls is spec.ConnectionTuneOk:
            self._tune_ok(method)
        elif self.state is State.AWAIT_OPEN and cls is spec.ConnectionOpen:
            self._open(method)
        else:
            raise AMQPError(spec.COMMAND_INVALID, f"unexpected method {method.NAME} in state {self.state.value}")

    def _start_ok(self, method) -> None:
        self.client_properties = method.client_properties or {}
        caps = self.client_properties.get("capabilities")
        self.client_capabilities = caps if isinstance(caps, dict) else {}
        mechanism = method.mechanism
        parse = MECHANISMS.get(mechanism)
        if parse is None:
            raise AMQPError(spec.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'")
        try:
            username, password = parse(method.response)
        except (ValueError, UnicodeDecodeError, DecodeError):
            username, password = "", None
        self._mechanism = mechanism
        if password is None or not self._authenticate(mechanism, username, password):
            self._refuse_login(mechanism)
            return
        self.user = username
        self.state = State.AWAIT_TUNE_OK
        self._send_method(0, spec.ConnectionTune(channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat_s))

    def _refuse_login(self, mechanism: str) -> None:
        text = f"Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
        if self.client_capabilities.get("authentication_failure_close"):
            # The client understands a close during the handshake (RabbitMQ capability).
            self._send_method(0, spec.ConnectionClose(reply_code=spec.ACCESS_REFUSED, reply_text="ACCESS_REFUSED - " + text, class_id=0, method_id=0))
        self._terminate(spec.ACCESS_REFUSED, text, by_peer=False)

    def _tune_ok(self, method) -> None:
        # RabbitMQ refuses values above what it offered, and frame_max below the spec minimum.
        if method.frame_max and method.frame_max < spec.FRAME_MIN_SIZE:
            raise AMQPError(spec.NOT_ALLOWED, f"frame_max={method.frame_max} < {spec.FRAME_MIN_SIZE} min size")
        if self.frame_max and method.frame_max > self.frame_max:
            raise AMQPError(spec.NOT_ALLOWED, f"frame_max={method.frame_max} > {self.frame_max} max size")
        if self.channel_max and method.channel_max > self.channel_max:
            raise AMQPError(spec.NOT_ALLOWED, f"channel_max={method.channel_max} > {self.channel_max} max size")
        self.frame_max = method.frame_max or self.frame_max
        self.channel_max = method.channel_max or self.channel_max
        self.heartbeat_s = method.heartbeat
        self._reader.frame_max = self.frame_max
        self.state = State.AWAIT_OPEN

    def _open(self, method) -> None:
        vhost = method.virtual_host
        if not self._vhost_allowed(self.user, vhost):
            raise AMQPError(spec.NOT_ALLOWED, f"vhost {vhost} not found")
        self.vhost = vhost
        self.state = State.OPEN
        self._send_method(0, spec.ConnectionOpenOk())
        self._events.append(ConnectionOpened(self.user, vhost, self.client_properties, self.channel_max, self.frame_max, self.heartbeat_s))


def _reply_text(reply_code: int, text: str) -> str:
    """RabbitMQ prefixes reply texts with the reply code's name: 'NOT_FOUND - no queue 'x' ...'."""
    name = spec.REPLY_NAMES.get(reply_code)
    if name and not text.startswith(name):
        text = f"{name} - {text}"
    return text.encode("utf-8")[:255].decode("utf-8", "ignore")
