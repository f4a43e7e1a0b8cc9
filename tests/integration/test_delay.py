"""Delayed delivery through pika: the x-delay header on any queue, and the x-delayed-message
exchange type with x-delayed-type, as clients of rabbitmq-delayed-message-exchange use it.

References: the plugin's README (x-delay in milliseconds; the exchange routes as x-delayed-type;
406 "Invalid argument, 'x-delayed-type' must be an existing exchange type"). Differences, by
design (docs/queue-features.md): `mandatory` is checked at publish, and a delayed message is held
by the queues it was routed to (replicated with them), not by one node's exchange.
"""

from __future__ import annotations

import time

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import get_one, wait_until

pytestmark = pytest.mark.timeout(60)


def delayed(ms: int, **kwargs) -> pika.BasicProperties:
    return pika.BasicProperties(headers={"x-delay": ms}, **kwargs)


def test_x_delay_on_a_plain_queue(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    published = time.monotonic()
    channel.basic_publish("", name, b"later", delayed(800))
    channel.basic_publish("", name, b"now")
    assert channel.basic_get(name, auto_ack=True)[2] == b"now"
    assert channel.basic_get(name, auto_ack=True) == (None, None, None)  # held, not counted
    assert channel.queue_declare(name, passive=True).method.message_count == 0
    _, props, body = get_one(channel, name, auto_ack=True)
    assert body == b"later" and time.monotonic() - published >= 0.75
    assert props.headers["x-delay"] == 800


def test_delayed_messages_come_out_in_due_order(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    for body, delay in [(b"c", 900), (b"a", 300), (b"b", 600)]:
        channel.basic_publish("", name, body, delayed(delay))
    got = [get_one(channel, name, auto_ack=True)[2] for _ in range(3)]
    assert got == [b"a", b"b", b"c"]


def test_consumer_receives_a_delayed_message_when_due(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    got = []
    channel.basic_consume(name, lambda ch, m, p, b: got.append((time.monotonic(), b)), auto_ack=True)
    publisher = env.channel()
    published = time.monotonic()
    publisher.basic_publish("", name, b"tick", delayed(500))
    wait_until(lambda: got, 10, connections=[channel.connection])
    assert got and got[0][1] == b"tick" and got[0][0] - published >= 0.45


def test_x_delayed_message_exchange_routes_as_its_delayed_type(env):
    channel = env.channel()
    exchange = env.exchange_name()
    q1, q2 = env.queue_name(), env.queue_name()
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    for name in (q1, q2):
        channel.queue_declare(name)
    channel.queue_bind(q1, exchange, routing_key="k1")
    channel.queue_bind(q2, exchange, routing_key="k2")
    channel.basic_publish(exchange, "k1", b"to-q1", delayed(300))
    channel.basic_publish(exchange, "k2", b"to-q2-now")
    assert channel.basic_get(q2, auto_ack=True)[2] == b"to-q2-now"
    assert channel.basic_get(q1, auto_ack=True) == (None, None, None)
    _, _, body = get_one(channel, q1, auto_ack=True)
    assert body == b"to-q1"
    # Redeclaring with the same x-delayed-type is fine; a different one is 406.
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "direct"})
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "topic"})
    assert exc.value.reply_code == 406


def test_mandatory_is_checked_at_publish(env):
    channel = env.channel()
    exchange = env.exchange_name()
    channel.exchange_declare(exchange, "x-delayed-message", arguments={"x-delayed-type": "fanout"})
    returned = []
    channel.add_on_return_callback(lambda ch, method, props, body: returned.append(body))
    channel.basic_publish(exchange, "", b"nowhere", delayed(60_000), mandatory=True)
    wait_until(lambda: returned, 5, connections=[channel.connection])
    assert returned == [b"nowhere"]  # at once, not after the delay


@pytest.mark.parametrize("arguments", [{}, {"x-delayed-type": "no-such-type"}])
def test_x_delayed_type_must_be_an_exchange_type(env, arguments):
    channel = env.channel()
    exchange = env.exchange_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(exchange, "x-delayed-message", arguments=arguments)
    assert exc.value.reply_code == 406
    assert (
        exc.value.reply_text
        == "PRECONDITION_FAILED - Invalid argument, 'x-delayed-type' must be an existing exchange type"
    )


def test_zero_negative_and_non_integer_delays_are_no_delay(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    for value in (0, -500, "1000"):
        channel.basic_publish("", name, b"m", pika.BasicProperties(headers={"x-delay": value}))
    assert channel.queue_declare(name, passive=True).method.message_count == 3


def test_ttl_starts_when_a_delayed_message_falls_due(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 2000})
    channel.basic_publish("", name, b"m", delayed(2500))  # longer than the TTL: still delivered
    _, props, body = get_one(channel, name, auto_ack=True)
    assert body == b"m"


def test_durable_delayed_messages_survive_a_restart(start_broker):
    broker = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("delayed-durable", durable=True)
    channel.confirm_delivery()
    for i in range(3):
        channel.basic_publish("", "delayed-durable", b"d%d" % i, delayed(2000 + i * 100, delivery_mode=2))
    channel.basic_publish("", "delayed-durable", b"transient", delayed(2000))
    connection.close()
    broker.stop()
    broker = start_broker(data_dir=broker.data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    got = [get_one(channel, "delayed-durable", auto_ack=True)[2] for _ in range(3)]
    assert got == [b"d0", b"d1", b"d2"]
    time.sleep(0.3)
    assert channel.basic_get("delayed-durable", auto_ack=True) == (None, None, None)  # transient: gone
    connection.close()
