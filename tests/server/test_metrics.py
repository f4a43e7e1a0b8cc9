"""The Prometheus renderer (maxq_raft/http/metrics.py): its output parsed back with
prometheus_client's own parser, the names, types and labels RabbitMQ's dashboards expect, and
escaping of names a queue may have."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from maxq_raft.http.metrics import ProcessSample, render

PROCESS = ProcessSample(resident_memory_bytes=100 << 20, open_fds=12, max_fds=1024, disk_free_bytes=5 << 30)


def _queue(ready: int, unacked: int, consumers: int, ready_bytes: int = 0, spilled: int = 0):
    return SimpleNamespace(
        ready_count=ready,
        unacked_count=unacked,
        active_consumer_count=consumers,
        ready_bytes=ready_bytes,
        spilled_count=spilled,
    )


def _broker(**overrides):
    session = SimpleNamespace(messages_in=7, messages_routed=6, channels={1: object(), 2: object()})
    broker = SimpleNamespace(
        node_id="maxq1",
        started_at=0.0,
        log=SimpleNamespace(replication_node=None),
        sessions={"c1": session},
        consumers={"k1": object()},
        queues={
            ("/", "orders"): _queue(3, 2, 1, ready_bytes=30, spilled=1),
            ("v2", 'we"ird\\q\nname'): _queue(4, 0, 0),
        },
        alarms=SimpleNamespace(
            memory_limit_bytes=1 << 30,
            disk_limit_bytes=50 << 20,
            memory_alarm=False,
            disk_alarm=True,
            store_failure=None,
        ),
        messages_received_closed=10,
        messages_routed_closed=9,
        messages_received_http=0,  # (the management API's publishes: tests/integration/test_management_objects.py)
        messages_routed_http=0,
        messages_delivered=20,
        messages_delivered_auto_ack=5,
        messages_redelivered=2,
        messages_got_auto_ack=1,
        messages_got_manual_ack=3,
        messages_get_empty=4,
        messages_acknowledged=14,
        messages_received_confirm=11,
        messages_confirmed=11,
        messages_unroutable_dropped=1,
        messages_unroutable_returned=1,
        sqs_sent=6,
        sqs_received=5,
        sqs_received_empty=2,
        sqs_deleted=4,
        connections_opened=5,
        channels_opened=9,
        queues_created=4,
        queues_deleted=2,
    )
    for key, value in overrides.items():
        setattr(broker, key, value)
    return broker


def parse(text: bytes) -> dict:
    """family name -> (type, help, {labels tuple: value}), strictly: a duplicate sample fails."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        samples: dict = {}
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate sample {key}"
            samples[key] = sample.value
        assert family.name not in out, f"duplicate family {family.name}"
        out[family.name] = (family.type, family.documentation, samples)
    return out


def value(families: dict, family: str, sample: str | None = None, **labels) -> float:
    _type, _help, samples = families[family]
    return samples[(sample or family, tuple(sorted(labels.items())))]


def test_aggregated_names_types_and_values():
    text = render(_broker(), PROCESS, None)
    families = parse(text)
    # The parser names a counter's family without _total; its sample keeps it.
    assert families["rabbitmq_global_messages_received"][0] == "counter"
    assert b"# TYPE rabbitmq_global_messages_received_total counter" in text
    proto = {"protocol": "amqp091"}
    typed = {"protocol": "amqp091", "queue_type": "maxq_queue"}
    g = "rabbitmq_global_messages_"
    assert value(families, g + "received", g + "received_total", **proto) == 17  # 10 closed + 7 open
    assert value(families, g + "routed", g + "routed_total", **proto) == 15
    assert value(families, g + "confirmed", g + "confirmed_total", **proto) == 11
    assert value(families, g + "delivered", g + "delivered_total", **typed) == 24  # 20 consumed + 4 got
    assert value(families, g + "delivered_consume_manual_ack", g + "delivered_consume_manual_ack_total", **typed) == 15
    assert value(families, g + "acknowledged", g + "acknowledged_total", **typed) == 14
    # the SQS API's, a protocol of its own: sends are confirmed publishes, receives gets, deletes acks
    sqs, sqs_typed = {"protocol": "sqs"}, {"protocol": "sqs", "queue_type": "maxq_queue"}
    assert value(families, g + "received", g + "received_total", **sqs) == 6
    assert value(families, g + "confirmed", g + "confirmed_total", **sqs) == 6
    assert value(families, g + "delivered_get_manual_ack", g + "delivered_get_manual_ack_total", **sqs_typed) == 5
    assert value(families, g + "get_empty", g + "get_empty_total", **sqs_typed) == 2
    assert value(families, g + "acknowledged", g + "acknowledged_total", **sqs_typed) == 4
    assert value(families, g + "unroutable_dropped", g + "unroutable_dropped_total", **sqs) == 0
    assert value(families, "rabbitmq_connections") == 1
    assert value(families, "rabbitmq_connections_closed", "rabbitmq_connections_closed_total") == 4
    assert value(families, "rabbitmq_channels") == 2
    assert value(families, "rabbitmq_channels_closed", "rabbitmq_channels_closed_total") == 7
    assert value(families, "rabbitmq_consumers") == 1
    assert value(families, "rabbitmq_queues") == 2
    # Aggregated: one sample per queue family, no labels.
    assert value(families, "rabbitmq_queue_messages_ready") == 7
    assert value(families, "rabbitmq_queue_messages_unacked") == 2
    assert value(families, "rabbitmq_queue_messages") == 9
    assert value(families, "rabbitmq_queue_consumers") == 1
    assert value(families, "rabbitmq_process_resident_memory_bytes") == 100 << 20
    assert value(families, "rabbitmq_disk_space_available_limit_bytes") == 50 << 20
    assert families["rabbitmq_alarms_free_disk_space_watermark"][0] == "unknown"  # untyped, as RabbitMQ's
    assert b"# TYPE rabbitmq_alarms_free_disk_space_watermark untyped" in text
    assert value(families, "rabbitmq_alarms_free_disk_space_watermark") == 1
    assert value(families, "rabbitmq_alarms_memory_used_watermark") == 0
    assert value(families, "rabbitmq_identity_info", rabbitmq_node="maxq1", rabbitmq_cluster="maxq") == 1
    assert not any(name.startswith("rabbitmq_raft_") for name in families)  # a single node has no Raft


