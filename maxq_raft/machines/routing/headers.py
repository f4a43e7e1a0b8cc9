"""The headers exchange: bindings match on message header values; the routing key is ignored.

Theory of operation: each binding's argument table is compiled once, at bind time, into its
match kind and the list of (key, expected value) pairs that take part; routing scans the
bindings in order and tests each against the message headers. The rules are those of
RabbitMQ's rabbit_exchange_type_headers (headers_match/5):

* "x-match" is "all" (the default when absent), "any", "all-with-x" or "any-with-x". Any
  other value is refused at bind time (`validate_binding_arguments`, 406); a binding that
  got in anyway is treated as "all", as parse_x_match does ("legacy; we didn't validate").
* The "x-match" argument itself never takes part. Other arguments whose key starts with "x-"
  take part only with the "-with-x" kinds. Message headers are only ever looked up by the
  binding's keys, so message headers starting with "x-" are in effect ignored by "all" and
  "any" (and compared by the "-with-x" kinds when the binding names them).
* A binding argument of type void (None) matches when the header is present, with any value
  (RabbitMQ: "a 'no value' in a pattern field is supposed to mean simple presence").
* "all" matches when every taking-part argument matches, so "all" with none matches every
  message, including one without headers; "any" matches when at least one does, so "any"
  with none matches nothing.
* Values compare as RabbitMQ's `PV == DV` on the decoded Erlang values, without the type
  tags: see `header_values_equal`.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Mapping
from typing import Final

from .base import Binding, BindingIdentity, Router

X_MATCH: Final = "x-match"

# Match kinds, by x-match value. RabbitMQ's validate_binding accepts exactly these four.
_X_MATCH_KINDS: Final[dict[str, tuple[bool, bool]]] = {
    # value: (is_all, with_x)
    "all": (True, False),
    "any": (False, False),
    "all-with-x": (True, True),
    "any-with-x": (False, True),
}


class _Spec:
    """A binding's arguments compiled for matching."""

    __slots__ = ("binding", "is_all", "pattern")

    def __init__(self, binding: Binding, is_all: bool, pattern: list[tuple[str, object]]) -> None:
        self.binding = binding
        self.is_all = is_all
        self.pattern = pattern


def _compile(binding: Binding) -> _Spec:
    # parse_x_match: only a longstr of the four known values counts; anything else is "all".
    x_match = binding.arguments.get(X_MATCH)
    is_all, with_x = _X_MATCH_KINDS.get(_longstr_text(x_match) or "", (True, False))
    pattern = [
        (key, value)
        for key, value in binding.arguments.items()
        if key != X_MATCH and (with_x or not key.startswith("x-"))
    ]
    return _Spec(binding, is_all, pattern)


def headers_match(spec_is_all: bool, pattern: list[tuple[str, object]], headers: Mapping[str, object]) -> bool:
    """RabbitMQ's headers_match/5 for one compiled binding. Its merge over key-sorted tables
    is a lookup per binding key here; both stop at the first decisive key."""
    if spec_is_all:
        for key, expected in pattern:
            if key not in headers:
                return False
            if expected is not None and not header_values_equal(expected, headers[key]):
                return False
        return True
    for key, expected in pattern:
        if key in headers and (expected is None or header_values_equal(expected, headers[key])):
            return True
    return False


def header_values_equal(expected: object, actual: object, nested: bool = False) -> bool:
    """RabbitMQ's `PV == DV` on decoded values (the field types are not compared at the top).

    Erlang `==` decides: integers and floats compare arithmetically (1 == 1.0) but a boolean
    is an atom and never equals a number; every longstr is a binary, so str and bytes with the
    same UTF-8 bytes are equal (our decoder gives str only when the bytes are valid UTF-8);
    a decimal is a {Scale, Value} pair, equal only to a decimal of the same scale and value.
    Inside a nested table or array RabbitMQ compares {Type, Value} terms, so there int and float
    differ, and tables compare item by item in order. Corners we cannot reproduce because the
    decoded value has lost its wire type: signedint vs long (both int here) inside nested
    values, and a top-level timestamp against an integer (equal in RabbitMQ, where a timestamp
    is an integer; equal here only if the decoder gives timestamps as int).
    """
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, (int, float)) and isinstance(actual, (int, float)):
        if nested and isinstance(expected, float) != isinstance(actual, float):
            return False
        return expected == actual
    expected_text = _longstr_bytes(expected)
    if expected_text is not None:
        return expected_text == _longstr_bytes(actual)
    if expected is None or actual is None:
        # Only reached inside nested values (top-level void means presence): void == void.
        return expected is None and actual is None
    if isinstance(expected, decimal.Decimal) and isinstance(actual, decimal.Decimal):
        return expected.as_tuple() == actual.as_tuple()
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        if len(expected) != len(actual):
            return False
        return all(
            ek == ak and header_values_equal(ev, av, nested=True)
            for (ek, ev), (ak, av) in zip(expected.items(), actual.items(), strict=True)
        )
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            return False
        return all(header_values_equal(e, a, nested=True) for e, a in zip(expected, actual, strict=True))
    if isinstance(expected, datetime.datetime) and isinstance(actual, datetime.datetime):
        return expected == actual
    return type(expected) is type(actual) and expected == actual


