"""Framing: the incremental reader on arbitrarily split streams, its 501 errors, and
encode_content's body splitting at exactly frame_max."""

import pamqp.frame
import pamqp.heartbeat
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from maxq_raft.amqp import spec
from maxq_raft.amqp.errors import FrameError
from maxq_raft.amqp.frames import (
    COPY_PAYLOAD_BYTES_MAX,
    HEARTBEAT_FRAME,
    PROTOCOL_HEADER,
    PUBLISH_RUN,
    PUBLISH_TRIPLE,
    FrameReader,
    encode_content,
    encode_frame,
    encode_method_frame,
    unfold_publish,
    unfold_publish_run,
)
from maxq_raft.amqp.properties import BasicProperties, decode_content_header, encode_properties

frames = st.lists(
    st.tuples(st.sampled_from([1, 2, 3, 8]), st.integers(0, 65535), st.binary(max_size=300)),
    max_size=20,
)


def read_all(reader: FrameReader, pieces) -> list[tuple[int, int, bytes]]:
    out = []
    for piece in pieces:
        reader.feed(piece)
        out += [(t, ch, bytes(p)) for t, ch, p in reader.read_frames()]
    return out


@settings(max_examples=150, deadline=None)
@given(frames, st.data())
def test_split_stream_yields_the_same_frames(expected, data):
    stream = b"".join(encode_frame(t, ch, p) for t, ch, p in expected)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert read_all(FrameReader(4096), pieces) == expected
    # byte by byte as well, fed as bytearrays (a receive buffer)
    assert read_all(FrameReader(0), [bytearray(stream[i : i + 1]) for i in range(len(stream))]) == expected


def test_many_frames_in_one_read_small_ones_copied_large_ones_views_of_one_buffer():
    big = COPY_PAYLOAD_BYTES_MAX + 1
    sizes = [10, big, 10, big + 5]
    stream = b"".join(encode_frame(3, 1, bytes([i]) * n) for i, n in enumerate(sizes)) + b"\x03\x00"
    reader = FrameReader(0)
    reader.feed(stream)
    got = reader.read_frames()
    assert [bytes(p) for _, _, p in got] == [bytes([i]) * n for i, n in enumerate(sizes)]
    assert [type(p) for _, _, p in got] == [bytes, memoryview, bytes, memoryview]
    assert got[1][2].obj is got[3][2].obj
    assert reader.read_frames() == []  # the two-byte partial header stays buffered
    reader.feed(b"\x01\x00\x00\x00\x01z\xce")
    assert [(t, ch, bytes(p)) for t, ch, p in reader.read_frames()] == [(3, 1, b"z")]


def test_fed_buffers_may_be_reused_by_the_caller():
    buffer = bytearray(encode_frame(3, 1, b"hello"))
    reader = FrameReader(4096)
    reader.feed(buffer)
    [(_, _, payload)] = reader.read_frames()
    buffer[8:13] = b"XXXXX"
    assert bytes(payload) == b"hello"


def test_bad_frame_end():
    reader = FrameReader(4096)
    reader.feed(encode_frame(1, 0, b"abc")[:-1] + b"\x00")
    with pytest.raises(FrameError) as info:
        reader.read_frames()
    assert info.value.reply_code == spec.FRAME_ERROR == 501
    assert "frame end marker missing" in info.value.reply_text


def test_oversize_frame_is_detected_from_the_header_alone():
    reader = FrameReader(131072)
    reader.feed(b"\x03\x00\x01" + (200000 - 8).to_bytes(4, "big"))  # 7 header bytes, no body
    with pytest.raises(FrameError) as info:
        reader.read_frames()
    assert info.value.reply_code == 501
    assert info.value.reply_text == "frame size 200000 exceeds frame_max 131072"


