"""What goes over the replication port: frames, the peer handshake, Raft messages in msgpack.

Theory of operation
-------------------
pysyncobj hands its transport Python dicts and its stock TCP transport pickles them, so an open
Raft port is remote code execution (docs/design.md §3). Here every message is translated to a fixed
msgpack array per message type on the way out, and on the way in it is decoded with msgpack
(which builds only plain values), checked field by field, and rebuilt as the dict pysyncobj
expects. Nothing from the network is ever unpickled:

* entry commands are limited to three kinds (their first byte): pysyncobj's no-op (exactly one
  byte), our payload kind (opaque bytes that pysyncobj stores and skips when applying), and
  membership changes. pysyncobj keeps a membership change as a pickle; on the wire it travels
  as msgpack `["add"|"rem", node_id, host, port]` and the receiver pickles it again locally,
  so the pickle that pysyncobj later loads was written by this process;
* pysyncobj's other message kinds that would unpickle data (chunked "transmission" entries,
  "serialized" snapshots, version-switch entries, forwarded "apply_command") have no encoding
  here: the sender refuses them and the receiver cannot express them. Snapshots travel as our
  own messages instead (snapshot_install.py): `snapshot_chunk` (bytes of our snapshot file,
  msgpack and crc-checked, never a pickle) and `snapshot_ack`, handled by the transport.

Frames: u32 length (of kind + body) | u8 kind | body | mac (16 bytes, frame_mac.py). Kinds:
RAFT (msgpack [group, type, fields...]), CONTROL (msgpack map, engine-to-engine requests),
PING (empty).

Handshake, on every TCP connection, before any frame (the connection carries frames one way:
from the node that connected to the node that accepted):
  acceptor  -> connector : MAGIC | version u8 | nonce_a (32)
  connector -> acceptor  : MAGIC | version u8 | nonce_c (32) | id length u8 | node id | mac_c (32)
  acceptor  -> connector : id length u8 | node id | mac_a (32)
  mac_c = HMAC-SHA256(secret, "maxq-raft client v2" | nonce_a | nonce_c | connector id)
  mac_a = HMAC-SHA256(secret, "maxq-raft server v2" | nonce_c | nonce_a | acceptor id)
The acceptor parses only these fixed fields until mac_c checks out; a wrong mac closes the
connection (logged). Both nonces are fresh, so a recorded handshake cannot be replayed, and
the frames after it are keyed from them (frame_mac.py). Version 2 added the frame MAC; a
member of version 1 is refused with a message saying so: every member must run the same
version.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pickle
import struct
from typing import Any

import msgpack
from pysyncobj.node import Node

__all__ = [
    "WireError",
    "FRAME_HEADER",
    "FRAME_BYTES_MAX",
    "KIND_RAFT",
    "KIND_CONTROL",
    "KIND_PING",
    "CMD_NO_OP",
    "CMD_MEMBERSHIP",
    "CMD_PAYLOAD",
    "NODE_ID_BYTES_MAX",
    "encode_raft",
    "decode_raft",
    "encode_control",
    "decode_control",
    "frame",
    "membership_command",
    "membership_of",
    "RaftNode",
    "server_hello",
    "parse_server_hello",
    "client_auth",
    "parse_client_auth",
    "server_proof",
    "parse_server_proof",
    "SERVER_HELLO_BYTES",
    "CLIENT_AUTH_BYTES_MAX",
    "SERVER_PROOF_BYTES_MAX",
]

FRAME_HEADER = struct.Struct(">IB")
FRAME_BYTES_MAX = 8 * 1024 * 1024  # append_entries batches are capped at 2 MiB + one entry (<= 1 MiB)
KIND_RAFT = 1
KIND_CONTROL = 2
KIND_PING = 3

# First byte of a pysyncobj log command (pysyncobj.syncobj._COMMAND_TYPE, pinned 0.3.17).
CMD_REGULAR = 0  # a pickled method call: never accepted
CMD_NO_OP = 1
CMD_MEMBERSHIP = 2
CMD_VERSION = 3  # a pickled code version: never accepted
CMD_PAYLOAD = 4  # ours: pysyncobj stores it and skips it when applying (not REGULAR)

NODE_ID_BYTES_MAX = 255
ENTRIES_PER_MESSAGE_MAX = 1_000_000
INT_MAX = (1 << 63) - 1

# message type codes on the wire
_T_REQUEST_VOTE = 1
_T_RESPONSE_VOTE = 2
_T_APPEND_ENTRIES = 3
_T_NEXT_NODE_IDX = 4
_T_TIMEOUT_NOW = 5
_T_SNAPSHOT_CHUNK = 6  # leader -> follower: term, snapshot index, offset, bytes, is_last
_T_SNAPSHOT_ACK = 7  # follower -> leader: term, snapshot index, next offset wanted, installed
SNAPSHOT_CHUNK_BYTES_MAX = 4 * 1024 * 1024

MAGIC = b"MQRF"
VERSION = 2  # 2: a MAC on every frame (frame_mac.py); 1 had none
NONCE_BYTES = 32
MAC_BYTES = 32
SERVER_HELLO_BYTES = len(MAGIC) + 1 + NONCE_BYTES
CLIENT_AUTH_BYTES_MAX = len(MAGIC) + 1 + NONCE_BYTES + 1 + NODE_ID_BYTES_MAX + MAC_BYTES
SERVER_PROOF_BYTES_MAX = 1 + NODE_ID_BYTES_MAX + MAC_BYTES
_CLIENT_LABEL = b"maxq-raft client v2"
_SERVER_LABEL = b"maxq-raft server v2"


class WireError(ValueError):
    """A message that must not be sent, or bytes that are not a valid message."""


class RaftNode(Node):
    """A pysyncobj node whose id is our node id and which carries its Raft address, so that a
    membership change (which pysyncobj pickles into the log) tells every member where to connect."""

    def __init__(self, node_id: str, raft_addr: tuple[str, int] | None = None) -> None:
        super().__init__(node_id)
        self.raft_addr = tuple(raft_addr) if raft_addr is not None else None


# ----------------------------------------------------------------------------------- frames


def frame(kind: int, body: bytes) -> bytes:
    return FRAME_HEADER.pack(len(body) + 1, kind) + body


# ------------------------------------------------------------------------------- membership


def membership_command(action: str, node_id: str, raft_addr: tuple[str, int] | None) -> bytes:
    """The log command pysyncobj's addNodeToCluster/removeNodeFromCluster would build (byte 2 +
    pickle of [action, id, node]), built here from checked plain values."""
    if action not in ("add", "rem"):
        raise WireError(f"membership action {action!r}")
    return bytes([CMD_MEMBERSHIP]) + pickle.dumps([action, node_id, RaftNode(node_id, raft_addr)], protocol=2)


def membership_of(command: bytes) -> tuple[str, str, tuple[str, int] | None]:
    """(action, node id, raft address) of a membership command written by THIS process (its own
    log): never call it on bytes from the network."""
    action, node_id, node = pickle.loads(command[1:])
    return action, node_id, getattr(node, "raft_addr", None)


# --------------------------------------------------------------------------- raft messages


def _entry_to_wire(entry: Any, cache: dict) -> list:
    cmd, idx, term = entry[0], entry[1], entry[2]
    kind = cmd[0] if cmd else -1
    if kind == CMD_PAYLOAD or (kind == CMD_NO_OP and len(cmd) == 1):
        return [cmd, idx, term]
    if kind == CMD_MEMBERSHIP:
        wire = cache.get(cmd)
        if wire is None:
            action, node_id, addr = membership_of(cmd)
            host, port = addr if addr is not None else ("", 0)
            wire = bytes([CMD_MEMBERSHIP]) + msgpack.packb([action, node_id, host, port])
            if len(cache) > 64:
                cache.clear()
            cache[cmd] = wire
        return [wire, idx, term]
    raise WireError(f"log entry {idx} has command kind {kind}: not replicable")


def encode_raft(group: str, message: dict, membership_cache: dict) -> bytes:
    """A pysyncobj message as a RAFT frame body. WireError for anything we never send."""
    t = message.get("type")
    if t == "append_entries":
        if "transmission" in message or "serialized" in message or "prevLogIdx" not in message:
            raise WireError("chunked or snapshot append_entries are not supported")
        entries = [_entry_to_wire(e, membership_cache) for e in message["entries"]]
        body = [
            group,
            _T_APPEND_ENTRIES,
            message["term"],
            message["commit_index"],
            message["prevLogIdx"],
            message["prevLogTerm"],
            entries,
        ]
    elif t == "snapshot_chunk":
        if type(message["data"]) is not bytes or len(message["data"]) > SNAPSHOT_CHUNK_BYTES_MAX:
            raise WireError("snapshot chunk is not bytes of a bounded size")
        body = [
            group,
            _T_SNAPSHOT_CHUNK,
            message["term"],
            message["index"],
            message["offset"],
            message["data"],
            bool(message["is_last"]),
        ]
    elif t == "snapshot_ack":
        body = [group, _T_SNAPSHOT_ACK, message["term"], message["index"], message["offset"], bool(message["done"])]
    elif t == "next_node_idx":
        body = [
            group,
            _T_NEXT_NODE_IDX,
            message["next_node_idx"],
            bool(message["reset"]),
            bool(message["success"]),
            message["term"],
        ]
    elif t == "request_vote":
        body = [group, _T_REQUEST_VOTE, message["term"], message["last_log_index"], message["last_log_term"]]
    elif t == "response_vote":
        body = [group, _T_RESPONSE_VOTE, message["term"]]
    elif t == "timeout_now":
        body = [group, _T_TIMEOUT_NOW, message["term"]]
    else:
        raise WireError(f"message type {t!r} is not sent by this transport")
    return msgpack.packb(body, use_bin_type=True)


def _int(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= INT_MAX:
        raise WireError(f"{what} is not a non-negative int: {v!r}")
    return v


def _bool(v: Any, what: str) -> bool:
    if type(v) is not bool:
        raise WireError(f"{what} is not a bool: {v!r}")
    return v


def _entry_from_wire(e: Any) -> list:
    if type(e) is not list or len(e) != 3:
        raise WireError("entry is not [command, index, term]")
    cmd, idx, term = e
    if type(cmd) is not bytes or not cmd:
        raise WireError("entry command is not non-empty bytes")
    kind = cmd[0]
    if kind == CMD_PAYLOAD:
        pass
    elif kind == CMD_NO_OP:
        if len(cmd) != 1:
            raise WireError("no-op entry with a body")
    elif kind == CMD_MEMBERSHIP:
        try:
            m = msgpack.unpackb(cmd[1:], raw=False, use_list=True)
        except Exception as exc:  # msgpack raises several types on garbage
            raise WireError(f"membership entry is not msgpack: {exc}") from None
        if (
            type(m) is not list
            or len(m) != 4
            or m[0] not in ("add", "rem")
            or type(m[1]) is not str
            or not 0 < len(m[1].encode()) <= NODE_ID_BYTES_MAX
            or type(m[2]) is not str
            or type(m[3]) is not int
            or not 0 <= m[3] <= 65535
        ):
            raise WireError(f"bad membership entry {m!r}")
        cmd = membership_command(m[0], m[1], (m[2], m[3]) if m[2] else None)
    else:
        raise WireError(f"entry command kind {kind} is not accepted")
    return [cmd, _int(idx, "entry index"), _int(term, "entry term")]


def decode_raft(body: bytes) -> tuple[str, dict]:
    """(group, pysyncobj message dict) from a RAFT frame body, or WireError."""
    try:
        m = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"raft frame is not msgpack: {exc}") from None
    if type(m) is not list or len(m) < 3 or type(m[0]) is not str or type(m[1]) is not int:
        raise WireError("raft frame is not [group, type, ...]")
    group, t = m[0], m[1]
    if t == _T_APPEND_ENTRIES and len(m) == 7:
        term = _int(m[2], "term")
        prev = _int(m[4], "prevLogIdx")
        prev_term = _int(m[5], "prevLogTerm")
        raw = m[6]
        if type(raw) is not list or len(raw) > ENTRIES_PER_MESSAGE_MAX:
            raise WireError("entries is not a list")
        entries = [_entry_from_wire(e) for e in raw]
        expect, last_term = prev + 1, prev_term
        for e in entries:  # consecutive after prevLogIdx, terms never falling, none above the message term
            if e[1] != expect or e[2] < last_term or e[2] > term:
                raise WireError(f"entries out of order at index {e[1]}")
            expect, last_term = expect + 1, e[2]
        return group, {
            "type": "append_entries",
            "term": term,
            "commit_index": _int(m[3], "commit_index"),
            "prevLogIdx": prev,
            "prevLogTerm": prev_term,
            "entries": entries,
        }
    if t == _T_SNAPSHOT_CHUNK and len(m) == 7:
        if type(m[5]) is not bytes or len(m[5]) > SNAPSHOT_CHUNK_BYTES_MAX:
            raise WireError("snapshot chunk is not bytes of a bounded size")
        return group, {
            "type": "snapshot_chunk",
            "term": _int(m[2], "term"),
            "index": _int(m[3], "index"),
            "offset": _int(m[4], "offset"),
            "data": m[5],
            "is_last": _bool(m[6], "is_last"),
        }
    if t == _T_SNAPSHOT_ACK and len(m) == 6:
        return group, {
            "type": "snapshot_ack",
            "term": _int(m[2], "term"),
            "index": _int(m[3], "index"),
            "offset": _int(m[4], "offset"),
            "done": _bool(m[5], "done"),
        }
    if t == _T_NEXT_NODE_IDX and len(m) == 6:
        return group, {
            "type": "next_node_idx",
            "next_node_idx": _int(m[2], "next_node_idx"),
            "reset": _bool(m[3], "reset"),
            "success": _bool(m[4], "success"),
            "term": _int(m[5], "term"),
        }
    if t == _T_REQUEST_VOTE and len(m) == 5:
        return group, {
            "type": "request_vote",
            "term": _int(m[2], "term"),
            "last_log_index": _int(m[3], "last_log_index"),
            "last_log_term": _int(m[4], "last_log_term"),
        }
    if t == _T_RESPONSE_VOTE and len(m) == 3:
        return group, {"type": "response_vote", "term": _int(m[2], "term")}
    if t == _T_TIMEOUT_NOW and len(m) == 3:
        return group, {"type": "timeout_now", "term": _int(m[2], "term")}
    raise WireError(f"unknown raft message type {t} with {len(m)} fields")


def encode_control(message: dict) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def decode_control(body: bytes) -> dict:
    try:
        m = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"control frame is not msgpack: {exc}") from None
    if type(m) is not dict or type(m.get("op")) is not str:
        raise WireError("control frame is not a map with an op")
    return m


# ------------------------------------------------------------------------------- handshake


def _mac(secret: bytes, label: bytes, n1: bytes, n2: bytes, node_id: bytes) -> bytes:
    return hmac.new(secret, label + n1 + n2 + bytes([len(node_id)]) + node_id, hashlib.sha256).digest()


def _id_bytes(node_id: str) -> bytes:
    b = node_id.encode()
    if not 0 < len(b) <= NODE_ID_BYTES_MAX:
        raise WireError(f"node id must be 1..{NODE_ID_BYTES_MAX} bytes")
    return b


def _check_version(version: int) -> None:
    if version != VERSION:
        raise WireError(
            f"peer speaks maxq-raft wire version {version}, this node {VERSION}: every member must run the same version"
        )


def server_hello() -> tuple[bytes, bytes]:
    """(bytes to send, nonce_a)."""
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + bytes([VERSION]) + nonce, nonce


def parse_server_hello(buf: bytes | bytearray) -> bytes | None:
    """nonce_a, None if incomplete; WireError if not our protocol."""
    if len(buf) < SERVER_HELLO_BYTES:
        return None
    if bytes(buf[:4]) != MAGIC:
        raise WireError("peer did not answer with the maxq-raft hello")
    _check_version(buf[4])
    return bytes(buf[5:SERVER_HELLO_BYTES])


def client_auth(secret: bytes, nonce_a: bytes, node_id: str) -> tuple[bytes, bytes]:
    """(bytes to send, nonce_c)."""
    nonce_c = os.urandom(NONCE_BYTES)
    nid = _id_bytes(node_id)
    return (
        MAGIC
        + bytes([VERSION])
        + nonce_c
        + bytes([len(nid)])
        + nid
        + _mac(secret, _CLIENT_LABEL, nonce_a, nonce_c, nid)
    ), nonce_c


def parse_client_auth(buf: bytes | bytearray, secret: bytes, nonce_a: bytes) -> tuple[str, bytes, int] | None:
    """(connector id, nonce_c, bytes used) once complete and authentic; None if incomplete;
    WireError if malformed or the mac is wrong."""
    head = len(MAGIC) + 1 + NONCE_BYTES + 1
    if len(buf) < head:
        return None
    if bytes(buf[:4]) != MAGIC:
        raise WireError("not a maxq-raft client")
    _check_version(buf[4])
    nonce_c = bytes(buf[5 : 5 + NONCE_BYTES])
    n = buf[head - 1]
    if n == 0:
        raise WireError("empty node id")
    end = head + n + MAC_BYTES
    if len(buf) < end:
        return None
    nid = bytes(buf[head : head + n])
    mac = bytes(buf[head + n : end])
    if not hmac.compare_digest(mac, _mac(secret, _CLIENT_LABEL, nonce_a, nonce_c, nid)):
        raise WireError("bad HMAC")
    try:
        return nid.decode(), nonce_c, end
    except UnicodeDecodeError:
        raise WireError("node id is not utf-8") from None


def server_proof(secret: bytes, nonce_a: bytes, nonce_c: bytes, node_id: str) -> bytes:
    nid = _id_bytes(node_id)
    return bytes([len(nid)]) + nid + _mac(secret, _SERVER_LABEL, nonce_c, nonce_a, nid)


def parse_server_proof(buf: bytes | bytearray, secret: bytes, nonce_a: bytes, nonce_c: bytes) -> tuple[str, int] | None:
    """(acceptor id, bytes used) once complete and authentic; None if incomplete; WireError."""
    if not buf:
        return None
    n = buf[0]
    end = 1 + n + MAC_BYTES
    if n == 0:
        raise WireError("empty node id in proof")
    if len(buf) < end:
        return None
    nid = bytes(buf[1 : 1 + n])
    if not hmac.compare_digest(bytes(buf[1 + n : end]), _mac(secret, _SERVER_LABEL, nonce_c, nonce_a, nid)):
        raise WireError("bad HMAC in the acceptor's proof")
    try:
        return nid.decode(), end
    except UnicodeDecodeError:
        raise WireError("node id is not utf-8") from None
