"""Message trace (x-trace): every step of a traced queue's messages as a record, derived from
the applied log.

Theory of operation: the applier (applier.py) asks `Tracer.traced` whether a command's queue
traces (one dict test per applied queue command: nothing else when no queue traces). For one
that does, `before` notes what the command will take away (the messages an ack, reject,
requeue or SQS delete names, read from the machine before it applies) and `after` turns the
command, the machine's reply and effects, and what the machine dropped (`trace_dropped`) into
records: published (the publisher's context the Enqueue carries: server/session.py adds it for
traced queues only), enqueued, refused, delivered, acked, rejected, requeued, received (SQS),
deleted (SQS), dead-lettered, expired, dropped, purged. All of it is in the log and the
machines are deterministic, so every member makes the same records with the same keys, stamped
with the queue's time (`now_ms`, the broker's time in the log entry), and writes them to its
own trace store (trace_store.py). The hot steps go in the store's lean shapes (its groups):
a command's publishes one group, in which a run of publishes the session sent as one (commands.py,
Enqueue.trace) is one entry when its messages were all enqueued in a row; deliveries and acks
by seq alone.

A message is found by its `message_id` property or, without one, by the `x-maxq-trace-id`
header the publishing node adds to a message routed to a traced queue (server/session.py); the
`correlation_id` property is indexed too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from operator import attrgetter, itemgetter
from typing import Any, get_args

import trio

from ..amqp.properties import CORRELATION_ID_FLAG, MESSAGE_ID_FLAG, decode_properties, encode_properties
from ..machines import commands as qc
from ..machines.message import Message
from ..machines.queue_types import (
    DeadLetter,
    Deliver,
    Effect,
    HandleResult,
    Meta,
    Overflowed,
    Received,
    Rejected,
)
from .trace_store import (
    ACK_GROUP,
    DELIVER_GROUP,
    FLUSH_INTERVAL_S,
    PUBLISH_GROUP,
    TRACE_ID_DIGITS,
    TRACE_RETENTION_BYTES_DEFAULT,
    TRACE_RETENTION_MS_DEFAULT,
    Record,
    TraceLog,
)

log = logging.getLogger("maxq.trace")

TRACE_ID_HEADER = "x-maxq-trace-id"
# How often retention runs: often enough that a short x-trace-retention is honoured within
# seconds; a pass over a store without trace records is one scan of an empty range.
COMPACT_INTERVAL_S = 2.0
# Property lists whose ids are kept: a message's are asked at each of its steps, and one with an
# x-maxq-trace-id is unique, so the cache must outlast a window of messages (64 Ki: a few MiB).
_IDS_CACHED_MAX = 65536


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    return str(value)


_TRACE_ID_KEY = bytes((len(TRACE_ID_HEADER),)) + TRACE_ID_HEADER.encode() + b"S"  # in a field table
_ID_FLAGS = MESSAGE_ID_FLAG | CORRELATION_ID_FLAG
# a delivered message's seq and delivery count, read in C over a command's deliveries (Tracer._records)
_SEQ = attrgetter("seq")
_DELIVERY_COUNT = attrgetter("delivery_count")
_MESSAGE = itemgetter(1)  # (a Deliver's message)
# Of a queue machine's effects only a Deliver holds a Message second, so the Enqueue shortcut of
# Tracer._records tells that its effects are all deliveries by their second items alone.
if [kind for kind in get_args(Effect) if kind._fields[1] == "message"] != [Deliver]:
    raise ImportError("tracer.py: an effect other than Deliver holds a message second (Tracer._records)")
_CORRELATION_BYTE = CORRELATION_ID_FLAG >> 8  # (its bit in the first byte of the property flags)
assert CORRELATION_ID_FLAG & 0xFF == 0


def trace_id_template(props_raw: bytes, connection: str) -> tuple[bytes, bytes] | None:
    """For a publish routed to a traced queue: its properties with an `x-maxq-trace-id` header
    ("node@connection-n", unique in the cluster) as (prefix, suffix) around the digits of n, so
    that each publish with these properties costs a concatenation (`with_trace_id`); None when
    they have a message id or that header already (or do not decode: refused at publish)."""
    try:
        props = decode_properties(props_raw)
    except Exception:
        return None
    if props.message_id is not None or (props.headers and TRACE_ID_HEADER in props.headers):
        return None
    encoded = []
    for digit in "01":
        props.headers = {**(props.headers or {}), TRACE_ID_HEADER: f"{connection}-{digit * TRACE_ID_DIGITS}"}
        encoded.append(encode_properties(props))
    zeros, ones = encoded
    at = next(i for i, (a, b) in enumerate(zip(zeros, ones, strict=True)) if a != b)
    assert (
        zeros[at : at + TRACE_ID_DIGITS] == b"0" * TRACE_ID_DIGITS
        and zeros[at + TRACE_ID_DIGITS :] == ones[at + TRACE_ID_DIGITS :]
    )
    return zeros[:at], zeros[at + TRACE_ID_DIGITS :]


def with_trace_id(template: tuple[bytes, bytes], n: int) -> bytes:
    """The properties of `trace_id_template` with the id's number `n` (below 10**12)."""
    return b"%b%012d%b" % (template[0], n, template[1])


