"""TTL and queue expiry through pika: x-message-ttl, the `expiration` property, x-expires.

References: RabbitMQ's ttl.md (TTL 0 with a waiting consumer delivers; expired messages at the
head are dropped before delivery; the lower of queue and message TTL applies; x-expires deletes
an unused queue) and rabbit_amqqueue declare_args / rabbit_channel check_expiration_header for
the 406 texts. Waits are bounded polls, never sleeps that a slow machine could outrun.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import GUEST_AUTH, message_count, wait_until

pytestmark = pytest.mark.timeout(60)


def queue_exists(broker, name: str) -> bool:
    """Asked of the admin API: a passive queue.declare would count as use (RabbitMQ's `stat`
    restarts the x-expires timer), so polling with one would keep the queue alive."""
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{broker.http_port}/api/queues", headers=GUEST_AUTH), timeout=5
    ) as response:
        return any(q["name"] == name for q in json.load(response))


def test_queue_ttl_expires_messages_without_traffic(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 200})
    for i in range(5):
        channel.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: message_count(channel, name) == 0, 10.0)
    assert channel.basic_get(name, auto_ack=True) == (None, None, None)


def test_per_message_expiration(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"short", pika.BasicProperties(expiration="100"))
    assert wait_until(lambda: message_count(channel, name) == 0, 10.0)
    channel.basic_publish("", name, b"long", pika.BasicProperties(expiration="600000"))
    method, props, body = channel.basic_get(name, auto_ack=True)
    assert body == b"long" and props.expiration == "600000"  # delivered with its expiration, as RabbitMQ


def test_expired_message_at_the_head_is_dropped_before_delivery(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"expires", pika.BasicProperties(expiration="50"))
    channel.basic_publish("", name, b"stays")
    # No Tick needed: the head is dropped when a basic.get meets it after its deadline.
    time.sleep(0.2)
    method, _, body = channel.basic_get(name, auto_ack=True)
    assert body == b"stays"
    assert method.message_count == 0


def test_ttl_zero_delivers_to_a_waiting_consumer(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 0})
    got = []
    channel.basic_consume(name, lambda ch, m, p, b: got.append(b), auto_ack=True)
    publisher = env.channel()
    for i in range(3):
        publisher.basic_publish("", name, b"now%d" % i)
    assert wait_until(lambda: len(got) == 3, 10.0, connections=[channel.connection])
    assert got == [b"now0", b"now1", b"now2"]


def test_ttl_zero_without_a_consumer_is_dropped_at_once(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 0})
    channel.basic_publish("", name, b"gone")
    assert channel.basic_get(name, auto_ack=True) == (None, None, None)


def test_lower_of_queue_and_message_ttl_applies(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 100})
    channel.basic_publish("", name, b"m", pika.BasicProperties(expiration="600000"))
    assert wait_until(lambda: message_count(channel, name) == 0, 10.0)


def test_requeued_messages_keep_their_expiry(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 1000})
    channel.basic_publish("", name, b"m")
    method, _, _ = channel.basic_get(name, auto_ack=False)
    time.sleep(1.2)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert wait_until(lambda: message_count(channel, name) == 0, 10.0)
    assert channel.basic_get(name, auto_ack=True) == (None, None, None)


def test_durable_spilled_messages_keep_their_ttl_across_a_restart(start_broker):
    broker = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("ttl-durable", durable=True, arguments={"x-message-ttl": 1500})
    channel.confirm_delivery()
    channel.basic_publish("", "ttl-durable", b"m", pika.BasicProperties(delivery_mode=2))
    channel.queue_declare("keep-durable", durable=True)
    channel.basic_publish("", "keep-durable", b"k", pika.BasicProperties(delivery_mode=2, expiration="600000"))
    connection.close()
    broker.stop()
    broker = start_broker(data_dir=broker.data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    # The deadline was stored with the message: it still expires, without traffic.
    assert wait_until(lambda: message_count(channel, "ttl-durable") == 0, 10.0)
    assert message_count(channel, "keep-durable") == 1
    connection.close()


# ------------------------------------------------------------------------ x-expires


def test_unused_queue_expires(env, broker):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-expires": 300})
    channel.basic_publish("", name, b"m")  # messages do not count as use
    assert wait_until(lambda: not queue_exists(broker, name), 10.0)


def test_a_queue_published_to_all_along_still_expires(env, broker):
    # RabbitMQ counts consumers, basic.get and redeclares as use, never publishes: a queue
    # published to every 0.2 s expires all the same.
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-expires": 1000})
    deadline = time.monotonic() + 15
    while queue_exists(broker, name) and time.monotonic() < deadline:
        channel.basic_publish("", name, b"m")
        channel.connection.sleep(0.2)
    assert not queue_exists(broker, name)


def test_queue_with_a_consumer_does_not_expire_and_expires_after_cancel(env, broker):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-expires": 300})
    tag = channel.basic_consume(name, lambda *a: None)
    time.sleep(0.8)
    assert queue_exists(broker, name)
    channel.basic_cancel(tag)
    assert wait_until(lambda: not queue_exists(broker, name), 10.0)


def test_redeclare_postpones_expiry(env, broker):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-expires": 2000})
    for _ in range(5):
        time.sleep(0.5)
        channel.queue_declare(name, arguments={"x-expires": 2000})
    assert queue_exists(broker, name)  # 2.5 s old, never 2 s unused
    assert wait_until(lambda: not queue_exists(broker, name), 10.0)


# ------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "arguments, text",
    [
        ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
        (
            {"x-message-ttl": "1000"},
            "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': {{unacceptable_type,longstr}}",
        ),
        ({"x-expires": 0}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': {{value_zero,0}}"),
        ({"x-expires": -5}, "invalid arg 'x-expires' for queue '{q}' in vhost '/': {{value_negative,-5}}"),
        (
            {"x-message-ttl": 4294967296},
            "invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': {{value_too_large,4294967296,4294967295}}",
        ),
    ],
)
def test_bad_ttl_arguments_are_406(env, arguments, text):
    channel = env.channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, arguments=arguments)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - " + text.format(q=name)


@pytest.mark.parametrize(
    "expiration, reason",
    [
        ("-1", "{value_negative,-1}"),
        ("abc", "no_integer"),
        ("10s", '{leftover_string,"s"}'),
    ],
)
def test_bad_expiration_property_is_406(env, expiration, reason):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"m", pika.BasicProperties(expiration=expiration))
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, passive=True)  # the next synchronous call meets the close
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == f"PRECONDITION_FAILED - invalid expiration '{expiration}': {reason}"
