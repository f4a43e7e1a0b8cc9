"""The node's metrics in Prometheus's text exposition format 0.0.4: what `/metrics` serves.

Theory of operation: `render` is a pure function from the broker's in-memory state (and a
process sample and the Raft groups' status, both read by the caller, which does the I/O) to
the text a Prometheus server scrapes. The families are built with prometheus_client's metric
families and written by its `generate_latest`, so HELP/TYPE lines, label escaping and the
`_total` suffix of counters are the library's (docs/design.md §1).

Names: RabbitMQ's (its rabbitmq_prometheus plugin) wherever we count the same thing, so its
Grafana dashboards and alert rules work unchanged; `maxq_` for what is ours (the Raft groups'
lag and leadership, the store's health). As RabbitMQ's plugin does, `/metrics` aggregates
(one sample per family, no per-queue labels) and `/metrics/per-object` labels each queue with
`vhost` and `queue`. The Raft groups are few (the metadata group and the shards), so both
label them with `raft_group`.

In a cluster every member applies every queue, but only the leader of a queue's shard group
reports it (as RabbitMQ reports a quorum queue from its leader): summing a family over the
nodes counts each queue once.

Counters are monotonic while the node runs (they start at 0 with the process, as RabbitMQ's).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.utils import floatToGoString

from .. import __version__
from ..server.message_rates import node_counts

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROTOCOL = "amqp091"
SQS_PROTOCOL = "sqs"  # the SQS API's counts: a protocol of its own, as RabbitMQ labels MQTT's or STOMP's
# RabbitMQ labels per-queue-type counters with its queue type; ours is one type of its own.
QUEUE_TYPE = "maxq_queue"
# There is no cluster name setting yet: every node says the same, so dashboards that join on
# rabbitmq_identity_info's rabbitmq_cluster group the nodes together (docs/operations.md).
CLUSTER_NAME = "maxq"


@dataclass(frozen=True)
class ProcessSample:
    """What the caller read from the operating system for this scrape."""

    resident_memory_bytes: int
    open_fds: int
    max_fds: int
    disk_free_bytes: int
    store: dict[str, int] = field(default_factory=dict)  # the message store's usage() figures


STORE_FIGURES = (
    ("sst_bytes", "Bytes of the message store's SST files on disk (RocksDB)"),
    ("memtable_bytes", "Bytes of the message store's memtables (RocksDB; bounded by its settings)"),
    ("block_cache_bytes", "Bytes in the message store's block cache (RocksDB; at most 16 MiB)"),
    ("redo_bytes", "Bytes written but not yet durable, kept to redo after a store failure"),
)


def render(broker: Any, process: ProcessSample, raft_groups: dict[str, dict] | None, per_object: bool = False) -> bytes:
    """The exposition text of `broker`'s node. `raft_groups` is ReplicationNode.status() (None on a
    single node, or when the engine did not answer: the Raft families are then left out)."""
    families = list(_families(broker, process, raft_groups, per_object))
    return generate_latest(_Families(families))


class _Families:
    """A collector over ready-made families: what generate_latest walks."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def _counter(name: str, help_text: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = CounterMetricFamily(name, help_text, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _gauge(name: str, help_text: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _untyped(name: str, help_text: str, value: float) -> Metric:
    family = UnknownMetricFamily(name, help_text)
    family.add_metric([], value)
    return family


def _families(
    broker: Any, process: ProcessSample, raft_groups: dict[str, dict] | None, per_object: bool
) -> Iterator[Metric]:
    yield from _identity(broker)
    yield from _global_counters(broker)
    yield from _objects(broker)
    yield from _process(broker, process)
    yield from _queues(broker, per_object)
    if getattr(broker, "syncer", None) is not None:
        yield from _store_sync(broker.syncer)
    if raft_groups is not None:
        yield from _raft(broker.node_id, raft_groups)


