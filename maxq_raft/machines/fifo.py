"""SQS FIFO queues in the queue machine: the deduplication window and message groups (issue #18, item 3).

Theory of operation: `QueueFifo` is the part of `QueueMachine` (queue.py) that a queue declared
with `x-sqs-fifo` (QueueSettings.fifo) uses; like receives.py it works on the core's state
through the core's primitives. Everything is replicated state, decided from the log's time only.

- Sends are `EnqueueFifo(messages, fifo)`: beside each message its MessageGroupId, its
  MessageDeduplicationId (the shell puts the body's SHA-256 there for ContentBasedDeduplication)
  and the MessageId the shell gave it. A deduplication id seen in the last DEDUP_WINDOW_MS of
  queue time is a duplicate: it is answered with the first send's MessageId and SequenceNumber
  and not enqueued (SQS: "accepted successfully but not delivered"). A new one gets the next
  SequenceNumber (a per-queue counter that only goes up; snapshots carry it) and is recorded.
  The window is `dedup` (id -> (expires ms, message id, sequence number)) with `_dedup_order`,
  the same entries in expiry order (queue time never goes back and every entry lives the same
  5 minutes, so expiry order is insertion order). Expired entries are pruned at every send and
  every Tick, so the window holds at most the sends of the last 5 minutes; it is also capped
  at DEDUP_ENTRIES_MAX, beyond which new sends are refused (the shell answers
  RequestThrottled) rather than deduplicated less: SQS's own FIFO limit (3,000 messages a
  second with batching, for 5 minutes) is above it, but not a queue this node can hold in memory.
- Groups: a receive hands out the ready messages in the queue's order, skipping every message
  whose group has a message in flight to a receiver (from an earlier receive) or waiting out a
  retry back-off, so a group goes to one receiver at a time and in order; one receive may take
  several messages of one group, in order. A message whose visibility runs out goes back at its
  place in sequence order (receives.py), before the later messages of its group. The scan
  past blocked groups looks at FIFO_SCAN_MAX messages at most per receive, in the returned
  heap and the in-memory window; past a window whose messages are all held, it loads the
  spilled tail into memory, up to twice the window (messages and bytes). A free group's message
  past that waits until the groups ahead of it move (SQS: "FIFO queues scan the first 120,000
  messages to determine available message groups").
- A message enqueued without a group (an AMQP publish, a dead-lettered message) has group None:
  it is served in order but blocks nothing. AMQP consumers and basic.get are refused on a FIFO
  queue (they would hand out messages past the group rule); docs/sqs.md says so.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Any

from .commands import Enqueue, EnqueueFifo, malformed
from .dedup import EXCHANGE_WINDOW_STRIDE
from .message import Message, new_message_error
from .queue_types import Overflowed, Rejected

if TYPE_CHECKING:
    from .queue_args import QueueSettings
    from .queue_types import Backing, Effect
    from .receives import InFlight

DEDUP_WINDOW_MS = 5 * 60 * 1000  # SQS's deduplication interval
DEDUP_ENTRIES_MAX = 100_000
# Messages one FIFO receive looks at past blocked groups (bounded work per log entry).
FIFO_SCAN_MAX = 8192
ID_CHARS_MAX = 128  # MessageGroupId, MessageDeduplicationId (SQS); a MessageId is shorter

# What an EnqueueFifo answers per message: (MessageId, SequenceNumber), or None when refused
# (a full reject-publish queue).
FifoSent = tuple[str, int] | None


def _bad_id(value: Any, optional: bool = False) -> bool:
    if value is None:
        return not optional
    return type(value) is not str or not 0 < len(value) <= ID_CHARS_MAX


class QueueFifo:
    """The FIFO half of `QueueMachine`: deduplication, sequence numbers, group-aware receives."""

    if TYPE_CHECKING:
        settings: QueueSettings
        now_ms: int
        ready: Any
        returned: list[tuple[int, Message]]
        ready_bytes: int
        window_bytes: int
        window_bytes_max: int
        spilled_count: int
        window_max: int
        durable: bool
        backing: Backing | None
        in_flight: dict[int, InFlight]
        backoff: list[tuple[int, int, Message]]
        _timed: bool

        def _enqueue(self, cmd: Enqueue) -> tuple[int | Overflowed | Rejected, list[Effect]]: ...
        def _refill(self) -> None: ...
        def _die(self, message: Message, reason: str) -> None: ...

    def _init_fifo(self) -> None:
        self.dedup: dict[str, tuple[int, str, int]] = {}  # dedup id -> (expires ms, message id, sequence)
        self._dedup_order: deque[tuple[int, str]] = deque()  # (expires ms, dedup id), oldest first
        self.next_sequence_number = 1
        self.groups_in_flight: dict[str, int] = {}  # group -> its messages in flight to receivers

    # ------------------------------------------------------------ sends

    def _prune_dedup(self) -> None:
        """Forget the deduplication ids whose 5 minutes are over (all of them: each was added
        by one send, so the work is paid for by the sends)."""
        order = self._dedup_order
        dedup = self.dedup
        now = self.now_ms
        pruned = False
        while order and order[0][0] <= now:
            expires_ms, dedup_id = order.popleft()
            entry = dedup.get(dedup_id)
            if entry is not None and entry[0] == expires_ms:
                del dedup[dedup_id]
                pruned = True
        if pruned and self.durable:
            # (entries are in sequence order too: each send's numbers come after the last's)
            first = next(iter(dedup.values()))[2] if dedup else self.next_sequence_number
            self.backing.dedup_forget(first)  # type: ignore[union-attr]  # a durable queue has a backing

    def _enqueue_fifo(self, cmd: EnqueueFifo) -> tuple[list[FifoSent] | Rejected, list[Effect]]:
        messages, fifo = cmd.messages, cmd.fifo
        if not self.settings.fifo:
            return Rejected(406, "not a FIFO queue"), []
        if (
            type(messages) is not list
            or type(fifo) is not list
            or len(messages) != len(fifo)
            or len({id(m) for m in messages}) != len(messages)
        ):
            return malformed(cmd), []
        for message, extra in zip(messages, fifo, strict=True):
            why = new_message_error(message)
            if why is not None:
                return malformed(cmd, why), []
            if (
                type(extra) not in (list, tuple)
                or len(extra) != 3
                or _bad_id(extra[0])
                or _bad_id(extra[1], optional=True)
                or _bad_id(extra[2])
            ):
                return malformed(cmd, f"bad FIFO fields {extra!r}"), []
        self._prune_dedup()
        if len(self.dedup) + len(messages) > DEDUP_ENTRIES_MAX:
            return Rejected(403, f"over limit: {DEDUP_ENTRIES_MAX} deduplication ids in 5 minutes"), []
        results: list[FifoSent] = []
        new: list[Message] = []
        new_positions: list[int] = []  # position in `messages` of each of `new`
        first_of: dict[str, int] = {}  # dedup id -> position of its first send in this batch
        duplicate_of: dict[int, int] = {}  # position -> position of the send it repeats
        expires_ms = self.now_ms + DEDUP_WINDOW_MS
        for position, (message, (group_id, dedup_id, message_id)) in enumerate(zip(messages, fifo, strict=True)):
            if dedup_id is not None:
                seen = self.dedup.get(dedup_id)
                if seen is not None:
                    results.append((seen[1], seen[2]))
                    continue
                if dedup_id in first_of:
                    duplicate_of[position] = first_of[dedup_id]
                    results.append(None)  # filled in below from the first one's result
                    continue
                first_of[dedup_id] = position
            sequence = self.next_sequence_number
            self.next_sequence_number += 1
            message.group_id = group_id
            message.sequence_number = sequence
            new.append(message)
            new_positions.append(position)
            results.append((message_id, sequence))
        effects: list[Effect] = []
        if new:
            reply, effects = self._enqueue(Enqueue(new))
            if type(reply) is Rejected:  # (validated above: not expected)
                return reply, effects
            if type(reply) is Overflowed:
                for index in reply.rejected:
                    results[new_positions[index]] = None
        for position, first in duplicate_of.items():
            results[position] = results[first]
        kept: list[tuple[int, int, str, str]] = []
        for dedup_id, position in first_of.items():
            sent = results[position]
            if sent is not None:  # a refused send is not remembered: sending it again may work
                self.dedup[dedup_id] = (expires_ms, sent[0], sent[1])
                self._dedup_order.append((expires_ms, dedup_id))
                kept.append((sent[1], expires_ms, dedup_id, sent[0]))
        if new and self.durable:
            self.backing.dedup_write(kept, self.next_sequence_number)  # type: ignore[union-attr]  # a durable queue has a backing
        return results, effects

    # ------------------------------------------------------------ receives

    def _blocked_groups(self) -> dict[str | None, None]:
        blocked: dict[str | None, None] = dict.fromkeys(self.groups_in_flight)
        for _due, _seq, message in self.backoff:
            if message.group_id is not None:
                blocked[message.group_id] = None
        return blocked

    def _take_fifo(self, max_count: int) -> list[Message]:
        """Up to `max_count` ready messages whose groups are free, in the queue's order (see
        the module notes); they leave the ready state (the caller puts them in flight)."""
        blocked = self._blocked_groups()
        taken: list[Message] = []
        scanned = 0
        # Returned messages first, in sequence order (they precede their groups' ready ones).
        returned = self.returned
        if returned:
            gone: set[int] = set()
            # (seqs are unique: no Message is compared; nsmallest: no sort of a large heap)
            for seq, message in heapq.nsmallest(FIFO_SCAN_MAX, returned):
                scanned += 1
                if len(taken) >= max_count:
                    break
                if message.group_id is not None and message.group_id in blocked:
                    continue
                gone.add(seq)
                self.ready_bytes -= len(message.body)
                if not self._expired_now(message):
                    taken.append(message)
            if gone:
                returned[:] = [entry for entry in returned if entry[0] not in gone]
                heapq.heapify(returned)
        ready = self.ready
        index = 0
        while len(taken) < max_count and scanned < FIFO_SCAN_MAX:
            if index >= len(ready):
                # Past the window with everything in it held: the spilled tail may have free
                # groups. Load it, up to twice the window in messages and in bytes (memory
                # stays bounded; SQS too scans only a queue's first 120,000 messages).
                if (
                    not self.spilled_count
                    or len(ready) >= 2 * self.window_max
                    or self.window_bytes >= 2 * self.window_bytes_max
                ):
                    break
                self._refill()
                continue
            scanned += 1
            message = ready[index]
            if message.group_id is not None and message.group_id in blocked:
                index += 1
                continue
            del ready[index]  # (at most FIFO_SCAN_MAX positions in)
            size = len(message.body)
            self.window_bytes -= size
            self.ready_bytes -= size
            if not self._expired_now(message):
                taken.append(message)
        return taken

    def _expired_now(self, message: Message) -> bool:
        """Past its TTL (a message may go out up to its deadline, as for a consumer): it dies."""
        expires_at = message.expires_at_ms
        if self._timed and expires_at is not None and expires_at < self.now_ms:
            self._die(message, "expired")
            return True
        return False

    def _group_received(self, message: Message) -> None:
        group = message.group_id
        if group is not None:
            self.groups_in_flight[group] = self.groups_in_flight.get(group, 0) + 1

    def _group_settled(self, message: Message) -> None:
        """A message is no longer in flight (deleted, visible again, purged)."""
        group = message.group_id
        if group is not None:
            count = self.groups_in_flight[group] - 1
            if count:
                self.groups_in_flight[group] = count
            else:
                del self.groups_in_flight[group]

    # ------------------------------------------------------- dump and load

    def _dump_fifo(self) -> dict[str, Any]:
        return {
            "next_sequence_number": self.next_sequence_number,
            "dedup": [[dedup_id, *entry] for dedup_id, entry in self.dedup.items()],
        }

    def _load_fifo(self, header: dict[str, Any]) -> None:
        """From a header (absent before format version 3: a new window)."""
        self.next_sequence_number = header.get("next_sequence_number", 1)
        for dedup_id, expires_ms, message_id, sequence in header.get("dedup", []):
            if type(dedup_id) is not str or type(expires_ms) is not int or type(sequence) is not int:
                raise TypeError("a deduplication entry is (str, int, str, int)")
            self.dedup[dedup_id] = (expires_ms, message_id, sequence)
            self._dedup_order.append((expires_ms, dedup_id))

    def recover_fifo(self) -> None:
        """A restarted single node: the window and the sequence counter its backing kept (the
        entries whose 5 minutes are over go at the next send or Tick, in the new log's time)."""
        if self.backing is None or not self.durable or not self.settings.fifo:
            return
        # (below the first exchange window's slots, dedup.py)
        entries, next_sequence_number = self.backing.dedup_stored(0, EXCHANGE_WINDOW_STRIDE)
        for sequence, expires_ms, dedup_id, message_id in entries:
            self.dedup.pop(dedup_id, None)  # (sent again after its window: the later one counts)
            self.dedup[dedup_id] = (expires_ms, message_id, sequence)
            self._dedup_order.append((expires_ms, dedup_id))
            next_sequence_number = max(next_sequence_number, sequence + 1)
        self.next_sequence_number = max(self.next_sequence_number, next_sequence_number)

    def _rebuild_groups(self) -> None:
        self.groups_in_flight = {}
        for flight in self.in_flight.values():
            self._group_received(flight.message)

    # ------------------------------------------------------------ invariants

    def _check_fifo(self) -> None:
        counts: dict[str, int] = {}
        for flight in self.in_flight.values():
            group = flight.message.group_id
            if group is not None:
                counts[group] = counts.get(group, 0) + 1
        assert counts == self.groups_in_flight, "groups in flight agree with the in-flight messages"
        assert len(self.dedup) <= len(self._dedup_order)
        previous = -1
        for dedup_id, (expires_ms, _message_id, sequence) in self.dedup.items():
            assert previous <= expires_ms and sequence < self.next_sequence_number
            assert expires_ms <= self.now_ms + DEDUP_WINDOW_MS
            previous = expires_ms
            assert dedup_id
        if not self.settings.fifo:
            assert not self.dedup and not self.groups_in_flight
