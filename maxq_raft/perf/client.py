"""A minimal blocking AMQP 0-9-1 client for set-up: handshake, synchronous RPCs, close.

Theory of operation: maxq-perf does everything that is not the data path through this client:
connection handshake (PLAIN login, tune, open), channel.open, queue/exchange declares and
deletes, basic.qos, confirm.select, basic.consume. It is a plain socket with a deadline on
every read, our codec's `FrameReader` and `decode_method`, and nothing else. After set-up a
worker calls `detach()` and drives the same socket itself with pre-encoded frames; the client
asserts that nothing arrived that the data path would then miss.

Heartbeats are declined (tune-ok heartbeat 0), as every broker allows, so that a connection
held idle (many-connections mode) or a worker busy writing never gets closed for silence.
A connection.close or channel.close from the broker raises `BrokerClosed` with its code and
text after the close-ok is sent, the way the spec (1.5.2.5, 1.4.2.5) asks.
"""

from __future__ import annotations

import socket
import time
from collections import deque

from ..amqp import spec
from ..amqp.frames import PROTOCOL_HEADER, FrameReader, encode_method_frame
from ..amqp.spec import FRAME_METHOD, decode_method
from ..amqp.values import FieldTable

FRAME_MAX_WANTED = 131072
READ_BYTES = 65536
RPC_TIMEOUT_S = 30.0
CLIENT_PROPERTIES: FieldTable = {
    "product": "maxq-perf",
    "platform": "Python",
    "capabilities": {
        "publisher_confirms": True,
        "basic.nack": True,
        "consumer_cancel_notify": True,
        "connection.blocked": True,
        "exchange_exchange_bindings": True,
        "authentication_failure_close": True,  # a bad login gets a 403 close, not a bare disconnect
    },
}


class BrokerClosed(Exception):
    """The broker closed the connection or a channel: its reply code and text."""

    def __init__(self, scope: str, reply_code: int, reply_text: str) -> None:
        super().__init__(f"broker closed the {scope}: {reply_code} {reply_text}")
        self.scope = scope
        self.reply_code = reply_code
        self.reply_text = reply_text


