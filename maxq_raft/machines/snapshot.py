"""Snapshot and restore of one queue machine as plain records (the pure half of log compaction).

Theory of operation: the machine gives its state as plain data and takes it back
(`QueueMachine.dump_header` / `dump_places`, `from_header` / `load_place` / `finish_load`);
this module only frames that as a versioned stream of records, chunked and counted.
`dump_queue(machine)` yields records made only of None, bools, ints, floats, str, bytes, lists
and dicts with str keys, so any msgpack (`use_bin_type=True`, unpacked with `raw=False`)
carries them unchanged; nothing is pickled. `load_queue(records, backing=...)` builds a machine
that, given the same commands from then on, returns the same replies and effects as the
original would have (tests/machines/test_snapshot.py is the proof).

The records, in order (docs/replication.md, "Snapshot format"):

- `["queue", header]`: the format version and the machine's header: its kind, name, settings,
  window sizes and every counter and flag (sequence, delivered watermark, dropped /
  dead-lettered / rejected counts, x-expires time, spill cursors, the consumers' round-robin
  rings and the single active consumer order ...), the consumers without their messages, the
  priority lanes' counters and the delayed messages' counters. Small: its size does not grow
  with the queue's depth.
- `["messages", place, key, [message, ...]]`: messages in chunks of at most CHUNK_MESSAGES_MAX
  messages or CHUNK_BYTES_MAX bytes of body, so a queue of millions never becomes one list.
  `place` and `key` say where they were, as the machine names it (`ready`, `lane` with its
  priority as `key`, `returned`, `backoff`, `dead_lettering`, `checked_out` with the consumer id
  as `key`, `delayed`, `in_flight`, `dying` with the reason as `key`, `unstore`; only in the
  backing: `spilled`, `lane_spilled`, `delayed_spilled`, read from it in batches of
  CHUNK_MESSAGES_MAX). A message is `message_record`'s list; a `backoff` item is
  `[due_ms, message]`, an `in_flight` one `[receive_id, deadline_ms, received_ms, message]`. Within a place
  the order is the machine's own (a heap's list order, a dict's insertion order), so nothing is
  re-sorted on the way.
  The header also holds an SQS FIFO queue's deduplication window (fifo.py): its size is
  bounded by the sends of 5 minutes (DEDUP_ENTRIES_MAX), not by the depth; and an
  x-message-deduplication queue's window (dedup.py), bounded by its x-cache-size.
- `["end", counts]`: how many messages each place had, checked by the loader (assert in pairs).

Every message the original held in its backing (`stored`) is written to the new backing as it
is loaded, so the restored machine finds in its backing what the original found in its own:
the spilled tails, the delayed messages beyond the in-memory window, the stored copies it will
delete when they leave. In-memory copies are written as they are in memory (a stored record of a
message returned since its write may have an older delivery count; only a restart of a durable
queue would read that back, which a snapshot does not serve).

A dump is lazy: the caller consumes it completely before the machine applies another command
(the machine's state and its backing must not move under the reader).

Not in the records: the backing's own counters (rebuilt by the writes), and what the machine
rebuilds (see its dump and load).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias

from .message import Message
from .priority_queue import PriorityQueueMachine
from .queue import QueueMachine
from .receives import InFlight

if TYPE_CHECKING:
    from .queue_types import Backing

# A record of a dump: plain data for msgpack, its fields by position (hence Any).
Record: TypeAlias = list[Any]

# Version 2 added the SQS receives: `in_flight`, `next_receive_id` in the header, a message's
# sent and first-receive times. Version 3 added SQS FIFO queues (fifo.py): `dedup` (the
# deduplication window, [id, expires ms, message id, sequence number] in expiry order) and
# `next_sequence_number` in the header, a message's group id and sequence number. Version 4
# added `dedup_window` (dedup.py: `next_number` and every slot, [number, key, expires ms or None
# for a stale one], oldest first), only for a queue with x-message-deduplication. Versions 1 to
# 3 still load (they have none of them: such a queue starts with an empty window). Version 5
# added `txns` (transactions.py: each open transaction as [id, timeout ms, checks max, deadline
# ms, attempts, [half, ...], [half number, ...]] in the order they opened, a half as a log entry
# carries a message) and `txn_next_number`, only for a queue with some; a version 1 to 4 dump
# has none open. Version 6 added `exchange_windows` (dedup.py: each x-message-deduplication
# exchange's window in the queue as [exchange, size max, TTL ms or None, store base, window
# dumped as `dedup_window`]), only for a queue with some; earlier versions have none.
FORMAT_VERSION = 6
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
CHUNK_MESSAGES_MAX = 1024
CHUNK_BYTES_MAX = 1 << 20  # of bodies (and properties) per chunk

# The machine classes by the `kind` their header names.
MACHINES: dict[str, type[QueueMachine]] = {cls.KIND: cls for cls in (QueueMachine, PriorityQueueMachine)}


class SnapshotError(ValueError):
    """Records that this code cannot restore: an unknown version, a malformed or truncated dump."""


# ------------------------------------------------------------------ messages


def message_record(message: Message) -> Record:
    """A message as a list (position is the field; FORMAT_VERSION names the layout)."""
    return [
        message.seq,
        message.exchange,
        message.routing_key,
        bytes(message.props_raw),
        bytes(message.body),
        message.delivery_count,
        message.redelivered,
        message.persistent,
        message.stored,
        message.ttl_ms,
        message.expires_at_ms,
        message.priority,
        message.count_header,
        message.delay_ms,
        message.due_ms,
        message.delay_counter,
        list(message.death) if message.death is not None else None,
        message.sent_ms,
        message.first_received_ms,
        message.group_id,
        message.sequence_number,
    ]


def message_from_record(record: Record) -> Message:
    (
        seq,
        exchange,
        routing_key,
        props_raw,
        body,
        delivery_count,
        redelivered,
        persistent,
        stored,
        ttl_ms,
        expires_at_ms,
        priority,
        count_header,
        delay_ms,
        due_ms,
        delay_counter,
        death,
        sent_ms,
        first_received_ms,
        group_id,
        sequence_number,
    ) = (
        record
        if len(record) == 21
        else (*record, None, None)
        if len(record) == 19
        else (*record, None, None, None, None)
    )
    # (19 fields: version 2; 17: version 1)
    message = Message(exchange, routing_key, props_raw, body, persistent, ttl_ms, priority, delay_ms)
    message.seq = seq
    message.delivery_count = delivery_count
    message.redelivered = redelivered
    message.stored = stored
    message.expires_at_ms = expires_at_ms
    message.count_header = count_header
    message.due_ms = due_ms
    message.delay_counter = delay_counter
    message.death = (death[0], death[1]) if death is not None else None
    message.sent_ms = sent_ms
    message.first_received_ms = first_received_ms
    if (
        group_id is not None
        and type(group_id) is not str
        or sequence_number is not None
        and type(sequence_number) is not int
    ):
        raise TypeError("a message's group id is a str and its sequence number an int")
    message.group_id = group_id
    message.sequence_number = sequence_number
    return message


def _backoff_record(item: tuple[int, Message]) -> Record:
    due_ms, message = item
    return [due_ms, message_record(message)]


def _backoff_from_record(record: Record) -> tuple[int, Message]:
    due_ms, message = record
    return due_ms, message_from_record(message)


def _in_flight_record(flight: InFlight) -> Record:
    return [flight.receive_id, flight.deadline_ms, flight.received_ms, message_record(flight.message)]


def _in_flight_from_record(record: Record) -> InFlight:
    receive_id, deadline_ms, received_ms, message = record
    if type(receive_id) is not int or type(deadline_ms) is not int or type(received_ms) is not int:
        raise TypeError("an in-flight message's receive id, deadline and receive time are ints")
    return InFlight(message_from_record(message), receive_id, deadline_ms, received_ms)


# How a place's items are written and read, when they are not plain messages.
_ENCODE: dict[str, Callable[[Any], Record]] = {"backoff": _backoff_record, "in_flight": _in_flight_record}
_DECODE: dict[str, Callable[[Record], Any]] = {"backoff": _backoff_from_record, "in_flight": _in_flight_from_record}


def _message_of(item: Message | tuple[int, Message] | InFlight) -> Message:
    if isinstance(item, tuple):
        return item[1]
    return item.message if isinstance(item, InFlight) else item


def _chunks(place: str, key: Any, items: Iterable[Any], counts: dict[str, int]) -> Iterator[Record]:
    """`["messages", place, key, [...]]` records of at most CHUNK_MESSAGES_MAX / CHUNK_BYTES_MAX."""
    encode = _ENCODE.get(place, message_record)
    chunk: Record = []
    size = 0
    for item in items:
        chunk.append(encode(item))
        message = _message_of(item)
        size += len(message.body) + len(message.props_raw)
        if len(chunk) >= CHUNK_MESSAGES_MAX or size >= CHUNK_BYTES_MAX:
            counts[place] = counts.get(place, 0) + len(chunk)
            yield ["messages", place, key, chunk]
            chunk, size = [], 0
    if chunk:
        counts[place] = counts.get(place, 0) + len(chunk)
        yield ["messages", place, key, chunk]


# ---------------------------------------------------------------------- dump


def dump_queue(machine: QueueMachine) -> Iterator[Record]:
    """The records of `machine`'s state (see the module notes). Consume them before the next apply."""
    yield ["queue", {"version": FORMAT_VERSION, **machine.dump_header()}]
    counts: dict[str, int] = {}
    for place, key, items in machine.dump_places(CHUNK_MESSAGES_MAX):
        yield from _chunks(place, key, items, counts)
    yield ["end", counts]


