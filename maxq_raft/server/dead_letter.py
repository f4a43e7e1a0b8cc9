"""Performing the queue machine's feature effects: dead letters, expired queues, and the ticker.

Theory of operation: a queue machine that drops a message for a dead-letter exchange returns a
`DeadLetter` effect and keeps the message (and its stored copy) in `dead_lettering`. Here each
message is rewritten as RabbitMQ's rabbit_dead_letter does (the x-death history, the
x-first-death-* and x-last-death-* headers, `expiration` removed and kept as
`original-expiration`), routed through the dead-letter exchange by the metadata machine (with the
dead-letter routing key, or the message's own routing keys: the publish key and its CC keys),
enqueued to every target not in a fully automatic cycle, and only then confirmed to the source
with `DeadLettered`, so the source forgets (and deletes from its store) only what the targets
have: at-least-once. A missing dead-letter exchange or no target drops the message, as
RabbitMQ does.

`QueueExpired` (x-expires) deletes the queue. In a cluster every member's machine returns these
effects; the member that leads the queue's shard performs them (a single node leads all).
The ticker that makes time pass for queues without traffic is `CommandLog.tick_queues`.
"""

from __future__ import annotations

import logging

from ..amqp.properties import encode_properties
from ..amqp.values import Long, Timestamp
from ..machines import commands as qc
from ..machines.message import Message
from ..machines.queue_types import DeadLetter, QueueExpired
from . import transactions
from .publish_extras import stored_properties

log = logging.getLogger("maxq.dead_letter")

DEAD_LETTER_STALE_MS = 5000  # held this long by nobody: a shard leader performs it again


def perform_effect(broker, effect) -> None:
    """The broker's `perform` hands every effect that is not a `Deliver` here."""
    kind = type(effect)
    if kind is DeadLetter:
        # Every member's machine returns it; the source shard's leader acts on it.
        if broker.log.leads_queue((effect.vhost, effect.queue)):
            dead_letter(broker, effect)
    elif transactions.perform_effect(broker, effect):
        pass  # a transaction's check-back or time-out (transactions.py)
    elif kind is QueueExpired:
        key = (effect.vhost, effect.name)
        if key in broker.queues and broker.log.leads_queue(key):
            log.info("queue '%s' in vhost '%s' expired (x-expires): deleted", effect.name, effect.vhost)
            broker.delete_queue(key)
    else:
        log.warning("unknown queue effect %s ignored", kind.__name__)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _cc_keys(headers: dict) -> list[str]:
    cc = headers.get("CC")
    if isinstance(cc, (list, tuple)):
        return [_text(key) for key in cc if isinstance(key, (str, bytes))]
    return []


def update_x_death(
    headers: dict, reason: str, queue: str, time_s: int, exchange: str, routing_keys: list, expiration: str | None
) -> None:
    """Record one death in `headers`, as rabbit_dead_letter / mc do.

    x-death is an array of tables, most recent death first, one per (queue, reason): a repeated
    death increments that entry's `count` and moves it to the front. x-first-death-* are set
    once, x-last-death-* every time (RabbitMQ 3.13 and later)."""
    info = {
        "count": Long(1),
        "reason": reason,
        "queue": queue,
        "time": Timestamp(time_s),
        "exchange": exchange,
        "routing-keys": list(routing_keys),
    }
    if expiration is not None:
        info["original-expiration"] = expiration
    deaths = headers.get("x-death")
    if deaths is None:
        headers["x-first-death-reason"] = reason
        headers["x-first-death-queue"] = queue
        headers["x-first-death-exchange"] = exchange
        headers["x-death"] = [info]
    elif isinstance(deaths, list):
        others = []
        match = None
        for entry in deaths:
            if (
                match is None
                and isinstance(entry, dict)
                and _text(entry.get("queue", "")) == queue
                and _text(entry.get("reason", "")) == reason
            ):
                match = entry
            else:
                others.append(entry)
        if match is None:
            headers["x-death"] = [info, *others]
        else:
            count = match.get("count", 0)
            updated = dict(match)
            updated["count"] = (count if isinstance(count, int) else 0) + 1
            headers["x-death"] = [dict(sorted(updated.items())), *others]
        for entry in headers["x-death"]:
            # Decoded counts are plain ints again: RabbitMQ's type for them is long.
            if isinstance(entry, dict) and isinstance(entry.get("count"), int) and not isinstance(entry["count"], bool):
                entry["count"] = Long(entry["count"])
    else:
        # Not an array (a client re-published it converted): RabbitMQ resets it.
        headers["x-death"] = [info]
    headers["x-last-death-reason"] = reason
    headers["x-last-death-queue"] = queue
    headers["x-last-death-exchange"] = exchange


