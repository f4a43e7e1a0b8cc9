"""Length limits through pika: x-max-length, x-max-length-bytes, x-overflow.

References: RabbitMQ's maxlength.md (drop-head drops the oldest ready messages; reject-publish
refuses the newest and nacks confirm-mode publishers; reject-publish-dlx also dead-letters them;
only ready messages count, not unacknowledged ones) and rabbit_amqqueue declare_args for the 406s.
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from ..helpers import drain, get_one

pytestmark = pytest.mark.timeout(60)


def test_drop_head_keeps_the_newest(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-length": 3})
    for i in range(10):
        channel.basic_publish("", name, b"%d" % i)
    assert channel.queue_declare(name, passive=True).method.message_count == 3
    assert drain(channel, name) == [b"7", b"8", b"9"]


def test_max_length_bytes_drop_head(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc", b"dd"):
        channel.basic_publish("", name, body)
    assert drain(channel, name) == [b"bbbb", b"cccc", b"dd"]


def test_max_length_counts_ready_messages_only(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-length": 1})
    channel.basic_publish("", name, b"held")
    method, _, _ = channel.basic_get(name, auto_ack=False)  # unacked: not counted
    channel.basic_publish("", name, b"ready")
    assert channel.queue_declare(name, passive=True).method.message_count == 1
    channel.basic_nack(method.delivery_tag, requeue=True)
    # The requeued one goes back in front, over the limit: drop-head drops it again.
    assert drain(channel, name) == [b"ready"]


def test_reject_publish_nacks_confirmed_publishes(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-max-length": 2, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    channel.basic_publish("", name, b"1")
    channel.basic_publish("", name, b"2")
    with pytest.raises(NackError):
        channel.basic_publish("", name, b"3")
    assert drain(channel, name) == [b"1", b"2"]
    channel.basic_publish("", name, b"4")  # room again: acked
    assert drain(channel, name) == [b"4"]


def test_reject_publish_nacks_a_publish_any_routed_queue_refused(env):
    channel = env.channel()
    full, roomy = env.queue_name(), env.queue_name()
    exchange = env.exchange_name()
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(full, arguments={"x-max-length": 0, "x-overflow": "reject-publish"})
    channel.queue_declare(roomy)
    channel.queue_bind(full, exchange)
    channel.queue_bind(roomy, exchange)
    channel.confirm_delivery()
    with pytest.raises(NackError):
        channel.basic_publish(exchange, "", b"m")
    assert drain(channel, roomy) == [b"m"]  # RabbitMQ too: the other queue keeps its copy


def test_reject_publish_on_a_durable_queue_nacks_after_the_sync(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, durable=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    persistent = pika.BasicProperties(delivery_mode=2)
    channel.basic_publish("", name, b"1", persistent)
    with pytest.raises(NackError):
        channel.basic_publish("", name, b"2", persistent)
    assert drain(channel, name) == [b"1"]


def test_reject_publish_dlx_dead_letters_the_refused(env):
    channel = env.channel()
    name, dead = env.queue_name(), env.queue_name()
    channel.queue_declare(dead)
    channel.queue_declare(
        name,
        arguments={
            "x-max-length": 1,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    channel.confirm_delivery()
    channel.basic_publish("", name, b"1")
    with pytest.raises(NackError):
        channel.basic_publish("", name, b"2")
    # The nack comes when the refusal is applied; the dead letter is published after it (on a
    # cluster by the source shard's leader, into the dead queue's shard): wait for it.
    method, props, body = get_one(channel, dead)
    channel.basic_ack(method.delivery_tag)
    assert body == b"2" and props.headers["x-death"][0]["reason"] == "maxlen"
    assert drain(channel, name) == [b"1"]


@pytest.mark.parametrize(
    "arguments, error",
    [
        ({"x-max-length": -1}, "'x-max-length' for queue '{q}' in vhost '/': {{value_negative,-1}}"),
        (
            {"x-max-length-bytes": "big"},
            "'x-max-length-bytes' for queue '{q}' in vhost '/': {{unacceptable_type,longstr}}",
        ),
        ({"x-overflow": "drop-tail"}, "'x-overflow' for queue '{q}' in vhost '/': invalid_overflow"),
        ({"x-overflow": 1}, "'x-overflow' for queue '{q}' in vhost '/': {{unacceptable_type,signedint}}"),
    ],
)
def test_bad_length_arguments_are_406(env, arguments, error):
    channel = env.channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, arguments=arguments)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - invalid arg " + error.format(q=name)
