"""Which queues the ticker must look at (CommandLog.tick_queues), found without a pass over all.

Why: every 50 ms the ticker looked at every queue of the node: its next deadline (TTL, x-expires,
delays, back-offs, SQS visibility, consume rate, check-backs), its held dead letters and its
open transactions. Measured in process with nothing due (scripts/bench_ticker.py): 0.4-2.8 ms a
pass with 1,000 queues and 40-65 ms with 10,000, that is most of a core spent on queues with
nothing to do, and a step that long on the event loop holds every connection of the node back
(the fair-dispatch benchmark's tail, docs/benchmarks.md).

Theory of operation: what the ticker needs of a queue changes only when a command is applied to
it (a queue's time moves only with its commands) or when its machine is replaced (made,
removed, installed from a snapshot). The apply path (applier.py) and the broker's index of
queues (`Broker.queue_settings_changed`) mark such a queue `touch`ed; at each tick `refresh`
reads only the touched queues again: the deadline goes into a heap, and the queue into small
sets when it holds dead letters or open transactions. `due(now_ms)` pops the queues whose
deadline has come. A pass costs O(queues touched since the last one + due ones · log n).

The heap is lazy: a queue whose deadline moved gets a new entry, and the old one is dropped when
it comes out (its deadline is no longer the queue's); when stale entries outnumber the live ones
the heap is rebuilt. A popped queue is forgotten until touched again: the ticker touches every
queue it could not tick (not its shard's leader, or a Tick already in flight), and the Tick it
submits touches the queue when applied, or when it fails.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import Any

QueueKey = tuple[str, str]
STALE_ENTRIES_SLACK = 64  # the heap is rebuilt past 2x its live entries plus this


class QueueTimers:
    def __init__(self) -> None:
        self._touched: dict[QueueKey, None] = {}
        self._everything = False  # a shard-wide command (ALL_QUEUES): read every queue again
        self._heap: list[tuple[int, QueueKey]] = []
        self._deadline_ms: dict[QueueKey, int] = {}  # the deadline each queue's live heap entry holds
        self.dead_lettering: dict[QueueKey, None] = {}  # queues holding dead letters in flight
        self.with_txns: dict[QueueKey, None] = {}  # queues holding halves of open transactions

    def touch(self, key: QueueKey) -> None:
        self._touched[key] = None

    def touch_all(self) -> None:
        self._everything = True

    def refresh(self, queues: Mapping[QueueKey, Any]) -> None:
        """Read the touched queues again (`queues`: the node's queue machines by key)."""
        if self._everything:
            self._everything = False
            keys: Iterable[QueueKey] = {
                **dict.fromkeys(queues),
                **dict.fromkeys(self._deadline_ms),
                **dict.fromkeys(self.dead_lettering),
                **dict.fromkeys(self.with_txns),
            }
            self._touched = {}
        else:
            keys, self._touched = self._touched, {}
        heap = self._heap
        deadlines = self._deadline_ms
        for key in keys:
            queue = queues.get(key)
            deadline = None if queue is None else queue.next_deadline_ms
            if deadline is None:
                deadlines.pop(key, None)
            elif deadlines.get(key) != deadline:
                deadlines[key] = deadline
                heapq.heappush(heap, (deadline, key))
            if queue is not None and queue.dead_lettering:
                self.dead_lettering[key] = None
            else:
                self.dead_lettering.pop(key, None)
            if queue is not None and queue.txns:
                self.with_txns[key] = None
            else:
                self.with_txns.pop(key, None)
        if len(heap) > 2 * len(deadlines) + STALE_ENTRIES_SLACK:
            self._heap = [(deadline, key) for key, deadline in deadlines.items()]
            heapq.heapify(self._heap)

    def due(self, now_ms: int) -> list[QueueKey]:
        """The queues whose deadline is at or before `now_ms`, each once, forgotten until touched."""
        heap = self._heap
        deadlines = self._deadline_ms
        found = []
        while heap and heap[0][0] <= now_ms:
            deadline, key = heapq.heappop(heap)
            if deadlines.get(key) == deadline:  # (else a stale entry: the queue's deadline moved)
                del deadlines[key]
                found.append(key)
        return found

    def timed(self) -> int:
        """How many queues have a deadline now (for tests)."""
        return len(self._deadline_ms)
