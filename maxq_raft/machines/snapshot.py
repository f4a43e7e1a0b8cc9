"""Snapshot and restore of one queue machine as plain records (the pure half of log compaction).

Theory of operation: `dump_queue(machine)` yields records made only of None, bools, ints,
floats, str, bytes, lists and dicts with str keys, so any msgpack (`use_bin_type=True`, unpacked
with `raw=False`) carries them unchanged; nothing is pickled. `load_queue(records, backing=...)`
builds a machine that, given the same commands from then on, returns the same replies and
effects as the original would have (tests/machines/test_snapshot.py is the proof).

The records, in order (docs/replication.md, "Snapshot format"):

- `["queue", header]`: the format version, the machine's kind, name, settings, window sizes and
  every counter and flag (sequence, delivered watermark, dropped / dead-lettered / rejected
  counts, x-expires time, spill cursors, the consumers' round-robin rings and the single active
  consumer order ...), the consumers without their messages, the priority lanes' counters and
  the delayed messages' counters. Small: its size does not grow with the queue's depth.
- `["messages", place, key, [message, ...]]`: messages in chunks of at most CHUNK_MESSAGES_MAX
  messages or CHUNK_BYTES_MAX bytes of body, so a queue of millions never becomes one list.
  `place` says where they were: in memory (`ready`, `lane` with its priority as `key`,
  `returned`, `backoff`, `dead_lettering`, `checked_out` with the consumer id as `key`,
  `delayed`, `dying` with the reason as `key`, `unstore`), or only in the backing (`spilled`,
  `lane_spilled`, `delayed_spilled`), read from it in batches of CHUNK_MESSAGES_MAX. Within a place the order is the machine's own (a heap's
  list order, a dict's insertion order), so nothing is re-sorted on the way.
- `["end", counts]`: how many messages each place had, checked by the loader (assert in pairs).

Every message the original held in its backing (`stored`) is written to the new backing as it
is loaded, so the restored machine finds in its backing what the original found in its own:
the spilled tails, the delayed messages beyond the in-memory window, the stored copies it will
delete when they leave. In-memory copies are written as they are in memory (a stored record of a
message returned since its write may have an older delivery count; only a restart of a durable
queue would read that back, which a snapshot does not serve).

A dump is lazy: the caller consumes it completely before the machine applies another command
(the machine's state and its backing must not move under the reader).

Not in the records: the backing's own counters (rebuilt by the writes). Derived indexes are rebuilt: the consumers' priority order, the active
count, the delayed heap and key list, the priority levels, whether returns are counted.
`_dying` / `_unstore` (places `dying`, `unstore`) are empty between commands except after a
refused command that followed a release which dead-lettered: the next command flushes them.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Iterable, Iterator

from .delayed import DELAYED_BASE
from .priority_queue import Lane, PriorityQueueMachine, make_queue_machine
from .message import Message
from .queue import SEQ_BITS, Consumer, QueueMachine
from .queue_args import QueueSettings

FORMAT_VERSION = 1
CHUNK_MESSAGES_MAX = 1024
CHUNK_BYTES_MAX = 1 << 20  # of bodies (and properties) per chunk
NO_CURSOR = 1 << 64  # DelayedMessages' "nothing stored": above msgpack's uint64, so sent as None

# Chunks of messages that only the backing held (written there again on load, nowhere else).
SPILLED_PLACES = ("spilled", "lane_spilled", "delayed_spilled")


class SnapshotError(ValueError):
    """Records that this code cannot restore: an unknown version, a malformed or truncated dump."""


# ------------------------------------------------------------------ messages


def message_record(message: Message) -> list:
    """A message as a list (position is the field; FORMAT_VERSION names the layout)."""
    return [message.seq, message.exchange, message.routing_key, bytes(message.props_raw), bytes(message.body),
            message.delivery_count, message.redelivered, message.persistent, message.stored, message.ttl_ms,
            message.expires_at_ms, message.priority, message.count_header, message.delay_ms, message.due_ms,
            message.delay_counter, list(message.death) if message.death is not None else None]


def message_from_record(record: list) -> Message:
    (seq, exchange, routing_key, props_raw, body, delivery_count, redelivered, persistent, stored, ttl_ms,
     expires_at_ms, priority, count_header, delay_ms, due_ms, delay_counter, death) = record
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
    return message


def _chunks(place: str, key: Any, messages: Iterable[Message], encode=message_record) -> Iterator[list]:
    """`["messages", place, key, [...]]` records of at most CHUNK_MESSAGES_MAX / CHUNK_BYTES_MAX.
    `encode` turns each message into its record (a back-off entry carries its due time too)."""
    chunk: list = []
    size = 0
    for message in messages:
        chunk.append(encode(message))
        size += len(message.body) + len(message.props_raw)
        if len(chunk) >= CHUNK_MESSAGES_MAX or size >= CHUNK_BYTES_MAX:
            yield ["messages", place, key, chunk]
            chunk, size = [], 0
    if chunk:
        yield ["messages", place, key, chunk]




def _stored_only(backing, seq_from: int, seq_below: int | None, count: int) -> Iterator[Message]:
    """Up to `count` messages the backing holds from `seq_from` (below `seq_below`), read in
    batches of CHUNK_MESSAGES_MAX. `count` is the machine's own tally, so the loop is bounded."""
    remaining = count
    while remaining > 0:
        batch = backing.load(seq_from, min(CHUNK_MESSAGES_MAX, remaining), seq_below)
        if not batch:
            return  # fewer than counted (a restarted durable queue's transient ones): as the machine finds
        assert batch[0].seq >= seq_from and (seq_below is None or batch[-1].seq < seq_below)
        for message in batch:
            message.stored = True
            yield message
        remaining -= len(batch)
        seq_from = batch[-1].seq + 1


