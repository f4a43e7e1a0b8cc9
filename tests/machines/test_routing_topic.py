"""Topic exchange routing: RabbitMQ's own topic test table, the empty-word corner cases, and a
property test against a small recursive reference matcher."""

from __future__ import annotations

import functools
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines.routing import TopicRouter, make_router
from maxq_raft.machines.routing.topic import split_words

# -- a reference matcher, written independently of the trie ------------------------------------


def reference_split(key: str) -> tuple[str, ...]:
    # RabbitMQ split_topic_key: <<>> is [] (no words), otherwise split on every dot.
    return () if key == "" else tuple(key.split("."))


@functools.cache
def _ref(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        # zero words, or swallow one word and stay on "#"
        return _ref(rest, words) or (bool(words) and _ref(pattern, words[1:]))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _ref(rest, words[1:])


def reference_match(binding_key: str, routing_key: str) -> bool:
    return _ref(reference_split(binding_key), reference_split(routing_key))


def matches(binding_key: str, routing_key: str) -> bool:
    router = TopicRouter()
    router.add("q", binding_key, {})
    router.check_invariants()
    return router.route(routing_key, None) == ["q"]


# -- RabbitMQ deps/rabbit/test/routing_SUITE.erl, topic1/1 ----------------------------------------

RABBITMQ_BINDINGS = [
    ("a.b.c", "t1", {}),
    ("a.*.c", "t2", {}),
    ("a.#.b", "t3", {}),
    ("a.b.b.c", "t4", {}),
    ("#", "t5", {}),
    ("#.#", "t6", {}),
    ("#.b", "t7", {}),
    ("*.*", "t8", {}),
    ("a.*", "t9", {}),
    ("*.b.c", "t10", {}),
    ("a.#", "t11", {}),
    ("a.#.#", "t12", {}),
    ("b.b.c", "t13", {}),
    ("a.b.b", "t14", {}),
    ("a.b", "t15", {}),
    ("b.c", "t16", {}),
    ("", "t17", {}),
    ("*.*.*", "t18", {}),
    ("vodka.martini", "t19", {}),
    ("a.b.c", "t20", {}),
    ("*.#", "t21", {}),
    ("#.*.#", "t22", {}),
    ("*.#.#", "t23", {}),
    ("#.#.#", "t24", {}),
    ("*", "t25", {}),
    ("#.b.#", "t26", {}),
    ("args-test", "t27", {"foo": "bar"}),
    ("args-test", "t27", {"foo": "baz"}),  # "Note aliasing": same queue and key, other args
]

RABBITMQ_EXPECTED_BEFORE = {
    "a.b.c": "t1 t2 t5 t6 t10 t11 t12 t18 t20 t21 t22 t23 t24 t26",
    "a.b": "t3 t5 t6 t7 t8 t9 t11 t12 t15 t21 t22 t23 t24 t26",
    "a.b.b": "t3 t5 t6 t7 t11 t12 t14 t18 t21 t22 t23 t24 t26",
    "": "t5 t6 t17 t24",
    "b.c.c": "t5 t6 t18 t21 t22 t23 t24 t26",
    "a.a.a.a.a": "t5 t6 t11 t12 t21 t22 t23 t24",
    "vodka.gin": "t5 t6 t8 t21 t22 t23 t24",
    "vodka.martini": "t5 t6 t8 t19 t21 t22 t23 t24",
    "b.b.c": "t5 t6 t10 t13 t18 t21 t22 t23 t24 t26",
    "nothing.here.at.all": "t5 t6 t21 t22 t23 t24",
    "oneword": "t5 t6 t21 t22 t23 t24 t25",
    "args-test": "t5 t6 t21 t22 t23 t24 t25 t27",
}

# after removing bindings number 1, 5, 11, 19, 21 and 28 (1-based)
RABBITMQ_REMOVED = [1, 5, 11, 19, 21, 28]
RABBITMQ_EXPECTED_AFTER = {
    "a.b.c": "t2 t6 t10 t12 t18 t20 t22 t23 t24 t26",
    "a.b": "t3 t6 t7 t8 t9 t12 t15 t22 t23 t24 t26",
    "a.b.b": "t3 t6 t7 t12 t14 t18 t22 t23 t24 t26",
    "": "t6 t17 t24",
    "b.c.c": "t6 t18 t22 t23 t24 t26",
    "a.a.a.a.a": "t6 t12 t22 t23 t24",
    "vodka.gin": "t6 t8 t22 t23 t24",
    "vodka.martini": "t6 t8 t22 t23 t24",
    "b.b.c": "t6 t10 t13 t18 t22 t23 t24 t26",
    "nothing.here.at.all": "t6 t22 t23 t24",
    "oneword": "t6 t22 t23 t24 t25",
    "args-test": "t6 t22 t23 t24 t25 t27",
}


def test_rabbitmq_routing_suite_topic_table() -> None:
    router = make_router("topic")
    for key, queue, args in RABBITMQ_BINDINGS:
        assert router.add(queue, key, args)
    router.check_invariants()
    assert len(router) == 28
    # RabbitMQ compares with lists:usort; the suite's queues are numbered in binding order, so
    # our order (earliest matching binding first) is exactly the listed order.
    for routing_key, expected in RABBITMQ_EXPECTED_BEFORE.items():
        assert router.route(routing_key, None) == expected.split(), routing_key
    for number in RABBITMQ_REMOVED:
        key, queue, args = RABBITMQ_BINDINGS[number - 1]
        assert router.remove(queue, key, args)
    router.check_invariants()
    for routing_key, expected in RABBITMQ_EXPECTED_AFTER.items():
        assert router.route(routing_key, None) == expected.split(), routing_key
    # "remove the entire exchange ... none should match now"
    for _key, queue, _args in RABBITMQ_BINDINGS:
        router.remove_destination(queue)
    router.check_invariants()
    assert len(router) == 0
    for routing_key in ("a.b.c", "b.b.c", ""):
        assert router.route(routing_key, None) == []


# -- corner cases ---------------------------------------------------------------------------------

CORNER_CASES = [
    # (binding key, routing key, matches?)
    # The empty routing key is NO words (split_topic_key(<<>>) -> []), so "*" does not match it
    # (routing_SUITE: "" -> [t5 "#", t6 "#.#", t17 "", t24 "#.#.#"], not t25 "*").
    ("*", "", False),
    ("#", "", True),
    ("#.#", "", True),
    ("", "", True),
    ("", "a", False),
    ("", ".", False),
    ("*.#", "", False),
    ("#.*", "", False),
    # Empty words inside or at the ends of a key are words.
    ("a.*.b", "a..b", True),
    ("a..b", "a..b", True),
    ("a.b", "a..b", False),
    ("a.#.b", "a..b", True),
    ("*", ".", False),
    ("*.*", ".", True),
    (".", ".", True),
    ("#", ".", True),
    ("a.*", "a.", True),
    ("a", "a.", False),
    ("a.#", "a.", True),
    ("*.a", ".a", True),
    ("a.b", "a.b.", False),
    # "#" is zero or more words.
    ("a.#", "a", True),
    ("#.a", "a", True),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.b.c", False),
    ("#.a.#", "a", True),
    ("#.#.#.#.a", "a", True),
    ("#.#.#.#.a", "b.c.a", True),
    ("#.#.#.#.a", "a.b", False),
    ("#.*", "a", True),
    ("*.#.*", "a", False),
    ("*.#.*", "a.b", True),
    # "*" is exactly one word.
    ("*", "a", True),
    ("*", "a.b", False),
    ("*.*", "a", False),
    ("a.*", "a", False),
    # Exact words, case-sensitive.
    ("a", "A", False),
    ("a.b.c", "a.b.c", True),
    # Wildcards in the routing key are ordinary words.
    ("a.b", "a.*", False),
    ("a.*", "a.*", True),
    ("a", "#", False),
    ("#", "#", True),
    ("*", "#", True),
]


@pytest.mark.parametrize("binding_key, routing_key, expected", CORNER_CASES)
def test_topic_corner_cases(binding_key: str, routing_key: str, expected: bool) -> None:
    assert matches(binding_key, routing_key) is expected
    assert reference_match(binding_key, routing_key) is expected


def test_split_words_follows_rabbitmq() -> None:
    assert split_words("") == []
    assert split_words(".") == ["", ""]
    assert split_words("a..b") == ["a", "", "b"]
    assert split_words("a.") == ["a", ""]


def test_route_order_is_earliest_matching_binding() -> None:
    router = TopicRouter()
    router.add("q:late", "x.y", {})
    router.add("q:early", "#", {})
    router.add("q:late", "#", {})  # q:late's earliest binding does not match "a"
    assert router.route("a", None) == ["q:early", "q:late"]
    assert router.route("x.y", None) == ["q:late", "q:early"]


def test_same_destination_many_patterns_routes_once() -> None:
    router = TopicRouter()
    for key in ("a.*", "#", "a.b", "*.b", "a.#"):
        assert router.add("q", key, {})
    assert router.route("a.b", None) == ["q"]


def test_remove_prunes_the_trie() -> None:
    router = TopicRouter()
    router.add("q1", "a.b.c", {})
    router.add("q2", "a.b", {})
    router.add("q3", "a.#.c", {})
    assert router.remove("q1", "a.b.c", {})
    router.check_invariants()
    assert not router.remove("q1", "a.b.c", {})
    assert not router.remove("q1", "a.b.c.d", {})  # path does not even exist
    assert router.remove("q2", "a.b", {})
    assert router.remove("q3", "a.#.c", {})
    router.check_invariants()
    assert router._root.children == {}


def test_pathological_hash_patterns_are_fast() -> None:
    # RabbitMQ's recursive walk tries every way to split the key among the "#"s: for ten "#"
    # and a 200-word key that is ~C(210, 10) paths. The automaton walk is words x nodes.
    router = TopicRouter()
    pattern = ".".join(["#"] * 10 + ["a"])
    router.add("q:hash", pattern, {})
    router.add("q:mixed", "#.*.#.*.#.*.#.a", {})
    for i in range(2_000):
        router.add(f"q:{i}", f"k{i}.#.x{i % 7}", {})
    key_miss = ".".join(["b"] * 200)
    key_hit = key_miss + ".a"
    started = time.perf_counter()
    assert router.route(key_miss, None) == []
    assert router.route(key_hit, None) == ["q:hash", "q:mixed"]
    for i in range(200):
        assert router.route(f"k{i}.p.q.x{i % 7}", None) == [f"q:{i}"]
    elapsed_s = time.perf_counter() - started
    assert elapsed_s < 2.0, elapsed_s


# -- properties ----------------------------------------------------------------------------------

WORDS = st.sampled_from(["a", "b", "", "*", "#"])
KEY_WORDS = st.sampled_from(["a", "b", "", "*", "#", "c"])
binding_keys = st.lists(WORDS, max_size=5).map(".".join)
routing_keys = st.lists(KEY_WORDS, max_size=6).map(".".join)


@settings(max_examples=400, deadline=None)
@given(binding_key=binding_keys, routing_key=routing_keys)
def test_single_binding_agrees_with_reference(binding_key: str, routing_key: str) -> None:
    assert matches(binding_key, routing_key) is reference_match(binding_key, routing_key)


@settings(max_examples=150, deadline=None)
@given(
    bindings=st.lists(st.tuples(st.sampled_from(["q1", "q2", "q3", "q4"]), binding_keys), max_size=25),
    routing_keys_=st.lists(routing_keys, min_size=1, max_size=8),
)
def test_many_bindings_agree_with_reference(bindings: list[tuple[str, str]], routing_keys_: list[str]) -> None:
    router = TopicRouter()
    model: list[tuple[str, str]] = []
    for destination, key in bindings:
        added = router.add(destination, key, {})
        assert added is ((destination, key) not in model)
        if added:
            model.append((destination, key))
    router.check_invariants()
    for routing_key in routing_keys_:
        expected: list[str] = []
        for destination, key in model:
            if reference_match(key, routing_key) and destination not in expected:
                expected.append(destination)
        assert router.route(routing_key, None) == expected
