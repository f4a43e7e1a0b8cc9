"""The broker of one node: the machines, the log they are applied from, and their effects.

Theory of operation: every change goes through `apply_meta` (topology) or `apply_queue` (one
queue), which stamp a log entry, apply it to the machine and perform the effects it returns.
`Deliver` effects are handed to the channel that holds the consumer; `QueueCreated` /
`QueueDeleted` create and drop queue machines. The broker knows nothing of sockets or trio:
sessions (one per connection) call it synchronously and it calls back into their channels,
which only append frames to buffers. So one publish, from frames to the consumer's buffer, runs
without a single `await`.

Storage: every queue machine gets a backing in the node's store (message_store.py); durable
topology goes to a metadata log (persistence.py). `recover` rebuilds both at start: the metadata
by replaying its log, each durable queue from its counters and key bounds, never by reading its
messages, so start-up does not grow with depth. Publisher confirms that depend on a write wait
for the group-commit sync (`on_sync`), and are nacked if the store failed before that sync
(`on_sync_failed`: storage/guarded.py keeps the machines whole meanwhile, and the node
recovers by itself: store_health.py).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections import deque
from typing import Any, NamedTuple

from ..amqp import spec
from ..amqp.frames import encode_shortstr_field
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.delayed import DELAYED_BASE
from ..machines.priority_queue import make_queue_machine
from ..machines.queue import SEQ_MASK, QueueMachine
from ..machines.queue_types import Deliver, Rejected
from ..replication.local_log import LocalLog
from ..storage.errors import StoreFailed
from . import dead_letter, persistence, policies
from .errors import ChannelError
from .message_store import QueueBacking, WalSyncer, counters_key, decode_counters

log = logging.getLogger("maxq.broker")


class ConsumerHandle:
    """Where a consumer lives: the channel that sends its deliveries."""

    __slots__ = ("consumer_id", "tag", "channel", "queue_key", "no_ack", "wire_tag")

    def __init__(self, consumer_id: str, tag: str, channel: Any, queue_key: tuple, no_ack: bool) -> None:
        self.consumer_id = consumer_id
        self.tag = tag
        self.wire_tag = encode_shortstr_field(tag)  # encoded once, written with every delivery
        self.channel = channel
        self.queue_key = queue_key
        self.no_ack = no_ack


def _ignore(_reply) -> None:
    pass


class Unavailable(NamedTuple):
    """Stands in for a machine's reply when the command could not be committed: `reason` is the
    engine's ("not leader", "timeout": the outcome is unknown, "busy", "stopped")."""

    reason: str


