"""The publish fast path (`ServerConnection._publish_whole`, fed by the reader's PUBLISH_TRIPLE items)
decides exactly as the general one.

A frame only takes the fast path when its whole publish (method, header, body) arrived in the
same read, so feeding the same bytes one frame per read always takes the general path: the
two must give the same events, the same bytes back to the peer and the same final state, for
well-formed publishes and for every kind of broken one mixed in.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxq_raft.amqp import spec
from maxq_raft.amqp.events import ContentReceived, PublishesReceived
from maxq_raft.amqp.frames import FrameReader, encode_content, encode_frame, encode_method_frame
from maxq_raft.amqp.properties import BasicProperties, encode_content_header, encode_properties

from .test_connection import PROPS, open_channel, open_peer

MAX_MESSAGE = 64


def publish(channel: int, body: bytes, routing_key: str = "q", props: bytes = PROPS, mandatory: bool = False) -> bytes:
    return encode_content(
        channel, spec.BasicPublish(exchange="", routing_key=routing_key, mandatory=mandatory), props, body, 131072
    )


def split_frames(data: bytes) -> list[bytes]:
    reader = FrameReader(0)
    reader.feed(data)
    return [encode_frame(t, c, bytes(p)) for t, c, p in reader.read_frames()]


def assembled(ch: int, declared_size: int, props: bytes, *after: bytes, class_id: int = 60) -> bytes:
    """basic.publish, a content header (class, declared body size, properties), then `after`."""
    return b"".join(
        (
            encode_method_frame(ch, spec.BasicPublish(exchange="", routing_key="q")),
            encode_frame(spec.FRAME_HEADER, ch, encode_content_header(class_id, declared_size, props)),
            *after,
        )
    )


# Pieces of a stream: good publishes and the ways a publish can go wrong.
PIECES = {
    "publish": lambda ch: publish(ch, b"body"),
    "publish-empty-body": lambda ch: publish(ch, b""),
    "publish-other-key": lambda ch: publish(ch, b"x" * 10, routing_key="other", mandatory=True),
    "publish-two-body-frames": lambda ch: assembled(
        ch, 6, PROPS, encode_frame(spec.FRAME_BODY, ch, b"abc"), encode_frame(spec.FRAME_BODY, ch, b"def")
    ),
    "publish-too-big": lambda ch: publish(ch, b"y" * (MAX_MESSAGE + 1)),
    "publish-on-unopened-channel": lambda ch: publish(9, b"body"),
    "header-of-other-class": lambda ch: assembled(
        ch, 4, PROPS, encode_frame(spec.FRAME_BODY, ch, b"body"), class_id=50
    ),
    "header-without-flags": lambda ch: assembled(ch, 4, b"", encode_frame(spec.FRAME_BODY, ch, b"body")),
    "body-longer-than-header-says": lambda ch: assembled(ch, 2, PROPS, encode_frame(spec.FRAME_BODY, ch, b"body")),
    "method-instead-of-body": lambda ch: assembled(
        ch, 4, PROPS, encode_method_frame(ch, spec.BasicQos(prefetch_count=1))
    ),
    "malformed-publish-method": lambda ch: b"".join(
        (
            encode_frame(spec.FRAME_METHOD, ch, b"\x00\x3c\x00\x28\x00\x00\x05ab"),
            encode_frame(spec.FRAME_HEADER, ch, encode_content_header(60, 4, PROPS)),
            encode_frame(spec.FRAME_BODY, ch, b"body"),
        )
    ),
    "immediate-publish": lambda ch: encode_content(
        ch, spec.BasicPublish(routing_key="q", immediate=True), PROPS, b"b", 131072
    ),
    "headers-properties": lambda ch: publish(
        ch, b"h", props=encode_properties(BasicProperties(headers={"k": 1}, delivery_mode=1))
    ),
    "header-on-another-channel": lambda ch: b"".join(
        (
            encode_method_frame(ch, spec.BasicPublish(exchange="", routing_key="q")),
            encode_frame(spec.FRAME_HEADER, 3 - ch, encode_content_header(60, 4, PROPS)),
            encode_frame(spec.FRAME_BODY, ch, b"body"),
        )
    ),
    "body-on-another-channel": lambda ch: assembled(ch, 4, PROPS, encode_frame(spec.FRAME_BODY, 3 - ch, b"body")),
    "publish-on-channel-zero": lambda ch: publish(0, b"body"),
    "empty-body-then-a-body-frame": lambda ch: assembled(ch, 0, PROPS, encode_frame(spec.FRAME_BODY, ch, b"body")),
    "ack": lambda ch: encode_method_frame(ch, spec.BasicAck(delivery_tag=1)),
    "channel-close": lambda ch: encode_method_frame(ch, spec.ChannelClose(reply_code=200, reply_text="bye")),
}


def run(data: bytes, per_frame: bool, publish_runs: bool = False) -> tuple[list, bytes, str]:
    peer = open_peer(max_message_size_bytes=MAX_MESSAGE, publish_runs=publish_runs)
    open_channel(peer, 1)
    open_channel(peer, 2)
    events: list = []
    for chunk in split_frames(data) if per_frame else [data]:
        peer.conn.receive_data(chunk, 0.0)
        events += peer.conn.next_events()
    return events, peer.conn.data_to_send(0.0), peer.conn.state.name


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(sorted(PIECES)), st.sampled_from([1, 2])), min_size=1, max_size=12))
def test_fast_path_decides_as_the_general_path(pieces):
    data = b"".join(PIECES[name](channel) for name, channel in pieces)
    assert run(data, per_frame=False) == run(data, per_frame=True)


def test_a_read_of_publishes_takes_the_fast_path_and_gives_every_message():
    peer = open_peer()
    open_channel(peer, 1)
    data = b"".join(publish(1, b"m%d" % i) for i in range(100))
    peer.conn.receive_data(data, 0.0)
    events = peer.conn.next_events()
    assert [type(e) for e in events] == [ContentReceived] * 100
    assert [e.body for e in events] == [b"m%d" % i for i in range(100)]
    assert {e.props_raw for e in events} == {PROPS}
    assert all(e.method.routing_key == "q" and e.method.exchange == "" for e in events)
    assert len(peer.conn._publish_methods) == 1  # decoded once for the connection, then reused


def test_a_publish_split_across_reads_is_assembled():
    whole = publish(1, b"hello")
    for cut in range(1, len(whole)):
        peer = open_peer()
        open_channel(peer, 1)
        peer.conn.receive_data(whole[:cut], 0.0)
        events = peer.conn.next_events()
        peer.conn.receive_data(whole[cut:], 0.0)
        events += peer.conn.next_events()
        assert [(type(e), e.body, e.props_raw, e.method.routing_key) for e in events] == [
            (ContentReceived, b"hello", PROPS, "q")
        ], cut


def unfolded(events: list) -> list:
    """Each PublishesReceived as the ContentReceived of each of its bodies."""
    out: list = []
    for e in events:
        if type(e) is PublishesReceived:
            out += [ContentReceived(e.channel, e.method, e.props_raw, body) for body in e.bodies]
        else:
            out.append(e)
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(sorted(PIECES)), st.sampled_from([1, 2])), min_size=1, max_size=12))
def test_runs_of_publishes_are_the_same_publishes_in_the_same_order(pieces):
    data = b"".join(PIECES[name](channel) for name, channel in pieces)
    events, sent, state = run(data, per_frame=False, publish_runs=True)
    assert (unfolded(events), sent, state) == run(data, per_frame=False)
    for before, after in itertools.pairwise(events):  # a run goes as far as the publishes are alike
        assert not (
            type(before) is PublishesReceived
            and type(after) is PublishesReceived
            and (before.channel, before.method, before.props_raw) == (after.channel, after.method, after.props_raw)
        )


def test_a_run_ends_where_the_channel_method_or_properties_change():
    peer = open_peer(publish_runs=True)
    open_channel(peer, 1)
    open_channel(peer, 2)
    other_props = encode_properties(BasicProperties(delivery_mode=1))
    data = b"".join(
        (
            publish(1, b"a"),
            publish(1, b"b"),
            publish(2, b"c"),
            publish(1, b"d", routing_key="r"),
            publish(1, b"e", routing_key="r", props=other_props),
            publish(1, b"f", routing_key="r", props=other_props),
            encode_method_frame(1, spec.BasicQos(prefetch_count=1)),
            publish(1, b"g", routing_key="r", props=other_props),
        )
    )
    peer.conn.receive_data(data, 0.0)
    events = peer.conn.next_events()
    runs = [
        (e.channel, e.method.routing_key, e.props_raw, e.bodies) if type(e) is PublishesReceived else type(e).__name__
        for e in events
    ]
    assert runs == [
        (1, "q", PROPS, [b"a", b"b"]),
        (2, "q", PROPS, [b"c"]),
        (1, "r", PROPS, [b"d"]),
        (1, "r", other_props, [b"e", b"f"]),
        "MethodReceived",
        (1, "r", other_props, [b"g"]),
    ]
