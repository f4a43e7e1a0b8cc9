"""AMQP 0-9-1 framing: encode frames, split content into body frames, parse a byte stream.

Theory of operation: every frame is type u8, channel u16, payload size u32, payload, and the
end octet 0xCE (spec 4.2.3). FrameReader is sans-IO: `feed()` appends received bytes and
`read_frames()` returns every complete frame now available, parsed from one joined buffer by
offsets; a large payload is a memoryview slice of that (immutable) buffer, not copied, a small
one (up to COPY_PAYLOAD_BYTES_MAX) a bytes copy, which is cheaper to make than a view and is what
the consumer of a method, header or small body wants anyway; only the incomplete tail is copied
once per call. A frame header is validated as
soon as its 7 bytes arrive: an unknown type or a size above frame_max fails before the body
is buffered, so at most one frame_max of data is ever held. Until a buffered partial frame is
complete, read_frames() returns immediately without joining, which keeps a peer that trickles
bytes from causing quadratic copying.

Payload memoryviews keep their whole receive buffer alive: copy (bytes(payload)) anything
retained beyond handling the frame, such as a message body (a no-op on a bytes payload).

`read_frames(fuse_publishes=True)` (the server connection's reader) hands out a basic.publish
whose content header and single body frame are all buffered as one item, PUBLISH_TRIPLE, whose
payload is (method payload, header payload, body bytes or None when the declared size is 0):
publishing is most of what a broker reads, and one item instead of three tuples, slices and
loop turns took more than a quarter off the read of a small publish (scripts/bench_read.py). Only
a triple every frame of which the general loop would accept is fused (type, channel, size
within frame_max, end octet, class 60, one body frame of exactly the declared size); anything
else is left to that loop, so its errors are the same.

A publisher mostly repeats its method and properties, and with bodies of one size the bytes
before each body are then the very same: publishes whose method and header frames and body
frame header repeat those of the fused publish before them, byte for byte, are one PUBLISH_RUN
item, (method payload, header payload, [body, ...]), found with one comparison per publish.
"""

from struct import Struct
from typing import Any

from .errors import FrameError
from .spec import (
    FRAME_BODY,
    FRAME_END,
    FRAME_ERROR,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    BasicDeliver,
    Method,
)

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_HEADER_SIZE = 7
FRAME_OVERHEAD = 8  # header + end octet: the payload of a frame is at most frame_max - 8

_FRAME_HEADER = Struct(">BHI")
_CONTENT_HEADER = Struct(">HHQ")
_END = bytes((FRAME_END,))
_FRAME_TYPES = (FRAME_METHOD, FRAME_HEADER, FRAME_BODY, FRAME_HEARTBEAT)

COPY_PAYLOAD_BYTES_MAX = 16384  # read_frames: payloads up to this size are copied, not viewed
PUBLISH_TRIPLE = 0x100  # not a wire type: a whole basic.publish from read_frames(fuse_publishes=True)
PUBLISH_RUN = 0x101  # not a wire type: whole basic.publishes alike but for their bodies (the same)
PUBLISH_METHOD_ID = b"\x00\x3c\x00\x28"  # basic.publish's class (60) and method (40) ids
CONTENT_HEADER_WITH_FLAGS_MIN_BYTES = 14  # class, weight, body size and the property flags
_CONTENT_CLASS_BASIC = 60
HEARTBEAT_FRAME = _FRAME_HEADER.pack(FRAME_HEARTBEAT, 0, 0) + _END


def unfold_publish(channel: int, triple: tuple[bytes, bytes, bytes | None]) -> list[tuple[int, int, bytes]]:
    """A PUBLISH_TRIPLE item's frames as read_frames() without fusing hands them out."""
    method, header, body = triple
    frames = [(FRAME_METHOD, channel, method), (FRAME_HEADER, channel, header)]
    if body is not None:
        frames.append((FRAME_BODY, channel, body))
    return frames


def unfold_publish_run(channel: int, run: tuple[bytes, bytes, list[bytes]]) -> list[tuple[int, int, bytes]]:
    """A PUBLISH_RUN item's frames as read_frames() without fusing hands them out."""
    method, header, bodies = run
    frames = []
    for body in bodies:
        frames += [(FRAME_METHOD, channel, method), (FRAME_HEADER, channel, header), (FRAME_BODY, channel, body)]
    return frames


def encode_frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    """One complete frame around `payload`."""
    return b"".join((_FRAME_HEADER.pack(frame_type, channel, len(payload)), payload, _END))