# ---------------------------------------------------------------------- dump


def _settings_record(settings: QueueSettings) -> list:
    return list(settings)


def dump_queue(machine: QueueMachine) -> Iterator[list]:
    """The records of `machine`'s state (see the module notes). Consume them before the next apply."""
    priority = type(machine) is PriorityQueueMachine
    delayed = machine.delayed
    header: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "kind": "priority" if priority else "fifo",
        "vhost": machine.vhost,
        "name": machine.name,
        "settings": _settings_record(machine.settings),
        "has_backing": machine.backing is not None,
        "durable": machine.durable,
        "window_max": machine.window_max,
        "window_bytes_max": machine.window_bytes_max,
        "now_ms": machine.now_ms,
        "last_index": machine.last_index,
        "next_seq": machine.next_seq,
        "delivered_upto": machine.delivered_upto,
        "ready_bytes": machine.ready_bytes,
        "window_bytes": machine.window_bytes,
        "recovered_below": machine._recovered_below,
        "spilled_count": machine.spilled_count,
        "spilled_persistent": machine.spilled_persistent,
        "spill_cursor": machine.spill_cursor,
        "dropped": dict(machine.dropped),
        "dead_lettered": dict(machine.dead_lettered),
        "rejected_publishes": machine.rejected_publishes,
        "last_used_ms": machine.last_used_ms,
        "expired": machine.expired,
        "deleted": machine.deleted,
        "ever_had_consumer": machine.ever_had_consumer,
        "timed": machine._timed,
        "more_due": machine._more_due,
        "exclusive_consumer": machine.exclusive_consumer,
        "sac_order": list(machine._sac_order),
        # Consumers in dict order (Down walks it), each ring in its rotation (whose turn is next).
        "consumers": [[c.consumer_id, c.owner, c.prefetch, c.no_ack, c.priority, c.credit, c.active]
                      for c in machine.consumers.values()],
        "rings": [[p, list(ring)] for p, ring in machine._rings.items()],
        "delayed": {
            "window_max": delayed.window_max,
            "load_max": delayed.load_max,
            "count": delayed.count,
            "spilled": delayed.spilled,
            "cursor": None if delayed.cursor == NO_CURSOR else delayed.cursor,
            "counter": delayed.counter,
        },
    }
    if priority:
        header["lanes"] = [[lane.priority, lane.window_bytes, lane.spilled_count, lane.spilled_persistent,
                            lane.spill_cursor, lane.recovered] for lane in machine.lanes.values()]
        header["lane_count"] = machine.lane_count
        header["window_count"] = machine.window_count
        header["recovered_spilled"] = machine._recovered_spilled
    yield ["queue", header]

    counts: dict[str, int] = {}

    def counted(place: str, items):
        for item in items:
            counts[place] = counts.get(place, 0) + 1
            yield item

    yield from _chunks("ready", None, counted("ready", machine.ready))
    if priority:
        for lane in machine.lanes.values():
            yield from _chunks("lane", lane.priority, counted("lane", lane.ready))
    yield from _chunks("returned", None, counted("returned", (m for _, m in machine.returned)))
    # (a back-off entry is [due ms, message]: the message's own fields do not hold its due time)
    due_ms = {message.seq: due for due, _, message in machine.backoff}
    yield from _chunks("backoff", None, counted("backoff", (m for _, _, m in machine.backoff)),
                       lambda m: [due_ms[m.seq], message_record(m)])
    yield from _chunks("dead_lettering", None, counted("dead_lettering", machine.dead_lettering.values()))
    for consumer in machine.consumers.values():
        yield from _chunks("checked_out", consumer.consumer_id, counted("checked_out", consumer.checked_out.values()))
    yield from _chunks("delayed", None, counted("delayed", delayed.window.values()))
    # Normally empty between commands; a refused command after a release that dead-letters
    # leaves them for the next command to flush (see the note in docs/replication.md).
    for reason, messages in machine._dying.items():
        yield from _chunks("dying", reason, counted("dying", messages))
    yield from _chunks("unstore", None, counted("unstore", machine._unstore))
    backing = machine.backing
    if backing is not None:
        if machine.spilled_count:
            yield from _chunks("spilled", None, counted("spilled", _stored_only(
                backing, machine.spill_cursor, DELAYED_BASE, machine.spilled_count)))
        if priority:
            recovered = machine._recovered_spilled
            for lane in machine.lanes.values():
                if lane.may_load():
                    # (recovered messages are counted for all lanes together: any lane may hold all)
                    limit = lane.spilled_count + (recovered if lane.recovered else 0)
                    yield from _chunks("lane_spilled", lane.priority, counted("lane_spilled", _stored_only(
                        backing, lane.spill_cursor, lane.end, limit)))
        if delayed.spilled:
            yield from _chunks("delayed_spilled", None, counted("delayed_spilled", _stored_only(
                backing, delayed.cursor, None, delayed.spilled)))
    yield ["end", counts]


