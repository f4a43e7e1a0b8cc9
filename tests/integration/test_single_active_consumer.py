"""Single active consumer through pika: x-single-active-consumer.

References: RabbitMQ's consumers.md "Single Active Consumer": of the consumers of such a queue
only one gets messages at a time; when it is cancelled or its channel or connection goes, the
next one (in the order they subscribed) takes over, getting the unacknowledged messages of the
previous one again first. The queue.declare-ok consumer count counts every subscribed consumer.
"""

from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import pump, wait_until

pytestmark = pytest.mark.timeout(60)


def subscribe(env, name: str, got: list, label: str, ack: bool = True):
    connection = env.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)

    def on_message(ch, method, props, body):
        got.append((label, body, method.redelivered))
        if ack:
            ch.basic_ack(method.delivery_tag)

    tag = channel.basic_consume(name, on_message)
    return connection, channel, tag


def test_only_one_consumer_gets_messages_and_the_next_takes_over_on_cancel(env):
    publisher = env.channel()
    name = env.queue_name()
    publisher.queue_declare(name, arguments={"x-single-active-consumer": True})
    got = []
    first = subscribe(env, name, got, "first")
    second = subscribe(env, name, got, "second")
    connections = [first[0], second[0]]
    pump(connections, 0.2)  # both subscribed
    assert publisher.queue_declare(name, passive=True).method.consumer_count == 2
    for i in range(5):
        publisher.basic_publish("", name, b"%d" % i)
    assert wait_until(lambda: len(got) == 5, 10.0, connections=connections)
    assert {label for label, _, _ in got} == {"first"}
    first[1].basic_cancel(first[2])
    for i in range(5, 8):
        publisher.basic_publish("", name, b"%d" % i)
    assert wait_until(lambda: len(got) == 8, 10.0, connections=connections)
    assert [label for label, _, _ in got[5:]] == ["second"] * 3


def test_connection_loss_hands_over_with_the_unacked_messages_first(env):
    publisher = env.channel()
    name = env.queue_name()
    publisher.queue_declare(name, arguments={"x-single-active-consumer": True})
    got = []
    first = subscribe(env, name, got, "first", ack=False)
    second = subscribe(env, name, got, "second")
    third = subscribe(env, name, got, "third")
    for i in range(3):
        publisher.basic_publish("", name, b"%d" % i)
    assert wait_until(lambda: len(got) == 3, 10.0, connections=[first[0], second[0], third[0]])
    assert [label for label, _, _ in got] == ["first"] * 3
    first[0].close()  # unacked: back to the queue, to the next consumer
    publisher.basic_publish("", name, b"3")
    assert wait_until(lambda: len(got) == 7, 10.0, connections=[second[0], third[0]])
    assert got[3:] == [("second", b"0", True), ("second", b"1", True), ("second", b"2", True), ("second", b"3", False)]


def test_bad_argument_is_406(env):
    channel = env.channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, arguments={"x-single-active-consumer": "yes"})
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-single-active-consumer' for queue '{name}' "
        "in vhost '/': {unacceptable_type,longstr}"
    )
