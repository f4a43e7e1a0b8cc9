"""The fanout exchange: a message goes to every bound destination; the routing key is ignored.

Theory of operation: the answer depends only on the bindings, so it is computed once and
cached until the next add or remove (RabbitMQ's rabbit_exchange_type_fanout likewise returns
every destination of the exchange without looking at the key). A destination bound several
times (with different keys or arguments) receives the message once.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Binding, Router, distinct_destinations


class FanoutRouter(Router):
    exchange_type = "fanout"

    def __init__(self) -> None:
        super().__init__()
        self._route_cache: list[str] | None = None

    def route(self, routing_key: str, headers: Mapping[str, object] | None = None) -> list[str]:
        if self._route_cache is None:
            self._route_cache = distinct_destinations(self._bindings.values())
        # A copy: the caller owns the list it is given.
        return list(self._route_cache)

    def _index_add(self, binding: Binding) -> None:
        self._route_cache = None

    def _index_remove(self, binding: Binding) -> None:
        self._route_cache = None

    def _check_index(self) -> None:
        if self._route_cache is not None:
            assert self._route_cache == distinct_destinations(self._bindings.values())
