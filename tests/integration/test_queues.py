"""Queues through pika: declare (server-named, passive, equivalence), exclusive and auto-delete
lifetimes, bind/unbind, purge and delete, each checked against RabbitMQ's replies.

References: rabbit_channel handle_method/6 for queue.declare/delete/purge, rabbit_amqqueue
assert_equivalence and check_exclusive_access, rabbit_misc assert_args_equivalence and val/1.
"""

from __future__ import annotations

import uuid

import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import wait_until

pytestmark = pytest.mark.timeout(60)


def locked_text(name: str) -> str:
    return (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost '/'. "
        "It could be originally declared on another connection or the exclusive property value does not "
        "match that of the original declaration."
    )


def queue_exists(env, name: str) -> bool:
    connection = env.connect()
    try:
        connection.channel().queue_declare(name, passive=True)
        return True
    except ChannelClosedByBroker as err:
        assert err.reply_code in (404, 405), err
        return err.reply_code == 405  # another connection's exclusive queue exists
    finally:
        if connection.is_open:
            connection.close()


# ------------------------------------------------------------------------------- declare


def test_server_named_queue(env):
    channel = env.channel()
    ok = channel.queue_declare("", exclusive=True).method
    assert ok.queue.startswith("amq.gen-") and len(ok.queue) > len("amq.gen-")
    assert (ok.message_count, ok.consumer_count) == (0, 0)
    other = channel.queue_declare("", exclusive=True).method.queue
    assert other != ok.queue


def test_passive_declare_of_missing_queue_is_404(env):
    channel = env.channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, passive=True)
    assert exc.value.reply_code == 404
    assert exc.value.reply_text == f"NOT_FOUND - no queue '{name}' in vhost '/'"


def test_reserved_prefix_is_refused_for_client_named_queues(env):
    channel = env.channel()
    name = "amq.test-" + uuid.uuid4().hex[:8]
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name)
    assert exc.value.reply_code == 403
    assert exc.value.reply_text == f"ACCESS_REFUSED - queue name '{name}' contains reserved prefix 'amq.*'"


@pytest.mark.parametrize(
    "first, second, field, received, current",
    [
        ({"durable": True}, {"durable": False}, "durable", "false", "true"),
        ({"durable": False}, {"durable": True}, "durable", "true", "false"),
        ({"auto_delete": False}, {"auto_delete": True}, "auto_delete", "true", "false"),
    ],
)
def test_property_equivalence(env, first, second, field, received, current):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name, **first)
    channel.queue_declare(name, **first)  # the same again: fine
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, **second)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg '{field}' for queue '{name}' in vhost '/': "
        f"received '{received}' but current is '{current}'"
    )


def test_exclusive_mismatch_is_resource_locked(env):
    # rabbit_amqqueue:assert_equivalence checks exclusive access strictly, before anything
    # else: a different `exclusive` flag is 405 RESOURCE_LOCKED (not 406), both ways.
    connection = env.connect()
    plain, exclusive = env.queue_name(), env.queue_name()
    channel = connection.channel()
    channel.queue_declare(plain)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(plain, exclusive=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (405, locked_text(plain))
    channel = connection.channel()
    channel.queue_declare(exclusive, exclusive=True)
    channel.queue_declare(exclusive, exclusive=True)
    channel.queue_declare(exclusive, passive=True)  # lax: the owner may look at it
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(exclusive, exclusive=False)
    assert (exc.value.reply_code, exc.value.reply_text) == (405, locked_text(exclusive))


def test_argument_equivalence(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name, arguments={"x-message-ttl": 1000})
    channel.queue_declare(name, arguments={"x-message-ttl": 1000})
    # Arguments RabbitMQ does not check for equivalence may differ.
    channel.queue_declare(name, arguments={"x-message-ttl": 1000, "x-custom": "anything"})
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, arguments={"x-message-ttl": 2000})
    assert exc.value.reply_code == 406
    # Both present: rabbit_misc:val/1 shows the bare values.
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{name}' in "
        "vhost '/': received '2000' but current is '1000'"
    )
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name)
    # One missing: val({Type, Value}) and val(undefined); pika sends 1000 as a signedint.
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue '{name}' in "
        "vhost '/': received none but current is the value '1000' of type 'signedint'"
    )