def _identity(broker: Any) -> Iterator[Metric]:
    yield _gauge(
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        1,
        {"rabbitmq_node": broker.node_id, "rabbitmq_cluster": CLUSTER_NAME},
    )
    yield _gauge(
        "maxq_build_info",
        "MaxQ-Raft and Python versions",
        1,
        {"version": __version__, "python_version": ".".join(map(str, sys.version_info[:3]))},
    )


def _global_counters(broker: Any) -> Iterator[Metric]:
    """RabbitMQ's rabbitmq_global_messages_* families, a sample per protocol: AMQP 0-9-1 (with
    the management API's publishes and gets, as RabbitMQ counts them) and the SQS API, whose
    sends are confirmed publishes, received messages gets waiting for their ack (a delete)."""
    sessions = broker.sessions.values()
    received = node_counts(broker)["publish"] - broker.sqs_sent
    routed = broker.messages_routed_closed + broker.messages_routed_http + sum(s.messages_routed for s in sessions)
    consumed = broker.messages_delivered
    auto_ack = broker.messages_delivered_auto_ack
    got_auto, got_manual = broker.messages_got_auto_ack, broker.messages_got_manual_ack
    sent, got_sqs = broker.sqs_sent, broker.sqs_received
    g = "rabbitmq_global_messages_"
    # (name, help, AMQP's count, SQS's count, labelled with the queue type as RabbitMQ's is)
    for name, help_text, amqp, sqs, by_type in (
        ("received_total", "Total number of messages received from publishers", received, sent, False),
        (
            "received_confirm_total",
            "Total number of messages received from publishers expecting confirmations",
            broker.messages_received_confirm,
            sent,
            False,
        ),
        ("routed_total", "Total number of messages routed to queues or streams", routed, sent, False),
        (
            "unroutable_dropped_total",
            "Total number of messages published as non-mandatory into an exchange and dropped as unroutable",
            broker.messages_unroutable_dropped,
            0,
            False,
        ),
        (
            "unroutable_returned_total",
            "Total number of messages published as mandatory into an exchange and returned to the publisher as "
            "unroutable",
            broker.messages_unroutable_returned,
            0,
            False,
        ),
        ("confirmed_total", "Total number of messages confirmed to publishers", broker.messages_confirmed, sent, False),
        (
            "delivered_total",
            "Total number of messages delivered to consumers",
            consumed + got_auto + got_manual,
            got_sqs,
            True,
        ),
        (
            "delivered_consume_auto_ack_total",
            "Total number of messages delivered to consumers using basic.consume with automatic acknowledgment",
            auto_ack,
            0,
            True,
        ),
        (
            "delivered_consume_manual_ack_total",
            "Total number of messages delivered to consumers using basic.consume with manual acknowledgment",
            consumed - auto_ack,
            0,
            True,
        ),
        (
            "delivered_get_auto_ack_total",
            "Total number of messages delivered to consumers using basic.get with automatic acknowledgment",
            got_auto,
            0,
            True,
        ),
        (
            "delivered_get_manual_ack_total",
            "Total number of messages delivered to consumers using basic.get with manual acknowledgment",
            got_manual,
            got_sqs,
            True,
        ),
        (
            "get_empty_total",
            "Total number of times basic.get operations fetched no message",
            broker.messages_get_empty,
            broker.sqs_received_empty,
            True,
        ),
        (
            "redelivered_total",
            "Total number of messages redelivered to consumers",
            broker.messages_redelivered,
            0,
            True,
        ),
        (
            "acknowledged_total",
            "Total number of messages acknowledged by consumers",
            broker.messages_acknowledged,
            broker.sqs_deleted,
            True,
        ),
    ):
        labels = ["protocol", "queue_type"] if by_type else ["protocol"]
        family = CounterMetricFamily(g + name, help_text, labels=labels)
        for protocol, value in ((PROTOCOL, amqp), (SQS_PROTOCOL, sqs)):
            family.add_metric([protocol, QUEUE_TYPE] if by_type else [protocol], value)
        yield family
    proto = {"protocol": PROTOCOL}
    yield _gauge("rabbitmq_global_consumers", "Consumers currently connected", len(broker.consumers), proto)


