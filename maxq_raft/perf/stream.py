"""A worker's socket after set-up: large non-blocking reads parsed in place, whole-batch writes.

Theory of operation: one receive buffer of `RECV_BUFFER_BYTES` plus room for two maximum
frames; `read_available()` reads until a read comes back short (the socket had no more), the
socket would block, or `READ_BATCH_BYTES_MAX` was read (so acks get written in between), and
after every read hands the new bytes to a parser (`DeliveryParser` / `ConfirmParser`) that
consumes whole frames by offset. Waiting is poll() on a registered descriptor (select() for
waits under a few milliseconds, which poll() cannot express). The time passed to
the parser is taken once per read, just after it returns: the moment those bytes were seen.
A partial frame at the end stays; it is moved to the front only when the free room at the end
could not hold a maximum frame. `write_all()` writes with `send()` and, while the kernel
buffer is full, waits for the socket to be writable *or readable*, reading meanwhile, so that
a broker that is itself blocked writing confirms or deliveries to us can never deadlock us.
Every wait has a deadline.
"""

from __future__ import annotations

import select
import socket
import time

RECV_BUFFER_BYTES = 1 << 20
READ_BATCH_BYTES_MAX = 4 << 20
WRITE_WAIT_S = 0.2
POLL_PRECISION_S = 0.005


class StreamClosed(ConnectionError):
    pass


class RawStream:
    def __init__(self, sock: socket.socket, frame_max: int) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.fd = sock.fileno()
        frame_room = (frame_max or 131072) + 8
        self.capacity = RECV_BUFFER_BYTES + 2 * frame_room
        self.frame_room = frame_room
        self.buffer = bytearray(self.capacity)
        self.view = memoryview(self.buffer)
        self.start = 0
        self.end = 0
        self.bytes_in = 0
        self.reads = 0  # recv calls that returned data
        self.writes = 0  # send calls
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def wait_readable(self, timeout_s: float) -> bool:
        if timeout_s < POLL_PRECISION_S:  # poll() counts whole milliseconds; rate schedules need less
            readable, _, _ = select.select((self.fd,), (), (), max(timeout_s, 0.0))
            return bool(readable)
        return bool(self.poller.poll(int(timeout_s * 1000)))

    def read_available(self, parser) -> int:
        """Read and parse whatever has arrived, without blocking; returns bytes read."""
        total = 0
        recv_into = self.sock.recv_into
        view = self.view
        while total < READ_BATCH_BYTES_MAX:
            if self.capacity - self.end < self.frame_room:
                self._compact()
            room = self.capacity - self.end
            try:
                n = recv_into(view[self.end :])
            except (BlockingIOError, InterruptedError):
                break
            if n == 0:
                raise StreamClosed("the broker closed the connection")
            now_ns = time.monotonic_ns()
            self.reads += 1
            self.end += n
            total += n
            self.start = parser.parse(self.buffer, self.start, self.end, now_ns)
            if self.start == self.end:
                self.start = self.end = 0
            if n < room:
                break  # a short read: the socket had no more; the next poll tells when it has
        self.bytes_in += total
        return total

    def _compact(self) -> None:
        pending = self.end - self.start
        if self.start == 0:
            raise StreamClosed(f"a frame larger than the receive buffer ({pending} bytes pending)")
        self.buffer[0:pending] = self.buffer[self.start : self.end]
        self.start = 0
        self.end = pending

    def write_all(self, data, parser, deadline: float) -> None:
        """Send all of `data` (bytes or memoryview), reading into `parser` while blocked."""
        view = memoryview(data)
        sent = 0
        size = len(view)
        send = self.sock.send
        while sent < size:
            try:
                sent += send(view[sent:])
                self.writes += 1
                continue
            except (BlockingIOError, InterruptedError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("could not write to the broker before the deadline")
            readable, _, _ = select.select((self.fd,), (self.fd,), (), WRITE_WAIT_S)
            if readable:
                self.read_available(parser)

    def close(self, parser, close_frame: bytes, wait_s: float = 1.0) -> None:
        """connection.close, then read (and ignore) until the broker closes or wait_s passes."""
        deadline = time.monotonic() + wait_s
        try:
            self.write_all(close_frame, parser, deadline)
            while time.monotonic() < deadline:
                if self.wait_readable(deadline - time.monotonic()):
                    self.read_available(parser)
        except (OSError, StreamClosed, TimeoutError):
            pass
        finally:
            try:
                self.sock.close()
            except OSError:
                pass