def test_queue_types_classic_and_quorum_are_accepted(env):
    connection = env.connect()
    channel = connection.channel()
    classic, quorum, implicit = env.queue_name("classic"), env.queue_name("quorum"), env.queue_name("implicit")
    channel.queue_declare(classic, durable=True, arguments={"x-queue-type": "classic"})
    channel.queue_declare(quorum, durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_declare(implicit, durable=True)
    # rabbitmq-common#341: a classic queue redeclared with or without x-queue-type=classic is the same.
    channel.queue_declare(implicit, durable=True, arguments={"x-queue-type": "classic"})
    channel.queue_declare(classic, durable=True)
    channel.basic_publish("", quorum, b"in-quorum")
    method, _props, body = channel.basic_get(quorum, auto_ack=True)
    assert body == b"in-quorum"
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(quorum, durable=True, arguments={"x-queue-type": "classic"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text.startswith(
        f"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue '{quorum}'"
    )


def test_declare_ok_counts_ready_messages_and_consumers(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    for i in range(3):
        channel.basic_publish("", name, b"m%d" % i)
    ok = channel.queue_declare(name, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    consumer_channel = connection.channel()
    consumer_channel.basic_qos(prefetch_count=1)
    received = []
    consumer_channel.basic_consume(name, lambda ch, method, props, body: received.append(body))
    assert wait_until(lambda: received, 5.0, connections=[connection])
    # message_count is the ready count only: the delivered-but-unacked one is not in it.
    ok = channel.queue_declare(name).method
    assert (ok.message_count, ok.consumer_count) == (2, 1)


# ----------------------------------------------------------------------------- exclusive


def test_exclusive_queue_is_locked_to_other_connections(env):
    owner = env.connect()
    name = env.queue_name()
    owner_channel = owner.channel()
    owner_channel.queue_declare(name, exclusive=True)
    owner_channel.basic_publish("", name, b"mine")
    other = env.connect()
    attempts = {
        "declare": lambda ch: ch.queue_declare(name, exclusive=True),
        "declare-passive": lambda ch: ch.queue_declare(name, passive=True),
        "consume": lambda ch: ch.basic_consume(name, lambda *a: None),
        "bind": lambda ch: ch.queue_bind(name, "amq.direct", "k"),
        "unbind": lambda ch: ch.queue_unbind(name, "amq.direct", "k"),
        "get": lambda ch: ch.basic_get(name),
        "purge": lambda ch: ch.queue_purge(name),
        "delete": lambda ch: ch.queue_delete(name),
    }
    failures = {}
    for label, attempt in attempts.items():
        channel = other.channel()
        with pytest.raises(ChannelClosedByBroker) as exc:
            attempt(channel)
        failures[label] = (exc.value.reply_code, exc.value.reply_text)
    assert failures == {label: (405, locked_text(name)) for label in attempts}
    # None of that touched the queue.
    ok = owner_channel.queue_declare(name, passive=True).method
    assert ok.message_count == 1
    owner.close()
    assert not queue_exists(env, name)


def test_exclusive_queue_goes_when_its_connection_closes(env):
    owner = env.connect()
    channel = owner.channel()
    name = channel.queue_declare("", exclusive=True).method.queue
    channel.queue_bind(name, "amq.fanout")
    assert queue_exists(env, name)
    owner.close()
    assert not queue_exists(env, name)


# --------------------------------------------------------------------------- auto-delete


def test_auto_delete_queue_goes_after_its_last_consumer_cancels(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name, auto_delete=True)
    channel.basic_publish("", name, b"m")
    channel.basic_get(name, auto_ack=True)  # a get is not a consumer
    assert queue_exists(env, name)  # never had a consumer: stays
    tag1 = channel.basic_consume(name, lambda *a: None)
    tag2 = channel.basic_consume(name, lambda *a: None)
    channel.basic_cancel(tag1)
    assert queue_exists(env, name)  # one consumer left
    channel.basic_cancel(tag2)
    assert not queue_exists(env, name)


def test_auto_delete_queue_goes_when_its_consumer_channel_closes(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name, auto_delete=True)
    channel.basic_consume(name, lambda *a: None)
    channel.close()
    assert not queue_exists(env, name)


# -------------------------------------------------------------------- bind, purge, delete


def test_bind_and_unbind(env):
    channel = env.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.queue_bind(name, "amq.direct", "key-" + name)
    channel.basic_publish("amq.direct", "key-" + name, b"bound")
    assert channel.basic_get(name, auto_ack=True)[2] == b"bound"
    channel.queue_unbind(name, "amq.direct", "key-" + name)
    channel.queue_unbind(name, "amq.direct", "key-" + name)  # a missing binding: still unbind-ok
    channel.basic_publish("amq.direct", "key-" + name, b"unbound")
    assert channel.basic_get(name, auto_ack=True) == (None, None, None)


def test_bind_to_missing_queue_or_exchange_is_404(env):
    connection = env.connect()
    name, missing_queue, missing_exchange = env.queue_name(), env.queue_name(), env.exchange_name()
    channel = connection.channel()
    channel.queue_declare(name)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_bind(missing_queue, "amq.direct", "k")
    assert (exc.value.reply_code, exc.value.reply_text) == (404, f"NOT_FOUND - no queue '{missing_queue}' in vhost '/'")
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_bind(name, missing_exchange, "k")
    assert (exc.value.reply_code, exc.value.reply_text) == (
        404,
        f"NOT_FOUND - no exchange '{missing_exchange}' in vhost '/'",
    )


def test_bind_to_the_default_exchange_is_refused(env):
    channel = env.connect().channel()
    name = env.queue_name()
    channel.queue_declare(name)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_bind(name, "", name)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        403,
        "ACCESS_REFUSED - operation not permitted on the default exchange",
    )


def test_purge_returns_the_ready_count(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    for i in range(5):
        channel.basic_publish("", name, b"m%d" % i)
    method, _props, _body = channel.basic_get(name)  # one unacked: purge leaves it alone
    assert channel.queue_purge(name).method.message_count == 4
    assert channel.basic_get(name) == (None, None, None)
    channel.basic_nack(method.delivery_tag, requeue=True)
    assert channel.queue_declare(name, passive=True).method.message_count == 1


def test_delete_if_unused_and_if_empty(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"a")
    channel.basic_publish("", name, b"b")
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_delete(name, if_empty=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        406,
        f"PRECONDITION_FAILED - queue '{name}' in vhost '/' not empty",
    )
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    tag = consumer.basic_consume(name, lambda *a: None)
    channel = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_delete(name, if_unused=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        406,
        f"PRECONDITION_FAILED - queue '{name}' in vhost '/' in use",
    )
    consumer.basic_cancel(tag)
    consumer.close()  # the unacked one goes back: two ready again
    channel = connection.channel()
    assert channel.queue_delete(name, if_unused=True).method.message_count == 2
    assert not queue_exists(env, name)


def test_delete_of_missing_queue_succeeds(env):
    channel = env.channel()
    assert channel.queue_delete(env.queue_name()).method.message_count == 0


def test_long_reply_text_is_truncated_like_rabbitmq(env):
    # rabbit_binary_generator:amqp_exception_explanation: a reply text longer than 255 bytes
    # is cut to its first 252 bytes followed by "...".
    channel = env.channel()
    name = "long-" + "x" * 240
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, passive=True)
    full = f"NOT_FOUND - no queue '{name}' in vhost '/'"
    assert exc.value.reply_text == full[:252] + "..."