# ---------------------------------------------------------------------- load


def _fail(why: str) -> SnapshotError:
    return SnapshotError(f"queue snapshot: {why}")


def load_queue(records: Iterable, *, backing=None) -> QueueMachine:
    """A machine rebuilt from `dump_queue`'s records; `backing` is a fresh (empty) one, given
    exactly when the original had one. Raises SnapshotError for records it cannot restore."""
    it = iter(records)
    first = next(it, None)
    if type(first) is not list or len(first) != 2 or first[0] != "queue" or type(first[1]) is not dict:
        raise _fail(f"the first record is not a queue header: {str(first)[:80]}")
    header = first[1]
    version = header.get("version")
    if version != FORMAT_VERSION:
        raise _fail(f"unknown format version {version!r} (this code reads version {FORMAT_VERSION})")
    if header["has_backing"] != (backing is not None):
        raise _fail("the original machine had a backing: restore it with one" if header["has_backing"]
                    else "the original machine had no backing: restore it without one")
    try:
        machine = _machine_from_header(header, backing)
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
            _place(machine, place, key, items)
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(f"malformed {place!r} chunk: {exc!r}") from None
        counts[place] = counts.get(place, 0) + len(items)
    if ended is None:
        raise _fail("truncated: no end record")
    if ended != counts:
        raise _fail(f"message counts differ from the end record: {counts} != {ended}")
    _rebuild_delayed_index(machine)
    if machine.durable and machine.delivered_upto >= 0:
        backing.delivered(machine.delivered_upto)
    return machine


