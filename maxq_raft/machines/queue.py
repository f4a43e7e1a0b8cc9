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

Queue features (the queue's arguments, parsed into `QueueSettings` by queue_args.py):

- TTL (x-message-ttl, a message's `expiration`): a message's deadline is fixed at enqueue from
  the entry's time. As in RabbitMQ, a message can be delivered up to its deadline, so TTL 0
  reaches a consumer that is waiting; an expired message met while serving is never delivered;
  and after every command the expired messages at the head (of the returned heap and of the
  ready window, loading spilled ones) are removed, at most `DROP_BATCH_MAX` per command, more
  at the next `Tick`. An expired message behind an unexpired head waits until it is the head.
- x-expires: unused (no consumer, no basic.get, no redeclare `Touch`) for that long, the queue
  says `QueueExpired`; the shell deletes it. Its messages are not dead-lettered (RabbitMQ).
- Length limits (x-max-length, x-max-length-bytes, ready messages only): `drop-head` removes
  from the head after delivering what it can; `reject-publish(-dlx)` refuses a message that
  would go over (the reply `Overflowed` names them, for the publisher's basic.nack).
- Dead lettering: with x-dead-letter-exchange, a message rejected without requeue, expired or
  dropped for length leaves the queue into `dead_lettering` (still in the backing) and a
  `DeadLetter` effect asks the shell to republish it; only `DeadLettered` removes it, so a
  crash in between dead-letters it again rather than losing it (at-least-once).
`next_deadline_ms` says when the queue next needs a `Tick`; the shell ticks only those queues.
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
    DeadLettered,
    DeleteQueue,
    Discard,
    Down,
    Enqueue,
    Get,
    Purge,
    Requeue,
    Settle,
    Tick,
    Touch,
    UpdateSettings,
)
from .delayed import DELAYED_BASE, DelayedMessages
from .delayed import WINDOW_MAX as DELAYED_WINDOW_MAX
from .queue_args import DEFAULT_SETTINGS, QueueSettings


class Meta(NamedTuple):
    """Stamped by the proposer into each log entry: pysyncobj passes none of this to apply."""

    log_index: int
    time_ms: int


class Message:
    """A queued message. `props_raw` and `body` are opaque bytes for the machine."""

    __slots__ = ("seq", "exchange", "routing_key", "props_raw", "body", "delivery_count", "redelivered",
                 "persistent", "stored", "wire_routing", "ttl_ms", "expires_at_ms", "publish_ref", "priority", "count_header",
                 "delay_ms", "due_ms", "delay_counter", "death")

    def __init__(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes, persistent: bool = False,
                 ttl_ms: int | None = None, priority: int = 0, delay_ms: int | None = None) -> None:
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
        self.ttl_ms = ttl_ms  # the `expiration` property, parsed by the shell
        self.expires_at_ms: int | None = None  # set at enqueue from the TTLs and the entry's time
        self.publish_ref = None  # the shell's (channel number, confirm seq), to nack a refused publish
        self.priority = priority  # the `priority` property (0 when absent); used by x-max-priority queues
        self.count_header = False  # returned in a queue that counts deliveries: send x-delivery-count
        self.delay_ms = delay_ms  # the `x-delay` header, parsed by the shell: held this long first
        self.due_ms: int | None = None  # a delayed message's release time (delayed.py)
        self.delay_counter = 0  # its number among the queue's delayed messages (in its key)
        self.death: tuple[str, int] | None = None  # (reason, machine time) while in dead_lettering

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, rk={self.routing_key!r}, body={self.body[:20]!r})"


class Deliver(NamedTuple):
    """Effect: send `message` to `consumer_id` (its host performs it)."""

    consumer_id: str
    message: Message
    redelivered: bool


_new_tuple = tuple.__new__


class DeadLetter(NamedTuple):
    """Effect: republish `messages` to `exchange` (with `routing_key`, or their own when None),
    adding x-death for `reason` (rejected, expired, maxlen), then apply `DeadLettered` with the
    seqs of those that have one (a publish refused by reject-publish-dlx was never queued)."""

    vhost: str
    queue: str
    reason: str
    messages: list
    time_ms: int
    exchange: str
    routing_key: str | None


class QueueExpired(NamedTuple):
    """Effect: x-expires has passed with the queue unused; the shell deletes it."""

    vhost: str
    name: str


class Overflowed(NamedTuple):
    """Reply to an Enqueue into a full reject-publish queue: `rejected` were not queued."""

    accepted: int
    rejected: list


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

    def remove_from(self, seq_from: int, persistent: int, seq_below: int | None = None) -> None:
        """Every stored message with seq >= seq_from (and < seq_below) left the queue (purge of the
        spilled tail); `persistent` of them were persistent."""

    def load(self, seq_from: int, limit: int, seq_below: int | None = None) -> list:
        """Up to `limit` stored messages with seq >= seq_from (and < seq_below), in seq order."""

    def rewrite(self, messages: list) -> None:
        """These stored messages changed (their delivery count): store them again, in place."""

    def delivered(self, seq: int) -> None:
        """Messages up to `seq` have been delivered at least once (their redelivered flag after a restart)."""

    def drop(self) -> None:
        """The queue is deleted."""


# Ready messages a queue keeps in memory before it spills to its backing: enough that a consumer
# briefly behind its publisher never touches the disk, small enough that a deep queue costs a
# bounded amount of memory (many deep queues together are the memory alarm's business).
# Seqs are below 2**48; a priority queue puts the priority lane above them (priority_queue.py).
SEQ_BITS = 48
SEQ_MASK = (1 << SEQ_BITS) - 1
WINDOW_MAX = 65536
WINDOW_BYTES_MAX = 32 << 20
# Messages one command may expire or drop for length; the rest go at the next Tick (bounded work
# per log entry, so a deep queue whose whole backlog expired does not stall its group).
DROP_BATCH_MAX = 4096
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")


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
                 window_max: int = WINDOW_MAX, window_bytes_max: int = WINDOW_BYTES_MAX,
                 settings: QueueSettings = DEFAULT_SETTINGS, delayed_window_max: int | None = None) -> None:
        self.vhost = vhost
        self.settings = settings
        self.now_ms = 0  # the time of the entry being applied (of the last one, between entries)
        self.ready_bytes = 0  # body bytes of all ready messages (window, returned, spilled)
        self._recovered_below = 0  # seqs below this were recovered: their bytes count once loaded
        # seq -> Message: left the queue for a dead-letter exchange, kept (and stored) until the
        # shell says the targets have it (DeadLettered)
        self.dead_lettering: dict[int, Message] = {}
        self._dying: dict[str, list] = {}  # reason -> messages leaving in this command
        self._unstore: list = []  # stored messages dropped in this command
        self.dropped = {reason: 0 for reason in REASONS}  # left with no dead-letter exchange
        self.dead_lettered = {reason: 0 for reason in REASONS}
        self.rejected_publishes = 0
        self.last_used_ms: int | None = None  # x-expires: the last consume/get/declare
        self.expired = False
        # True once any message has a deadline: only then do heads need looking at
        self._timed = settings.message_ttl_ms is not None
        self._more_due = False  # a command hit DROP_BATCH_MAX: tick again at once
        self._fifo = True  # ready messages in seq order (False in PriorityQueueMachine)
        # Returned messages waiting out their retry back-off: a heap of (due ms, seq, message).
        # Not ready (not counted, not delivered) until due, when they join `returned`.
        self.backoff: list[tuple[int, int, Message]] = []
        self._counts_returns = settings.delivery_limit is not None or settings.retry_backoff_ms is not None
        self.delayed = DelayedMessages(backing, delayed_window_max or DELAYED_WINDOW_MAX)  # x-delay
        # x-single-active-consumer: attached consumer ids in the order they came; the first is served
        self._sac_order: list[str] = []
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
            Tick: self._tick,
            Touch: self._touch,
            DeadLettered: self._dead_lettered,
            UpdateSettings: self._update_settings,
        }

    # ------------------------------------------------------------- queries

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returned) + self.spilled_count

    def recover(self, next_seq: int, spilled_count: int, spill_cursor: int) -> None:
        """Start from what a restarted node's backing holds: everything is spilled, nothing delivered.

        The bytes of the recovered messages are not known until they are loaded (start-up reads
        no message), so x-max-length-bytes counts them from then on."""
        self._recovered_below = next_seq
        delayed = getattr(self.backing, "delayed_stored", 0)
        self.delayed.recover(delayed, getattr(self.backing, "delayed_next", 0))
        spilled_count = max(0, spilled_count - delayed)
        # The watermark goes on from the backing's: delivering an old message must not lower it.
        self.delivered_upto = max(self.delivered_upto, getattr(self.backing, "delivered_upto", -1))
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

    @property
    def next_deadline_ms(self) -> int | None:
        """When this queue next needs a `Tick` (an entry time), or None: nothing is due without traffic."""
        if self.deleted or self.expired:
            return None
        if self._more_due:
            return self.now_ms
        deadline = self._head_expiry_ms() if self._timed else None
        if deadline == -1:
            return self.now_ms  # a head is on disk: a Tick loads it
        expires_ms = self.settings.expires_ms
        if expires_ms is not None and not self._active_count:
            unused = (self.now_ms if self.last_used_ms is None else self.last_used_ms) + expires_ms
            if deadline is None or unused < deadline:
                deadline = unused
        if self.backoff and (deadline is None or self.backoff[0][0] < deadline):
            deadline = self.backoff[0][0]
        if self.delayed.count:
            due = self.delayed.next_due_ms
            if due is not None and (deadline is None or due < deadline):
                deadline = due
        return deadline

    def _head_expiry_ms(self) -> int | None:
        """The earliest TTL deadline among the heads (None: none; -1: a head must be loaded first)."""
        deadline = None
        if self.returned:
            deadline = self.returned[0][1].expires_at_ms
        if self.ready:
            head = self.ready[0].expires_at_ms
            if head is not None and (deadline is None or head < deadline):
                deadline = head
        elif self.spilled_count:
            return -1
        return deadline

    # --------------------------------------------------------------- apply

    def apply(self, meta: Meta, command: Any) -> tuple[Any, list]:
        # Handlers validate a command completely before they change anything, so a refusal
        # leaves the state as it was. The `except` is the last line for bugs of ours: it keeps
        # the log moving, but cannot undo a half-applied command.
        try:
            log_index = meta.log_index
            if type(log_index) is not int or type(meta.time_ms) is not int:
                return Rejected(541, f"malformed log entry meta {meta!r}"), []
            self.last_index = log_index
            if self.deleted:
                return Rejected(404, f"no queue '{self.name}' in vhost '{self.vhost}'"), []
            handler = self._handlers.get(type(command))
            if handler is None:
                return Rejected(541, f"unknown queue command {type(command).__name__}"), []
            self.now_ms = meta.time_ms
            if self.backoff and self.backoff[0][0] <= self.now_ms:
                self._release_backoff()
            released = None
            if self.delayed.count:
                due = self.delayed.next_due_ms
                if due is not None and due <= self.now_ms:
                    released = self._release_delayed()
            reply, effects = handler(meta, command)
            if released:
                effects = released + effects
            if type(reply) is Rejected:
                return reply, effects
            if self._timed:
                self._expire_heads()
            if self.settings.limited and self.settings.overflow == "drop-head" and self._drop_over_limit() and self._timed:
                self._expire_heads()  # the new head may be due too (RabbitMQ: drop_expired, drop_head)
            if self._dying or self._unstore:
                effects = self._flush_dying(effects)
            return reply, effects
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
            ttl = message.ttl_ms
            if ttl is not None and (type(ttl) is not int or ttl < 0):
                return _malformed(cmd, f"bad ttl_ms {ttl!r}"), []
            delay = message.delay_ms
            if delay is not None and (type(delay) is not int or delay < 0):
                return _malformed(cmd, f"bad delay_ms {delay!r}"), []
        if len(messages) > 1 and len({id(m) for m in messages}) != len(messages):
            return _malformed(cmd, "the same Message twice in one batch"), []
        now = self.now_ms
        if any(message.delay_ms for message in messages):
            # x-delay: held until due, then enqueued as if published then (delayed.py)
            self.delayed.add_all([message for message in messages if message.delay_ms], now)
            messages = [message for message in messages if not message.delay_ms]
            if not messages:
                return len(cmd.messages), []
            reply, effects = self._accept(messages)
            if type(reply) is Overflowed:
                return Overflowed(reply.accepted + len(cmd.messages) - len(messages), reply.rejected), effects
            return len(cmd.messages), effects
        return self._accept(messages)

    def _release_delayed(self) -> list:
        """Enqueue the delayed messages that are due (at most DROP_BATCH_MAX per command)."""
        released, more = self.delayed.release(self.now_ms, DROP_BATCH_MAX)
        if more:
            self._more_due = True
        if not released:
            return []
        for message in released:
            message.delay_ms = None
            message.expires_at_ms = None
        reply, effects = self._accept(released)
        return effects

    def _accept(self, messages: list):
        """Enqueue new messages (published now, or delayed ones falling due now)."""
        settings = self.settings
        queue_ttl = settings.message_ttl_ms
        now = self.now_ms
        for message in messages:
            # The shorter of the queue's and the message's TTL (RabbitMQ), from the entry's time.
            ttl = message.ttl_ms
            if queue_ttl is not None and (ttl is None or queue_ttl < ttl):
                ttl = queue_ttl
            if ttl is not None:
                message.expires_at_ms = now + ttl
                self._timed = True
        if settings.limited and settings.overflow != "drop-head":
            return self._enqueue_or_reject(messages)
        self._append(messages)
        return len(messages), self._service()

    def _enqueue_or_reject(self, messages: list):
        """reject-publish(-dlx): as rabbit_amqqueue_process, a message that would take the ready
        count or bytes over the limit is refused; each accepted one is offered to the consumers
        before the next is judged, as RabbitMQ delivers each publish before the next."""
        settings = self.settings
        max_length, max_bytes = settings.max_length, settings.max_length_bytes
        effects: list = []
        rejected = []
        for message in messages:
            if ((max_length is not None and self.ready_count + 1 > max_length)
                    or (max_bytes is not None and self.ready_bytes + len(message.body) > max_bytes)):
                rejected.append(message)
                self.rejected_publishes += 1
                if settings.overflow == "reject-publish-dlx" and settings.dead_letter_exchange is not None:
                    self._dying.setdefault("maxlen", []).append(message)
                    self.dead_lettered["maxlen"] += 1
                continue
            self._append([message])
            effects.extend(self._service())
        accepted = len(messages) - len(rejected)
        return (Overflowed(accepted, rejected) if rejected else accepted), effects

    def _append(self, messages: list) -> None:
        """Give the messages their seqs and put them at the tail (the window, or the backing)."""
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
        self.ready_bytes += sum(len(m.body) for m in messages)

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
        self.last_used_ms = self.now_ms
        if cmd.exclusive:
            self.exclusive_consumer = consumer_id
        if self.settings.single_active_consumer:
            self._sac_order.append(consumer_id)
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
        # Reject without requeue: the message leaves the queue, to the dead-letter exchange if any.
        if self.settings.dead_letter_exchange is None:
            settled, effects = self._settle(meta, cmd)
            if type(settled) is int:
                self.dropped["rejected"] += settled
            return settled, effects
        if type(cmd.consumer_id) is not str or _bad_seqs(cmd.seqs):
            return _malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        n = 0
        for seq in cmd.seqs:
            message = consumer.checked_out.pop(seq, None)
            if message is not None:
                self._die(message, "rejected")
                n += 1
        self._forget_if_idle(consumer)
        return n, self._service() if n else []

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
        self.last_used_ms = self.now_ms
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
            self.backing.remove_from(self.spill_cursor, self.spilled_persistent, DELAYED_BASE)
            self.spilled_count = self.spilled_persistent = 0
        self.ready.clear()
        self.window_bytes = 0
        self.ready_bytes = 0
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
        self.ready_bytes = 0
        self.returned.clear()
        self.backoff.clear()
        self.delayed.clear()
        self.dead_lettering.clear()
        self._dying.clear()
        self._unstore.clear()
        self.consumers.clear()
        self._sac_order.clear()
        self._rings.clear()
        self._priorities = []
        self._active_count = 0
        self.exclusive_consumer = None
        return n, []

    def _tick(self, meta: Meta, cmd: Tick):
        # Expiry of messages happens after every command (in `apply`); a Tick adds x-expires.
        self._more_due = False
        effects = self._service()  # messages whose back-off ended (released in `apply`)
        if self.last_used_ms is None:
            self.last_used_ms = self.now_ms  # a recovered queue: its unused time starts now
        expires_ms = self.settings.expires_ms
        if (expires_ms is not None and not self._active_count and not self.expired
                and self.last_used_ms + expires_ms <= self.now_ms):
            self.expired = True
            return True, [*effects, QueueExpired(self.vhost, self.name)]
        return False, effects

    def _update_settings(self, meta: Meta, cmd: UpdateSettings):
        settings = cmd.settings
        if type(settings) is not QueueSettings:
            return _malformed(cmd), []
        if (settings.max_priority != self.settings.max_priority
                or settings.single_active_consumer != self.settings.single_active_consumer):
            return Rejected(406, "x-max-priority and x-single-active-consumer cannot change"), []
        self.settings = settings
        if settings.message_ttl_ms is not None:
            self._timed = True
        self._counts_returns = settings.delivery_limit is not None or settings.retry_backoff_ms is not None
        return True, self._service()

    def _touch(self, meta: Meta, cmd: Touch):
        self.last_used_ms = self.now_ms
        return True, []

    def _dead_lettered(self, meta: Meta, cmd: DeadLettered):
        if _bad_seqs(cmd.seqs):
            return _malformed(cmd), []
        n = 0
        for seq in cmd.seqs:  # unknown seqs (already done, -1 for refused publishes) are ignored
            message = self.dead_lettering.pop(seq, None)
            if message is not None:
                n += 1
                if message.stored:
                    self._unstore.append(message)
        return n, []

    # ------------------------------------------------------------- helpers

    def _die(self, message: Message, reason: str) -> None:
        """`message` has left the ready or unacked state for `reason`: dead-letter or drop it."""
        if self.settings.dead_letter_exchange is not None:
            message.death = (reason, self.now_ms)  # a new leader performs it again if it stays held
            self.dead_lettering[message.seq] = message
            self.dead_lettered[reason] += 1
            dying = self._dying.get(reason)
            if dying is None:
                self._dying[reason] = [message]
            else:
                dying.append(message)
        else:
            self.dropped[reason] += 1
            if message.stored:
                self._unstore.append(message)

    def _flush_dying(self, effects: list) -> list:
        if self._unstore:
            self.backing.remove(self._unstore)
            self._unstore = []
        if self._dying:
            settings = self.settings
            for reason, messages in self._dying.items():
                effects.append(DeadLetter(self.vhost, self.name, reason, messages, self.now_ms,
                                          settings.dead_letter_exchange, settings.dead_letter_routing_key))
            self._dying = {}
        return effects

    def _expire_returned(self, budget: int) -> int:
        """Expire returned messages (in seq order) whose deadline has passed; the budget left."""
        now = self.now_ms
        returned = self.returned
        while returned and budget:
            message = returned[0][1]
            if message.expires_at_ms is None or message.expires_at_ms > now:
                break
            heapq.heappop(returned)
            self.ready_bytes -= len(message.body)
            self._die(message, "expired")
            budget -= 1
        return budget

    def _expire_heads(self) -> None:
        """Remove the expired messages at the heads (returned, then the window, loading spilled
        ones), at most DROP_BATCH_MAX; `_more_due` asks for a Tick if that was not all."""
        now = self.now_ms
        budget = self._expire_returned(DROP_BATCH_MAX)
        ready = self.ready
        while budget:
            if not ready:
                if not self.spilled_count:
                    break
                self._refill()
                continue
            message = ready[0]
            if message.expires_at_ms is None or message.expires_at_ms > now:
                break
            ready.popleft()
            self.window_bytes -= len(message.body)
            self.ready_bytes -= len(message.body)
            self._die(message, "expired")
            budget -= 1
        if not budget:
            self._more_due = True

    def _drop_over_limit(self) -> bool:
        """drop-head: remove from the head until the ready count and bytes are within the limits."""
        settings = self.settings
        max_length = settings.max_length if settings.max_length is not None else 1 << 62
        max_bytes = settings.max_length_bytes if settings.max_length_bytes is not None else 1 << 62
        budget = DROP_BATCH_MAX
        while self.ready_count > max_length or self.ready_bytes > max_bytes:
            if not budget:
                self._more_due = True
                break
            message = self._pop_next()
            if message is None:
                break
            self._die(message, "maxlen")
            budget -= 1
        return budget < DROP_BATCH_MAX

    def _expired(self, message: Message) -> bool:
        """Met while serving: past its deadline (a message may go out up to its deadline)."""
        expires_at = message.expires_at_ms
        if expires_at is not None and expires_at < self.now_ms:
            self._die(message, "expired")
            return True
        return False

    def _deactivate(self, consumer: Consumer) -> None:
        if not consumer.active:
            return
        consumer.active = False
        self._active_count -= 1
        self.last_used_ms = self.now_ms
        if self._sac_order:
            # The next attached consumer, in the order they came, becomes the active one.
            self._sac_order.remove(consumer.consumer_id)
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
        counts_returns = self._counts_returns
        recount = None
        for seq in seqs:
            message = checked_out.pop(seq, None)
            if message is not None:
                message.redelivered = True
                n += 1
                if counts_returns:
                    if message.stored and self.durable and message.persistent and not self._over_limit(message):
                        # The count survives a restart with the message (rabbit_fifo keeps it in its log).
                        if recount is None:
                            recount = []
                        recount.append(message)
                    if self._return_counted(message):
                        continue
                heapq.heappush(self.returned, (message.seq, message))
                self.ready_bytes += len(message.body)
        if recount:
            self.backing.rewrite(recount)
        return n

    def _over_limit(self, message: Message) -> bool:
        limit = self.settings.delivery_limit
        return limit is not None and message.delivery_count > limit

    def _return_counted(self, message: Message) -> bool:
        """x-delivery-limit and retry back-off: True if the message does not go back now.

        Every delivery but the last ended in a return, so this is return number
        `delivery_count` (rabbit_fifo counts returns the same way: requeues and lost consumers)."""
        settings = self.settings
        returns = message.delivery_count
        message.count_header = True
        if settings.delivery_limit is not None and returns > settings.delivery_limit:
            self._die(message, "delivery_limit")
            return True
        if settings.retry_backoff_ms is not None:
            heapq.heappush(self.backoff, (self.now_ms + settings.retry_delay_ms(returns), message.seq, message))
            return True
        return False

    def _release_backoff(self) -> None:
        """Messages whose back-off is over become ready again (at the front, as returned ones)."""
        backoff = self.backoff
        now = self.now_ms
        while backoff and backoff[0][0] <= now:
            message = heapq.heappop(backoff)[2]
            heapq.heappush(self.returned, (message.seq, message))
            self.ready_bytes += len(message.body)

    def _pop_next(self) -> Message | None:
        """The next ready message (expired ones met on the way are dead-lettered or dropped)."""
        while self._head() is not None:
            message = self._pop_next_raw()
            if not self._timed or not self._expired(message):
                return message
        return None

    def _head(self) -> Message | None:
        """The next ready message, loaded into memory if it was spilled; None if there is none."""
        if self.returned:
            return self.returned[0][1]
        if not self.ready and self.spilled_count:
            self._refill()
        return self.ready[0] if self.ready else None

    def _pop_next_raw(self) -> Message:
        """Take the head, which the caller knows is in memory (returned, or the window)."""
        if self.returned:
            message = heapq.heappop(self.returned)[1]
        else:
            message = self.ready.popleft()
            self.window_bytes -= len(message.body)
        self.ready_bytes -= len(message.body)
        return message

    def _refill(self) -> None:
        """Load the next spilled messages into the (empty) window."""
        loaded = self.backing.load(self.spill_cursor, self.window_max, DELAYED_BASE)
        if not loaded:
            # The backing holds fewer than counted: transient messages of a durable queue do
            # not survive a restart. Nothing more is spilled.
            self.spilled_count = self.spilled_persistent = 0
            return
        for message in loaded:
            message.stored = True
            if message.seq < self._recovered_below:
                self.ready_bytes += len(message.body)  # unknown until now (see `recover`)
            if message.expires_at_ms is not None:
                self._timed = True
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
        if self._sac_order:
            # x-single-active-consumer: only the first attached consumer gets messages.
            consumer = consumers[self._sac_order[0]]
            return consumer if consumer.has_room() else None
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
        if not self._priorities or not self.ready_count:
            return []
        effects: list = []
        if self._fifo and len(self._priorities) == 1:
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
                timed = self._timed
                while n < room:
                    if returned:
                        message = heappop(returned)[1]
                    elif ready:
                        message = popleft()
                        self.window_bytes -= len(message.body)
                    elif self.spilled_count:
                        self._refill()
                        timed = self._timed
                        continue
                    else:
                        break
                    self.ready_bytes -= len(message.body)
                    if timed and self._expired(message):
                        continue
                    message.delivery_count += 1
                    if checked_out is not None:
                        checked_out[message.seq] = message
                    elif message.stored:
                        if stored is None:
                            stored = []
                        stored.append(message)
                    append(_new_tuple(Deliver, (consumer_id, message, message.redelivered)))  # Deliver(...) minus a call
                    n += 1
                consumer.credit -= n
                if n:
                    self._after_deliveries(effects, stored)
                return effects
        # Pick only while a message waits: a consumer picked for nothing would lose its turn.
        stored = None
        while True:
            head = self._head()
            if head is None:
                break
            if self._timed:
                # Drop an expired head before picking: a consumer picked for it would lose its turn.
                expires_at = head.expires_at_ms
                if expires_at is not None and expires_at < self.now_ms:
                    self._pop_next_raw()
                    self._die(head, "expired")
                    continue
            consumer = self._pick_consumer()
            if consumer is None:
                break
            message = self._pop_next_raw()
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
        top = effects[-1].message.seq if self._fifo else max(e.message.seq for e in effects)
        if top > self.delivered_upto:
            self._note_delivered(top)

    def _ready_in_memory(self):
        """The ready messages held in memory other than returned ones, in delivery order."""
        return self.ready

    def _spilled_total(self) -> int:
        return self.spilled_count

    def check_invariants(self) -> None:
        """For tests and simulation: every message is in exactly one place, the indexes agree."""
        seen = set()
        previous = -1
        for m in self._ready_in_memory():
            assert previous < m.seq and m.seq & SEQ_MASK < self.next_seq, "ready is in sequence order"
            # (redelivered may be set on a message loaded after a restart: delivered before it)
            # (a message returned before a restart comes back with its count, in a counting queue)
            assert (m.delivery_count == 0 or m.count_header) and (
                m.stored or self.backing is None or not self.durable or not m.persistent)
            previous = m.seq
            seen.add(m.seq)
        for seq, m in self.returned:
            assert seq == m.seq and seq not in seen and 0 <= seq and seq & SEQ_MASK < self.next_seq
            assert m.redelivered and m.delivery_count > 0
            seen.add(seq)
        self.delayed.check_invariants()
        for due, seq, m in self.backoff:
            assert seq == m.seq and seq not in seen and m.redelivered and m.delivery_count > 0
            seen.add(seq)
        for seq, m in self.dead_lettering.items():
            # (a policy may have removed the dead-letter exchange since: these are still on their way)
            assert seq == m.seq and seq not in seen and 0 <= seq and seq & SEQ_MASK < self.next_seq
            seen.add(seq)
        assert not self._dying and not self._unstore, "flushed at the end of every command"
        if not self._spilled_total():
            # (with spilled messages, the test that knows the backing checks the sum)
            assert self.ready_bytes == (sum(len(m.body) for m in self._ready_in_memory())
                                        + sum(len(m.body) for _, m in self.returned))
        active = 0
        for consumer_id, c in self.consumers.items():
            assert c.consumer_id == consumer_id
            # A consumer that is neither attached nor holding anything is forgotten. (A no-ack
            # consumer may hold messages too: those it had before its tag was cancelled and reused.)
            assert c.active or c.checked_out
            active += c.active
            for seq, m in c.checked_out.items():
                assert seq == m.seq and seq not in seen and 0 <= seq and seq & SEQ_MASK < self.next_seq
                assert m.delivery_count > 0
                seen.add(seq)
        assert active == self._active_count
        assert self.spilled_count >= 0 and (not self.spilled_count or self.backing is not None)
        assert self.window_bytes == sum(len(m.body) for m in self._ready_in_memory())
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
        if self.settings.single_active_consumer:
            assert sorted(self._sac_order) == sorted(cid for cid, c in self.consumers.items() if c.active)
        else:
            assert not self._sac_order
