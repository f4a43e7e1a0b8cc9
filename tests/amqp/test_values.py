"""Field tables and arrays: round trips, RabbitMQ errata tags byte for byte, pamqp agreement,
and hostile input that must only ever raise DecodeError."""

import struct
from decimal import Decimal

import pamqp.decode
import pamqp.encode
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxq_raft.amqp.errors import DecodeError
from maxq_raft.amqp.values import (
    NESTING_DEPTH_MAX,
    Timestamp,
    decode_array,
    decode_shortstr,
    decode_table,
    encode_array,
    encode_shortstr,
    encode_table,
    encode_value,
    with_shared_strings,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

keys = st.text(max_size=20).filter(lambda k: len(k.encode()) <= 255)
decimals = st.builds(
    lambda mantissa, scale: Decimal(mantissa).scaleb(-scale),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 20),
)
scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    decimals,
    st.text(max_size=30),
    st.binary(max_size=30),
    st.binary(max_size=30).map(bytearray),
    st.integers(0, 2**64 - 1).map(Timestamp),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.lists(inner, max_size=5).map(tuple),
        st.dictionaries(keys, inner, max_size=5),
    ),
    max_leaves=20,
)
tables = st.dictionaries(keys, values, max_size=8)


def expected(value):
    """What decoding gives back: tuples become lists, bytes that are valid UTF-8 become str
    (RabbitMQ's 'S' is binary; only valid UTF-8 is surfaced as text)."""
    if isinstance(value, dict):
        return {k: expected(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [expected(v) for v in value]
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


@SETTINGS
@given(tables)
def test_table_round_trip(table):
    raw = encode_table(table)
    decoded, end = decode_table(raw, 0)
    assert end == len(raw)
    assert decoded == expected(table)
    # the same at an offset inside a memoryview, as the method decoders call it
    decoded, end = decode_table(memoryview(b"xyz" + raw + b"tail"), 3)
    assert (decoded, end) == (expected(table), 3 + len(raw))


@SETTINGS
@given(st.lists(values, max_size=8))
def test_array_round_trip(array):
    raw = encode_array(array)
    decoded, end = decode_array(raw, 0)
    assert end == len(raw)
    assert decoded == expected(array)


def test_decoded_types_follow_the_mapping():
    table = {"ts": Timestamp(5), "x": bytearray(b"\x00"), "s": b"\xff", "t": "text", "d": Decimal("1.5")}
    decoded, _ = decode_table(encode_table(table), 0)
    assert type(decoded["ts"]) is Timestamp
    assert type(decoded["x"]) is bytearray
    assert type(decoded["s"]) is bytes
    assert type(decoded["t"]) is str
    assert type(decoded["d"]) is Decimal


def _entry(key: bytes, tag: bytes, value: bytes) -> bytes:
    return bytes([len(key)]) + key + tag + value


# one entry per tag of https://www.rabbitmq.com/amqp-0-9-1-errata.html, written by hand
ERRATA_ENTRIES = [
    (b"t", b"t", b"\x01", True),
    (b"b", b"b", b"\xff", -1),
    (b"B", b"B", b"\xff", 255),
    (b"s", b"s", b"\xff\xfe", -2),
    (b"u", b"u", b"\xff\xfe", 65534),
    (b"I", b"I", b"\xff\xff\xff\xfd", -3),
    (b"i", b"i", b"\xff\xff\xff\xfd", 4294967293),
    (b"l", b"l", b"\xff\xff\xff\xff\xff\xff\xff\xfc", -4),
    (b"f", b"f", struct.pack(">f", 1.5), 1.5),
    (b"d", b"d", struct.pack(">d", -2.25), -2.25),
    (b"D", b"D", b"\x02\x00\x00\x01\x2c", Decimal("3.00")),
    (b"S", b"S", b"\x00\x00\x00\x02hi", "hi"),
    (b"A", b"A", b"\x00\x00\x00\x05I\x00\x00\x00\x07", [7]),
    (b"T", b"T", b"\x00\x00\x00\x00\x65\x00\x00\x00", Timestamp(0x65000000)),
    (b"F", b"F", b"\x00\x00\x00\x04\x01kt\x00", {"k": False}),
    (b"V", b"V", b"", None),
    (b"x", b"x", b"\x00\x00\x00\x02\x00\xff", bytearray(b"\x00\xff")),
    # not in the errata table, but RabbitMQ's parser reads 'L' as a signed 64-bit int
    (b"L", b"L", b"\xff\xff\xff\xff\xff\xff\xff\xff", -1),
]


def test_errata_tags_decode_byte_exact():
    body = b"".join(_entry(k, tag, v) for k, tag, v, _ in ERRATA_ENTRIES)
    raw = struct.pack(">I", len(body)) + body
    decoded, end = decode_table(raw, 0)
    assert end == len(raw)
    assert decoded == {k.decode(): value for k, _, _, value in ERRATA_ENTRIES}


def test_encoding_chooses_errata_tags_byte_exact():
    table = {
        "bool": True,
        "i32": -(2**31),
        "i64": 2**31,
        "float": 0.5,
        "dec": Decimal("-1.25"),
        "str": "é",
        "bin": b"\xff",
        "bytes": bytearray(b"\x01"),
        "ts": Timestamp(1),
        "nested": {"a": None},
        "list": [1, "x"],
        "tuple": (),
    }
    body = b"".join(
        [
            _entry(b"bool", b"t", b"\x01"),
            _entry(b"i32", b"I", b"\x80\x00\x00\x00"),
            _entry(b"i64", b"l", b"\x00\x00\x00\x00\x80\x00\x00\x00"),
            _entry(b"float", b"d", struct.pack(">d", 0.5)),
            _entry(b"dec", b"D", b"\x02\xff\xff\xff\x83"),
            _entry(b"str", b"S", b"\x00\x00\x00\x02\xc3\xa9"),
            _entry(b"bin", b"S", b"\x00\x00\x00\x01\xff"),
            _entry(b"bytes", b"x", b"\x00\x00\x00\x01\x01"),
            _entry(b"ts", b"T", b"\x00\x00\x00\x00\x00\x00\x00\x01"),
            _entry(b"nested", b"F", b"\x00\x00\x00\x03\x01aV"),
            _entry(b"list", b"A", b"\x00\x00\x00\x0bI\x00\x00\x00\x01S\x00\x00\x00\x01x"),
            _entry(b"tuple", b"A", b"\x00\x00\x00\x00"),
        ]
    )
    assert encode_table(table) == struct.pack(">I", len(body)) + body


def test_empty_and_none_tables():
    assert encode_table(None) == encode_table({}) == b"\x00\x00\x00\x00"
    assert decode_table(b"\x00\x00\x00\x00", 0) == ({}, 4)
    assert encode_array([]) == b"\x00\x00\x00\x00"


def test_encoding_errors():
    with pytest.raises(ValueError):
        encode_table({"big": 2**63})
    with pytest.raises(ValueError):
        encode_table({"small": -(2**63) - 1})
    with pytest.raises(ValueError):
        encode_table({"k" * 256: 1})
    with pytest.raises(ValueError):
        encode_table({"ts": Timestamp(-1)})
    with pytest.raises(ValueError):
        encode_table({"d": Decimal("NaN")})
    with pytest.raises(ValueError):
        encode_table({"d": Decimal(2**31)})
    with pytest.raises(TypeError):
        encode_table({"o": object()})
    with pytest.raises(TypeError):
        encode_table({1: 1})
    with pytest.raises(ValueError):
        encode_shortstr("é" * 128)
    # int64 bounds are accepted
    assert decode_table(encode_table({"a": 2**63 - 1, "b": -(2**63)}), 0)[0] == {"a": 2**63 - 1, "b": -(2**63)}


def test_shortstr_round_trip():
    raw = encode_shortstr("héllo")
    assert raw == b"\x06h\xc3\xa9llo"
    assert decode_shortstr(b"\x00" + raw, 1) == ("héllo", 1 + len(raw))
    for bad in (b"\x05abc", b"\x01\xff", b""):
        with pytest.raises(DecodeError) as info:
            decode_shortstr(bad, 0)
        assert info.value.reply_code == 502


def test_nesting_is_bounded():
    deep: dict = {}
    for _ in range(NESTING_DEPTH_MAX + 2):
        deep = {"n": deep}
    with pytest.raises(ValueError):
        encode_table(deep)
    # build the hostile encoding by hand: tables nested beyond the limit
    raw = b"\x00\x00\x00\x00"
    for _ in range(NESTING_DEPTH_MAX + 2):
        body = b"\x01nF" + raw
        raw = struct.pack(">I", len(body)) + body
    with pytest.raises(DecodeError) as info:
        decode_table(raw, 0)
    assert info.value.reply_code == 502


@pytest.mark.parametrize(
    "raw",
    [
        b"\x00\x00\x00",  # truncated length
        b"\x00\x00\x00\x09\x01k",  # length beyond the buffer
        b"\x00\x00\x00\x03\x01kZ",  # unknown tag
        b"\x00\x00\x00\x06\x01kI\x00\x00",  # value runs past the table length (and buffer)
        b"\x00\x00\x00\x03\x01kI\x00\x00\x00\x01",  # value runs past the table length
        b"\x00\x00\x00\x04\x01\xffV\x00",  # key is not UTF-8
        b"\x00\x00\x00\x07\x01kS\x00\x00\x00\x09",  # longstr beyond the buffer
    ],
)
def test_malformed_tables_raise_decode_error(raw):
    with pytest.raises(DecodeError) as info:
        decode_table(raw, 0)
    assert info.value.reply_code == 502


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64))
def test_garbage_only_raises_decode_error(raw):
    for decode in (decode_table, decode_array):
        try:
            decode(raw, 0)
        except DecodeError as exc:
            assert exc.reply_code == 502