class AmqpClient:
    """One connection with one open channel (`self.channel`)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        user: str,
        password: str,
        vhost: str,
        timeout_s: float = RPC_TIMEOUT_S,
        frame_max: int = FRAME_MAX_WANTED,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.vhost = vhost
        self.timeout_s = timeout_s
        self.frame_max_wanted = frame_max
        self.frame_max = frame_max
        self.sock: socket.socket | None = None
        self.reader = FrameReader(0)
        self.frames: deque = deque()
        self.channel = 0
        self._next_channel = 1
        self.server_properties: dict = {}

    # -- connection ----------------------------------------------------------------------

    def connect(self) -> AmqpClient:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        try:
            self._handshake()
            self.open_channel()
        except BaseException:
            self.abort()
            raise
        return self

    def _handshake(self) -> None:
        assert self.sock is not None
        self.sock.sendall(PROTOCOL_HEADER)
        start = self.wait_method(0, (spec.ConnectionStart,))
        self.server_properties = start.server_properties
        mechanisms = start.mechanisms if isinstance(start.mechanisms, bytes) else start.mechanisms.encode()
        mechanisms = mechanisms.split()
        if b"PLAIN" not in mechanisms:
            raise BrokerClosed("connection", 0, f"broker offers no PLAIN login ({start.mechanisms!r})")
        response = b"\x00" + self.user.encode() + b"\x00" + self.password.encode()
        self.send_method(
            0,
            spec.ConnectionStartOk(
                client_properties=CLIENT_PROPERTIES, mechanism="PLAIN", response=response, locale="en_US"
            ),
        )
        tune = self.wait_method(0, (spec.ConnectionTune,))
        frame_max = self.frame_max_wanted
        if tune.frame_max and tune.frame_max < frame_max:
            frame_max = tune.frame_max
        self.frame_max = frame_max
        self.reader.frame_max = frame_max
        channel_max = tune.channel_max or 2047
        self.send_method(0, spec.ConnectionTuneOk(channel_max=channel_max, frame_max=frame_max, heartbeat=0))
        self.send_method(0, spec.ConnectionOpen(virtual_host=self.vhost))
        self.wait_method(0, (spec.ConnectionOpenOk,))

    def open_channel(self) -> int:
        channel = self._next_channel
        self._next_channel += 1
        self.send_method(channel, spec.ChannelOpen())
        self.wait_method(channel, (spec.ChannelOpenOk,))
        self.channel = channel
        return channel

    def close(self) -> None:
        """connection.close and wait (bounded) for close-ok; never raises."""
        if self.sock is None:
            return
        try:
            self.send_method(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
            self.wait_method(0, (spec.ConnectionCloseOk,), timeout_s=min(self.timeout_s, 5.0))
        except (OSError, BrokerClosed):
            pass
        self.abort()

    def abort(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def detach(self) -> socket.socket:
        """Hand the socket to a data path; nothing may be buffered that it would not see."""
        assert self.sock is not None
        assert not self.frames and self.reader._buffered == 0, "frames buffered before raw mode"
        sock, self.sock = self.sock, None
        return sock

    # -- methods -------------------------------------------------------------------------

    def send_method(self, channel: int, method) -> None:
        assert self.sock is not None
        self.sock.sendall(encode_method_frame(channel, method))

    def rpc(self, method, expect: tuple, channel: int | None = None):
        channel = self.channel if channel is None else channel
        self.send_method(channel, method)
        return self.wait_method(channel, expect)

    def wait_method(self, channel: int, expect: tuple, timeout_s: float | None = None):
        """Read until a method of one of the `expect` types arrives on `channel`."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        while True:
            while self.frames:
                frame_type, frame_channel, payload = self.frames.popleft()
                if frame_type != FRAME_METHOD:
                    continue  # content of an unexpected delivery or a heartbeat: not for set-up
                method = decode_method(payload)
                if isinstance(method, spec.ConnectionClose):
                    self._try_send(0, spec.ConnectionCloseOk())
                    self.abort()
                    raise BrokerClosed("connection", method.reply_code, method.reply_text)
                if isinstance(method, spec.ChannelClose):
                    self._try_send(frame_channel, spec.ChannelCloseOk())
                    if frame_channel == self.channel:
                        self.channel = 0
                    raise BrokerClosed("channel", method.reply_code, method.reply_text)
                if frame_channel == channel and isinstance(method, expect):
                    return method
                # anything else (connection.blocked, a stray ack) is not what set-up waits for
            self._read_some(deadline)

    def _try_send(self, channel: int, method) -> None:
        try:
            self.send_method(channel, method)
        except OSError:
            pass

    def _read_some(self, deadline: float) -> None:
        assert self.sock is not None
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            raise TimeoutError(f"no answer from {self.host}:{self.port} within {self.timeout_s} s")
        self.sock.settimeout(left_s)
        try:
            data = self.sock.recv(READ_BYTES)
        except TimeoutError:
            raise TimeoutError(f"no answer from {self.host}:{self.port} within {self.timeout_s} s") from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(self.timeout_s)
        if not data:
            self.abort()
            raise ConnectionError(f"{self.host}:{self.port} closed the connection")
        self.reader.feed(data)
        self.frames.extend(self.reader.read_frames())

    # -- conveniences for set-up ---------------------------------------------------------

    def ensure_channel(self) -> None:
        if not self.channel:
            self.open_channel()

    def queue_declare(self, queue: str, *, durable: bool, arguments: dict | None = None):
        self.ensure_channel()
        return self.rpc(
            spec.QueueDeclare(queue=queue, durable=durable, arguments=arguments or {}), (spec.QueueDeclareOk,)
        )

    def queue_delete(self, queue: str, *, missing_ok: bool = True) -> int | None:
        """Delete a queue; a 404 (older brokers) reopens the channel when missing_ok."""
        self.ensure_channel()
        try:
            return self.rpc(spec.QueueDelete(queue=queue), (spec.QueueDeleteOk,)).message_count
        except BrokerClosed as exc:
            if exc.scope == "channel" and exc.reply_code == spec.NOT_FOUND and missing_ok:
                self.open_channel()
                return None
            raise

    def exchange_declare(self, exchange: str, kind: str, *, durable: bool) -> None:
        self.ensure_channel()
        self.rpc(spec.ExchangeDeclare(exchange=exchange, type=kind, durable=durable), (spec.ExchangeDeclareOk,))

    def queue_bind(self, queue: str, exchange: str, routing_key: str = "") -> None:
        self.ensure_channel()
        self.rpc(spec.QueueBind(queue=queue, exchange=exchange, routing_key=routing_key), (spec.QueueBindOk,))

    def basic_qos(self, prefetch_count: int) -> None:
        self.rpc(spec.BasicQos(prefetch_size=0, prefetch_count=prefetch_count, global_=False), (spec.BasicQosOk,))

    def confirm_select(self) -> None:
        self.rpc(spec.ConfirmSelect(nowait=False), (spec.ConfirmSelectOk,))

    def basic_consume(self, queue: str, *, no_ack: bool, consumer_tag: str = "") -> str:
        ok = self.rpc(spec.BasicConsume(queue=queue, consumer_tag=consumer_tag, no_ack=no_ack), (spec.BasicConsumeOk,))
        return ok.consumer_tag
