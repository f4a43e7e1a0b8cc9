"""Transactional (half) messages on a queue (issue #21, parts 1 and 2): the queue's side.

Theory of operation: a publish with an `x-transaction-id` header is a half message. The shell
puts it in the queue's Enqueue like any publish, with `(position, transaction id, timeout ms,
checks max)` beside it (`Enqueue.txn`); the queue keeps it in `txns[id]` (a `HalfTxn`), apart
from the ready messages: no consumer, basic.get, length limit or TTL sees it. The queue never
decides a transaction: the decision is recorded once, in the metadata group
(metadata.py, `DecideTxn`: the first decision wins), and the shell then applies it to every
queue that holds halves of that transaction with `ResolveTxn`, idempotently (a queue without
that transaction answers 0 and changes nothing), retrying from the ticker until no queue holds
halves of a decided transaction. So a crash between two queues leaves the decision standing and
the second queue resolved later, never the opposite decision.

- commit: the halves are enqueued at the tail, in publish order, as if published now (a durable
  queue writes the persistent ones then; TTL, length limits and dead lettering apply from then);
  one command per queue, so a queue's consumers see all of its halves at once;
- rollback: the halves are dropped;
- expire (the check-back limit passed with no answer, decided by the shell in the metadata
  group as a rollback): the halves are dead-lettered with reason "expired" when the queue has a
  dead-letter exchange, else dropped.

Check-back: each transaction has a deadline, `timeout_ms` after its first half arrived (queue
time, from the log). At a Tick past it, while `attempts < checks_max`, the queue counts one more
attempt, moves the deadline `timeout_ms` on, and returns a `TxnCheck` effect (the shard's
leader publishes a check message to the first half's reply_to queue). Once the attempts are
spent it returns `TxnTimedOut` instead, once per `timeout_ms` until it is resolved (the shard's
leader records the rollback in the metadata group, then resolves). Attempt counts and
deadlines are replicated state, so a new leader goes on from the same attempt.

Deduplication: on a queue with an `x-message-deduplication` window (dedup.py) a half's id is
checked and recorded when the half arrives, as any publish's: a copy of a half whose id is in the
window (a publisher's retry after a lost confirm) is accepted and not held.

Bounded: at most TXN_MESSAGES_MAX half messages and TXN_BYTES_MAX bytes of body per queue; a
half publish beyond that is refused like a reject-publish overflow (the publisher gets a nack).
Halves live in memory and in the snapshot header (format version 5). A durable queue on a single
node also writes its persistent halves to its backing (`txn_write`, under the queue's own half
numbers) and removes them once resolved (a commit writes them as messages first), so a restart
finds its open transactions again (`recover_txns`): their check-backs start over, the first at
once. Transient halves, like transient messages, do not survive a restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .commands import Enqueue, ResolveTxn, malformed
from .dedup import NO_EXPIRY_MS, dedup_items
from .message import Message, new_message_error
from .queue_args import EXPIRY_MS_MAX
from .queue_types import Overflowed, Rejected, TxnCheck, TxnTimedOut

if TYPE_CHECKING:
    from .dedup import DedupWindow
    from .queue_args import QueueSettings
    from .queue_types import Backing, Effect

TXN_EXCHANGE = "amq.maxq.transaction"  # the reserved exchange decisions are published to
TXN_ID_HEADER = "x-transaction-id"
TXN_TIMEOUT_HEADER = "x-transaction-timeout"  # ms before the first check-back
TXN_CHECKS_HEADER = "x-transaction-checks"  # check-backs before the transaction is rolled back
TXN_ACTION_HEADER = "x-transaction-action"  # commit | rollback (on a publish to TXN_EXCHANGE)
TXN_ATTEMPT_HEADER = "x-transaction-check-attempt"  # on a check message: 1, 2, ...
TXN_QUEUE_HEADER = "x-transaction-queue"  # on a check message: the queue that asked
TXN_CHECK_TYPE = "maxq.transaction.check"  # a check message's `type` property
TXN_TIMEOUT_MS_DEFAULT = 60_000  # as RocketMQ's transaction check interval
TXN_CHECKS_DEFAULT = 5
TXN_CHECKS_MAX = 100
TXN_ID_LENGTH_MAX = 255  # a shortstr: it is also the routing key of the decision publish
TXN_MESSAGES_MAX = 100_000  # half messages per queue
TXN_BYTES_MAX = 64 << 20  # their bodies per queue
ACTIONS = ("commit", "rollback", "expire")

__all__ = ["QueueTxns", "HalfTxn", "TxnCheck", "TxnTimedOut", "txn_error"]


def _half_record(message: Message) -> list[Any]:
    """A half as a list: only what a publish sets (a half is never delivered, stored in a
    queue's ready range or timed before its commit), as a log entry carries a message."""
    return [
        message.exchange,
        message.routing_key,
        bytes(message.props_raw),
        bytes(message.body),
        message.persistent,
        message.ttl_ms,
        message.priority,
        message.delay_ms,
    ]


def _half_from_record(record: list[Any]) -> Message:
    exchange, routing_key, props_raw, body, persistent, ttl_ms, priority, delay_ms = record
    message = Message(exchange, routing_key, props_raw, body, persistent, ttl_ms, priority, delay_ms)
    why = new_message_error(message)
    if why is not None:
        raise ValueError(f"bad half message: {why}")
    return message


def txn_error(txn_id: Any, timeout_ms: Any, checks: Any) -> str | None:
    """Why a half publish's transaction fields are refused, or None (the shell's 406 text)."""
    if type(txn_id) is not str or not 0 < len(txn_id) <= TXN_ID_LENGTH_MAX:
        return f"{TXN_ID_HEADER} must be a string of 1 to {TXN_ID_LENGTH_MAX} characters"
    if type(timeout_ms) is not int or not 0 < timeout_ms <= EXPIRY_MS_MAX:
        return f"{TXN_TIMEOUT_HEADER} must be a positive integer (ms) up to {EXPIRY_MS_MAX}"
    if type(checks) is not int or not 0 <= checks <= TXN_CHECKS_MAX:
        return f"{TXN_CHECKS_HEADER} must be an integer from 0 to {TXN_CHECKS_MAX}"
    return None


class HalfTxn:
    """One transaction's halves in one queue, and its check-back state."""

    __slots__ = ("messages", "numbers", "timeout_ms", "checks_max", "deadline_ms", "attempts")

    def __init__(self, timeout_ms: int, checks_max: int, deadline_ms: int) -> None:
        self.messages: list[Message] = []
        self.numbers: list[int] = []  # beside each message: its half number in the backing, 0: not stored
        self.timeout_ms = timeout_ms
        self.checks_max = checks_max
        self.deadline_ms = deadline_ms
        self.attempts = 0


class QueueTxns:
    """The transaction part of `QueueMachine` (queue.py)."""

    if TYPE_CHECKING:
        vhost: str
        name: str
        now_ms: int
        next_seq: int
        settings: QueueSettings
        durable: bool
        backing: Backing | None

        def _enqueue_checked(self, messages: list[Message]) -> tuple[int | Overflowed, list[Effect]]: ...
        def _enqueue_dedup(
            self, cmd: Enqueue, messages: list[Message]
        ) -> tuple[int | Overflowed | Rejected, list[Effect]]: ...
        def _die(self, message: Message, reason: str) -> None: ...
        def _dedup_forget(self) -> None: ...

        dedup_window: DedupWindow | None

    def _init_txns(self) -> None:
        self.txns: dict[str, HalfTxn] = {}  # by id, in the order they opened
        self.txn_messages = 0
        self.txn_bytes = 0
        self._txn_next_number = 1  # a durable queue's next half number in its backing

    @property
    def txn_deadline_ms(self) -> int | None:
        """The earliest check-back deadline (for `next_deadline_ms`), None without transactions."""
        if not self.txns:
            return None
        return min(txn.deadline_ms for txn in self.txns.values())

    def _enqueue_txn(self, cmd: Enqueue, messages: list[Message]) -> tuple[int | Overflowed | Rejected, list[Effect]]:
        """An Enqueue with half messages (`cmd.txn`), its messages already checked: the halves
        are held, the rest go the usual way (with their dedup ids, positions mapped)."""
        items: Any = cmd.txn
        if type(items) is not list and type(items) is not tuple:
            return malformed(cmd, "txn must be a list"), []
        halves: dict[int, tuple[str, int, int]] = {}
        previous = -1
        for item in items:
            if type(item) is not list and type(item) is not tuple or len(item) != 4:
                return malformed(cmd, f"bad txn item {item!r}"), []
            position, txn_id, timeout_ms, checks = item
            if type(position) is not int or not previous < position < len(messages):
                return malformed(cmd, f"bad txn item {item!r}"), []
            if txn_error(txn_id, timeout_ms, checks) is not None:
                return malformed(cmd, f"bad txn item {item!r}"), []
            halves[position] = (txn_id, timeout_ms, checks)
            previous = position
        dedup: Any = cmd.dedup
        if dedup is not None and type(dedup) is not list and type(dedup) is not tuple:
            return malformed(cmd, "dedup must be a list"), []
        # A deduplicating queue checks and records a half's id as any publish's: a publisher that
        # lost a half's confirm and publishes it again gets the copy confirmed and dropped.
        rest = [p for p in range(len(messages)) if p not in halves]
        window = self.dedup_window
        half_ids: dict[int, tuple[str, int | None]] = {}  # position -> (key, ttl) to record
        duplicates = 0
        if dedup is not None and window is not None:
            ids = dedup_items(cmd, len(messages))
            if isinstance(ids, Rejected):
                return ids, []
            window.prune(self.now_ms)
            keys_here: set[str] = set()
            for position in halves:
                found = ids.get(position)
                if found is None:
                    continue
                if window.seen(found[0], self.now_ms) or found[0] in keys_here:
                    duplicates += 1
                    continue
                keys_here.add(found[0])
                half_ids[position] = (found[0], found[1])  # (an exchange window does not apply: dedup.py)
            if duplicates:  # confirmed, not held
                window.duplicates += duplicates
                halves = {p: v for p, v in halves.items() if p in half_ids or ids.get(p) is None}
        refused: list[int] = []
        stored: list[tuple[int, str, int, int, Message]] = []
        for position, (txn_id, timeout_ms, checks) in halves.items():
            message = messages[position]
            size = len(message.body)
            if self.txn_messages >= TXN_MESSAGES_MAX or self.txn_bytes + size > TXN_BYTES_MAX:
                refused.append(position)
                continue
            txn = self.txns.get(txn_id)
            if txn is None:
                # The first half sets the timeout and the checks (later ones' fields are ignored).
                txn = self.txns[txn_id] = HalfTxn(timeout_ms, checks, self.now_ms + timeout_ms)
            txn.messages.append(message)
            number = 0
            if self.durable and message.persistent:
                number = self._txn_next_number
                self._txn_next_number += 1
                stored.append((number, txn_id, txn.timeout_ms, txn.checks_max, message))
            txn.numbers.append(number)
            self.txn_messages += 1
            self.txn_bytes += size
        if stored:
            self.backing.txn_write(stored)  # type: ignore[union-attr]  # a durable queue has a backing
        if window is not None and (half_ids or duplicates):
            recorded = []
            for position, (key, ttl_ms) in half_ids.items():
                if position in refused:
                    continue  # (refused: not recorded, a retry may work)
                ttl_ms = ttl_ms or window.ttl_ms
                expires_ms = self.now_ms + ttl_ms if ttl_ms is not None else NO_EXPIRY_MS
                recorded.append((window.record(key, expires_ms), expires_ms, key, ""))
            if self.durable:
                # Also with nothing new: a single node's confirm of a duplicate waits for the next
                # fsync, which covers the recording that made it one (as _enqueue_dedup does).
                self.backing.dedup_write(recorded, window.next_number)  # type: ignore[union-attr]  # durable: a backing
            self._dedup_forget()
        if not rest:
            reply: Any = len(messages)
            effects: list[Effect] = []
        else:
            index_of = {p: i for i, p in enumerate(rest)}
            sub = [messages[p] for p in rest]
            sub_dedup = None
            if dedup is not None:
                sub_dedup = [
                    (index_of[item[0]], *item[1:])
                    for item in dedup
                    if (type(item) is list or type(item) is tuple) and len(item) == 3 and item[0] in index_of
                ]
            if sub_dedup:
                reply, effects = self._enqueue_dedup(Enqueue(sub, sub_dedup), sub)
            else:
                reply, effects = self._enqueue_checked(sub)
            if type(reply) is Rejected:
                return reply, effects  # (only a malformed dedup list: nothing was enqueued)
            if type(reply) is Overflowed:
                refused.extend(rest[i] for i in reply.rejected)
        if refused:
            refused.sort()
            return Overflowed(len(messages) - len(refused), refused), effects
        return len(messages), effects

    def _resolve_txn(self, cmd: ResolveTxn) -> tuple[int | Rejected, list[Effect]]:
        """Apply a recorded decision: how many halves it moved (0: none here, a repeat)."""
        if type(cmd.txn_id) is not str or cmd.action not in ACTIONS or type(cmd.action) is not str:
            return malformed(cmd), []
        txn = self.txns.pop(cmd.txn_id, None)
        if txn is None:
            return 0, []
        messages = txn.messages
        self.txn_messages -= len(messages)
        self.txn_bytes -= sum(len(m.body) for m in messages)
        numbers = [n for n in txn.numbers if n]
        if cmd.action == "commit":
            reply, effects = self._enqueue_checked(messages)
            if numbers:  # (after the messages' own write: a crash between keeps both, never neither)
                self.backing.txn_remove(numbers)  # type: ignore[union-attr]  # a durable queue has a backing
            if type(reply) is Overflowed:
                # A full reject-publish queue refuses committed halves as it would a publish
                # (they were confirmed as halves: counted as rejected publishes, docs say so).
                return reply.accepted, effects
            return len(messages), effects
        if numbers:
            self.backing.txn_remove(numbers)  # type: ignore[union-attr]  # a durable queue has a backing
        if cmd.action == "expire":
            for message in messages:
                # A seq of their own, never in the ready range: dead lettering keys by it.
                message.seq = self.next_seq
                self.next_seq += 1
                self._die(message, "expired")
        return len(messages), []

    def _tick_txns(self) -> list[Effect]:
        """Check-backs and time-outs that are due (in the order the transactions opened)."""
        now = self.now_ms
        effects: list[Effect] = []
        for txn_id, txn in self.txns.items():
            if txn.deadline_ms > now:
                continue
            txn.deadline_ms = now + txn.timeout_ms
            if txn.attempts < txn.checks_max:
                txn.attempts += 1
                effects.append(TxnCheck(self.vhost, self.name, txn_id, txn.attempts, txn.messages[0].props_raw))
            else:
                effects.append(TxnTimedOut(self.vhost, self.name, txn_id))
        return effects

    # ------------------------------------------------------- dump and load

    def _dump_txns(self) -> dict[str, Any]:
        """The open transactions with their halves (snapshot format version 5), only if any:
        bounded by TXN_MESSAGES_MAX and TXN_BYTES_MAX, so they may sit in the header."""
        if not self.txns:
            return {}
        return {
            "txns": [
                [txn_id, txn.timeout_ms, txn.checks_max, txn.deadline_ms, txn.attempts]
                + [[_half_record(m) for m in txn.messages], list(txn.numbers)]
                for txn_id, txn in self.txns.items()
            ],
            "txn_next_number": self._txn_next_number,
        }

    def _load_txns(self, header: dict[str, Any]) -> None:
        next_number = header.get("txn_next_number", 1)
        if type(next_number) is not int:
            raise TypeError("a queue's next half number is an int")
        self._txn_next_number = next_number
        stored: list[tuple[int, str, int, int, Message]] = []
        for txn_id, timeout_ms, checks_max, deadline_ms, attempts, records, numbers in header.get("txns", ()):
            if txn_error(txn_id, timeout_ms, checks_max) is not None or type(deadline_ms) is not int:
                raise ValueError(f"bad transaction {txn_id!r} in a queue header")
            if type(attempts) is not int or not 0 <= attempts <= checks_max or not records:
                raise ValueError(f"bad transaction {txn_id!r} in a queue header")
            txn = self.txns[txn_id] = HalfTxn(timeout_ms, checks_max, deadline_ms)
            txn.attempts = attempts
            txn.messages = [_half_from_record(r) for r in records]
            if len(numbers) != len(records) or not all(type(n) is int and 0 <= n < next_number for n in numbers):
                raise ValueError(f"bad half numbers of transaction {txn_id!r}")
            txn.numbers = list(numbers)
            if self.durable:  # the new backing holds what the original's did, as for stored messages
                stored.extend(
                    (n, txn_id, timeout_ms, checks_max, m) for n, m in zip(numbers, txn.messages, strict=True) if n
                )
            self.txn_messages += len(txn.messages)
            self.txn_bytes += sum(len(m.body) for m in txn.messages)
        if stored:
            self.backing.txn_write(stored)  # type: ignore[union-attr]  # a durable queue has a backing

    def recover_txns(self) -> None:
        """A restarted single node: the open transactions its backing kept (their persistent
        halves), in half-number order; their check-backs start over, the first due at once."""
        if self.backing is None or not self.durable:
            return
        for number, txn_id, timeout_ms, checks, message in self.backing.txn_stored():
            if txn_error(txn_id, timeout_ms, checks) is not None:
                continue  # (never written so; skipped rather than trusted)
            txn = self.txns.get(txn_id)
            if txn is None:
                txn = self.txns[txn_id] = HalfTxn(timeout_ms, checks, self.now_ms)
            txn.messages.append(message)
            txn.numbers.append(number)
            self.txn_messages += 1
            self.txn_bytes += len(message.body)
            self._txn_next_number = max(self._txn_next_number, number + 1)

    def _check_txns(self) -> None:
        count = 0
        size = 0
        for txn in self.txns.values():
            assert txn.messages, "a transaction is held only while it has halves"
            assert 0 <= txn.attempts <= txn.checks_max and len(txn.numbers) == len(txn.messages)
            assert all(0 <= n < self._txn_next_number for n in txn.numbers)
            for m in txn.messages:
                assert m.seq == -1 and not m.stored, "a half has no seq and no stored copy"
            count += len(txn.messages)
            size += sum(len(m.body) for m in txn.messages)
        assert count == self.txn_messages and size == self.txn_bytes
        assert count <= TXN_MESSAGES_MAX
