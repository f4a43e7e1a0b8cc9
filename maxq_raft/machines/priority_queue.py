"""A queue with x-max-priority: strict order by priority, FIFO within one (rabbit_priority_queue).

Theory of operation: a priority queue is the FIFO queue machine with one *lane* per priority in
use instead of one ready sequence. A message's priority is its `priority` property, 0 when
absent, capped at x-max-priority (RabbitMQ). Its seq carries its lane above the counter bits:
`seq = (max_priority - priority) << SEQ_BITS | counter`, so comparing seqs compares (priority
descending, then publish order): the returned heap, ordered by seq, puts a requeued message at
the front of its own priority, as RabbitMQ does, and the head of the queue is the smaller of the
returned top and the head of the highest non-empty lane.

Each lane is a FIFO with the same window/spill design as the plain queue: a lane whose messages
have started to spill keeps spilling (order within the lane), and a lane's spilled messages are
exactly its stored seqs from its `spill_cursor` up to the lane's end, so a refill is a range load.
The windows of all lanes together hold at most `window_max` messages / `window_bytes_max` bytes;
a refill loads at least REFILL_MIN so a high lane is never starved by the windows of lower ones
(bounded: REFILL_MIN per lane, 256 lanes at most).

After a restart everything is spilled: `recover` finds each lane's first stored seq (one point
read per priority level, not per message); the recovered messages are counted as a whole
(`_recovered_spilled`) until loaded. The delivered watermark is kept in counter space, so after
a restart a message published before a delivered one may come back flagged redelivered although
it was not delivered: a false positive, which AMQP allows (a hint), never a false negative.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any

from . import queue_limits
from .commands import DeleteQueue, Purge
from .message import Message
from .queue import SEQ_BITS, SEQ_MASK, QueueMachine
from .queue_args import QueueSettings
from .queue_types import Backing, Effect

REFILL_MIN = 256


class Lane:
    __slots__ = (
        "priority",
        "base",
        "end",
        "ready",
        "window_bytes",
        "spilled_count",
        "spilled_persistent",
        "spill_cursor",
        "recovered",
    )

    def __init__(self, priority: int, base: int) -> None:
        self.priority = priority
        self.base = base
        self.end = base + (1 << SEQ_BITS)
        self.ready: deque[Message] = deque()
        self.window_bytes = 0
        self.spilled_count = 0  # spilled since the start of this run
        self.spilled_persistent = 0
        self.spill_cursor = base
        self.recovered = False  # may hold messages of an earlier run from spill_cursor on

    def may_load(self) -> bool:
        return self.spilled_count > 0 or self.recovered


def effective_priority(message: Message, max_priority: int) -> int:
    priority = message.priority
    if type(priority) is not int or priority <= 0:
        return 0
    return priority if priority < max_priority else max_priority


class PriorityQueueMachine(QueueMachine):
    def __init__(self, vhost: str, name: str, *, settings: QueueSettings, **kwargs: Any) -> None:
        super().__init__(vhost, name, settings=settings, **kwargs)
        assert settings.max_priority is not None
        self._fifo = False
        self.max_priority = settings.max_priority
        self.lanes: dict[int, Lane] = {}
        self._levels: list[int] = []  # priorities of the lanes, highest first
        self.lane_count = 0  # ready messages in lanes (windows and spilled), recovered ones aside
        self.window_count = 0  # messages in all lane windows
        self._recovered_spilled = 0

    # ------------------------------------------------------------------ queries

    @property
    def ready_count(self) -> int:
        return len(self.returned) + self.lane_count + self._recovered_spilled

    def _lane(self, priority: int) -> Lane:
        lane = self.lanes.get(priority)
        if lane is None:
            lane = self.lanes[priority] = Lane(priority, (self.max_priority - priority) << SEQ_BITS)
            self._levels = sorted(self.lanes, reverse=True)
        return lane

    def _lane_of(self, message: Message) -> Lane:
        return self.lanes[self.max_priority - (message.seq >> SEQ_BITS)]

    def _ready_in_memory(self) -> Iterable[Message]:
        return chain.from_iterable(self.lanes[p].ready for p in self._levels)

    def _spilled_total(self) -> int:
        return sum(lane.spilled_count for lane in self.lanes.values()) + self._recovered_spilled

    def _head_expiry_ms(self) -> int | None:
        """The earliest TTL deadline among the lanes' heads (None: none; -1: a head must be loaded)."""
        deadline = None
        heads = [self.returned[0][1]] if self.returned else []
        for priority in self._levels:
            lane = self.lanes[priority]
            if lane.ready:
                heads.append(lane.ready[0])
            elif lane.may_load():
                return -1
        for head in heads:
            if head.expires_at_ms is not None and (deadline is None or head.expires_at_ms < deadline):
                deadline = head.expires_at_ms
        return deadline

    def recover(self, next_seq: int, spilled_count: int, spill_cursor: int) -> None:
        self._recovered_below = next_seq
        spilled_count = max(0, spilled_count - self._recover_delayed())
        self.next_seq = next_seq
        self._recovered_spilled = spilled_count
        if spilled_count and self.backing is not None:
            for priority in range(self.max_priority, -1, -1):
                base = (self.max_priority - priority) << SEQ_BITS
                probe = self.backing.load(base, 1, base + (1 << SEQ_BITS))
                if probe:
                    lane = self._lane(priority)
                    lane.recovered = True
                    lane.spill_cursor = probe[0].seq
        if not any(lane.recovered for lane in self.lanes.values()):
            self._recovered_spilled = 0

    # ------------------------------------------------------------- ready state

    def _append(self, messages: list[Message]) -> None:
        self.stats_published += len(messages)
        backing = self.backing
        to_write = []
        durable = self.durable
        max_priority = self.max_priority
        counter = self.next_seq
        for message in messages:
            lane = self._lane(effective_priority(message, max_priority))
            message.seq = lane.base | counter
            counter += 1
            size = len(message.body)
            if backing is not None and (
                lane.may_load() or self.window_count >= self.window_max or self.window_bytes >= self.window_bytes_max
            ):
                if not lane.may_load():
                    lane.spill_cursor = message.seq
                lane.spilled_count += 1
                lane.spilled_persistent += message.persistent
                message.stored = True
                to_write.append(message)
            else:
                lane.ready.append(message)
                lane.window_bytes += size
                self.window_bytes += size
                self.window_count += 1
                if durable and message.persistent:
                    message.stored = True
                    to_write.append(message)
            self.lane_count += 1
            self.ready_bytes += size
        self.next_seq = counter
        if to_write:
            backing.write(to_write)  # type: ignore[union-attr]  # messages stored or spilled: a backing

    def _head(self) -> Message | None:
        best = self.returned[0][1] if self.returned else None
        for priority in self._levels:
            lane = self.lanes[priority]
            if not lane.ready and lane.may_load():
                self._refill_lane(lane)
            if lane.ready:
                head = lane.ready[0]
                if best is None or head.seq < best.seq:
                    best = head
                break  # lanes are in priority order: the first non-empty one has the best lane head
        return best

    def _pop_next_raw(self) -> Message:
        # (the ignores: the caller knows there is a head; no check per delivery)
        head = self._head()
        if self.returned and self.returned[0][1] is head:
            heapq.heappop(self.returned)
        else:
            self._take_lane_head(self._lane_of(head))  # type: ignore[arg-type]
        self.ready_bytes -= len(head.body)  # type: ignore[union-attr]
        return head  # type: ignore[return-value]

    def _take_lane_head(self, lane: Lane) -> Message:
        message = lane.ready.popleft()
        size = len(message.body)
        lane.window_bytes -= size
        self.window_bytes -= size
        self.window_count -= 1
        self.lane_count -= 1
        return message

    def _refill_lane(self, lane: Lane) -> None:
        room = max(REFILL_MIN, self.window_max - self.window_count)
        loaded = self.backing.load(lane.spill_cursor, room, lane.end)  # type: ignore[union-attr]  # messages stored or spilled: a backing
        if not loaded:
            # Nothing more stored in this lane: transient messages do not survive a restart.
            self.lane_count -= lane.spilled_count
            lane.spilled_count = lane.spilled_persistent = 0
            if lane.recovered:
                lane.recovered = False
                if not any(other.recovered for other in self.lanes.values()):
                    self._recovered_spilled = 0
            return
        recovered_below = self._recovered_below
        for message in loaded:
            message.stored = True
            size = len(message.body)
            if message.seq & SEQ_MASK < recovered_below:
                # Of an earlier run: counted as a whole until now.
                self._recovered_spilled = max(0, self._recovered_spilled - 1)
                self.lane_count += 1
                self.ready_bytes += size
            else:
                lane.spilled_count -= 1
                lane.spilled_persistent -= message.persistent
            if message.expires_at_ms is not None:
                self._timed = True
            lane.window_bytes += size
            self.window_bytes += size
        lane.ready.extend(loaded)
        self.window_count += len(loaded)
        lane.spill_cursor = loaded[-1].seq + 1

    def _expire_heads(self) -> None:
        now = self.now_ms
        budget = self._expire_returned(queue_limits.DROP_BATCH_MAX)
        for priority in self._levels:
            lane = self.lanes[priority]
            while budget:
                if not lane.ready:
                    if not lane.may_load():
                        break
                    self._refill_lane(lane)
                    continue
                message = lane.ready[0]
                if message.expires_at_ms is None or message.expires_at_ms > now:
                    break
                self._take_lane_head(lane)
                self.ready_bytes -= len(message.body)
                self._die(message, "expired")
                budget -= 1
        if not budget:
            self._more_due = True

    def _note_delivered(self, seq: int) -> None:
        counter = seq & SEQ_MASK
        if counter > self.delivered_upto:
            self.delivered_upto = counter
            if self.durable:
                self.backing.delivered(counter)  # type: ignore[union-attr]  # a durable queue has a backing

    # ---------------------------------------------------------------- commands

    def _purge(self, cmd: Purge) -> tuple[int, list[Effect]]:
        n = self.ready_count
        stored = [m for m in self._ready_in_memory() if m.stored] + [m for _, m in self.returned if m.stored]
        if stored:
            self.backing.remove(stored)  # type: ignore[union-attr]  # messages stored or spilled: a backing
        recovered_persistent = self._recovered_spilled
        for priority in self._levels:
            lane = self.lanes[priority]
            if lane.may_load():
                persistent = lane.spilled_persistent
                if lane.recovered:
                    persistent += recovered_persistent  # (the backing keeps one total)
                    recovered_persistent = 0
                self.backing.remove_from(lane.spill_cursor, persistent, lane.end)  # type: ignore[union-attr]  # messages stored or spilled: a backing
            self._clear_lane(lane)
        self.returned.clear()
        self.lane_count = self.window_count = self.window_bytes = self.ready_bytes = 0
        self._recovered_spilled = 0
        return n, []

    def _delete(self, cmd: DeleteQueue) -> tuple[int, list[Effect]]:
        reply = super()._delete(cmd)
        for lane in self.lanes.values():
            self._clear_lane(lane)
        self.lane_count = self.window_count = self._recovered_spilled = 0
        return reply

    # ------------------------------------------------------------ dump and load

    KIND = "priority"

    def dump_header(self) -> dict[str, Any]:
        header = super().dump_header()
        header["lanes"] = [
            [
                lane.priority,
                lane.window_bytes,
                lane.spilled_count,
                lane.spilled_persistent,
                lane.spill_cursor,
                lane.recovered,
            ]
            for lane in self.lanes.values()
        ]
        header["lane_count"] = self.lane_count
        header["window_count"] = self.window_count
        header["recovered_spilled"] = self._recovered_spilled
        return header

    def _dump_ready(self) -> Iterator[tuple[str, Any, Iterable[Any]]]:
        """`ready` (always empty here), then `lane` (key: its priority)."""
        yield from super()._dump_ready()
        for lane in self.lanes.values():
            yield "lane", lane.priority, lane.ready

    def _dump_spilled(self, batch_max: int) -> Iterator[tuple[str, Any, Iterable[Any]]]:
        """`lane_spilled` (key: its priority), read from the backing."""
        yield from super()._dump_spilled(batch_max)
        recovered = self._recovered_spilled
        for lane in self.lanes.values():
            if lane.may_load():
                # (recovered messages are counted for all lanes together: any lane may hold all)
                limit = lane.spilled_count + (recovered if lane.recovered else 0)
                yield "lane_spilled", lane.priority, self._stored(lane.spill_cursor, lane.end, limit, batch_max)

    @classmethod
    def from_header(cls, header: dict[str, Any], backing: Backing | None) -> QueueMachine:
        machine = super().from_header(header, backing)
        assert isinstance(machine, PriorityQueueMachine)
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

    def _load_other_place(self, place: str, key: Any, messages: list[Message]) -> bool:
        if place == "lane":
            self.lanes[key].ready.extend(messages)
            return True
        return place == "lane_spilled" or super()._load_other_place(place, key, messages)

    @staticmethod
    def _clear_lane(lane: Lane) -> None:
        lane.ready.clear()
        lane.window_bytes = lane.spilled_count = lane.spilled_persistent = 0
        lane.recovered = False

    def check_invariants(self) -> None:
        super().check_invariants()
        assert not self.ready and not self.spilled_count, "a priority queue keeps its messages in lanes"
        assert self._levels == sorted(self.lanes, reverse=True)
        count = window = window_bytes = 0
        for priority, lane in self.lanes.items():
            assert lane.priority == priority and 0 <= priority <= self.max_priority
            previous = -1
            for message in lane.ready:
                assert self._lane_of(message) is lane and message.seq > previous
                previous = message.seq
            if lane.may_load() and lane.ready:
                assert lane.ready[-1].seq < lane.spill_cursor, "a lane's window comes before its spilled tail"
            assert lane.window_bytes == sum(len(m.body) for m in lane.ready)
            assert lane.spilled_count >= 0
            count += len(lane.ready) + lane.spilled_count
            window += len(lane.ready)
            window_bytes += lane.window_bytes
        assert count == self.lane_count and window == self.window_count and window_bytes == self.window_bytes
        for seq, _message in self.returned:
            assert 0 <= self.max_priority - (seq >> SEQ_BITS) <= self.max_priority


def make_queue_machine(vhost: str, name: str, *, settings: QueueSettings, **kwargs: Any) -> QueueMachine:
    """The machine for a queue's settings: a priority queue with x-max-priority, else FIFO."""
    if settings.max_priority is not None:
        return PriorityQueueMachine(vhost, name, settings=settings, **kwargs)
    return QueueMachine(vhost, name, settings=settings, **kwargs)