def test_frame_max_boundary_and_retuning():
    reader = FrameReader(4096)
    exact = encode_frame(3, 1, b"x" * (4096 - 8))
    reader.feed(exact)
    assert len(reader.read_frames()) == 1
    reader.feed(encode_frame(3, 1, b"x" * (4096 - 7)))
    with pytest.raises(FrameError):
        reader.read_frames()
    # frame_max is raised after connection.tune-ok; 0 means no limit
    reader = FrameReader(4096)
    reader.frame_max = 0
    reader.feed(encode_frame(3, 1, b"x" * 10000))
    assert bytes(reader.read_frames()[0][2]) == b"x" * 10000


def test_unknown_frame_type():
    reader = FrameReader(4096)
    reader.feed(b"\x05\x00\x00\x00\x00\x00\x00")
    with pytest.raises(FrameError) as info:
        reader.read_frames()
    assert info.value.reply_code == 501
    assert info.value.reply_text == "unknown frame type 5"


def test_constants_and_simple_encoders_match_pamqp():
    assert PROTOCOL_HEADER == b"AMQP\x00\x00\x09\x01"
    assert HEARTBEAT_FRAME == pamqp.frame.marshal(pamqp.heartbeat.Heartbeat(), 0) == b"\x08\x00\x00\x00\x00\x00\x00\xce"
    method = spec.BasicAck(delivery_tag=9, multiple=True)
    assert encode_method_frame(3, method) == encode_frame(1, 3, method.encode())
    _, channel, theirs = pamqp.frame.unmarshal(encode_method_frame(3, method))
    assert (channel, theirs.delivery_tag, theirs.multiple) == (3, 9, True)


FRAME_MAX = 4096
CHUNK = FRAME_MAX - 8


