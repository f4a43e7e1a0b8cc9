"""Dead lettering through pika: x-dead-letter-exchange, x-dead-letter-routing-key, x-death.

References: RabbitMQ's dlx.md and rabbit_dead_letter (the x-death entry: count, reason, queue,
time, exchange, routing-keys, original-expiration; most recent first, one per queue and reason,
its count increased on a repeat; x-first-death-* once, x-last-death-* every time; CC keys in
routing-keys and dropped with a dead-letter routing key; `expiration` removed; fully automatic
cycles dropped, cycles through a reject allowed).
"""

from __future__ import annotations

import datetime
import time

import pika
import pytest

from ..helpers import get_one, message_count, wait_until

pytestmark = pytest.mark.timeout(60)


def test_rejected_message_is_dead_lettered_with_x_death(env):
    channel = env.channel()
    source, dead = env.queue_name(), env.queue_name()
    dlx = env.exchange_name()
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dead)
    channel.queue_bind(dead, dlx)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx})
    before = int(time.time())
    channel.basic_publish("", source, b"body", pika.BasicProperties(headers={"app": "kept"}, message_id="m1"))
    method, _, _ = get_one(channel, source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, props, body = get_one(channel, dead)
    assert body == b"body" and props.message_id == "m1" and props.headers["app"] == "kept"
    assert method.exchange == dlx and method.routing_key == source  # the message's own routing key
    (death,) = props.headers["x-death"]
    assert death["count"] == 1 and death["reason"] == "rejected" and death["queue"] == source
    assert death["exchange"] == "" and death["routing-keys"] == [source]
    assert isinstance(death["time"], datetime.datetime)
    stamp = death["time"].replace(tzinfo=datetime.UTC).timestamp()
    assert before - 1 <= stamp <= time.time() + 1
    assert props.headers["x-first-death-reason"] == "rejected"
    assert props.headers["x-first-death-queue"] == source
    assert props.headers["x-first-death-exchange"] == ""
    assert props.headers["x-last-death-reason"] == "rejected" and props.headers["x-last-death-queue"] == source
    assert message_count(channel, source) == 0


def test_expired_message_is_dead_lettered_with_original_expiration(env):
    channel = env.channel()
    source, dead = env.queue_name(), env.queue_name()
    channel.queue_declare(dead)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    channel.basic_publish("", source, b"m", pika.BasicProperties(expiration="50"))
    method, props, _ = get_one(channel, dead)
    assert props.expiration is None  # removed, as RabbitMQ, so it does not expire again
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired" and death["original-expiration"] == "50"
    assert method.routing_key == dead and death["routing-keys"] == [source]


def test_queue_ttl_expiry_dead_letters_without_original_expiration(env):
    channel = env.channel()
    source, dead = env.queue_name(), env.queue_name()
    channel.queue_declare(dead)
    channel.queue_declare(
        source, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    )
    channel.basic_publish("", source, b"m")
    _, props, _ = get_one(channel, dead)
    (death,) = props.headers["x-death"]
    assert death["reason"] == "expired" and "original-expiration" not in death


def test_maxlen_drop_head_is_dead_lettered(env):
    channel = env.channel()
    source, dead = env.queue_name(), env.queue_name()
    channel.queue_declare(dead)
    channel.queue_declare(
        source, arguments={"x-max-length": 1, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    )
    channel.basic_publish("", source, b"old")
    channel.basic_publish("", source, b"new")
    _, props, body = get_one(channel, dead)
    assert body == b"old" and props.headers["x-death"][0]["reason"] == "maxlen"


def test_cc_keys_are_routed_and_recorded_and_dropped_with_a_dead_letter_routing_key(env):
    channel = env.channel()
    source, by_cc, fixed = env.queue_name(), env.queue_name(), env.queue_name()
    dlx = env.exchange_name()
    channel.exchange_declare(dlx, "direct")
    for name in (by_cc, fixed):
        channel.queue_declare(name)
        channel.queue_bind(name, dlx, routing_key=name)
    channel.queue_declare(source, arguments={"x-dead-letter-exchange": dlx})
    channel.basic_publish("", source, b"cc", pika.BasicProperties(headers={"CC": [by_cc]}))
    method, _, _ = get_one(channel, source)
    channel.basic_nack(method.delivery_tag, requeue=False)
    _, props, _ = get_one(channel, by_cc)  # routed by its CC key
    assert props.headers["x-death"][0]["routing-keys"] == [source, by_cc]
    assert props.headers["CC"] == [by_cc]
    other = env.queue_name()
    channel.queue_declare(other, arguments={"x-dead-letter-exchange": dlx, "x-dead-letter-routing-key": fixed})
    channel.basic_publish("", other, b"cc", pika.BasicProperties(headers={"CC": [by_cc]}))
    method, _, _ = get_one(channel, other)
    channel.basic_nack(method.delivery_tag, requeue=False)
    method, props, _ = get_one(channel, fixed)
    assert method.routing_key == fixed and "CC" not in props.headers
    assert props.headers["x-death"][0]["routing-keys"] == [other, by_cc]
    assert message_count(channel, by_cc) == 0  # with a dead-letter routing key the CC key is not used


def test_x_death_count_increases_on_repeated_dead_lettering(env):
    channel = env.channel()
    work, retry = env.queue_name(), env.queue_name()
    # work --reject--> retry --expire after 50 ms--> work: the classic retry loop.
    channel.queue_declare(
        retry, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": work}
    )
    channel.queue_declare(work, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": retry})
    channel.basic_publish("", work, b"job")
    for attempt in range(1, 4):
        method, props, _ = get_one(channel, work)
        if attempt > 1:
            deaths = {(d["queue"], d["reason"]): d["count"] for d in props.headers["x-death"]}
            assert deaths == {(work, "rejected"): attempt - 1, (retry, "expired"): attempt - 1}
            assert props.headers["x-death"][0]["queue"] == retry  # the most recent first
            assert props.headers["x-first-death-queue"] == work
            assert props.headers["x-last-death-queue"] == retry
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.queue_delete(retry)


def test_fully_automatic_cycle_is_dropped(env, broker):
    channel = env.channel()
    a, b = env.queue_name(), env.queue_name()
    channel.queue_declare(
        a, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": b}
    )
    channel.queue_declare(
        b, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": a}
    )
    channel.basic_publish("", a, b"loop")
    assert wait_until(lambda: f"dead-letter cycle through queue '{a}'" in broker.logs_text(), 10), "no cycle detected"
    assert message_count(channel, a) == 0 and message_count(channel, b) == 0


def test_cycle_with_the_same_queue_as_its_own_dlx_drops_expired(env, broker):
    channel = env.channel()
    q = env.queue_name()
    channel.queue_declare(
        q, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": q}
    )
    channel.basic_publish("", q, b"self")
    assert wait_until(lambda: f"dead-letter cycle through queue '{q}'" in broker.logs_text(), 10), "no cycle detected"
    assert message_count(channel, q) == 0


def test_reject_to_itself_is_not_a_cycle(env):
    channel = env.channel()
    q = env.queue_name()
    channel.queue_declare(q, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": q})
    channel.basic_publish("", q, b"again")
    for count in (1, 2, 3):
        method, _, _ = get_one(channel, q)
        channel.basic_reject(method.delivery_tag, requeue=False)
        _, props, _ = get_one(channel, q)
        assert props.headers["x-death"][0]["count"] == count
        channel.basic_nack(0, multiple=True, requeue=True)


def test_missing_dead_letter_exchange_drops(env):
    channel = env.channel()
    q = env.queue_name()
    channel.queue_declare(q, arguments={"x-dead-letter-exchange": "no-such-exchange"})
    channel.basic_publish("", q, b"m")
    method, _, _ = get_one(channel, q)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert message_count(channel, q) == 0


def test_dead_letter_routing_key_without_exchange_is_406(env):
    from pika.exceptions import ChannelClosedByBroker

    channel = env.channel()
    q = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(q, arguments={"x-dead-letter-routing-key": "k"})
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{q}' "
        "in vhost '/': routing_key_but_no_dlx_defined"
    )


def test_dead_lettered_persistent_message_survives_a_restart(start_broker):
    broker = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    channel.queue_declare("dl-target", durable=True)
    channel.queue_declare(
        "dl-source", durable=True, arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dl-target"}
    )
    channel.confirm_delivery()
    channel.basic_publish("", "dl-source", b"keep", pika.BasicProperties(delivery_mode=2))
    method, _, _ = get_one(channel, "dl-source")
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert message_count(channel, "dl-target") == 1
    connection.close()
    broker.stop()
    broker = start_broker(data_dir=broker.data_dir)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    channel = connection.channel()
    assert message_count(channel, "dl-source") == 0
    _, props, body = get_one(channel, "dl-target")
    assert body == b"keep" and props.delivery_mode == 2 and props.headers["x-death"][0]["reason"] == "rejected"
    connection.close()


def test_x_death_count_is_encoded_as_long_as_rabbitmq_does():
    """Clients cast it (Spring AMQP: `(Long) death.get("count")`), so the type matters: 'l'."""
    from maxq_raft.amqp.properties import BasicProperties, decode_properties, encode_properties
    from maxq_raft.server.dead_letter import update_x_death

    headers = {}
    update_x_death(headers, "expired", "q1", 1_700_000_000, "", ["q1"], None)
    raw = encode_properties(BasicProperties(headers=headers))
    assert b"\x05countl\x00\x00\x00\x00\x00\x00\x00\x01" in raw
    again = dict(decode_properties(raw).headers)
    update_x_death(again, "expired", "q1", 1_700_000_001, "", ["q1"], None)  # decoded: plain ints
    update_x_death(again, "rejected", "q2", 1_700_000_002, "", ["q2"], None)
    raw = encode_properties(BasicProperties(headers=again))
    assert raw.count(b"\x05countl") == 2 and b"\x05countI" not in raw
    deaths = decode_properties(raw).headers["x-death"]
    assert [(d["queue"], d["reason"], d["count"]) for d in deaths] == [("q2", "rejected", 1), ("q1", "expired", 2)]
