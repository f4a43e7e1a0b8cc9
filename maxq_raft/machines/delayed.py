"""Delayed messages of one queue (the `x-delay` header): held until due, millions without memory.

Theory of operation: a delayed message is not in the queue yet: at its due time (the entry time
of its Enqueue plus its delay) it is enqueued as if published then, so its TTL, its place in the
queue and the length limits apply from then on, as with RabbitMQ's delayed-message exchange.

Until then it lives in the queue's backing under a key of its own range,
`DELAYED_BASE | due_slot << 24 | counter` (a slot is 10 ms; slots last until the year 2140), so
stored delayed messages are ordered by due slot, then publish order, and a load from a cursor
returns the next ones to fall due. (Two keys would collide only if 2**24 delayed messages apart
fell due in the same 10 ms: a limit, not checked.) Every delayed message is written to the
backing when it arrives, persistent ones of a durable queue through the WAL so they survive a
restart, and deleted from it when released.

Only the earliest are in memory (`window`): every delayed key below `cursor` is in memory, every
stored one from `cursor` on is not. Arrivals keep the window within `window_max` (a new message
due before the window's last takes its place; the last is evicted, it is stored already). A load
happens when the cursor's slot has come and may take the window one load (`load_max`) beyond.
Within a slot, key order is publish order, not due order, so nothing of the cursor's slot is
released before the rest of that slot is loaded (a message due earlier may be among them), even
beyond the window: that goes beyond the bound only by messages due within the same 10 ms, for as
long. Releases pop a heap ordered by the exact due millisecond, then publish order.

The queue machine calls `release(now_ms, limit)` at the start of each command and enqueues what
it returns; `next_due_ms` tells the shell's ticker when to come back.
"""

from __future__ import annotations

import heapq
from bisect import insort
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .message import Message
    from .queue_types import Backing

DELAYED_BASE = 1 << 63
DUE_SHIFT = 24
COUNTER_MASK = (1 << DUE_SHIFT) - 1
SLOT_MS = 10
DUE_SLOT_MAX = (1 << (63 - DUE_SHIFT)) - 1  # 2**39 slots of 10 ms: until the year 2140
WINDOW_MAX = 4096
LOAD_MAX = 1024
NO_CURSOR = 1 << 64  # the cursor when nothing is stored (above every key)