def _header_trace_id(props_raw: bytes) -> str | None:
    """The fast path of `Tracer.ids` for what `with_trace_id` made: properties without message
    or correlation id whose headers hold x-maxq-trace-id (a long string), found without a decode."""
    if len(props_raw) < 2 or (props_raw[0] << 8 | props_raw[1]) & _ID_FLAGS:
        return None
    at = props_raw.find(_TRACE_ID_KEY)
    if at < 0:
        return None
    at += len(_TRACE_ID_KEY)
    length = int.from_bytes(props_raw[at : at + 4], "big")
    return props_raw[at + 4 : at + 4 + length].decode("utf-8", "replace")


class Tracer:
    def __init__(self, trace_log: TraceLog) -> None:
        self.log = trace_log
        # queue key -> its machine, for the queues whose settings say x-trace (the broker's
        # index, kept by `settings_changed`): what the applier and the publish path test.
        self.traced: dict[tuple[str, str], Any] = {}
        # The queues whose publishes carry their publisher's context (the `published` record):
        # those traced, here or, for a queue whose group is held by other members only (issue
        # #19), by the settings its record and the policies give it (Broker.settings_elsewhere):
        # its records are made where its group is applied, from what the Enqueue carries.
        self.publishing: dict[tuple[str, str], None] = {}
        self._ids: dict[bytes, tuple[str | None, str | None]] = {}
        self._last: dict[tuple[str, str], tuple[int, int]] = {}  # queue -> (log index, next n)
        # Set while compact_trace waits with nothing traced (the apply path and the task share
        # the trio thread): a queue that begins to trace wakes it.
        self.tracing_began: trio.Event | None = None

    def settings_changed(self, key: tuple[str, str], machine: Any, elsewhere: Any = None) -> None:
        """The queue's machine here (None: none here) and, for a queue whose machine is on other
        members only, its settings there (`elsewhere`, QueueSettings) changed."""
        if machine is not None and machine.settings.trace:
            self.traced[key] = machine
            self.publishing[key] = None
            if self.tracing_began is not None:
                self.tracing_began.set()  # (compact_trace flushes every FLUSH_INTERVAL_S again)
        else:
            self.traced.pop(key, None)
            self._last.pop(key, None)
            if elsewhere is not None and elsewhere.trace:
                self.publishing[key] = None
            else:
                self.publishing.pop(key, None)
        if machine is not None:
            machine.trace_dropped.clear()

    def retention(self, vhost: str, queue: str) -> tuple[int, int]:
        """A queue's (ms, bytes) to keep; the defaults for a queue that no longer traces."""
        machine = self.traced.get((vhost, queue))
        settings = machine.settings if machine is not None else None
        return (
            (settings and settings.trace_retention_ms) or TRACE_RETENTION_MS_DEFAULT,
            (settings and settings.trace_retention_bytes) or TRACE_RETENTION_BYTES_DEFAULT,
        )

    def ids(self, props_raw: bytes) -> tuple[str | None, str | None]:
        """(message id, correlation id) of a message's properties."""
        found = self._ids.get(props_raw)
        if found is None:
            trace_id = _header_trace_id(props_raw)
            if trace_id is not None:
                found = (trace_id, None)
                if len(self._ids) >= _IDS_CACHED_MAX:
                    self._ids.clear()
                self._ids[props_raw] = found
                return found
            try:
                props = decode_properties(props_raw)
            except Exception:  # (refused at publish; a dead-lettered copy is ours)
                return None, None
            message_id = _text(props.message_id)
            if message_id is None and props.headers:
                message_id = _text(props.headers.get(TRACE_ID_HEADER))
            found = (message_id, _text(props.correlation_id))
            if len(self._ids) >= _IDS_CACHED_MAX:
                self._ids.clear()
            self._ids[props_raw] = found
        return found

    # ------------------------------------------------------------ apply

    def before(self, machine: Any, command: Any) -> list | None:
        """The messages `command` will take away from the machine (for an ack, their seqs), read
        before it applies."""
        kind = type(command)
        if kind is qc.Settle or kind is qc.Discard or kind is qc.Requeue:
            consumer = machine.consumers.get(command.consumer_id)
            if consumer is None or type(command.seqs) not in (list, tuple):
                return None
            checked_out = consumer.checked_out
            if kind is qc.Settle:  # (an ack's record names its seq alone: ACK_GROUP)
                return [seq for seq in command.seqs if seq in checked_out]
            return [checked_out[seq] for seq in command.seqs if seq in checked_out]
        if kind is qc.Down and type(command.owner) is str:
            owner = command.owner
            prefix = owner.endswith(("@", "/"))
            return [
                message
                for consumer in machine.consumers.values()
                if consumer.owner == owner or prefix and consumer.owner.startswith(owner)
                for message in consumer.checked_out.values()
            ]
        if kind is qc.DeleteReceived and type(command.handles) in (list, tuple):
            in_flight = machine.in_flight
            found = []
            for handle in command.handles:
                flight = in_flight.get(handle[0]) if type(handle) in (list, tuple) and handle else None
                found.append(flight.message if flight is not None else None)
            return found
        return None

    def after(
        self,
        meta: Meta,
        key: tuple[str, str],
        machine: Any,
        command: Any,
        reply: Any,
        effects: list | None,
        before: list | None,
    ) -> None:
        """Record what the command did to the traced queue `key` (never raises)."""
        try:
            records, count = self._records(command, reply, effects or (), before, machine)
        except Exception:  # a bug here must not stop the log: the records of this command are lost
            log.exception("tracing %s on queue %r failed", type(command).__name__, key)
            return
        finally:
            if machine.trace_dropped:
                machine.trace_dropped.clear()
        if records:
            # Their place: the log entry's index and, within it, their position among the
            # records of this queue (an entry carries many commands), the same on every member.
            log_index = meta.log_index
            last = self._last.get(key)
            n0 = last[1] if last is not None and last[0] == log_index else 0
            self._last[key] = (log_index, n0 + count)
            try:
                self.log.add(key[0], key[1], machine.now_ms, log_index, n0, records, count)
            except Exception:  # the trace store cannot write: the broker goes on without these records
                log.exception("writing %d trace records of queue %r failed", len(records), key)

    def _records(
        self, command: Any, reply: Any, effects: Any, before: Any, machine: Any
    ) -> tuple[list[Record | list], int]:
        """The command's records and groups in their stored shape (trace_store.py: `Record`,
        PUBLISH_GROUP, DELIVER_GROUP, ACK_GROUP), and how many records they are read as."""
        if type(reply) is Rejected:
            # (a refused command changed nothing, but the expiry run before it may have)
            effects = [e for e in effects if type(e) is DeadLetter]
        out: list[Record | list] = []
        append = out.append
        ids = self.ids
        count = 0

        def record(event: str, message: Message, extra: Any = None) -> None:
            message_id, correlation_id = ids(message.props_raw)
            append((event, message_id, correlation_id, message.seq, extra))

        kind = type(command)
        if kind is qc.Enqueue and type(reply) is not Rejected:
            count += self._enqueued(command, reply, out, machine.settings.trace_bodies)
        elif kind is qc.Settle and before:
            append([ACK_GROUP, before])
            count += len(before)
        elif kind is qc.Discard and before:
            for message in before:
                record("rejected", message, {"requeue": False})
        elif kind is qc.Requeue and before:
            for message in before:
                record("requeued", message)
        elif kind is qc.Down and before:
            for message in before:
                record("requeued", message, {"reason": "consumer gone"})
        elif kind is qc.Get and type(reply) is tuple:
            message, redelivered, _left = reply
            extra = {
                "consumer": command.consumer_id,
                "connection": command.owner.split("/", 1)[0],
                "via": "basic.get",
                "no_ack": command.no_ack,
                "redelivered": redelivered,
                "delivery_count": message.delivery_count,
            }
            record("delivered", message, extra)
        elif kind is qc.Receive and type(reply) is list:
            for received in reply:
                if type(received) is Received:
                    record("received", received.message, {"via": "sqs", "receive_count": received.receive_count})
        elif kind is qc.DeleteReceived and type(reply) is list and before:
            for message, result in zip(before, reply, strict=False):
                if message is not None and result == HandleResult.DONE:
                    record("deleted", message, {"via": "sqs"})
        elif kind is qc.Purge and type(reply) is int and reply:
            append(("purged", None, None, None, {"count": reply}))
        if (
            kind is qc.Enqueue
            and effects
            and len(effects) == len(command.messages)
            and len(machine.consumers) == 1
            and list(map(_MESSAGE, effects)) == command.messages  # (so each a Deliver: below)
            and effects[-1][1].seq - effects[0][1].seq == len(effects) - 1
        ):
            # The usual case of all: a consumer that keeps up got this Enqueue's messages, each
            # once, in its order. Fresh messages (not redelivered, a delivery count of 1) with
            # seqs in a row (the machine gives an Enqueue's messages rising seqs: the ends tell),
            # all to the queue's one consumer (an Enqueue adds and removes none): two passes in
            # C, where the general case below needs seven.
            append([DELIVER_GROUP, effects[0][0], effects[0][1].seq, len(effects)])
            effects = ()
        elif effects and set(map(type, effects)) == {Deliver}:
            # Every effect a delivery (to one consumer): its group at once, and as a run when
            # they are first deliveries of seqs in a row (trace_store.py). Each step one pass in
            # C over the command's deliveries.
            consumers, delivered, redelivered = zip(*effects, strict=True)
            receiver, delivered_count = consumers[0], len(consumers)
            if consumers.count(receiver) == delivered_count:
                delivered_seqs = list(map(_SEQ, delivered))
                first = delivered_seqs[0]
                if (
                    True not in redelivered
                    # (every count is 1 at least: a message's delivery counted before its effect)
                    and sum(map(_DELIVERY_COUNT, delivered)) == delivered_count
                    and delivered_seqs == list(range(first, first + delivered_count))
                ):
                    append([DELIVER_GROUP, receiver, first, delivered_count])
                else:
                    append(
                        [
                            DELIVER_GROUP,
                            receiver,
                            delivered_seqs,
                            list(redelivered),
                            list(map(_DELIVERY_COUNT, delivered)),
                        ]
                    )
                effects = ()
        # The DELIVER_GROUP being filled (deliveries in a row to one consumer): its consumer and lists.
        consumer: str | None = None
        add_seq: Any = None
        add_again: Any = None
        add_count: Any = None
        for effect in effects:
            effect_kind = type(effect)
            if effect_kind is Deliver:
                if effect.consumer_id != consumer:
                    consumer = effect.consumer_id
                    seqs: list[int] = []
                    again: list[bool] = []
                    counts: list[int] = []
                    add_seq, add_again, add_count = seqs.append, again.append, counts.append
                    append([DELIVER_GROUP, consumer, seqs, again, counts])
                message = effect.message
                add_seq(message.seq)
                add_again(effect.redelivered)
                add_count(message.delivery_count)
            elif effect_kind is DeadLetter:
                consumer = None
                for message in effect.messages:
                    extra = {
                        "reason": effect.reason,
                        "exchange": effect.exchange,
                        "routing_key": effect.routing_key if effect.routing_key is not None else message.routing_key,
                    }
                    record("dead-lettered", message, extra)
        for message, reason in machine.trace_dropped:
            record("expired" if reason == "expired" else "dropped", message, {"reason": reason})
        for item in out:
            kind_name = item[0]
            if kind_name == DELIVER_GROUP:
                count += item[3] if len(item) == 4 else len(item[2])
            elif kind_name != PUBLISH_GROUP and kind_name != ACK_GROUP:
                count += 1
        return out, count

    def _enqueued(self, command: qc.Enqueue, reply: Any, out: list, bodies: bool) -> int:
        """Append the Enqueue's PUBLISH_GROUP to `out`; the number of records it is read as. A run
        of publishes (commands.py, Enqueue.trace) whose messages were all enqueued, in a row, is
        one entry, written without a look at each message."""
        messages = command.messages
        user = connection = address = None
        listed: Any = ()
        if command.trace is not None:
            user, connection, address, listed = command.trace
        refused = set(reply.rejected) if type(reply) is Overflowed else ()
        deduplicated = command.dedup is not None
        whole = not refused and not deduplicated and command.txn is None and not bodies
        entries: list[list[Any]] = []
        count = 0
        covered = 0  # the messages before this position are recorded
        for publish in listed:
            position = publish[0]
            for at in range(covered, position):  # (none in a session's batch: every one has a publish)
                count += self._entry(entries, at, messages[at], None, refused, deduplicated, bodies)
            if len(publish) > 5:  # a run: n, count
                number, run = publish[4], publish[5]
                first, last = messages[position], messages[position + run - 1]
                if (
                    whole
                    and first.seq >= 0
                    and last.seq - first.seq == run - 1
                    and not first.props_raw[0] & _CORRELATION_BYTE
                ):
                    entries.append(
                        [
                            number,
                            None,
                            first.seq,
                            first.exchange,
                            first.routing_key,
                            [publish[1], publish[3], True if publish[2] else None],
                            None,
                            first.delay_ms,
                            None,
                            run,
                        ]
                    )
                    count += 2 * run
                else:
                    for i in range(run):
                        at = position + i
                        one = (at, publish[1], publish[2], publish[3], number + i)
                        count += self._entry(entries, at, messages[at], one, refused, deduplicated, bodies)
                covered = position + run
            else:
                count += self._entry(entries, position, messages[position], publish, refused, deduplicated, bodies)
                covered = position + 1
        for at in range(covered, len(messages)):
            count += self._entry(entries, at, messages[at], None, refused, deduplicated, bodies)
        if entries:
            out.append([PUBLISH_GROUP, user, connection, address, entries])
        return count

    def _entry(
        self,
        entries: list[list[Any]],
        position: int,
        message: Message,
        publish: Any,
        refused: Any,
        deduplicated: bool,
        bodies: bool,
    ) -> int:
        """Append one message's entry of a PUBLISH_GROUP (`publish`: its publish tuple, with its
        trace number as a fifth item when it has one, or None); the number of records it is read as."""
        props_raw = message.props_raw
        if publish is not None and len(publish) > 4 and not props_raw[0] & _CORRELATION_BYTE:
            # The id the publishing node gave it, "connection-n": stored as n (the group names
            # the connection; trace_store.py reads it as the id).
            message_id, correlation_id = publish[4], None
        else:
            message_id, correlation_id = self.ids(props_raw)
        seq = message.seq
        fate = None
        if seq < 0:
            if position in refused:
                fate = "refused"
            elif deduplicated:
                fate = "dropped"
        count = 0
        if publish is not None:
            count += 1
            # [channel, routed queues, ack (True) or nack (False, reject-publish) if confirmed]
            publish = [publish[1], publish[3], position not in refused if publish[2] else None]
        if seq >= 0 or fate is not None:
            count += 1
        elif publish is None:
            return 0  # (nothing to say of it)
        entries.append(
            [
                message_id,
                correlation_id,
                seq,
                message.exchange,
                message.routing_key,
                publish,
                message.body if bodies else None,
                message.delay_ms,
                fate,
            ]
        )
        return count


async def compact_trace(tracer: Tracer, clock_ms: Callable[[], int]) -> None:
    """Write the buffered records every FLUSH_INTERVAL_S and apply each queue's trace retention
    every COMPACT_INTERVAL_S, for as long as the node runs. While no queue traces and nothing
    waits to be written (most nodes, most of the time), it wakes for retention only."""
    compact_at = trio.current_time() + COMPACT_INTERVAL_S
    while True:
        if tracer.traced or tracer.log.buffered:
            await trio.sleep(FLUSH_INTERVAL_S)
        else:  # (until the next retention pass, or a queue begins to trace: `settings_changed`)
            tracer.tracing_began = trio.Event()
            with trio.move_on_at(compact_at):
                await tracer.tracing_began.wait()
            tracer.tracing_began = None
        try:
            tracer.log.flush()  # (a write that fails is counted and logged there)
            if trio.current_time() >= compact_at:
                compact_at = trio.current_time() + COMPACT_INTERVAL_S
                tracer.log.compact(clock_ms(), tracer.retention)
        except Exception:  # the trace store cannot be read or written now: try again next time
            log.exception("trace retention failed")
