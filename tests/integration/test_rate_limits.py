"""Rate limits (issue #20, item 3) against a real node with pika: x-consume-rate-limit per
consumer (basic.consume argument) and per queue (argument or policy, changed live), and
x-publish-rate-limit, which slows a publisher by not reading it and loses nothing."""

from __future__ import annotations

import statistics
import time
import uuid

import pika
import pika.exceptions
import pytest

from ..helpers import api


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def fill(channel, queue: str, count: int) -> None:
    channel.confirm_delivery()
    for i in range(count):
        channel.basic_publish("", queue, b"%d" % i)


def receive_for(connection, channel, queue: str, seconds: float, arguments: dict | None = None) -> list[float]:
    """Consume (auto-ack) for `seconds`: the times of the deliveries, from the consume."""
    times: list[float] = []
    start = time.monotonic()
    channel.basic_consume(queue, lambda *_: times.append(time.monotonic() - start), auto_ack=True, arguments=arguments)
    while time.monotonic() - start < seconds:
        connection.process_data_events(time_limit=0.05)
    return times


def test_a_consumer_limited_to_100_a_second_gets_100_a_second_for_10_seconds(broker):
    connection = broker.connect()
    channel = connection.channel()
    queue = fresh("rate-consumer")
    channel.queue_declare(queue)
    fill(channel, queue, 2_000)
    times = receive_for(connection, channel, queue, 10.0, {"x-consume-rate-limit": 100})
    per_second = [sum(1 for t in times if s <= t < s + 1) for s in range(10)]
    connection.close()
    print(f"\nper second: {per_second}")
    assert 900 <= len(times) <= 1_120, per_second  # 1,000 and the first burst (11)
    assert 90 <= statistics.median(per_second) <= 110, per_second


def test_a_queue_limit_set_by_policy_applies_live_and_lifts(broker):
    connection = broker.connect()
    channel = connection.channel()
    queue = fresh("rate-policy")
    channel.queue_declare(queue)
    fill(channel, queue, 500)
    policy = f"/api/policies/%2F/{queue}"
    body = {"pattern": f"^{queue}$", "definition": {"consume-rate-limit": 50}, "apply-to": "queues"}
    assert api(broker, "PUT", policy, body)[0] == 201
    try:
        times = receive_for(connection, channel, queue, 2.0)
        assert 60 <= len(times) <= 130, len(times)  # 50 a second (and the burst), not all 500
    finally:
        assert api(broker, "DELETE", policy)[0] == 204
    deadline = time.monotonic() + 10
    before = len(times)
    while time.monotonic() < deadline and api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"]:
        connection.process_data_events(time_limit=0.05)
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 0  # the rest once lifted
    assert before < 500
    connection.close()


def test_a_publisher_over_its_queues_limit_is_slowed_and_loses_nothing(broker):
    connection = broker.connect()
    channel = connection.channel()
    queue = fresh("rate-publish")
    channel.queue_declare(queue, arguments={"x-publish-rate-limit": 200})
    channel.confirm_delivery()
    start = time.monotonic()
    for i in range(600):
        channel.basic_publish("", queue, b"%d" % i)  # each waits for its confirm
    elapsed_s = time.monotonic() - start
    assert channel.queue_declare(queue, passive=True).method.message_count == 600
    connection.close()
    print(f"\n600 publishes at a limit of 200/s took {elapsed_s:.2f} s")
    assert elapsed_s >= 2.5  # 3 s at the rate, less the tolerance (~21 messages)


@pytest.mark.parametrize("value", [0, -5, 1_000_001, "fast", True])
def test_bad_rate_limits_are_refused_with_406(broker, value):
    connection = broker.connect()
    channel = connection.channel()
    queue = fresh("rate-bad")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as declared:
        channel.queue_declare(queue, arguments={"x-consume-rate-limit": value})
    assert declared.value.reply_code == 406
    assert f"invalid arg 'x-consume-rate-limit' for queue '{queue}'" in declared.value.reply_text
    channel = connection.channel()
    channel.queue_declare(queue)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as consumed:
        channel.basic_consume(queue, lambda *_: None, arguments={"x-consume-rate-limit": value})
        connection.process_data_events(time_limit=1)
    assert consumed.value.reply_code == 406
    assert "x-consume-rate-limit" in consumed.value.reply_text
    connection.close()
