"""The Prometheus port against a real node: pika publishes, gets and consumes; /metrics and
/metrics/per-object, scraped over a socket and read with prometheus_client's parser, move as
they should, with RabbitMQ's names and labels. A node of its own, so the counts are exact."""

from __future__ import annotations

import socket
import time
import uuid

import pika
import pika.exceptions
from prometheus_client.parser import text_string_to_metric_families

SCRAPE_TIMEOUT_S = 10.0
SETTLE_S = 5.0  # acks and confirms reach the counters after the client sent them


def http_get(port: int, path: str, method: str = "GET", host: str = "127.0.0.1") -> tuple[str, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_TIMEOUT_S) as sock:
        # (read to the end: the server keeps a connection open unless asked to close it)
        request = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return lines[0], headers, body


def scrape(port: int, path: str = "/metrics") -> dict:
    """sample name -> {labels tuple: value}"""
    status, headers, body = http_get(port, path)
    assert status.startswith("HTTP/1.1 200 "), (status, body[:200])
    assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    out: dict = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def one(samples: dict, name: str, **labels) -> float:
    return samples[name][tuple(sorted(labels.items()))]


PROTO = {"protocol": "amqp091"}
TYPED = {"protocol": "amqp091", "queue_type": "maxq_queue"}


def wait_for(port: int, check, path: str = "/metrics") -> dict:
    deadline = time.monotonic() + SETTLE_S
    while True:
        samples = scrape(port, path)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


def test_metrics_follow_publishes_gets_and_consumes(start_broker):
    broker = start_broker()
    port = broker.prometheus_port
    before = scrape(port)
    g = "rabbitmq_global_messages_"
    assert one(before, g + "received_total", **PROTO) == 0
    assert one(before, "rabbitmq_connections") == 0

    queue = f"prom-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue)
        for i in range(5):
            channel.basic_publish("", queue, f"m{i}".encode())
        channel.basic_publish("", "no-such-queue", b"dropped")
        try:
            channel.basic_publish("", "no-such-queue", b"returned", mandatory=True)
        except pika.exceptions.UnroutableError:
            pass

        per_object = scrape(port, "/metrics/per-object")
        assert one(per_object, "rabbitmq_queue_messages_ready", vhost="/", queue=queue) == 5
        assert one(per_object, "rabbitmq_queue_consumers", vhost="/", queue=queue) == 0
        samples = scrape(port)
        assert one(samples, g + "received_total", **PROTO) == 7
        assert one(samples, g + "received_confirm_total", **PROTO) == 7
        assert one(samples, g + "routed_total", **PROTO) == 5
        assert one(samples, g + "unroutable_dropped_total", **PROTO) == 1
        assert one(samples, g + "unroutable_returned_total", **PROTO) == 1
        assert one(samples, g + "confirmed_total", **PROTO) == 7
        assert one(samples, "rabbitmq_connections") == 1
        assert one(samples, "rabbitmq_channels") == 1
        assert one(samples, "rabbitmq_queues") == 1
        assert one(samples, "rabbitmq_queue_messages_ready") == 5  # aggregated: no labels

        method, _props, _body = channel.basic_get(queue)
        channel.basic_ack(method.delivery_tag)
        for got, (method, _props, _body) in enumerate(channel.consume(queue, inactivity_timeout=5), 1):
            assert method is not None, "a delivery did not come"
            channel.basic_ack(method.delivery_tag)
            if got == 4:
                break
        channel.cancel()
        method, _props, _body = channel.basic_get(queue)
        assert method is None

        samples = wait_for(port, lambda s: one(s, g + "acknowledged_total", **TYPED) == 5)
        assert one(samples, g + "acknowledged_total", **TYPED) == 5
        assert one(samples, g + "delivered_total", **TYPED) == 5
        assert one(samples, g + "delivered_get_manual_ack_total", **TYPED) == 1
        assert one(samples, g + "delivered_consume_manual_ack_total", **TYPED) == 4
        assert one(samples, g + "delivered_consume_auto_ack_total", **TYPED) == 0
        assert one(samples, g + "get_empty_total", **TYPED) == 1
        assert one(samples, g + "redelivered_total", **TYPED) == 0
        assert one(samples, "rabbitmq_queue_messages") == 0
    finally:
        connection.close()

    after = wait_for(port, lambda s: one(s, "rabbitmq_connections") == 0)
    assert one(after, "rabbitmq_connections") == 0
    assert one(after, "rabbitmq_connections_opened_total") == 1
    assert one(after, "rabbitmq_connections_closed_total") == 1
    assert one(after, "rabbitmq_channels_closed_total") == 1
    assert one(after, g + "received_total", **PROTO) == 7  # the closed connection's count stays
    assert one(after, g + "routed_total", **PROTO) == 5
    assert one(after, "rabbitmq_process_resident_memory_bytes") > 0
    assert one(after, "rabbitmq_disk_space_available_bytes") > 0
    assert one(after, "rabbitmq_alarms_memory_used_watermark") == 0
    assert one(after, "rabbitmq_identity_info", rabbitmq_node="maxq1", rabbitmq_cluster="maxq") == 1