def _machine_from_header(header: dict, backing) -> QueueMachine:
    settings = QueueSettings(*header["settings"])
    kind = header["kind"]
    if kind not in ("fifo", "priority") or (kind == "priority") != (settings.max_priority is not None):
        raise ValueError(f"kind {kind!r} does not match the settings")
    delayed_header = header["delayed"]
    machine = make_queue_machine(header["vhost"], header["name"], backing=backing, durable=header["durable"],
                                 window_max=header["window_max"], window_bytes_max=header["window_bytes_max"],
                                 settings=settings, delayed_window_max=delayed_header["window_max"])
    machine.window_max = header["window_max"]
    machine.window_bytes_max = header["window_bytes_max"]
    for name in ("now_ms", "last_index", "next_seq", "delivered_upto", "ready_bytes", "window_bytes",
                 "spilled_count", "spilled_persistent", "spill_cursor", "rejected_publishes", "last_used_ms",
                 "expired", "deleted", "ever_had_consumer", "exclusive_consumer"):
        setattr(machine, name, header[name])
    machine._recovered_below = header["recovered_below"]
    machine._timed = header["timed"]
    machine._more_due = header["more_due"]
    machine._sac_order = list(header["sac_order"])
    machine.dropped = dict(header["dropped"])
    machine.dead_lettered = dict(header["dead_lettered"])
    active = 0
    for consumer_id, owner, prefetch, no_ack, priority, credit, is_active in header["consumers"]:
        machine.consumers[consumer_id] = Consumer(consumer_id, owner, prefetch, no_ack, priority, credit, is_active)
        active += is_active
    machine._active_count = active
    for priority, ids in header["rings"]:
        machine._rings[priority] = deque(ids)
    machine._priorities = sorted(machine._rings, reverse=True)
    delayed = machine.delayed
    delayed.window_max = delayed_header["window_max"]
    delayed.load_max = delayed_header["load_max"]
    delayed.count = delayed_header["count"]
    delayed.spilled = delayed_header["spilled"]
    delayed.cursor = NO_CURSOR if delayed_header["cursor"] is None else delayed_header["cursor"]
    delayed.counter = delayed_header["counter"]
    if kind == "priority":
        for priority, window_bytes, spilled_count, spilled_persistent, spill_cursor, recovered in header["lanes"]:
            lane = machine.lanes[priority] = Lane(priority, (machine.max_priority - priority) << SEQ_BITS)
            lane.window_bytes = window_bytes
            lane.spilled_count = spilled_count
            lane.spilled_persistent = spilled_persistent
            lane.spill_cursor = spill_cursor
            lane.recovered = recovered
        machine._levels = sorted(machine.lanes, reverse=True)
        machine.lane_count = header["lane_count"]
        machine.window_count = header["window_count"]
        machine._recovered_spilled = header["recovered_spilled"]
    return machine


def _place(machine: QueueMachine, place: str, key: Any, items: list) -> None:
    """Put one chunk where its messages were; stored ones go to the backing too."""
    if type(items) is not list:
        raise TypeError("a chunk's messages must be a list")
    if place == "backoff":
        messages = [message_from_record(record) for _, record in items]
        for (due_ms, _), message in zip(items, messages):
            machine.backoff.append((due_ms, message.seq, message))  # the dumped list is a heap already
    else:
        messages = [message_from_record(record) for record in items]
        if place == "ready":
            machine.ready.extend(messages)
        elif place == "lane":
            machine.lanes[key].ready.extend(messages)
        elif place == "returned":
            machine.returned.extend((m.seq, m) for m in messages)  # the dumped list is a heap already
        elif place == "dead_lettering":
            machine.dead_lettering.update((m.seq, m) for m in messages)
        elif place == "checked_out":
            machine.consumers[key].checked_out.update((m.seq, m) for m in messages)
        elif place == "delayed":
            machine.delayed.window.update((m.seq, m) for m in messages)
        elif place == "dying":
            # The same objects as in `dead_lettering` (loaded before); refused publishes (seq -1) are not.
            shared = machine.dead_lettering
            messages = [shared.get(m.seq, m) if m.seq != -1 else m for m in messages]
            machine._dying.setdefault(key, []).extend(messages)
            messages = [m for m in messages if m.seq == -1 or m.seq not in shared]  # (written with them)
        elif place == "unstore":
            machine._unstore.extend(messages)
        elif place not in SPILLED_PLACES:
            raise ValueError(f"unknown place {place!r}")
    stored = [m for m in messages if m.stored]
    if stored:
        if machine.backing is None:
            raise ValueError("stored messages for a machine without a backing")
        machine.backing.write(stored)


def _rebuild_delayed_index(machine: QueueMachine) -> None:
    """The delayed window's sorted keys and due heap follow from its messages (the original's
    heap may also hold entries of evicted keys, which every reader skips)."""
    delayed = machine.delayed
    delayed.keys = sorted(delayed.window)
    delayed.heap = [(message.due_ms, key) for key, message in delayed.window.items()]
    heapq.heapify(delayed.heap)
