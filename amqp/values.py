"""AMQP field tables, field arrays and short strings, with RabbitMQ's type-tag errata.

Theory of operation: a field table is a u32 byte length followed by (shortstr key, tag octet,
value) entries; an array is a u32 byte length followed by (tag, value) entries. The tags are
those of https://www.rabbitmq.com/amqp-0-9-1-errata.html ("field types"), which differ from
the 0-9-1 spec text (e.g. 's' is a signed 16-bit int, not a short string). Decoding walks
the buffer with offsets and a tag -> function dict; nothing is sliced except the strings
themselves. Decoding trusts no length: a table or array must end exactly at its declared
length, which must lie within the buffer, and every failure surfaces as DecodeError(502) at
the public functions. Encoding picks the tag from the Python type (see encode_value).
Nesting is bounded (NESTING_DEPTH_MAX) so hostile input cannot exhaust the Python stack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from struct import Struct
from struct import error as StructError
from sys import intern
from typing import Any, TypeAlias, Union

from .errors import DecodeError

# What the decoders read: a frame payload is bytes or a memoryview of the receive buffer (frames.py).
ReadBuffer: TypeAlias = bytes | bytearray | memoryview
# A decoded field value, by tag: t bool; b B s u I i l L int (Timestamp for T); f d float; D Decimal;
# S str, or bytes when not UTF-8; x bytearray; V None; F a table; A an array.
FieldValue: TypeAlias = Union[bool, int, float, Decimal, str, bytes, bytearray, None, "FieldTable", "FieldArray"]
FieldTable: TypeAlias = dict[str, FieldValue]
FieldArray: TypeAlias = list[FieldValue]

SYNTAX_ERROR = 502  # spec.SYNTAX_ERROR; spec.py imports this module, so not imported here
NESTING_DEPTH_MAX = 64

_U8 = Struct(">B")
_I8 = Struct(">b")
_I16 = Struct(">h")
_U16 = Struct(">H")
_I32 = Struct(">i")
_U32 = Struct(">I")
_I64 = Struct(">q")
_U64 = Struct(">Q")
_F32 = Struct(">f")
_F64 = Struct(">d")
_DEC = Struct(">Bi")  # decimal: scale octet + signed int32 (spec 4.2.5.5)
# tag + value in one pack for the common scalar encodings
_TAG_I32 = Struct(">ci")
_TAG_I64 = Struct(">cq")
_TAG_F64 = Struct(">cd")
_TAG_U64 = Struct(">cQ")
_TAG_U32 = Struct(">cI")
_TAG_DEC = Struct(">cBi")

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_EMPTY = b"\x00\x00\x00\x00"


class Timestamp(int):
    """A field-table timestamp ('T'): seconds since the epoch as an unsigned 64-bit int.
    A distinct type so that it encodes back as 'T' rather than as an integer."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