def _objects(broker: Any) -> Iterator[Metric]:
    sessions = broker.sessions
    channels = sum(len(s.channels) for s in sessions.values())
    yield _gauge("rabbitmq_connections", "Connections currently open", len(sessions))
    yield _counter("rabbitmq_connections_opened_total", "Total number of connections opened", broker.connections_opened)
    # Derived: every opened connection is in `sessions` until it closes (Session._release).
    yield _counter(
        "rabbitmq_connections_closed_total",
        "Total number of connections closed or terminated",
        broker.connections_opened - len(sessions),
    )
    yield _gauge("rabbitmq_channels", "Channels currently open", channels)
    yield _counter("rabbitmq_channels_opened_total", "Total number of channels opened", broker.channels_opened)
    yield _counter(
        "rabbitmq_channels_closed_total", "Total number of channels closed", broker.channels_opened - channels
    )
    yield _gauge("rabbitmq_consumers", "Consumers currently connected", len(broker.consumers))
    yield _counter(
        "rabbitmq_queues_created_total",
        "Total number of queues created (on a cluster member: queue machines added, every member adds each queue)",
        broker.queues_created,
    )
    yield _counter(
        "rabbitmq_queues_deleted_total",
        "Total number of queues deleted (on a cluster member: queue machines removed)",
        broker.queues_deleted,
    )


def _process(broker: Any, process: ProcessSample) -> Iterator[Metric]:
    alarms = broker.alarms
    yield _gauge("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", process.resident_memory_bytes)
    yield _gauge("rabbitmq_process_open_fds", "Open file descriptors", process.open_fds)
    yield _gauge("rabbitmq_process_max_fds", "Open file descriptors limit", process.max_fds)
    yield _gauge("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", process.disk_free_bytes)
    yield _gauge("maxq_uptime_seconds", "Seconds since this node started", max(0.0, time.time() - broker.started_at))
    for key, help_text in STORE_FIGURES:
        if key in process.store:
            yield _gauge("maxq_store_" + key, help_text, process.store[key])
    if alarms is None:
        return
    yield _gauge("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes", alarms.memory_limit_bytes)
    yield _gauge(
        "rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes", alarms.disk_limit_bytes
    )
    yield _untyped(
        "rabbitmq_alarms_memory_used_watermark", "is 1 if VM memory watermark alarm is in effect", alarms.memory_alarm
    )
    yield _untyped(
        "rabbitmq_alarms_free_disk_space_watermark",
        "is 1 if free disk space watermark alarm is in effect",
        alarms.disk_alarm,
    )
    yield _gauge(
        "maxq_alarms_store_write_failure",
        "is 1 while the message store cannot write (it raises the disk alarm too)",
        alarms.store_failure is not None,
    )


_QUEUE_FAMILIES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth"),
    ("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages"),
    ("rabbitmq_queue_messages_paged_out", "Messages paged out to disk"),
    ("rabbitmq_queue_consumers", "Consumers on a queue"),
)


def _reported_queues(broker: Any) -> list[tuple[tuple[str, str], Any]]:
    """The queues this node reports: on a cluster member those of the shards it leads."""
    log_ = broker.log
    if getattr(log_, "replication_node", None) is None:
        return list(broker.queues.items())
    leading: dict[str, bool] = {}
    out = []
    for key, queue in broker.queues.items():
        group = log_.group_of(key)
        leads = leading.get(group)
        if leads is None:
            leads = leading[group] = bool(log_.leads(group))
        if leads:
            out.append((key, queue))
    return out


def _queues(broker: Any, per_object: bool) -> Iterator[Metric]:
    queues = _reported_queues(broker)
    yield _gauge("rabbitmq_queues", "Queues available", len(queues))
    rows = []
    for (vhost, name), queue in queues:
        ready, unacked = queue.ready_count, queue.unacked_count
        rows.append(
            (
                vhost,
                name,
                (ready, unacked, ready + unacked, queue.ready_bytes, queue.spilled_count, queue.active_consumer_count),
            )
        )
    for i, (family_name, help_text) in enumerate(_QUEUE_FAMILIES):
        if per_object:
            family = GaugeMetricFamily(family_name, help_text, labels=["vhost", "queue"])
            for vhost, name, values in rows:
                family.add_metric([vhost, name], values[i])
        else:
            family = GaugeMetricFamily(family_name, help_text, value=sum(values[i] for _v, _n, values in rows))
        yield family


