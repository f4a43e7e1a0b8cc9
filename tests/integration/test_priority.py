"""Priority queues through pika: x-max-priority.

References: RabbitMQ's priority.md (strict order by priority, FIFO within one; no priority
property means 0; a priority above the queue's maximum counts as the maximum; x-max-priority up
to 255) and rabbit_amqqueue check_max_priority_arg for the 406s.
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import drain, wait_until

pytestmark = pytest.mark.timeout(120)


def prio(p):
    return pika.BasicProperties(priority=p)


def test_strict_priority_then_fifo(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-priority": 10})
    for body, p in [(b"a0", 0), (b"b5", 5), (b"c", None), (b"d9", 9), (b"e5", 5), (b"f0", 0)]:
        channel.basic_publish("", name, body, prio(p) if p is not None else None)
    assert drain(channel, name) == [b"d9", b"b5", b"e5", b"a0", b"c", b"f0"]


def test_priority_above_the_maximum_is_capped(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-priority": 2})
    channel.basic_publish("", name, b"two", prio(2))
    channel.basic_publish("", name, b"nine", prio(9))  # counts as 2: after "two"
    channel.basic_publish("", name, b"one", prio(1))
    assert drain(channel, name) == [b"two", b"nine", b"one"]


def test_consumer_gets_the_highest_priority_first(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-priority": 255})
    for i in range(20):
        channel.basic_publish("", name, b"%d" % i, prio(i % 4 * 80))  # 0, 80, 160, 240
    got = []
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(name, lambda ch, m, p, b: (got.append((p.priority, b)), ch.basic_ack(m.delivery_tag)))
    wait_until(lambda: len(got) >= 20, 10, connections=[channel.connection])
    assert [p for p, _ in got] == [240] * 5 + [160] * 5 + [80] * 5 + [0] * 5
    assert [b for p, b in got if p == 240] == [b"3", b"7", b"11", b"15", b"19"]


def test_requeued_message_goes_back_to_the_front_of_its_priority(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-priority": 5})
    channel.basic_publish("", name, b"low1", prio(1))
    channel.basic_publish("", name, b"low2", prio(1))
    method, _, body = channel.basic_get(name, auto_ack=False)
    assert body == b"low1"
    channel.basic_publish("", name, b"high", prio(5))
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert drain(channel, name) == [b"high", b"low1", b"low2"]


def test_plain_queue_ignores_priority(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"first", prio(0))
    channel.basic_publish("", name, b"second", prio(9))
    assert drain(channel, name) == [b"first", b"second"]


def test_deep_durable_priority_queue_keeps_order_across_a_restart(start_broker):
    """More messages than a queue's in-memory window (65,536), so lanes spill to the store; after
    a restart every lane is read back from the store in order."""
    broker = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("deep-prio", durable=True, arguments={"x-max-priority": 3})
    n = 70_000
    persistent = [pika.BasicProperties(delivery_mode=2, priority=p) for p in range(4)]
    for i in range(n):
        channel.basic_publish("", "deep-prio", b"%d" % i, persistent[i % 4])
    channel.confirm_delivery()
    channel.basic_publish("", "deep-prio", b"last", pika.BasicProperties(delivery_mode=2, priority=0))
    connection.close()
    broker.stop()
    broker = start_broker(data_dir=broker.data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    assert channel.queue_declare("deep-prio", passive=True).method.message_count == n + 1
    # A no-ack consumer, not basic.get: the same order from the lanes, without 70,001 round trips.
    got = []
    for _method, _props, body in channel.consume("deep-prio", auto_ack=True, inactivity_timeout=10):
        if body is None:  # (10 s with nothing more: short)
            break
        got.append(body)
        if len(got) == n + 1:
            break
    assert channel.cancel() == 0  # (nothing more came)
    assert channel.queue_declare("deep-prio", passive=True).method.message_count == 0
    expected = [b"%d" % i for p in (3, 2, 1, 0) for i in range(n) if i % 4 == p] + [b"last"]
    assert got == expected
    connection.close()


@pytest.mark.parametrize(
    "value, error",
    [
        (256, "{{max_value_exceeded,256}}"),
        (-1, "{{value_negative,-1}}"),
        ("high", "{{unacceptable_type,longstr}}"),
    ],
)
def test_bad_max_priority_is_406(env, value, error):
    channel = env.channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, arguments={"x-max-priority": value})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-max-priority' for queue '{name}' in vhost '/': " + error.format()
    )
