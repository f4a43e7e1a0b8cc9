"""The data path's bytes: pre-encoded publish batches, coalesced acks, frame parsing by offsets.

Theory of operation: after set-up nothing on the data path goes through a method object.
A producer encodes one complete publish (method + content header + body frames) once with our
codec, repeats it into a batch buffer of about `BATCH_BYTES`, and before each write only stamps
16 bytes into every body it sends: the CLOCK_MONOTONIC send time in nanoseconds (u64 little
endian, bytes 0..7, amqpload's layout, so either tool can time the other's messages) and
(producer id << 48 | sequence) in bytes 8..15. A batch goes out as one memoryview slice.

Parsers walk a receive buffer by offsets with precompiled structs, frame by frame, without
copying: `DeliveryParser` keeps the per-channel content state (method, header, body frames) and
yields counts, delivery tags for the acks and latency samples; `ConfirmParser` turns basic.ack
and basic.nack into a `ConfirmTracker`, which keeps the window and the confirm latency. Any
other method is decoded with the codec and handed to the caller, which treats a close as fatal.
Every frame's end octet is checked (0xCE) before the frame is used.
"""

from __future__ import annotations

from collections import deque
from struct import Struct

from ..amqp import spec
from ..amqp.errors import FrameError
from ..amqp.frames import FRAME_HEADER_SIZE, encode_content, encode_method_frame
from ..amqp.properties import BasicProperties, encode_properties
from ..amqp.spec import FRAME_BODY, FRAME_END, FRAME_HEADER, FRAME_METHOD, decode_method
from .histogram import Histogram

BATCH_BYTES = 32768  # amqpload's --flush-bytes: one send() per batch
BODY_SIZE_MIN = 8  # room for the timestamp
PRODUCER_ID_SHIFT = 48

_FRAME_HEAD = Struct(">BHI")
_U32 = Struct(">I")
_U64 = Struct(">Q")
_CONTENT_HEAD = Struct(">BHIHHQ")  # frame header + class id, weight, body size
_STAMP_TS = Struct("<Q")
_STAMP_TS_SEQ = Struct("<QQ")
_CONFIRM_FIELDS = Struct(">QB")

DELIVER = spec.BasicDeliver.INDEX
ACK = spec.BasicAck.INDEX
NACK = spec.BasicNack.INDEX
CONSUME_OK = spec.BasicConsumeOk.INDEX


class PublishBatch:
    """Up to `count_max` identical publishes in one buffer; `stamp()` readies the first n."""

    def __init__(
        self,
        *,
        channel: int,
        exchange: str,
        routing_key: str,
        body_size: int,
        persistent: bool,
        frame_max: int,
        producer_id: int,
        batch_bytes: int = BATCH_BYTES,
    ) -> None:
        if body_size < BODY_SIZE_MIN:
            raise ValueError(f"body size must be at least {BODY_SIZE_MIN} bytes (the timestamp)")
        method = spec.BasicPublish(exchange=exchange, routing_key=routing_key)
        props_raw = encode_properties(BasicProperties(delivery_mode=2 if persistent else 1))
        one = encode_content(channel, method, props_raw, b"x" * body_size, frame_max)
        header_frame_bytes = FRAME_HEADER_SIZE + 12 + len(props_raw) + 1
        body_offset = len(encode_method_frame(channel, method)) + header_frame_bytes + FRAME_HEADER_SIZE
        assert one[body_offset - FRAME_HEADER_SIZE] == FRAME_BODY, "body frame not where expected"
        assert one[body_offset - FRAME_HEADER_SIZE - 1] == FRAME_END
        self.message_bytes = len(one)
        self.count_max = max(1, batch_bytes // self.message_bytes)
        self.buffer = bytearray(one * self.count_max)
        self.view = memoryview(self.buffer)
        self.body_offsets = [i * self.message_bytes + body_offset for i in range(self.count_max)]
        self.id_bits = producer_id << PRODUCER_ID_SHIFT
        # the first body frame holds at least 8 bytes; the sequence only when it holds 16
        first_body_bytes = min(body_size, frame_max - 8) if frame_max else body_size
        self.with_seq = first_body_bytes >= 16

    def stamp(self, count: int, t_ns: int, seq0: int) -> memoryview:
        """Stamp time and sequence into the first `count` messages and return their bytes."""
        assert 0 < count <= self.count_max
        buf = self.buffer
        offsets = self.body_offsets
        if self.with_seq:
            pack = _STAMP_TS_SEQ.pack_into
            seq = self.id_bits | seq0
            for i in range(count):
                pack(buf, offsets[i], t_ns, seq + i)
        else:
            pack = _STAMP_TS.pack_into
            for i in range(count):
                pack(buf, offsets[i], t_ns)
        return self.view[: count * self.message_bytes]


_ACK_FRAME_FIELDS = 8  # type, channel, size, class, method, delivery tag, bits, end octet
_ACK_TAG_FIELD = 5
_ACK_STRUCTS_MAX = 4096  # frames per pack call; longer lists go in chunks
_ack_structs: dict[int, Struct] = {}


def _ack_struct(count: int) -> Struct:
    s = _ack_structs.get(count)
    if s is None:
        s = _ack_structs[count] = Struct(">" + "BHIHHQBB" * count)
    return s


def encode_acks(channel: int, tags: list[int], multiple: bool) -> bytes:
    """basic.ack frames for `tags`, one write's worth, packed by one C call per chunk: the
    argument list is a template whose tag slots are filled by a slice assignment."""
    bits = 1 if multiple else 0
    parts = []
    for start in range(0, len(tags), _ACK_STRUCTS_MAX):
        chunk = tags[start : start + _ACK_STRUCTS_MAX]
        fields = [FRAME_METHOD, channel, 13, 60, 80, 0, bits, FRAME_END] * len(chunk)
        fields[_ACK_TAG_FIELD::_ACK_FRAME_FIELDS] = chunk
        parts.append(_ack_struct(len(chunk)).pack(*fields))
    return parts[0] if len(parts) == 1 else b"".join(parts)


def acks_for(tags: list[int], multi_ack: int) -> tuple[list[int], bool]:
    """The acks for the deliveries of one read batch: each tag, or every multi_ack-th tag and the
    last one with multiple=true (amqpload's --multi-ack; the remainder is acked per batch)."""
    if multi_ack <= 1:
        return tags, False
    picked = tags[multi_ack - 1 :: multi_ack]
    if len(tags) % multi_ack:
        picked.append(tags[-1])
    return picked, True


def encode_consume(channel: int, queue: str, *, no_ack: bool, consumer_tag: str = "") -> bytes:
    return encode_method_frame(channel, spec.BasicConsume(queue=queue, consumer_tag=consumer_tag, no_ack=no_ack))


def encode_connection_close() -> bytes:
    return encode_method_frame(0, spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))


