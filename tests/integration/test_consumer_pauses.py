"""Consumer pause and resume (issue #20, item 2) against a real node with pika: through the admin
API (POST /api/queues/{vhost}/{name}/actions) and `maxqctl pause-consumers` / `resume-consumers`.

A paused consumer keeps its subscription and its unacked messages and gets nothing new; resume
goes on in order. The pause is the queue's replicated rule, so it outlives a restart."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pika
import pytest

from ..helpers import api, wait_until

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")
PERSISTENT = pika.BasicProperties(delivery_mode=2)


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def action(broker, queue: str, body: dict) -> int:
    return api(broker, "POST", f"/api/queues/%2F/{quote(queue, safe='')}/actions", body)[0]


def shown(broker, queue: str) -> dict:
    status, body, _ = api(broker, "GET", f"/api/queues/%2F/{quote(queue, safe='')}")
    assert status == 200, body
    return body


def publish(broker, queue: str, bodies: list[bytes], durable: bool = False) -> None:
    connection = broker.connect()
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=durable)
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, PERSISTENT if durable else None)
    finally:
        connection.close()


class Consumer:
    """A pika consumer with manual acks that collects what it is given."""

    def __init__(self, broker, queue: str, tag: str, prefetch: int, name: str = "") -> None:
        props = {"connection_name": name} if name else {}
        self.connection = pika.BlockingConnection(
            pika.ConnectionParameters("127.0.0.1", broker.amqp_port, heartbeat=0, client_properties=props)
        )
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.got: list[tuple[int, bytes]] = []
        self.channel.basic_consume(queue, self._on_message, consumer_tag=tag)

    def _on_message(self, channel, method, properties, body) -> None:
        self.got.append((method.delivery_tag, body))

    def pump(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.05)

    def pump_until(self, count: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.got) < count and time.monotonic() < deadline:
            self.connection.process_data_events(time_limit=0.05)
        assert len(self.got) >= count, f"got {len(self.got)} of {count}"

    def ack_all(self) -> None:
        for tag, _ in self.got:
            self.channel.basic_ack(tag)

    def bodies(self) -> list[bytes]:
        return [body for _, body in self.got]

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


def test_a_paused_consumer_keeps_its_unacked_gets_nothing_new_and_resumes_in_order(broker):
    queue = fresh("pause")
    publish(broker, queue, [b"m%d" % i for i in range(20)])
    consumer = Consumer(broker, queue, "c1", prefetch=5)
    try:
        consumer.pump_until(5)
        assert action(broker, queue, {"action": "pause_consumers"}) == 204
        view = shown(broker, queue)
        assert (view["consumers"], view["paused_consumers"]) == (1, 1)
        assert view["consumer_pauses"] == [{"scope": "queue", "key": ""}]
        assert (view["messages_unacknowledged"], view["messages_ready"]) == (5, 15)
        consumer.ack_all()  # acks still count while paused: room opens, nothing comes
        consumer.pump(0.5)
        assert consumer.bodies() == [b"m%d" % i for i in range(5)]
        assert wait_until(lambda: shown(broker, queue)["messages_unacknowledged"] == 0, timeout_s=5)
        assert shown(broker, queue)["messages_ready"] == 15

        assert action(broker, queue, {"action": "resume_consumers"}) == 204
        consumer.got.clear()
        after: list[bytes] = []
        for _ in range(3):  # prefetch 5: five at a time, each batch acked
            consumer.pump_until(5)
            consumer.ack_all()
            after += consumer.bodies()
            consumer.got.clear()
        assert after == [b"m%d" % i for i in range(5, 20)]
        assert wait_until(lambda: shown(broker, queue)["messages"] == 0, timeout_s=5)
        assert shown(broker, queue)["paused_consumers"] == 0
    finally:
        consumer.close()


def test_a_pause_by_tag_or_by_connection_leaves_the_other_consumers_running(broker):
    queue = fresh("pause-scope")
    name_a, name_b = fresh("conn-a"), fresh("conn-b")
    publish(broker, queue, [])
    a = Consumer(broker, queue, "tag-a", prefetch=100, name=name_a)
    b = Consumer(broker, queue, "tag-b", prefetch=100, name=name_b)
    try:
        assert action(broker, queue, {"action": "pause_consumers", "consumer_tag": "tag-a"}) == 204
        assert shown(broker, queue)["paused_consumers"] == 1
        publish(broker, queue, [b"x%d" % i for i in range(10)])
        b.pump_until(10)
        a.pump(0.3)
        assert a.got == [] and len(b.got) == 10
        assert action(broker, queue, {"action": "resume_consumers", "consumer_tag": "tag-a"}) == 204

        connections = api(broker, "GET", "/api/connections")[1]
        (conn_b,) = [c["name"] for c in connections if c["client_properties"].get("connection_name") == name_b]
        assert action(broker, queue, {"action": "pause_consumers", "connection": conn_b}) == 204
        publish(broker, queue, [b"y%d" % i for i in range(10)])
        a.pump_until(10)
        b.pump(0.3)
        assert a.bodies() == [b"y%d" % i for i in range(10)] and len(b.got) == 10
        view = shown(broker, queue)
        assert view["consumer_pauses"] == [{"scope": "connection", "key": conn_b}]
        assert view["messages_unacknowledged"] == 20  # nobody acked: the paused keep theirs
    finally:
        a.close()
        b.close()


def test_maxqctl_pauses_and_resumes_and_refuses_a_bad_command(broker):
    queue = fresh("pause-ctl")
    publish(broker, queue, [b"z"])
    node = f"127.0.0.1:{broker.http_port}"
    done = subprocess.run(
        [MAXQCTL, "--node", node, "pause-consumers", queue, "--consumer-tag", "t"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert f"consumers tagged 't' of queue '{queue}' paused" in done.stdout
    assert shown(broker, queue)["consumer_pauses"] == [{"scope": "tag", "key": "t"}]
    done = subprocess.run(
        [MAXQCTL, "--node", node, "resume-consumers", queue, "--consumer-tag", "t"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0 and "resumed" in done.stdout, done.stderr
    assert shown(broker, queue)["consumer_pauses"] == []
    both = [MAXQCTL, "--node", node, "pause-consumers", queue, "--consumer-tag", "t", "--connection", "c"]
    done = subprocess.run(both, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
    done = subprocess.run(
        [MAXQCTL, "--node", node, "pause-consumers", fresh("missing")], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 4 and "Not Found" in done.stderr, (done.stdout, done.stderr)


@pytest.mark.parametrize(
    "body",
    [
        {"action": "explode"},
        {},
        {"action": "pause_consumers", "consumer_tag": "a", "connection": "b"},
        {"action": "pause_consumers", "consumer_tag": 5},
        {"action": "pause_consumers", "consumer_tag": ""},
        {"action": "pause_consumers", "connection": "c" * 256},
        {"action": "pause_consumers", "colour": "red"},
    ],
)
def test_a_bad_pause_request_is_a_400_and_changes_nothing(broker, body):
    queue = fresh("pause-bad")
    publish(broker, queue, [])
    status, answer, _ = api(broker, "POST", f"/api/queues/%2F/{queue}/actions", body)
    assert status == 400 and answer["error"] == "bad_request", answer
    assert shown(broker, queue)["consumer_pauses"] == []
    assert action(broker, fresh("missing"), {"action": "pause_consumers"}) == 404


def test_a_queue_pause_outlives_a_restart(start_broker):
    server = start_broker()
    queue = "paused-durable"
    publish(server, queue, [b"d%d" % i for i in range(3)], durable=True)
    assert action(server, queue, {"action": "pause_consumers"}) == 204
    server.stop()
    server = start_broker(data_dir=server.data_dir)
    assert shown(server, queue)["consumer_pauses"] == [{"scope": "queue", "key": ""}]
    consumer = Consumer(server, queue, "after-restart", prefetch=10)
    try:
        consumer.pump(0.5)
        assert consumer.got == []
        assert shown(server, queue)["paused_consumers"] == 1
        assert action(server, queue, {"action": "resume_consumers"}) == 204
        consumer.pump_until(3)
        assert consumer.bodies() == [b"d0", b"d1", b"d2"]
    finally:
        consumer.close()