# ---------------------------------------------------------------------- load


def _fail(why: str) -> SnapshotError:
    return SnapshotError(f"queue snapshot: {why}")


def load_queue(records: Iterable[Any], *, backing: Backing | None = None) -> QueueMachine:
    """A machine rebuilt from `dump_queue`'s records; `backing` is a fresh (empty) one, given
    exactly when the original had one. Raises SnapshotError for records it cannot restore."""
    it = iter(records)
    first = next(it, None)
    if type(first) is not list or len(first) != 2 or first[0] != "queue" or type(first[1]) is not dict:
        raise _fail(f"the first record is not a queue header: {str(first)[:80]}")
    header = first[1]
    version = header.get("version")
    if version not in READABLE_VERSIONS:
        raise _fail(f"unknown format version {version!r} (this code reads versions {READABLE_VERSIONS})")
    if header.get("has_backing") != (backing is not None):
        raise _fail(
            "the original machine had a backing: restore it with one"
            if header.get("has_backing")
            else "the original machine had no backing: restore it without one"
        )
    machine_class = MACHINES.get(str(header.get("kind")))
    if machine_class is None:
        raise _fail(f"unknown machine kind {str(header.get('kind'))[:40]!r}")
    try:
        machine = machine_class.from_header(header, backing)
    except (KeyError, TypeError, ValueError) as exc:
        raise _fail(f"malformed header: {exc!r}") from None
    counts: dict[str, int] = {}
    ended = None
    for record in it:  # bounded by the records given; each is checked before it is used
        if ended is not None:
            raise _fail("records after the end record")
        if type(record) is not list or not record:
            raise _fail(f"malformed record {str(record)[:80]}")
        if record[0] == "end":
            ended = record[1]
            continue
        if record[0] != "messages" or len(record) != 4:
            raise _fail(f"unknown record {str(record[0])[:40]!r}")
        _, place, key, items = record
        try:
            if type(items) is not list:
                raise TypeError("a chunk's messages must be a list")
            decode = _DECODE.get(place, message_from_record)
            machine.load_place(place, key, [decode(item) for item in items])
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(f"malformed {str(place)[:40]!r} chunk: {exc!r}") from None
        counts[place] = counts.get(place, 0) + len(items)
    if ended is None:
        raise _fail("truncated: no end record")
    if ended != counts:
        raise _fail(f"message counts differ from the end record: {counts} != {ended}")
    machine.finish_load()
    return machine