def _raft(node_id: str, groups: dict[str, dict]) -> Iterator[Metric]:
    """One sample per group (label raft_group), from group.Group.status(); a follower does not
    know its peers' match indexes, so the member lag is the leader's only."""
    label = ["raft_group"]
    term = CounterMetricFamily("rabbitmq_raft_term", "Current Raft term number", labels=label)
    commit = GaugeMetricFamily("rabbitmq_raft_log_commit_index", "Raft log commit index", labels=label)
    applied = GaugeMetricFamily("rabbitmq_raft_log_last_applied_index", "Raft log last applied index", labels=label)
    written = GaugeMetricFamily("rabbitmq_raft_log_last_written_index", "Raft log last written index", labels=label)
    snapshot = GaugeMetricFamily("rabbitmq_raft_log_snapshot_index", "Raft log snapshot index", labels=label)
    durable = GaugeMetricFamily("maxq_raft_log_durable_index", "Raft log index fsynced on this node", labels=label)
    apply_lag = GaugeMetricFamily(
        "maxq_raft_apply_lag_entries", "Entries committed but not yet applied on this node", labels=label
    )
    leader = GaugeMetricFamily("maxq_raft_group_leader", "is 1 if this node leads the group", labels=label)
    has_leader = GaugeMetricFamily("maxq_raft_group_has_leader", "is 1 if this node knows a leader", labels=label)
    failed = GaugeMetricFamily("maxq_raft_group_failed", "is 1 if the group failed on this node", labels=label)
    pending = GaugeMetricFamily("maxq_raft_pending_proposals", "Proposals waiting to commit", labels=label)
    saved = CounterMetricFamily("maxq_raft_snapshots_saved", "Snapshots this node saved", labels=label)
    installed = CounterMetricFamily("maxq_raft_snapshots_installed", "Snapshots installed from a leader", labels=label)
    syncs = CounterMetricFamily("maxq_raft_journal_fdatasyncs", "fdatasync calls of the group's journal", labels=label)
    sync_seconds = HistogramMetricFamily(
        "maxq_raft_journal_fdatasync_seconds", "How long the group's journal fdatasyncs took", labels=label
    )
    snapshot_bytes = GaugeMetricFamily(
        "maxq_raft_snapshot_bytes", "Bytes of the group's latest snapshot file on this node", labels=label
    )
    elections = CounterMetricFamily(
        "maxq_raft_elections_started",
        "Elections this node stood in for the group (terms in which it was seen as candidate)",
        labels=label,
    )
    leader_changes = CounterMetricFamily(
        "maxq_raft_leader_changes", "Times this node learnt of a new leader of the group", labels=label
    )
    member_lag = GaugeMetricFamily(
        "maxq_raft_member_lag_entries",
        "Entries a member's log is behind the leader's last index (on the leader only)",
        labels=["raft_group", "member"],
    )
    for name in sorted(groups):
        g = groups[name]
        v = [name]
        term.add_metric(v, g.get("term") or 0)
        commit.add_metric(v, g.get("commit_index") or 0)
        applied.add_metric(v, g.get("applied_index") or 0)
        written.add_metric(v, g.get("last_index") or 0)
        snapshot.add_metric(v, g.get("snapshot_index") or 0)
        durable.add_metric(v, g.get("durable_index") or 0)
        apply_lag.add_metric(v, max(0, (g.get("commit_index") or 0) - (g.get("applied_index") or 0)))
        leader.add_metric(v, g.get("leader") == node_id)
        has_leader.add_metric(v, g.get("leader") is not None)
        failed.add_metric(v, bool(g.get("failed")))
        pending.add_metric(v, g.get("pending_proposals") or 0)
        saved.add_metric(v, (g.get("group") or {}).get("snapshots_saved", 0))
        installed.add_metric(v, (g.get("group") or {}).get("snapshots_installed", 0))
        syncs.add_metric(v, (g.get("journal") or {}).get("fdatasyncs", 0))
        latency = g.get("fdatasync_seconds")
        if latency:
            buckets, sum_s = _histogram_buckets(latency)
            sync_seconds.add_metric(v, buckets, sum_s)
        snapshot_bytes.add_metric(v, g.get("snapshot_bytes") or 0)
        elections.add_metric(v, (g.get("group") or {}).get("elections_started", 0))
        leader_changes.add_metric(v, (g.get("group") or {}).get("leader_changes", 0))
        if g.get("leader") == node_id:
            for member, m in sorted((g.get("members") or {}).items()):
                if m.get("lag") is not None:
                    member_lag.add_metric([name, member], m["lag"])
    yield from (term, commit, applied, written, snapshot, durable, apply_lag, leader, has_leader, failed, pending)
    yield from (saved, installed, syncs, sync_seconds, snapshot_bytes, elections, leader_changes, member_lag)