def is_cycle(queue: str, deaths) -> bool:
    """rabbit_dead_letter:is_cycle: `queue` is in the history and every death since its own
    (inclusive) was automatic (not `rejected`): delivering there again would loop forever."""
    if not isinstance(deaths, list):
        return False
    for entry in deaths:
        if not isinstance(entry, dict):
            return False  # something a client put there: not fully automatic
        if _text(entry.get("reason", "")) == "rejected":
            return False
        if _text(entry.get("queue", "")) == queue:
            return True
    return False


def dead_letter(broker, effect: DeadLetter) -> None:
    vhost = effect.vhost
    source_key = (vhost, effect.queue)
    exchange = effect.exchange
    targets: dict[str, list] = {}
    if broker.meta.exchange(vhost, exchange) is None:
        log.debug(
            "dead-letter exchange '%s' of queue '%s' does not exist: %d messages dropped",
            exchange,
            effect.queue,
            len(effect.messages),
        )
    else:
        time_s = effect.time_ms // 1000
        for message in effect.messages:
            _route_one(broker, effect, message, time_s, targets)
    seqs = [m.seq for m in effect.messages if m.seq >= 0]
    log_ = broker.log
    # At-least-once: the source forgets them once the targets have them, durably.
    entries = [log_.submit((vhost, name), qc.Enqueue(messages), None) for name, messages in targets.items()]
    in_flight = log_.dead_letters_in_flight
    in_flight.update((source_key, seq) for seq in seqs)

    def committed(ok: bool) -> None:
        if ok and seqs:
            log_.submit(
                source_key,
                qc.DeadLettered(seqs),
                lambda _reply: in_flight.difference_update((source_key, seq) for seq in seqs),
            )
            return
        in_flight.difference_update((source_key, seq) for seq in seqs)
        if not ok:
            log.warning(
                "dead letters of queue '%s' not committed; they stay held in it (performed again "
                "later by its shard's leader)",
                effect.queue,
            )

    log_.when_committed(entries, committed)


def held_dead_letters(queue, now_ms: int, skip) -> list[DeadLetter]:
    """Dead letters `queue` still holds that nobody is performing (`skip(seq)`), for at least
    DEAD_LETTER_STALE_MS: their performer (an earlier leader of the queue's shard) failed between
    the targets' commit and the source's `DeadLettered`. One effect per reason, in seq order."""
    by_reason: dict[str, list[Message]] = {}
    for seq, message in sorted(queue.dead_lettering.items()):
        death = message.death
        if death is None or skip(seq) or death[1] > now_ms - DEAD_LETTER_STALE_MS:
            continue
        by_reason.setdefault(death[0], []).append(message)
    settings = queue.settings
    return [
        DeadLetter(
            queue.vhost,
            queue.name,
            reason,
            messages,
            messages[0].death[1],
            settings.dead_letter_exchange or "",
            settings.dead_letter_routing_key,
        )
        for reason, messages in by_reason.items()
    ]


def _route_one(broker, effect: DeadLetter, message: Message, time_s: int, targets: dict) -> None:
    props = stored_properties(message)
    headers = dict(props.headers) if isinstance(props.headers, dict) else {}
    routing_keys = [message.routing_key, *_cc_keys(headers)]
    update_x_death(headers, effect.reason, effect.queue, time_s, message.exchange, routing_keys, props.expiration)
    if effect.routing_key is not None:
        routing_keys = [effect.routing_key]
        headers.pop("CC", None)
    props.headers = headers
    props.expiration = None
    props_raw = encode_properties(props)
    queues: dict[str, None] = {}
    for key in routing_keys:
        for name in broker.meta.route(effect.vhost, effect.exchange, key, headers):
            queues[name] = None
    deaths = headers["x-death"]
    for name in queues:
        if effect.reason != "rejected" and is_cycle(name, deaths):
            log.warning("message dropped: dead-letter cycle through queue '%s' in vhost '%s'", name, effect.vhost)
            continue
        batch = targets.get(name)
        copy = Message(
            effect.exchange, routing_keys[0], props_raw, message.body, message.persistent, priority=props.priority or 0
        )
        if batch is None:
            targets[name] = [copy]
        else:
            batch.append(copy)
