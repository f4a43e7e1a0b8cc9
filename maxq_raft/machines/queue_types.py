"""What passes between a queue machine and its shell: entry meta in, replies and effects out,
and the storage the shell lends the machine (`Backing`).

Theory of operation: `QueueMachine.apply(meta, command)` returns `(reply, effects)`. The reply
goes to whoever proposed the command (on the proposing node only); the effects are data that
every replica returns alike and that the shell performs, idempotently: `Deliver` on the node
hosting the consumer's connection, `DeadLetter` and `QueueExpired` on the queue's leader.
Replies name what they refer to by value (positions, sequence numbers), never by object
identity, so a replica that applied decoded copies of a command answers the same.

`Backing` is the one place where a machine touches storage. Its calls come from inside
`apply`, in log order, and what they leave is a function of the applied commands, so a replica
that reads it back (`load`) decides as every other replica does. The machines and `Meta`,
`Rejected` are shared with the metadata machine (metadata.py).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias

if TYPE_CHECKING:
    from .message import Message


class Meta(NamedTuple):
    """Stamped by the proposer into each log entry: pysyncobj passes none of this to apply.

    `time_ms` is the proposer's clock, so entries from different proposers (a leader change,
    skewed clocks) may go back in time; a queue machine never does (see `QueueMachine.now_ms`)."""

    log_index: int
    time_ms: int


# ------------------------------------------------------------------ replies


class Rejected(NamedTuple):
    """Reply to a command the machine refused; the shell turns it into an AMQP error."""

    reply_code: int
    reply_text: str


class Overflowed(NamedTuple):
    """Reply to an Enqueue into a full reject-publish queue: `accepted` messages were queued;
    `rejected` are the positions (0-based, ascending) in the Enqueue's `messages` of those that
    were not, so the proposer can nack their publishes from what it kept beside the batch."""

    accepted: int
    rejected: list[int]


class QueueCounts(NamedTuple):
    """Reply to a `Sync` of a queue that exists: what declare-ok, a conditional delete and an
    auto-delete read, for a member that holds no replica of the queue's group (the names are
    the machine's own attributes, so either answers the same reads)."""

    ready_count: int
    active_consumer_count: int
    ever_had_consumer: bool


class Received(NamedTuple):
    """One message of a `Receive`'s reply (a list of them, in the queue's order): what the shell
    needs for an SQS ReceiveMessage answer and its receipt handle (sqs/receipt.py)."""

    message: Message
    seq: int  # with `receive_id`, names this receive of the message (the handle)
    receive_id: int
    receive_count: int  # ApproximateReceiveCount: every delivery and receive of the message so far
    first_received_ms: int  # ApproximateFirstReceiveTimestamp, queue time
    sent_ms: int | None  # SentTimestamp, queue time; None for a message read back from the backing


class HandleResult(StrEnum):
    """Per entry of a `DeleteReceived` or `ChangeVisibility` reply, in the command's order."""

    DONE = "done"  # deleted, or its deadline set
    STALE = "stale"  # in flight, but under a later receive: the handle is an old one
    NOT_IN_FLIGHT = "not_in_flight"  # visible again, deleted, gone or never known
    TOO_LONG = "too_long"  # ChangeVisibility only: past 12 hours from the receive (SQS: InvalidParameterValue)


# ------------------------------------------------------------------ effects


class Deliver(NamedTuple):
    """Effect: send `message` to `consumer_id` (its host performs it)."""

    consumer_id: str
    message: Message
    redelivered: bool


class DeadLetter(NamedTuple):
    """Effect: republish `messages` to `exchange` (with `routing_key`, or their own when None),
    adding x-death for `reason` (rejected, expired, maxlen, delivery_limit), then apply
    `DeadLettered` with the seqs of those that have one (a publish refused by
    reject-publish-dlx was never queued: its seq is -1)."""

    vhost: str
    queue: str
    reason: str
    messages: list[Message]
    time_ms: int
    # None when the queue lost its dead-letter exchange (a policy change) in the command that
    # dead-lettered them: the shell finds no such exchange and drops them
    exchange: str | None
    routing_key: str | None


class QueueExpired(NamedTuple):
    """Effect: x-expires has passed with the queue unused; the shell deletes it."""

    vhost: str
    name: str


class TxnCheck(NamedTuple):
    """Effect: transaction `txn_id` of queue `queue` has had no decision in time: publish check
    number `attempt` to the reply_to of its first half, whose properties are `props_raw`
    (transactions.py)."""

    vhost: str
    queue: str
    txn_id: str
    attempt: int
    props_raw: bytes


