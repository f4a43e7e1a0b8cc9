"""One queue as a deterministic state machine applied from a log (after rabbit_fifo on Ra).

Theory of operation: every change to a queue is a command in a log; `QueueMachine.apply(meta,
command)` returns `(reply, effects)` and is the only way state changes. Replicas that apply the
same commands in the same order end in the same state, so the same code serves a single node
(an in-process log) and a Raft group. Time comes only from `meta.time_ms`, never a clock; the
machine iterates only dicts and deques, never sets, so every replica decides alike.

The machine decides which message goes to which consumer: a `Deliver` effect names the consumer
and the message; the node hosting that consumer's connection sends the frames. Consumers get
messages while they have both prefetch room (unacked < prefetch, manual-ack only) and flow credit
(a window of messages the shell has not yet written to the socket, refilled by `Credit`): the
second bound keeps a slow or no-ack consumer from making the shell buffer without limit.

Order: ready messages are FIFO by sequence; returned (requeued) messages go back in front, in
their original sequence order, as RabbitMQ's classic queues do, with `redelivered` set. Among
consumers, the highest `x-priority` with room is served first, round robin within a priority.

Memory does not grow with depth: the ready messages in memory are a window of at most
`window_max` messages or `window_bytes_max` bytes of body; once it is full, newer messages go to the queue's backing store only ("spilled",
counted in `spilled_count`, found again from `spill_cursor` because spilled messages are never
delivered before they are loaded, so every seq from the cursor on that the store holds is ready).
A durable queue also writes each persistent message to the backing at enqueue and deletes it when
it leaves the queue, so a restart finds exactly the messages still queued. The backing's contents
are a function of the applied commands, so reading it back keeps replicas deterministic.

`apply` never raises: a command that cannot be performed gets a `Rejected` reply, because an
exception inside a replicated apply would stall the whole group; a malformed one (wrong types,
negative counts) is refused before it changes anything, so replicas stay identical.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .commands import (
    Cancel,
    Checkout,
    Credit,
    DeleteQueue,
    Discard,
    Down,
    Enqueue,
    Get,
    Purge,
    Requeue,
    Settle,
)


class Meta(NamedTuple):
    """Stamped by the proposer into each log entry: pysyncobj passes none of this to apply."""

    log_index: int
    time_ms: int


class Message:
    """A queued message. `props_raw` and `body` are opaque bytes for the machine."""

    __slots__ = ("seq", "exchange", "routing_key", "props_raw", "body", "delivery_count", "redelivered",
                 "persistent", "stored", "wire_routing")

    def __init__(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes, persistent: bool = False) -> None:
        self.seq = -1  # assigned by the machine at enqueue: the queue's sequence number
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_raw = props_raw
        self.body = body
        self.delivery_count = 0
        self.redelivered = False
        self.persistent = persistent  # delivery_mode 2: survives a restart on a durable queue
        self.stored = False  # the backing holds it: delete it there when it leaves the queue
        self.wire_routing = None  # the shell's cache of exchange + routing key as encoded on the wire

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, rk={self.routing_key!r}, body={self.body[:20]!r})"


class Deliver(NamedTuple):
    """Effect: send `message` to `consumer_id` (its host performs it)."""

    consumer_id: str
    message: Message
    redelivered: bool


class Rejected(NamedTuple):
    """Reply to a command the machine refused; the shell turns it into an AMQP error."""

    reply_code: int
    reply_text: str


class Backing(Protocol):
    """Where a queue keeps what is not in memory (storage/ behind the shell's adapter).

    Calls come from `apply`, in log order; `load` must return what earlier calls left, so every
    replica that applied the same commands reads the same messages.
    """

    def write(self, messages: list) -> None:
        """Store these messages (each with its seq); durable ones must survive a restart."""

    def remove(self, messages: list) -> None:
        """These stored messages left the queue (acked, discarded, purged, delivered without ack)."""

    def remove_from(self, seq_from: int, persistent: int) -> None:
        """Every stored message with seq >= seq_from left the queue (purge of the spilled tail);
        `persistent` of them were persistent."""

    def load(self, seq_from: int, limit: int) -> list:
        """Up to `limit` stored messages with seq >= seq_from, in seq order."""

    def delivered(self, seq: int) -> None:
        """Messages up to `seq` have been delivered at least once (their redelivered flag after a restart)."""

    def drop(self) -> None:
        """The queue is deleted."""


# Ready messages a queue keeps in memory before it spills to its backing: enough that a consumer
# briefly behind its publisher never touches the disk, small enough that a deep queue costs a
# bounded amount of memory (many deep queues together are the memory alarm's business).
WINDOW_MAX = 65536
WINDOW_BYTES_MAX = 32 << 20


@dataclass
class Consumer:
    consumer_id: str
    owner: str  # the channel that holds it ("node@connection/channel"); `Down(owner)` releases it
    prefetch: int  # 0 = unlimited (manual ack only)
    no_ack: bool
    priority: int
    credit: int  # flow window: deliveries not yet written by the shell
    active: bool = True  # False after cancel: stays until its unacked are settled
    # seq -> Message, delivered with manual ack and not yet settled or returned (a no-ack consumer
    # holds some only if it reused the tag of a cancelled manual-ack consumer that held them)
    checked_out: dict = field(default_factory=dict)

    def has_room(self) -> bool:
        if not self.active or self.credit <= 0:
            return False
        return self.no_ack or self.prefetch == 0 or len(self.checked_out) < self.prefetch


def _malformed(command: Any, why: str = "") -> Rejected:
    # The shell builds every command, so a malformed one is a bug there; refusing it before any
    # state changes keeps replicas identical and the queue usable. (Error path: repr is fine.)
    return Rejected(541, f"malformed {type(command).__name__}: {why or repr(command)}"[:200])


def _bad_seqs(seqs: Any) -> bool:
    """True unless `seqs` is a list or tuple of ints (checked before any is acted on)."""
    if type(seqs) is not list and type(seqs) is not tuple:
        return True
    for seq in seqs:
        if type(seq) is not int:  # also refuses bool: True would settle seq 1
            return True
    return False


class QueueMachine:
    def __init__(self, vhost: str, name: str, *, backing: Backing | None = None, durable: bool = False,
                 window_max: int = WINDOW_MAX, window_bytes_max: int = WINDOW_BYTES_MAX) -> None:
        self.vhost = vhost
        self.name = name
        self.backing = backing
        self.durable = durable and backing is not None
        self.window_max = window_max if backing is not None else 1 << 62
        self.window_bytes_max = window_bytes_max if backing is not None else 1 << 62
        self.window_bytes = 0  # body bytes of the messages in `ready`
        self.next_seq = 0
        self.ready: deque[Message] = deque()
        self.spilled_count = 0  # ready messages only the backing holds, all with seq >= spill_cursor
        self.spilled_persistent = 0  # of those, persistent ones
        self.spill_cursor = 0
        self.delivered_upto = -1  # highest seq delivered at least once
        self.returned: list[tuple[int, Message]] = []  # heap by seq, served before `ready`
        self.consumers: dict[str, Consumer] = {}
        # Round robin per priority: priority -> deque of active consumer ids; `_priorities`
        # descending. Only active consumers are in a ring.
        self._rings: dict[int, deque[str]] = {}
        self._priorities: list[int] = []
        self._active_count = 0  # kept, not counted: queue.declare and auto-delete ask often
        self.exclusive_consumer: str | None = None
        self.deleted = False
        self.ever_had_consumer = False
        self.last_index = 0
        self._handlers = {
            Enqueue: self._enqueue,
            Checkout: self._checkout,
            Cancel: self._cancel,
            Settle: self._settle,
            Requeue: self._requeue,
            Discard: self._discard,
            Credit: self._credit,
            Get: self._get,
            Purge: self._purge,
            Down: self._down,
            DeleteQueue: self._delete,
        }

    # ------------------------------------------------------------- queries

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returned) + self.spilled_count

    def recover(self, next_seq: int, spilled_count: int, spill_cursor: int) -> None:
        """Start from what a restarted node's backing holds: everything is spilled, nothing delivered."""
        self.next_seq = next_seq
        self.spilled_count = spilled_count
        self.spilled_persistent = spilled_count
        self.spill_cursor = spill_cursor

    @property
    def unacked_count(self) -> int:
        return sum(len(c.checked_out) for c in self.consumers.values())

    @property
    def active_consumer_count(self) -> int:
        return self._active_count

    # --------------------------------------------------------------- apply

    def apply(self, meta: Meta, command: Any) -> tuple[Any, list]:
        # Handlers validate a command completely before they change anything, so a refusal
        # leaves the state as it was. The `except` is the last line for bugs of ours: it keeps
        # the log moving, but cannot undo a half-applied command.
        try:
            log_index = meta.log_index
            if type(log_index) is not int:
                return Rejected(541, f"malformed log entry meta {meta!r}"), []
            self.last_index = log_index
            if self.deleted:
                return Rejected(404, f"no queue '{self.name}' in vhost '{self.vhost}'"), []
            handler = self._handlers.get(type(command))
            if handler is None:
                return Rejected(541, f"unknown queue command {type(command).__name__}"), []
            return handler(meta, command)
        except Exception as exc:  # never let one bad command stall the log
            return Rejected(541, f"internal error applying {type(command).__name__}: {exc!r}"), []

    # ------------------------------------------------------------ commands

    def _enqueue(self, meta: Meta, cmd: Enqueue):
        messages = cmd.messages
        if type(messages) is not list and type(messages) is not tuple:
            return _malformed(cmd, "messages must be a list"), []
        for message in messages:
            # A Message belongs to one queue once (seq == -1 until then): the machine keeps and
            # mutates it, so the same object enqueued twice would sit in two places.
            if type(message) is not Message or message.seq != -1:
                return _malformed(cmd, f"not a new Message: {message!r}"), []
        if len(messages) > 1 and len({id(m) for m in messages}) != len(messages):
            return _malformed(cmd, "the same Message twice in one batch"), []
        seq = self.next_seq
        ready = self.ready
        append = ready.append
        backing = self.backing
        if backing is None:
            for message in messages:
                message.seq = seq
                seq += 1
                append(message)
                self.window_bytes += len(message.body)
        else:
            to_write = []
            durable = self.durable
            window_max = self.window_max
            window_bytes_max = self.window_bytes_max
            for message in messages:
                message.seq = seq
                if self.spilled_count or len(ready) >= window_max or self.window_bytes >= window_bytes_max:
                    if not self.spilled_count:
                        self.spill_cursor = seq
                    self.spilled_count += 1
                    self.spilled_persistent += message.persistent
                    message.stored = True
                    to_write.append(message)
                else:
                    append(message)
                    self.window_bytes += len(message.body)
                    if durable and message.persistent:
                        message.stored = True
                        to_write.append(message)
                seq += 1
            if to_write:
                backing.write(to_write)
        self.next_seq = seq
        return len(messages), self._service()

    def _checkout(self, meta: Meta, cmd: Checkout):
        consumer_id, prefetch, credit = cmd.consumer_id, cmd.prefetch, cmd.credit
        if (type(consumer_id) is not str or type(cmd.owner) is not str or type(prefetch) is not int or prefetch < 0
                or type(cmd.no_ack) is not bool or type(cmd.priority) is not int or type(cmd.exclusive) is not bool
                or type(credit) is not int or credit < 0):
            return _malformed(cmd), []
        consumer = self.consumers.get(consumer_id)
        if consumer is not None and consumer.active:
            return Rejected(530, f"attempt to reuse consumer tag '{consumer_id}'"), []
        if self.exclusive_consumer is not None or (cmd.exclusive and self._active_count):
            return Rejected(403, f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use"), []
        if consumer is None:
            consumer = Consumer(consumer_id, cmd.owner, prefetch, cmd.no_ack, cmd.priority, credit)
            self.consumers[consumer_id] = consumer
        else:
            # The id of a cancelled consumer whose deliveries are still unacked: AMQP lets a
            # channel reuse a tag once basic.cancel is done, and the id is (connection, channel,
            # tag). It comes back holding them; they count against its prefetch, as in RabbitMQ,
            # where acks credit the consumer by tag. (Also the id of a basic.get holder.)
            consumer.owner = cmd.owner
            consumer.prefetch = prefetch
            consumer.no_ack = cmd.no_ack
            consumer.priority = cmd.priority
            consumer.credit = credit
            consumer.active = True
        self._active_count += 1
        self.ever_had_consumer = True
        if cmd.exclusive:
            self.exclusive_consumer = consumer_id
        ring = self._rings.get(cmd.priority)
        if ring is None:
            ring = self._rings[cmd.priority] = deque()
            self._priorities = sorted(self._rings, reverse=True)
        ring.append(consumer_id)
        return True, self._service()

    def _cancel(self, meta: Meta, cmd: Cancel):
        if type(cmd.consumer_id) is not str:
            return _malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None or not consumer.active:
            return self._active_count, []
        self._deactivate(consumer)
        # RabbitMQ keeps a cancelled consumer's deliveries unacked: the channel may still ack them.
        if not consumer.checked_out:
            del self.consumers[cmd.consumer_id]
        return self._active_count, []

    def _settle(self, meta: Meta, cmd: Settle | Discard):
        if type(cmd.consumer_id) is not str or _bad_seqs(cmd.seqs):
            return _malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        checked_out = consumer.checked_out
        settled = 0
        stored = None
        for seq in cmd.seqs:  # unknown seqs (another consumer's, already settled) are ignored
            message = checked_out.pop(seq, None)
            if message is not None:
                settled += 1
                if message.stored:
                    if stored is None:
                        stored = []
                    stored.append(message)
        if stored:
            self.backing.remove(stored)
        self._forget_if_idle(consumer)
        return settled, self._service() if settled else []

    def _requeue(self, meta: Meta, cmd: Requeue):
        if type(cmd.consumer_id) is not str or _bad_seqs(cmd.seqs):
            return _malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        n = self._return(consumer, cmd.seqs)
        self._forget_if_idle(consumer)
        return n, self._service() if n else []

    def _discard(self, meta: Meta, cmd: Discard):
        # Reject without requeue: the message leaves the queue (dead lettering comes later).
        return self._settle(meta, cmd)

    def _credit(self, meta: Meta, cmd: Credit):
        if type(cmd.consumer_id) is not str or type(cmd.messages) is not int or cmd.messages < 0:
            return _malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        consumer.credit += cmd.messages
        return consumer.credit, self._service()

    def _get(self, meta: Meta, cmd: Get):
        if type(cmd.consumer_id) is not str or type(cmd.owner) is not str or type(cmd.no_ack) is not bool:
            return _malformed(cmd), []
        message = self._pop_next()
        if message is None:
            return None, []
        redelivered = message.redelivered
        message.delivery_count += 1
        if message.seq > self.delivered_upto:
            self._note_delivered(message.seq)
        if cmd.no_ack:
            if message.stored:
                self.backing.remove([message])
        else:
            consumer = self.consumers.get(cmd.consumer_id)
            if consumer is None:
                consumer = self.consumers[cmd.consumer_id] = Consumer(cmd.consumer_id, cmd.owner, 0, False, 0, 0, active=False)
            consumer.checked_out[message.seq] = message
        return (message, redelivered, self.ready_count), []

    def _purge(self, meta: Meta, cmd: Purge):
        # Purge removes ready messages only; unacked ones stay with their consumers (as RabbitMQ).
        n = self.ready_count
        stored = [m for m in self.ready if m.stored] + [m for _, m in self.returned if m.stored]
        if stored:
            self.backing.remove(stored)
        if self.spilled_count:
            self.backing.remove_from(self.spill_cursor, self.spilled_persistent)
            self.spilled_count = self.spilled_persistent = 0
        self.ready.clear()
        self.window_bytes = 0
        self.returned.clear()
        return n, []

    def _down(self, meta: Meta, cmd: Down):
        """The owner (a channel, or all of a connection's or node's) is gone: drop its consumers,
        return their unacked messages."""
        if type(cmd.owner) is not str:
            return _malformed(cmd), []
        returned = 0
        owner = cmd.owner
        prefix = owner.endswith(("@", "/"))
        for consumer in [c for c in self.consumers.values()
                         if c.owner == owner or prefix and c.owner.startswith(owner)]:
            self._deactivate(consumer)
            returned += self._return(consumer, list(consumer.checked_out))
            del self.consumers[consumer.consumer_id]
        return returned, self._service() if returned else []

    def _delete(self, meta: Meta, cmd: DeleteQueue):
        n = self.ready_count
        self.deleted = True
        if self.backing is not None:
            self.backing.drop()
        self.spilled_count = self.spilled_persistent = 0
        self.ready.clear()
        self.window_bytes = 0
        self.returned.clear()
        self.consumers.clear()
        self._rings.clear()
        self._priorities = []
        self._active_count = 0
        self.exclusive_consumer = None
        return n, []

    # ------------------------------------------------------------- helpers

    def _deactivate(self, consumer: Consumer) -> None:
        if not consumer.active:
            return
        consumer.active = False
        self._active_count -= 1
        ring = self._rings.get(consumer.priority)
        if ring is not None:
            ring.remove(consumer.consumer_id)
            if not ring:
                del self._rings[consumer.priority]
                self._priorities = sorted(self._rings, reverse=True)
        if self.exclusive_consumer == consumer.consumer_id:
            self.exclusive_consumer = None

    def _forget_if_idle(self, consumer: Consumer) -> None:
        if not consumer.active and not consumer.checked_out:
            self.consumers.pop(consumer.consumer_id, None)

    def _return(self, consumer: Consumer, seqs) -> int:
        n = 0
        checked_out = consumer.checked_out
        for seq in seqs:
            message = checked_out.pop(seq, None)
            if message is not None:
                message.redelivered = True
                heapq.heappush(self.returned, (message.seq, message))
                n += 1
        return n

    def _pop_next(self) -> Message | None:
        if self.returned:
            return heapq.heappop(self.returned)[1]
        if not self.ready and self.spilled_count:
            self._refill()
        if self.ready:
            message = self.ready.popleft()
            self.window_bytes -= len(message.body)
            return message
        return None

    def _refill(self) -> None:
        """Load the next spilled messages into the (empty) window."""
        loaded = self.backing.load(self.spill_cursor, self.window_max)
        if not loaded:
            # The backing holds fewer than counted: transient messages of a durable queue do
            # not survive a restart. Nothing more is spilled.
            self.spilled_count = self.spilled_persistent = 0
            return
        for message in loaded:
            message.stored = True
        self.ready.extend(loaded)
        self.window_bytes += sum(len(m.body) for m in loaded)
        self.spilled_count = max(0, self.spilled_count - len(loaded))
        self.spilled_persistent = max(0, self.spilled_persistent - sum(m.persistent for m in loaded))
        self.spill_cursor = loaded[-1].seq + 1

    def _note_delivered(self, seq: int) -> None:
        self.delivered_upto = seq
        if self.durable:
            self.backing.delivered(seq)

    def _pick_consumer(self) -> Consumer | None:
        """The next consumer with room: highest priority first, round robin within one.

        Call it only when there is a message to give: the consumer it returns has had its turn.
        """
        consumers = self.consumers
        for priority in self._priorities:
            ring = self._rings[priority]
            for _ in range(len(ring)):
                consumer = consumers[ring[0]]
                ring.rotate(-1)
                if consumer.has_room():
                    return consumer
        return None

    def _service(self) -> list:
        """Hand ready messages to consumers with room, as far as both allow."""
        returned = self.returned
        ready = self.ready
        if not self._priorities or not (returned or ready or self.spilled_count):
            return []
        effects: list = []
        if len(self._priorities) == 1:
            ring = self._rings[self._priorities[0]]
            if len(ring) == 1:
                # One consumer, the common case: its room is known up front, so each message
                # costs a pop and an append, with no ring walk and no `has_room`.
                consumer = self.consumers[ring[0]]
                room = consumer.credit
                checked_out = None if consumer.no_ack else consumer.checked_out
                if checked_out is not None and consumer.prefetch:
                    room = min(room, consumer.prefetch - len(checked_out))
                if room <= 0:
                    return effects
                consumer_id = consumer.consumer_id
                append = effects.append
                heappop = heapq.heappop
                popleft = ready.popleft
                n = 0
                stored = None
                while n < room:
                    if returned:
                        message = heappop(returned)[1]
                    elif ready:
                        message = popleft()
                        self.window_bytes -= len(message.body)
                    elif self.spilled_count:
                        self._refill()
                        continue
                    else:
                        break
                    message.delivery_count += 1
                    if checked_out is not None:
                        checked_out[message.seq] = message
                    elif message.stored:
                        if stored is None:
                            stored = []
                        stored.append(message)
                    append(Deliver(consumer_id, message, message.redelivered))
                    n += 1
                consumer.credit -= n
                if n:
                    self._after_deliveries(effects, stored)
                return effects
        # Pick only while a message waits: a consumer picked for nothing would lose its turn.
        stored = None
        while returned or ready or self.spilled_count:
            if not returned and not ready:
                self._refill()
                continue
            consumer = self._pick_consumer()
            if consumer is None:
                break
            if returned:
                message = heapq.heappop(returned)[1]
            else:
                message = ready.popleft()
                self.window_bytes -= len(message.body)
            message.delivery_count += 1
            consumer.credit -= 1
            if not consumer.no_ack:
                consumer.checked_out[message.seq] = message
            elif message.stored:
                if stored is None:
                    stored = []
                stored.append(message)
            effects.append(Deliver(consumer.consumer_id, message, message.redelivered))
        if effects:
            self._after_deliveries(effects, stored)
        return effects

    def _after_deliveries(self, effects: list, stored_no_ack: list | None) -> None:
        if stored_no_ack:
            self.backing.remove(stored_no_ack)
        # Returned messages go first and were delivered before, so the last effect has the top seq.
        top = effects[-1].message.seq
        if top > self.delivered_upto:
            self._note_delivered(top)

    def check_invariants(self) -> None:
        """For tests and simulation: every message is in exactly one place, the indexes agree."""
        seen = set()
        previous = -1
        for m in self.ready:
            assert previous < m.seq < self.next_seq, "ready is in sequence order"
            # (redelivered may be set on a message loaded after a restart: delivered before it)
            assert m.delivery_count == 0 and (m.stored or self.backing is None or not self.durable or not m.persistent)
            previous = m.seq
            seen.add(m.seq)
        for seq, m in self.returned:
            assert seq == m.seq and seq not in seen and 0 <= seq < self.next_seq
            assert m.redelivered and m.delivery_count > 0
            seen.add(seq)
        active = 0
        for consumer_id, c in self.consumers.items():
            assert c.consumer_id == consumer_id
            # A consumer that is neither attached nor holding anything is forgotten. (A no-ack
            # consumer may hold messages too: those it had before its tag was cancelled and reused.)
            assert c.active or c.checked_out
            active += c.active
            for seq, m in c.checked_out.items():
                assert seq == m.seq and seq not in seen and 0 <= seq < self.next_seq
                assert m.delivery_count > 0
                seen.add(seq)
        assert active == self._active_count
        assert self.spilled_count >= 0 and (not self.spilled_count or self.backing is not None)
        assert self.window_bytes == sum(len(m.body) for m in self.ready)
        if self.spilled_count and self.ready:
            assert self.ready[-1].seq < self.spill_cursor, "the window comes before the spilled tail"
        in_rings = 0
        for priority, ring in self._rings.items():
            assert ring, "empty rings are removed"
            for cid in ring:
                assert self.consumers[cid].active and self.consumers[cid].priority == priority
            in_rings += len(ring)
        assert in_rings == active, "every active consumer is in exactly one ring"
        assert self._priorities == sorted(self._rings, reverse=True)
        if self.exclusive_consumer is not None:
            assert self.consumers[self.exclusive_consumer].active