def _histogram_buckets(latency: dict) -> tuple[list[tuple[str, float]], float]:
    """A histogram in group.Group.status()'s JSON form (`bounds_s`, `cumulative` with one more
    count for +Inf, `sum_s`) as HistogramMetricFamily takes it."""
    bounds = [floatToGoString(b) for b in latency["bounds_s"]] + ["+Inf"]
    return list(zip(bounds, latency["cumulative"], strict=True)), latency["sum_s"]


def _store_sync(syncer: Any) -> Iterator[Metric]:
    """The message store's WAL fsyncs (message_store.WalSyncer): what a persistent publish's
    confirm waits for on a single node."""
    family = HistogramMetricFamily("maxq_store_fsync_seconds", "How long the message store's WAL fsyncs took")
    cumulative, sum_s = syncer.sync_latency.snapshot()
    family.add_metric([], [(floatToGoString(bound), count) for bound, count in cumulative], sum_s)
    yield family


# ------------------------------------------------------------------ /metrics/detailed

DETAILED_FAMILIES = (
    "queue_coarse_metrics",
    "queue_consumer_count",
    "queue_metrics",
    "connection_churn_metrics",
    "channel_metrics",
    "vhost_status",
    "exchange_names",
)


def render_detailed(broker: Any, families: list[str], vhosts: list[str]) -> bytes:
    """RabbitMQ 3.10's `/metrics/detailed?family=...&vhost=...`: only the families asked for
    (those we have, of DETAILED_FAMILIES; others are skipped, as RabbitMQ skips unknown ones),
    per object, named `rabbitmq_detailed_*`; `vhost` (repeatable) keeps those vhosts' objects."""
    chosen = [name for name in DETAILED_FAMILIES if name in families]
    out = list(_identity(broker))
    for name in chosen:
        out.extend(_DETAILED[name](broker, vhosts))
    return generate_latest(_Families(out))


def _in(vhost: str, vhosts: list[str]) -> bool:
    return not vhosts or vhost in vhosts


def _queue_rows(broker: Any, vhosts: list[str]) -> list[tuple[str, str, Any]]:
    return [(vhost, name, queue) for (vhost, name), queue in _reported_queues(broker) if _in(vhost, vhosts)]


def _per_queue(name: str, help_text: str, rows: list[tuple[str, str, Any]], value: Callable[[Any], float]) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=["vhost", "queue"])
    for vhost, queue_name, queue in rows:
        family.add_metric([vhost, queue_name], value(queue))
    return family


