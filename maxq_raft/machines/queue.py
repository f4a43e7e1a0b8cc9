"""One queue as a deterministic state machine applied from a log (after rabbit_fifo on Ra): the core.

Theory of operation: every change to a queue is a command in a log; `QueueMachine.apply(meta,
command)` returns `(reply, effects)` (queue_types.py) and is the only way state changes.
Replicas that apply the same commands in the same order end in the same state, so the same code
serves a single node (an in-process log) and a Raft group. Time comes only from `meta.time_ms`,
never a clock, and never goes backwards: the queue's `now_ms` is the latest entry time it has
seen, so an entry from a proposer whose clock is behind (a new leader, a skewed node) neither
extends a TTL nor revives an expired message. The machine iterates only dicts, lists and deques,
never sets, so every replica decides alike.

The machine decides which message goes to which consumer: a `Deliver` effect names the consumer
and the message; the node hosting that consumer's connection sends the frames. Consumers get
messages while they have both prefetch room (unacked < prefetch, manual-ack only) and flow credit
(a window of messages the shell has not yet written to the socket, refilled by `Credit`): the
second bound keeps a slow or no-ack consumer from making the shell buffer without limit.

Order: ready messages are FIFO by sequence; returned (requeued) messages go back in front, in
their original sequence order, as RabbitMQ's classic queues do, with `redelivered` set. Among
consumers, the highest `x-priority` with room is served first, round robin within a priority.

Memory does not grow with depth: the ready messages in memory are a window of at most
`window_max` messages or `window_bytes_max` bytes of body; once it is full, newer messages go to
the queue's `Backing` only ("spilled", counted in `spilled_count`, found again from
`spill_cursor` because spilled messages are never delivered before they are loaded, so every seq
from the cursor on that the store holds is ready). A durable queue also writes each persistent
message to the backing at enqueue and deletes it when it leaves the queue, so a restart finds
exactly the messages still queued. The backing's contents are a function of the applied
commands, so reading it back keeps replicas deterministic.

`apply` never raises: a command that cannot be performed gets a `Rejected` reply, because an
exception inside a replicated apply would stall the whole group; a malformed one (wrong types,
negative counts) is refused before it changes anything, so replicas stay identical. Commands are
the typed union `QueueCommand`, dispatched with `match`. Around the handler, `apply` releases
what fell due (retry back-offs, delayed messages, SQS receives whose visibility ran out) first
and, after it, expires heads, enforces
drop-head and flushes what left the queue (queue_limits.py: TTL, limits, dead lettering,
x-expires, delivery limits), refused commands included. x-delay is delayed.py; x-max-priority
is priority_queue.py; SQS receivers (messages in flight until a visibility deadline, sharing
the queue with AMQP consumers) are receives.py.

`dump_header()` / `dump_places()` give the whole state as plain data and `from_header()` /
`load_place()` / `finish_load()` take it back; snapshot.py frames them as records.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, assert_never

from . import queue_limits
from .commands import (
    QUEUE_COMMAND_TYPES,
    Cancel,
    ChangeVisibility,
    Checkout,
    Credit,
    DeadLettered,
    DeleteQueue,
    DeleteReceived,
    Discard,
    Down,
    Enqueue,
    EnqueueFifo,
    Get,
    PauseConsumers,
    Purge,
    QueueCommand,
    Receive,
    Requeue,
    ResolveTxn,
    Settle,
    Tick,
    Touch,
    UpdateSettings,
    bad_seqs,
    malformed,
)
from .consume_rate import RATE_MAX, QueueConsumeRate
from .consumer import Consumer
from .consumer_pauses import QueuePauses
from .dedup import QueueDedup
from .delayed import DELAYED_BASE, DelayedMessages
from .delayed import WINDOW_MAX as DELAYED_WINDOW_MAX
from .fifo import QueueFifo
from .message import Message, new_message_error
from .partitions import parent_of
from .queue_args import DEFAULT_SETTINGS, QueueSettings
from .queue_limits import QueueLimits
from .queue_types import Backing, Deliver, Effect, Meta, Overflowed, Rejected
from .receives import QueueReceives
from .transactions import QueueTxns

# Ready messages a queue keeps in memory before it spills to its backing: enough that a consumer
# briefly behind its publisher never touches the disk, small enough that a deep queue costs a
# bounded amount of memory (many deep queues together are the memory alarm's business).
# Seqs are below 2**48; a priority queue puts the priority lane above them (priority_queue.py).
SEQ_BITS = 48
SEQ_MASK = (1 << SEQ_BITS) - 1
WINDOW_MAX = 65536
WINDOW_BYTES_MAX = 32 << 20

_new_tuple = tuple.__new__

# An AMQP consumer or basic.get would hand out messages past the FIFO group rule (fifo.py).
_NO_AMQP_ON_FIFO = Rejected(405, "this is an SQS FIFO queue: receive from it over SQS (docs/sqs.md)")

# What `apply` returns: an int, bool, None, a `Get` result, `Overflowed`, `Rejected`, or a list
# (of `Received` for a `Receive`, of `HandleResult` for `DeleteReceived` and `ChangeVisibility`).
QueueReply = Any


class QueueMachine(QueueLimits, QueueReceives, QueueFifo, QueueDedup, QueuePauses, QueueConsumeRate, QueueTxns):
    def __init__(
        self,
        vhost: str,
        name: str,
        *,
        backing: Backing | None = None,
        durable: bool = False,
        window_max: int = WINDOW_MAX,
        window_bytes_max: int = WINDOW_BYTES_MAX,
        settings: QueueSettings = DEFAULT_SETTINGS,
        delayed_window_max: int | None = None,
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.settings = settings
        # The queue's time: the latest entry time applied (a later entry may carry an earlier one).
        self.now_ms = 0
        self.ready_bytes = 0  # body bytes of all ready messages (window, returned, spilled)
        self._recovered_below = 0  # seqs below this were recovered: their bytes count once loaded
        self._init_limits(settings)
        self._init_receives()  # SQS receives in flight (receives.py)
        self._init_fifo()  # SQS FIFO queues: deduplication, groups (fifo.py)
        self._init_pauses()  # consumer pause rules (consumer_pauses.py)
        self._init_consume_rate()  # x-consume-rate-limit buckets (consume_rate.py)
        self._init_dedup(settings)  # x-message-deduplication (dedup.py)
        self._init_txns()  # transactional half messages (transactions.py)
        self._fifo = True  # ready messages in seq order (False in PriorityQueueMachine)
        self.delayed = DelayedMessages(backing, delayed_window_max or DELAYED_WINDOW_MAX)  # x-delay
        # x-single-active-consumer: attached consumer ids in the order they came; the first is
        # served, in partition i of a partitioned queue the i-th (`_sac_consumer`)
        self._sac_order: list[str] = []
        partition = parent_of(name)
        self._sac_slot = 0 if partition is None else partition[1]
        self._sac_serving: str | None = None  # (a partition's: the consumer it serves now)
        # None when nothing stores this queue's messages. Where a stored or spilled message,
        # or durability, implies a backing, the calls say so with a type: ignore[union-attr]:
        # no check per message (storage leaves `apply` in the planned machines redesign).
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
        # Counts for the management API's message rates (message_rates.QueueRates), since this
        # machine was made here: added per batch where there is one, never read by the machine,
        # not in snapshots (a replica restored from one starts them again, as a restarted
        # RabbitMQ node does its stats).
        self.stats_published = 0  # messages put at the tail (publishes, dead letters in, delays due)
        self.stats_delivered = 0  # to consumers
        self.stats_got = 0  # basic.get
        self.stats_redelivered = 0  # of those two, ones delivered before
        self.stats_acked = 0  # basic.ack'ed (not rejects)

    # ------------------------------------------------------------- queries

    @property
    def ready_count(self) -> int:
        return len(self.ready) + len(self.returned) + self.spilled_count

    def recover(self, next_seq: int, spilled_count: int, spill_cursor: int) -> None:
        """Start from what a restarted node's backing holds: everything is spilled, nothing delivered.

        The bytes of the recovered messages are not known until they are loaded (start-up reads
        no message), so x-max-length-bytes counts them from then on."""
        self._recovered_below = next_seq
        spilled_count = max(0, spilled_count - self._recover_delayed())
        self.next_seq = next_seq
        self.spilled_count = spilled_count
        self.spilled_persistent = spilled_count
        self.spill_cursor = spill_cursor

    def _recover_delayed(self) -> int:
        """The backing's delayed messages and delivered watermark after a restart; how many
        of its messages are delayed ones (not ready)."""
        backing = self.backing
        if backing is None:
            return 0
        self.delayed.recover(backing.delayed_stored, backing.delayed_next)
        # The watermark goes on from the backing's: delivering an old message must not lower it.
        self.delivered_upto = max(self.delivered_upto, backing.delivered_upto)
        return backing.delayed_stored

    @property
    def unacked_count(self) -> int:
        """AMQP deliveries awaiting their ack, and messages in flight to SQS receivers."""
        return sum(len(c.checked_out) for c in self.consumers.values()) + len(self.in_flight)

    @property
    def active_consumer_count(self) -> int:
        return self._active_count

    # --------------------------------------------------------------- apply

    def apply(self, meta: Meta, command: QueueCommand) -> tuple[QueueReply, list[Effect]]:
        # Handlers validate a command completely before they change anything, so a refusal
        # leaves the state as it was. The `except` is the last line for bugs of ours (which
        # every replica meets alike) and for a backing that cannot read a damaged record (this
        # replica's disk): it keeps the log moving, but cannot undo a half-applied command.
        try:
            log_index = meta.log_index
            time_ms = meta.time_ms
            if type(log_index) is not int or type(time_ms) is not int:
                return Rejected(541, f"malformed log entry meta {meta!r}"), []
            self.last_index = log_index
            if self.deleted:
                return Rejected(404, f"no queue '{self.name}' in vhost '{self.vhost}'"), []
            if type(command) not in QUEUE_COMMAND_TYPES:
                # Exactly the union's classes, not a subclass or a look-alike tuple: the `match`
                # below would take a subclass for its base. Anything else is a bug in the shell.
                return Rejected(541, f"unknown queue command {type(command).__name__}"), []
            # Each proposer stamps its own clock: after a leader change or with skewed clocks a
            # later entry may carry an earlier time. The queue's time stays where it was then,
            # so a deadline already passed stays passed and no TTL is measured from the past.
            if time_ms > self.now_ms:
                self.now_ms = time_ms
            if self.backoff and self.backoff[0][0] <= self.now_ms:
                self._release_backoff()
            released = None
            if self.delayed.count:
                due = self.delayed.next_due_ms
                if due is not None and due <= self.now_ms:
                    released = self._release_delayed()
            visibility = self._visibility
            if visibility and visibility[0][0] <= self.now_ms:
                # (a stale top is dropped there: cheaper than asking `visibility_deadline_ms` here)
                visible = self._release_visibility()
                if visible:
                    released = visible if released is None else released + visible
            reply: QueueReply
            effects: list[Effect]
            # Hot commands first: a class pattern is one isinstance check.
            match command:
                case Enqueue():
                    reply, effects = self._enqueue(command)
                case Settle():
                    reply, effects = self._settle(command)
                case Credit():
                    reply, effects = self._credit(command)
                case Requeue():
                    reply, effects = self._requeue(command)
                case Discard():
                    reply, effects = self._discard(command)
                case Checkout():
                    reply, effects = self._checkout(command)
                case Cancel():
                    reply, effects = self._cancel(command)
                case Get():
                    reply, effects = self._get(command)
                case Tick():
                    if self.dedup:
                        self._prune_dedup()  # (a queue that no one sends to still forgets)
                    if self.dedup_window is not None or self.exchange_windows:
                        self._prune_dedup_window()
                    reply, effects = self._tick(command)
                    if self.txns:
                        effects = effects + self._tick_txns()
                case DeadLettered():
                    reply, effects = self._dead_lettered(command)
                case Down():
                    reply, effects = self._down(command)
                case Touch():
                    reply, effects = self._touch(command)
                case Purge():
                    reply, effects = self._purge_command(command)
                case UpdateSettings():
                    reply, effects = self._update_settings(command)
                case DeleteQueue():
                    reply, effects = self._delete(command)
                case Receive():
                    reply, effects = self._receive(command)
                case DeleteReceived():
                    reply, effects = self._delete_received(command)
                case ChangeVisibility():
                    reply, effects = self._change_visibility(command)
                case EnqueueFifo():
                    reply, effects = self._enqueue_fifo(command)
                case PauseConsumers():
                    reply, effects = self._pause_consumers(command)
                case ResolveTxn():
                    reply, effects = self._resolve_txn(command)
                case _:
                    # A type checker proves this unreachable for every QueueCommand; at run time
                    # a class in the union but not matched above raises, and the `except` refuses.
                    assert_never(command)
            if released:
                effects = released + effects
            if (self._timed or self._drops_head) and type(reply) is not Rejected:
                self._after_command()
            # Also after a refusal: the releases before the handler may have dead-lettered.
            if self._dying or self._unstore:
                effects = self._flush_dying(effects)
            return reply, effects
        except Exception as exc:  # never let one bad command stall the log
            return Rejected(541, f"internal error applying {type(command).__name__}: {exc!r}"), []

    # ------------------------------------------------------------ commands

    def _enqueue(self, cmd: Enqueue) -> tuple[int | Overflowed | Rejected, list[Effect]]:
        messages = cmd.messages
        # (the ignore: the field says list; a tuple is accepted too and works as one)
        if type(messages) is not list and type(messages) is not tuple:  # type: ignore[comparison-overlap]
            return malformed(cmd, "messages must be a list"), []
        delayed = False
        for message in messages:
            # (the common message, without TTL or delay, costs one line here)
            if (
                type(message) is not Message
                or message.seq != -1
                or message.ttl_ms is not None
                or message.delay_ms is not None
            ):
                why = new_message_error(message)
                if why is not None:
                    return malformed(cmd, why), []
                delayed = delayed or bool(message.delay_ms)
        if len(messages) > 1 and len({id(m) for m in messages}) != len(messages):
            return malformed(cmd, "the same Message twice in one batch"), []
        if cmd.txn is not None:
            return self._enqueue_txn(cmd, messages)  # (transactions.py)
        if cmd.dedup is not None:
            return self._enqueue_dedup(cmd, messages)  # (dedup.py)
        if not delayed:
            return self._accept(messages)
        return self._enqueue_checked(messages)

    def _enqueue_checked(self, messages: list[Message]) -> tuple[int | Overflowed, list[Effect]]:
        """Enqueue new messages already checked: delayed ones are held, the rest accepted."""
        if not any(message.delay_ms for message in messages):
            return self._accept(messages)
        # x-delay: held until due, then enqueued as if published then (delayed.py); sent now.
        for message in messages:
            if message.delay_ms:
                message.sent_ms = self.now_ms
        self.delayed.add_all([message for message in messages if message.delay_ms], self.now_ms)
        positions = [i for i, message in enumerate(messages) if not message.delay_ms]
        if not positions:
            return len(messages), []
        reply, effects = self._accept([messages[i] for i in positions])
        if type(reply) is Overflowed:
            # Positions in what `_accept` saw, mapped back to the Enqueue's list.
            return Overflowed(
                reply.accepted + len(messages) - len(positions), [positions[i] for i in reply.rejected]
            ), effects
        return len(messages), effects

    def _release_delayed(self) -> list[Effect]:
        """Enqueue the delayed messages that are due (at most DROP_BATCH_MAX per command)."""
        released, more = self.delayed.release(self.now_ms, queue_limits.DROP_BATCH_MAX)
        if more:
            self._more_due = True
        if not released:
            return []
        for message in released:
            message.delay_ms = None
            message.expires_at_ms = None
        reply, effects = self._accept(released)
        return effects

    def _accept(self, messages: list[Message]) -> tuple[int | Overflowed, list[Effect]]:
        """Enqueue new messages (published now, or delayed ones falling due now)."""
        self._stamp_deadlines(messages)
        settings = self.settings
        if settings.limited and settings.overflow != "drop-head":
            return self._enqueue_or_reject(messages)
        self._append(messages)
        return len(messages), self._service()

    def _append(self, messages: list[Message]) -> None:
        """Give the messages their seqs and put them at the tail (the window, or the backing)."""
        self.stats_published += len(messages)
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

    def _checkout(self, cmd: Checkout) -> tuple[bool | Rejected, list[Effect]]:
        consumer_id, prefetch, credit = cmd.consumer_id, cmd.prefetch, cmd.credit
        if (
            type(consumer_id) is not str
            or type(cmd.owner) is not str
            or type(prefetch) is not int
            or prefetch < 0
            or type(cmd.no_ack) is not bool
            or type(cmd.priority) is not int
            or type(cmd.exclusive) is not bool
            or type(credit) is not int
            or credit < 0
            or type(cmd.rate_limit) is not int
            or not 0 <= cmd.rate_limit <= RATE_MAX
        ):
            return malformed(cmd), []
        if self.settings.fifo:
            return _NO_AMQP_ON_FIFO, []
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
        if consumer.rate_limit != cmd.rate_limit:
            consumer.rate_limit, consumer.rate_tat_us = cmd.rate_limit, 0
        consumer.paused = self.covered_by_pause(consumer)
        self._active_count += 1
        if cmd.rate_limit:
            self._rate_on = True
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

    def _cancel(self, cmd: Cancel) -> tuple[int | Rejected, list[Effect]]:
        if type(cmd.consumer_id) is not str:
            return malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None or not consumer.active:
            return self._active_count, []
        self._deactivate(consumer)
        # RabbitMQ keeps a cancelled consumer's deliveries unacked: the channel may still ack them.
        if not consumer.checked_out:
            del self.consumers[cmd.consumer_id]
        return self._active_count, []

    def _settle(self, cmd: Settle | Discard) -> tuple[int | Rejected, list[Effect]]:
        if type(cmd.consumer_id) is not str or bad_seqs(cmd.seqs):
            return malformed(cmd), []
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
            self.backing.remove(stored)  # type: ignore[union-attr]  # messages stored or spilled: a backing
        if type(cmd) is Settle:
            self.stats_acked += settled
        self._forget_if_idle(consumer)
        return settled, self._service() if settled else []

    def _requeue(self, cmd: Requeue) -> tuple[int | Rejected, list[Effect]]:
        if type(cmd.consumer_id) is not str or bad_seqs(cmd.seqs):
            return malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        n = self._return(consumer, cmd.seqs)
        self._forget_if_idle(consumer)
        return n, self._service() if n else []

    def _credit(self, cmd: Credit) -> tuple[int | Rejected, list[Effect]]:
        if type(cmd.consumer_id) is not str or type(cmd.messages) is not int or cmd.messages < 0:
            return malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        consumer.credit += cmd.messages
        return consumer.credit, self._service()

    def _get(self, cmd: Get) -> tuple[tuple[Message, bool, int] | None | Rejected, list[Effect]]:
        """basic.get: (message, redelivered, messages left) or None when the queue is empty."""
        if type(cmd.consumer_id) is not str or type(cmd.owner) is not str or type(cmd.no_ack) is not bool:
            return malformed(cmd), []
        if self.settings.fifo:
            return _NO_AMQP_ON_FIFO, []
        self.last_used_ms = self.now_ms
        message = self._pop_next()
        if message is None:
            return None, []
        redelivered = message.redelivered
        message.delivery_count += 1
        self.stats_got += 1
        self.stats_redelivered += redelivered
        if message.seq > self.delivered_upto:
            self._note_delivered(message.seq)
        if cmd.no_ack:
            if message.stored:
                self.backing.remove([message])  # type: ignore[union-attr]  # messages stored or spilled: a backing
        else:
            consumer = self.consumers.get(cmd.consumer_id)
            if consumer is None:
                consumer = self.consumers[cmd.consumer_id] = Consumer(
                    cmd.consumer_id, cmd.owner, 0, False, 0, 0, active=False
                )
                consumer.paused = self.covered_by_pause(consumer)  # (never attached: only kept exact)
            consumer.checked_out[message.seq] = message
        return (message, redelivered, self.ready_count), []

    def _purge_command(self, cmd: Purge) -> tuple[int | Rejected, list[Effect]]:
        if type(cmd.in_flight) is not bool:
            return malformed(cmd), []
        n, effects = self._purge(cmd)
        if cmd.in_flight:
            n += self._purge_in_flight()
        return n, effects

    def _purge(self, cmd: Purge) -> tuple[int, list[Effect]]:
        # Purge removes ready messages only; unacked ones stay with their consumers (as RabbitMQ).
        n = self.ready_count
        stored = [m for m in self.ready if m.stored] + [m for _, m in self.returned if m.stored]
        if stored:
            self.backing.remove(stored)  # type: ignore[union-attr]  # messages stored or spilled: a backing
        if self.spilled_count:
            self.backing.remove_from(self.spill_cursor, self.spilled_persistent, DELAYED_BASE)  # type: ignore[union-attr]  # messages stored or spilled: a backing
            self.spilled_count = self.spilled_persistent = 0
        self.ready.clear()
        self.window_bytes = 0
        self.ready_bytes = 0
        self.returned.clear()
        return n, []

    def _down(self, cmd: Down) -> tuple[int | Rejected, list[Effect]]:
        """The owner (a channel, or all of a connection's or node's) is gone: drop its consumers,
        return their unacked messages."""
        if type(cmd.owner) is not str:
            return malformed(cmd), []
        returned = 0
        owner = cmd.owner
        prefix = owner.endswith(("@", "/"))
        for consumer in [
            c for c in self.consumers.values() if c.owner == owner or prefix and c.owner.startswith(owner)
        ]:
            self._deactivate(consumer)
            returned += self._return(consumer, list(consumer.checked_out))
            del self.consumers[consumer.consumer_id]
        return returned, self._service() if returned else []

    def _delete(self, cmd: DeleteQueue) -> tuple[int, list[Effect]]:
        n = self.ready_count
        self.deleted = True
        if self.backing is not None:
            self.backing.drop()
        self.dedup_window = None
        self.exchange_windows.clear()
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
        self._clear_in_flight()
        self.consumers.clear()
        self._sac_order.clear()
        self._rings.clear()
        self._priorities = []
        self._active_count = 0
        self.exclusive_consumer = None
        return n, []

    # ------------------------------------------------------- dump and load
    #
    # The machine's whole state as plain data (None, bools, ints, floats, str, bytes, lists,
    # dicts with str keys) and back: a header of counters and flags whose size does not grow
    # with depth, then the messages place by place. snapshot.py frames them as records; the
    # proof that nothing is lost is tests/machines/test_snapshot.py. Derived indexes (the
    # consumers' priority order, the active count, the delayed heap and keys, whether returns
    # are counted) are rebuilt, not dumped.

    KIND = "fifo"  # names the class in a dump (priority_queue.py: "priority")

    def dump_header(self) -> dict[str, Any]:
        """Every counter and flag, the consumers without their messages, the rings in their
        rotation (whose turn is next), the delayed messages' counters."""
        return {
            "kind": self.KIND,
            "vhost": self.vhost,
            "name": self.name,
            "settings": list(self.settings),
            "has_backing": self.backing is not None,
            "durable": self.durable,
            "window_max": self.window_max,
            "window_bytes_max": self.window_bytes_max,
            "now_ms": self.now_ms,
            "last_index": self.last_index,
            "next_seq": self.next_seq,
            "delivered_upto": self.delivered_upto,
            "ready_bytes": self.ready_bytes,
            "window_bytes": self.window_bytes,
            "recovered_below": self._recovered_below,
            "spilled_count": self.spilled_count,
            "spilled_persistent": self.spilled_persistent,
            "spill_cursor": self.spill_cursor,
            "dropped": dict(self.dropped),
            "dead_lettered": dict(self.dead_lettered),
            "rejected_publishes": self.rejected_publishes,
            "last_used_ms": self.last_used_ms,
            "expired": self.expired,
            "deleted": self.deleted,
            "ever_had_consumer": self.ever_had_consumer,
            "timed": self._timed,
            "more_due": self._more_due,
            "exclusive_consumer": self.exclusive_consumer,
            "sac_order": list(self._sac_order),
            "sac_serving": self._sac_serving,
            # Consumers in dict order (Down walks it), each ring in its rotation.
            "consumers": [
                [
                    c.consumer_id,
                    c.owner,
                    c.prefetch,
                    c.no_ack,
                    c.priority,
                    c.credit,
                    c.active,
                    c.rate_limit,
                    c.rate_tat_us,
                ]
                for c in self.consumers.values()
            ],
            "rate_tat_us": self.rate_tat_us,
            "rings": [[p, list(ring)] for p, ring in self._rings.items()],
            "delayed": self.delayed.dump(),
            "next_receive_id": self.next_receive_id,
            **self._dump_fifo(),
            **self._dump_pauses(),
            **self._dump_dedup(),
            **self._dump_txns(),
        }

    def dump_places(self, batch_max: int = 1024) -> Iterator[tuple[str, Any, Iterable[Any]]]:
        """Where the messages are, as `(place, key, items)` in the machine's own order (a heap's
        list order, a dict's insertion order). Items are `Message`s, but a `backoff` item is
        `(due ms, Message)` and an `in_flight` item an `InFlight`. In memory: `ready`, `returned`,
        `backoff`, `dead_lettering`, `checked_out` (key: consumer id), `delayed`, `in_flight`,
        `dying` (key: reason) and `unstore` (both
        empty between commands unless one failed with an internal error); only in the backing,
        read from it `batch_max` at a time: `spilled`, `delayed_spilled`. Consume everything
        before the next apply: the state and the backing must not move under the reader."""
        yield from self._dump_ready()
        yield "returned", None, (m for _, m in self.returned)
        yield "backoff", None, ((due, m) for due, _, m in self.backoff)
        yield "dead_lettering", None, self.dead_lettering.values()
        for consumer in self.consumers.values():
            yield "checked_out", consumer.consumer_id, consumer.checked_out.values()
        yield "delayed", None, self.delayed.window.values()
        yield "in_flight", None, self.in_flight.values()
        for reason, messages in self._dying.items():
            yield "dying", reason, messages
        yield "unstore", None, self._unstore
        if self.backing is not None:
            yield from self._dump_spilled(batch_max)
            delayed = self.delayed
            if delayed.spilled:
                yield "delayed_spilled", None, self._stored(delayed.cursor, None, delayed.spilled, batch_max)

    def _dump_ready(self) -> Iterator[tuple[str, Any, Iterable[Any]]]:
        yield "ready", None, self.ready

    def _dump_spilled(self, batch_max: int) -> Iterator[tuple[str, Any, Iterable[Any]]]:
        if self.spilled_count:
            yield "spilled", None, self._stored(self.spill_cursor, DELAYED_BASE, self.spilled_count, batch_max)

    def _stored(self, seq_from: int, seq_below: int | None, count: int, batch_max: int) -> Iterator[Message]:
        """Up to `count` messages the backing holds from `seq_from` (below `seq_below`), read
        `batch_max` at a time. `count` is the machine's own tally, so the loop is bounded."""
        assert self.backing is not None
        remaining = count
        while remaining > 0:
            batch = self.backing.load(seq_from, min(batch_max, remaining), seq_below)
            if not batch:
                return  # fewer than counted (a restarted durable queue's transient ones): as `_refill` finds
            assert batch[0].seq >= seq_from and (seq_below is None or batch[-1].seq < seq_below)
            for message in batch:
                message.stored = True
                yield message
            remaining -= len(batch)
            seq_from = batch[-1].seq + 1

    @classmethod
    def from_header(cls, header: dict[str, Any], backing: Backing | None) -> QueueMachine:
        """A machine with `dump_header`'s state and no messages yet (they follow through
        `load_place`, then `finish_load`). `backing` is a fresh, empty one, given exactly when
        the original had one. Raises KeyError, TypeError or ValueError for a malformed header."""
        settings = QueueSettings(*header["settings"])
        if header["kind"] != cls.KIND or (cls.KIND == "priority") != (settings.max_priority is not None):
            raise ValueError(f"kind {header['kind']!r} does not match the settings")
        delayed = header["delayed"]
        machine = cls(
            header["vhost"],
            header["name"],
            backing=backing,
            durable=header["durable"],
            window_max=header["window_max"],
            window_bytes_max=header["window_bytes_max"],
            settings=settings,
            delayed_window_max=delayed["window_max"],
        )
        machine.window_max = header["window_max"]
        machine.window_bytes_max = header["window_bytes_max"]
        machine.now_ms = header["now_ms"]
        machine.last_index = header["last_index"]
        machine.next_seq = header["next_seq"]
        machine.delivered_upto = header["delivered_upto"]
        machine.ready_bytes = header["ready_bytes"]
        machine.window_bytes = header["window_bytes"]
        machine.spilled_count = header["spilled_count"]
        machine.spilled_persistent = header["spilled_persistent"]
        machine.spill_cursor = header["spill_cursor"]
        machine.rejected_publishes = header["rejected_publishes"]
        machine.last_used_ms = header["last_used_ms"]
        machine.expired = header["expired"]
        machine.deleted = header["deleted"]
        machine.ever_had_consumer = header["ever_had_consumer"]
        machine.exclusive_consumer = header["exclusive_consumer"]
        machine._recovered_below = header["recovered_below"]
        machine._timed = header["timed"]
        machine._more_due = header["more_due"]
        machine._sac_order = list(header["sac_order"])
        machine._sac_serving = header.get("sac_serving")  # (absent before partitioned queues)
        machine.dropped = dict(header["dropped"])
        machine.dead_lettered = dict(header["dead_lettered"])
        active = 0
        for consumer_id, owner, prefetch, no_ack, priority, credit, is_active, *rate in header["consumers"]:
            consumer = Consumer(consumer_id, owner, prefetch, no_ack, priority, credit, is_active)
            if rate:  # (a dump made before rate limits has none)
                consumer.rate_limit, consumer.rate_tat_us = rate
            machine.consumers[consumer_id] = consumer
            active += is_active
        machine._active_count = active
        for priority, ids in header["rings"]:
            machine._rings[priority] = deque(ids)
        machine._priorities = sorted(machine._rings, reverse=True)
        machine.delayed.load(delayed)
        machine.next_receive_id = header.get("next_receive_id", 0)  # (absent from a version 1 dump)
        machine._load_fifo(header)
        machine._load_pauses(header)
        machine.rate_tat_us = header.get("rate_tat_us", 0)
        machine._update_rate_on()
        machine._load_dedup(header)
        machine._load_txns(header)  # (absent before format version 5, or with none open)
        return machine

    def load_place(self, place: str, key: Any, items: list[Any]) -> None:
        """Put back one batch of `dump_places`' items where they were; stored ones go to the
        backing too. Raises KeyError, TypeError or ValueError for what cannot be placed."""
        if type(items) is not list:
            raise TypeError("a place's items must be a list")
        if place == "in_flight":
            messages = self._load_in_flight(items)
        elif place == "backoff":
            messages = [message for _, message in items]
            # (the dumped list is a heap already)
            self.backoff.extend((due_ms, message.seq, message) for due_ms, message in items)
        else:
            messages = items
            if place == "ready":
                self.ready.extend(messages)
            elif place == "returned":
                self.returned.extend((m.seq, m) for m in messages)  # the dumped list is a heap already
            elif place == "dead_lettering":
                self.dead_lettering.update((m.seq, m) for m in messages)
            elif place == "checked_out":
                self.consumers[key].checked_out.update((m.seq, m) for m in messages)
            elif place == "delayed":
                self.delayed.window.update((m.seq, m) for m in messages)
            elif place == "dying":
                # The same objects as in `dead_lettering` (loaded before); refused publishes (seq -1) are not.
                shared = self.dead_lettering
                messages = [shared.get(m.seq, m) if m.seq != -1 else m for m in messages]
                self._dying.setdefault(key, []).extend(messages)
                messages = [m for m in messages if m.seq == -1 or m.seq not in shared]  # (written with them)
            elif place == "unstore":
                self._unstore.extend(messages)
            elif not self._load_other_place(place, key, messages):
                raise ValueError(f"unknown place {place!r}")
        stored = [m for m in messages if m.stored]
        if stored:
            if self.backing is None:
                raise ValueError("stored messages for a machine without a backing")
            self.backing.write(stored)

    def _load_other_place(self, place: str, key: Any, messages: list[Message]) -> bool:
        """A place of a subclass, or one only the backing holds (written there, nowhere else)."""
        return place in ("spilled", "delayed_spilled")

    def finish_load(self) -> None:
        """After the last `load_place`: rebuild what follows from the messages."""
        self.delayed.rebuild_index()
        self._finish_receives()
        self._rebuild_groups()
        if self.durable and self.delivered_upto >= 0:
            self.backing.delivered(self.delivered_upto)  # type: ignore[union-attr]  # a durable queue has a backing

    # ------------------------------------------------------------- helpers

    def _deactivate(self, consumer: Consumer) -> None:
        if not consumer.active:
            return
        consumer.active = False
        self._active_count -= 1
        self.last_used_ms = self.now_ms
        if consumer.rate_limit:
            self._update_rate_on()
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

    def _return(self, consumer: Consumer, seqs: list[int]) -> int:
        checked_out = consumer.checked_out
        messages = []
        for seq in seqs:
            message = checked_out.pop(seq, None)
            if message is not None:
                messages.append(message)
        return self._give_back(messages)

    def _give_back(self, messages: list[Message]) -> int:
        """Messages that were delivered (or received) come back: to `returned`, flagged
        redelivered; or, counted for x-delivery-limit or a retry back-off, elsewhere."""
        counts_returns = self._counts_returns
        recount = None
        for message in messages:
            message.redelivered = True
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
            self.backing.rewrite(recount)  # type: ignore[union-attr]  # messages stored or spilled: a backing
        return len(messages)

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
        loaded = self.backing.load(self.spill_cursor, self.window_max, DELAYED_BASE)  # type: ignore[union-attr]  # messages stored or spilled: a backing
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
            self.backing.delivered(seq)  # type: ignore[union-attr]  # a durable queue has a backing

    def _pick_consumer(self) -> Consumer | None:
        """The next consumer with room: highest priority first, round robin within one.

        Call it only when there is a message to give: the consumer it returns has had its turn.
        """
        consumers = self.consumers
        if self._sac_order:
            # x-single-active-consumer: only one attached consumer gets messages.
            sac = self._sac_consumer()
            if sac is None or not sac.has_room() or sac.rate_limit and not self._under_rate(sac):
                return None
            return sac
        for priority in self._priorities:
            ring = self._rings[priority]
            for _ in range(len(ring)):
                consumer = consumers[ring[0]]
                ring.rotate(-1)
                if consumer.has_room() and (not consumer.rate_limit or self._under_rate(consumer)):
                    return consumer
        return None

    def _sac_consumer(self) -> Consumer | None:
        """The single active consumer: the first attached; in partition i (>= 1) of a partitioned
        queue (partitions.py), the i-th modulo their number, so that the consumers of the name
        share the partitions, each partition served by one of them at a time. A partition moves
        to another consumer only once the one it served holds none of its messages unsettled
        (None meanwhile: nothing is delivered), so a key's messages are never processed by two
        consumers at once and stay in order; one that is cancelled or goes hands over at once,
        as in a queue that is not partitioned."""
        order = self._sac_order
        if not self._sac_slot:
            return self.consumers[order[0]]
        preferred = order[self._sac_slot % len(order)]
        serving = self._sac_serving
        if serving != preferred:
            current = self.consumers.get(serving) if serving is not None else None
            if current is not None and current.active and current.checked_out:
                return None
            self._sac_serving = serving = preferred
        return self.consumers[serving]

    def _under_rate(self, consumer: Consumer) -> bool:
        """A consumer with an x-consume-rate-limit: does its bucket allow a delivery now? (The
        callers test `rate_limit` first: no call per pick for the common unlimited consumer.)"""
        return self._consumer_allowance(consumer) > 0

    def _service(self) -> list[Effect]:
        """Hand ready messages to consumers with room, as far as both allow."""
        returned = self.returned
        ready = self.ready
        if not self._priorities or not self.ready_count:
            return []
        effects: list[Effect] = []
        if self._fifo and len(self._priorities) == 1:
            ring = self._rings[self._priorities[0]]
            if len(ring) == 1:
                # One consumer, the common case: its room is known up front, so each message
                # costs a pop and an append, with no ring walk and no `has_room`.
                consumer = self.consumers[ring[0]]
                if consumer.paused:
                    return effects
                room = consumer.credit
                checked_out = None if consumer.no_ack else consumer.checked_out
                if checked_out is not None and consumer.prefetch:
                    room = min(room, consumer.prefetch - len(checked_out))
                rate_on = self._rate_on
                if rate_on:
                    room = min(room, self._queue_allowance(), self._consumer_allowance(consumer))
                if room <= 0:
                    return effects
                consumer_id = consumer.consumer_id
                append = effects.append
                heappop = heapq.heappop
                popleft = ready.popleft
                n = 0
                stored: list[Message] | None = None
                timed = self._timed
                while n < room:
                    if returned:
                        message = heappop(returned)[1]
                        self.stats_redelivered += 1  # (a returned message is flagged redelivered)
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
                    append(
                        _new_tuple(Deliver, (consumer_id, message, message.redelivered))
                    )  # Deliver(...) minus a call
                    n += 1
                consumer.credit -= n
                if rate_on and n:
                    self._rate_take(consumer, n)
                if n:
                    if self._sac_slot:
                        self._sac_serving = consumer_id  # (the only one attached: `_sac_consumer`)
                    self.stats_delivered += n
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
            if self._rate_on and not self._queue_allowance():
                break
            picked = self._pick_consumer()
            if picked is None:
                break
            if self._rate_on:
                self._rate_take(picked, 1)
            message = self._pop_next_raw()
            message.delivery_count += 1
            self.stats_redelivered += message.redelivered
            picked.credit -= 1
            if not picked.no_ack:
                picked.checked_out[message.seq] = message
            elif message.stored:
                if stored is None:
                    stored = []
                stored.append(message)
            effects.append(Deliver(picked.consumer_id, message, message.redelivered))
        if effects:
            self.stats_delivered += len(effects)
            self._after_deliveries(effects, stored)
        return effects

    def _after_deliveries(self, effects: list[Effect], stored_no_ack: list[Message] | None) -> None:
        """`effects` are the Deliver effects just made (the ignores below: only Delivers)."""
        if stored_no_ack:
            self.backing.remove(stored_no_ack)  # type: ignore[union-attr]  # messages stored or spilled: a backing
        # Returned messages go first and were delivered before, so the last effect has the top seq.
        top = effects[-1].message.seq if self._fifo else max(e.message.seq for e in effects)  # type: ignore[union-attr]
        if top > self.delivered_upto:
            self._note_delivered(top)

    def _ready_in_memory(self) -> Iterable[Message]:
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
                m.stored or self.backing is None or not self.durable or not m.persistent
            )
            previous = m.seq
            seen.add(m.seq)
        for seq, m in self.returned:
            assert seq == m.seq and seq not in seen and 0 <= seq and seq & SEQ_MASK < self.next_seq
            assert m.redelivered and m.delivery_count > 0
            seen.add(seq)
        self.delayed.check_invariants()
        for _due, seq, m in self.backoff:
            assert seq == m.seq and seq not in seen and m.redelivered and m.delivery_count > 0
            seen.add(seq)
        for seq, m in self.dead_lettering.items():
            # (a policy may have removed the dead-letter exchange since: these are still on their way)
            assert seq == m.seq and seq not in seen and 0 <= seq and seq & SEQ_MASK < self.next_seq
            seen.add(seq)
        for seq, flight in self.in_flight.items():
            m = flight.message
            assert seq == m.seq and seq not in seen and 0 <= seq and seq & SEQ_MASK < self.next_seq
            seen.add(seq)
        self._check_receives()
        self._check_fifo()
        self._check_dedup()
        self._check_txns()
        assert not self._dying and not self._unstore, "flushed at the end of every command"
        if not self._spilled_total():
            # (with spilled messages, the test that knows the backing checks the sum)
            assert self.ready_bytes == (
                sum(len(m.body) for m in self._ready_in_memory()) + sum(len(m.body) for _, m in self.returned)
            )
        active = 0
        for consumer_id, c in self.consumers.items():
            assert c.consumer_id == consumer_id
            # A consumer that is neither attached nor holding anything is forgotten. (A no-ack
            # consumer may hold messages too: those it had before its tag was cancelled and reused.)
            assert c.active or c.checked_out
            active += c.active
            assert c.paused == self.covered_by_pause(c)  # the flag the delivery loops test
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