def test_serves_only_its_two_paths_to_this_nodes_names(start_broker):
    broker = start_broker()
    port = broker.prometheus_port
    status, _headers, body = http_get(port, "/metrics", method="HEAD")
    assert status.startswith("HTTP/1.1 200 ") and body == b""
    assert http_get(port, "/api/overview")[0].startswith("HTTP/1.1 404")
    assert http_get(port, "/metrics", method="POST")[0].startswith("HTTP/1.1 405")
    # A page that rebinds its own name to 127.0.0.1 is refused, as by the admin API.
    assert http_get(port, "/metrics", host="attacker.example:15692")[0].startswith("HTTP/1.1 403")
    assert http_get(port, "/metrics", host="localhost:15692")[0].startswith("HTTP/1.1 200 ")


def test_zero_disables_the_port(start_broker):
    broker = start_broker(["--prometheus-port", "0"])
    assert "Prometheus metrics on" not in broker.log_text()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    connection.close()


def test_detailed_serves_the_families_asked_for(start_broker):
    broker = start_broker()
    port = broker.prometheus_port
    queue = f"detailed-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue)
        for _ in range(3):
            channel.basic_publish("", queue, b"x")
        samples = scrape(port, "/metrics/detailed?family=queue_coarse_metrics&family=queue_consumer_count")
        assert one(samples, "rabbitmq_detailed_queue_messages_ready", vhost="/", queue=queue) == 3
        assert one(samples, "rabbitmq_detailed_queue_messages", vhost="/", queue=queue) == 3
        assert one(samples, "rabbitmq_detailed_queue_consumers", vhost="/", queue=queue) == 0
        assert "rabbitmq_detailed_channel_consumers" not in samples  # not asked for
        assert "rabbitmq_identity_info" in samples
        other_vhost = scrape(port, "/metrics/detailed?family=queue_coarse_metrics&vhost=nope")
        assert "rabbitmq_detailed_queue_messages_ready" not in other_vhost  # an empty family has no samples
        channels = scrape(port, "/metrics/detailed?family=channel_metrics&family=exchange_names&family=nope")
        assert sum(channels["rabbitmq_detailed_channel_messages_unconfirmed"].values()) == 0
        assert one(channels, "rabbitmq_cluster_exchange_name", vhost="/", exchange="amq.topic") == 1
        assert set(scrape(port, "/metrics/detailed")) <= {"rabbitmq_identity_info", "maxq_build_info"}
    finally:
        connection.close()


def test_the_message_stores_own_figures(start_broker):
    broker = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("stored", durable=True)
        for _ in range(20):
            channel.basic_publish("", "stored", bytes(1000), pika.BasicProperties(delivery_mode=2))
        samples = scrape(broker.prometheus_port)
        assert one(samples, "maxq_store_memtable_bytes") >= 20 * 1000  # the persistent bodies, written through
        assert one(samples, "maxq_store_sst_bytes") >= 0 and one(samples, "maxq_store_block_cache_bytes") >= 0
        assert one(samples, "maxq_store_redo_bytes") == 0  # nothing waiting after a failure
        # Each confirm above waited for an fsync of the WAL: the histogram has counted them.
        fsyncs = one(samples, "maxq_store_fsync_seconds_count")
        assert fsyncs >= 1
        assert one(samples, "maxq_store_fsync_seconds_bucket", le="+Inf") == fsyncs
        assert one(samples, "maxq_store_fsync_seconds_sum") > 0
    finally:
        connection.close()