def _detailed_queue_coarse(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    rows = _queue_rows(broker, vhosts)
    d = "rabbitmq_detailed_queue_"
    yield _per_queue(d + "messages_ready", "Messages ready to be delivered to consumers", rows, lambda q: q.ready_count)
    yield _per_queue(
        d + "messages_unacked",
        "Messages delivered to consumers but not yet acknowledged",
        rows,
        lambda q: q.unacked_count,
    )
    yield _per_queue(
        d + "messages",
        "Sum of ready and unacknowledged messages - total queue depth",
        rows,
        lambda q: q.ready_count + q.unacked_count,
    )


def _detailed_queue_consumers(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    rows = _queue_rows(broker, vhosts)
    yield _per_queue(
        "rabbitmq_detailed_queue_consumers", "Consumers on a queue", rows, lambda q: q.active_consumer_count
    )


def _detailed_queue_metrics(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    rows = _queue_rows(broker, vhosts)
    d = "rabbitmq_detailed_queue_"
    yield _per_queue(d + "consumers", "Consumers on a queue", rows, lambda q: q.active_consumer_count)
    yield _per_queue(d + "messages_ready_bytes", "Size in bytes of ready messages", rows, lambda q: q.ready_bytes)
    yield _per_queue(d + "messages_paged_out", "Messages paged out to disk", rows, lambda q: q.spilled_count)


def _detailed_churn(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    channels = sum(len(session.channels) for session in broker.sessions.values())
    d = "rabbitmq_detailed_"
    yield _counter(d + "connections_opened_total", "Total number of connections opened", broker.connections_opened)
    yield _counter(
        d + "connections_closed_total",
        "Total number of connections closed or terminated",
        broker.connections_opened - len(broker.sessions),
    )
    yield _counter(d + "channels_opened_total", "Total number of channels opened", broker.channels_opened)
    yield _counter(d + "channels_closed_total", "Total number of channels closed", broker.channels_opened - channels)
    yield _counter(d + "queues_created_total", "Total number of queues created", broker.queues_created)
    yield _counter(d + "queues_deleted_total", "Total number of queues deleted", broker.queues_deleted)


def _detailed_channels(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    labels = ["vhost", "channel"]
    d = "rabbitmq_detailed_channel_"
    consumers = GaugeMetricFamily(d + "consumers", "Consumers on a channel", labels=labels)
    unacked = GaugeMetricFamily(d + "messages_unacked", "Delivered but not yet acknowledged messages", labels=labels)
    unconfirmed = GaugeMetricFamily(
        d + "messages_unconfirmed", "Published but not yet confirmed messages", labels=labels
    )
    prefetch = GaugeMetricFamily(
        d + "prefetch", "Total limit of unacknowledged messages for all consumers on a channel", labels=labels
    )
    for session in broker.sessions.values():
        if not _in(session.vhost, vhosts):
            continue
        for number, channel in session.channels.items():
            state, label = channel.state, [session.vhost, session.channel_name(number)]
            consumers.add_metric(label, len(channel.consumers))
            unacked.add_metric(label, len(state.unacked))
            unconfirmed.add_metric(label, state.unconfirmed_count)
            prefetch.add_metric(label, state.prefetch_count_global)
    yield from (consumers, unacked, unconfirmed, prefetch)


def _detailed_vhosts(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    family = GaugeMetricFamily("rabbitmq_cluster_vhost_status", "Whether a given vhost is running", labels=["vhost"])
    for vhost in broker.meta.vhosts:
        if _in(vhost, vhosts):
            family.add_metric([vhost], 1)
    yield family


def _detailed_exchanges(broker: Any, vhosts: list[str]) -> Iterator[Metric]:
    family = UnknownMetricFamily(
        "rabbitmq_cluster_exchange_name",
        "Enumerates exchanges without any additional info. This value is cluster-wide.",
        labels=["vhost", "exchange"],
    )
    for vhost, v in broker.meta.vhosts.items():
        if _in(vhost, vhosts):
            for name in v.exchanges:
                family.add_metric([vhost, name], 1)
    yield family


_DETAILED: dict[str, Callable[[Any, list[str]], Iterator[Metric]]] = {
    "queue_coarse_metrics": _detailed_queue_coarse,
    "queue_consumer_count": _detailed_queue_consumers,
    "queue_metrics": _detailed_queue_metrics,
    "connection_churn_metrics": _detailed_churn,
    "channel_metrics": _detailed_channels,
    "vhost_status": _detailed_vhosts,
    "exchange_names": _detailed_exchanges,
}
