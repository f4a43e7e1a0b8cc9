"""The binding table every exchange type shares, and the interface a router offers.

Theory of operation: a router holds the bindings of ONE exchange. A binding is identified, as
in RabbitMQ's `#binding{source, key, destination, args}`, by (destination, routing key,
arguments), so one destination may be bound several times with different keys or arguments.
`Router` keeps the bindings in a dict in insertion order (the order `bindings()` reports) and
an index by destination (for `remove_destination` when a queue or exchange is deleted); each
exchange type adds its own routing index through the `_index_add` / `_index_remove` hooks and
implements `route`.

Arguments are AMQP field tables decoded to Python values. They are compared for identity
through `canonical_arguments`, a hashable, typed encoding: RabbitMQ matches a binding's
arguments as an exact Erlang term (top-level table sorted by key, `rabbit_misc:
sort_field_table`), so `{bool, true}` and `{signedint, 1}` are different bindings, while
Python's `True == 1` would alias them.

Everything here is deterministic: only dicts and lists are iterated, and route results are
ordered by binding sequence numbers handed out in operation order, so every replica that
applies the same commands in the same order gives the same answers, byte for byte.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, TypeAlias

# A hashable, typed encoding of a field-table value (see canonical_value).
CanonicalValue: TypeAlias = tuple[Any, ...]
# (destination, routing_key, canonical arguments): the identity of a binding.
BindingIdentity: TypeAlias = tuple[str, str, tuple[tuple[bytes, CanonicalValue], ...]]


def canonical_value(value: object) -> CanonicalValue:
    """A hashable encoding of one field value that keeps the AMQP type distinctions we can see.

    bool is tested before int because bool is a subclass of int in Python. str and bytes both
    stand for a longstr (the decoder gives str when the bytes are valid UTF-8), so they share
    one encoding. Nested tables keep their order: RabbitMQ sorts only the top-level table of
    binding arguments.
    """
    if value is None:
        return ("void",)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", int(value))
    if isinstance(value, float):
        # float.hex is exact and makes NaN equal to itself, so the key stays usable in a dict.
        return ("float", value.hex())
    if isinstance(value, str):
        return ("longstr", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("longstr", bytes(value))
    if isinstance(value, decimal.Decimal):
        return ("decimal", value.as_tuple())
    if isinstance(value, datetime.datetime):
        return ("timestamp", value.isoformat())
    if isinstance(value, Mapping):
        return ("table", tuple((_key_bytes(k), canonical_value(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(canonical_value(v) for v in value))
    # An unknown type: its name and repr still make a deterministic identity.
    return (type(value).__name__, repr(value))


def canonical_arguments(
    arguments: Mapping[str, object] | None,
) -> tuple[tuple[bytes, CanonicalValue], ...]:
    """The identity of a binding's argument table: its items sorted by key, values canonical.

    Sorting follows rabbit_binding, which stores `rabbit_misc:sort_field_table(Args)`, so the
    order the client sent the arguments in does not make a different binding.
    """
    if not arguments:
        return ()
    return tuple(sorted((_key_bytes(k), canonical_value(v)) for k, v in arguments.items()))


def _key_bytes(key: object) -> bytes:
    # Table keys are shortstr; compare them as bytes, like Erlang compares binaries.
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    return repr(key).encode("utf-8")


class Binding:
    """One binding of the exchange: what the client bound, plus our bookkeeping."""

    __slots__ = ("destination", "routing_key", "arguments", "identity", "seq")

    def __init__(
        self,
        destination: str,
        routing_key: str,
        arguments: dict[str, object],
        identity: BindingIdentity,
        seq: int,
    ) -> None:
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments
        self.identity = identity
        # Position in operation order; route results are ordered by it.
        self.seq = seq

    def __repr__(self) -> str:
        return f"Binding({self.destination!r}, {self.routing_key!r}, {self.arguments!r}, seq={self.seq})"


def distinct_destinations(bindings: Iterable[Binding]) -> list[str]:
    """Destinations of `bindings` (already in the wanted order), each once, first one wins."""
    seen: dict[str, None] = {}
    for binding in bindings:
        seen.setdefault(binding.destination, None)
    return list(seen)


class Router:
    """The bindings of one exchange and the routing decision over them.

    Subclasses set `exchange_type`, implement `route`, and keep their routing index in step
    through `_index_add` / `_index_remove` (called after the shared tables are updated on add,
    before they are updated on remove).
    """

    exchange_type: ClassVar[str] = ""

    def __init__(self) -> None:
        self._bindings: dict[BindingIdentity, Binding] = {}
        self._by_destination: dict[str, dict[BindingIdentity, Binding]] = {}
        self._seq_next = 0

    # -- the interface -------------------------------------------------------------------------

    @classmethod
    def validate_binding_arguments(cls, arguments: Mapping[str, object] | None) -> str | None:
        """RabbitMQ's `validate_binding` callback: an error text (406) or None. Most types accept
        any arguments."""
        return None

    def add(self, destination: str, routing_key: str, arguments: Mapping[str, object] | None) -> bool:
        """Bind; False if this exact (destination, routing_key, arguments) is already bound."""
        identity = _identity(destination, routing_key, arguments)
        if identity in self._bindings:
            return False
        binding = Binding(destination, routing_key, dict(arguments or {}), identity, self._seq_next)
        self._seq_next += 1
        self._bindings[identity] = binding
        self._by_destination.setdefault(destination, {})[identity] = binding
        self._index_add(binding)
        return True

    def remove(self, destination: str, routing_key: str, arguments: Mapping[str, object] | None) -> bool:
        """Unbind; False if no such binding exists."""
        binding = self._bindings.get(_identity(destination, routing_key, arguments))
        if binding is None:
            return False
        self._drop(binding)
        return True

    def remove_destination(self, destination: str) -> int:
        """Drop every binding to `destination` (its queue or exchange was deleted); how many."""
        group = self._by_destination.get(destination)
        if not group:
            return 0
        doomed = list(group.values())
        for binding in doomed:
            self._drop(binding)
        assert destination not in self._by_destination
        return len(doomed)

    def route(self, routing_key: str, headers: Mapping[str, object] | None = None) -> list[str]:
        """The destinations a message with this routing key and headers goes to: each once,
        ordered by the earliest binding (in `bindings()` order) that matched it."""
        raise NotImplementedError

    def bindings(self) -> list[tuple[str, str, dict[str, object]]]:
        """Every binding as (destination, routing_key, arguments), in insertion order."""
        return [(b.destination, b.routing_key, dict(b.arguments)) for b in self._bindings.values()]

    def destinations(self) -> list[str]:
        """Every bound destination, once each, in the order it was first bound."""
        return list(self._by_destination)

    def __len__(self) -> int:
        return len(self._bindings)

    def check_invariants(self) -> None:
        """Assert that the shared tables and the type's index agree (for tests and simulation)."""
        seqs = [b.seq for b in self._bindings.values()]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "binding order broken"
        assert all(seq < self._seq_next for seq in seqs)
        count = 0
        for destination, group in self._by_destination.items():
            assert group, f"empty destination group {destination!r}"
            for identity, binding in group.items():
                assert binding.destination == destination
                assert self._bindings.get(identity) is binding
                count += 1
        assert count == len(self._bindings)
        for identity, binding in self._bindings.items():
            assert binding.identity == identity
            recomputed = _identity(binding.destination, binding.routing_key, binding.arguments)
            assert identity == recomputed
        self._check_index()

    # -- hooks for the exchange types ----------------------------------------------------------

    def _index_add(self, binding: Binding) -> None:
        pass

    def _index_remove(self, binding: Binding) -> None:
        pass

    def _check_index(self) -> None:
        pass

    # -- internals -----------------------------------------------------------------------------

    def _drop(self, binding: Binding) -> None:
        self._index_remove(binding)
        del self._bindings[binding.identity]
        group = self._by_destination[binding.destination]
        del group[binding.identity]
        if not group:
            del self._by_destination[binding.destination]


def _identity(destination: str, routing_key: str, arguments: Mapping[str, object] | None) -> BindingIdentity:
    return (destination, routing_key, canonical_arguments(arguments))
