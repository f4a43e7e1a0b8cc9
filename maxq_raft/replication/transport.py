"""The replication port: one TCP listener per node carrying every group, peers authenticated.

Theory of operation
-------------------
`Hub` owns the sockets of one node and is driven by the engine's single hub thread: `poll`
waits on all of them at once (selectors) and hands every complete frame to `on_frame`;
`send` appends a frame to a peer's write buffer and `flush` writes them out; `maintain`
(called every tick) connects, re-connects, pings and drops dead peers. Nothing here knows
about Raft: frames are (kind, bytes) and the engine routes them (wire.py has the format).

Connections carry frames one way, as in the multiplexing probe (docs/design.md §3): a node
sends on the connection it made to a peer and receives on the connection the peer made to it,
so there is one ordered stream per direction and no tie-break between simultaneous connects. A
peer is "up" once our outgoing connection to it has completed the handshake (wire.py: mutual
HMAC-SHA256 over fresh nonces with the cluster secret). An incoming connection is parsed only
as far as the fixed handshake fields until the peer's HMAC checks out; a wrong one is logged
and closed, and nothing of it reaches msgpack, let alone pickle. After the handshake every frame
carries a MAC under a key of that connection with an implicit sequence number (frame_mac.py):
a frame altered, replayed, reordered or injected on the link is logged and closes the
connection before its body is read.

The listener binds the configured address only (never 0.0.0.0 unless configured so).
Liveness: every outgoing connection sends a PING when idle for `ping_interval_s`; a peer from
which nothing arrived for `peer_timeout_s` is declared down (both directions closed; a paused
process or a black-holed route looks like this) and re-connected with back-off. Write buffers
are bounded (`wbuf_bytes_max`): `send` returns False beyond it and the message is lost, which
Raft repairs (the follower asks for a re-send). Reads are bounded by FRAME_BYTES_MAX per frame.
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import time
from collections.abc import Callable

from . import wire
from .frame_mac import MAC_BYTES, FrameMac, frame_key

__all__ = ["Hub"]

log = logging.getLogger(__name__)

RECV_BYTES = 256 * 1024
WBUF_BYTES_MAX_DEFAULT = 32 * 1024 * 1024
PENDING_INCOMING_MAX = 64  # connections that have not authenticated yet, in all
PENDING_PER_SOURCE_MAX = 8  # ... and from one source address


class _Out:
    __slots__ = (
        "peer",
        "sock",
        "state",
        "rbuf",
        "wbuf",
        "nonce_a",
        "nonce_c",
        "deadline",
        "last_tx",
        "up_since",
        "events",
        "mac",
    )

    def __init__(self, peer: str, sock: socket.socket, deadline: float) -> None:
        self.peer, self.sock, self.state = peer, sock, "connecting"
        self.rbuf = bytearray()
        self.wbuf = bytearray()
        self.nonce_a = self.nonce_c = b""
        self.deadline = deadline
        self.last_tx = 0.0
        self.up_since = 0.0
        self.events = 0
        self.mac: FrameMac | None = None  # signs our frames once the handshake is done


class _In:
    __slots__ = ("sock", "addr", "state", "rbuf", "nonce_a", "peer", "deadline", "mac")

    def __init__(self, sock: socket.socket, addr, nonce_a: bytes, deadline: float) -> None:
        self.sock, self.addr, self.state = sock, addr, "auth"
        self.rbuf = bytearray()
        self.nonce_a = nonce_a
        self.peer: str | None = None
        self.deadline = deadline
        self.mac: FrameMac | None = None  # checks the peer's frames once the handshake is done


class Hub:
    def __init__(
        self,
        node_id: str,
        bind_addr: tuple[str, int],
        secret: bytes,
        *,
        on_frame: Callable[[str, int, bytes], None],
        on_peer_up: Callable[[str], None],
        on_peer_down: Callable[[str], None],
        connect_timeout_s: float = 2.0,
        peer_timeout_s: float = 3.0,
        ping_interval_s: float = 0.5,
        retry_s_min: float = 0.1,
        retry_s_max: float = 1.0,
        wbuf_bytes_max: int = WBUF_BYTES_MAX_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not secret:
            raise ValueError("cluster_secret must not be empty")
        wire._id_bytes(node_id)  # length check
        self.node_id = node_id
        self.bind_addr = (bind_addr[0], int(bind_addr[1]))
        self.secret = bytes(secret)
        self.on_frame, self.on_peer_up, self.on_peer_down = on_frame, on_peer_up, on_peer_down
        # A peer's stream to us closed (its process stopped, say) while no link of ours to it is
        # up: what it said over that stream is no longer its word (engine.py drops its
        # announcements). A peer we do not link to (a node about to join) has only that stream.
        self.on_inbound_closed: Callable[[str], None] | None = None
        self.connect_timeout_s = connect_timeout_s
        self.peer_timeout_s = peer_timeout_s
        self.ping_interval_s = ping_interval_s
        self.retry_s_min, self.retry_s_max = retry_s_min, retry_s_max
        self.wbuf_bytes_max = wbuf_bytes_max
        self.clock = clock
        self.addrs: dict[str, tuple[str, int]] = {}
        self.wanted: set[str] = set()
        self.out: dict[str, _Out] = {}
        self.inc: dict[socket.socket, _In] = {}
        self.inc_by_peer: dict[str, _In] = {}
        self.last_rx: dict[str, float] = {}
        self.retry_at: dict[str, float] = {}
        self.retry_s: dict[str, float] = {}
        self.stats = {
            "frames_in": 0,
            "frames_out": 0,
            "bytes_in": 0,
            "bytes_out": 0,
            "auth_rejected": 0,
            "protocol_errors": 0,
            "mac_rejected": 0,
            "connects": 0,
            "peer_timeouts": 0,
            "send_refused_full": 0,
            "pending_evicted": 0,
        }
        self.sel = selectors.DefaultSelector()
        self.lsock: socket.socket | None = None
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        self.closed = False

    # ------------------------------------------------------------------------------ setup

    def listen(self) -> None:
        """Bind the configured address (only that one) and listen. OSError if taken."""
        host, port = self.bind_addr
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            s.listen(128)
            s.setblocking(False)
        except BaseException:
            s.close()
            raise
        self.lsock = s
        self.sel.register(s, selectors.EVENT_READ, ("listen", None))

    @property
    def listen_addr(self) -> tuple[str, int]:
        assert self.lsock is not None
        return self.lsock.getsockname()[:2]

    def set_address(self, peer: str, addr: tuple[str, int]) -> None:
        if peer != self.node_id:
            self.addrs[peer] = (addr[0], int(addr[1]))

    def want(self, peer: str) -> None:
        if peer != self.node_id:
            self.wanted.add(peer)

    def unwant(self, peer: str) -> None:
        self.wanted.discard(peer)
        o = self.out.get(peer)
        if o is not None:
            self._close_out(o, "peer no longer a member")

    def wake(self) -> None:
        """Thread-safe: make a blocked poll return."""
        try:
            self.wake_w.send(b"w")
        except (BlockingIOError, OSError):
            pass  # a wake is already pending (or we are closing)

    def is_up(self, peer: str) -> bool:
        o = self.out.get(peer)
        return o is not None and o.state == "up"

    # ------------------------------------------------------------------------------- send

    def send(self, peer: str, kind: int, body: bytes) -> bool:
        o = self.out.get(peer)
        if o is None or o.state != "up":
            return False
        if len(o.wbuf) > self.wbuf_bytes_max:
            self.stats["send_refused_full"] += 1
            return False
        if len(body) + 1 > wire.FRAME_BYTES_MAX:
            raise wire.WireError(f"frame of {len(body)} bytes exceeds {wire.FRAME_BYTES_MAX}")
        self._append_frame(o, kind, body)
        self.stats["frames_out"] += 1
        return True

    def _append_frame(self, o: _Out, kind: int, body: bytes) -> None:
        header = wire.FRAME_HEADER.pack(len(body) + 1, kind)
        o.wbuf += header
        o.wbuf += body
        o.wbuf += o.mac.sign(header, body)

    def flush(self) -> None:
        for o in list(self.out.values()):
            if o.wbuf and o.state == "up":
                self._write(o)

    def _write(self, o: _Out) -> None:
        try:
            n = o.sock.send(o.wbuf)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self._close_out(o, f"send failed: {exc.strerror}")
            return
        if n:
            del o.wbuf[:n]
            o.last_tx = self.clock()
            self.stats["bytes_out"] += n
        self._set_events(o, selectors.EVENT_READ | (selectors.EVENT_WRITE if o.wbuf else 0))

    def _set_events(self, o: _Out, events: int) -> None:
        if o.events != events:
            self.sel.modify(o.sock, events, ("out", o))
            o.events = events

    # ------------------------------------------------------------------------------- poll

    def poll(self, timeout: float) -> None:
        for key, ev in self.sel.select(max(0.0, timeout)):
            what, obj = key.data
            if what == "in":
                self._read_in(obj)
            elif what == "out":
                self._out_event(obj, ev)
            elif what == "listen":
                self._accept()
            elif what == "wake":
                try:
                    self.wake_r.recv(4096)
                except (BlockingIOError, OSError):
                    pass

    def _accept(self) -> None:
        for _ in range(PENDING_INCOMING_MAX):  # bounded per poll
            try:
                sock, addr = self.lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("raft port %s: accept failed: %s", self.bind_addr, exc)
                return
            self._make_room_for(addr[0])
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello, nonce_a = wire.server_hello()
            c = _In(sock, addr, nonce_a, self.clock() + self.connect_timeout_s)
            try:
                sock.send(hello)  # 37 bytes into an empty buffer
            except OSError:
                sock.close()
                continue
            self.inc[sock] = c
            self.sel.register(sock, selectors.EVENT_READ, ("in", c))

    def _make_room_for(self, source: str) -> None:
        """Before a new connection from `source` waits for its handshake: at most
        PENDING_PER_SOURCE_MAX from one address and PENDING_INCOMING_MAX in all wait, and the one
        that goes to make room is the oldest of the address holding the most. Refusing the new
        one instead let anyone who reached the port hold every slot with idle connections
        (renewed as their 2 s deadline ran out) and keep real peers out; a peer's own handshake
        takes one round trip, so it is through long before it could be the oldest."""
        pending: dict[str, list[_In]] = {}
        for c in self.inc.values():  # (in accept order)
            if c.state == "auth":
                pending.setdefault(c.addr[0], []).append(c)
        mine = pending.get(source, [])
        if len(mine) >= PENDING_PER_SOURCE_MAX:
            victim = mine[0]
        elif sum(len(cs) for cs in pending.values()) >= PENDING_INCOMING_MAX:
            victim = max(pending.values(), key=len)[0]
        else:
            return
        self.stats["pending_evicted"] += 1
        if self.stats["pending_evicted"] <= 10 or self.stats["pending_evicted"] % 1000 == 0:
            log.warning(
                "raft port %s: too many unauthenticated connections (%d evicted so far); closing the oldest, from %s",
                self.bind_addr,
                self.stats["pending_evicted"],
                victim.addr[0],
            )
        self._close_in(victim, None)

    def _read_in(self, c: _In) -> None:
        try:
            data = c.sock.recv(RECV_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close_in(c, None)
            return
        self.stats["bytes_in"] += len(data)
        buf = c.rbuf
        buf += data
        if c.state == "auth":
            try:
                got = wire.parse_client_auth(buf, self.secret, c.nonce_a)
            except wire.WireError as exc:
                self.stats["auth_rejected"] += 1
                log.warning(
                    "raft port %s: rejected connection from %s:%s: %s", self.bind_addr[0], c.addr[0], c.addr[1], exc
                )
                self._close_in(c, None)
                return
            if got is None:
                if len(buf) >= wire.CLIENT_AUTH_BYTES_MAX:
                    self._close_in(c, "handshake too long")
                return
            peer, nonce_c, used = got
            if peer == self.node_id:
                log.error("raft port %s: a connection claims our own node id %r; closing", self.bind_addr, peer)
                self._close_in(c, None)
                return
            try:
                c.sock.send(wire.server_proof(self.secret, c.nonce_a, nonce_c, self.node_id))
            except OSError:
                self._close_in(c, None)
                return
            del buf[:used]
            c.mac = FrameMac(frame_key(self.secret, c.nonce_a, nonce_c, peer, self.node_id))
            c.state, c.peer = "up", peer
            old = self.inc_by_peer.get(peer)
            if old is not None and old is not c:
                self._close_in(old, None)  # the peer reconnected (restart): the new stream wins
            self.inc_by_peer[peer] = c
            self.last_rx[peer] = self.clock()
        self._frames(c)

    def _frames(self, c: _In) -> None:
        """Every complete frame in the buffer, each checked against its MAC (frame_mac.py)
        before anything reads its body: a frame that fails closes the connection."""
        buf = c.rbuf
        off, n = 0, len(buf)
        hdr = wire.FRAME_HEADER
        peer = c.peer
        mac = c.mac
        got = False
        while n - off >= 5:
            ln, kind = hdr.unpack_from(buf, off)
            if ln < 1 or ln > wire.FRAME_BYTES_MAX:
                self.stats["protocol_errors"] += 1
                self._close_in(c, f"bad frame length {ln}")
                return
            end = off + 4 + ln
            if n - end < MAC_BYTES:
                break
            body = bytes(buf[off + 5 : end])
            if not mac.check(buf[off : off + 5], body, buf[end : end + MAC_BYTES]):
                self.stats["mac_rejected"] += 1
                log.warning(
                    "raft port %s: frame %d from %s (%s) failed its MAC (altered, replayed, reordered or "
                    "injected); closing the connection",
                    self.bind_addr[0],
                    mac.seq - 1,
                    peer,
                    c.addr[0],
                )
                self._close_in(c, None)
                return
            off = end + MAC_BYTES
            got = True
            self.stats["frames_in"] += 1
            if kind != wire.KIND_PING:
                self.on_frame(peer, kind, body)
            if c.state != "up":  # the callback closed us
                return
        if off:
            del buf[:off]
        if got:
            self.last_rx[peer] = self.clock()

    def _close_in(self, c: _In, why: str | None) -> None:
        if why:
            log.info(
                "raft port %s: closing connection from %s (%s): %s", self.bind_addr[0], c.peer or c.addr, c.addr, why
            )
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        self.inc.pop(c.sock, None)
        if c.peer is not None and self.inc_by_peer.get(c.peer) is c:
            del self.inc_by_peer[c.peer]
            if self.on_inbound_closed is not None and not self.is_up(c.peer):
                self.on_inbound_closed(c.peer)
        c.state = "closed"

    # ---------------------------------------------------------------------------- outgoing

    def _connect(self, peer: str, now: float) -> None:
        addr = self.addrs.get(peer)
        if addr is None:
            return
        family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            s.connect(addr)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            s.close()
            self._backoff(peer, now)
            log.debug("raft connect to %s %s failed: %s", peer, addr, exc)
            return
        o = _Out(peer, s, now + self.connect_timeout_s)
        self.out[peer] = o
        o.events = selectors.EVENT_WRITE
        self.sel.register(s, selectors.EVENT_WRITE, ("out", o))
        self.stats["connects"] += 1

    def _backoff(self, peer: str, now: float) -> None:
        d = min(self.retry_s_max, max(self.retry_s_min, self.retry_s.get(peer, 0.0) * 2))
        self.retry_s[peer] = d
        self.retry_at[peer] = now + d

    def _out_event(self, o: _Out, ev: int) -> None:
        if o.state == "closed":
            return
        if o.state == "connecting":
            err = o.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._close_out(o, f"connect: {errno.errorcode.get(err, err)}", quiet=True)
                return
            o.state = "hello"
            self._set_events(o, selectors.EVENT_READ)
            return
        if ev & selectors.EVENT_READ:
            try:
                data = o.sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data is not None:
                if not data:
                    self._close_out(o, "closed by peer", quiet=o.state != "up")
                    return
                self._out_handshake(o, data)
                if o.state == "closed":
                    return
        if ev & selectors.EVENT_WRITE and o.state == "up":
            self._write(o)

    def _out_handshake(self, o: _Out, data: bytes) -> None:
        if o.state == "up":
            self.stats["protocol_errors"] += 1
            self._close_out(o, "unexpected bytes from the acceptor")
            return
        o.rbuf += data
        try:
            if o.state == "hello":
                nonce_a = wire.parse_server_hello(o.rbuf)
                if nonce_a is None:
                    return
                del o.rbuf[: wire.SERVER_HELLO_BYTES]
                msg, o.nonce_c = wire.client_auth(self.secret, nonce_a, self.node_id)
                o.nonce_a = nonce_a
                o.sock.send(msg)
                o.state = "proof"
            if o.state == "proof":
                got = wire.parse_server_proof(o.rbuf, self.secret, o.nonce_a, o.nonce_c)
                if got is None:
                    if len(o.rbuf) >= wire.SERVER_PROOF_BYTES_MAX:
                        raise wire.WireError("proof too long")
                    return
                peer_id, used = got
                if peer_id != o.peer:
                    raise wire.WireError(
                        f"address {self.addrs.get(o.peer)} answers as {peer_id!r}, expected {o.peer!r}"
                    )
                del o.rbuf[:used]
                if o.rbuf:
                    raise wire.WireError("bytes after the proof")
                o.mac = FrameMac(frame_key(self.secret, o.nonce_a, o.nonce_c, self.node_id, peer_id))
                now = self.clock()
                o.state, o.up_since, o.last_tx = "up", now, now
                self.retry_s.pop(o.peer, None)
                self.on_peer_up(o.peer)
        except wire.WireError as exc:
            self.stats["auth_rejected"] += 1
            log.warning("raft port %s: handshake with %s failed: %s", self.bind_addr[0], o.peer, exc)
            self._close_out(o, None)
        except OSError as exc:
            self._close_out(o, f"handshake send failed: {exc.strerror}", quiet=True)

    def _close_out(self, o: _Out, why: str | None, quiet: bool = False) -> None:
        if o.state == "closed":
            return
        was_up = o.state == "up"
        if why and not quiet:
            log.info("raft link %s -> %s closed: %s", self.node_id, o.peer, why)
        try:
            self.sel.unregister(o.sock)
        except (KeyError, ValueError):
            pass
        o.sock.close()
        o.state = "closed"
        if self.out.get(o.peer) is o:
            del self.out[o.peer]
        self._backoff(o.peer, self.clock())
        if was_up:
            self.on_peer_down(o.peer)

    # ---------------------------------------------------------------------------- maintain

    def maintain(self, now: float) -> None:
        """Connect wanted peers, time out handshakes and silent peers, ping idle links."""
        for peer in list(self.wanted):
            if peer not in self.out and now >= self.retry_at.get(peer, 0.0):
                self._connect(peer, now)
        for o in list(self.out.values()):
            if o.state != "up":
                if now > o.deadline:
                    self._close_out(o, "connect/handshake timed out", quiet=True)
                continue
            heard = max(o.up_since, self.last_rx.get(o.peer, 0.0))
            if now - heard > self.peer_timeout_s:
                self.stats["peer_timeouts"] += 1
                log.info("raft link %s -> %s: nothing heard for %.1f s; dropping it", self.node_id, o.peer, now - heard)
                c = self.inc_by_peer.get(o.peer)
                if c is not None:
                    self._close_in(c, None)
                self._close_out(o, None)
                continue
            if not o.wbuf and now - o.last_tx >= self.ping_interval_s:
                self._append_frame(o, wire.KIND_PING, b"")
                self._write(o)
        for c in list(self.inc.values()):
            if c.state == "auth" and now > c.deadline:
                self._close_in(c, "handshake timed out")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for o in list(self.out.values()):
            o.state = "closing"
            try:
                self.sel.unregister(o.sock)
            except (KeyError, ValueError):
                pass
            o.sock.close()
        self.out.clear()
        for c in list(self.inc.values()):
            self._close_in(c, None)
        if self.lsock is not None:
            self.sel.unregister(self.lsock)
            self.lsock.close()
        self.sel.unregister(self.wake_r)
        self.wake_r.close()
        self.wake_w.close()
        self.sel.close()