class TxnTimedOut(NamedTuple):
    """Effect: the checks of `txn_id` are spent with no answer: record a rollback ("expire")."""

    vhost: str
    queue: str
    txn_id: str


Effect: TypeAlias = Deliver | DeadLetter | QueueExpired | TxnCheck | TxnTimedOut


# ------------------------------------------------------------------ storage


class Backing(Protocol):
    """Where a queue keeps what is not in memory (storage/ behind the shell's adapter,
    server/message_store.py's `QueueBacking`; tests use a dict).

    Calls come from `apply`, in log order; `load` must return what earlier calls left, so every
    replica that applied the same commands reads the same messages. Writes do not fail as far as
    the machine can tell (the store keeps what it could not write and recovers by itself); a
    `load` that meets a damaged record raises, and `apply` refuses the command with a 541.

    Keys are the messages' `seq`: ready messages below `DELAYED_BASE` (a priority queue puts its
    lane above the counter bits), delayed ones (delayed.py) from `DELAYED_BASE` on.
    """

    def write(self, messages: list[Message]) -> None:
        """Store these messages (each with its seq); persistent ones of a durable queue must
        survive a restart."""

    def remove(self, messages: list[Message]) -> None:
        """These stored messages left the queue (acked, discarded, purged, delivered without ack)."""

    def remove_from(self, seq_from: int, persistent: int, seq_below: int | None = None) -> None:
        """Every stored message with seq >= seq_from (and < seq_below) left the queue (purge of the
        spilled tail); `persistent` of them were persistent."""

    def load(self, seq_from: int, limit: int, seq_below: int | None = None) -> list[Message]:
        """Up to `limit` (at least one if any) stored messages with seq >= seq_from (and <
        seq_below), in seq order, as new `Message` objects; [] means none is stored there."""

    def rewrite(self, messages: list[Message]) -> None:
        """These stored messages changed (their delivery count): store them again, in place."""

    def delivered(self, seq: int) -> None:
        """Messages up to `seq` have been delivered at least once (their redelivered flag after a restart)."""

    def drop(self) -> None:
        """The queue is deleted."""

    # An SQS FIFO queue's deduplication window (fifo.py), asked of a durable queue only: a
    # single node has no log to replay after a restart, so its window is kept here too.

    def dedup_write(self, entries: list[tuple[int, int, str, str]], next_sequence_number: int | None) -> None:
        """New window entries (sequence number, expires ms, deduplication id, message id or
        exchange name), in sequence order, and the queue's next sequence number (None: as it was)."""

    def dedup_forget(self, below_sequence_number: int, from_sequence_number: int = 0) -> None:
        """The entries from `from_sequence_number` up to below `below_sequence_number` have left
        the window."""

    def dedup_stored(
        self, from_sequence_number: int = 0, below_sequence_number: int | None = None
    ) -> tuple[list[tuple[int, int, str, str]], int]:
        """After a restart: the entries kept in that range (in sequence order; None: no upper
        bound) and the next sequence number."""

    # Consumer pause rules (consumer_pauses.py), for the same reason: asked of a durable queue only.

    def pauses_write(self, rules: list[tuple[str, str]]) -> None:
        """The queue's pause rules now, all of them (a few; they replace what was kept)."""

    def pauses_stored(self) -> list[tuple[str, str]]:
        """After a restart: the rules last written ([] if none)."""

    # Half messages of open transactions (transactions.py), for the same reason: asked of a
    # durable queue only, for its persistent halves. `number` is the queue's own numbering.

    def txn_write(self, entries: list[tuple[int, str, int, int, Message]]) -> None:
        """New halves: (number, transaction id, timeout ms, checks max, message)."""

    def txn_remove(self, numbers: list[int]) -> None:
        """These halves are resolved (committed ones were written as messages before)."""

    def txn_stored(self) -> list[tuple[int, str, int, int, Message]]:
        """After a restart: the halves kept, in number order."""

    # What a restarted node's backing knows before any message is read (`QueueMachine.recover`).

    @property
    def delivered_upto(self) -> int:
        """The last `delivered` seq it was told (-1: none)."""

    @property
    def delayed_stored(self) -> int:
        """How many delayed messages it holds."""

    @property
    def delayed_next(self) -> int:
        """Above the counter of every delayed message it holds (new ones must not take their keys)."""
