"""Receipt handles: what a receive hands out and a delete or visibility change hands back.

A handle names one receive of one message: (vhost, queue, the message's sequence number in the
queue, the receive's id). The queue machine gives each receive of a message a new id, so a handle
from an earlier receive no longer matches once the message has been received again (issue #18).
Clients treat handles as opaque; we must treat what comes back as hostile, so a handle carries an
HMAC-SHA256 over its contents under a server key: any change, or one made without the key, is
refused with ReceiptHandleIsInvalid before anything is looked up.

Layout (then base64url without padding): version byte, vhost (length byte + UTF-8), queue
(length byte + UTF-8), message sequence (8 bytes), receive id (8 bytes), 32-byte tag over
"maxq-raft sqs receipt" + the bytes before it. At most 748 characters (SQS allows 1024).
Decoding takes several keys so that a rotated key still accepts handles issued just before.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from .errors import SqsError

VERSION = 1
TAG_BYTES = 32
MAX_HANDLE_CHARS = 1024
MAX_NAME_BYTES = 255
_DOMAIN = b"maxq-raft sqs receipt\x00"
_U64 = 1 << 64


@dataclass(frozen=True)
class Receipt:
    vhost: str
    queue: str
    message_seq: int  # the message's place in its queue
    receive_id: int  # which receive of it: a later receive makes earlier handles stale


def encode_receipt(receipt: Receipt, key: bytes) -> str:
    vhost = receipt.vhost.encode("utf-8")
    queue = receipt.queue.encode("utf-8")
    if len(vhost) > MAX_NAME_BYTES or len(queue) > MAX_NAME_BYTES:
        raise ValueError("vhost and queue names are at most 255 bytes")
    if not (0 <= receipt.message_seq < _U64 and 0 <= receipt.receive_id < _U64):
        raise ValueError("message_seq and receive_id are unsigned 64-bit")
    body = b"".join(
        [
            bytes([VERSION, len(vhost)]),
            vhost,
            bytes([len(queue)]),
            queue,
            receipt.message_seq.to_bytes(8, "big"),
            receipt.receive_id.to_bytes(8, "big"),
        ]
    )
    return base64.urlsafe_b64encode(body + _tag(key, body)).rstrip(b"=").decode("ascii")


def decode_receipt(handle: str, keys: Sequence[bytes], *, vhost: str, queue: str) -> Receipt:
    """The receipt a handle carries, if one of `keys` made it and it names this vhost and queue."""
    if not keys:
        raise ValueError("at least one key")
    if not 0 < len(handle) <= MAX_HANDLE_CHARS or not handle.isascii():
        raise _invalid(handle)
    try:
        raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    except (binascii.Error, ValueError):
        raise _invalid(handle) from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=") != handle.encode("ascii"):
        # unpadded base64's last character has spare bits that decoding ignores: only the one
        # spelling we issue is accepted, so no two handles mean the same receipt
        raise _invalid(handle)
    body, tag = raw[:-TAG_BYTES], raw[-TAG_BYTES:]
    if len(raw) <= TAG_BYTES or not any(hmac.compare_digest(_tag(key, body), tag) for key in keys):
        raise _invalid(handle)
    # only bytes we wrote ourselves are parsed from here on
    if body[0] != VERSION:
        raise _invalid(handle)
    vhost_end = 2 + body[1]
    queue_end = vhost_end + 1 + body[vhost_end]
    receipt = Receipt(
        body[2:vhost_end].decode("utf-8"),
        body[vhost_end + 1 : queue_end].decode("utf-8"),
        int.from_bytes(body[queue_end : queue_end + 8], "big"),
        int.from_bytes(body[queue_end + 8 : queue_end + 16], "big"),
    )
    if (receipt.vhost, receipt.queue) != (vhost, queue):
        raise _invalid(handle)
    return receipt


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + body, hashlib.sha256).digest()


def _invalid(handle: str) -> SqsError:
    return SqsError(
        "ReceiptHandleIsInvalid", f'The input receipt handle "{handle[:128]}" is not a valid receipt handle.'
    )
