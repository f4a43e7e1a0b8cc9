"""Fanout exchange routing: every bound destination, once, whatever the routing key (RabbitMQ
rabbit_exchange_type_fanout)."""

from __future__ import annotations

from maxq_raft.machines.routing import FanoutRouter, make_router


def test_fanout_routes_to_everything_once() -> None:
    router = make_router("fanout")
    assert router.route("k", None) == []
    assert router.add("q:b", "", {})
    assert router.add("q:a", "x", {})
    assert router.add("e:c", "y", {"z": 1})
    assert router.add("q:b", "other", {})  # a second binding of q:b
    for key in ("", "k", "x", "a.b.#"):
        assert router.route(key, None) == ["q:b", "q:a", "e:c"]
    assert router.route("", {"h": 1}) == ["q:b", "q:a", "e:c"]
    router.check_invariants()


def test_fanout_order_follows_remaining_bindings() -> None:
    router = FanoutRouter()
    router.add("q:1", "a", {})
    router.add("q:2", "", {})
    router.add("q:1", "b", {})
    assert router.route("", None) == ["q:1", "q:2"]
    assert router.remove("q:1", "a", {})
    # q:1's earliest remaining binding is now after q:2's
    assert router.route("", None) == ["q:2", "q:1"]
    router.check_invariants()
    assert router.remove_destination("q:1") == 1
    assert router.route("", None) == ["q:2"]
    assert not router.remove("q:2", "nope", {})
    assert router.remove("q:2", "", {})
    assert router.route("", None) == [] and len(router) == 0
    router.check_invariants()


def test_fanout_result_is_a_copy() -> None:
    router = FanoutRouter()
    router.add("q", "", {})
    router.route("", None).append("junk")
    assert router.route("", None) == ["q"]
