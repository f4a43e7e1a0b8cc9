"""The broker of one node: its machines, the log they are applied from, and their effects.

Theory of operation: the broker holds the machines of every group this node applies (the
metadata group and its shards: machines/shard.py), an index of the queue machines by key, the
store, and what the connections registered (consumers, direct reply-to waiters, sessions). It
applies nothing itself: every change is submitted to the node's log (`log`: local_log.py on a
single node, cluster.py in a cluster), which applies it through the one apply path
(applier.py) and calls back here: `queue_added` / `queue_removed` keep the index, `perform`
carries out the queue machines' effects (a `Deliver` to a consumer whose channel is on this
node; dead letters and expiry, dead_letter.py). The broker knows nothing of sockets or trio:
sessions call it synchronously and it calls back into their channels, which only append frames
to buffers. So one publish, from frames to the consumer's buffer, runs without an `await` on a
single node.

Storage: a single node's queues write their messages to the store (message_store.py) and its
durable topology goes to a metadata log (persistence.py); recovery.py rebuilds both at start.
A cluster member's Raft log is its durable record; its store only takes what overflows memory.
"""

from __future__ import annotations

import logging
import secrets
import time
from operator import attrgetter
from typing import Any, NamedTuple

from ..amqp.frames import encode_shortstr_field
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.metadata import META_GROUP
from ..machines.queue import QueueMachine
from ..machines.queue_args import QueueSettings, settings_or_default
from ..machines.queue_types import Deliver, QueueCounts
from . import dead_letter, persistence
from .message_rates import CONNECTION_COUNTS, EXCHANGE_COUNTS, QUEUE_COUNTS, KeyedRates, MessageRates
from .message_store import WalSyncer
from .publish_rates import PublishRates
from .queue_stats import QueueStats, from_record
from .queue_timers import QueueTimers
from .queue_wakeups import QueueWakeups
from .trace_store import MemoryKV, TraceLog
from .tracer import Tracer

log = logging.getLogger("maxq.broker")
_REDELIVERED = attrgetter("redelivered")  # of a Deliver effect


class ConsumerHandle:
    """Where a consumer lives: the channel that sends its deliveries."""

    __slots__ = ("consumer_id", "tag", "channel", "queue_key", "no_ack", "wire_tag", "exclusive", "arguments")

    def __init__(
        self,
        consumer_id: str,
        tag: str,
        channel: Any,
        queue_key: tuple,
        no_ack: bool,
        exclusive: bool = False,
        arguments: dict | None = None,
    ) -> None:
        self.consumer_id = consumer_id
        self.tag = tag
        self.wire_tag = encode_shortstr_field(tag)  # encoded once, written with every delivery
        self.channel = channel
        self.queue_key = queue_key
        self.no_ack = no_ack
        self.exclusive = exclusive  # (as basic.consume asked: shown by the management API)
        self.arguments = arguments or {}


def _ignore(_reply) -> None:
    pass


class SettingsOnly(NamedTuple):
    """What the shell's settings indexes read of a queue machine (`.settings`), for a queue
    whose machine is on other members."""

    settings: QueueSettings


