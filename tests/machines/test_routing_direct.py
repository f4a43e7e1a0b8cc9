"""Direct exchange routing: exact, case-sensitive routing-key equality (RabbitMQ
rabbit_exchange_type_direct)."""

from __future__ import annotations

import pytest

from maxq_raft.machines.routing import DirectRouter, make_router

CASES = [
    # (binding key, routing key, matches?)
    ("a", "a", True),
    ("a", "b", False),
    ("a", "A", False),  # binaries compare byte for byte
    ("", "", True),  # the empty key is an ordinary key
    ("", "a", False),
    ("a.b", "a.b", True),
    ("a.*", "a.b", False),  # no wildcards
    ("#", "a", False),
    ("#", "#", True),
    ("a ", "a", False),
]


@pytest.mark.parametrize("binding_key, routing_key, expected", CASES)
def test_direct_matching(binding_key: str, routing_key: str, expected: bool) -> None:
    router = DirectRouter()
    router.add("q", binding_key, {})
    router.check_invariants()
    assert (router.route(routing_key, None) == ["q"]) is expected


def test_direct_many_destinations_in_binding_order() -> None:
    router = make_router("direct")
    assert router.add("q:2", "k", {})
    assert router.add("q:1", "k", {})
    assert router.add("q:3", "other", {})
    assert router.add("q:2", "k", {"x-arg": 1})  # same destination and key, other arguments
    assert not router.add("q:1", "k", {})
    assert router.route("k", None) == ["q:2", "q:1"]
    assert router.route("other", {"ignored": True}) == ["q:3"]
    assert router.remove("q:2", "k", {})
    # q:2 is still bound through its second binding, now later than q:1's
    assert router.route("k", None) == ["q:1", "q:2"]
    assert router.remove_destination("q:2") == 1
    assert router.route("k", None) == ["q:1"]
    router.check_invariants()


def test_direct_same_destination_several_keys() -> None:
    router = DirectRouter()
    router.add("q", "a", {})
    router.add("q", "b", {})
    assert router.route("a", None) == ["q"]
    assert router.route("b", None) == ["q"]
    assert router.remove_destination("q") == 2
    assert router.route("a", None) == [] and len(router) == 0
    router.check_invariants()
