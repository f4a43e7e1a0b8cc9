"""A queued message as the queue machine keeps it.

Theory of operation: the shell builds a `Message` from a publish (or decodes one from a log
entry, a store record or a snapshot) with what the machine needs to decide: the routing it was
published with, whether it is persistent, its TTL, priority and delay, all parsed by the shell.
`props_raw` and `body` are opaque bytes to the machine. From the Enqueue on, the machine owns the
object and alone changes its other fields (seq, delivery count, deadlines, where it is stored),
so one object sits in one queue once; a publish routed to several queues is several objects.

Nothing here belongs to one node: the shell keeps its own per-node caches (the encoded routing
of a delivery, the publish's confirm number) beside the message, not in it, so every field is
state that replicas share and snapshots carry.
"""

from __future__ import annotations


class Message:
    """A queued message (slots: a deep queue holds many in memory)."""

    __slots__ = (
        "seq",
        "exchange",
        "routing_key",
        "props_raw",
        "body",
        "delivery_count",
        "redelivered",
        "persistent",
        "stored",
        "ttl_ms",
        "expires_at_ms",
        "priority",
        "count_header",
        "delay_ms",
        "due_ms",
        "delay_counter",
        "death",
        "sent_ms",
        "first_received_ms",
        "group_id",
        "sequence_number",
    )

    def __init__(
        self,
        exchange: str,
        routing_key: str,
        props_raw: bytes,
        body: bytes,
        persistent: bool = False,
        ttl_ms: int | None = None,
        priority: int = 0,
        delay_ms: int | None = None,
    ) -> None:
        self.seq = -1  # assigned by the machine at enqueue: the queue's sequence number
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_raw = props_raw
        self.body = body
        self.delivery_count = 0
        self.redelivered = False
        self.persistent = persistent  # delivery_mode 2: survives a restart on a durable queue
        self.stored = False  # the backing holds it: delete it there when it leaves the queue
        self.ttl_ms = ttl_ms  # the `expiration` property, parsed by the shell
        self.expires_at_ms: int | None = None  # set at enqueue from the TTLs and the queue's time
        self.priority = priority  # the `priority` property (0 when absent); used by x-max-priority queues
        self.count_header = False  # returned in a queue that counts deliveries: send x-delivery-count
        self.delay_ms = delay_ms  # the `x-delay` header, parsed by the shell: held this long first
        self.due_ms: int | None = None  # a delayed message's release time (delayed.py)
        self.delay_counter = 0  # its number among the queue's delayed messages (in its key)
        self.death: tuple[str, int] | None = None  # (reason, machine time) while in dead_lettering
        # SQS's SentTimestamp and ApproximateFirstReceiveTimestamp, in queue time (receives.py).
        # Memory only: a message read back from a backing (spilled, or recovered after a restart)
        # has neither, None: the store's record has no room for them.
        self.sent_ms: int | None = None
        self.first_received_ms: int | None = None
        # SQS FIFO queues (fifo.py): the MessageGroupId and the queue's SequenceNumber of the
        # send, set by the machine at an EnqueueFifo (None for any other message).
        self.group_id: str | None = None
        self.sequence_number: int | None = None

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, rk={self.routing_key!r}, body={self.body[:20]!r})"


def new_message_error(message: object) -> str | None:
    """Why `message` cannot be enqueued (None if it can): checked for a whole batch before any
    of it is queued, so a malformed Enqueue changes nothing."""
    # A Message belongs to one queue once (seq == -1 until then): the machine keeps and mutates
    # it, so the same object enqueued twice would sit in two places.
    if type(message) is not Message or message.seq != -1:
        return f"not a new Message: {message!r}"
    ttl = message.ttl_ms
    if ttl is not None and (type(ttl) is not int or ttl < 0):
        return f"bad ttl_ms {ttl!r}"
    delay = message.delay_ms
    if delay is not None and (type(delay) is not int or delay < 0):
        return f"bad delay_ms {delay!r}"
    return None
