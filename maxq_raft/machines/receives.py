"""SQS receives on a queue: messages in flight until a visibility deadline (issue #18, item 5).

Theory of operation: `QueueReceives` is the part of `QueueMachine` (queue.py) that serves SQS
receivers, as queue_limits.py is its TTL and limits part. A `Receive` takes up to ten ready
messages exactly as a delivery to an AMQP consumer would (the core's `_pop_next`: returned ones
first, then in sequence order, priority lanes and expired heads as the core has them; delayed
messages are not ready until released), so AMQP consumers and SQS receivers share one queue:
a message handed to either is simply not ready any more. A received message is *in flight*:
held in `in_flight` (seq -> `InFlight`) until its deadline, `now_ms + visibility_ms` in the
queue's time (the log's, never a clock), with the id of that receive.

A receive id is unique within the queue and names one receive of one message: the SQS shell
puts `(seq, receive_id)` into the receipt handle (sqs/receipt.py), and `DeleteReceived` and
`ChangeVisibility` act only on a message in flight under that same id, so a handle from an
earlier receive is stale once the message has been received again. The ids count up from
`max(next_receive_id, now_ms << RECEIVE_ID_TIME_SHIFT)`: a counter that every replica and a
snapshot carry, floored by the queue's time so that a single node, whose log restarts its
indexes and whose restarted queue comes back from its backing without the counter, does not
hand out an id that a handle from before the restart still carries (given that the node's
clock does not go back across the restart).

Deadlines live in `_visibility`, a heap of `(deadline_ms, seq, receive_id)`. Changing a deadline
pushes a new entry rather than searching the heap, and a deleted message leaves its entry, so an
entry counts only while the message is in flight under that id with that deadline (a lazy heap,
rebuilt when the stale entries outnumber the live ones). `apply` releases the due ones before
the command (as delayed messages and retry back-offs are released), at most DROP_BATCH_MAX per
command, and `visibility_deadline_ms` tells the shell's ticker when the next one falls due.

A released message goes back as an AMQP requeue does: into `returned` at its place in sequence
order, `redelivered` set, through the core's `_give_back`. So one count serves both protocols:
a receive increments the message's `delivery_count` as a delivery does (it is SQS's
ApproximateReceiveCount), and with x-delivery-limit a message whose count is over the limit is
dead-lettered (reason `delivery_limit`) when its visibility runs out, instead of coming back,
exactly as an AMQP return over the limit is; a retry back-off applies as to a requeue. SQS's
RedrivePolicy `maxReceiveCount` N is that limit at N - 1 with the dead-letter queue as the
dead-letter target (x-dead-letter-exchange "" and the queue's name as routing key): the N-th
receive's expiry dead-letters it, so it is received N times, as in SQS (which moves it at the
next receive instead; no one can tell the difference but by the queue's counts in between).

In-flight messages are not tied to a connection: `Down` leaves them. TTL does not expire a
message in flight (as for unacked AMQP deliveries): it is judged when the message is back.
A message stored in the backing stays stored while in flight (it is still in the queue) and
leaves it when deleted, purged or dead-lettered. They count as unacknowledged. A queue holds at
most IN_FLIGHT_MAX of them (SQS's OverLimit), in memory.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from . import queue_limits
from .commands import ChangeVisibility, DeleteReceived, Receive, malformed
from .queue_types import HandleResult, Received, Rejected

if TYPE_CHECKING:
    from .message import Message
    from .queue_args import QueueSettings
    from .queue_types import Backing, Effect

RECEIVE_MAX = 10  # messages per Receive, handles per DeleteReceived / ChangeVisibility (SQS's batch)
VISIBILITY_MS_MAX = 12 * 3600 * 1000  # SQS's longest visibility timeout, 12 hours
# Messages in flight per queue, as SQS's standard queues allow: they are held in memory, so a
# receiver that never deletes cannot pull a deep queue into memory. Read at call time (tests lower it).
IN_FLIGHT_MAX = 120_000
# Receive ids are floored at the queue's time shifted by this much: 2**20 receives per ms of
# queue time before the counter runs ahead of it; 2**64 ms >> 20 lasts until the year 2527.
RECEIVE_ID_TIME_SHIFT = 20
# Stale heap entries allowed beyond the live ones before the heap is rebuilt.
VISIBILITY_SLACK = 64


class InFlight:
    """A received message until its deadline, and which receive (when) it is in flight under."""

    __slots__ = ("message", "receive_id", "deadline_ms", "received_ms")

    def __init__(self, message: Message, receive_id: int, deadline_ms: int, received_ms: int) -> None:
        self.message = message
        self.receive_id = receive_id
        self.deadline_ms = deadline_ms
        self.received_ms = received_ms  # a deadline is at most VISIBILITY_MS_MAX after it

    def __repr__(self) -> str:
        return (
            f"InFlight({self.message!r}, receive_id={self.receive_id}, deadline_ms={self.deadline_ms}, "
            f"received_ms={self.received_ms})"
        )


def _bad_handles(handles: Any, width: int) -> bool:
    """True unless `handles` is a list or tuple of at most RECEIVE_MAX entries of `width`
    non-negative ints (a third, a visibility, within VISIBILITY_MS_MAX)."""
    if type(handles) is not list and type(handles) is not tuple or len(handles) > RECEIVE_MAX:
        return True
    for handle in handles:
        if type(handle) is not list and type(handle) is not tuple or len(handle) != width:
            return True
        for value in handle:
            if type(value) is not int or value < 0:  # (bool is not int here: True is not a seq)
                return True
        if width == 3 and handle[2] > VISIBILITY_MS_MAX:
            return True
    return False


class QueueReceives:
    """The SQS receive half of `QueueMachine`: in-flight messages and their deadlines."""

    if TYPE_CHECKING:
        # What this half uses of the core (queue.py) and of queue_limits.py, which define them.
        now_ms: int
        next_seq: int
        delivered_upto: int
        last_used_ms: int | None
        backing: Backing | None
        durable: bool

        def _pop_next(self) -> Message | None: ...
        def _note_delivered(self, seq: int) -> None: ...
        def _give_back(self, messages: list[Message]) -> int: ...
        def _service(self) -> list[Effect]: ...
        def _take_fifo(self, max_count: int) -> list[Message]: ...
        def _group_received(self, message: Message) -> None: ...
        def _group_settled(self, message: Message) -> None: ...

        groups_in_flight: dict[str, int]
        settings: QueueSettings

    def _init_receives(self) -> None:
        self.in_flight: dict[int, InFlight] = {}  # seq -> in flight to an SQS receiver, in receive order
        self._visibility: list[tuple[int, int, int]] = []  # heap of (deadline ms, seq, receive id), lazy
        self.next_receive_id = 0  # ids below it are taken (see RECEIVE_ID_TIME_SHIFT)

    # ------------------------------------------------------------- queries

    def _live(self, entry: tuple[int, int, int]) -> bool:
        deadline_ms, seq, receive_id = entry
        flight = self.in_flight.get(seq)
        return flight is not None and flight.receive_id == receive_id and flight.deadline_ms == deadline_ms

    @property
    def visibility_deadline_ms(self) -> int | None:
        """The earliest deadline of a message in flight (queue time), or None."""
        heap = self._visibility
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)  # stale: the message was deleted, received again or given a new deadline
        return heap[0][0] if heap else None

    # ------------------------------------------------------ at points of a command

    def _release_visibility(self) -> list[Effect]:
        """At the start of a command: messages whose deadline has come are visible again (at
        most DROP_BATCH_MAX; the rest keep the deadline in the past, so the shell ticks at once)."""
        heap = self._visibility
        now = self.now_ms
        in_flight = self.in_flight
        due: list[Message] = []
        budget = queue_limits.DROP_BATCH_MAX
        while heap and heap[0][0] <= now and len(due) < budget:
            entry = heapq.heappop(heap)
            if self._live(entry):
                message = in_flight.pop(entry[1]).message
                self._group_settled(message)
                due.append(message)
        if not due:
            return []
        self._give_back(due)
        return self._service()

    def _push_deadline(self, deadline_ms: int, seq: int, receive_id: int) -> None:
        heap = self._visibility
        heapq.heappush(heap, (deadline_ms, seq, receive_id))
        if len(heap) > 2 * len(self.in_flight) + VISIBILITY_SLACK:
            self._rebuild_visibility()

    def _rebuild_visibility(self) -> None:
        self._visibility = [(f.deadline_ms, seq, f.receive_id) for seq, f in self.in_flight.items()]
        heapq.heapify(self._visibility)

    # ------------------------------------------------------------ commands

    def _receive(self, cmd: Receive) -> tuple[list[Received] | Rejected, list[Effect]]:
        max_count, visibility_ms = cmd.max_count, cmd.visibility_ms
        if (
            type(max_count) is not int
            or not 1 <= max_count <= RECEIVE_MAX
            or type(visibility_ms) is not int
            or not 0 <= visibility_ms <= VISIBILITY_MS_MAX
        ):
            return malformed(cmd), []
        room = IN_FLIGHT_MAX - len(self.in_flight)
        if room <= 0:
            # (the SQS shell answers OverLimit; the receiver must delete or let some expire first)
            return Rejected(403, f"over limit: {IN_FLIGHT_MAX} messages in flight"), []
        max_count = min(max_count, room)
        now = self.now_ms
        self.last_used_ms = now  # x-expires: a receive uses the queue, as basic.get does
        deadline_ms = now + visibility_ms
        receive_id = max(self.next_receive_id, now << RECEIVE_ID_TIME_SHIFT)
        received: list[Received] = []
        recount: list[Message] = []  # stored messages whose new count goes to the store
        # A FIFO queue hands out only the messages of groups with none in flight (fifo.py).
        fifo = iter(self._take_fifo(max_count)) if self.settings.fifo else None
        while len(received) < max_count:  # bounded by RECEIVE_MAX
            if fifo is None:
                message = self._pop_next()  # (an expired head met on the way leaves as for a consumer)
            else:
                message = next(fifo, None)
                if message is not None:
                    self._group_received(message)
            if message is None:
                break
            seq = message.seq
            message.delivery_count += 1
            if message.stored and self.durable and message.persistent:
                message.count_header = True  # (its record carries the count from now on)
                recount.append(message)
            if message.first_received_ms is None:
                message.first_received_ms = now
            if seq > self.delivered_upto:
                self._note_delivered(seq)
            self.in_flight[seq] = InFlight(message, receive_id, deadline_ms, now)
            self._push_deadline(deadline_ms, seq, receive_id)
            received.append(
                Received(message, seq, receive_id, message.delivery_count, message.first_received_ms, message.sent_ms)
            )
            receive_id += 1
        self.next_receive_id = receive_id
        if recount:
            # ApproximateReceiveCount survives a restart of a single node (a cluster replays its
            # log): the count is stored at the receive, not only when the message comes back,
            # so a receive that a crash cut short counts too, as a lost consumer does in
            # rabbit_fifo. One write per receive, without its own fsync (the count is approximate).
            self.backing.rewrite(recount)  # type: ignore[union-attr]  # stored messages: a backing
        return received, []

    def _delete_received(self, cmd: DeleteReceived) -> tuple[list[HandleResult] | Rejected, list[Effect]]:
        """Only the handle of the message's latest receive deletes it, and only while it is in
        flight. SQS answers a delete with an older handle with success all the same (its
        documentation: the request succeeds, the message may not be deleted), and so may the
        shell; after a visibility timeout ran out the message stays too (at-least-once)."""
        handles = cmd.handles
        if _bad_handles(handles, 2):
            return malformed(cmd), []
        results: list[HandleResult] = []
        stored: list[Message] = []
        in_flight = self.in_flight
        for seq, receive_id in handles:
            flight = in_flight.get(seq)
            if flight is None:
                results.append(HandleResult.NOT_IN_FLIGHT)
            elif flight.receive_id != receive_id:
                results.append(HandleResult.STALE)
            else:
                del in_flight[seq]  # (its heap entry is stale from now on)
                self._group_settled(flight.message)
                if flight.message.stored:
                    stored.append(flight.message)
                results.append(HandleResult.DONE)
        if stored:
            self.backing.remove(stored)  # type: ignore[union-attr]  # messages stored: a backing
        if len(self._visibility) > 2 * len(in_flight) + VISIBILITY_SLACK:
            self._rebuild_visibility()
        return results, []

    def _change_visibility(self, cmd: ChangeVisibility) -> tuple[list[HandleResult] | Rejected, list[Effect]]:
        """A new deadline from now for each in-flight message under its handle's receive; a
        stale handle or a message not in flight is refused for that entry (SQS:
        MessageNotInflight), and so is a deadline more than 12 hours after the receive (SQS caps
        a message's visibility in total, not each change). A deadline of now makes the message
        visible in this command."""
        handles = cmd.handles
        if _bad_handles(handles, 3):
            return malformed(cmd), []
        results: list[HandleResult] = []
        now = self.now_ms
        in_flight = self.in_flight
        for seq, receive_id, visibility_ms in handles:
            flight = in_flight.get(seq)
            if flight is None:
                results.append(HandleResult.NOT_IN_FLIGHT)
            elif flight.receive_id != receive_id:
                results.append(HandleResult.STALE)
            elif now + visibility_ms > flight.received_ms + VISIBILITY_MS_MAX:
                results.append(HandleResult.TOO_LONG)
            else:
                flight.deadline_ms = now + visibility_ms
                self._push_deadline(flight.deadline_ms, seq, receive_id)
                results.append(HandleResult.DONE)
        due = self.visibility_deadline_ms
        return results, self._release_visibility() if due is not None and due <= now else []

    def _purge_in_flight(self) -> int:
        """SQS PurgeQueue: the messages in flight go too; how many."""
        n = len(self.in_flight)
        stored = [f.message for f in self.in_flight.values() if f.message.stored]
        if stored:
            self.backing.remove(stored)  # type: ignore[union-attr]  # messages stored: a backing
        self._clear_in_flight()
        return n

    def _clear_in_flight(self) -> None:
        self.in_flight.clear()
        self._visibility.clear()
        self.groups_in_flight.clear()

    # ------------------------------------------------------- dump and load

    def _load_in_flight(self, items: list[InFlight]) -> list[Message]:
        """Put back a batch of in-flight messages (the heap is rebuilt by `_finish_receives`)."""
        for flight in items:
            if type(flight) is not InFlight:
                raise TypeError(f"not an InFlight: {flight!r}")
            self.in_flight[flight.message.seq] = flight
        return [flight.message for flight in items]

    def _finish_receives(self) -> None:
        self._rebuild_visibility()

    # ------------------------------------------------------------ invariants

    def _check_receives(self) -> None:
        """Every in-flight message was received and is due by a live heap entry (that it is in
        no other place, the core's `check_invariants` checks)."""
        live = {entry for entry in self._visibility if self._live(entry)}
        for seq, flight in self.in_flight.items():
            m = flight.message
            assert m.delivery_count > 0 and m.first_received_ms is not None
            assert 0 <= flight.receive_id < self.next_receive_id
            assert flight.received_ms <= self.now_ms and flight.deadline_ms <= flight.received_ms + VISIBILITY_MS_MAX
            assert (flight.deadline_ms, seq, flight.receive_id) in live, "every in-flight message has its deadline"
        assert len(live) == len(self.in_flight)
        assert len(self._visibility) <= 2 * len(self.in_flight) + VISIBILITY_SLACK