@settings(max_examples=150, deadline=None)
@given(tables, st.data())
def test_corrupted_tables_only_raise_decode_error(table, data):
    raw = bytearray(encode_table(table))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        decode_table(bytes(raw[:cut]), 0)
    except DecodeError as exc:
        assert exc.reply_code == 502


# --- pamqp cross-check -------------------------------------------------------------------
# Only the values whose mapping pamqp shares: pamqp encodes float as 'f' (float32), so floats
# must be float32-exact; it has no bytes or Timestamp encoder ('T' decodes to datetime); it
# truncates keys beyond 128 bytes; it encodes ints in the smallest of b/s/u/I/i/l.
pamqp_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(width=32, allow_nan=False, allow_infinity=False),
    decimals,
    st.text(max_size=30),
    st.binary(max_size=30).map(bytearray),
    st.none(),
)
pamqp_values = st.recursive(
    pamqp_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=15,
)
pamqp_tables = st.dictionaries(st.text(max_size=20).filter(lambda k: len(k.encode()) <= 128), pamqp_values, max_size=6)


@SETTINGS
@given(pamqp_tables)
def test_pamqp_decodes_our_tables(table):
    raw = encode_table(table)
    consumed, theirs = pamqp.decode.field_table(raw)
    assert consumed == len(raw)
    assert theirs == table


