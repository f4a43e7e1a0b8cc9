"""A MAC on every Raft frame after the handshake: nothing on the link can be altered, replayed,
dropped in the middle, reordered or injected without the receiver closing the connection.

Theory of operation
-------------------
The handshake (wire.py) proves that both ends hold the cluster secret, over two fresh nonces.
From the same inputs both ends derive a key for the connection's one direction of frames:

    key = HMAC-SHA256(secret, "maxq-raft frame key v2" | nonce_a | nonce_c
                              | len | connector id | len | acceptor id)

and each frame carries, after its body,

    mac = HMAC-SHA256(key, seq u64 | frame header | body)[:16]

where `seq` counts the frames of this connection from 0 on both sides (it is not sent: TCP
delivers in order, so a frame out of place, dropped or repeated has the wrong number). A fresh
pair of nonces gives every connection its own key, so a frame recorded on one connection is
worth nothing on another. The tag is truncated to 128 bits as in RFC 4868's HMAC-SHA-256-128.

The cost is one SHA-256 pass over each frame (keyed state copied, not rebuilt: see `FrameMac`);
docs/security.md has the figure measured with scripts/bench_replication.py.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

__all__ = ["MAC_BYTES", "FrameMac", "frame_key"]

MAC_BYTES = 16
_KEY_LABEL = b"maxq-raft frame key v2"
_SEQ = struct.Struct(">Q")
SEQ_MAX = (1 << 64) - 1


def frame_key(secret: bytes, nonce_a: bytes, nonce_c: bytes, connector_id: str, acceptor_id: str) -> bytes:
    """The key of the frames from `connector_id` to `acceptor_id` on one connection."""
    cid, aid = connector_id.encode(), acceptor_id.encode()
    message = _KEY_LABEL + nonce_a + nonce_c + bytes([len(cid)]) + cid + bytes([len(aid)]) + aid
    return hmac.new(secret, message, hashlib.sha256).digest()


class FrameMac:
    """One direction of one connection: its key and the number of the next frame. The sender
    calls `sign` once per frame, the receiver `check`, each in frame order."""

    __slots__ = ("_keyed", "seq")

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)  # copied per frame: the key pads once
        self.seq = 0

    def _tag(self, header: bytes | bytearray, body: bytes | bytearray | memoryview) -> bytes:
        if self.seq > SEQ_MAX:  # 2^64 frames: unreachable, but a wrapped number would repeat tags
            raise OverflowError("frame sequence number exhausted; reconnect")
        h = self._keyed.copy()
        h.update(_SEQ.pack(self.seq))
        h.update(header)
        h.update(body)
        self.seq += 1
        return h.digest()[:MAC_BYTES]

    def sign(self, header: bytes | bytearray, body: bytes | bytearray | memoryview) -> bytes:
        """The tag to send after this frame."""
        return self._tag(header, body)

    def check(self, header: bytes | bytearray, body: bytes | bytearray | memoryview, tag: bytes | bytearray) -> bool:
        """True if `tag` is this frame's at this place in the stream (compared in constant time)."""
        return hmac.compare_digest(self._tag(header, body), bytes(tag))