@pytest.mark.parametrize("body_size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 2 * CHUNK + 1, 1_000_000])
def test_encode_content_splits_bodies_at_frame_max(body_size):
    body = bytes(i % 251 for i in range(body_size))
    method = spec.BasicDeliver(consumer_tag="c", delivery_tag=1, exchange="e", routing_key="r")
    props_raw = encode_properties(BasicProperties(content_type="application/octet-stream"))
    wire = encode_content(5, method, props_raw, body, FRAME_MAX)
    reader = FrameReader(FRAME_MAX)  # also proves no frame exceeds frame_max
    reader.feed(wire)
    got = [(t, ch, bytes(p)) for t, ch, p in reader.read_frames()]
    assert all(ch == 5 for _, ch, _ in got)
    (t1, _, m), (t2, _, h), *bodies = got
    assert (t1, t2) == (1, 2)
    assert spec.decode_method(m) == method
    assert decode_content_header(h) == (60, body_size, props_raw)
    assert all(t == 3 for t, _, _ in bodies)
    assert len(bodies) == -(-body_size // CHUNK)  # no body frame at all for an empty body
    assert all(len(p) == CHUNK for _, _, p in bodies[:-1])
    assert b"".join(p for _, _, p in bodies) == body


def test_encode_content_unlimited_and_invalid_frame_max():
    method = spec.BasicPublish(exchange="x")
    wire = encode_content(1, method, b"\x00\x00", b"y" * 100000, 0)
    reader = FrameReader(0)
    reader.feed(wire)
    assert [t for t, _, _ in reader.read_frames()] == [1, 2, 3]
    with pytest.raises(ValueError):
        encode_content(1, method, b"\x00\x00", b"y", 8)
    # A content header larger than frame_max is one frame anyway (RabbitMQ's generator splits
    # only the body): method, header, and body frames of at most frame_max.
    props = b"\x20\x00" + b"\x00" * 5000
    reader = FrameReader(0)
    reader.feed(encode_content(1, method, props, b"z" * 9000, 4096))
    frames = list(reader.read_frames())
    assert [t for t, _, _ in frames] == [1, 2, 3, 3, 3]
    assert len(frames[1][2]) == 12 + len(props) and all(len(p) <= 4096 - 8 for _, _, p in frames[2:])


@given(
    st.integers(1, 65535),
    st.text(max_size=40),
    st.integers(0, 2**64 - 1),
    st.booleans(),
    st.text(max_size=30),
    st.text(max_size=60),
    st.binary(max_size=40),
    st.binary(max_size=9000),
    st.sampled_from([0, 4096, 131072]),
)
def test_encode_delivery_matches_the_general_encoder(
    channel, tag, delivery_tag, redelivered, exchange, routing_key, props_raw, body, frame_max
):
    from maxq_raft.amqp.frames import encode_delivery, encode_shortstr_field
    from maxq_raft.amqp.spec import BasicDeliver

    assume(all(len(s.encode()) <= 255 for s in (tag, exchange, routing_key)))
    expected = encode_content(
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
    got = encode_delivery(
        channel,
        encode_shortstr_field(tag),
        delivery_tag,
        redelivered,
        encode_shortstr_field(exchange) + encode_shortstr_field(routing_key),
        props_raw,
        body,
        frame_max,
    )
    assert got == expected


@settings(deadline=None)  # (a slow example under load is not a failure)
@given(
    st.integers(1, 65535),
    st.text(max_size=40),
    st.integers(0, 2**63),
    st.lists(
        st.tuples(
            st.sampled_from(["", "amq.direct", "x" * 200]),
            st.text(max_size=20),
            st.binary(max_size=40),
            st.binary(max_size=5000),
            st.booleans(),
        ),
        max_size=6,
    ),
    st.sampled_from([0, 4096, 131072]),
)
def test_encode_deliveries_writes_each_delivery_as_encode_delivery_with_consecutive_tags(
    channel, tag, first_delivery_tag, messages, frame_max
):
    from maxq_raft.amqp.frames import encode_deliveries, encode_delivery, encode_shortstr_field

    assume(all(len(s.encode()) <= 255 for s in [tag] + [m[1] for m in messages]))
    tag_field = encode_shortstr_field(tag)
    deliveries = [
        (encode_shortstr_field(exchange) + encode_shortstr_field(routing_key), props_raw, body, redelivered)
        for exchange, routing_key, props_raw, body, redelivered in messages
    ]
    expected = b"".join(
        encode_delivery(channel, tag_field, first_delivery_tag + i, redelivered, routing, props_raw, body, frame_max)
        for i, (routing, props_raw, body, redelivered) in enumerate(deliveries)
    )
    assert encode_deliveries(channel, tag_field, first_delivery_tag, deliveries, frame_max) == expected


# Pieces of a stream for the reader's fused publishes: whole publishes and near misses.
_PUBLISH = encode_method_frame(1, spec.BasicPublish(exchange="", routing_key="q"))[7:-1]
_PROPS = encode_properties(BasicProperties(delivery_mode=2))


def _header(size: int, class_id: int = 60, props: bytes = _PROPS) -> bytes:
    return class_id.to_bytes(2, "big") + b"\0\0" + size.to_bytes(8, "big") + props


FUSE_PIECES = {
    "publish": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(3)), (3, ch, b"abc")],
    "publish-empty": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(0))],
    "two-body-frames": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(4)), (3, ch, b"ab"), (3, ch, b"cd")],
    "body-too-short": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(4)), (3, ch, b"abc")],
    "header-other-channel": lambda ch: [(1, ch, _PUBLISH), (2, ch + 1, _header(1)), (3, ch, b"a")],
    "body-other-channel": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(1)), (3, ch + 1, b"a")],
    "header-other-class": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(1, class_id=50)), (3, ch, b"a")],
    "header-without-flags": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(1)[:12]), (3, ch, b"a")],
    "publish-then-method": lambda ch: [(1, ch, _PUBLISH), (2, ch, _header(1)), (1, ch, _PUBLISH)],
    "publish-alone": lambda ch: [(1, ch, _PUBLISH)],
    "heartbeat": lambda ch: [(8, 0, b"")],
    "ack": lambda ch: [(1, ch, encode_method_frame(ch, spec.BasicAck(delivery_tag=1))[7:-1])],
}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(sorted(FUSE_PIECES)), st.sampled_from([0, 1, 2])), max_size=12),
    st.data(),
)
def test_fused_publishes_unfold_to_the_frames_of_the_general_reader(pieces, data):
    expected = [frame for name, channel in pieces for frame in FUSE_PIECES[name](channel)]
    stream = b"".join(encode_frame(t, ch, p) for t, ch, p in expected)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=4)))
    reader = FrameReader(4096)
    got: list = []
    fused = 0
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        reader.feed(stream[a:b])
        for frame_type, channel, payload in reader.read_frames(fuse_publishes=True):
            if frame_type == PUBLISH_TRIPLE:
                fused += 1
                got += unfold_publish(channel, payload)
            elif frame_type == PUBLISH_RUN:
                assert len(payload[2]) > 1 and len({len(body) for body in payload[2]}) == 1
                fused += len(payload[2])
                got += unfold_publish_run(channel, payload)
            else:
                got.append((frame_type, channel, bytes(payload)))
    assert got == expected
    if not cuts:  # one read: every whole publish on a channel other than 0 is one item
        assert fused == sum(1 for name, channel in pieces if name in ("publish", "publish-empty") and channel)


