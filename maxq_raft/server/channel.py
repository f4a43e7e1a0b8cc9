"""One AMQP channel's broker semantics: the methods of classes exchange, queue, basic, confirm, tx.

Theory of operation: the session hands each method to `Channel.handle`, which performs it on
the broker (metadata and queue commands) and answers through the session's protocol object.
Failures raise `ChannelError` (soft: the channel closes) or `HardError` (the connection closes)
with RabbitMQ's reply codes and texts (rabbit_channel.erl is the reference).

The rules of delivery tags, acks, basic.recover, confirm numbering, transactions and held
deliveries live in the pure `ChannelState` (channel_state.py, tested without sockets); this
module is the glue that feeds it the client's methods and the queues' deliveries, and performs
what it answers on the broker and the session. The channel itself keeps its consumers and its
direct reply-to address. Deliveries arrive from the queue machines through `deliver`; held ones
stay bounded: a consumer's flow credit is refilled only when its deliveries have been written.

The channel reaches its connection only through `ChannelHost` (the session is one), so this
module never imports session.py: the session makes channels, never the reverse.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from ..amqp import spec
from ..amqp.connection import ServerConnection
from ..amqp.properties import decode_properties, encode_properties
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines import partitions
from ..machines.queue_args import RATE_LIMIT_MAX, SUPPORTED_QUEUE_TYPES, QueueArgumentError, validate_queue_arguments
from ..machines.queue_types import Rejected
from .authorization import Authorization
from .broker import Broker, ConsumerHandle
from .channel_state import ChannelState
from .confirms import Unavailable
from .errors import AccessRefused, ChannelError, HardError, MetadataBehind
from .partitioned import (
    in_turn,
    missing_partitions,
    partition_keys,
    ready_count,
    share,
    sync_alongside,
    unavailable,
    with_fresh_counts,
    with_policy_partitions,
)
from .publish_extras import delivery_props
from .publish_plan import PublishPlan

REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO_QUEUE + "."
FLOW_CREDIT = 2000  # deliveries a consumer may have written-but-not-yet-flushed
# In a cluster a consumer's credit comes back as a replicated command (Credit), committed behind
# the publishes proposed before it (up to the proposer's flow mark), so a refill takes a round
# trip of tens of ms under load: with 2,000 a 3-node transient 16 B consumer got 15,200-20,200
# msgs/s beside a publisher at 39,000-40,000; with 8,000, 48,700-63,500, as fast as the
# publisher; but 1 KiB consumers were slower with more (12,900-14,400 at 8,000 against
# 15,000-18,100 at 2,000: bigger bursts of deliveries on a loaded node). So a cluster member's
# session raises a consumer's credit up to CLUSTER_FLOW_CREDIT for small deliveries, about
# CREDIT_BYTES of them (session.credit_target; docs/benchmarks.md, 2026-12-03).
CLUSTER_FLOW_CREDIT = 8000
CREDIT_BYTES = 1 << 20


def _ignore(_reply: Any) -> None:
    pass


def _str(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


class ChannelHost(Protocol):
    """What a channel needs from the connection it lives on; `session.Session` is one."""

    broker: Broker
    conn: ServerConnection
    id: str  # the connection's id: exclusive queues and consumers' owners name it
    vhost: str
    authorization: Authorization

    def continuation(self, channel: Channel, fn: Callable[[Any], None]) -> Callable[[Any], None]: ...
    def route_publish(
        self, channel: Channel, seq: int | None, method, props_raw: bytes, body: bytes
    ) -> PublishPlan | None: ...
    def route_again(
        self, channel: Channel, first_seq: int | None, plan: PublishPlan, method, bodies: list[bytes]
    ) -> None: ...
    def flush_publishes(self) -> dict: ...
    def metadata_current(self, channel: Channel) -> None: ...
    def routes_nowhere(self, method, props_raw: bytes) -> bool: ...
    def defer_settles(self, kind, entries: list) -> None: ...
    def flush_settles(self) -> None: ...
    def write_delivery(
        self, channel_number: int, handle: ConsumerHandle, delivery_tag: int, redelivered: bool, message
    ) -> None: ...
    def write_deliveries(
        self, channel_number: int, handle: ConsumerHandle, first_delivery_tag: int, run: list
    ) -> None: ...
    def wake(self) -> None: ...
    def cancel_later(self, channel: Channel, consumer_tag: str) -> None: ...


class Channel:
    def __init__(self, session: ChannelHost, number: int) -> None:
        self.session = session
        self.broker = session.broker
        self.conn = session.conn
        self.number = number
        # Delivery tags, unacked entries (queue key, consumer id, queue seq), confirms, tx, held deliveries.
        self.state = ChannelState()
        self.consumers: dict[str, ConsumerHandle] = {}  # consumer tag -> handle
        # consumer tag -> its handles on partitions 1.. of a partitioned queue (0's is in consumers)
        self.partition_consumers: dict[str, list[ConsumerHandle]] = {}
        self.get_turns: dict[str, int] = {}  # partitioned queue -> where its next basic.get starts
        self.owner = f"{session.id}/{number}"  # consumers' owner: Down(owner) when the channel goes
        self.get_consumer_id = f"get:{self.owner}"
        self.last_queue = ""
        self.reply_key: str | None = None
        self.reply_tag: str | None = None
        self.queues_touched: dict[tuple, None] = {}
        self.waiting = 0  # methods waiting for a commit (cluster); `backlog` holds the frames behind them
        self.waiting_method = None
        self.metadata_synced = False  # performing a method again after a metadata barrier (session.py)
        self.backlog_read_at = 0.0  # (trio time) when `backlog` last took a frame
        self.backlog: list = []

    # ----------------------------------------------------------- dispatch

    def handle(self, method) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise HardError(
                spec.COMMAND_INVALID if method.CLASS_ID in (10, 20, 40, 50, 60, 85, 90) else spec.NOT_IMPLEMENTED,
                f"method {method.NAME} is not supported from a client",
            )
        try:
            handler(self, method)
        except AccessRefused:
            # Every permission check comes before its method changes anything: on a cluster
            # member the method runs again after a metadata barrier (MetadataBehind) unless it is
            # that run already, and is refused then.
            self.session.metadata_current(self)
            raise

    def _reply(self, method) -> None:
        self.conn.send_method(self.number, method)

    def _then(self, fn):
        """The continuation of a method that waits for a machine's reply. A local log replies in
        the caller's stack (the channel error a continuation raises reaches the method's
        handler); a cluster's reply comes after a commit: the session holds this channel's later
        frames until it has run (AMQP orders a channel's methods), and an `Unavailable` reply
        closes the connection."""
        if self.broker.log.synchronous:
            return fn
        return self.session.continuation(self, fn)

    def _meta(self, command, then) -> None:
        def checked(reply) -> None:
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            then(reply)

        self.broker.meta_call(command, self._then(checked))

    def _queue_key(self, name: str) -> tuple:
        return (self.session.vhost, name)

    def _expand_queue_name(self, name: str) -> str:
        # RabbitMQ: an empty queue name means the last queue declared on this channel.
        if name == "":
            if not self.last_queue:
                raise ChannelError(spec.NOT_FOUND, "no previously declared queue")
            return self.last_queue
        return name

    def _existing_queue(self, name: str):
        record = self.broker.meta.queue(self.session.vhost, name)
        if record is None:
            self.session.metadata_current(self)
            raise ChannelError(spec.NOT_FOUND, f"no queue '{name}' in vhost '{self.session.vhost}'")
        if record.exclusive_owner is not None and record.exclusive_owner != self.session.id:
            raise ChannelError(
                spec.RESOURCE_LOCKED,
                f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.session.vhost}'. "
                "It could be originally declared on another connection or the exclusive property value "
                "does not match that of the original declaration.",
            )
        return record

    # ----------------------------------------------------------- exchange

    def exchange_declare(self, m) -> None:
        # rabbit_channel: check_not_default_exchange runs for passive declares too.
        if m.exchange == "":
            raise ChannelError(spec.ACCESS_REFUSED, "operation not permitted on the default exchange")
        if not m.passive:
            authz = self.session.authorization
            authz.check("configure", "exchange", m.exchange)
            alternate = (m.arguments or {}).get("alternate-exchange")
            if isinstance(alternate, (str, bytes)):
                # rabbit_channel: using an alternate exchange writes to it and reads this one
                authz.check("write", "exchange", _str(alternate))
                authz.check("read", "exchange", m.exchange)
        self._meta(
            md.DeclareExchange(
                self.session.vhost,
                m.exchange,
                m.type,
                m.passive,
                m.durable,
                m.auto_delete,
                m.internal,
                m.arguments or {},
            ),
            lambda _: m.no_wait or self._reply(spec.ExchangeDeclareOk()),
        )

    def exchange_delete(self, m) -> None:
        if m.exchange and not m.exchange.startswith("amq."):  # those are refused as system exchanges first
            self.session.authorization.check("configure", "exchange", m.exchange)
        self._meta(
            md.DeleteExchange(self.session.vhost, m.exchange, m.if_unused),
            lambda _: m.no_wait or self._reply(spec.ExchangeDeleteOk()),
        )

    def _check_binding(self, source: str, destination: str, destination_type: str, routing_key: str) -> None:
        # rabbit_channel:binding_action: write the destination, read the source, and a topic
        # source's read permission on the routing key.
        authz = self.session.authorization
        authz.check("write", destination_type, destination)
        authz.check("read", "exchange", source)
        if authz.is_topic_exchange(source):
            authz.check_topic("read", source, routing_key)

    def exchange_bind(self, m) -> None:
        self._check_binding(m.source, m.destination, "exchange", m.routing_key)
        self._meta(
            md.Bind(
                self.session.vhost, m.source, m.destination, True, m.routing_key, m.arguments or {}, self.session.id
            ),
            lambda _: m.no_wait or self._reply(spec.ExchangeBindOk()),
        )

    def exchange_unbind(self, m) -> None:
        self._check_binding(m.source, m.destination, "exchange", m.routing_key)
        self._meta(
            md.Unbind(
                self.session.vhost, m.source, m.destination, True, m.routing_key, m.arguments or {}, self.session.id
            ),
            lambda _: m.no_wait or self._reply(spec.ExchangeUnbindOk()),
        )

    # -------------------------------------------------------------- queue

    def queue_declare(self, m) -> None:
        name = m.queue
        vhost = self.session.vhost
        if name == REPLY_TO_QUEUE or name.startswith(REPLY_TO_PREFIX):
            # rabbit_channel: every declare of the pseudo-queue is in effect passive; it exists
            # (with its one consumer) if the address is live.
            if name != REPLY_TO_QUEUE and name[len(REPLY_TO_PREFIX) :] not in self.broker.reply_to:
                raise ChannelError(spec.NOT_FOUND, f"no queue '{name}' in vhost '{vhost}'")
            if not m.no_wait:
                self._reply(spec.QueueDeclareOk(queue=name, message_count=0, consumer_count=1))
            return
        if name == "":
            name = self._expand_queue_name(name) if m.passive else self.broker.generate_name(md.SERVER_NAMED_PREFIX)
        elif not m.passive and name.startswith("amq."):
            # rabbit_channel check_name: a client-chosen name may not use the reserved prefix, even
            # to redeclare (only server-named queues get amq.gen-).
            raise ChannelError(spec.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
        arguments = m.arguments or {}
        queue_type = arguments.get("x-queue-type")
        if queue_type is not None and _str(queue_type) not in SUPPORTED_QUEUE_TYPES:
            raise ChannelError(
                spec.PRECONDITION_FAILED,
                f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{vhost}': "
                f"'{_str(queue_type)}' is not supported (use classic or quorum)",
            )
        if arguments and not m.passive:
            try:
                validate_queue_arguments(vhost, name, arguments)
            except QueueArgumentError as err:
                raise ChannelError(spec.PRECONDITION_FAILED, err.reply_text) from None
        count = 1 if m.passive else partitions.partition_count(arguments)
        if count > 1:
            refusal = partitions.declare_refusal(name, count, m.exclusive, m.auto_delete, arguments)
            refusal = refusal or unavailable(self.broker, arguments)
            if refusal is not None:
                raise ChannelError(
                    spec.PRECONDITION_FAILED,
                    f"invalid arg 'x-partitions' for queue '{name}' in vhost '{vhost}': {refusal}",
                )
        if not m.passive:
            authz = self.session.authorization
            authz.check("configure", "queue", name)
            dlx = arguments.get("x-dead-letter-exchange")
            if isinstance(dlx, (str, bytes)):
                # rabbit_channel:check_dead_letter_exchange: dead-lettering reads this queue and
                # writes to the exchange
                authz.check("read", "queue", name)
                authz.check("write", "exchange", _str(dlx))

        def answer(_replies) -> None:
            queue = self.broker.queues.get((vhost, name))
            settings = queue.settings if queue is not None else self.broker.settings_elsewhere((vhost, name))
            if settings is not None and settings.expires_ms is not None:
                self.broker.queue_cast((vhost, name), qc.Touch())  # a redeclare restarts x-expires
            if m.no_wait:
                return
            # In a cluster the counts are this replica's, which may trail the leader's a little
            # (a group held elsewhere: its leader's, in the reply to the declare's Sync).
            # A partitioned queue's: the messages of every partition (the others synced too),
            # the consumers of the first (a consumer of the name consumes from each).
            keys = partition_keys(self.broker, vhost, name)

            def counted() -> None:
                view = self.broker.queue_view((vhost, name))
                self._reply(
                    spec.QueueDeclareOk(
                        queue=name,
                        message_count=ready_count(self.broker, keys),
                        consumer_count=view.active_consumer_count if view is not None else 0,
                    )
                )

            with_fresh_counts(self.broker, keys[1:], self._then, counted)

        def declared(reply) -> None:
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            self.last_queue = name
            # A partitioned queue's other partitions (a redeclare makes those still missing).
            missing = [] if m.passive else missing_partitions(self.broker, vhost, name, self.session.id)
            steps = [partial(self.broker.declare_queue, command) for command in missing]
            in_turn(self._then, steps, answer)

        command = md.DeclareQueue(
            vhost, name, m.passive, m.durable, m.exclusive, m.auto_delete, arguments, self.session.id
        )
        self.broker.declare_queue(with_policy_partitions(self.broker, command), self._then(declared))

    def queue_bind(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self._check_binding(m.exchange, name, "queue", m.routing_key)
        self._meta(
            md.Bind(self.session.vhost, m.exchange, name, False, m.routing_key, m.arguments or {}, self.session.id),
            lambda _: m.no_wait or self._reply(spec.QueueBindOk()),
        )

    def queue_unbind(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self._check_binding(m.exchange, name, "queue", m.routing_key)
        self._meta(
            md.Unbind(self.session.vhost, m.exchange, name, False, m.routing_key, m.arguments or {}, self.session.id),
            lambda _: self._reply(spec.QueueUnbindOk()),
        )

    def queue_purge(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self.session.authorization.check("read", "queue", name)
        self._existing_queue(name)

        def purged(counts: list) -> None:
            if not m.no_wait:
                total = sum(count for count in counts if isinstance(count, int) and not isinstance(count, bool))
                self._reply(spec.QueuePurgeOk(message_count=total))

        steps = [
            lambda done, key=key: self.broker.queue_call(key, qc.Purge(), done)
            for key in partition_keys(self.broker, self.session.vhost, name)
        ]
        in_turn(self._then, steps, purged)

    def queue_delete(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        vhost = self.session.vhost
        self.session.authorization.check("configure", "queue", name)
        if self.broker.meta.queue(vhost, name) is None:
            self.session.metadata_current(self)
            # Idempotent in RabbitMQ 3.x: deleting a missing queue succeeds.
            if not m.no_wait:
                self._reply(spec.QueueDeleteOk(message_count=0))
            return
        self._existing_queue(name)
        partition = partitions.parent_of(name)
        if partition is not None and self.broker.meta.queue(vhost, partition[0]) is not None:
            raise ChannelError(
                spec.ACCESS_REFUSED,
                f"queue '{name}' in vhost '{vhost}' is a partition of '{partition[0]}': delete that",
            )
        keys = partition_keys(self.broker, vhost, name)

        def checked() -> None:
            queue = self.broker.queue_view((vhost, name))
            if m.if_unused and queue is not None and queue.active_consumer_count:
                raise ChannelError(spec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vhost}' in use")
            if m.if_empty and ready_count(self.broker, keys):
                raise ChannelError(spec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vhost}' not empty")
            # Partition 0, the queue of the name, goes last (partitioned.py).
            steps = [lambda done, key=key: self.broker.delete_queue(key, done) for key in reversed(keys)]
            in_turn(
                self._then,
                steps,
                lambda counts: m.no_wait or self._reply(spec.QueueDeleteOk(message_count=sum(counts))),
            )

        def delete(synced) -> None:
            self.broker.note_counts((vhost, name), synced)
            # (if-empty counts every partition: those held elsewhere as of a Sync too)
            with_fresh_counts(self.broker, keys[1:] if m.if_empty else [], self._then, checked)

        # The checks read the queue: in a cluster, once its shard has what this node sent before.
        self.broker.queue_call((vhost, name), qc.Sync(), self._then(delete))

    # -------------------------------------------------------------- basic

    def basic_qos(self, m) -> None:
        state = self.state
        state.qos(m.prefetch_size, m.prefetch_count, m.global_)
        if state.held:
            self.release_held()  # a larger channel-wide limit may have made room
        self._reply(spec.BasicQosOk())

    def basic_consume(self, m) -> None:
        tag = m.consumer_tag or self.broker.generate_name("amq.ctag-")
        if tag in self.consumers:
            raise HardError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if m.queue == REPLY_TO_QUEUE:
            self._consume_reply_to(m, tag)
            return
        name = self._expand_queue_name(m.queue)
        self.session.authorization.check("read", "queue", name)
        self._existing_queue(name)
        queue_key = self._queue_key(name)
        consumer_id = f"{self.owner}/{tag}"
        arguments = m.arguments or {}
        priority = arguments.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ChannelError(
                spec.PRECONDITION_FAILED, f"invalid arg 'x-priority' for consumer '{tag}': expected an integer"
            )
        rate_limit = arguments.get("x-consume-rate-limit")  # MaxQ-Raft's (machines/consume_rate.py)
        if rate_limit is None:
            rate_limit = 0
        elif type(rate_limit) is not int or not 1 <= rate_limit <= RATE_LIMIT_MAX:
            raise ChannelError(
                spec.PRECONDITION_FAILED,
                f"invalid arg 'x-consume-rate-limit' for consumer '{tag}': expected an integer 1-{RATE_LIMIT_MAX}",
            )
        prefetch = self.state.consumer_prefetch_count()
        keys = partition_keys(self.broker, self.session.vhost, name)
        if len(keys) > 1:  # a partitioned queue: a checkout in each partition, sharing the limits
            prefetch, rate_limit = share(prefetch, len(keys)), share(rate_limit, len(keys))
        handle = ConsumerHandle(consumer_id, tag, self, queue_key, m.no_ack, m.exclusive, arguments)
        # Register before checkout: the checkout may deliver at once.
        self.consumers[tag] = handle
        self.broker.consumers[consumer_id] = handle
        self.queues_touched[queue_key] = None

        def checkout(handle: ConsumerHandle, done: Callable[[Any], None]) -> None:
            self.broker.queue_call(
                handle.queue_key,
                qc.Checkout(
                    handle.consumer_id, self.owner, prefetch, m.no_ack, priority, m.exclusive, FLOW_CREDIT, rate_limit
                ),
                done,
            )

        def checked_out(reply) -> None:
            if type(reply) is Rejected or type(reply) is Unavailable:
                self.consumers.pop(tag, None)
                self.broker.consumers.pop(consumer_id, None)
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            if not m.no_wait and type(reply) is not Unavailable:
                self._reply(spec.BasicConsumeOk(consumer_tag=tag))  # before the first delivery
            if len(keys) > 1 and type(reply) is not Unavailable:
                # The other partitions after consume-ok, so that none delivers before it; a
                # refusal there closes the channel (its consumers go everywhere with it).
                others = self.partition_consumers[tag] = []
                for key in keys[1:]:
                    other = ConsumerHandle(f"{consumer_id}#{key[1]}", tag, self, key, m.no_ack, m.exclusive, arguments)
                    others.append(other)
                    self.broker.consumers[other.consumer_id] = other
                    self.queues_touched[key] = None
                in_turn(self._then, [partial(checkout, h) for h in others], _ignore)

        checkout(handle, self._then(checked_out))

    def _consume_reply_to(self, m, tag: str) -> None:
        if not m.no_ack:
            raise ChannelError(spec.PRECONDITION_FAILED, "reply consumer cannot acknowledge")
        if self.reply_tag is not None:
            raise ChannelError(spec.PRECONDITION_FAILED, "reply consumer already set")
        self.reply_tag = tag
        # The key names this node ("n1~..."), so a reply published on another member finds it.
        self.reply_key = self.broker.generate_name(self.broker.node_id + "~")
        self.broker.reply_to[self.reply_key] = self
        if not m.no_wait:
            self._reply(spec.BasicConsumeOk(consumer_tag=tag))

    def basic_cancel(self, m) -> None:
        tag = m.consumer_tag
        if tag == self.reply_tag and tag is not None:
            self._drop_reply_to()
        else:
            handle = self.consumers.get(tag)
            if handle is not None:
                # The consumer stays registered until the machine has it cancelled: what it is
                # handed until then still goes to the client, which may ack it.
                def cancelled(_reply) -> None:
                    if self.consumers.get(tag) is handle:
                        del self.consumers[tag]
                    self.broker.consumers.pop(handle.consumer_id, None)
                    if self.state.held:
                        self._return_held(handle)
                    # An auto-delete queue is gone by the time cancel-ok is sent.
                    self.broker.maybe_auto_delete(
                        handle.queue_key,
                        self._then(lambda _deleted: m.no_wait or self._reply(spec.BasicCancelOk(consumer_tag=tag))),
                    )

                def others_cancelled(_replies) -> None:
                    for other in self.partition_consumers.pop(tag, ()):
                        self.broker.consumers.pop(other.consumer_id, None)
                        if self.state.held:
                            self._return_held(other)
                    self.broker.queue_call(handle.queue_key, qc.Cancel(handle.consumer_id), self._then(cancelled))

                # A partitioned queue's consumer: partition 0 last, so nothing comes after cancel-ok.
                others = self.partition_consumers.get(tag, [])
                steps = [
                    lambda done, h=h: self.broker.queue_call(h.queue_key, qc.Cancel(h.consumer_id), done)
                    for h in others
                ]
                in_turn(self._then, steps, others_cancelled)
                return
        if not m.no_wait:
            self._reply(spec.BasicCancelOk(consumer_tag=tag))

    def _drop_reply_to(self) -> None:
        self.broker.reply_to.pop(self.reply_key, None)
        self.reply_key = self.reply_tag = None

    def basic_get(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self.session.authorization.check("read", "queue", name)
        self._existing_queue(name)
        keys = partition_keys(self.broker, self.session.vhost, name)
        count = len(keys)
        # A partitioned queue: its partitions in turn, from where the last get left; those this
        # member sees holding messages first, every one tried anyway. An empty one costs a Get
        # through its group's log: a final drain through a member without the replicas took 0.3 s
        # per basic.get of 4 mostly empty partitions (jepsen-style seed 2012, on a loaded
        # machine). Those held elsewhere are synced beside the Get, and get-ok waits for them: its
        # count is every partition's, not what this member last heard of them.
        start = self.get_turns.get(name, 0) % count
        order = [(start + i) % count for i in range(count)]
        if count > 1:
            order.sort(key=lambda i: ready_count(self.broker, [keys[i]]) == 0)
        for key in keys:
            self.queues_touched[key] = None
        after_counts = sync_alongside(self.broker, keys if count > 1 else [], self._then)
        self._get(m, name, keys, order, 0, after_counts)

    def _get(self, m, name: str, keys: list, order: list[int], turn: int, after_counts) -> None:
        """Try partition `order[turn]` of `keys` (a queue's only one, or its partitions); get-ok
        goes once `after_counts` (partitioned.sync_alongside) has the others' counts."""
        queue_key = keys[order[turn]]

        def got(reply) -> None:
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            broker = self.broker
            if reply is None and turn + 1 < len(keys):
                self._get(m, name, keys, order, turn + 1, after_counts)  # this partition is empty: the next one
                return
            if reply is None:
                broker.messages_get_empty += 1
                self._reply(spec.BasicGetEmpty())
                return
            message, redelivered, remaining = reply
            if m.no_ack:
                broker.messages_got_auto_ack += 1
            else:
                broker.messages_got_manual_ack += 1
            if redelivered:
                broker.messages_redelivered += 1

            def counted() -> None:
                left = remaining
                if len(keys) > 1:
                    self.get_turns[name] = (order[turn] + 1) % len(keys)
                    left += ready_count(broker, [key for key in keys if key != queue_key])
                tag = self.state.deliver(None if m.no_ack else (queue_key, self.get_consumer_id, message.seq))
                self.conn.send_content(
                    self.number,
                    spec.BasicGetOk(
                        delivery_tag=tag,
                        redelivered=redelivered,
                        exchange=message.exchange,
                        routing_key=message.routing_key,
                        message_count=left,
                    ),
                    delivery_props(message),
                    message.body,
                )

            after_counts(counted)

        self.broker.queue_call(queue_key, qc.Get(self.get_consumer_id, self.owner, m.no_ack), self._then(got))

    def basic_ack(self, m) -> None:
        self._settle(qc.Settle, self.state.settle(qc.Settle, m.delivery_tag, m.multiple))

    def basic_reject(self, m) -> None:
        kind = qc.Requeue if m.requeue else qc.Discard
        self._settle(kind, self.state.settle(kind, m.delivery_tag, False))

    def basic_nack(self, m) -> None:
        kind = qc.Requeue if m.requeue else qc.Discard
        self._settle(kind, self.state.settle(kind, m.delivery_tag, m.multiple))

    def basic_recover(self, m) -> None:
        self._settle(qc.Requeue, self.state.recover(m.requeue))
        if isinstance(m, spec.BasicRecover):
            self._reply(spec.BasicRecoverOk())

    def _settle(self, kind, entries: list) -> None:
        """Hand settled deliveries to the session, which applies them per (queue, consumer) at the
        end of the read: a read of a thousand single acks becomes one command (and one write)."""
        if not entries:
            return  # (inside a transaction the state keeps them until tx.commit)
        self.session.defer_settles(kind, entries)
        if self.state.held:
            self.release_held()

    # ------------------------------------------------------- confirm / tx

    def confirm_select(self, m) -> None:
        self.state.confirm_select()
        if not m.nowait:
            self._reply(spec.ConfirmSelectOk())

    def tx_select(self, m) -> None:
        self.state.tx_select()
        self._reply(spec.TxSelectOk())

    def tx_commit(self, m) -> None:
        session = self.session
        if (
            self.state.tx
            and not self.metadata_synced
            and self.broker.log.metadata_may_lag()
            and any(session.routes_nowhere(p[0], p[1]) for p in self.state.tx_publishes)
        ):
            raise MetadataBehind  # (before anything of the commit is done)
        publishes, settles = self.state.tx_commit()
        was_synced, self.metadata_synced = self.metadata_synced, True  # (checked above, all at once)
        try:
            for method, props_raw, body in publishes:
                session.route_publish(self, None, method, props_raw, body)
        except AccessRefused as err:
            # Final: the transaction's buffer is taken and some of it may be routed, so this
            # commit must not run again after a barrier (`handle` does so for an AccessRefused).
            raise ChannelError(err.reply_code, err.reply_text) from None
        finally:
            self.metadata_synced = was_synced
        queue_keys = list(self.session.flush_publishes())
        for kind, entries in settles:
            self._settle(kind, entries)
        if not queue_keys:
            self._reply(spec.TxCommitOk())
            return
        # commit-ok once every queue has the messages: in a cluster, once their entries have
        # committed (a Sync through each shard answers after them).
        committed = self._then(lambda _reply: self._reply(spec.TxCommitOk()))
        progress = {"left": len(queue_keys), "failure": None}

        def synced(reply) -> None:
            if type(reply) is Unavailable:
                progress["failure"] = reply
            progress["left"] -= 1
            if progress["left"] == 0:
                committed(progress["failure"])

        for queue_key in queue_keys:
            self.broker.queue_call(queue_key, qc.Sync(), synced)

    def tx_rollback(self, m) -> None:
        self.state.tx_rollback()  # the deliveries acked in it are unacked again, under their tags
        self._reply(spec.TxRollbackOk())

    # ------------------------------------------------------------ publish

    def publish(self, method, props_raw: bytes, body: bytes) -> PublishPlan | None:
        """Take one basic.publish; its plan (Session.route_publish) when more like it may follow it."""
        if method.immediate:
            # RabbitMQ dropped `immediate` in 3.0: rabbit_channel answers it with a connection error.
            raise HardError(spec.NOT_IMPLEMENTED, "immediate=true")
        state = self.state
        if state.tx:
            state.buffer_publish((method, props_raw, body))
            return None
        seq = state.next_publish_seq() if state.confirm else None
        try:
            try:
                return self.session.route_publish(self, seq, method, props_raw, body)
            except AccessRefused:
                # Its checks come before it routes anything: refused on a member whose metadata
                # may be behind, it runs again after a barrier, as a method does (`handle`).
                self.session.metadata_current(self)
                raise
        except MetadataBehind:  # (performed again after the barrier, under the same seq)
            if seq is not None:
                state.publish_seq -= 1
            raise

    def publish_again(self, plan: PublishPlan, method, bodies: list[bytes]) -> None:
        """More publishes with the method and properties whose first gave `plan` (`publish`
        returned it), right after it: routed as it was (Session.route_again)."""
        state = self.state
        self.session.route_again(
            self, state.next_publish_seqs(len(bodies)) if state.confirm else None, plan, method, bodies
        )

    def rewrite_reply_to(self, props_raw: bytes) -> bytes:
        """Direct reply-to: 'amq.rabbitmq.reply-to' becomes an address of this channel's reply consumer."""
        props = decode_properties(props_raw)
        if props.reply_to != REPLY_TO_QUEUE:
            return props_raw
        if self.reply_key is None:
            raise ChannelError(spec.PRECONDITION_FAILED, "fast reply consumer does not exist")
        props.reply_to = REPLY_TO_PREFIX + self.reply_key
        return encode_properties(props)

    def deliver_reply(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes) -> None:
        tag = self.state.deliver(None)  # a reply consumer is no-ack
        self.conn.send_content(
            self.number,
            spec.BasicDeliver(
                consumer_tag=self.reply_tag,
                delivery_tag=tag,
                redelivered=False,
                exchange=exchange,
                routing_key=routing_key,
            ),
            props_raw,
            body,
        )
        self.session.wake()

    # --------------------------------------------------------- deliveries

    def deliver_run(self, handle: ConsumerHandle, run: list) -> None:
        """Write a run of `Deliver` effects to `handle`, in order, as one (Session.write_deliveries):
        their tags are consecutive. What the channel may not write now (paused, at the
        channel-wide limit, or behind held ones; the limit may be reached part way) is held."""
        state = self.state
        if state.holding:
            written = 0
        elif handle.no_ack:
            written = len(run)
            state.deliver_no_ack(written)
        else:
            written = 0
            queue_key, consumer_id = handle.queue_key, handle.consumer_id
            for _consumer_id, message, _redelivered in run:
                state.deliver((queue_key, consumer_id, message.seq))
                written += 1
                if state.holding:
                    break
        if written:
            self.session.write_deliveries(
                self.number, handle, state.next_delivery_tag - written, run if written == len(run) else run[:written]
            )
        for _consumer_id, message, redelivered in run[written:]:
            state.hold((handle, message, redelivered))

    def _return_held(self, handle: ConsumerHandle | None = None) -> None:
        """Give back deliveries held on this channel (of `handle`, or all): the queue checked
        them out, but the client never saw them. RabbitMQ's limiter would have left them in the
        queue; here they return to their places (flagged redelivered by the queue machine).
        No-ack deliveries are no longer the queue's, as with ones already in the socket."""
        held = self.state.take_held(None if handle is None else (lambda item: item[0] is handle))
        self._settle(qc.Requeue, [(h.queue_key, h.consumer_id, message.seq) for h, message, _ in held if not h.no_ack])

    def release_held(self) -> None:
        state = self.state
        write_delivery = self.session.write_delivery
        while (item := state.next_released()) is not None:
            handle, message, redelivered = item
            tag = state.deliver(None if handle.no_ack else (handle.queue_key, handle.consumer_id, message.seq))
            write_delivery(self.number, handle, tag, redelivered, message)

    def consumer_gone(self, handle: ConsumerHandle) -> None:
        """The queue was deleted: tell the client (consumer_cancel_notify) and forget the consumer
        (of a partitioned queue: on every partition)."""
        first = self.consumers.pop(handle.tag, None)
        if first is None:
            return
        gone = [first, *self.partition_consumers.pop(handle.tag, ())]
        for other in gone:
            if other is not handle and self.broker.consumers.pop(other.consumer_id, None) is not None:
                self.broker.queue_cast(other.queue_key, qc.Cancel(other.consumer_id))
        if self.state.held:
            self.state.take_held(lambda item: item[0] in gone)
        if self.conn.client_capabilities.get("consumer_cancel_notify"):
            self.session.cancel_later(self, handle.tag)

    # ------------------------------------------------------------- close

    def close(self) -> None:
        """The channel is gone: its consumers go and what it had not acked returns to the queues
        (in order), held deliveries too: one `Down` per queue it consumed from."""
        self.state.close()  # uncommitted acks never happened: those messages come back too
        self.session.flush_settles()  # acks it made before closing stand
        self._unregister()
        self.broker.owner_down(self.owner, list(self.queues_touched))

    def forget(self) -> None:
        """Connection-wide cleanup does the queue side (`Down` of the connection); only unregister here."""
        self._unregister()

    def _unregister(self) -> None:
        for handle in self.consumers.values():
            self.broker.consumers.pop(handle.consumer_id, None)
        for others in self.partition_consumers.values():
            for handle in others:
                self.broker.consumers.pop(handle.consumer_id, None)
        self.consumers.clear()
        self.partition_consumers.clear()
        self.state.take_held()
        if self.reply_key is not None:
            self._drop_reply_to()


_HANDLERS = {
    spec.ExchangeDeclare: Channel.exchange_declare,
    spec.ExchangeDelete: Channel.exchange_delete,
    spec.ExchangeBind: Channel.exchange_bind,
    spec.ExchangeUnbind: Channel.exchange_unbind,
    spec.QueueDeclare: Channel.queue_declare,
    spec.QueueBind: Channel.queue_bind,
    spec.QueueUnbind: Channel.queue_unbind,
    spec.QueuePurge: Channel.queue_purge,
    spec.QueueDelete: Channel.queue_delete,
    spec.BasicQos: Channel.basic_qos,
    spec.BasicConsume: Channel.basic_consume,
    spec.BasicCancel: Channel.basic_cancel,
    spec.BasicGet: Channel.basic_get,
    spec.BasicAck: Channel.basic_ack,
    spec.BasicReject: Channel.basic_reject,
    spec.BasicNack: Channel.basic_nack,
    spec.BasicRecover: Channel.basic_recover,
    spec.BasicRecoverAsync: Channel.basic_recover,
    spec.ConfirmSelect: Channel.confirm_select,
    spec.TxSelect: Channel.tx_select,
    spec.TxCommit: Channel.tx_commit,
    spec.TxRollback: Channel.tx_rollback,
}