class Broker:
    def __init__(self, node_id: str, store=None, fsync: bool = True) -> None:
        self.node_id = node_id
        self.log = LocalLog(self.clock_ms)
        self.meta = md.MetadataMachine()
        self.queues: dict[tuple[str, str], QueueMachine] = {}
        self.queue_ids: dict[tuple[str, str], int] = {}
        self.store = store
        self.epoch = 0
        self.next_queue_id = 1
        self.metadata_log: persistence.MetadataLog | None = None
        self.syncer: WalSyncer | None = None
        self.durable_auto_delete: dict[tuple[str, str], None] = {}  # (vhost, name) of such exchanges
        self.confirm_waiters: dict = {}  # channel -> None, channels whose confirms wait for a sync
        self._call_soon = None  # trio's run_sync_soon, set by the shell
        self._fsync = fsync
        self.alarms = None  # ResourceAlarms, set by the shell
        self.cluster = None  # ClusterLog when this node is a member of a Raft cluster
        self.consumers: dict[str, ConsumerHandle] = {}
        self.reply_to: dict[str, Any] = {}  # direct reply-to key -> channel
        self.sessions: dict[str, Any] = {}  # open connections (past connection.open), by id
        self.live_sessions: dict = {}  # every connection task, handshaking ones too
        self.started_at = time.time()
        self.messages_published = 0
        self.messages_delivered = 0

    @staticmethod
    def clock_ms() -> int:
        return int(time.time() * 1000)

    # ------------------------------------------------------------- storage

    def recover(self, call_soon) -> None:
        """Open what the store holds: durable topology and durable queues; drop everything else."""
        self._call_soon = call_soon
        store = self.store
        self.epoch = int.from_bytes(store.get_meta(persistence.EPOCH_KEY) or b"\0", "big") + 1
        store.write((), (), {persistence.EPOCH_KEY: self.epoch.to_bytes(8, "big")}, wal=True)
        self.next_queue_id = int.from_bytes(store.get_meta(persistence.NEXT_QUEUE_ID_KEY) or b"\0\0\0\0\0\0\0\1", "big")
        self.syncer = WalSyncer(store, self._sync_outcome_from_thread, fsync=self._fsync)
        self.metadata_log = persistence.MetadataLog(store)
        for command, queue_id in self.metadata_log.entries():
            self.apply_meta(command, replaying=True, queue_id=queue_id)
        # What is not durable does not survive a restart (RabbitMQ): queues, then exchanges.
        for vhost in list(self.meta.vhosts.values()):
            for queue in list(vhost.queues.values()):
                if not (queue.durable and queue.exclusive_owner is None):
                    self.apply_meta(md.DeleteQueueRecord(vhost.name, queue.name), replaying=True)
            for exchange in list(vhost.exchanges.values()):
                if not exchange.durable:
                    self.apply_meta(md.DeleteExchange(vhost.name, exchange.name, False), replaying=True)
        live_ids = set()
        for queue_key, queue in self.queues.items():
            queue_id = self.queue_ids[queue_key]
            live_ids.add(queue_id)
            backing = queue.backing
            persistent, next_seq, delivered = decode_counters(store.get_meta(counters_key(queue_id)))
            bounds = store.bounds(queue_id)
            # Seqs are never reused, not even those of transient messages that are gone: a new
            # message at or below the delivered watermark would come back redelivered=true.
            # (The counters' next_seq moves only with durable writes; delivered with deliveries.)
            next_seq = max(next_seq, delivered + 1, (bounds[1] & SEQ_MASK) + 1 if bounds and bounds[1] < DELAYED_BASE else 0)
            if bounds and not persistent:
                # Nothing durable is stored, so whatever is there is transient records of an
                # earlier run that RocksDB had flushed: one range tombstone frees them, where
                # loading would only skip them (and they would stay on disk until the queue goes).
                store.drop_queue(queue_id)
                bounds = None
            backing.persistent, backing.delivered_upto, backing.next_seq = persistent, delivered, next_seq
            if bounds:
                # Two point reads, whatever the depth: the head is what is delivered first and
                # the tail holds the last writes before the stop, so damage there stops the start
                # (StorageError -> exit 1 naming the record) instead of failing the first
                # basic.get. Damage deeper in is met when read (logged), or by `--check`.
                store.get(queue_id, bounds[0])
                store.get(queue_id, bounds[1])
            queue.recover(next_seq=backing.next_seq, spilled_count=persistent if bounds else 0,
                          spill_cursor=bounds[0] if bounds else 0)
        for queue_id in store.queue_ids():
            if queue_id not in live_ids:
                store.drop_queue(queue_id)
        self.durable_auto_delete = {(vhost_name, ex.name): None for vhost_name, vhost in self.meta.vhosts.items()
                                    for ex in vhost.exchanges.values() if ex.durable and ex.auto_delete}
        self.metadata_log.write_snapshot(persistence.snapshot_entries(self.meta, self.queue_ids))
        store.sync_wal()
        log.info("recovered %d durable queues (%d messages), %d exchanges", len(self.queues),
                 sum(q.ready_count for q in self.queues.values()),
                 sum(len(v.exchanges) for v in self.meta.vhosts.values()))

    def open_for_cluster(self) -> None:
        """A cluster member's store holds only what overflowed memory in an earlier life: the
        Raft log is replayed into fresh machines, so whatever is here goes."""
        store = self.store
        self.epoch = int.from_bytes(store.get_meta(persistence.EPOCH_KEY) or b"\0", "big") + 1
        store.write((), (), {persistence.EPOCH_KEY: self.epoch.to_bytes(8, "big")}, wal=True)
        for queue_id in store.queue_ids():
            store.drop_queue(queue_id)

    def _new_queue(self, vhost: str, name: str, queue_id: int | None) -> None:
        record = self.meta.queue(vhost, name)
        durable = record is not None and record.durable and record.exclusive_owner is None
        if queue_id is None:
            queue_id = self.next_queue_id
            self.next_queue_id += 1
            if self.store is not None:
                self.store.write((), (), {persistence.NEXT_QUEUE_ID_KEY: self.next_queue_id.to_bytes(8, "big")}, wal=durable)
        else:
            self.next_queue_id = max(self.next_queue_id, queue_id + 1)
        self.queue_ids[(vhost, name)] = queue_id
        backing = QueueBacking(self.store, queue_id, durable, self.epoch, self.syncer) if self.store is not None else None
        settings = policies.queue_settings(self, vhost, name)
        self.queues[(vhost, name)] = make_queue_machine(vhost, name, backing=backing, durable=durable, settings=settings)

    def _sync_outcome_from_thread(self, ticket: int, mark) -> None:
        # Called by the syncer thread: hop to the trio loop (one hop per fsync, not per message).
        try:
            self._call_soon(self.on_sync, ticket, mark)
        except RuntimeError:
            pass  # the loop is closing

    def on_sync(self, ticket: int, mark) -> None:
        """The syncer's outcome for `ticket`: durable up to the store's `mark`, or failed (None)."""
        if mark is None:
            self.on_sync_failed(ticket)
        else:
            self.store.synced(mark)
            self.on_durable(ticket)

    def on_sync_failed(self, ticket: int) -> None:
        """The store failed before the writes of tickets up to `ticket` were durable: every
        publish still waiting on one of them gets basic.nack, in order (a confirm means stored)."""
        nacked = 0
        for channel, waiting in list(self.confirm_waiters.items()):
            session = channel.session
            live = session.channels.get(channel.number) is channel
            while waiting and waiting[0][0] <= ticket:
                _, seq, outcomes = waiting.popleft()
                if not live:
                    continue
                if outcomes is None:  # everything up to seq not confirmed yet on this channel
                    session.conn.send_method(channel.number, spec.BasicNack(delivery_tag=seq, multiple=True))
                else:
                    for one, _acked in outcomes:
                        session.conn.send_method(channel.number, spec.BasicNack(delivery_tag=one, multiple=False))
                nacked += 1
                session.wake()
            if not waiting:
                del self.confirm_waiters[channel]
        if nacked:
            log.warning("nacked the publishes of %d batches: the store failed before they were durable", nacked)

    def defer_confirms(self, channel, ticket: int | None, last_seq: int, outcomes: list | None = None) -> None:
        """Hold a channel's confirms up to `last_seq` until `ticket` is durable (None: behind the last one).
        `outcomes`, [(seq, acked)], when some were refused (reject-publish): each is sent alone."""
        waiting = self.confirm_waiters.get(channel)
        if waiting is None:
            waiting = self.confirm_waiters[channel] = deque()
        if ticket is None:
            ticket = waiting[-1][0] if waiting else 0
        waiting.append((ticket, last_seq, outcomes))

    def on_durable(self, ticket: int) -> None:
        for channel, waiting in list(self.confirm_waiters.items()):
            last_seq = None
            session = channel.session
            # The channel may have closed (and its number been reused) while the sync ran.
            live = session.channels.get(channel.number) is channel
            while waiting and waiting[0][0] <= ticket:
                _, seq, outcomes = waiting.popleft()
                if outcomes is None:
                    last_seq = seq
                elif live:
                    # Some were nacked: no `multiple` ack may cover them.
                    if last_seq is not None:
                        session.conn.send_method(channel.number, spec.BasicAck(delivery_tag=last_seq, multiple=True))
                        last_seq = None
                    for one, acked in outcomes:
                        method = spec.BasicAck if acked else spec.BasicNack
                        session.conn.send_method(channel.number, method(delivery_tag=one, multiple=False))
                    session.wake()
            if not waiting:
                del self.confirm_waiters[channel]
            if last_seq is not None and live:
                session.conn.send_method(channel.number, spec.BasicAck(delivery_tag=last_seq, multiple=True))
                session.wake()

    def close(self) -> None:
        if self.syncer is not None:
            self.syncer.close()
        if self.store is not None:
            self.store.close()

    # --------------------------------------------------------------- apply

    def apply_meta(self, command, replaying: bool = False, queue_id: int | None = None) -> Any:
        """Apply a metadata command; a refusal becomes a ChannelError for the caller to raise."""
        kind = type(command)
        log_it = False
        if not replaying and self.metadata_log is not None:
            if kind is md.DeclareExchange:
                # Only a new exchange is logged: clients redeclare on every start.
                log_it = self.meta.exchange(command.vhost, command.name) is None and persistence.concerns_durable(
                    self.meta, command, before=False)
            elif kind is not md.DeclareQueue:
                log_it = persistence.concerns_durable(self.meta, command, before=True)
        reply, effects = self.meta.apply(self.log.stamp(), command)
        try:
            self._perform_meta(command, kind, reply, effects, replaying, queue_id, log_it)
        except StoreFailed as exc:
            # Applied and kept in the store's redo log (storage/guarded.py), but not durable.
            raise ChannelError(541, f"the message store cannot write ({exc}): "
                                    f"{kind.__name__} is not stored yet") from None
        return reply

    def _perform_meta(self, command, kind, reply, effects: list, replaying: bool, queue_id: int | None,
                      log_it: bool) -> None:
        for effect in effects:
            if type(effect) is md.QueueCreated:
                self._new_queue(effect.vhost, effect.name, queue_id)
            # (a cluster member creates queue machines from its shards' logs: cluster.py)
            elif type(effect) is md.QueueDeleted:
                self._queue_deleted((effect.vhost, effect.name))
            elif type(effect) is md.PolicyChanged:
                policies.apply_policies(self, effect.vhost)
        if type(reply) is Rejected:
            raise ChannelError(reply.reply_code, reply.reply_text)
        if not replaying and self.metadata_log is not None:
            queue_id = None
            if kind is md.DeclareQueue and effects and type(effects[0]) is md.QueueCreated:
                log_it = persistence.concerns_durable(self.meta, command, before=False)
                queue_id = self.queue_ids[(command.vhost, command.name)]
            elif kind is md.Bind or kind is md.Unbind:
                log_it = log_it or persistence.concerns_durable(self.meta, command, before=False)
            if log_it:
                self.metadata_log.append(command, queue_id)
            if kind is md.DeclareExchange:
                if command.durable and command.auto_delete and not command.passive:
                    self.durable_auto_delete[(command.vhost, command.name)] = None
            elif self.durable_auto_delete and kind is not md.DeclareQueue and kind is not md.Bind:
                self._log_cascaded_exchange_deletes()
            if self.metadata_log.needs_snapshot:
                self.metadata_log.write_snapshot(persistence.snapshot_entries(self.meta, self.queue_ids))

    def _log_cascaded_exchange_deletes(self) -> None:
        """Log the durable auto-delete exchanges that a command deleted as a side effect.

        RabbitMQ deletes an auto-delete exchange when its last binding goes, also when that
        binding went because its (transient) queue went. Commands about transient things are not
        logged, so their cascades would not be replayed and the exchange would come back at the
        next start; a DeleteExchange is logged for each instead. Only durable auto-delete
        exchanges can be concerned, so only those (usually none) are looked at.
        """
        for key in list(self.durable_auto_delete):
            record = self.meta.exchange(*key)
            if record is None or not (record.durable and record.auto_delete):
                del self.durable_auto_delete[key]
                if record is None:
                    self.metadata_log.append(md.DeleteExchange(key[0], key[1], False))

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
                elif self.cluster is None:
                    log.warning("delivery for unknown consumer %s dropped by this node", effect.consumer_id)
                # In a cluster every replica decides every delivery; only the consumer's node sends it.
            else:
                dead_letter.perform_effect(self, effect)

    # ------------------------------------------------- calls and casts
    #
    # What channels use. `then(reply)` gets the machine's reply: at once on a single node, after
    # the command has committed and been applied here in a cluster (the cluster log calls it, and
    # `Unavailable` stands in for the reply when the command could not be committed). A cast
    # wants no reply. The same channel code runs either way.

    def meta_call(self, command, then) -> None:
        refusal = persistence.unstorable(command)
        if refusal is not None:
            then(refusal)
            return
        if self.cluster is not None:
            self.cluster.submit(None, command, then)
        else:
            then(self.apply_meta(command))

    def queue_call(self, queue_key: tuple, command, then) -> None:
        if self.cluster is not None:
            self.cluster.submit(queue_key, command, then)
            return
        queue = self.queues.get(queue_key)
        if queue is None:
            then(Rejected(404, f"no queue '{queue_key[1]}' in vhost '{queue_key[0]}'"))
            return
        if type(command) is qc.Sync:  # a single node's machines are always up to date
            then(None)
            return
        reply, effects = queue.apply(self.log.stamp(), command)
        try:
            then(reply)  # before the effects: consume-ok goes out ahead of the first delivery
        finally:
            if effects:
                self.perform(effects)

    def queue_cast(self, queue_key: tuple, command) -> None:
        if self.cluster is not None:
            self.cluster.submit(queue_key, command, None)
        else:
            self.apply_queue(queue_key, command)

    def declare_queue(self, command: md.DeclareQueue, then) -> None:
        refusal = persistence.unstorable(command)
        if refusal is not None:
            then(refusal)
            return
        if self.cluster is not None:
            self.cluster.declare_queue(command, then)
        else:
            then(self.apply_meta(command))

    # --------------------------------------------------------------- queues

    def delete_queue(self, queue_key: tuple, then=None) -> None:
        """Delete a queue: its messages, its record and bindings; its consumers are told.
        `then(message count)`."""
        def record_gone(count) -> None:
            def done(reply) -> None:
                if then is not None:
                    then(count if isinstance(count, int) and not isinstance(count, bool) else 0)
            self.meta_call(md.DeleteQueueRecord(*queue_key), done)
        self.queue_call(queue_key, qc.DeleteQueue(), record_gone)

    def _queue_deleted(self, queue_key: tuple) -> None:
        queue = self.queues.pop(queue_key, None)
        self.queue_ids.pop(queue_key, None)
        if queue is not None and not queue.deleted:
            queue.apply(self.log.stamp(), qc.DeleteQueue())
        for handle in [h for h in self.consumers.values() if h.queue_key == queue_key]:
            del self.consumers[handle.consumer_id]
            handle.channel.consumer_gone(handle)

    def maybe_auto_delete(self, queue_key: tuple, then=None) -> None:
        """RabbitMQ: an auto-delete queue goes when its last consumer is cancelled or gone.
        `then(deleted)` once it has gone (or at once, False, when it stays)."""
        queue = self.queues.get(queue_key)
        record = self.meta.queue(*queue_key)
        if queue is not None and record is not None and record.auto_delete and queue.ever_had_consumer \
                and queue.active_consumer_count == 0:
            self.delete_queue(queue_key, None if then is None else lambda _count: then(True))
        elif then is not None:
            then(False)

    def owner_down(self, owner: str, queue_keys: list, connection_id: str | None = None) -> None:
        """A channel or connection closed: release its consumers everywhere (their unacked
        messages come back), drop the auto-delete queues it leaves without consumers, and for a
        connection its exclusive queues."""
        for queue_key in queue_keys:
            if queue_key in self.queues or self.cluster is not None:
                self.queue_call(queue_key, qc.Down(owner), lambda _reply, key=queue_key: self.maybe_auto_delete(key))
        if connection_id is not None:
            self.meta_call(md.OwnerDown(connection_id), _ignore)

    @staticmethod
    def generate_name(prefix: str) -> str:
        return prefix + secrets.token_urlsafe(16)
