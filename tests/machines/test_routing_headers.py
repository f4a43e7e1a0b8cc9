"""Headers exchange routing and x-match validation, case by case against the rules of
RabbitMQ's rabbit_exchange_type_headers (headers_match/5, validate_binding/2)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines.routing import HeadersRouter, make_router, validate_binding_arguments

MISSING = object()


def matches(arguments: dict, headers: dict | None, routing_key: str = "") -> bool:
    router = HeadersRouter()
    assert router.add("q", routing_key, arguments)
    router.check_invariants()
    return router.route("ignored.key", headers) == ["q"]


CASES = [
    # (id, binding arguments, message headers, matches?)
    ("all: every arg matches", {"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ("all: extra headers are fine", {"x-match": "all", "a": 1}, {"a": 1, "c": 3}, True),
    ("all: one value differs", {"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ("all: one key missing", {"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ("all: no headers at all", {"x-match": "all", "a": 1}, None, False),
    ("default is all: match", {"a": 1, "b": 2}, {"a": 1, "b": 2}, True),
    ("default is all: partial", {"a": 1, "b": 2}, {"a": 1}, False),
    ("any: one of two", {"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
    ("any: none", {"x-match": "any", "a": 1, "b": 2}, {"a": 2, "c": 1}, False),
    ("any: no headers", {"x-match": "any", "a": 1}, None, False),
    # "all" with nothing to compare matches everything; "any" with nothing matches nothing
    # (headers_match([], _, AllMatch=true, AnyMatch=false, Kind)).
    ("empty args = all of nothing", {}, None, True),
    ("all of nothing, no headers", {"x-match": "all"}, None, True),
    ("all of nothing, headers", {"x-match": "all"}, {"a": 1}, True),
    ("any of nothing", {"x-match": "any"}, {"a": 1}, False),
    ("any of nothing, no headers", {"x-match": "any"}, None, False),
    ("all of only x- args", {"x-match": "all", "x-foo": "1"}, None, True),
    ("any of only x- args", {"x-match": "any", "x-foo": "1"}, {"x-foo": "1"}, False),
    # x- binding arguments are not compared by all/any...
    ("all ignores x- arg", {"x-foo": "1", "a": 1}, {"a": 1}, True),
    ("all ignores x- arg value", {"x-foo": "1", "a": 1}, {"a": 1, "x-foo": "2"}, True),
    ("any ignores x- arg", {"x-match": "any", "x-foo": "1", "a": 1}, {"x-foo": "1"}, False),
    # ...and so message headers starting with x- are never looked at.
    ("message x- header ignored", {"a": 1}, {"a": 1, "x-b": 2}, True),
    # ...but the -with-x kinds compare them.
    ("all-with-x needs x- arg", {"x-match": "all-with-x", "x-foo": "1", "a": 1}, {"a": 1}, False),
    (
        "all-with-x all present",
        {"x-match": "all-with-x", "x-foo": "1", "a": 1},
        {"a": 1, "x-foo": "1"},
        True,
    ),
    ("any-with-x on x- arg", {"x-match": "any-with-x", "x-foo": "1"}, {"x-foo": "1"}, True),
    ("any-with-x no match", {"x-match": "any-with-x", "x-foo": "1"}, {"x-foo": "2"}, False),
    # x-match itself is always dropped from the pattern, even with -with-x.
    ("with-x drops x-match (all)", {"x-match": "all-with-x"}, {"x-match": "other"}, True),
    ("with-x drops x-match (any)", {"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
    # void (None) in the binding means "present, any value".
    ("void: present", {"a": None}, {"a": "anything"}, True),
    ("void: present as void", {"a": None}, {"a": None}, True),
    ("void: absent", {"a": None}, {"b": 1}, False),
    ("void: any", {"x-match": "any", "a": None, "b": 1}, {"a": 0}, True),
    ("void in header, value in binding", {"a": 1}, {"a": None}, False),
    # Erlang ==: a boolean is an atom, never a number.
    ("bool vs int", {"a": True}, {"a": 1}, False),
    ("int vs bool", {"a": 1}, {"a": True}, False),
    ("false vs 0", {"a": False}, {"a": 0}, False),
    ("bool vs bool", {"a": True}, {"a": True}, True),
    ("bool vs other bool", {"a": True}, {"a": False}, False),
    # Erlang ==: numbers compare arithmetically (1 == 1.0 is true).
    ("int vs float", {"a": 1}, {"a": 1.0}, True),
    ("int vs int", {"a": 5}, {"a": 6}, False),
    # Every longstr is a binary: str and bytes with the same UTF-8 are the same value.
    ("str vs bytes", {"a": "v"}, {"a": b"v"}, True),
    ("bytes vs str", {"a": b"v"}, {"a": "v"}, True),
    ("str vs other bytes", {"a": "v"}, {"a": b"w"}, False),
    ("utf-8 str vs bytes", {"a": "é"}, {"a": "é".encode()}, True),
    ("str vs int", {"a": "1"}, {"a": 1}, False),
    ("case-sensitive keys", {"A": 1}, {"a": 1}, False),
    # Decimals are {Scale, Value} in RabbitMQ: no arithmetic equality with numbers.
    ("decimal vs same decimal", {"a": Decimal("1.5")}, {"a": Decimal("1.5")}, True),
    ("decimal vs other scale", {"a": Decimal("1.0")}, {"a": Decimal("1.00")}, False),
    ("decimal vs int", {"a": Decimal("1")}, {"a": 1}, False),
    # Nested values compare as {Type, Value} terms, in order.
    ("nested table equal", {"a": {"k": 1, "l": "x"}}, {"a": {"k": 1, "l": b"x"}}, True),
    ("nested int vs float", {"a": {"k": 1}}, {"a": {"k": 1.0}}, False),
    ("nested table order", {"a": {"k": 1, "l": 2}}, {"a": {"l": 2, "k": 1}}, False),
    ("nested array equal", {"a": [1, "x", None]}, {"a": [1, b"x", None]}, True),
    ("nested array differs", {"a": [1, 2]}, {"a": [1, 2, 3]}, False),
    ("nested bool vs int", {"a": [True]}, {"a": [1]}, False),
    # A binding that bypassed validation: parse_x_match treats unknown values as "all".
    ("legacy invalid x-match = all", {"x-match": "foo", "a": 1}, {"a": 1}, True),
    ("legacy invalid x-match = all (miss)", {"x-match": "foo", "a": 1, "b": 2}, {"a": 1}, False),
    ("x-match as bytes", {"x-match": b"any", "a": 1, "b": 2}, {"b": 2}, True),
]


@pytest.mark.parametrize("arguments, headers, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_headers_matching(arguments: dict, headers: dict | None, expected: bool) -> None:
    assert matches(arguments, headers) is expected


def test_routing_key_is_ignored() -> None:
    router = HeadersRouter()
    router.add("q1", "some.key", {"a": 1})
    router.add("q2", "", {"x-match": "any", "b": 2})
    assert router.route("other", {"a": 1, "b": 2}) == ["q1", "q2"]
    assert router.route("", {"b": 2}) == ["q2"]


def test_route_order_and_dedup() -> None:
    router = HeadersRouter()
    router.add("q:b", "", {"a": 1})
    router.add("q:a", "", {"a": 1})
    router.add("q:b", "", {"x-match": "any", "a": 1, "z": 9})
    assert router.route("", {"a": 1}) == ["q:b", "q:a"]
    assert router.route("", {"z": 9}) == ["q:b"]


def test_bindings_differ_by_argument_types() -> None:
    router = make_router("headers")
    assert router.add("q", "", {"a": True})
    assert router.add("q", "", {"a": 1})  # {bool,true} and {signedint,1} are different args
    assert not router.add("q", "", {"a": 1})
    assert router.add("q", "", {"a": "v"})
    assert not router.add("q", "", {"a": b"v"})  # the same longstr
    assert not router.add("q", "", {"a": True})
    # argument order does not matter (rabbit_binding sorts the table)
    assert router.add("q", "", {"x-match": "any", "a": 1, "b": 2})
    assert not router.add("q", "", {"b": 2, "a": 1, "x-match": "any"})
    assert router.remove("q", "", {"b": 2, "x-match": "any", "a": 1})
    assert len(router) == 3
    router.check_invariants()
    assert router.route("", {"a": 1}) == ["q"]
    assert router.remove("q", "", {"a": True})
    assert router.remove("q", "", {"a": 1})
    assert router.route("", {"a": True}) == []


# -- validate_binding_arguments ------------------------------------------------------------------

VALUE_ERROR = "Invalid x-match field value {}; expected all, any, all-with-x, or any-with-x"
TYPE_ERROR = "Invalid x-match field type {} (value {}); expected longstr"

VALIDATION_CASES = [
    (None, None),
    ({}, None),
    ({"a": 1}, None),  # absent x-match is allowed ("useful to allow people to do this")
    ({"x-match": "all"}, None),
    ({"x-match": "any"}, None),
    ({"x-match": "all-with-x"}, None),
    ({"x-match": "any-with-x"}, None),
    ({"x-match": b"any"}, None),
    ({"x-match": "foo"}, VALUE_ERROR.format('<<"foo">>')),
    ({"x-match": "ALL"}, VALUE_ERROR.format('<<"ALL">>')),
    ({"x-match": ""}, VALUE_ERROR.format("<<>>")),
    ({"x-match": 'a"b\\c'}, VALUE_ERROR.format('<<"a\\"b\\\\c">>')),
    ({"x-match": "é"}, VALUE_ERROR.format('<<"é"/utf8>>')),
    ({"x-match": b"\x00\x01"}, VALUE_ERROR.format("<<0,1>>")),
    ({"x-match": 1}, TYPE_ERROR.format("signedint", "1")),
    ({"x-match": 2**40}, TYPE_ERROR.format("long", str(2**40))),
    ({"x-match": True}, TYPE_ERROR.format("bool", "true")),
    ({"x-match": None}, TYPE_ERROR.format("void", "undefined")),
]


@pytest.mark.parametrize("arguments, expected", VALIDATION_CASES)
def test_validate_headers_binding_arguments(arguments: dict | None, expected: str | None) -> None:
    assert validate_binding_arguments("headers", arguments) == expected


def test_validate_other_types_accept_anything() -> None:
    for exchange_type in ("direct", "fanout", "topic"):
        assert validate_binding_arguments(exchange_type, {"x-match": "foo"}) is None
    with pytest.raises(KeyError):
        validate_binding_arguments("x-unknown", {})


# -- property: the router agrees with a direct reading of headers_match --------------------------

KEYS = st.sampled_from(["a", "b", "x-a", "x-match"])
VALUES = st.sampled_from([None, 1, 1.0, 2, True, False, "v", b"v", "w"])
X_MATCH = st.sampled_from([MISSING, "all", "any", "all-with-x", "any-with-x"])


def reference(arguments: dict, headers: dict | None) -> bool:
    headers = headers or {}
    kind = arguments.get("x-match", "all")
    with_x = kind.endswith("-with-x")
    outcomes = []
    for key, expected in arguments.items():
        if key == "x-match" or (key.startswith("x-") and not with_x):
            continue
        if key not in headers:
            outcomes.append(False)
        elif expected is None:
            outcomes.append(True)
        else:
            actual = headers[key]
            if isinstance(expected, bool) or isinstance(actual, bool):
                outcomes.append(type(expected) is type(actual) and expected == actual)
            else:
                norm = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
                outcomes.append(norm(expected) == norm(actual))
    return all(outcomes) if kind.startswith("all") else any(outcomes)


@settings(max_examples=300, deadline=None)
@given(
    x_match=X_MATCH,
    arguments=st.dictionaries(KEYS.filter(lambda k: k != "x-match"), VALUES, max_size=3),
    headers=st.one_of(st.none(), st.dictionaries(KEYS, VALUES, max_size=4)),
)
def test_headers_agree_with_reference(x_match: object, arguments: dict, headers: dict | None) -> None:
    if x_match is not MISSING:
        arguments = {"x-match": x_match, **arguments}
    assert validate_binding_arguments("headers", arguments) is None
    assert matches(arguments, headers) is reference(arguments, headers)