class Broker:
    def __init__(self, node_id: str, store=None, fsync: bool = True) -> None:
        self.node_id = node_id
        self.store = store
        self.fsync = fsync
        self.log: Any = None  # LocalLog or ClusterLog: `attach`
        self.groups: dict[str, Any] = {}  # group name -> MetaGroup / ShardMachine
        self.queues: dict[tuple[str, str], QueueMachine] = {}  # every queue machine of every shard
        self.queue_ids: dict[tuple[str, str], int] = {}  # the store's key prefix of each queue
        self.epoch = 0
        self.next_queue_id = 1
        self.syncer: WalSyncer | None = None
        self.alarms = None  # ResourceAlarms, set by the shell
        self.message_rates = MessageRates()  # sampled by a task of the shell (message_rates.py)
        self.queue_rates = KeyedRates(QUEUE_COUNTS)  # each queue's, sampled by the same task
        self.exchange_rates = KeyedRates(EXCHANGE_COUNTS)  # each exchange's, likewise
        self.connection_rates = KeyedRates(CONNECTION_COUNTS)  # each connection's, likewise
        # (vhost, exchange) -> [published, routed] of closed connections and HTTP publishes
        self.exchange_counts: dict[tuple[str, str], list[int]] = {}
        # What this node listens on, as RabbitMQ names protocols ("amqp", "http", ...): port.
        self.listeners: dict[str, int] = {}  # set by the shell once bound
        self.consumers: dict[str, ConsumerHandle] = {}
        # The counts of queues of groups this member holds no replica of, from the last reply to
        # a Sync of each (`note_counts`): read right after one, by declare-ok and delete.
        self.synced_counts: dict[tuple[str, str], QueueCounts] = {}
        # The counts of those queues as their group's leader last sent them (queue_stats.py),
        # for the management API: every queue is listed on every member.
        self.remote_stats: dict[tuple[str, str], QueueStats] = {}
        self.reply_to: dict[str, Any] = {}  # direct reply-to key -> channel
        self.sessions: dict[str, Any] = {}  # open connections (past connection.open), by id
        self.queue_timers = QueueTimers()  # the queues the ticker looks at (queue_timers.py)
        self.queue_wakeups = QueueWakeups()  # SQS long polls waiting for a queue (queue_wakeups.py)
        self.publish_rates = PublishRates()  # x-publish-rate-limit buckets (publish_rates.py)
        self.tracer = Tracer(TraceLog(MemoryKV()))  # x-trace (tracer.py); the shell gives it its store
        self.live_sessions: dict = {}  # every connection task, handshaking ones too
        self.send_now: list = []  # sessions written to in this pass of the loop (Session.send_soon)
        self.started_at = time.time()
        self.messages_published = 0  # copies enqueued: a message routed to three queues counts three
        self.messages_delivered = 0  # to consumers (basic.deliver), on this node
        # Monotonic counters for the Prometheus endpoint (http/metrics.py), each counted where it
        # happens, per batch where there is one. Per-message ones kept by each connection
        # (Session.messages_in, messages_routed) are added here when it closes (`*_closed`);
        # closed connections and channels are derived at scrape time (opened - open now).
        self.messages_delivered_auto_ack = 0  # of messages_delivered, to no-ack consumers
        self.messages_redelivered = 0  # delivered (consumed or got) with the redelivered flag
        self.messages_got_auto_ack = 0  # basic.get, no_ack
        self.messages_got_manual_ack = 0
        self.messages_get_empty = 0
        self.messages_acknowledged = 0  # basic.ack'ed deliveries (reject and nack are not counted)
        self.messages_received_confirm = 0  # published on channels in confirm mode
        self.messages_confirmed = 0  # basic.ack'ed to publishers
        self.messages_unroutable_dropped = 0
        self.messages_unroutable_returned = 0
        self.messages_received_closed = 0  # Session.messages_in of the connections now closed
        self.messages_routed_closed = 0  # Session.messages_routed, likewise
        self.messages_received_http = 0  # published through the management API (not SQS sends)
        self.messages_routed_http = 0  # of those, routed to at least one queue
        # The SQS API's (http/sqs_actions.py), counted per request: messages sent and stored,
        # received, receives that found none, and deleted (each a delete of the latest receive).
        self.sqs_sent = 0
        self.sqs_received = 0
        self.sqs_received_empty = 0
        self.sqs_deleted = 0
        self.connections_opened = 0
        self.channels_opened = 0
        self.queues_created = 0  # queue machines added on this node (every replica adds each queue)
        self.queues_deleted = 0

    def add_exchange_counts(self, vhost: str, totals: dict[str, tuple[int, int]]) -> None:
        """Keep a closing connection's (or an HTTP publish's) per-exchange (published, routed)."""
        kept = self.exchange_counts
        for name, (published, routed) in totals.items():
            counts = kept.setdefault((vhost, name), [0, 0])
            counts[0] += published
            counts[1] += routed

    def forget_gone_exchanges(self, seen: dict[tuple[str, str], Any]) -> None:
        """Drop the counts of exchanges deleted since (`seen`: the keys just counted), here and
        in each connection's, so that churned names do not pile up."""
        exchange = self.meta.exchange
        gone = {key for key in seen if exchange(*key) is None}
        if not gone:
            return
        for key in gone:
            self.exchange_counts.pop(key, None)
        for session in self.sessions.values():
            names = {name for vhost, name in gone if vhost == session.vhost}
            if names:
                session.forget_exchanges(names)

    @staticmethod
    def clock_ms() -> int:
        return int(time.time() * 1000)

    def attach(self, log_) -> None:
        """Apply from `log_` (LocalLog or ClusterLog), with fresh machines for its groups."""
        self.log = log_
        self.groups = log_.make_groups(log_.make_queue)
        self.queues.clear()
        self.queue_ids.clear()

    @property
    def meta(self) -> md.MetadataMachine:
        return self.groups[META_GROUP].machine

    def open_for_cluster(self) -> None:
        """A cluster member's store holds only what overflowed memory in an earlier life: the
        Raft log is replayed into fresh machines, so whatever is here goes."""
        store = self.store
        self.epoch = int.from_bytes(store.get_meta(persistence.EPOCH_KEY) or b"\0", "big") + 1
        store.write((), (), {persistence.EPOCH_KEY: self.epoch.to_bytes(8, "big")}, wal=True)
        for queue_id in store.queue_ids():
            store.drop_queue(queue_id)

    def close(self) -> None:
        if self.syncer is not None:
            self.syncer.close()
        if self.store is not None:
            self.store.close()
        self.tracer.log.close()

    # --------------------------------------------------------------- effects

    def queue_settings_changed(self, key: tuple[str, str], machine: QueueMachine | None) -> None:
        """The shell's indexes of queue settings (x-publish-rate-limit, x-trace) and the ticker's
        (queue_timers.py) read the queue's machine again: made, deleted (None), its settings
        changed, or installed from a snapshot."""
        elsewhere = self.settings_elsewhere(key) if machine is None else None
        if elsewhere is not None:
            self.publish_rates.settings_changed(key, SettingsOnly(elsewhere))  # (its publishers here)
        else:
            self.publish_rates.settings_changed(key, machine)
        self.tracer.settings_changed(key, machine, elsewhere)  # (x-trace: its publishers here too)
        self.queue_timers.touch(key)

    def queue_records_changed(self, vhost: str, name: str | None = None) -> None:
        """A queue's record (`name`), or the policies of `vhost`, changed in the metadata: the
        settings of queues whose machines are elsewhere are read again (those here follow their
        machines)."""
        record = self.meta.vhosts.get(vhost)
        names = [name] if name is not None else list(record.queues) if record is not None else []
        for queue_name in names:
            if (vhost, queue_name) not in self.queues:
                self.queue_settings_changed((vhost, queue_name), None)

    def queue_added(self, key: tuple[str, str], machine: QueueMachine) -> None:
        self.queues[key] = machine
        self.queues_created += 1
        self.queue_settings_changed(key, machine)

    def queue_removed(self, key: tuple[str, str], machine: QueueMachine) -> None:
        """Its shard deleted the queue (its machine dropped its stored messages): its consumers'
        channels are told (basic.cancel to those that asked for it)."""
        if self.queues.get(key) is machine:
            del self.queues[key]
            self.queue_ids.pop(key, None)
            self.queues_deleted += 1
            self.queue_settings_changed(key, None)
        self.queue_consumers_gone(key)

    def queue_record_deleted(self, key: tuple[str, str], group: str | None) -> None:
        """The metadata deleted the record of queue `key` (of `group`, if it named one). If its
        machine is not here, this member's consumers of it are told now, as for the deletion
        (`queue_consumers_gone`): the word of it from the group's leader ("q", server/remote.py)
        is lost with a link that drops, and the resync after the gap does not carry it, so they
        stayed, consuming nothing. Told already, none are left. Each also cancels in its group:
        one that reached, through the record before this member applied its deletion, a queue
        declared again there under the name would otherwise keep its messages checked out to a
        consumer no channel has, until its channel closed."""
        if key in self.queues:
            return  # (its machine here tells them when its shard deletes it)
        for handle in self.queue_consumers_gone(key):
            self.log.submit(key, qc.Cancel(handle.consumer_id), None, group)

    def queue_consumers_gone(self, key: tuple[str, str]) -> list[ConsumerHandle]:
        """The queue was deleted: this node's consumers of it are told (and returned)."""
        self.synced_counts.pop(key, None)
        self.remote_stats.pop(key, None)
        gone = [h for h in self.consumers.values() if h.queue_key == key]
        for handle in gone:
            del self.consumers[handle.consumer_id]
            handle.channel.consumer_gone(handle)
        return gone

    def perform(self, effects: list) -> None:
        # Deliveries go in runs to one consumer (a queue serves a consumer many at a time), and
        # each run is written as one (Channel.deliver_run): the order of all effects is kept.
        run: list = []
        for effect in effects:
            if type(effect) is Deliver:
                if run and effect[0] is not run[0][0] and effect[0] != run[0][0]:
                    self._deliver_run(run)
                    run = []
                run.append(effect)
            else:
                if run:
                    self._deliver_run(run)
                    run = []
                dead_letter.perform_effect(self, effect)
        if run:
            self._deliver_run(run)

    def _deliver_run(self, run: list) -> None:
        # Every replica decides every delivery; only the consumer's node sends it.
        handle = self.consumers.get(run[0][0])
        if handle is None:
            return
        handle.channel.deliver_run(handle, run)
        self.messages_delivered += len(run)
        if handle.no_ack:
            self.messages_delivered_auto_ack += len(run)
        self.messages_redelivered += sum(map(_REDELIVERED, run))

    # ------------------------------------------------- calls and casts
    #
    # What channels use. `then(reply)` gets the machine's reply once the command is applied here:
    # at once on a single node, after it has committed in a cluster (`Unavailable` stands in for
    # the reply when it could not be committed). A cast wants no reply. The same channel code
    # runs either way.

    def meta_call(self, command, then) -> None:
        refusal = persistence.unstorable(command)
        if refusal is not None:
            then(refusal)
            return
        self.log.submit(None, command, then)

    def queue_call(self, queue_key: tuple, command, then) -> None:
        self.log.submit(queue_key, command, then)

    def queue_cast(self, queue_key: tuple, command) -> None:
        self.log.submit(queue_key, command, None)

    def send_queued(self) -> None:
        """Send what this pass of the loop wrote to connections (Session.send_soon). Called
        from `run_sync_soon` callbacks too, where an exception would end the node: a failure
        here is logged and left to the connection's writer, which is woken for it."""
        queued = self.send_now
        if queued:
            self.send_now = []
            for session in queued:
                try:
                    session.send_now()
                except Exception:
                    log.exception("sending straight to connection %s failed", session.id)
                    session.wake()

    def declare_queue(self, command: md.DeclareQueue, then) -> None:
        refusal = persistence.unstorable(command)
        if refusal is not None:
            then(refusal)
            return
        self.log.declare_queue(command, then)

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

    def note_counts(self, queue_key: tuple, reply: Any) -> None:
        """A Sync's reply: kept for a queue whose machine is not here (`queue_view`)."""
        if type(reply) is QueueCounts and queue_key not in self.queues:
            self.synced_counts[queue_key] = reply
        elif queue_key in self.synced_counts and self.meta.queue(*queue_key) is None:
            del self.synced_counts[queue_key]

    def overflow_of(self, queue_key: tuple) -> str:
        """A queue's x-overflow where its machine is not (a group held elsewhere): from its record
        and the policies, as its machine has it (a publish's confirm waits for the reply only when
        a reject-publish queue may refuse it); "" when there is no record."""
        settings = self.record_settings(queue_key)
        return "" if settings is None else settings.overflow

    def record_settings(self, queue_key: tuple) -> QueueSettings | None:
        """A queue's settings from its record's arguments under the policies, as its machine has
        them (the machine takes them from the same, by UpdateSettings); None without a record."""
        record = self.meta.queue(*queue_key)
        if record is None:
            return None
        arguments = self.meta.arguments_under_policies(queue_key[0], queue_key[1], record.arguments)
        return settings_or_default(queue_key[0], queue_key[1], arguments)

    def settings_elsewhere(self, queue_key: tuple) -> QueueSettings | None:
        """`record_settings` of a queue whose machine is on other members only (its group held
        elsewhere, issue #19), for what this member's shell does by them (a redeclare's x-expires
        touch, x-publish-rate-limit); None for a queue of a group held here, or without a record."""
        if queue_key in self.queues or self.log.holds_queue(queue_key):
            return None
        return self.record_settings(queue_key)

    def take_queue_stats(self, node: str, records: list) -> None:
        """Counts `node` (a group's leader) sent of its queues, kept for those whose machine is
        not here and whose record is (ValueError on a malformed record: the rest are kept)."""
        bad = None
        for record in records:
            try:
                key, stats = from_record(node, record)
            except ValueError as exc:
                bad = exc
                continue
            if key not in self.queues and self.meta.queue(*key) is not None:
                self.remote_stats[key] = stats
        if bad is not None:
            raise bad

    def shown_queue(self, key: tuple[str, str]) -> Any:
        """What the management API shows of a queue: its machine here, else the counts its
        group's leader last sent (zeros until the first come); None when there is no such queue."""
        queue = self.queues.get(key)
        if queue is not None:
            return queue
        if self.meta.queue(*key) is None:
            self.remote_stats.pop(key, None)
            return None
        return self.remote_stats.get(key) or QueueStats("")

    def shown_queues(self, vhost: str | None = None) -> list[tuple[tuple[str, str], Any]]:
        """Every queue of the cluster (of `vhost`), each with `shown_queue`'s view: those held
        here first, as before, then those of groups held elsewhere."""
        out: list[tuple[tuple[str, str], Any]] = [
            (key, queue) for key, queue in self.queues.items() if vhost is None or key[0] == vhost
        ]
        if len(self.queues) < sum(len(v.queues) for v in self.meta.vhosts.values()):
            for name_of_vhost, record in self.meta.vhosts.items():
                if vhost is not None and name_of_vhost != vhost:
                    continue
                for name in record.queues:
                    key = (name_of_vhost, name)
                    if key not in self.queues:
                        out.append((key, self.remote_stats.get(key) or QueueStats("")))
        return out

    def queue_view(self, queue_key: tuple) -> Any:
        """The queue's machine, or for a queue of a group held elsewhere the counts its last Sync
        replied (both have ready_count, active_consumer_count, ever_had_consumer), or None."""
        queue = self.queues.get(queue_key)
        return queue if queue is not None else self.synced_counts.get(queue_key)

    def maybe_auto_delete(self, queue_key: tuple, then=None) -> None:
        """RabbitMQ: an auto-delete queue goes when its last consumer is cancelled or gone.
        `then(deleted)` once it has gone (or at once, False, when it stays)."""
        queue = self.queues.get(queue_key)
        record = self.meta.queue(*queue_key)
        if queue is None and record is not None and record.auto_delete and not self.log.holds_queue(queue_key):
            # Its group is held elsewhere: its leader's counts decide, once it has applied the
            # cancel or close that called us.
            def synced(reply: Any) -> None:
                self.note_counts(queue_key, reply)
                if type(reply) is QueueCounts and reply.ever_had_consumer and reply.active_consumer_count == 0:
                    self.delete_queue(queue_key, None if then is None else lambda _count: then(True))
                elif then is not None:
                    then(False)

            self.queue_call(queue_key, qc.Sync(), synced)
            return
        if (
            queue is not None
            and record is not None
            and record.auto_delete
            and queue.ever_had_consumer
            and queue.active_consumer_count == 0
        ):
            self.delete_queue(queue_key, None if then is None else lambda _count: then(True))
        elif then is not None:
            then(False)

    def owner_down(self, owner: str, queue_keys: list, connection_id: str | None = None) -> None:
        """A channel or connection closed: release its consumers everywhere (their unacked
        messages come back), drop the auto-delete queues it leaves without consumers, and for a
        connection its exclusive queues."""
        for queue_key in queue_keys:
            self.queue_call(queue_key, qc.Down(owner), lambda _reply, key=queue_key: self.maybe_auto_delete(key))
        if connection_id is not None:
            self.meta_call(md.OwnerDown(connection_id), _ignore)

    def close_vhost_connections(self, vhost: str) -> None:
        """A vhost was deleted: this node's connections to it go (RabbitMQ: 320 CONNECTION_FORCED)."""
        for session in list(self.sessions.values()):
            if session.vhost == vhost:
                session.force_close(f"vhost '{vhost}' is deleted")

    @staticmethod
    def generate_name(prefix: str) -> str:
        return prefix + secrets.token_urlsafe(16)
