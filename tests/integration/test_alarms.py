"""Resource alarms through pika: connection.blocked / unblocked, as RabbitMQ has them.

RabbitMQ (rabbit_alarm, rabbit_reader): while a memory or disk alarm is on, a connection that
publishes is no longer read once it has published (what it sends waits in the socket) and gets
connection.blocked if it announced the capability (pika does); connections that only consume
go on, which is what drains a memory alarm; when the alarm clears, blocked connections get
connection.unblocked and are read again, so nothing the client sent is lost.

Alarms are tripped without test-only hooks: a memory watermark of 1 MiB or a disk-free limit of
10**9 MiB are crossed from the first sample; for an alarm that trips and clears at runtime, the
watermark is set 24 MiB above the RSS of the same broker idle (measured by a first run), large
messages fill the queue's in-memory window past it, and a consumer drains it below 95 % of it.
The alarm task samples once a second; every wait is bounded.
"""

from __future__ import annotations

import os
import time

import pika
import pytest

from ..helpers import get_bodies, message_count, wait_until

pytestmark = pytest.mark.timeout(60)

BLOCK_TIMEOUT_S = 5.0  # the alarm samples every second
HEADROOM_MB = 24


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


class Publisher:
    """A publishing connection that records connection.blocked / unblocked as they arrive."""

    def __init__(self, server) -> None:
        self.connection = server.connect(heartbeat=0)
        self.events: list[tuple[str, str]] = []
        self.connection.add_on_connection_blocked_callback(
            lambda _conn, frame: self.events.append(("blocked", frame.method.reason))
        )
        self.connection.add_on_connection_unblocked_callback(
            lambda _conn, _frame: self.events.append(("unblocked", ""))
        )
        self.channel = self.connection.channel()

    def wait_for(self, kind: str, timeout_s: float = BLOCK_TIMEOUT_S) -> bool:
        return wait_until(
            lambda: any(event == kind for event, _ in self.events), timeout_s, connections=[self.connection]
        )


def check_blocked_publisher_and_free_consumer(server, reason: str) -> None:
    consumer_connection = server.connect(heartbeat=0)
    consumer = consumer_connection.channel()
    consumer.queue_declare("q", durable=True)  # a consuming connection is never blocked
    publisher = Publisher(server)
    publisher.channel.basic_publish("", "q", b"first", pika.BasicProperties(delivery_mode=2))
    assert publisher.wait_for("blocked"), f"no connection.blocked; events {publisher.events}"
    assert publisher.events[0] == ("blocked", reason)
    # What a blocked connection sends is not read, so it does not reach the queue.
    for i in range(5):
        publisher.channel.basic_publish("", "q", b"while-blocked-%d" % i)
    publisher.connection.process_data_events(time_limit=1.5)
    assert message_count(consumer, "q") == 1
    # The consumer's connection goes on: it gets the message taken in before the block.
    got = []
    consumer.basic_consume("q", lambda ch, method, props, body: (got.append(body), ch.basic_ack(method.delivery_tag)))
    wait_until(lambda: got, 5, connections=[consumer_connection])
    assert got == [b"first"]
    assert ("unblocked", "") not in publisher.events
    consumer_connection.close()
    # A blocked connection is not read, so it would not see a shutdown's connection.close:
    # stopping would wait out the grace period (3 s). Nothing here is about shutdown.
    server.kill()


def test_memory_alarm_blocks_publishers_and_consumers_still_drain(start_broker):
    server = start_broker(["--memory-high-watermark-mb", "1"])
    check_blocked_publisher_and_free_consumer(server, "low on memory")
    assert "memory alarm: RSS" in server.log_text()


def test_disk_alarm_blocks_publishers_and_consumers_still_drain(start_broker):
    server = start_broker(["--disk-free-limit-mb", str(10**9)])
    check_blocked_publisher_and_free_consumer(server, "low on disk")
    assert "disk alarm:" in server.log_text()


def test_memory_alarm_trips_and_clears_at_runtime_and_loses_nothing(start_broker, tmp_path):
    # The RSS of this broker idle, with a connection open, on this machine.
    probe = start_broker(data_dir=tmp_path / "probe")
    probe_connection = probe.connect(heartbeat=0)
    probe_connection.channel().queue_declare("q")
    time.sleep(1.0)
    idle_mb = rss_mb(probe.pid)
    probe_connection.close()
    probe.stop()

    watermark_mb = idle_mb + HEADROOM_MB
    server = start_broker(["--memory-high-watermark-mb", str(watermark_mb)])
    publisher = Publisher(server)
    publisher.channel.queue_declare("q")
    body = bytes(256 << 10)
    sent = 0
    deadline = time.monotonic() + 15
    # 256 KiB messages stay in the queue's window (32 MiB) in memory: RSS climbs past the mark.
    # Publish until it has (about 100 messages), so that the queue stays within its window (what
    # spills goes to RocksDB's memtable, which is not freed by draining).
    # Also until the node says it blocked us: its own sample (once a second) may have caught the
    # RSS above the mark at a peak that this test's reading, between publishes, never sees; more
    # publishes then would fill the socket the node no longer reads, and the publish would hang.
    while not publisher.events and rss_mb(server.pid) <= watermark_mb and time.monotonic() < deadline and sent < 120:
        publisher.channel.basic_publish("", "q", b"%06d" % sent + body)
        sent += 1
        publisher.connection.process_data_events(time_limit=0.01)
    if not publisher.events:
        assert rss_mb(server.pid) > watermark_mb, (sent, rss_mb(server.pid), watermark_mb)
        # The alarm samples once a second and a publisher is blocked at its next read: the
        # publish after the sample is the last one taken in.
        publisher.connection.process_data_events(time_limit=1.2)
        publisher.channel.basic_publish("", "q", b"%06d" % sent + body)
        sent += 1
    assert publisher.wait_for("blocked"), (publisher.events, rss_mb(server.pid), watermark_mb)
    assert publisher.events[:1] == [("blocked", "low on memory")], publisher.events
    for _ in range(5):  # sent while blocked: they wait in the socket
        publisher.channel.basic_publish("", "q", b"%06d" % sent + body)
        sent += 1

    consumer_connection = server.connect(heartbeat=0)
    consumer = consumer_connection.channel()
    received: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(received) < sent and time.monotonic() < deadline:
        received.extend(body[:6] for body in get_bodies(consumer, "q", 50))
        publisher.connection.process_data_events(time_limit=0.05)
    assert ("unblocked", "") in publisher.events, (
        publisher.events,
        rss_mb(server.pid),
        watermark_mb,
        len(received),
        sent,
    )
    assert received == [b"%06d" % i for i in range(sent)], "every message, in order, none lost"
    # Read again: a confirm comes back.
    publisher.channel.confirm_delivery()
    publisher.channel.basic_publish("", "q", b"after")
    assert get_bodies(consumer, "q", 2) == [b"after"]
    assert "memory alarm cleared" in server.log_text()
    consumer_connection.close()
    publisher.connection.close()
