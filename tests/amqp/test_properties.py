"""Basic properties and content headers: round trips of any subset of the 14 properties,
agreement with pamqp's Basic.Properties, and strict decoding."""

import datetime
import struct
from decimal import Decimal

import pamqp.commands
import pamqp.header
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxq_raft.amqp import spec
from maxq_raft.amqp.errors import DecodeError
from maxq_raft.amqp.properties import (
    BasicProperties,
    decode_content_header,
    decode_properties,
    encode_content_header,
    encode_properties,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

shortstrs = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
# header values whose table mapping pamqp shares (see test_values.py)
header_values = st.recursive(
    st.one_of(
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.text(max_size=20),
        st.builds(lambda m, s: Decimal(m).scaleb(-s), st.integers(-(2**31), 2**31 - 1), st.integers(0, 9)),
        st.none(),
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8,
)
headers = st.dictionaries(st.text(max_size=16), header_values, max_size=5)


def props_strategy(pamqp_compatible: bool):
    """Each property absent (None) or present. pamqp treats "" as absent, only accepts
    delivery_mode 1 or 2, insists that cluster_id is empty, and reads timestamps above
    0xFFFFFFFF as milliseconds; so its variant avoids those."""
    text = shortstrs.filter(bool) if pamqp_compatible else shortstrs
    fields = {name: st.none() | text for name, wire, _ in spec.BASIC_PROPERTIES if wire == "shortstr"}
    fields["headers"] = st.none() | headers
    fields["delivery_mode"] = st.none() | (st.sampled_from([1, 2]) if pamqp_compatible else st.integers(0, 255))
    fields["priority"] = st.none() | st.integers(0, 255)
    fields["timestamp"] = st.none() | st.integers(0, 0xFFFFFFFF if pamqp_compatible else 2**64 - 1)
    if pamqp_compatible:
        fields["cluster_id"] = st.none()
    return st.fixed_dictionaries(fields).map(lambda kwargs: BasicProperties(**kwargs))


def to_pamqp(props: BasicProperties) -> pamqp.commands.Basic.Properties:
    kwargs = {name: getattr(props, name) for name in BasicProperties.__slots__}
    kwargs["message_type"] = kwargs.pop("type")
    if kwargs["timestamp"] is not None:
        kwargs["timestamp"] = datetime.datetime.fromtimestamp(kwargs["timestamp"], tz=datetime.UTC)
    if kwargs["cluster_id"] is None:
        kwargs["cluster_id"] = ""
    return pamqp.commands.Basic.Properties(**kwargs)


def from_pamqp(theirs) -> BasicProperties:
    kwargs = {name: getattr(theirs, name, None) for name in BasicProperties.__slots__ if name != "type"}
    kwargs["type"] = theirs.message_type
    if kwargs["timestamp"] is not None:
        kwargs["timestamp"] = int(kwargs["timestamp"].timestamp())
    if kwargs["cluster_id"] == "":
        kwargs["cluster_id"] = None
    return BasicProperties(**kwargs)


@SETTINGS
@given(props_strategy(pamqp_compatible=False))
def test_round_trip(props):
    raw = encode_properties(props)
    assert decode_properties(raw) == props
    assert decode_properties(memoryview(b"\x00" + raw)[1:]) == props
    flags = struct.unpack_from(">H", raw)[0]
    expected_flags = sum(bit for name, _, bit in spec.BASIC_PROPERTIES if getattr(props, name) is not None)
    assert flags == expected_flags


@SETTINGS
@given(props_strategy(pamqp_compatible=True), st.integers(0, 2**63 - 1))
def test_pamqp_agrees(props, body_size):
    raw = encode_properties(props)
    # pamqp decodes our content header payload to the same properties
    theirs = pamqp.header.ContentHeader()
    theirs.unmarshal(encode_content_header(60, body_size, raw))
    assert theirs.body_size == body_size
    assert from_pamqp(theirs.properties) == props
    # we decode pamqp's content header payload to ours
    their_payload = pamqp.header.ContentHeader(body_size=body_size, properties=to_pamqp(props)).marshal()
    class_id, size, their_raw = decode_content_header(their_payload)
    assert (class_id, size) == (60, body_size)
    assert decode_properties(their_raw) == props
    if not props.headers:  # pamqp sorts header keys and narrows integers
        assert their_raw == raw


def test_byte_exact_example():
    props = BasicProperties(content_type="text/plain", delivery_mode=2, timestamp=1, cluster_id="")
    assert encode_properties(props) == (
        b"\x90\x44"  # content_type 0x8000 | delivery_mode 0x1000 | timestamp 0x40 | cluster 0x04
        b"\x0atext/plain\x02\x00\x00\x00\x00\x00\x00\x00\x01\x00"
    )
    assert encode_properties(BasicProperties()) == b"\x00\x00"
    assert decode_properties(b"\x00\x00") == BasicProperties()
    # an empty table is present, None is absent
    assert encode_properties(BasicProperties(headers={})) == b"\x20\x00\x00\x00\x00\x00"


def test_flag_words():
    # a continuation word without property bits is accepted (spec 4.2.6.1)
    assert decode_properties(b"\x80\x01\x00\x00\x01a") == BasicProperties(content_type="a")
    # property bits beyond the 14 that basic defines cannot be decoded
    with pytest.raises(DecodeError):
        decode_properties(b"\x00\x01\x80\x00")
    # bit 1 has no property: ignored like RabbitMQ does
    assert decode_properties(b"\x00\x02") == BasicProperties()


@settings(max_examples=50, deadline=None)
@given(props_strategy(pamqp_compatible=False))
def test_truncated_and_extended_property_lists_are_rejected(props):
    raw = encode_properties(props)
    for cut in range(len(raw)):
        try:
            decoded = decode_properties(raw[:cut])
        except DecodeError as exc:
            assert exc.reply_code == 502
        else:  # a prefix can only parse if it drops nothing but trailing absent fields
            pytest.fail(f"prefix {raw[:cut]!r} decoded to {decoded!r}")
    with pytest.raises(DecodeError):
        decode_properties(raw + b"\x00")


def test_invalid_values_are_rejected():
    with pytest.raises(DecodeError):
        decode_properties(b"\x80\x00\x01\xff")  # content_type is not UTF-8
    with pytest.raises(DecodeError):
        decode_properties(b"\x20\x00\x00\x00\x00\x03\x01kZ")  # headers with an unknown tag
    with pytest.raises(ValueError):
        encode_properties(BasicProperties(delivery_mode=256))
    with pytest.raises(ValueError):
        encode_properties(BasicProperties(message_id="x" * 256))


def test_content_header():
    payload = encode_content_header(60, 2**40, b"\x00\x00")
    assert payload == b"\x00\x3c\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"
    assert decode_content_header(payload) == (60, 2**40, b"\x00\x00")
    assert decode_content_header(memoryview(payload)) == (60, 2**40, b"\x00\x00")
    for cut in range(14):
        with pytest.raises(DecodeError) as info:
            decode_content_header(payload[:cut])
        assert info.value.reply_code == 502


def test_equality_and_repr():
    assert BasicProperties(priority=1) != BasicProperties(priority=2)
    assert BasicProperties(headers={}) != BasicProperties()
    assert repr(BasicProperties(priority=1)) == "BasicProperties(priority=1)"


@given(
    st.builds(
        BasicProperties,
        content_type=st.none() | st.text(max_size=20),
        content_encoding=st.none() | st.text(max_size=20),
        headers=st.none() | st.dictionaries(st.text(max_size=10), st.integers(-5, 5), max_size=3),
        delivery_mode=st.none() | st.integers(1, 2),
        priority=st.none() | st.integers(0, 9),
    )
)
def test_delivery_mode_of_matches_full_decode(props):
    from maxq_raft.amqp.properties import delivery_mode_of

    assert delivery_mode_of(encode_properties(props)) == (props.delivery_mode or 0)
