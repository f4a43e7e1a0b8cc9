"""What a publish needs for the queue features: its TTL, and confirms when a queue refused it.

Theory of operation: the session calls `publish_extras` only when the `expiration` or `priority`
property flag is set, so publishes without them pay one bit test; the expiration is checked as
rabbit_channel's check_expiration_header does (406 on a bad one); both are carried on each
`Message` for the queue machine. A queue with x-overflow reject-publish(-dlx) answers an Enqueue with `Overflowed` (positions in the batch);
`note_refused` collects the confirm seqs of the publishes it refused, which confirms.py then
nacks one by one (as RabbitMQ: a publish routed to several queues is nacked if any refused it),
never covering one with an ack's `multiple`. `dedup_fields` reads a publish's
x-deduplication-header for the queues that drop duplicates (a dropped duplicate is confirmed).
"""

from __future__ import annotations

import logging

from ..amqp import spec
from ..amqp.errors import DecodeError
from ..amqp.properties import BasicProperties, decode_properties, encode_properties
from ..machines.dedup import CACHE_TTL_HEADER, DEDUP_HEADER, dedup_key, dedup_ttl
from ..machines.queue_args import parse_expiration
from .errors import ChannelError

log = logging.getLogger("maxq.publish")

EXPIRATION_FLAG = 1 << 8  # property flag bits (basic class, spec order)
PRIORITY_FLAG = 1 << 11
HEADERS_FLAG = 1 << 13
EXTRAS_FLAGS = EXPIRATION_FLAG | PRIORITY_FLAG
DELAY_MS_MAX = (1 << 32) - 1  # as the plugin: about 49 days


def wants_extras(flags: int, props_raw: bytes) -> bool:
    """Whether `publish_extras` has anything to find: one bit test for most publishes, and a
    byte search (no decoding) for those with headers."""
    return bool(flags & EXTRAS_FLAGS) or bool(flags & HEADERS_FLAG and b"x-delay" in props_raw)


def publish_extras(props_raw: bytes) -> tuple[int | None, int, int | None]:
    """(TTL in ms or None, priority, delay in ms or None) of a publish."""
    props = decode_properties(props_raw)
    delay_ms = None
    if props.headers:
        # rabbitmq-delayed-message-exchange reads an integer x-delay; anything else, or a delay
        # of zero or less, is no delay.
        delay = props.headers.get("x-delay")
        if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0:
            delay_ms = min(delay, DELAY_MS_MAX)
    expiration = props.expiration
    ttl_ms = None
    if expiration is not None:
        try:
            ttl_ms = parse_expiration(expiration)
        except ValueError as exc:
            raise ChannelError(spec.PRECONDITION_FAILED, f"invalid expiration '{expiration}': {exc}") from None
    return ttl_ms, props.priority or 0, delay_ms


DEDUP_HEADER_BYTES = DEDUP_HEADER.encode()


def dedup_fields(flags: int, props_raw: bytes) -> tuple[str, int | None] | None:
    """(key, TTL ms or None) of a publish's x-deduplication-header and x-cache-ttl headers
    (machines/dedup.py), or None: no id. A byte search first, so publishes without the header
    decode nothing more; whether a queue deduplicates is its machine's business."""
    if not flags & HEADERS_FLAG or DEDUP_HEADER_BYTES not in props_raw:
        return None
    headers = decode_properties(props_raw).headers
    if not isinstance(headers, dict) or DEDUP_HEADER not in headers:
        return None
    key = dedup_key(headers[DEDUP_HEADER])
    if key is None:
        return None
    return key, dedup_ttl(headers.get(CACHE_TTL_HEADER))


def stored_properties(message) -> BasicProperties:
    """A stored message's properties. Publishes are refused unless theirs decode (session.py),
    but a store written before that check may hold one that does not: it is read as having
    only its delivery mode, with a warning, rather than failing what reads it (a delivery, a
    dead-lettering, the management API's get)."""
    try:
        return decode_properties(message.props_raw)
    except DecodeError as exc:
        log.warning("message %s of exchange '%s': %s; its properties are dropped", message.seq, message.exchange, exc)
        return BasicProperties(delivery_mode=2 if message.persistent else None)


def delivery_props(message) -> bytes:
    """The properties to deliver: with `x-delivery-count` (its earlier returns) when the queue
    counts them (x-delivery-limit, retry back-off) and the message was returned, as quorum queues do."""
    if not message.count_header:
        return message.props_raw
    props = stored_properties(message)
    headers = dict(props.headers) if isinstance(props.headers, dict) else {}
    headers["x-delivery-count"] = message.delivery_count - 1
    props.headers = headers
    return encode_properties(props)


def note_refused(refused: dict | None, refs: list | None, positions: list[int]) -> dict:
    """Collect channel number -> {confirm seq} of the refused publishes that await a confirm
    (all from this read of one connection, so the number names the channel). `positions` are
    the queue's `Overflowed.rejected`, positions in the batch; `refs` were kept beside that
    batch: (position, (channel number, confirm seq)) of each message whose publish awaits one."""
    if refused is None:
        refused = {}
    if refs:
        rejected = set(positions)
        for position, (channel_number, seq) in refs:
            if position in rejected:
                refused.setdefault(channel_number, set()).add(seq)
    return refused