@SETTINGS
@given(pamqp_tables)
def test_we_decode_pamqp_tables(table):
    raw = pamqp.encode.field_table(table)
    ours, end = decode_table(raw, 0)
    assert end == len(raw)
    assert ours == table


def test_pamqp_agrees_on_single_values():
    for value in (True, -5, 70000, 2**40, "s", None, [1, [2]], {"a": {"b": 1}}, bytearray(b"z"), Decimal("-0.5")):
        ours = decode_table(encode_table({"k": value}), 0)[0]["k"]
        theirs = pamqp.decode.field_table(encode_table({"k": value}))[1]["k"]
        assert ours == theirs == value
        assert encode_value(value)[:1] in b"tIlSVAFxD"


def test_long_is_always_encoded_as_a_64_bit_integer():
    from maxq_raft.amqp.values import Long, decode_table, encode_table

    raw = encode_table({"small": Long(1), "plain": 1})
    assert b"\x05smalll\x00\x00\x00\x00\x00\x00\x00\x01" in raw and b"\x05plainI\x00\x00\x00\x01" in raw
    assert decode_table(raw, 0)[0] == {"small": 1, "plain": 1}


@given(tables)
@SETTINGS
def test_a_table_with_shared_strings_is_equal_to_it(table):
    assert with_shared_strings(table) == table


def test_two_connections_client_properties_share_their_strings():
    sent = {"product": "pika", "version": "1.3.2", "capabilities": {"basic.nack": True}, "note": "x" * 300}
    raw = encode_table(sent)
    first = with_shared_strings(decode_table(raw, 0)[0])
    second = with_shared_strings(decode_table(raw, 0)[0])
    assert first == second == sent
    assert first["product"] is second["product"] and first["version"] is second["version"]
    first_keys, second_keys = list(first["capabilities"]), list(second["capabilities"])
    assert first_keys[0] is second_keys[0]  # (nested tables' keys too)
    assert first["note"] is not second["note"]  # longer than SHARED_STRING_CHARS_MAX: each its own
