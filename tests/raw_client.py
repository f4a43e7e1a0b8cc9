"""A blocking AMQP client on a bare socket, for tests that must see frames a client library hides
(their order, a reply to a method the libraries do not send). Every wait is bounded."""

from __future__ import annotations

import socket
import time

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import PROTOCOL_HEADER, FrameReader, encode_method_frame

READ_TIMEOUT_S = 5.0


class RawClient:
    """A blocking AMQP client on a bare socket; every wait is bounded."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.reader = FrameReader(0)
        self.pending: list = []
        self.raw = b""  # bytes before the first frame (a protocol header reply)
        self.eof = False
        self.tune: spec.ConnectionTune | None = None  # what the server offered, once `open` ran

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

    def open(self, channel_max: int | None = None, capabilities: dict | None = None) -> spec.ConnectionTune:
        """The handshake up to connection.open-ok; `channel_max`: what tune-ok answers (default
        the server's offer)."""
        self.send(PROTOCOL_HEADER)
        self.expect(spec.ConnectionStart)
        props = {"product": "raw-test", "capabilities": capabilities or {"authentication_failure_close": True}}
        self.method(
            0,
            spec.ConnectionStartOk(
                client_properties=props, mechanism="PLAIN", response=b"\x00guest\x00guest", locale="en_US"
            ),
        )
        tune = self.expect(spec.ConnectionTune)
        ours = tune.channel_max if channel_max is None else channel_max
        self.method(0, spec.ConnectionTuneOk(channel_max=ours, frame_max=131072, heartbeat=0))
        self.method(0, spec.ConnectionOpen(virtual_host="/"))
        self.expect(spec.ConnectionOpenOk)
        return tune

    def open_channel(self, channel: int) -> None:
        self.method(channel, spec.ChannelOpen())
        frame = self.next_frame()
        assert frame is not None and frame[1] == channel and isinstance(frame[2], spec.ChannelOpenOk), frame

    def call(self, channel: int, method, reply_cls):
        """Send a method and return its reply, which must come next on that channel."""
        self.method(channel, method)
        frame = self.next_frame()
        assert frame is not None and frame[1] == channel and isinstance(frame[2], reply_cls), frame
        return frame[2]

    def frames_until_quiet(self, quiet_s: float = 0.5, limit: int = 1000) -> list[tuple[int, object]]:
        """(channel, method or frame payload) of every frame until none came for `quiet_s` (or
        EOF); bounded by `limit` frames."""
        frames = []
        for _ in range(limit):
            frame = self.next_frame(quiet_s)
            if frame is None:
                break
            frames.append((frame[1], frame[2]))
        return frames
