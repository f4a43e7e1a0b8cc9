"""The broker of one node: the machines, the log they are applied from, and their effects.

Theory of operation: every change goes through `apply_meta` (topology) or `apply_queue` (one
queue), which stamp a log entry, apply it to the machine and perform the effects it returns.
`Deliver` effects are handed to the channel that holds the consumer; `QueueCreated` /
`QueueDeleted` create and drop queue machines. The broker knows nothing of sockets or trio:
sessions (one per connection) call it synchronously and it calls back into their channels,
which only append frames to buffers. So one publish, from frames to the consumer's buffer, runs
without a single `await`.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.queue import Deliver, QueueMachine, Rejected
from ..replication.local_log import LocalLog
from .errors import ChannelError

log = logging.getLogger("maxq.broker")


class ConsumerHandle:
    """Where a consumer lives: the channel that sends its deliveries."""

    __slots__ = ("consumer_id", "tag", "channel", "queue_key", "no_ack")

    def __init__(self, consumer_id: str, tag: str, channel: Any, queue_key: tuple, no_ack: bool) -> None:
        self.consumer_id = consumer_id
        self.tag = tag
        self.channel = channel
        self.queue_key = queue_key
        self.no_ack = no_ack


class Broker:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.log = LocalLog(lambda: int(time.time() * 1000))
        self.meta = md.MetadataMachine()
        self.queues: dict[tuple[str, str], QueueMachine] = {}
        self.consumers: dict[str, ConsumerHandle] = {}
        self.reply_to: dict[str, Any] = {}  # direct reply-to key -> channel
        self.sessions: dict[str, Any] = {}
        self.started_at = time.time()
        self.messages_published = 0
        self.messages_delivered = 0

    # --------------------------------------------------------------- apply

    def apply_meta(self, command) -> Any:
        """Apply a metadata command; a refusal becomes a ChannelError for the caller to raise."""
        reply, effects = self.meta.apply(self.log.stamp(), command)
        for effect in effects:
            if type(effect) is md.QueueCreated:
                self.queues[(effect.vhost, effect.name)] = QueueMachine(effect.vhost, effect.name)
            elif type(effect) is md.QueueDeleted:
                self._queue_deleted((effect.vhost, effect.name))
        if type(reply) is Rejected:
            raise ChannelError(reply.reply_code, reply.reply_text)
        return reply

    def apply_queue(self, queue_key: tuple, command) -> Any:
        queue = self.queues.get(queue_key)
        if queue is None:
            return Rejected(404, f"no queue '{queue_key[1]}' in vhost '{queue_key[0]}'")
        reply, effects = queue.apply(self.log.stamp(), command)
        if effects:
            self.perform(effects)
        return reply

    def perform(self, effects: list) -> None:
        consumers = self.consumers
        for effect in effects:
            if type(effect) is Deliver:
                handle = consumers.get(effect.consumer_id)
                if handle is not None:
                    handle.channel.deliver(handle, effect.message, effect.redelivered)
                    self.messages_delivered += 1
                else:
                    log.warning("delivery for unknown consumer %s dropped by this node", effect.consumer_id)

    # --------------------------------------------------------------- queues

    def delete_queue(self, queue_key: tuple) -> int:
        """Delete a queue: its messages, its record and bindings; its consumers are told."""
        reply = self.apply_queue(queue_key, qc.DeleteQueue())
        self.apply_meta(md.DeleteQueueRecord(*queue_key))
        return reply if isinstance(reply, int) else 0

    def _queue_deleted(self, queue_key: tuple) -> None:
        queue = self.queues.pop(queue_key, None)
        if queue is not None and not queue.deleted:
            queue.apply(self.log.stamp(), qc.DeleteQueue())
        for handle in [h for h in self.consumers.values() if h.queue_key == queue_key]:
            del self.consumers[handle.consumer_id]
            handle.channel.consumer_gone(handle)

    def maybe_auto_delete(self, queue_key: tuple) -> None:
        """RabbitMQ: an auto-delete queue goes when its last consumer is cancelled or gone."""
        queue = self.queues.get(queue_key)
        record = self.meta.queue(*queue_key)
        if queue is None or record is None or not record.auto_delete:
            return
        if queue.ever_had_consumer and queue.active_consumer_count == 0:
            self.delete_queue(queue_key)

    def owner_down(self, owner: str, queue_keys: list) -> None:
        """A connection closed: release its consumers everywhere, then drop its exclusive queues."""
        for queue_key in queue_keys:
            if queue_key in self.queues:
                self.apply_queue(queue_key, qc.Down(owner))
        for queue_key in queue_keys:
            self.maybe_auto_delete(queue_key)
        self.apply_meta(md.OwnerDown(owner))

    @staticmethod
    def generate_name(prefix: str) -> str:
        return prefix + secrets.token_urlsafe(16)
