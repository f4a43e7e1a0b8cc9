"""Publisher confirms: sent in order per channel once what carried the publishes is done.

Theory of operation: a log (local_log.py, cluster.py) answers each `submit` with a `Pending`:
something that becomes done, with an error or without, once the command is durable (a cluster:
the entry carrying it committed on a majority, fsynced there; a single node: the fsync of the
store that covered its writes, at once when it wrote nothing durable). The publishes of one
socket read of one connection form a `ConfirmBatch`, which waits for every Pending that carried
one of its messages; `Confirms.after` queues the batch's confirm seqs per channel, and a
channel's confirms go out in order when the batches at its front are complete: `basic.ack`
(with `multiple` when it covers more than one publish, as RabbitMQ), `basic.nack` when a Pending
failed, one by one when a reject-publish queue refused some, and, when an outcome is unknown
(a proposal that timed out may still commit), neither: the connection is closed so the
publisher treats them as in doubt.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import trio

from ..amqp import spec

log = logging.getLogger("maxq.confirms")

UNKNOWN_OUTCOME = ("timeout", "stopped")  # a failure after which the command may still be applied


class Unavailable(NamedTuple):
    """Stands in for a machine's reply when the command could not be committed: `reason` is the
    engine's ("not leader", "timeout": the outcome is unknown, "busy", "stopped")."""

    reason: str


class Pending:
    """What a submit returns: done once its command is durable (or failed: `error`)."""

    __slots__ = ("done", "error", "confirms")

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.confirms: list[ConfirmBatch] = []


class ConfirmBatch:
    """The confirms of one read of one connection: sent when all its Pendings are done."""

    __slots__ = ("remaining", "failed", "unknown", "refused", "then")

    def __init__(self, remaining: int = 0) -> None:
        self.remaining = remaining
        self.failed = False
        self.unknown = False  # an outcome is unknown: neither ack nor nack (close instead)
        self.refused: dict | None = None  # channel number -> confirm seqs a reject-publish queue refused
        self.then: Callable[[bool], None] | None = None  # for `Confirms.when_done`: then(ok)


class Confirms:
    def __init__(self) -> None:
        self.waits: dict[Any, deque] = {}  # channel -> deque of (ConfirmBatch, confirm seqs)

    def after(self, pendings: list[Pending], channel_seqs: list, batch: ConfirmBatch | None = None) -> None:
        """Confirm each channel's seqs once every one of `pendings` is done."""
        if batch is None:
            batch = ConfirmBatch()
        batch.remaining = sum(1 for p in pendings if not p.done)
        for pending in pendings:
            if not pending.done:
                pending.confirms.append(batch)
            elif pending.error is not None:
                batch.failed = True
                if pending.error in UNKNOWN_OUTCOME:
                    batch.unknown = True
        for channel, seqs in channel_seqs:
            waits = self.waits.get(channel)
            if waits is None:
                waits = self.waits[channel] = deque()
            waits.append((batch, seqs))  # the channel's confirm seqs of this read, in order
        if batch.remaining == 0:
            self._ready()

    def when_done(self, pendings: list[Pending], then: Callable[[bool], None]) -> None:
        """then(ok) once every one of `pendings` is done (ok: none failed)."""
        batch = ConfirmBatch(sum(1 for p in pendings if not p.done))
        batch.then = then
        for pending in pendings:
            if not pending.done:
                pending.confirms.append(batch)
            elif pending.error is not None:
                batch.failed = True
        if batch.remaining == 0:
            then(not batch.failed)

    def done(self, pending: Pending, error: str | None) -> None:
        """`pending` is done (error None: durable); release what waited on it. Idempotent."""
        if pending.done:
            return
        pending.done = True
        pending.error = error
        ready = False
        for batch in pending.confirms:
            batch.remaining -= 1
            if error is not None:
                batch.failed = True
                if error in UNKNOWN_OUTCOME:
                    batch.unknown = True
            if batch.remaining == 0:
                if batch.then is not None:
                    _call(batch.then, not batch.failed)
                else:
                    ready = True
        pending.confirms = []
        if ready:
            self._ready()

    def _ready(self) -> None:
        for channel, waits in list(self.waits.items()):
            session = channel.session
            number = channel.number
            closing = session.closing_channels.get(number) is channel  # closed by the client
            alive = (closing or session.channels.get(number) is channel) and not session.finished
            sent = False
            while waits and waits[0][0].remaining == 0:
                batch, seqs = waits.popleft()
                last_seq = seqs[-1]
                multiple = channel.state.confirm_through(last_seq)  # (the channel's confirms are in order)
                refused = batch.refused.get(channel.number) if batch.refused else None
                if alive and batch.unknown:
                    # Neither ack nor nack is true: the publisher must treat them as in doubt.
                    session.conn.close(
                        spec.CONNECTION_FORCED,
                        "publish outcome unknown after a leader change; reconnect and republish what was not confirmed",
                        now=trio.current_time(),
                    )
                    alive = False
                    sent = True
                elif alive and refused and not batch.failed:
                    # Some were refused (reject-publish): one by one, no `multiple` covering a nack.
                    for seq in seqs:
                        method = spec.BasicNack if seq in refused else spec.BasicAck
                        session.conn.send_method(channel.number, method(delivery_tag=seq, multiple=False))
                    session.broker.messages_confirmed += sum(1 for seq in seqs if seq not in refused)
                    sent = True
                elif alive:
                    # In order; multiple=true when it covers more than one publish, as RabbitMQ.
                    kind = (
                        spec.BasicNack(delivery_tag=last_seq, multiple=multiple)
                        if batch.failed
                        else spec.BasicAck(delivery_tag=last_seq, multiple=multiple)
                    )
                    session.conn.send_method(channel.number, kind)
                    if not batch.failed:
                        session.broker.messages_confirmed += len(seqs)  # (one add per batch)
                    sent = True
            if not waits:
                del self.waits[channel]
                if closing:
                    del session.closing_channels[number]
                    session.conn.finish_peer_close(number)  # its close-ok, after its last confirm
                    sent = True
            if sent:
                session.wake()
                session.send_soon()


def _call(then: Callable[[Any], None], value: Any) -> None:
    try:
        then(value)
    except Exception:  # the continuations handle their own errors; this is the backstop
        log.exception("continuation failed")