class HeadersRouter(Router):
    exchange_type = "headers"

    def __init__(self) -> None:
        super().__init__()
        # Compiled bindings, in the same (insertion) order as self._bindings.
        self._specs: dict[BindingIdentity, _Spec] = {}

    @classmethod
    def validate_binding_arguments(cls, arguments: Mapping[str, object] | None) -> str | None:
        """rabbit_exchange_type_headers:validate_binding. Absent x-match is fine ("in practice
        it's useful to allow people to do this"); a longstr must be one of the four kinds; any
        other type is refused. The text is RabbitMQ's, formatted with its ~tp."""
        if not arguments or X_MATCH not in arguments:
            return None
        value = arguments[X_MATCH]
        text = _longstr_text(value)
        if text is not None:
            if text in _X_MATCH_KINDS:
                return None
            return (
                f"Invalid x-match field value {format_erlang_term(value)}; expected all, any, all-with-x, or any-with-x"
            )
        if isinstance(value, (bytes, bytearray, memoryview)):
            # A longstr that is not UTF-8 cannot be one of the four kinds.
            return (
                f"Invalid x-match field value {format_erlang_term(value)}; expected all, any, all-with-x, or any-with-x"
            )
        return (
            f"Invalid x-match field type {_field_type_name(value)} "
            f"(value {format_erlang_term(value)}); expected longstr"
        )

    def route(self, routing_key: str, headers: Mapping[str, object] | None = None) -> list[str]:
        # RabbitMQ treats absent headers (undefined) as the empty table.
        message_headers: Mapping[str, object] = headers if headers is not None else {}
        seen: dict[str, None] = {}
        for spec in self._specs.values():
            destination = spec.binding.destination
            if destination in seen:
                continue
            if headers_match(spec.is_all, spec.pattern, message_headers):
                seen[destination] = None
        return list(seen)

    def _index_add(self, binding: Binding) -> None:
        self._specs[binding.identity] = _compile(binding)

    def _index_remove(self, binding: Binding) -> None:
        del self._specs[binding.identity]

    def _check_index(self) -> None:
        assert list(self._specs) == list(self._bindings)
        for identity, spec in self._specs.items():
            assert spec.binding is self._bindings[identity]


# -- helpers -------------------------------------------------------------------------------------


def _longstr_bytes(value: object) -> bytes | None:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return None


def _longstr_text(value: object) -> str | None:
    """A longstr value as text (str as is, bytes if valid UTF-8); None for other types."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None


def _field_type_name(value: object) -> str:
    """The RabbitMQ field type atom for a decoded value. Best effort: the wire type is gone, so
    an int is named by its size as pika would send it (signedint if it fits 32 bits)."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


_ERLANG_ESCAPES: Final = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\b": "\\b",
    "\f": "\\f",
    "\x1b": "\\e",
}


def format_erlang_term(value: object) -> str:
    """Erlang's `~tp` rendering of a decoded field value, as RabbitMQ puts it in error texts.

    Exact for short binaries: <<"foo">> when every character is printable ASCII (or one of
    Erlang's escapable controls), <<"é"/utf8>> for valid UTF-8 whose characters are printable
    Latin-1 (the default +pc latin1 printable range), else the bytes <<1,2,3>>. Long terms,
    which ~tp would wrap over several lines, are rendered on one line.
    """
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        return _format_binary(_longstr_bytes(value) or b"")
    if isinstance(value, Mapping):
        items = ",".join(
            f"{{{format_erlang_term(k)},{_field_type_name(v)},{format_erlang_term(v)}}}" for k, v in value.items()
        )
        return f"[{items}]"
    if isinstance(value, (list, tuple)):
        items = ",".join(f"{{{_field_type_name(v)},{format_erlang_term(v)}}}" for v in value)
        return f"[{items}]"
    return repr(value)


def _format_binary(data: bytes) -> str:
    if not data:
        return "<<>>"
    try:
        text = data.decode("utf-8")
        suffix = "" if text.isascii() else "/utf8"
    except UnicodeDecodeError:
        # Not UTF-8: Erlang still prints it as a string if the bytes are printable Latin-1.
        text = data.decode("latin-1")
        suffix = ""
    if all(_erlang_printable(ch) for ch in text):
        body = "".join(_ERLANG_ESCAPES.get(ch, ch) for ch in text)
        return f'<<"{body}"{suffix}>>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


def _erlang_printable(ch: str) -> bool:
    code = ord(ch)
    return 32 <= code <= 126 or 160 <= code <= 255 or ch in _ERLANG_ESCAPES
