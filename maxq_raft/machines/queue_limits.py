"""How messages leave a queue other than by consumption: TTL, length limits, delivery limits
and retry back-off, dead lettering, and x-expires (the queue's arguments, parsed into
`QueueSettings` by queue_args.py).

Theory of operation: `QueueLimits` is the part of `QueueMachine` (queue.py) that owns these
rules and their state; the core calls it at fixed points of a command, and it takes messages
from the core's ready state through the core's own primitives (`_head`, `_pop_next_raw`,
`_refill`), so it never needs to know how the ready messages are laid out (a priority queue
overrides `_expire_heads` for its lanes).

- TTL (x-message-ttl, a message's `expiration`): a message's deadline is fixed at enqueue from
  the queue's time. As in RabbitMQ, a message can be delivered up to its deadline, so TTL 0
  reaches a consumer that is waiting; an expired message met while serving is never delivered;
  and after every command the expired messages at the head (of the returned heap and of the
  ready window, loading spilled ones) are removed, at most `DROP_BATCH_MAX` per command, more
  at the next `Tick`. An expired message behind an unexpired head waits until it is the head.
- x-expires: unused (no consumer, no basic.get, no redeclare `Touch`) for that long, the queue
  says `QueueExpired`; the shell deletes it. Its messages are not dead-lettered (RabbitMQ).
- Length limits (x-max-length, x-max-length-bytes, ready messages only): `drop-head` removes
  from the head after delivering what it can; `reject-publish(-dlx)` refuses a message that
  would go over (the reply `Overflowed` names them by position, for the publisher's basic.nack).
- x-delivery-limit and retry back-off: a returned message is counted; over the limit it leaves
  for `delivery_limit`; with a back-off it waits in `backoff` (not ready) until its due time.
- Dead lettering: with x-dead-letter-exchange, a message rejected without requeue, expired or
  dropped for a limit leaves the queue into `dead_lettering` (still in the backing) and a
  `DeadLetter` effect asks the shell to republish it; only `DeadLettered` removes it, so a
  crash in between dead-letters it again rather than losing it (at-least-once).

Messages leaving in a command collect in `_dying` (reason -> messages) and `_unstore` (stored
copies to delete); `apply` flushes both once at the end of every command, refused ones included,
into one `DeadLetter` per reason and one backing `remove`: so they are empty between commands.
`next_deadline_ms` says when the queue next needs a `Tick`; the shell ticks only those queues.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from .commands import DeadLettered, Discard, Settle, Tick, Touch, UpdateSettings, bad_seqs, malformed
from .consume_rate import RATE_MAX
from .message import Message
from .queue_args import QueueSettings
from .queue_types import DeadLetter, Effect, Overflowed, QueueExpired, Rejected

if TYPE_CHECKING:
    from collections import deque

    from .consumer import Consumer
    from .delayed import DelayedMessages
    from .queue_types import Backing

# Messages one command may expire or drop for length, or release from delay; the rest go at the
# next Tick (bounded work per log entry, so a deep queue whose whole backlog expired does not
# stall its group). Read at call time (tests lower it to see "more is due").
DROP_BATCH_MAX = 4096
# x-trace: a bound on what one command may leave in `trace_dropped` for the shell (it takes them
# after every apply; the bound only matters if the shell's index of traced queues were wrong).
TRACE_DROPPED_MAX = 100_000
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")


class QueueLimits:
    """The TTL, limits, back-off, dead-lettering and x-expires half of `QueueMachine`."""

    if TYPE_CHECKING:
        # What this half uses of the core (queue.py), which defines them.
        vhost: str
        name: str
        settings: QueueSettings
        now_ms: int
        backing: Backing | None
        ready: deque[Message]
        returned: list[tuple[int, Message]]
        ready_bytes: int
        window_bytes: int
        spilled_count: int
        deleted: bool
        delayed: DelayedMessages
        _active_count: int
        _rate_on: bool  # consume_rate.py's

        @property
        def ready_count(self) -> int: ...
        def _update_rate_on(self) -> None: ...
        def rate_deadline_ms(self) -> int | None: ...
        def _append(self, messages: list[Message]) -> None: ...
        def _service(self) -> list[Effect]: ...
        def _refill(self) -> None: ...
        def _head(self) -> Message | None: ...
        def _pop_next_raw(self) -> Message: ...
        @property
        def visibility_deadline_ms(self) -> int | None: ...
        @property
        def txn_deadline_ms(self) -> int | None: ...

        consumers: dict[str, Consumer]

        def _settle(self, cmd: Settle | Discard) -> tuple[int | Rejected, list[Effect]]: ...
        def _forget_if_idle(self, consumer: Consumer) -> None: ...
        def _dedup_settings(self, settings: QueueSettings) -> None: ...

    def _init_limits(self, settings: QueueSettings) -> None:
        # seq -> Message: left the queue for a dead-letter exchange, kept (and stored) until the
        # shell says the targets have it (DeadLettered)
        self.dead_lettering: dict[int, Message] = {}
        self._dying: dict[str, list[Message]] = {}  # reason -> messages leaving in this command
        self._unstore: list[Message] = []  # stored messages dropped in this command
        self.dropped = {reason: 0 for reason in REASONS}  # left with no dead-letter exchange
        # x-trace (server/tracer.py): the messages dropped (no dead-letter exchange) by the command
        # being applied, with their reason; the shell takes them after each apply. Not state.
        self.trace_dropped: list[tuple[Message, str]] = []
        self.dead_lettered = {reason: 0 for reason in REASONS}
        self.rejected_publishes = 0
        self.last_used_ms: int | None = None  # x-expires: the last consume/get/declare
        self.expired = False
        # True once any message has a deadline: only then do heads need looking at
        self._timed = settings.message_ttl_ms is not None
        self._more_due = False  # a command hit DROP_BATCH_MAX: tick again at once
        self._drops_head = settings.limited and settings.overflow == "drop-head"  # (asked after every command)
        # Returned messages waiting out their retry back-off: a heap of (due ms, seq, message).
        # Not ready (not counted, not delivered) until due, when they join `returned`.
        self.backoff: list[tuple[int, int, Message]] = []
        self._counts_returns = settings.delivery_limit is not None or settings.retry_backoff_ms is not None

    # ------------------------------------------------------------- queries

    @property
    def next_deadline_ms(self) -> int | None:
        """When this queue next needs a `Tick` (a queue time), or None: nothing is due without traffic."""
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
        visible = self.visibility_deadline_ms  # SQS receives in flight (receives.py)
        if visible is not None and (deadline is None or visible < deadline):
            deadline = visible
        checks = self.txn_deadline_ms  # transaction check-backs (transactions.py)
        if checks is not None and (deadline is None or checks < deadline):
            deadline = checks
        if self._rate_on and self._active_count and self.ready_count:  # x-consume-rate-limit (consume_rate.py)
            refill = self.rate_deadline_ms()
            if refill is not None and (deadline is None or refill < deadline):
                deadline = refill
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

    # ------------------------------------------------- at points of a command

    def _stamp_deadlines(self, messages: list[Message]) -> None:
        """At enqueue: the shorter of the queue's and the message's TTL (RabbitMQ), from the
        queue's time; and the time it was sent (a delayed one has it from its Enqueue already,
        unless it was read back from the backing)."""
        queue_ttl = self.settings.message_ttl_ms
        now = self.now_ms
        for message in messages:
            if message.sent_ms is None:
                message.sent_ms = now
            ttl = message.ttl_ms
            if queue_ttl is not None and (ttl is None or queue_ttl < ttl):
                ttl = queue_ttl
            if ttl is not None:
                message.expires_at_ms = now + ttl
                self._timed = True

    def _enqueue_or_reject(self, messages: list[Message]) -> tuple[int | Overflowed, list[Effect]]:
        """reject-publish(-dlx): as rabbit_amqqueue_process, a message that would take the ready
        count or bytes over the limit is refused; each accepted one is offered to the consumers
        before the next is judged, as RabbitMQ delivers each publish before the next."""
        settings = self.settings
        max_length, max_bytes = settings.max_length, settings.max_length_bytes
        effects: list[Effect] = []
        rejected: list[int] = []
        for position, message in enumerate(messages):
            if (max_length is not None and self.ready_count + 1 > max_length) or (
                max_bytes is not None and self.ready_bytes + len(message.body) > max_bytes
            ):
                rejected.append(position)
                self.rejected_publishes += 1
                if settings.overflow == "reject-publish-dlx" and settings.dead_letter_exchange is not None:
                    self._dying.setdefault("maxlen", []).append(message)
                    self.dead_lettered["maxlen"] += 1
                continue
            self._append([message])
            effects.extend(self._service())
        accepted = len(messages) - len(rejected)
        return (Overflowed(accepted, rejected) if rejected else accepted), effects

    def _after_command(self) -> None:
        """After a command that was not refused (and only if `_timed` or `_drops_head`): expire
        the heads, then drop-head."""
        if self._timed:
            self._expire_heads()
        if self._drops_head and self._drop_over_limit() and self._timed:
            self._expire_heads()  # the new head may be due too (RabbitMQ: drop_expired, drop_head)

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

    def _pop_next(self) -> Message | None:
        """The next ready message (expired ones met on the way are dead-lettered or dropped)."""
        while self._head() is not None:
            message = self._pop_next_raw()
            if not self._timed or not self._expired(message):
                return message
        return None

    def _expired(self, message: Message) -> bool:
        """Met while serving: past its deadline (a message may go out up to its deadline)."""
        expires_at = message.expires_at_ms
        if expires_at is not None and expires_at < self.now_ms:
            self._die(message, "expired")
            return True
        return False

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

    # --------------------------------------------------- returns and back-off

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

    # ------------------------------------------------------ dead lettering

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
            if self.settings.trace and len(self.trace_dropped) < TRACE_DROPPED_MAX:
                self.trace_dropped.append((message, reason))
            if message.stored:
                self._unstore.append(message)

    def _flush_dying(self, effects: list[Effect]) -> list[Effect]:
        """The end of every command: one backing remove, one DeadLetter per reason."""
        if self._unstore:
            assert self.backing is not None  # (only stored messages are unstored)
            self.backing.remove(self._unstore)
            self._unstore = []
        if self._dying:
            settings = self.settings
            for reason, messages in self._dying.items():
                effects.append(
                    DeadLetter(
                        self.vhost,
                        self.name,
                        reason,
                        messages,
                        self.now_ms,
                        settings.dead_letter_exchange,
                        settings.dead_letter_routing_key,
                    )
                )
            self._dying = {}
        return effects

    # ------------------------------------------------------------ commands

    def _discard(self, cmd: Discard) -> tuple[int | Rejected, list[Effect]]:
        """Reject without requeue: the message leaves the queue, to the dead-letter exchange if any."""
        if self.settings.dead_letter_exchange is None:
            settled, effects = self._settle(cmd)
            if type(settled) is int:
                self.dropped["rejected"] += settled
            return settled, effects
        if type(cmd.consumer_id) is not str or bad_seqs(cmd.seqs):
            return malformed(cmd), []
        consumer = self.consumers.get(cmd.consumer_id)
        if consumer is None:
            return 0, []
        n = 0
        checked_out = consumer.checked_out
        for seq in cmd.seqs:
            message = checked_out.pop(seq, None)
            if message is not None:
                self._die(message, "rejected")
                n += 1
        self._forget_if_idle(consumer)
        return n, self._service() if n else []

    def _dead_lettered(self, cmd: DeadLettered) -> tuple[int | Rejected, list[Effect]]:
        if bad_seqs(cmd.seqs):
            return malformed(cmd), []
        n = 0
        for seq in cmd.seqs:  # unknown seqs (already done, -1 for refused publishes) are ignored
            message = self.dead_lettering.pop(seq, None)
            if message is not None:
                n += 1
                if message.stored:
                    self._unstore.append(message)
        return n, []

    def _tick(self, cmd: Tick) -> tuple[bool, list[Effect]]:
        # Expiry of messages happens after every command (in `apply`); a Tick adds x-expires.
        self._more_due = False
        effects = self._service()  # messages whose back-off ended (released in `apply`)
        if self.last_used_ms is None:
            self.last_used_ms = self.now_ms  # a recovered queue: its unused time starts now
        expires_ms = self.settings.expires_ms
        if (
            expires_ms is not None
            and not self._active_count
            and not self.expired
            and self.last_used_ms + expires_ms <= self.now_ms
        ):
            self.expired = True
            return True, [*effects, QueueExpired(self.vhost, self.name)]
        return False, effects

    def _touch(self, cmd: Touch) -> tuple[bool, list[Effect]]:
        self.last_used_ms = self.now_ms
        return True, []

    def _update_settings(self, cmd: UpdateSettings) -> tuple[bool | Rejected, list[Effect]]:
        settings = cmd.settings
        rate = settings.consume_rate_limit if type(settings) is QueueSettings else None
        if (
            type(settings) is not QueueSettings
            or rate is not None
            and (type(rate) is not int or not 1 <= rate <= RATE_MAX)
        ):
            return malformed(cmd), []
        if (
            settings.max_priority != self.settings.max_priority
            or settings.single_active_consumer != self.settings.single_active_consumer
            or settings.fifo != self.settings.fifo
        ):
            return Rejected(406, "x-max-priority, x-single-active-consumer and x-sqs-fifo cannot change"), []
        self._dedup_settings(settings)  # x-message-deduplication may start, change or end (dedup.py)
        self.settings = settings
        if settings.message_ttl_ms is not None:
            self._timed = True
        self._drops_head = settings.limited and settings.overflow == "drop-head"
        self._counts_returns = settings.delivery_limit is not None or settings.retry_backoff_ms is not None
        self._update_rate_on()
        return True, self._service()