def delayed_key(due_ms: int, counter: int) -> int:
    slot = min(max(due_ms // SLOT_MS, 0), DUE_SLOT_MAX)
    return DELAYED_BASE | slot << DUE_SHIFT | (counter & COUNTER_MASK)


def slot_start_ms(key: int) -> int:
    return ((key & ~DELAYED_BASE) >> DUE_SHIFT) * SLOT_MS


class DelayedMessages:
    def __init__(self, backing: Backing | None, window_max: int = WINDOW_MAX) -> None:
        self.backing = backing
        self.window_max = window_max if backing is not None else 1 << 62
        self.load_max = max(1, min(LOAD_MAX, window_max))
        self.count = 0  # all delayed messages of the queue
        self.spilled = 0  # of those, stored only (keys >= cursor)
        self.cursor = NO_CURSOR  # every delayed key below it is in memory
        self.counter = 0
        self.window: dict[int, Message] = {}  # key -> the in-memory ones
        self.keys: list[int] = []  # their keys, ascending (the last is evicted first)
        self.heap: list[tuple[int, int]] = []  # (due ms, key); entries of evicted keys are skipped

    def add_all(self, messages: list[Message], now_ms: int) -> None:
        """Hold each message until `now_ms` + its delay, writing them to the backing in one batch."""
        for message in messages:
            self._add(message, now_ms + message.delay_ms)  # type: ignore[operator]  # only delayed messages come here
        if self.backing is not None:
            self.backing.write(messages)

    def _add(self, message: Message, due_ms: int) -> None:
        key = delayed_key(due_ms, self.counter)
        message.delay_counter = self.counter
        self.counter += 1
        message.seq = key
        message.due_ms = due_ms
        self.count += 1
        backing = self.backing
        if backing is not None:
            message.stored = True
            if key >= self.cursor or (len(self.window) >= self.window_max and key > self.keys[-1]):
                # Due after everything in memory: it waits in the store only.
                self.spilled += 1
                self.cursor = min(self.cursor, key)
                return
            if len(self.window) >= self.window_max:
                evicted = self.keys.pop()
                del self.window[evicted]
                self.spilled += 1
                self.cursor = evicted
        self.window[key] = message
        insort(self.keys, key)
        heapq.heappush(self.heap, (due_ms, key))

    @property
    def next_due_ms(self) -> int | None:
        """When the next release may be due (the start of the cursor's slot stands for the
        stored ones, which may fall due in it), or None."""
        due = None
        heap = self.heap
        while heap and heap[0][1] not in self.window:
            heapq.heappop(heap)  # evicted: it is found again when loaded
        if heap:
            due = heap[0][0]
        if self.spilled:
            stored = slot_start_ms(self.cursor)
            if due is None or stored < due:
                due = stored
        return due

    def release(self, now_ms: int, limit: int) -> tuple[list[Message], bool]:
        """Up to `limit` messages due by `now_ms`, in due order, removed from the store; and
        whether more are due (the caller comes back at once)."""
        out: list[Message] = []
        heap = self.heap
        while len(out) < limit:
            while self.spilled and slot_start_ms(self.cursor) <= now_ms:
                top = self._top_due()
                if top is not None and self.heap[0][1] >> DUE_SHIFT < self.cursor >> DUE_SHIFT:
                    # In a slot before every stored one (so due already): it goes first.
                    break
                # The cursor's slot has come and holds stored messages that may be due before
                # everything in memory: load them first.
                self._load(forced=len(self.window) >= self.window_max + self.load_max)
            top = self._top_due()
            if top is None or top > now_ms:
                break
            _, key = heapq.heappop(heap)
            message = self.window.pop(key)
            del self.keys[self._index(key)]
            out.append(message)
        if out:
            self.count -= len(out)
            if self.backing is not None:
                self.backing.remove(out)
            for message in out:
                message.seq = -1
                message.stored = False
        due = self.next_due_ms
        return out, due is not None and due <= now_ms and len(out) >= limit

    def _top_due(self) -> int | None:
        heap = self.heap
        while heap and heap[0][1] not in self.window:
            heapq.heappop(heap)  # evicted: it is found again when loaded
        return heap[0][0] if heap else None

    def _index(self, key: int) -> int:
        from bisect import bisect_left

        return bisect_left(self.keys, key)

    def _load(self, forced: bool = False) -> None:
        if forced:
            # Beyond the window: only the rest of the cursor's slot (it has come).
            slot_end = ((self.cursor >> DUE_SHIFT) + 1) << DUE_SHIFT
            loaded = self.backing.load(self.cursor, self.load_max, slot_end)  # type: ignore[union-attr]  # spilled: a backing
            if not loaded:
                # The slot is exhausted: the next stored key is in a later slot.
                self.cursor = slot_end
                return
        else:
            want = min(self.load_max, self.window_max + self.load_max - len(self.window))
            loaded = self.backing.load(self.cursor, want)  # type: ignore[union-attr]  # spilled: a backing
        if not loaded:
            # Transient delayed messages do not survive a restart: nothing more is stored.
            self.count -= self.spilled
            self.spilled = 0
            self.cursor = NO_CURSOR
            return
        for message in loaded:
            key = message.seq
            message.stored = True
            self.window[key] = message
            self.keys.append(key)  # loaded keys are above every in-memory one
            heapq.heappush(self.heap, (message.due_ms, key))  # type: ignore[misc]  # a delayed message has its due_ms
        self.spilled -= len(loaded)
        self.cursor = loaded[-1].seq + 1 if self.spilled else NO_CURSOR
        if self.spilled < 0:
            self.spilled = 0

    def recover(self, stored: int, counter: int) -> None:
        """After a restart: `stored` delayed messages are in the backing, none in memory; new
        keys go on from `counter` so that they cannot take a stored one's key."""
        self.count = self.spilled = stored
        self.cursor = DELAYED_BASE if stored else NO_CURSOR
        self.counter = max(self.counter, counter)

    def clear(self) -> None:
        self.window.clear()
        self.keys.clear()
        self.heap.clear()
        self.count = self.spilled = 0
        self.cursor = NO_CURSOR

    def dump(self) -> dict[str, Any]:
        """The counters as plain data (the in-memory messages are dumped by the queue machine)."""
        return {
            "window_max": self.window_max,
            "load_max": self.load_max,
            "count": self.count,
            "spilled": self.spilled,
            # (NO_CURSOR is above msgpack's uint64: sent as None)
            "cursor": None if self.cursor == NO_CURSOR else self.cursor,
            "counter": self.counter,
        }

    def load(self, record: dict[str, Any]) -> None:
        """Take back `dump`'s counters; the window's messages follow through `window`, then
        `rebuild_index`."""
        self.window_max = record["window_max"]
        self.load_max = record["load_max"]
        self.count = record["count"]
        self.spilled = record["spilled"]
        self.cursor = NO_CURSOR if record["cursor"] is None else record["cursor"]
        self.counter = record["counter"]

    def rebuild_index(self) -> None:
        """The sorted keys and due heap follow from the window's messages (a live heap may also
        hold entries of evicted keys, which every reader skips)."""
        self.keys = sorted(self.window)
        self.heap = [(message.due_ms, key) for key, message in self.window.items()]  # type: ignore[misc]  # every held message has its due_ms
        heapq.heapify(self.heap)

    def check_invariants(self) -> None:
        assert len(self.window) == len(self.keys)
        assert self.keys == sorted(self.keys)
        assert all(key < self.cursor for key in self.keys)
        assert self.count == len(self.window) + self.spilled
        live = {key for _, key in self.heap if key in self.window}
        assert live == set(self.window), "every in-memory delayed message is in the heap"
        for key, message in self.window.items():
            assert message.seq == key and key >= DELAYED_BASE
