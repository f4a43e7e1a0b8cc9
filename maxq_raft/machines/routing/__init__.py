"""Routing: the bindings of an exchange and which destinations a message goes to.

Theory of operation: one router object per exchange, of the class its type names (one module
per type: direct, fanout, topic, headers). A router is pure, deterministic state: the
metadata machine adds and removes bindings as commands are applied and asks `route` where a
published message goes. Destinations are opaque strings chosen by the caller (for example
"q:name" for a queue and "e:name" for an exchange); following exchange-to-exchange bindings,
the mandatory flag and alternate exchanges are the caller's business.

The caller turns the errors RabbitMQ would raise into AMQP replies: an unknown type is a
KeyError from `make_router` (RabbitMQ: 503 COMMAND_INVALID "invalid exchange type 'foo'"), and
`validate_binding_arguments` gives the text of a 406 PRECONDITION_FAILED for a bad binding
(RabbitMQ's exchange-type `validate_binding`, which runs on bind only, not on unbind).
`Router.add` does not validate: call `validate_binding_arguments` first.
"""

from __future__ import annotations

from collections.abc import Mapping

from .base import Router
from .direct import DirectRouter
from .fanout import FanoutRouter
from .headers import HeadersRouter
from .topic import TopicRouter

__all__ = [
    "EXCHANGE_TYPES",
    "DirectRouter",
    "FanoutRouter",
    "HeadersRouter",
    "Router",
    "TopicRouter",
    "make_router",
    "validate_binding_arguments",
]

EXCHANGE_TYPES: dict[str, type[Router]] = {
    "direct": DirectRouter,
    "fanout": FanoutRouter,
    "topic": TopicRouter,
    "headers": HeadersRouter,
}


def make_router(exchange_type: str) -> Router:
    """A new, empty router for `exchange_type`; KeyError if the type is unknown."""
    return EXCHANGE_TYPES[exchange_type]()


def validate_binding_arguments(exchange_type: str, arguments: Mapping[str, object] | None) -> str | None:
    """The text of RabbitMQ's 406 PRECONDITION_FAILED for a binding with these arguments, or
    None if they are acceptable. KeyError if the type is unknown, as for `make_router`.

    Only the headers exchange checks anything (its x-match value), for example
    'Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x'.
    The text is what RabbitMQ formats; the "PRECONDITION_FAILED - " prefix of the reply text
    is the caller's.
    """
    return EXCHANGE_TYPES[exchange_type].validate_binding_arguments(arguments)
