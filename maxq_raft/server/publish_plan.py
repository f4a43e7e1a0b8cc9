"""How a plain publish was routed and made into messages, for the publishes like it behind it.

A publisher mostly sends the same exchange, routing key and properties again and again; the
connection hands such a run over at once (amqp/events.py, PublishesReceived). The session checks
and routes the first publish the whole way (`Session.route_publish`); when nothing about it
depends on the message itself (no headers, no publish rate limit, routed to a queue),
it returns this plan, and the rest of the run is queued by it (`Session.route_again`): the same
queues, the same kind of message, with none of the checks and lookups repeated. A publish to a
traced queue has a plan too when its trace id comes from a template and is numbered: each of
the rest gets its own id, numbered in a row.
"""

from __future__ import annotations

from typing import NamedTuple


class PublishPlan(NamedTuple):
    queues: list[str]
    props_raw: bytes  # as queued (a direct reply-to address rewritten), before any trace id
    persistent: bool
    ttl_ms: int | None
    priority: int
    delay_ms: int | None
    trace_template: tuple[bytes, bytes] | None  # the trace id's property list around its number
