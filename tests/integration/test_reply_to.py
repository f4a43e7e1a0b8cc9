"""Direct reply-to (amq.rabbitmq.reply-to) through pika: an RPC round trip, and the errors.

References: rabbit_channel handle_method basic.consume for <<"amq.rabbitmq.reply-to">> ("reply
consumer cannot acknowledge", "reply consumer already set"), maybe_set_fast_reply_to ("fast
reply consumer does not exist"), and the queue.declare clause for the pseudo-queue (it exists,
with one consumer).
"""

from __future__ import annotations

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import pump, wait_until

pytestmark = pytest.mark.timeout(60)

REPLY_TO = "amq.rabbitmq.reply-to"


def test_rpc_round_trip(env):
    server_connection, client_connection = env.connect(), env.connect()
    request_queue = env.queue_name("rpc")
    server = server_connection.channel()
    server.queue_declare(request_queue)

    def serve(channel, method, props, body):
        assert props.reply_to.startswith(REPLY_TO + ".") and props.reply_to != REPLY_TO + "."
        channel.basic_publish(
            "", props.reply_to, body.upper(), pika.BasicProperties(correlation_id=props.correlation_id)
        )
        channel.basic_ack(method.delivery_tag)
        seen_reply_to.append(props.reply_to)

    seen_reply_to = []
    server.basic_consume(request_queue, serve)

    client = client_connection.channel()
    replies = []
    reply_tag = client.basic_consume(REPLY_TO, lambda ch, m, p, b: replies.append((m, p, b)), auto_ack=True)
    for i in range(3):
        client.basic_publish(
            "", request_queue, b"ping%d" % i, pika.BasicProperties(reply_to=REPLY_TO, correlation_id=f"c{i}")
        )
    assert wait_until(lambda: len(replies) == 3, 5.0, connections=[server_connection, client_connection])
    assert [(p.correlation_id, b) for _m, p, b in replies] == [("c0", b"PING0"), ("c1", b"PING1"), ("c2", b"PING2")]
    method = replies[0][0]
    assert method.consumer_tag == reply_tag
    assert method.exchange == "" and method.routing_key == seen_reply_to[0]
    assert len(set(seen_reply_to)) == 1, "one address per reply consumer"
    # The address is alive while the reply consumer is: declaring it passively works.
    ok = server.queue_declare(seen_reply_to[0], passive=True).method
    assert ok.queue == seen_reply_to[0]
    # Once the client is gone, the address is not.
    client_connection.close()
    with pytest.raises(ChannelClosedByBroker) as exc:
        server.queue_declare(seen_reply_to[0], passive=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        404,
        f"NOT_FOUND - no queue '{seen_reply_to[0]}' in vhost '/'",
    )


def test_reply_pseudo_queue_can_be_declared(env):
    channel = env.connect().channel()
    ok = channel.queue_declare(REPLY_TO).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (REPLY_TO, 0, 1)


def test_reply_consumer_must_be_no_ack(env):
    channel = env.connect().channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - reply consumer cannot acknowledge",
    )


def test_only_one_reply_consumer_per_channel(env):
    channel = env.connect().channel()
    channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (406, "PRECONDITION_FAILED - reply consumer already set")


def test_publishing_with_reply_to_needs_a_reply_consumer(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"req", pika.BasicProperties(reply_to=REPLY_TO))
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, passive=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        406,
        "PRECONDITION_FAILED - fast reply consumer does not exist",
    )
    assert connection.channel().queue_declare(name, passive=True).method.message_count == 0


def test_cancelled_reply_consumer_gets_no_more_replies(env):
    connection = env.connect()
    client = connection.channel()
    replies = []
    tag = client.basic_consume(REPLY_TO, lambda ch, m, p, b: replies.append(b), auto_ack=True)
    name = env.queue_name()
    client.queue_declare(name)
    client.basic_publish("", name, b"req", pika.BasicProperties(reply_to=REPLY_TO))
    address = client.basic_get(name, auto_ack=True)[1].reply_to
    server = connection.channel()
    server.basic_publish("", address, b"first")
    assert wait_until(lambda: replies == [b"first"], 5.0, connections=[connection])
    client.basic_cancel(tag)
    server.basic_publish("", address, b"late")  # dropped: nobody holds the address
    pump([connection], 0.2)
    assert replies == [b"first"]
    assert server.is_open