def test_a_fused_publish_is_method_header_and_body_bytes():
    stream = encode_content(1, spec.BasicPublish(exchange="x", routing_key="k"), _PROPS, b"body", 131072)
    reader = FrameReader(131072)
    reader.feed(stream)
    [(frame_type, channel, (method, header, body))] = reader.read_frames(fuse_publishes=True)
    assert (frame_type, channel, body) == (PUBLISH_TRIPLE, 1, b"body")
    assert spec.decode_method(method) == spec.BasicPublish(exchange="x", routing_key="k")
    assert header == _header(4)
    reader.feed(stream)
    assert [t for t, _, _ in reader.read_frames()] == [1, 2, 3]  # (not fused unless asked)


def test_alike_publishes_are_one_run_until_anything_else_comes():
    def whole(body: bytes, channel: int = 1) -> bytes:
        return encode_content(channel, spec.BasicPublish(exchange="x", routing_key="k"), _PROPS, body, 131072)

    heartbeat = encode_frame(spec.FRAME_HEARTBEAT, 0, b"")
    last = whole(b"k", 2)
    stream = b"".join(
        [whole(b"a"), whole(b"b"), whole(b"c"), heartbeat, whole(b"d"), whole(b"e"), whole(b"fg"), whole(b"i", 2)]
        + [whole(b"j", 2), last[:-2]]
    )
    reader = FrameReader(131072)
    reader.feed(stream)
    items = [
        (t, ch, payload[2]) if t in (PUBLISH_RUN, PUBLISH_TRIPLE) else (t, ch)
        for t, ch, payload in reader.read_frames(fuse_publishes=True)
    ]
    assert items == [
        (PUBLISH_RUN, 1, [b"a", b"b", b"c"]),
        (spec.FRAME_HEARTBEAT, 0),
        (PUBLISH_RUN, 1, [b"d", b"e"]),
        (PUBLISH_TRIPLE, 1, b"fg"),  # (another size: other header bytes)
        (PUBLISH_RUN, 2, [b"i", b"j"]),
    ]
    reader.feed(last[-2:])  # the rest of a publish that began like the run before it: its body
    assert [(t, payload[2]) for t, _, payload in reader.read_frames(fuse_publishes=True)] == [(PUBLISH_TRIPLE, b"k")]


def test_a_fused_publish_respects_frame_max():
    reader = FrameReader(64)  # a body frame of 60 bytes is larger than frame_max allows
    reader.feed(encode_frame(1, 1, _PUBLISH) + encode_frame(2, 1, _header(60)) + encode_frame(3, 1, b"x" * 60))
    assert [t for t, _, _ in reader.read_frames(fuse_publishes=True)] == [1, 2]  # (the frames before it)
    with pytest.raises(FrameError, match="exceeds frame_max 64"):
        reader.read_frames(fuse_publishes=True)