class DeliveryParser:
    """Deliveries from a consumer's byte stream (one channel), counted as each completes."""

    __slots__ = ("manual_ack", "body_left", "delivery_tag", "first_body", "consumed", "tags", "samples", "methods")

    def __init__(self, *, manual_ack: bool) -> None:
        self.manual_ack = manual_ack
        self.body_left = -1  # -1: no content expected
        self.delivery_tag = 0
        self.first_body = False
        self.consumed = 0
        self.tags: list[int] = []  # delivery tags to ack after this read batch
        self.samples = None  # array('q') of latencies while measuring, else None
        self.methods: list = []  # anything but basic.deliver, decoded

    def parse(self, buf, off: int, end: int, now_ns: int) -> int:
        """Consume every complete frame in buf[off:end]; return the offset of the first incomplete one.

        The common case, a basic.deliver whose content header and single body frame have all
        arrived, is taken in one step (three header reads, three end-octet checks); anything
        else (a body split over frames or over reads, heartbeats, other methods) goes frame by
        frame through the general path."""
        unpack_head = _FRAME_HEAD.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_u64 = _U64.unpack_from
        unpack_ts = _STAMP_TS.unpack_from
        unpack_content = _CONTENT_HEAD.unpack_from
        samples = self.samples
        record = samples.append if samples is not None else None
        tags_append = self.tags.append if self.manual_ack else None
        body_left = self.body_left
        tag = self.delivery_tag
        first_body = self.first_body
        consumed = 0
        while end - off >= 8:
            frame_type, _channel, size = unpack_head(buf, off)
            payload = off + 7
            frame_end = payload + size
            if frame_end >= end:
                break
            if buf[frame_end] != FRAME_END:
                raise FrameError(501, f"frame end octet missing at offset {frame_end}")
            if frame_type == FRAME_METHOD:
                if unpack_u32(buf, payload)[0] != DELIVER:
                    self.methods.append(decode_method(bytes(buf[payload:frame_end])))
                    off = frame_end + 1
                    continue
                tag = unpack_u64(buf, payload + 5 + buf[payload + 4])[0]
                off = frame_end + 1
                # fast path: content header and one whole body frame right behind
                if end - off >= 28:
                    header_type, _c, header_size, _class, _weight, body_size = unpack_content(buf, off)
                    body_at = off + 8 + header_size
                    if header_type == FRAME_HEADER and end - body_at >= 8 and body_size:
                        body_type, _c, body_frame_size = unpack_head(buf, body_at)
                        body_end = body_at + 7 + body_frame_size
                        if body_type == FRAME_BODY and body_frame_size == body_size and body_end < end:
                            if buf[body_at - 1] != FRAME_END or buf[body_end] != FRAME_END:
                                raise FrameError(501, f"frame end octet missing near offset {body_at}")
                            if record is not None and body_size >= 8:
                                record(now_ns - unpack_ts(buf, body_at + 7)[0])
                            consumed += 1
                            if tags_append is not None:
                                tags_append(tag)
                            off = body_end + 1
                continue
            if frame_type == FRAME_BODY:
                if first_body:
                    first_body = False
                    if record is not None and size >= 8:
                        record(now_ns - unpack_ts(buf, payload)[0])
                body_left -= size
                if body_left == 0:
                    consumed += 1
                    body_left = -1
                    if tags_append is not None:
                        tags_append(tag)
                elif body_left < 0:
                    raise FrameError(505, "body frame beyond the announced body size")
            elif frame_type == FRAME_HEADER:
                body_left = unpack_u64(buf, payload + 4)[0]
                first_body = True
                if body_left == 0:
                    consumed += 1
                    body_left = -1
                    if tags_append is not None:
                        tags_append(tag)
            # heartbeat frames (8) carry nothing
            off = frame_end + 1
        self.body_left = body_left
        self.delivery_tag = tag
        self.first_body = first_body
        self.consumed += consumed
        return off