class Long(int):
    """An integer to encode as 'l' (signed 64-bit) whatever its size, where a peer expects that
    type: RabbitMQ writes x-death `count` as long, and clients cast it so (Java: Long)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Long({int(self)})"


# ---------------------------------------------------------------------------------------
# decoding: each function takes (buf, offset) and returns (value, new offset)


def _d_bool(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return buf[off] != 0, off + 1


def _d_int8(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _I8.unpack_from(buf, off)[0], off + 1


def _d_uint8(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return buf[off], off + 1


def _d_int16(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _I16.unpack_from(buf, off)[0], off + 2


def _d_uint16(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _U16.unpack_from(buf, off)[0], off + 2


def _d_int32(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _I32.unpack_from(buf, off)[0], off + 4


def _d_uint32(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _U32.unpack_from(buf, off)[0], off + 4


def _d_int64(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _I64.unpack_from(buf, off)[0], off + 8


def _d_float32(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _F32.unpack_from(buf, off)[0], off + 4


def _d_float64(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return _F64.unpack_from(buf, off)[0], off + 8


def _d_decimal(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    scale, value = _DEC.unpack_from(buf, off)
    return Decimal(value).scaleb(-scale), off + 5


def _d_longstr(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    (n,) = _U32.unpack_from(buf, off)
    off += 4
    end = off + n
    if end > len(buf):
        raise DecodeError(SYNTAX_ERROR, "field value longstr runs past the end of the buffer")
    raw = buf[off:end]
    try:
        return str(raw, "utf-8"), end
    except UnicodeDecodeError:
        # RabbitMQ's longstr is binary; only text that is valid UTF-8 becomes str
        return bytes(raw), end


def _d_timestamp(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return Timestamp(_U64.unpack_from(buf, off)[0]), off + 8


def _d_void(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    return None, off


def _d_bytes(buf: ReadBuffer, off: int) -> tuple[FieldValue, int]:
    (n,) = _U32.unpack_from(buf, off)
    off += 4
    end = off + n
    if end > len(buf):
        raise DecodeError(SYNTAX_ERROR, "field value byte array runs past the end of the buffer")
    return bytearray(buf[off:end]), end


# 'F' and 'A' are handled inline by the table/array loops so that they can carry depth.
_DECODERS: dict[int, Callable[[ReadBuffer, int], tuple[FieldValue, int]]] = {
    0x74: _d_bool,  # t
    0x62: _d_int8,  # b
    0x42: _d_uint8,  # B
    0x73: _d_int16,  # s
    0x75: _d_uint16,  # u
    0x49: _d_int32,  # I
    0x69: _d_uint32,  # i
    0x6C: _d_int64,  # l
    # 'L' is not in the errata table, but RabbitMQ's rabbit_binary_parser accepts it as a
    # signed 64-bit int; accepting it costs nothing and we never emit it.
    0x4C: _d_int64,  # L
    0x66: _d_float32,  # f
    0x64: _d_float64,  # d
    0x44: _d_decimal,  # D
    0x53: _d_longstr,  # S
    0x54: _d_timestamp,  # T
    0x56: _d_void,  # V
    0x78: _d_bytes,  # x
}
_TAG_TABLE = 0x46  # F
_TAG_ARRAY = 0x41  # A


def _read_table(buf: ReadBuffer, off: int, depth: int) -> tuple[FieldTable, int]:
    if depth > NESTING_DEPTH_MAX:
        raise DecodeError(SYNTAX_ERROR, "field tables nested too deeply")
    (size,) = _U32.unpack_from(buf, off)
    off += 4
    end = off + size
    if end > len(buf):
        raise DecodeError(SYNTAX_ERROR, f"field table length {size} runs past the end of the buffer")
    table: FieldTable = {}
    decoders = _DECODERS
    while off < end:
        n = buf[off]
        off += 1
        key_end = off + n
        key = str(buf[off:key_end], "utf-8")
        tag = buf[key_end]
        off = key_end + 1
        decoder = decoders.get(tag)
        if decoder is not None:
            table[key], off = decoder(buf, off)
        elif tag == _TAG_TABLE:
            table[key], off = _read_table(buf, off, depth + 1)
        elif tag == _TAG_ARRAY:
            table[key], off = _read_array(buf, off, depth + 1)
        else:
            raise DecodeError(SYNTAX_ERROR, f"unknown field type {chr(tag)!r} in field table")
    # an entry running past the declared length leaves off > end
    if off != end:
        raise DecodeError(SYNTAX_ERROR, "field table entries overrun the table length")
    return table, off


def _read_array(buf: ReadBuffer, off: int, depth: int) -> tuple[FieldArray, int]:
    if depth > NESTING_DEPTH_MAX:
        raise DecodeError(SYNTAX_ERROR, "field arrays nested too deeply")
    (size,) = _U32.unpack_from(buf, off)
    off += 4
    end = off + size
    if end > len(buf):
        raise DecodeError(SYNTAX_ERROR, f"field array length {size} runs past the end of the buffer")
    array: FieldArray = []
    append = array.append
    decoders = _DECODERS
    while off < end:
        tag = buf[off]
        off += 1
        decoder = decoders.get(tag)
        value: FieldValue
        if decoder is not None:
            value, off = decoder(buf, off)
        elif tag == _TAG_TABLE:
            value, off = _read_table(buf, off, depth + 1)
        elif tag == _TAG_ARRAY:
            value, off = _read_array(buf, off, depth + 1)
        else:
            raise DecodeError(SYNTAX_ERROR, f"unknown field type {chr(tag)!r} in field array")
        append(value)
    if off != end:
        raise DecodeError(SYNTAX_ERROR, "field array entries overrun the array length")
    return array, off


def decode_table(buf: ReadBuffer, offset: int) -> tuple[FieldTable, int]:
    """Decode a field table (with its u32 length) at `offset` of bytes or a memoryview."""
    try:
        return _read_table(buf, offset, 0)
    except (StructError, IndexError, ValueError):
        raise DecodeError(SYNTAX_ERROR, "malformed field table") from None


def decode_array(buf: ReadBuffer, offset: int) -> tuple[FieldArray, int]:
    """Decode a field array (with its u32 length) at `offset` of bytes or a memoryview."""
    try:
        return _read_array(buf, offset, 0)
    except (StructError, IndexError, ValueError):
        raise DecodeError(SYNTAX_ERROR, "malformed field array") from None


def decode_shortstr(buf: ReadBuffer, offset: int) -> tuple[str, int]:
    """Decode a shortstr (u8 length + UTF-8) at `offset`."""
    try:
        n = buf[offset]
        end = offset + 1 + n
        if end > len(buf):
            raise DecodeError(SYNTAX_ERROR, "shortstr runs past the end of the buffer")
        return str(buf[offset + 1 : end], "utf-8"), end
    except (IndexError, ValueError):
        raise DecodeError(SYNTAX_ERROR, "malformed shortstr") from None


# ---------------------------------------------------------------------------------------
# encoding


def encode_shortstr(value: str) -> bytes:
    """u8 length + UTF-8; ValueError beyond 255 bytes."""
    raw = value.encode()
    if len(raw) > 255:
        raise ValueError(f"shortstr is {len(raw)} bytes, the limit is 255")
    return _U8.pack(len(raw)) + raw


def _encode_key(key: object) -> bytes:
    if key.__class__ is not str and not isinstance(key, str):
        raise TypeError(f"field table keys must be str, not {type(key).__name__}")
    raw = key.encode()
    if len(raw) > 255:
        raise ValueError(f"field table key is {len(raw)} bytes, the limit is 255")
    return _U8.pack(len(raw)) + raw


def _encode_int(value: int) -> bytes:
    if _INT32_MIN <= value <= _INT32_MAX:
        return _TAG_I32.pack(b"I", value)
    if _INT64_MIN <= value <= _INT64_MAX:
        return _TAG_I64.pack(b"l", value)
    raise ValueError(f"integer {value} does not fit a signed 64-bit field value")


def _encode_decimal(value: Decimal) -> bytes:
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        raise ValueError(f"cannot encode {value} as an AMQP decimal")
    if exponent >= 0:
        # a positive exponent folds into the mantissa; beyond 10 digits it cannot fit 32 bits
        if exponent > 10 and any(digits):
            raise ValueError(f"decimal {value} needs a 32-bit mantissa")
        scale, mantissa = 0, abs(int(value))
    else:
        scale, mantissa = -exponent, int("".join(map(str, digits)) or "0")
    if sign:
        mantissa = -mantissa
    if scale > 255 or not _INT32_MIN <= mantissa <= _INT32_MAX:
        raise ValueError(f"decimal {value} needs scale <= 255 and a 32-bit mantissa")
    return _TAG_DEC.pack(b"D", scale, mantissa)


def _encode_longstr(tag: bytes, raw: bytes) -> bytes:
    if len(raw) > 0xFFFFFFFF:
        raise ValueError("field value longer than 4 GiB")
    return _TAG_U32.pack(tag, len(raw)) + raw


def encode_value(value: Any, depth: int = 0) -> bytes:
    """Tag and encode one field value. Exact type checks first (fast path), then isinstance
    for subclasses; bool is tested before int and Timestamp before int on purpose."""
    # `value` is Any, not object: the fast path compares `value.__class__` once, through a
    # local, which mypy cannot narrow on; every branch is a run-time type check, the last raises.
    cls = value.__class__
    if cls is str:
        return _encode_longstr(b"S", value.encode())
    if cls is int:
        return _encode_int(value)
    if cls is bool:
        return b"t\x01" if value else b"t\x00"
    if value is None:
        return b"V"
    if cls is dict:
        return b"F" + _encode_table(value, depth + 1)
    if cls is list or cls is tuple:
        return b"A" + _encode_array(value, depth + 1)
    if cls is bytes:
        return _encode_longstr(b"S", value)
    if cls is float:
        return _TAG_F64.pack(b"d", value)
    if cls is Timestamp:
        return _encode_timestamp(value)
    if cls is Decimal:
        return _encode_decimal(value)
    if cls is bytearray:
        return _encode_longstr(b"x", bytes(value))
    # subclasses of the types above, in precedence order
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, Timestamp):
        return _encode_timestamp(value)
    if isinstance(value, Long):
        return _TAG_I64.pack(b"l", value)
    if isinstance(value, int):
        return _encode_int(int(value))
    if isinstance(value, float):
        return _TAG_F64.pack(b"d", value)
    if isinstance(value, Decimal):
        return _encode_decimal(value)
    if isinstance(value, str):
        return _encode_longstr(b"S", str(value).encode())
    if isinstance(value, bytearray):
        return _encode_longstr(b"x", bytes(value))
    if isinstance(value, bytes):
        return _encode_longstr(b"S", bytes(value))
    if isinstance(value, dict):
        return b"F" + _encode_table(value, depth + 1)
    if isinstance(value, (list, tuple)):
        return b"A" + _encode_array(value, depth + 1)
    raise TypeError(f"cannot encode {type(value).__name__} as an AMQP field value")


def _encode_timestamp(value: int) -> bytes:
    if not 0 <= value <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError(f"timestamp {int(value)} does not fit an unsigned 64-bit value")
    return _TAG_U64.pack(b"T", value)


def _encode_table(table: Mapping[str, object], depth: int) -> bytes:
    if depth > NESTING_DEPTH_MAX:
        raise ValueError("field tables nested too deeply")
    if not table:
        return _EMPTY
    parts: list[bytes] = []
    append = parts.append
    for key, value in table.items():
        append(_encode_key(key))
        append(encode_value(value, depth))
    body = b"".join(parts)
    return _U32.pack(len(body)) + body


def _encode_array(array: Sequence[object], depth: int) -> bytes:
    if depth > NESTING_DEPTH_MAX:
        raise ValueError("field arrays nested too deeply")
    if not array:
        return _EMPTY
    body = b"".join([encode_value(value, depth) for value in array])
    return _U32.pack(len(body)) + body


def encode_table(table: Mapping[str, object] | None) -> bytes:
    """Encode a field table with its u32 length prefix; None is the empty table."""
    if not table:
        return _EMPTY
    if not isinstance(table, dict):
        raise TypeError(f"field table must be a dict, not {type(table).__name__}")
    return _encode_table(table, 0)


def encode_array(array: Sequence[object]) -> bytes:
    """Encode a field array with its u32 length prefix."""
    if not isinstance(array, (list, tuple)):
        raise TypeError(f"field array must be a list or tuple, not {type(array).__name__}")
    return _encode_array(array, 0)


SHARED_STRING_CHARS_MAX = 256


def with_shared_strings(table: FieldTable) -> FieldTable:
    """`table` with its keys and short string values interned, nested tables too: what every
    connection of one client library sends alike in its client properties (product, version,
    "capabilities", ...) is then held once, not by each connection (~1 KB each for pika). Not
    for the tables of the hot path (a message's headers): interning costs a lookup per string."""
    shared: FieldTable = {}
    for key, value in table.items():
        if type(value) is str and len(value) <= SHARED_STRING_CHARS_MAX:
            value = intern(value)
        elif type(value) is dict:
            value = with_shared_strings(value)
        shared[intern(key)] = value
    return shared