def encode_method_frame(channel: int, method: Method) -> bytes:
    """A method frame for a spec method instance (anything with `encode() -> bytes`)."""
    payload = method.encode()
    return b"".join((_FRAME_HEADER.pack(FRAME_METHOD, channel, len(payload)), payload, _END))


def encode_content(channel: int, method: Method, props_raw: bytes, body: bytes, frame_max: int) -> bytes:
    """Method frame + content header frame + body frames, as one bytes object.

    Body frames carry at most frame_max - 8 payload bytes so each frame is at most frame_max
    in total (the header frame excepted, see below); frame_max 0 means no limit (one body frame). An empty body has no body frame
    (spec 4.2.6.2: zero or more body frames)."""
    if frame_max and frame_max <= FRAME_OVERHEAD:
        raise ValueError(f"frame_max {frame_max} leaves no room for a payload")
    payload = method.encode()
    body_size = len(body)
    # The content header is one frame whatever its size: a message published with properties
    # larger than a consumer's frame_max is still delivered to it, header frame oversized, as
    # RabbitMQ's rabbit_binary_generator does (it splits only the body). Refusing here dropped
    # the delivery after its checkout: the message sat unacked, and a basic.get's was lost.
    header_payload_size = 12 + len(props_raw)
    parts: list[bytes | memoryview] = [
        _FRAME_HEADER.pack(FRAME_METHOD, channel, len(payload)),
        payload,
        _END,
        _FRAME_HEADER.pack(FRAME_HEADER, channel, header_payload_size),
        _CONTENT_HEADER.pack(method.CLASS_ID, 0, body_size),
        props_raw,
        _END,
    ]
    if body_size:
        chunk = frame_max - FRAME_OVERHEAD if frame_max else body_size
        if body_size <= chunk:
            parts += (_FRAME_HEADER.pack(FRAME_BODY, channel, body_size), body, _END)
        else:
            view = memoryview(body)
            full_header = _FRAME_HEADER.pack(FRAME_BODY, channel, chunk)
            last = body_size - chunk
            start = 0
            while start < last:
                parts += (full_header, view[start : start + chunk], _END)
                start += chunk
            rest = body_size - start
            parts += (_FRAME_HEADER.pack(FRAME_BODY, channel, rest), view[start:], _END)
    return b"".join(parts)


_DELIVER_PREFIX = Struct(">HH").pack(60, 60)  # basic.deliver: class 60, method 60
_DELIVER_TAG = Struct(">QB")
_PACK_FRAME_HEADER = _FRAME_HEADER.pack
# encode_delivery packs each run of fixed-size fields at once: a frame's end octet with the
# next frame's header (and the content header's fields), fewer pieces to join.
_PACK_DELIVER_HEAD = Struct(">BHIHH").pack  # method frame header + class and method ids
_PACK_DELIVER_TAG = _DELIVER_TAG.pack
_PACK_END_CONTENT_HEADER = Struct(">BBHIHHQ").pack  # end, header frame header, class, weight, body size
_PACK_END_FRAME_HEADER = Struct(">BBHI").pack  # end, next frame's header
_PACK_CONTENT_HEADER = _CONTENT_HEADER.pack


def encode_shortstr_field(value: str) -> bytes:
    """A shortstr as it sits in a method's arguments (length octet + UTF-8)."""
    raw = value.encode("utf-8")
    if len(raw) > 255:
        raise ValueError(f"shortstr of {len(raw)} bytes")
    return bytes((len(raw),)) + raw


