"""Basic content properties and the content header frame payload.

Theory of operation: a content header payload is class-id u16, weight u16 (always 0),
body-size u64, then the property list: 16-bit flag words, most significant bit first, one
bit per property in spec order, bit 0 meaning "another flag word follows" (spec 4.2.6.1),
followed by the values of the present properties only. The broker normally keeps the
property list as opaque bytes (`props_raw`) and relays it untouched, so headers are parsed
only when something needs them; `decode_properties` / `encode_properties` do the parse.
None means "absent": an empty string or table is a present, empty property.
Both directions are written out property by property (14 of them, fixed by the spec) rather
than looping over a descriptor table, because this sits on the publish/deliver hot path.
"""

from struct import Struct
from struct import error as StructError

from .errors import DecodeError
from .spec import BASIC_PROPERTIES, SYNTAX_ERROR
from .values import decode_table, encode_table

_U8 = Struct(">B")
_U16 = Struct(">H")
_U64 = Struct(">Q")
_HEADER = Struct(">HHQ")  # class id, weight, body size
_HEADER_SIZE = 12
_new = object.__new__


class BasicProperties:
    """The 14 basic-class content properties; each is None when absent."""

    __slots__ = (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
        "cluster_id",
    )

    def __init__(
        self,
        *,
        content_type: str | None = None,
        content_encoding: str | None = None,
        headers: dict | None = None,
        delivery_mode: int | None = None,
        priority: int | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expiration: str | None = None,
        message_id: str | None = None,
        timestamp: int | None = None,
        type: str | None = None,  # noqa: A002 - the spec's name for the property
        user_id: str | None = None,
        app_id: str | None = None,
        cluster_id: str | None = None,
    ) -> None:
        self.content_type = content_type
        self.content_encoding = content_encoding
        self.headers = headers
        self.delivery_mode = delivery_mode
        self.priority = priority
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.expiration = expiration
        self.message_id = message_id
        self.timestamp = timestamp
        self.type = type
        self.user_id = user_id
        self.app_id = app_id
        self.cluster_id = cluster_id

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        present = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in self.__slots__
            if getattr(self, name) is not None
        )
        return f"BasicProperties({present})"


# the hand-written order above must be the spec's wire order
assert BasicProperties.__slots__ == tuple(name for name, _, _ in BASIC_PROPERTIES)


def _shortstr(parts: list, value: str) -> None:
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"property value is {len(raw)} bytes, the shortstr limit is 255")
    parts.append(_U8.pack(len(raw)))
    parts.append(raw)


def encode_properties(props: BasicProperties) -> bytes:
    """The property list (flag word + present values) of a content header."""
    flags = 0
    parts: list = [b""]  # placeholder for the flag word
    try:
        if props.content_type is not None:
            flags |= 0x8000
            _shortstr(parts, props.content_type)
        if props.content_encoding is not None:
            flags |= 0x4000
            _shortstr(parts, props.content_encoding)
        if props.headers is not None:
            flags |= 0x2000
            parts.append(encode_table(props.headers))
        if props.delivery_mode is not None:
            flags |= 0x1000
            parts.append(_U8.pack(props.delivery_mode))
        if props.priority is not None:
            flags |= 0x0800
            parts.append(_U8.pack(props.priority))
        if props.correlation_id is not None:
            flags |= 0x0400
            _shortstr(parts, props.correlation_id)
        if props.reply_to is not None:
            flags |= 0x0200
            _shortstr(parts, props.reply_to)
        if props.expiration is not None:
            flags |= 0x0100
            _shortstr(parts, props.expiration)
        if props.message_id is not None:
            flags |= 0x0080
            _shortstr(parts, props.message_id)
        if props.timestamp is not None:
            flags |= 0x0040
            parts.append(_U64.pack(props.timestamp))
        if props.type is not None:
            flags |= 0x0020
            _shortstr(parts, props.type)
        if props.user_id is not None:
            flags |= 0x0010
            _shortstr(parts, props.user_id)
        if props.app_id is not None:
            flags |= 0x0008
            _shortstr(parts, props.app_id)
        if props.cluster_id is not None:
            flags |= 0x0004
            _shortstr(parts, props.cluster_id)
    except StructError as exc:
        raise ValueError(f"cannot encode basic properties: {exc}") from None
    # 14 properties fit one flag word, so the continuation bit is never set
    parts[0] = _U16.pack(flags)
    return b"".join(parts)