def test_per_object_labels_queues_and_escapes_their_names():
    text = render(_broker(), PROCESS, None, per_object=True)
    families = parse(text)
    assert value(families, "rabbitmq_queue_messages_ready", vhost="/", queue="orders") == 3
    assert value(families, "rabbitmq_queue_messages_paged_out", vhost="/", queue="orders") == 1
    assert value(families, "rabbitmq_queue_messages_ready_bytes", vhost="/", queue="orders") == 30
    assert value(families, "rabbitmq_queue_messages_ready", vhost="v2", queue='we"ird\\q\nname') == 4
    assert b'queue="we\\"ird\\\\q\\nname"' in text  # escaped on the wire, whole once parsed
    # the node-wide families are the same in both
    assert value(families, "rabbitmq_connections") == 1


def test_cluster_member_reports_the_queues_of_the_shards_it_leads_and_each_raft_group():
    led = {"shard-0"}
    log = SimpleNamespace(
        replication_node=object(),
        group_of=lambda key: "shard-0" if key[1] == "orders" else "shard-1",
        leads=lambda group: group in led,
    )
    groups = {
        "meta": {
            "leader": "maxq1",
            "term": 3,
            "commit_index": 40,
            "applied_index": 38,
            "last_index": 41,
            "snapshot_index": 10,
            "durable_index": 41,
            "members": {"maxq1": {"self": True, "lag": 0}, "maxq2": {"lag": 5}, "maxq3": {"lag": None}},
            "group": {"snapshots_saved": 2},
            "journal": {"fdatasyncs": 9},
        },
        "shard-0": {"leader": "maxq2", "term": 2, "commit_index": 7, "applied_index": 7, "members": {"maxq2": {}}},
    }
    families = parse(render(_broker(log=log), PROCESS, groups, per_object=True))
    assert value(families, "rabbitmq_queues") == 1
    assert ("rabbitmq_queue_messages_ready", (("queue", "orders"), ("vhost", "/"))) in families[
        "rabbitmq_queue_messages_ready"
    ][2]
    assert len(families["rabbitmq_queue_messages_ready"][2]) == 1
    assert value(families, "rabbitmq_raft_term", "rabbitmq_raft_term_total", raft_group="meta") == 3
    assert value(families, "rabbitmq_raft_log_commit_index", raft_group="meta") == 40
    assert value(families, "rabbitmq_raft_log_last_applied_index", raft_group="meta") == 38
    assert value(families, "maxq_raft_apply_lag_entries", raft_group="meta") == 2
    assert value(families, "maxq_raft_group_leader", raft_group="meta") == 1
    assert value(families, "maxq_raft_group_leader", raft_group="shard-0") == 0
    assert value(families, "maxq_raft_member_lag_entries", raft_group="meta", member="maxq2") == 5
    assert len(families["maxq_raft_member_lag_entries"][2]) == 2  # maxq3's lag is unknown: no sample
    assert value(families, "maxq_raft_snapshots_saved", "maxq_raft_snapshots_saved_total", raft_group="meta") == 2


def test_counters_never_go_down_as_connections_close():
    broker = _broker()
    before = parse(render(broker, PROCESS, None))
    # The connection closes: Session._release adds its counts to the node's.
    session = broker.sessions.pop("c1")
    broker.messages_received_closed += session.messages_in
    broker.messages_routed_closed += session.messages_routed
    after = parse(render(broker, PROCESS, None))
    for family, (kind, _help, samples) in before.items():
        if kind == "counter":
            for key, was in samples.items():
                assert after[family][2][key] >= was, (family, key)
    assert value(after, "rabbitmq_connections_closed", "rabbitmq_connections_closed_total") == 5
    assert value(after, "rabbitmq_channels_closed", "rabbitmq_channels_closed_total") == 9
