"""One AMQP channel's broker semantics: the methods of classes exchange, queue, basic, confirm, tx.

Theory of operation: the session hands each method to `Channel.handle`, which performs it on
the broker (metadata and queue commands) and answers through the session's protocol object.
Failures raise `ChannelError` (soft: the channel closes) or `HardError` (the connection closes)
with RabbitMQ's reply codes and texts (rabbit_channel.erl is the reference).

The channel owns its delivery tags and unacked deliveries (tag -> queue, consumer, sequence),
its consumers, its confirm counter and its transaction buffer. Deliveries arrive from the queue
machines through `deliver`; they are written at once unless the channel is paused
(channel.flow) or at its channel-wide (global) prefetch limit, in which case they are held in
order and released as acks come in. Held deliveries stay bounded: a consumer's flow credit is
refilled only when its deliveries have been written.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from ..amqp import spec
from ..amqp.properties import decode_properties, encode_properties
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.queue_types import Rejected
from ..machines.queue_args import QueueArgumentError, validate_queue_arguments
from .broker import ConsumerHandle, Unavailable
from .errors import ChannelError, HardError
from .publish_extras import delivery_props

if TYPE_CHECKING:
    from .session import Session

REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO_QUEUE + "."
FLOW_CREDIT = 2000  # deliveries a consumer may have written-but-not-yet-flushed
SUPPORTED_QUEUE_TYPES = ("classic", "quorum")


def _str(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


class Channel:
    def __init__(self, session: "Session", number: int) -> None:
        self.session = session
        self.broker = session.broker
        self.conn = session.conn
        self.number = number
        self.next_delivery_tag = 1
        self.unacked: dict[int, tuple] = {}  # delivery tag -> (queue key, consumer id, seq)
        self.consumers: dict[str, ConsumerHandle] = {}  # consumer tag -> handle
        self.owner = f"{session.id}/{number}"  # consumers' owner: Down(owner) when the channel goes
        self.get_consumer_id = f"get:{self.owner}"
        self.prefetch_count = 0  # applies to consumers created after basic.qos(global=false)
        self.global_prefetch = 0  # channel-wide limit, basic.qos(global=true)
        self.confirm = False
        self.publish_seq = 0
        self.confirmed_upto = 0  # cluster: the last publish seq acked or nacked
        self.tx = False
        self.tx_publishes: list = []
        self.tx_settles: list = []  # (kind, [(delivery tag, unacked entry)]) taken by acks inside a tx
        self.flow_active = True
        self.held: deque = deque()
        self.last_queue = ""
        self.reply_key: str | None = None
        self.reply_tag: str | None = None
        self.queues_touched: dict[tuple, None] = {}
        self.waiting = 0  # methods waiting for a commit (cluster); `backlog` holds the frames behind them
        self.waiting_method = None
        self.backlog: list = []

    # ----------------------------------------------------------- dispatch

    def handle(self, method) -> None:
        handler = _HANDLERS.get(type(method))
        if handler is None:
            raise HardError(spec.COMMAND_INVALID if method.CLASS_ID in (10, 20, 40, 50, 60, 85, 90) else spec.NOT_IMPLEMENTED,
                            f"method {method.NAME} is not supported from a client")
        handler(self, method)

    def _reply(self, method) -> None:
        self.conn.send_method(self.number, method)

    def _then(self, fn):
        """The continuation of a method that waits for a machine's reply. In a cluster the reply
        comes after a commit: the session holds this channel's later frames until it has run
        (AMQP orders a channel's methods), and an `Unavailable` reply closes the connection."""
        if self.broker.cluster is None:
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
            raise ChannelError(spec.NOT_FOUND, f"no queue '{name}' in vhost '{self.session.vhost}'")
        if record.exclusive_owner is not None and record.exclusive_owner != self.session.id:
            raise ChannelError(spec.RESOURCE_LOCKED,
                               f"cannot obtain exclusive access to locked queue '{name}' in vhost '{self.session.vhost}'. "
                               "It could be originally declared on another connection or the exclusive property value "
                               "does not match that of the original declaration.")
        return record

    # ----------------------------------------------------------- exchange

    def exchange_declare(self, m) -> None:
        # rabbit_channel: check_not_default_exchange runs for passive declares too.
        if m.exchange == "":
            raise ChannelError(spec.ACCESS_REFUSED, "operation not permitted on the default exchange")
        self._meta(md.DeclareExchange(self.session.vhost, m.exchange, m.type, m.passive, m.durable,
                                      m.auto_delete, m.internal, m.arguments or {}),
                   lambda _: m.no_wait or self._reply(spec.ExchangeDeclareOk()))

    def exchange_delete(self, m) -> None:
        self._meta(md.DeleteExchange(self.session.vhost, m.exchange, m.if_unused),
                   lambda _: m.no_wait or self._reply(spec.ExchangeDeleteOk()))

    def exchange_bind(self, m) -> None:
        self._meta(md.Bind(self.session.vhost, m.source, m.destination, True, m.routing_key, m.arguments or {}, self.session.id),
                   lambda _: m.no_wait or self._reply(spec.ExchangeBindOk()))

    def exchange_unbind(self, m) -> None:
        self._meta(md.Unbind(self.session.vhost, m.source, m.destination, True, m.routing_key, m.arguments or {}, self.session.id),
                   lambda _: m.no_wait or self._reply(spec.ExchangeUnbindOk()))

    # -------------------------------------------------------------- queue

    def queue_declare(self, m) -> None:
        name = m.queue
        vhost = self.session.vhost
        if name == REPLY_TO_QUEUE or name.startswith(REPLY_TO_PREFIX):
            # rabbit_channel: every declare of the pseudo-queue is in effect passive; it exists
            # (with its one consumer) if the address is live.
            if name != REPLY_TO_QUEUE and name[len(REPLY_TO_PREFIX):] not in self.broker.reply_to:
                raise ChannelError(spec.NOT_FOUND, f"no queue '{name}' in vhost '{vhost}'")
            if not m.no_wait:
                self._reply(spec.QueueDeclareOk(queue=name, message_count=0, consumer_count=1))
            return
        if name == "":
            if m.passive:
                name = self._expand_queue_name(name)
            else:
                name = self.broker.generate_name("amq.gen-")
        elif not m.passive and name.startswith("amq."):
            # rabbit_channel check_name: a client-chosen name may not use the reserved prefix, even
            # to redeclare (only server-named queues get amq.gen-).
            raise ChannelError(spec.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'")
        arguments = m.arguments or {}
        queue_type = arguments.get("x-queue-type")
        if queue_type is not None and _str(queue_type) not in SUPPORTED_QUEUE_TYPES:
            raise ChannelError(spec.PRECONDITION_FAILED,
                               f"invalid arg 'x-queue-type' for queue '{name}' in vhost '{vhost}': "
                               f"'{_str(queue_type)}' is not supported (use classic or quorum)")
        if arguments and not m.passive:
            try:
                validate_queue_arguments(vhost, name, arguments)
            except QueueArgumentError as err:
                raise ChannelError(spec.PRECONDITION_FAILED, err.reply_text) from None

        def declared(reply) -> None:
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            self.last_queue = name
            queue = self.broker.queues.get((vhost, name))
            if queue is not None and queue.settings.expires_ms is not None:
                self.broker.queue_cast((vhost, name), qc.Touch())  # a redeclare restarts x-expires
            if not m.no_wait:
                # In a cluster the counts are this replica's, which may trail the leader's a little.
                self._reply(spec.QueueDeclareOk(queue=name, message_count=queue.ready_count if queue else 0,
                                                consumer_count=queue.active_consumer_count if queue else 0))
        self.broker.declare_queue(md.DeclareQueue(vhost, name, m.passive, m.durable, m.exclusive, m.auto_delete,
                                                  arguments, self.session.id), self._then(declared))

    def queue_bind(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self._meta(md.Bind(self.session.vhost, m.exchange, name, False, m.routing_key, m.arguments or {}, self.session.id),
                   lambda _: m.no_wait or self._reply(spec.QueueBindOk()))

    def queue_unbind(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self._meta(md.Unbind(self.session.vhost, m.exchange, name, False, m.routing_key, m.arguments or {}, self.session.id),
                   lambda _: self._reply(spec.QueueUnbindOk()))

    def queue_purge(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self._existing_queue(name)
        def purged(count) -> None:
            if not m.no_wait:
                self._reply(spec.QueuePurgeOk(message_count=count if isinstance(count, int) else 0))
        self.broker.queue_call(self._queue_key(name), qc.Purge(), self._then(purged))

    def queue_delete(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        vhost = self.session.vhost
        if self.broker.meta.queue(vhost, name) is None:
            # Idempotent in RabbitMQ 3.x: deleting a missing queue succeeds.
            if not m.no_wait:
                self._reply(spec.QueueDeleteOk(message_count=0))
            return
        self._existing_queue(name)

        def delete(_synced) -> None:
            queue = self.broker.queues.get((vhost, name))
            if m.if_unused and queue is not None and queue.active_consumer_count:
                raise ChannelError(spec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vhost}' in use")
            if m.if_empty and queue is not None and queue.ready_count:
                raise ChannelError(spec.PRECONDITION_FAILED, f"queue '{name}' in vhost '{vhost}' not empty")
            self.broker.delete_queue((vhost, name), self._then(lambda count: m.no_wait or self._reply(spec.QueueDeleteOk(message_count=count))))
        # The checks read the queue: in a cluster, once its shard has what this node sent before.
        self.broker.queue_call((vhost, name), qc.Sync(), self._then(delete))

    # -------------------------------------------------------------- basic

    def basic_qos(self, m) -> None:
        if m.prefetch_size:
            raise HardError(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})")
        if m.global_:
            self.global_prefetch = m.prefetch_count
            self.release_held()
        else:
            self.prefetch_count = m.prefetch_count
        self._reply(spec.BasicQosOk())

    def basic_consume(self, m) -> None:
        tag = m.consumer_tag or self.broker.generate_name("amq.ctag-")
        if tag in self.consumers:
            raise HardError(spec.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'")
        if m.queue == REPLY_TO_QUEUE:
            self._consume_reply_to(m, tag)
            return
        name = self._expand_queue_name(m.queue)
        self._existing_queue(name)
        queue_key = self._queue_key(name)
        consumer_id = f"{self.owner}/{tag}"
        arguments = m.arguments or {}
        priority = arguments.get("x-priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ChannelError(spec.PRECONDITION_FAILED, f"invalid arg 'x-priority' for consumer '{tag}': expected an integer")
        # A channel-wide limit also bounds each consumer, so the machine never hands out more.
        prefetch = self.prefetch_count or self.global_prefetch
        handle = ConsumerHandle(consumer_id, tag, self, queue_key, m.no_ack)
        # Register before checkout: the checkout may deliver at once.
        self.consumers[tag] = handle
        self.broker.consumers[consumer_id] = handle
        self.queues_touched[queue_key] = None

        def checked_out(reply) -> None:
            if type(reply) is Rejected or type(reply) is Unavailable:
                self.consumers.pop(tag, None)
                self.broker.consumers.pop(consumer_id, None)
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            if not m.no_wait and type(reply) is not Unavailable:
                self._reply(spec.BasicConsumeOk(consumer_tag=tag))  # before the first delivery
        self.broker.queue_call(queue_key, qc.Checkout(consumer_id, self.owner, prefetch, m.no_ack,
                                                       priority, m.exclusive, FLOW_CREDIT), self._then(checked_out))

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
                    if self.held:
                        self._return_held(handle)
                    # An auto-delete queue is gone by the time cancel-ok is sent.
                    self.broker.maybe_auto_delete(handle.queue_key, self._then(
                        lambda _deleted: m.no_wait or self._reply(spec.BasicCancelOk(consumer_tag=tag))))
                self.broker.queue_call(handle.queue_key, qc.Cancel(handle.consumer_id), self._then(cancelled))
                return
        if not m.no_wait:
            self._reply(spec.BasicCancelOk(consumer_tag=tag))

    def _drop_reply_to(self) -> None:
        self.broker.reply_to.pop(self.reply_key, None)
        self.reply_key = self.reply_tag = None

    def basic_get(self, m) -> None:
        name = self._expand_queue_name(m.queue)
        self._existing_queue(name)
        queue_key = self._queue_key(name)
        self.queues_touched[queue_key] = None
        def got(reply) -> None:
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            if reply is None:
                self._reply(spec.BasicGetEmpty())
                return
            message, redelivered, remaining = reply
            tag = self.next_delivery_tag
            self.next_delivery_tag += 1
            if not m.no_ack:
                self.unacked[tag] = (queue_key, self.get_consumer_id, message.seq)
            self.conn.send_content(self.number, spec.BasicGetOk(delivery_tag=tag, redelivered=redelivered, exchange=message.exchange,
                                                                routing_key=message.routing_key, message_count=remaining),
                                   delivery_props(message), message.body)
        self.broker.queue_call(queue_key, qc.Get(self.get_consumer_id, self.owner, m.no_ack), self._then(got))

    def basic_ack(self, m) -> None:
        self._acknowledge(qc.Settle, m.delivery_tag, m.multiple)

    def basic_reject(self, m) -> None:
        self._acknowledge(qc.Requeue if m.requeue else qc.Discard, m.delivery_tag, False)

    def basic_nack(self, m) -> None:
        self._acknowledge(qc.Requeue if m.requeue else qc.Discard, m.delivery_tag, m.multiple)

    def _acknowledge(self, kind, delivery_tag: int, multiple: bool) -> None:
        taken = self._take_tags(delivery_tag, multiple)
        if self.tx:
            # As rabbit_channel: inside a transaction the tags leave the unacked set at once (so
            # acking one twice is a 406), the queues hear of them at commit, and a rollback
            # puts them back.
            self.tx_settles.append((kind, taken))
            return
        self._settle(kind, [entry for _tag, entry in taken])

    def basic_recover(self, m) -> None:
        if not m.requeue:
            raise HardError(spec.NOT_IMPLEMENTED, "requeue=false")
        self.requeue_all()
        if isinstance(m, spec.BasicRecover):
            self._reply(spec.BasicRecoverOk())

    def _take_tags(self, delivery_tag: int, multiple: bool) -> list:
        """Remove and return the (tag, entry) pairs an ack/nack names; an unknown tag is a 406.

        As rabbit_channel:collect_acks: `multiple` with tag 0 takes everything; otherwise the
        named tag must itself be unacked, also with `multiple` (acking up to a tag that was
        already acked is a 406). `unacked` is kept in tag order, so the walk stops early.
        """
        unacked = self.unacked
        if multiple and delivery_tag == 0:
            taken = list(unacked.items())
            unacked.clear()
            return taken
        if delivery_tag not in unacked:
            raise ChannelError(spec.PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
        if not multiple:
            return [(delivery_tag, unacked.pop(delivery_tag))]
        taken = []
        for tag in list(unacked):
            if tag > delivery_tag:
                break
            taken.append((tag, unacked.pop(tag)))
        return taken

    def _restore_tx_settles(self) -> None:
        """Put the deliveries acked inside the open transaction back among the unacked, in tag order."""
        settles, self.tx_settles = self.tx_settles, []
        if settles:
            entries = list(self.unacked.items())
            for _kind, taken in settles:
                entries.extend(taken)
            entries.sort(key=lambda item: item[0])
            self.unacked = dict(entries)

    def _settle(self, kind, taken: list) -> None:
        """Hand settled deliveries to the session, which applies them per (queue, consumer) at the
        end of the read: a read of a thousand single acks becomes one command (and one write)."""
        if not taken:
            return
        self.session.defer_settles(kind, taken)
        if self.held:
            self.release_held()

    def requeue_all(self) -> None:
        taken = list(self.unacked.values())
        self.unacked.clear()
        self._settle(qc.Requeue, taken)

    # ------------------------------------------------------- confirm / tx

    def confirm_select(self, m) -> None:
        if self.tx:
            raise ChannelError(spec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True
        if not m.nowait:
            self._reply(spec.ConfirmSelectOk())

    def tx_select(self, m) -> None:
        if self.confirm:
            raise ChannelError(spec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self.tx = True
        self._reply(spec.TxSelectOk())

    def tx_commit(self, m) -> None:
        if not self.tx:
            raise ChannelError(spec.PRECONDITION_FAILED, "channel is not transactional")
        publishes, self.tx_publishes = self.tx_publishes, []
        settles, self.tx_settles = self.tx_settles, []
        for method, props_raw, body in publishes:
            self.session.route_publish(self, None, method, props_raw, body)
        queue_keys = list(self.session.pending)
        self.session.flush_publishes()
        for kind, taken in settles:
            self._settle(kind, [entry for _tag, entry in taken])
        if not queue_keys:
            self._reply(spec.TxCommitOk())
            return
        # commit-ok once every queue has the messages: in a cluster, once their entries have
        # committed (a Sync through each shard answers after them).
        committed = self._then(lambda _reply: self._reply(spec.TxCommitOk()))
        state = {"left": len(queue_keys), "failure": None}

        def synced(reply) -> None:
            if type(reply) is Unavailable:
                state["failure"] = reply
            state["left"] -= 1
            if state["left"] == 0:
                committed(state["failure"])
        for queue_key in queue_keys:
            self.broker.queue_call(queue_key, qc.Sync(), synced)

    def tx_rollback(self, m) -> None:
        if not self.tx:
            raise ChannelError(spec.PRECONDITION_FAILED, "channel is not transactional")
        self.tx_publishes = []
        self._restore_tx_settles()  # the deliveries are unacked again, under their tags
        self._reply(spec.TxRollbackOk())

    # ------------------------------------------------------------ publish

    def publish(self, method, props_raw: bytes, body: bytes) -> None:
        if method.immediate:
            # RabbitMQ dropped `immediate` in 3.0: rabbit_channel answers it with a connection error.
            raise HardError(spec.NOT_IMPLEMENTED, "immediate=true")
        if self.tx:
            self.tx_publishes.append((method, props_raw, body))
            return
        seq = None
        if self.confirm:
            self.publish_seq += 1
            seq = self.publish_seq
        self.session.route_publish(self, seq, method, props_raw, body)

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
        tag = self.next_delivery_tag
        self.next_delivery_tag += 1
        self.conn.send_content(self.number, spec.BasicDeliver(consumer_tag=self.reply_tag, delivery_tag=tag, redelivered=False,
                                                              exchange=exchange, routing_key=routing_key), props_raw, body)
        self.session.wake()

    # --------------------------------------------------------- deliveries

    def deliver(self, handle: ConsumerHandle, message, redelivered: bool) -> None:
        if self.held or not self.flow_active or (self.global_prefetch and len(self.unacked) >= self.global_prefetch):
            self.held.append((handle, message, redelivered))
            return
        self._write_delivery(handle, message, redelivered)

    def _write_delivery(self, handle: ConsumerHandle, message, redelivered: bool) -> None:
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        if not handle.no_ack:
            self.unacked[tag] = (handle.queue_key, handle.consumer_id, message.seq)
        self.session.write_delivery(self.number, handle, tag, redelivered, message)

    def _return_held(self, handle: ConsumerHandle | None = None) -> None:
        """Give back deliveries held on this channel (of `handle`, or all): the queue checked
        them out, but the client never saw them. RabbitMQ's limiter would have left them in the
        queue; here they return to their places (flagged redelivered by the queue machine).
        No-ack deliveries are no longer the queue's, as with ones already in the socket."""
        if handle is None:
            held, self.held = self.held, deque()
        else:
            held = deque(h for h in self.held if h[0] is handle)
            self.held = deque(h for h in self.held if h[0] is not handle)
        self._settle(qc.Requeue, [(h.queue_key, h.consumer_id, message.seq) for h, message, _ in held if not h.no_ack])

    def release_held(self) -> None:
        held = self.held
        while held and self.flow_active and not (self.global_prefetch and len(self.unacked) >= self.global_prefetch):
            self._write_delivery(*held.popleft())

    def set_flow(self, active: bool) -> None:
        self.flow_active = active
        if active:
            self.release_held()

    def consumer_gone(self, handle: ConsumerHandle) -> None:
        """The queue was deleted: tell the client (consumer_cancel_notify) and forget the consumer."""
        if self.consumers.pop(handle.tag, None) is None:
            return
        if self.held:
            self.held = deque(h for h in self.held if h[0] is not handle)
        if self.session.conn.client_capabilities.get("consumer_cancel_notify"):
            self.conn.send_method(self.number, spec.BasicCancel(consumer_tag=handle.tag, no_wait=True))
            self.session.wake()

    # ------------------------------------------------------------- close

    def close(self) -> None:
        """The channel is gone: its consumers go and what it had not acked returns to the queues
        (in order), held deliveries too: one `Down` per queue it consumed from."""
        self.tx_publishes = []
        self.tx_settles = []  # uncommitted acks never happened: those messages come back too
        self.session.flush_settles()  # acks it made before closing stand
        self._unregister()
        self.unacked.clear()
        self.broker.owner_down(self.owner, list(self.queues_touched))

    def forget(self) -> None:
        """Connection-wide cleanup does the queue side (`Down` of the connection); only unregister here."""
        self._unregister()

    def _unregister(self) -> None:
        for handle in self.consumers.values():
            self.broker.consumers.pop(handle.consumer_id, None)
        self.consumers.clear()
        self.held.clear()
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
