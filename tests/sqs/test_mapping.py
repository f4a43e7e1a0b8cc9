"""SQS message attributes <-> AMQP headers, and queue attributes <-> queue arguments (sqs/mapping.py)."""

from __future__ import annotations

from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.amqp.values import decode_table, encode_table
from maxq_raft.sqs import mapping
from maxq_raft.sqs.digests import md5_of_attributes

ATTRIBUTE_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9_-]{0,20}", fullmatch=True)
ATTRIBUTES = st.dictionaries(
    ATTRIBUTE_NAMES,
    st.one_of(
        st.builds(lambda s: {"DataType": "String", "StringValue": s}, st.text("abcé ✓", min_size=1, max_size=8)),
        st.builds(lambda t, s: {"DataType": t, "StringValue": s}, st.just("String.custom"), st.just("x")),
        st.builds(lambda n: {"DataType": "Number", "StringValue": str(n)}, st.integers(-(2**70), 2**70)),
        st.builds(lambda n: {"DataType": "Number.float", "StringValue": str(n)}, st.integers(-99, 99)),
        st.builds(lambda n: {"DataType": "Number", "StringValue": f"{n}.5"}, st.integers(-99, 99)),
        st.builds(lambda b: {"DataType": "Binary", "BinaryValue": b}, st.binary(min_size=1, max_size=8)),
        st.builds(lambda b: {"DataType": "Binary.img", "BinaryValue": b}, st.binary(min_size=1, max_size=8)),
    ),
    max_size=10,
)


@given(ATTRIBUTES)
def test_attributes_come_back_from_their_headers_through_amqp_encoding(attributes) -> None:
    headers = mapping.headers_from_attributes(attributes)
    decoded = decode_table(encode_table(headers), 0)[0]  # as a stored message's headers are read
    back = mapping.attributes_from_headers(decoded)
    assert back == attributes
    assert md5_of_attributes(back) == md5_of_attributes(attributes)


def test_amqp_headers_read_as_attributes() -> None:
    headers = {
        "s": "text",
        "i": 7,
        "f": 1.5,
        "d": Decimal("2.50"),
        "yes": True,
        "raw": bytearray(b"\x00\x01"),
        "not-utf8": b"\xff",
        "table": {"a": 1},
        "list": [1, 2],
        "none": None,
        "aws.reserved": "x",
        "bad name": "x",
        "x-sqs-data-types": {},
        "empty": "",
    }
    assert mapping.attributes_from_headers(headers) == {
        "s": {"DataType": "String", "StringValue": "text"},
        "i": {"DataType": "Number", "StringValue": "7"},
        "f": {"DataType": "Number", "StringValue": "1.5"},
        "d": {"DataType": "Number", "StringValue": "2.50"},
        "yes": {"DataType": "String", "StringValue": "true"},
        "raw": {"DataType": "Binary", "BinaryValue": b"\x00\x01"},
        "not-utf8": {"DataType": "Binary", "BinaryValue": b"\xff"},
    }
    assert mapping.attributes_from_headers(None) == {}


def test_a_small_integer_number_is_an_amqp_integer() -> None:
    headers = mapping.headers_from_attributes(
        {"n": {"DataType": "Number", "StringValue": "42"}, "big": {"DataType": "Number", "StringValue": "1" * 25}}
    )
    assert headers["n"] == 42 and headers["big"] == "1" * 25
    assert headers[mapping.TYPES_HEADER] == {"big": "Number"}


def test_message_attribute_names_select() -> None:
    attributes = {name: {"DataType": "String", "StringValue": "v"} for name in ("a.b", "a.c", "b")}
    assert mapping.select_attributes(attributes, []) == {}
    assert mapping.select_attributes(attributes, ["All"]) == attributes
    assert mapping.select_attributes(attributes, [".*"]) == attributes
    assert sorted(mapping.select_attributes(attributes, ["a.*"])) == ["a.b", "a.c"]
    assert sorted(mapping.select_attributes(attributes, ["b", "zz"])) == ["b"]


def test_queue_attributes_are_queue_arguments() -> None:
    arguments = mapping.arguments_from_attributes(
        {"VisibilityTimeout": "60", "MessageRetentionPeriod": "120", "DelaySeconds": "3"}
    )
    assert arguments == {"x-sqs-visibility-timeout": 60, "x-message-ttl": 120_000, "x-sqs-delay-seconds": 3}
    assert mapping.queue_attributes(arguments, 1024) == {
        "VisibilityTimeout": 60,
        "DelaySeconds": 3,
        "MaximumMessageSize": 1024,
        "ReceiveMessageWaitTimeSeconds": 0,
        "MessageRetentionPeriod": 120,
    }
    assert mapping.queue_attributes({}, 2048)["MessageRetentionPeriod"] == mapping.RETENTION_UNBOUNDED_S
