"""Poison messages through pika: x-delivery-limit with x-delivery-count, and retry back-off.

References: RabbitMQ's quorum-queues.md "Poison Message Handling" (a message returned more than
x-delivery-limit times is dead-lettered with reason delivery_limit, or dropped; redeliveries
carry x-delivery-count, the number of earlier returns; a lost consumer's messages count too).
The back-off arguments are MaxQ-Raft's own (docs/queue-features.md): a returned message becomes
visible again only after x-retry-backoff-ms * multiplier^(returns - 1), at most the maximum.
"""

from __future__ import annotations

import time
from decimal import Decimal

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import get_one, message_count, wait_until

pytestmark = pytest.mark.timeout(60)


def test_delivery_limit_dead_letters_with_delivery_count_headers(env):
    channel = env.channel()
    work, dead = env.queue_name(), env.queue_name()
    channel.queue_declare(dead)
    channel.queue_declare(
        work, arguments={"x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    )
    channel.basic_publish("", work, b"poison", pika.BasicProperties(headers={"app": 1}))
    counts = []
    for _ in range(3):
        method, props, _ = get_one(channel, work)
        counts.append((props.headers or {}).get("x-delivery-count"))
        channel.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [None, 1, 2]  # absent on the first delivery, then the earlier returns
    method, props, body = get_one(channel, dead)
    assert body == b"poison" and props.headers["app"] == 1
    assert props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert props.headers["x-first-death-reason"] == "delivery_limit"
    assert channel.queue_declare(work, passive=True).method.message_count == 0


def test_delivery_limit_zero_drops_on_the_first_return_without_dlx(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-delivery-limit": 0})
    channel.basic_publish("", name, b"m")
    method, _, _ = get_one(channel, name)
    channel.basic_reject(method.delivery_tag, requeue=True)
    assert channel.basic_get(name, auto_ack=True) == (None, None, None)


def test_a_lost_consumer_counts_as_a_return(env):
    name = env.queue_name()
    channel = env.channel()
    channel.queue_declare(name, arguments={"x-delivery-limit": 1})
    channel.basic_publish("", name, b"crashy")
    for expected in (None, 1):
        consumer = env.connect()
        consumer_channel = consumer.channel()
        method, props, _ = get_one(consumer_channel, name)
        assert (props.headers or {}).get("x-delivery-count") == expected
        consumer.close()  # unacked: back to the queue, counted
    assert wait_until(lambda: message_count(channel, name) == 0, 10, step_s=0.02)


def test_retry_backoff_hides_a_returned_message_until_its_delay(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(
        name, arguments={"x-retry-backoff-ms": 1000, "x-retry-backoff-multiplier": 2, "x-retry-backoff-max-ms": 60000}
    )
    channel.basic_publish("", name, b"retry-me")
    method, _, _ = get_one(channel, name)
    returned_at = time.monotonic()
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert channel.basic_get(name, auto_ack=False) == (None, None, None)  # waiting out its back-off
    method, props, body = get_one(channel, name)
    assert time.monotonic() - returned_at >= 0.9
    assert body == b"retry-me" and method.redelivered and props.headers["x-delivery-count"] == 1
    # The second back-off is twice as long.
    channel.basic_nack(method.delivery_tag, requeue=True)
    returned_at = time.monotonic()
    method, props, _ = get_one(channel, name)
    assert time.monotonic() - returned_at >= 1.9
    assert props.headers["x-delivery-count"] == 2
    channel.basic_ack(method.delivery_tag)


def test_retry_backoff_with_a_waiting_consumer(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(
        name,
        arguments={
            "x-retry-backoff-ms": 200,
            "x-delivery-limit": 3,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": name + "-dead",
        },
    )
    env.queues.append(name + "-dead")
    channel.queue_declare(name + "-dead")
    seen = []

    def on_message(ch, method, props, body):
        seen.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)

    channel.basic_consume(name, on_message)
    channel.basic_publish("", name, b"always-fails")
    assert wait_until(lambda: message_count(channel, name + "-dead") != 0, 20, connections=[channel.connection]), seen
    assert seen == [None, 1, 2, 3]  # 4 deliveries, then the 4th return is over the limit of 3


@pytest.mark.parametrize(
    "arguments, error",
    [
        ({"x-delivery-limit": -1}, "'x-delivery-limit' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
        ({"x-delivery-limit": "5"}, "'x-delivery-limit' for queue '{q}' in vhost '/': {{unacceptable_type,longstr}}"),
        ({"x-retry-backoff-ms": -5}, "'x-retry-backoff-ms' for queue '{q}' in vhost '/': {{value_negative,-5}}"),
        (
            {"x-retry-backoff-multiplier": Decimal("0.5")},  # pika sends no floats: a decimal
            "'x-retry-backoff-multiplier' for queue '{q}' in vhost '/': {{value_out_of_range,0.5,1,1000}}",
        ),
    ],
)
def test_bad_arguments_are_406(env, arguments, error):
    channel = env.channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, arguments=arguments)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - invalid arg " + error.format(q=name)


def test_delivery_counts_survive_a_restart(start_broker):
    broker = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("poison-dead", durable=True)
    channel.queue_declare(
        "poison",
        durable=True,
        arguments={"x-delivery-limit": 2, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "poison-dead"},
    )
    channel.confirm_delivery()
    channel.basic_publish("", "poison", b"p", pika.BasicProperties(delivery_mode=2))
    for _ in range(2):
        method, _, _ = get_one(channel, "poison")
        channel.basic_nack(method.delivery_tag, requeue=True)
    channel.basic_publish("", "poison-dead", b"sync", pika.BasicProperties(delivery_mode=2))  # confirmed: synced
    connection.close()
    broker.stop()
    broker = start_broker(data_dir=broker.data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    method, props, _ = get_one(channel, "poison")
    assert props.headers["x-delivery-count"] == 2 and method.redelivered
    channel.basic_nack(method.delivery_tag, requeue=True)  # the third return: over the limit
    assert get_one(channel, "poison-dead")[2] == b"sync"
    _, props, body = get_one(channel, "poison-dead")
    assert body == b"p" and props.headers["x-death"][0]["reason"] == "delivery_limit"
    connection.close()