class ConfirmTracker:
    """Publisher confirms of one channel: the window, nacks and confirm latency.

    Delivery tags are 1, 2, 3, ... in publish order (spec: confirm.select). `confirmed` counts acks
    and nacks alike (both end a message's wait). Latency is recorded per batch: every message of
    a batch was stamped and written at the same instant."""

    __slots__ = ("published", "watermark", "ahead", "nacked", "batches", "histogram", "measuring")

    def __init__(self) -> None:
        self.published = 0  # highest delivery tag used
        self.watermark = 0  # every tag <= watermark is confirmed
        self.ahead: set[int] = set()  # single confirms above the watermark (out of order)
        self.nacked = 0
        self.batches: deque = deque()  # [first tag, last tag, sent ns, measured]
        self.histogram = Histogram()
        self.measuring = False

    @property
    def confirmed(self) -> int:
        return self.watermark + len(self.ahead)

    @property
    def outstanding(self) -> int:
        return self.published - self.confirmed

    def sent(self, count: int, t_ns: int) -> None:
        first = self.published + 1
        self.published += count
        self.batches.append([first, self.published, t_ns, self.measuring])

    def on_confirm(self, tag: int, multiple: bool, nack: bool, now_ns: int) -> None:
        if tag > self.published or tag <= self.watermark:
            return  # a duplicate, or a confirm for a tag never used: ignore, as amqpload does
        if multiple:
            if nack:
                self.nacked += tag - self.watermark - sum(1 for t in self.ahead if t <= tag)
            if self.ahead:
                self.ahead = {t for t in self.ahead if t > tag}
            self.watermark = tag
        else:
            if nack:
                self.nacked += 1
            if tag == self.watermark + 1:
                self.watermark = tag
            else:
                self.ahead.add(tag)
        ahead = self.ahead
        while ahead and self.watermark + 1 in ahead:
            ahead.discard(self.watermark + 1)
            self.watermark += 1
        self._retire(now_ns)

    def _retire(self, now_ns: int) -> None:
        batches = self.batches
        watermark = self.watermark
        while batches and batches[0][0] <= watermark:
            batch = batches[0]
            first, last, t_ns, measured = batch
            done_to = last if last <= watermark else watermark
            if measured:
                self.histogram.add(now_ns - t_ns, done_to - first + 1)
            if done_to == last:
                batches.popleft()
            else:
                batch[0] = done_to + 1


class ConfirmParser:
    """A producer's inbound stream: confirms into the tracker, anything else decoded."""

    __slots__ = ("tracker", "methods")

    def __init__(self, tracker: ConfirmTracker) -> None:
        self.tracker = tracker
        self.methods: list = []

    def parse(self, buf, off: int, end: int, now_ns: int) -> int:
        unpack_head = _FRAME_HEAD.unpack_from
        unpack_u32 = _U32.unpack_from
        unpack_confirm = _CONFIRM_FIELDS.unpack_from
        on_confirm = self.tracker.on_confirm
        while end - off >= 8:
            frame_type, _channel, size = unpack_head(buf, off)
            payload = off + 7
            frame_end = payload + size
            if frame_end >= end:
                break
            if buf[frame_end] != FRAME_END:
                raise FrameError(501, f"frame end octet missing at offset {frame_end}")
            if frame_type == FRAME_METHOD:
                index = unpack_u32(buf, payload)[0]
                if index == ACK or index == NACK:  # noqa: SIM109 - per confirm: `in (ACK, NACK)` builds a tuple each time
                    tag, bits = unpack_confirm(buf, payload + 4)
                    on_confirm(tag, bool(bits & 1), index == NACK, now_ns)
                else:
                    self.methods.append(decode_method(bytes(buf[payload:frame_end])))
            off = frame_end + 1
        return off
