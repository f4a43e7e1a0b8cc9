"""The direct exchange: a message goes to the bindings whose key equals its routing key.

Theory of operation: an index from routing key to the bindings with that key, each bucket a
dict in insertion order. Routing is one dict lookup; a bucket is already in binding order
because sequence numbers only grow and a re-added binding is appended. RabbitMQ's direct
exchange (rabbit_exchange_type_direct / rabbit_db_binding:match_routing_key) compares the key
as an exact binary: no wildcards, case-sensitive, "" is an ordinary key.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Binding, BindingIdentity, Router, distinct_destinations


class DirectRouter(Router):
    exchange_type = "direct"

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, dict[BindingIdentity, Binding]] = {}

    def route(self, routing_key: str, headers: Mapping[str, object] | None = None) -> list[str]:
        bucket = self._by_key.get(routing_key)
        if not bucket:
            return []
        return distinct_destinations(bucket.values())

    def _index_add(self, binding: Binding) -> None:
        self._by_key.setdefault(binding.routing_key, {})[binding.identity] = binding

    def _index_remove(self, binding: Binding) -> None:
        bucket = self._by_key[binding.routing_key]
        del bucket[binding.identity]
        if not bucket:
            # Drop empty buckets so memory follows the live bindings.
            del self._by_key[binding.routing_key]

    def _check_index(self) -> None:
        count = 0
        for key, bucket in self._by_key.items():
            assert bucket, f"empty bucket for key {key!r}"
            seqs = [b.seq for b in bucket.values()]
            assert seqs == sorted(seqs)
            for identity, binding in bucket.items():
                assert binding.routing_key == key
                assert self._bindings.get(identity) is binding
                count += 1
        assert count == len(self._bindings)