def decode_properties(raw) -> BasicProperties:
    """Parse a property list (bytes or memoryview starting at the flag word)."""
    try:
        return _decode_properties(raw)
    except (StructError, IndexError, ValueError):
        raise DecodeError(SYNTAX_ERROR, "malformed content header properties") from None
    except DecodeError as exc:
        raise DecodeError(
            SYNTAX_ERROR, f"malformed content header properties: {exc.reply_text}"
        ) from None


def _decode_properties(buf) -> BasicProperties:
    (flags,) = _U16.unpack_from(buf, 0)
    off = 2
    if flags & 1:
        # Continuation words (spec 4.2.6.1) can only carry bits of properties beyond the 14
        # that basic defines; accept them when empty so the stream stays in sync.
        while True:
            (more,) = _U16.unpack_from(buf, off)
            off += 2
            if more & 0xFFFE:
                raise DecodeError(SYNTAX_ERROR, "unknown basic property flags set")
            if not more & 1:
                break
    # bit 1 has no property; RabbitMQ ignores it, and so do we
    p = _new(BasicProperties)
    if flags & 0x8000:
        end = off + 1 + buf[off]
        p.content_type = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.content_type = None
    if flags & 0x4000:
        end = off + 1 + buf[off]
        p.content_encoding = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.content_encoding = None
    if flags & 0x2000:
        p.headers, off = decode_table(buf, off)
    else:
        p.headers = None
    if flags & 0x1000:
        p.delivery_mode = buf[off]
        off += 1
    else:
        p.delivery_mode = None
    if flags & 0x0800:
        p.priority = buf[off]
        off += 1
    else:
        p.priority = None
    if flags & 0x0400:
        end = off + 1 + buf[off]
        p.correlation_id = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.correlation_id = None
    if flags & 0x0200:
        end = off + 1 + buf[off]
        p.reply_to = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.reply_to = None
    if flags & 0x0100:
        end = off + 1 + buf[off]
        p.expiration = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.expiration = None
    if flags & 0x0080:
        end = off + 1 + buf[off]
        p.message_id = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.message_id = None
    if flags & 0x0040:
        (p.timestamp,) = _U64.unpack_from(buf, off)
        off += 8
    else:
        p.timestamp = None
    if flags & 0x0020:
        end = off + 1 + buf[off]
        p.type = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.type = None
    if flags & 0x0010:
        end = off + 1 + buf[off]
        p.user_id = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.user_id = None
    if flags & 0x0008:
        end = off + 1 + buf[off]
        p.app_id = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.app_id = None
    if flags & 0x0004:
        end = off + 1 + buf[off]
        p.cluster_id = str(buf[off + 1 : end], "utf-8")
        off = end
    else:
        p.cluster_id = None
    # a string slice that ran past the end leaves off beyond len(buf)
    if off != len(buf):
        raise ValueError("property list length mismatch")
    return p


def encode_content_header(class_id: int, body_size: int, props_raw: bytes) -> bytes:
    """Content header frame payload: class id, weight 0, body size, property list."""
    return _HEADER.pack(class_id, 0, body_size) + props_raw


def decode_content_header(payload) -> tuple[int, int, bytes]:
    """Split a content header payload into (class id, body size, raw property list).
    The weight field is ignored (spec: must be zero, unused)."""
    if len(payload) < _HEADER_SIZE + 2:
        raise DecodeError(SYNTAX_ERROR, "content header frame shorter than 14 bytes")
    class_id, _weight, body_size = _HEADER.unpack_from(payload, 0)
    return class_id, body_size, bytes(payload[_HEADER_SIZE:])


_DELIVERY_MODE_FLAG = 1 << 12
_SKIP_BEFORE_DELIVERY_MODE = ((1 << 15, "shortstr"), (1 << 14, "shortstr"), (1 << 13, "table"))


def delivery_mode_of(raw) -> int:
    """delivery_mode of an encoded property list (0 if absent), without decoding the rest.

    The broker asks this of every publish (persistent or not), so it skips the at most three
    fields before delivery-mode by their lengths instead of decoding them.
    """
    if len(raw) < 2:
        return 0
    flags = raw[0] << 8 | raw[1]
    if not flags & _DELIVERY_MODE_FLAG:
        return 0
    offset = 2
    word = flags
    try:
        while word & 1:  # continuation flag words (never carry properties in 0-9-1)
            word = raw[offset] << 8 | raw[offset + 1]
            offset += 2
        for flag, kind in _SKIP_BEFORE_DELIVERY_MODE:
            if flags & flag:
                if kind == "shortstr":
                    offset += 1 + raw[offset]
                else:
                    offset += 4 + int.from_bytes(raw[offset:offset + 4], "big")
        return raw[offset]
    except IndexError:
        raise DecodeError(502, "malformed content header properties") from None
