"""The commands of the queue log: small immutable records, one per kind of change.

They are what a log entry carries, so they hold only plain data (strings, ints, bytes, lists
of messages); identities are strings chosen by the proposer (`consumer_id` is unique across the
cluster: node, connection, channel and tag), so replicas agree on them.

`QueueCommand` is the union a queue machine's `apply` takes (and matches on, exhaustively);
`Create`, `Sync` and `Reply` travel in a shard's log but are the cluster glue's, never a
machine's. The field types are what the shell sends; a machine still checks them before acting
(`malformed`, `bad_seqs`), because a bad command must become a refusal, not an exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, get_args

from .queue_types import Rejected

if TYPE_CHECKING:
    from .message import Message
    from .queue_args import Arguments, QueueSettings


class Create(NamedTuple):
    """A queue starts in its shard's log (cluster mode): replicas create its machine here, so a
    shard's log alone decides what each of its queues holds, whatever the metadata group's pace."""

    durable: bool
    arguments: Arguments


class Sync(NamedTuple):
    """Changes nothing (cluster mode): its reply comes once the shard has applied everything this
    node proposed to it before, so a reply that reads the queue (declare-ok's counts) sees them."""


class Reply(NamedTuple):
    """A direct reply-to reply for a requester on another member (cluster mode): carried through
    a shard's log, delivered by the member whose key it is, ignored by the others."""

    key: str
    exchange: str
    routing_key: str
    props_raw: bytes
    body: bytes


class Enqueue(NamedTuple):
    messages: list[Message]  # in publish order; `Overflowed` names refused ones by position here
    # The publishes with an x-deduplication-header, as `(position in messages, key, TTL ms or
    # None)` in position order (dedup.py: `dedup_key`, `dedup_ttl`); None when none has one.
    # A queue without deduplication ignores them. A publish to an x-message-deduplication
    # exchange has its `ExchangeScope` after them: `(..., exchange, cache size, cache TTL ms or None)`.
    dedup: list[tuple[Any, ...]] | None = None
    # The half messages (transactions.py), as `(position, transaction id, timeout ms, checks
    # max)` in position order; None when none is one. Held apart until `ResolveTxn`.
    txn: list[tuple[int, str, int, int]] | None = None
    # x-trace (server/tracer.py): for a queue that traces, who published, as
    # `(user, connection, client address, [(position, channel, confirm mode, [routed queue names]), ...])`,
    # so every replica records the same publish; None otherwise. The machine ignores it. Once the
    # trace_numbers feature is on, a publish whose x-maxq-trace-id the node made ("connection-n",
    # 12 digits) comes in a run, `(position, channel, confirm mode, [routed queue names], n,
    # count)`: `count` publishes at positions and numbers from those, alike in the rest and in
    # their exchange, routing key, delay and properties but for that id (server/session.py).
    trace: tuple[str, str, str, list[tuple[Any, ...]]] | None = None


class EnqueueFifo(NamedTuple):
    """SQS SendMessage(Batch) to a FIFO queue (fifo.py): beside each message, its
    `(MessageGroupId, MessageDeduplicationId or None, MessageId)`. The reply is a list of
    `(MessageId, SequenceNumber)` per message (a duplicate's are the first send's), None for
    one a full reject-publish queue refused."""

    messages: list[Message]
    fifo: list[tuple[str, str | None, str]]


class Checkout(NamedTuple):
    """Attach a consumer (basic.consume)."""

    consumer_id: str
    owner: str
    prefetch: int
    no_ack: bool
    priority: int
    exclusive: bool
    credit: int
    rate_limit: int = 0  # deliveries per second (x-consume-rate-limit); absent from older entries


class Cancel(NamedTuple):
    consumer_id: str


class Settle(NamedTuple):
    """basic.ack: the messages are done."""

    consumer_id: str
    seqs: list[int]


class Requeue(NamedTuple):
    """basic.nack/reject with requeue, basic.recover, channel close: back to the queue."""

    consumer_id: str
    seqs: list[int]


class Discard(NamedTuple):
    """basic.nack/reject without requeue."""

    consumer_id: str
    seqs: list[int]


class Credit(NamedTuple):
    """The shell wrote `messages` deliveries of this consumer to its socket: refill its window."""

    consumer_id: str
    messages: int


class Get(NamedTuple):
    consumer_id: str  # the channel's holder of basic.get deliveries until they are acked
    owner: str
    no_ack: bool


class Purge(NamedTuple):
    """queue.purge: the ready messages go. SQS PurgeQueue also deletes the messages in flight
    to receivers (`in_flight`); AMQP's unacked deliveries stay either way (RabbitMQ)."""

    in_flight: bool = False


class Down(NamedTuple):
    """A channel, connection or node is gone: its consumers go, their unacked messages come back.
    Owners are "node@connection/channel"; one ending in "/" or "@" names all that start with it
    ("n1@7/" every channel of a connection, "n1@" every connection of a node)."""

    owner: str


class DeleteQueue(NamedTuple):
    pass


class Tick(NamedTuple):
    """Time passed: expire what is due (message TTL, x-expires). The shell applies it to a queue
    whose `next_deadline_ms` has come, so expiry needs no traffic; the time is the entry's."""


class Touch(NamedTuple):
    """The queue was redeclared: it counts as used (x-expires restarts), as in RabbitMQ."""


class DeadLettered(NamedTuple):
    """The shell has enqueued these dead-lettered messages to their targets (or found none):
    the source may now forget them (at-least-once dead lettering)."""

    seqs: list[int]


class UpdateSettings(NamedTuple):
    """The queue's effective arguments changed (a policy was set or cleared): new `QueueSettings`.
    They apply from now on: to messages enqueued, returned or dead-lettered after it; the length
    limits at once. A priority queue's x-max-priority, and single active consumer, cannot change."""

    settings: QueueSettings


class Receive(NamedTuple):
    """SQS ReceiveMessage: up to `max_count` (1-10) ready messages go in flight, invisible to
    everyone until `visibility_ms` (0 to 12 hours) from now (receives.py)."""

    max_count: int
    visibility_ms: int


class DeleteReceived(NamedTuple):
    """SQS DeleteMessage(Batch): each `(seq, receive_id)` handle (at most 10) deletes its message
    if the message is in flight under that very receive."""

    handles: list[tuple[int, int]]


class ChangeVisibility(NamedTuple):
    """SQS ChangeMessageVisibility(Batch): each `(seq, receive_id, visibility_ms)` (at most 10)
    sets its in-flight message's deadline to `visibility_ms` from now (0: visible at once)."""

    handles: list[tuple[int, int, int]]


class PauseConsumers(NamedTuple):
    """Pause (`paused` True) or resume consumers of the queue (consumer_pauses.py): `scope`
    "queue" (key ""), "tag" (key: a consumer tag) or "connection" (key: "node@connection").
    The reply is how many of the queue's consumers are paused afterwards."""

    scope: str
    key: str
    paused: bool


class ResolveTxn(NamedTuple):
    """Apply a transaction's decision, recorded first in the metadata group (transactions.py):
    `action` "commit", "rollback" or "expire". Idempotent: a queue without it changes nothing."""

    txn_id: str
    action: str


class TxnHolders(NamedTuple):
    """A query of a whole shard (target ALL_QUEUES) that changes nothing: the names of its queues
    of `vhost` holding halves of transaction `txn_id`, sorted. A member holding no replica of
    the group asks it before it decides that transaction (server/transactions.py): it cannot see
    those queues, and the decision's confirm waits for them to be resolved."""

    vhost: str
    txn_id: str


QueueCommand: TypeAlias = (
    Enqueue
    | EnqueueFifo
    | Checkout
    | Cancel
    | Settle
    | Requeue
    | Discard
    | Credit
    | Get
    | Purge
    | Down
    | DeleteQueue
    | Tick
    | Touch
    | DeadLettered
    | UpdateSettings
    | Receive
    | DeleteReceived
    | ChangeVisibility
    | PauseConsumers
    | ResolveTxn
)
# The classes of the union, exactly (a queue machine refuses any other type, subclasses too).
QUEUE_COMMAND_TYPES = frozenset(get_args(QueueCommand))


def malformed(command: Any, why: str = "") -> Rejected:
    """The refusal of a command whose fields are not what the shell should send."""
    # The shell builds every command, so a malformed one is a bug there; refusing it before any
    # state changes keeps replicas identical and the queue usable. (Error path: repr is fine.)
    return Rejected(541, f"malformed {type(command).__name__}: {why or repr(command)}"[:200])


def bad_seqs(seqs: Any) -> bool:
    """True unless `seqs` is a list or tuple of ints (checked before any is acted on)."""
    if type(seqs) is not list and type(seqs) is not tuple:
        return True
    for seq in seqs:  # noqa: SIM110 - per settle; a plain loop is faster than any() over a generator
        if type(seq) is not int:  # also refuses bool: True would settle seq 1
            return True
    return False