def encode_delivery(
    channel: int,
    consumer_tag_field: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_routing_key_fields: bytes,
    props_raw: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """basic.deliver + content header + body, for the delivery hot path.

    The same bytes as `encode_content(channel, BasicDeliver(...), ...)`, but the consumer tag and
    the exchange + routing key arrive pre-encoded (`encode_shortstr_field`): a consumer's tag is
    encoded once per consumer and a message's routing fields once per message, not per delivery.
    """
    return encode_deliveries(
        channel,
        consumer_tag_field,
        delivery_tag,
        [(exchange_routing_key_fields, props_raw, body, redelivered)],
        frame_max,
    )


def encode_deliveries(
    channel: int,
    consumer_tag_field: bytes,
    first_delivery_tag: int,
    deliveries: list[tuple[bytes, bytes, bytes, bool]],
    frame_max: int,
) -> bytes:
    """Several deliveries to one consumer as one bytes: what `encode_delivery` writes for each
    `(exchange_routing_key_fields, props_raw, body, redelivered)`, with delivery tags
    `first_delivery_tag`, +1, ... in order.

    A queue hands its consumer a run of messages at a time; one join for the run instead of a
    call and a join per message saves about a third of what encoding a small delivery costs."""
    parts: list[bytes] = []
    extend = parts.extend
    method_fixed_size = 13 + len(consumer_tag_field)
    single_frame_max = frame_max - FRAME_OVERHEAD if frame_max else 1 << 62
    tag = first_delivery_tag
    for routing_fields, props_raw, body, redelivered in deliveries:
        body_size = len(body)
        if body_size > single_frame_max or len(props_raw) + 12 > single_frame_max:
            # The rare message that needs several body frames takes the general path.
            parts.append(
                _encode_delivery_frames(
                    channel, consumer_tag_field, tag, redelivered, routing_fields, props_raw, body, frame_max
                )
            )
        else:
            extend(
                (
                    _PACK_DELIVER_HEAD(FRAME_METHOD, channel, method_fixed_size + len(routing_fields), 60, 60),
                    consumer_tag_field,
                    _PACK_DELIVER_TAG(tag, 1 if redelivered else 0),
                    routing_fields,
                    _PACK_END_CONTENT_HEADER(FRAME_END, FRAME_HEADER, channel, 12 + len(props_raw), 60, 0, body_size),
                    props_raw,
                    # the header frame's end and the body frame's header (none for an empty body)
                    _PACK_END_FRAME_HEADER(FRAME_END, FRAME_BODY, channel, body_size) if body_size else b"",
                    body,
                    _END,
                )
            )
        tag += 1
    return b"".join(parts)


def _encode_delivery_frames(
    channel: int,
    consumer_tag_field: bytes,
    delivery_tag: int,
    redelivered: bool,
    exchange_routing_key_fields: bytes,
    props_raw: bytes,
    body: bytes,
    frame_max: int,
) -> bytes:
    """A delivery through `encode_content`: for a body of several frames."""
    tag = consumer_tag_field[1:].decode("utf-8")
    exchange_len = exchange_routing_key_fields[0]
    exchange = exchange_routing_key_fields[1 : 1 + exchange_len].decode("utf-8")
    routing_key = exchange_routing_key_fields[2 + exchange_len :].decode("utf-8")
    return encode_content(
        channel,
        BasicDeliver(
            consumer_tag=tag,
            delivery_tag=delivery_tag,
            redelivered=redelivered,
            exchange=exchange,
            routing_key=routing_key,
        ),
        props_raw,
        body,
        frame_max,
    )


class FrameReader:
    """Incremental frame parser. Not thread-safe; one per connection.

    frame_max may be changed at any time (after connection.tune-ok); 0 means unlimited."""

    __slots__ = ("frame_max", "_chunks", "_buffered", "_needed", "_pending_error", "_broken")

    def __init__(self, frame_max: int) -> None:
        self.frame_max = frame_max
        self._chunks: list[bytes] = []
        self._buffered = 0
        # bytes required before parsing can make progress: a header, or a whole frame
        self._needed = FRAME_HEADER_SIZE
        self._pending_error: FrameError | None = None
        self._broken = False  # after a bad frame: the stream cannot be parsed again, drop input

    def feed(self, data: bytes | bytearray) -> None:
        """Append received bytes. Mutable buffers are copied: payload views must not change."""
        if self._broken:
            return
        if data.__class__ is not bytes:
            data = bytes(data)
        if data:
            self._chunks.append(data)
            self._buffered += len(data)

    @property
    def failed(self) -> bool:
        """A bad frame was found after good ones: the next read_frames raises its error."""
        return self._pending_error is not None

    def read_frames(self, fuse_publishes: bool = False) -> list[tuple[int, int, Any]]:
        """Every complete frame buffered so far, as (type, channel, payload); with
        `fuse_publishes`, a whole basic.publish as one PUBLISH_TRIPLE item (module docstring).

        A bad frame raises FrameError, but only after the good frames before it were handed out:
        a client that pipelines its handshake and then a bad frame gets its handshake answered
        and then the right error.
        """
        error = self._pending_error
        if error is not None:
            self._pending_error = None
            raise error
        if self._buffered < self._needed:
            return []
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        view = memoryview(data)
        size = len(data)
        frame_max = self.frame_max
        payload_max = frame_max - FRAME_OVERHEAD if frame_max else 1 << 62
        frames: list[tuple[int, int, Any]] = []
        append = frames.append
        off = 0
        needed = FRAME_HEADER_SIZE
        unpack_header = _FRAME_HEADER.unpack_from
        unpack_content = _CONTENT_HEADER.unpack_from
        error = None
        repeat = None  # the bytes before the body of the last fused publish (see PUBLISH_RUN)
        repeat_size = 0  # its body's size
        run_bodies: list[bytes] | None = None  # of the PUBLISH_RUN item being made, if any
        while size - off >= FRAME_HEADER_SIZE:
            if repeat is not None:
                if data.startswith(repeat, off):
                    body_start = off + len(repeat)
                    body_end = body_start + repeat_size
                    if body_end >= size:
                        needed = body_end + 1 - off
                        break
                    if data[body_end] == FRAME_END:
                        if run_bodies is None:
                            _triple_type, run_channel, (method_payload, header_payload, first) = frames[-1]
                            run_bodies = [first, data[body_start:body_end]]
                            frames[-1] = (PUBLISH_RUN, run_channel, (method_payload, header_payload, run_bodies))
                        else:
                            run_bodies.append(data[body_start:body_end])
                        off = body_end + 1
                        continue
                repeat = run_bodies = None
            frame_type, channel, payload_size = unpack_header(data, off)
            if frame_type not in _FRAME_TYPES:
                error = FrameError(FRAME_ERROR, f"unknown frame type {frame_type}")
                break
            if payload_size > payload_max:
                error = FrameError(
                    FRAME_ERROR,
                    f"frame size {payload_size + FRAME_OVERHEAD} exceeds frame_max {frame_max}",
                )
                break
            start = off + FRAME_HEADER_SIZE
            end = start + payload_size
            if end >= size:
                needed = end + 1 - off
                break
            if data[end] != FRAME_END:
                error = FrameError(
                    FRAME_ERROR,
                    f"frame end marker missing: expected 0xce after {payload_size} bytes "
                    f"of payload, got 0x{data[end]:02x}",
                )
                break
            if fuse_publishes and frame_type == FRAME_METHOD and channel and data.startswith(PUBLISH_METHOD_ID, start):
                # The content header right behind it, then (unless the size is 0) one body frame,
                # each checked inline as the general loop checks a frame (a helper's call per frame
                # would cost much of what fusing saves).
                at = end + 1
                if size - at >= FRAME_HEADER_SIZE:
                    header_type, header_channel, header_size = unpack_header(data, at)
                    header_start = at + FRAME_HEADER_SIZE
                    header_end = header_start + header_size
                    if (
                        header_type == FRAME_HEADER
                        and header_channel == channel
                        and CONTENT_HEADER_WITH_FLAGS_MIN_BYTES <= header_size <= payload_max
                        and header_end < size
                        and data[header_end] == FRAME_END
                    ):
                        class_id, _weight, body_size = unpack_content(data, header_start)
                        at = header_end + 1
                        if class_id == _CONTENT_CLASS_BASIC and not body_size:
                            append((PUBLISH_TRIPLE, channel, (data[start:end], data[header_start:header_end], None)))
                            off = at
                            continue
                        if class_id == _CONTENT_CLASS_BASIC and size - at >= FRAME_HEADER_SIZE:
                            body_type, body_channel, body_bytes = unpack_header(data, at)
                            body_start = at + FRAME_HEADER_SIZE
                            body_end = body_start + body_bytes
                            if (
                                body_type == FRAME_BODY
                                and body_channel == channel
                                and body_bytes == body_size
                                and body_bytes <= payload_max
                                and body_end < size
                                and data[body_end] == FRAME_END
                            ):
                                append(
                                    (
                                        PUBLISH_TRIPLE,
                                        channel,
                                        (data[start:end], data[header_start:header_end], data[body_start:body_end]),
                                    )
                                )
                                repeat = data[off:body_start]
                                repeat_size = body_bytes
                                off = body_end + 1
                                continue
            if payload_size <= COPY_PAYLOAD_BYTES_MAX:
                append((frame_type, channel, data[start:end]))
            else:
                append((frame_type, channel, view[start:end]))
            off = end + 1
        if error is not None:
            # The stream is broken from here on: nothing after the bad frame is ever parsed.
            self._chunks = []
            self._buffered = 0
            self._needed = 1 << 62
            self._broken = True
            if not frames:
                raise error
            self._pending_error = error
            return frames
        if off == size:
            self._chunks = []
            self._buffered = 0
        elif off:
            tail = data[off:]
            self._chunks = [tail]
            self._buffered = len(tail)
        else:
            self._chunks = [data]
        self._needed = needed
        return frames
