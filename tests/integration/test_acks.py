"""Acknowledgements and prefetch through pika: ack / nack / reject with multiple and requeue,
redelivery order, unknown delivery tags, basic.recover, and basic.qos per consumer and global.

References: rabbit_channel collect_acks ("unknown delivery tag N"), reject/internal_reject,
basic.recover_async, basic.qos ("prefetch_size!=0 (N)", 540 NOT_IMPLEMENTED); requeued
messages return to their original place in a classic queue, so they come first, in order.
"""

from __future__ import annotations

import pytest
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from ..helpers import Collector, pump, wait_until

pytestmark = pytest.mark.timeout(60)


def setup_queue(env, count: int):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    for i in range(count):
        channel.basic_publish("", name, b"m%d" % i)
    return connection, channel, name


def counts(channel, name: str) -> tuple[int, int]:
    ok = channel.queue_declare(name, passive=True).method
    return ok.message_count, ok.consumer_count


# ------------------------------------------------------------------------------- settle


def test_ack_single_and_multiple(env):
    connection, channel, name = setup_queue(env, 5)
    collector = Collector()
    channel.basic_consume(name, collector)
    assert wait_until(lambda: len(collector.messages) == 5, 5.0, connections=[connection])
    tags = [m[1] for m in collector.messages]
    assert tags == sorted(tags) and len(set(tags)) == 5
    channel.basic_ack(tags[1], multiple=True)  # the first two
    channel.basic_ack(tags[3])  # the fourth alone
    channel.close()  # what is still unacked (3rd and 5th) goes back
    check = connection.channel()
    assert counts(check, name) == (2, 0)
    bodies = [check.basic_get(name, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"m2", b"m4"]


def test_ack_multiple_with_tag_zero_acks_everything(env):
    connection, channel, name = setup_queue(env, 3)
    collector = Collector()
    channel.basic_consume(name, collector)
    assert wait_until(lambda: len(collector.messages) == 3, 5.0, connections=[connection])
    channel.basic_ack(0, multiple=True)
    channel.close()
    assert counts(connection.channel(), name) == (0, 0)


def test_nack_multiple_requeue_redelivers_in_original_order(env):
    connection, channel, name = setup_queue(env, 4)
    collector = Collector()
    channel.basic_consume(name, collector)
    assert wait_until(lambda: len(collector.messages) == 4, 5.0, connections=[connection])
    assert not any(m[2] for m in collector.messages)
    channel.basic_nack(collector.messages[-1][1], multiple=True, requeue=True)
    assert wait_until(lambda: len(collector.messages) == 8, 5.0, connections=[connection])
    again = collector.messages[4:]
    assert [m[3] for m in again] == [b"m0", b"m1", b"m2", b"m3"]
    assert all(m[2] for m in again), "requeued messages come back with redelivered=True"
    assert len({m[1] for m in collector.messages}) == 8, "redeliveries get new delivery tags"


def test_requeued_messages_come_back_first_in_their_original_order(env):
    _connection, channel, name = setup_queue(env, 5)
    tags = [channel.basic_get(name)[0].delivery_tag for _ in range(3)]  # m0, m1, m2 unacked
    channel.basic_reject(tags[2], requeue=True)  # m2 first ...
    channel.basic_nack(tags[0], requeue=True)  # ... then m0: still m0 before m2
    channel.basic_ack(tags[1])
    got = []
    for _ in range(4):
        method, _props, body = channel.basic_get(name, auto_ack=True)
        got.append((body, method.redelivered))
    assert got == [(b"m0", True), (b"m2", True), (b"m3", False), (b"m4", False)]
    assert channel.basic_get(name) == (None, None, None)


def test_reject_and_nack_without_requeue_discard(env):
    _connection, channel, name = setup_queue(env, 3)
    tags = [channel.basic_get(name)[0].delivery_tag for _ in range(3)]
    channel.basic_reject(tags[0], requeue=False)
    channel.basic_nack(tags[2], multiple=True, requeue=False)  # tags 2 and 3
    channel.close()
    check = _connection.channel()
    assert counts(check, name) == (0, 0)


@pytest.mark.parametrize(
    "action, tag_index",
    [
        ("ack-unknown", None),
        ("ack-twice", 0),
        ("ack-multiple-acked", 0),
        ("nack-unknown", None),
        ("reject-unknown", None),
    ],
)
def test_unknown_delivery_tag_is_precondition_failed(env, action, tag_index):
    connection, channel, name = setup_queue(env, 2)
    first = channel.basic_get(name)[0].delivery_tag
    channel.basic_get(name)
    if action == "ack-unknown":
        channel.basic_ack(99)
        bad = 99
    elif action == "ack-twice":
        channel.basic_ack(first)
        channel.basic_ack(first)
        bad = first
    elif action == "ack-multiple-acked":
        # collect_acks: with multiple, the named tag itself must still be unacked.
        channel.basic_ack(first)
        channel.basic_ack(first, multiple=True)
        bad = first
    elif action == "nack-unknown":
        channel.basic_nack(99, multiple=True)
        bad = 99
    else:
        channel.basic_reject(99)
        bad = 99
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, passive=True)  # the next synchronous call sees the close
    assert (exc.value.reply_code, exc.value.reply_text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {bad}")
    assert connection.is_open
    # The failed channel's unacked messages went back.
    assert counts(connection.channel(), name)[0] == (1 if action in ("ack-twice", "ack-multiple-acked") else 2)


def test_recover_requeues_and_redelivers(env):
    connection, channel, name = setup_queue(env, 3)
    collector = Collector()
    channel.basic_consume(name, collector)
    assert wait_until(lambda: len(collector.messages) == 3, 5.0, connections=[connection])
    channel.basic_ack(collector.messages[0][1])
    channel.basic_recover(requeue=True)
    assert wait_until(lambda: len(collector.messages) == 5, 5.0, connections=[connection])
    assert [(m[3], m[2]) for m in collector.messages[3:]] == [(b"m1", True), (b"m2", True)]
    # Old tags are gone after recover.
    channel.basic_ack(collector.messages[1][1])
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(name, passive=True)
    assert exc.value.reply_code == 406


# ---------------------------------------------------------------------------------- qos


def test_prefetch_per_consumer(env):
    connection, channel, name = setup_queue(env, 6)
    channel.basic_qos(prefetch_count=1)
    a, b = Collector(), Collector()
    channel.basic_consume(name, a)
    channel.basic_consume(name, b)
    assert wait_until(lambda: a.messages and b.messages, 5.0, connections=[connection])
    pump([connection], 0.3)
    assert (len(a.messages), len(b.messages)) == (1, 1), "each consumer holds at most one unacked"
    channel.basic_ack(a.messages[0][1])
    assert wait_until(lambda: len(a.messages) == 2, 5.0, connections=[connection])
    pump([connection], 0.2)
    assert (len(a.messages), len(b.messages)) == (2, 1)
    assert counts(channel, name) == (3, 2)


def test_global_prefetch_is_channel_wide(env):
    connection, channel, name = setup_queue(env, 6)
    channel.basic_qos(prefetch_count=2, global_qos=True)
    a, b = Collector(), Collector()
    channel.basic_consume(name, a)
    channel.basic_consume(name, b)
    assert wait_until(lambda: len(a.messages) + len(b.messages) >= 2, 5.0, connections=[connection])
    pump([connection], 0.3)
    assert len(a.messages) + len(b.messages) == 2, "two unacked on the whole channel"
    first = (a.messages + b.messages)[0]
    channel.basic_ack(first[1])
    assert wait_until(lambda: len(a.messages) + len(b.messages) == 3, 5.0, connections=[connection])
    pump([connection], 0.2)
    assert len(a.messages) + len(b.messages) == 3


def test_a_run_cut_by_the_global_limit_is_written_in_order_with_consecutive_tags(env):
    # A channel-wide limit of 3 over two queues: q1's consumer takes one, then q2's queue
    # hands its consumer a run of 3 (its own prefetch is the channel's 3); the channel writes
    # two of them and holds the third; each ack lets the next one out, in order, its tag the
    # next number.
    connection, channel, q1 = setup_queue(env, 1)
    q2 = env.queue_name()
    channel.queue_declare(q2)
    for i in range(4):
        channel.basic_publish("", q2, b"b%d" % i)
    channel.basic_qos(prefetch_count=3, global_qos=True)
    collector = Collector()
    channel.basic_consume(q1, collector, consumer_tag="one")
    assert wait_until(lambda: len(collector.messages) == 1, 5.0, connections=[connection])
    channel.basic_consume(q2, collector, consumer_tag="two")
    assert wait_until(lambda: len(collector.messages) >= 3, 5.0, connections=[connection])
    pump([connection], 0.3)

    def delivered() -> list[tuple]:
        return [(consumer, tag, body) for consumer, tag, _, body in collector.messages]

    assert delivered() == [("one", 1, b"m0"), ("two", 2, b"b0"), ("two", 3, b"b1")]
    channel.basic_ack(1)
    assert wait_until(lambda: len(collector.messages) == 4, 5.0, connections=[connection])
    channel.basic_ack(3, multiple=True)
    assert wait_until(lambda: len(collector.messages) == 5, 5.0, connections=[connection])
    pump([connection], 0.2)
    assert delivered()[3:] == [("two", 4, b"b2"), ("two", 5, b"b3")]
    assert counts(connection.channel(), q2) == (0, 1)


def test_messages_held_back_by_the_global_limit_are_not_lost(env):
    # With a channel-wide limit of one and two consumers, one delivery is sent and the other
    # waits on the channel. Cancelling the waiting consumer, or closing the channel, must give
    # the waiting message back to the queue (RabbitMQ's limiter never takes it off the queue).
    connection, channel, name = setup_queue(env, 3)
    channel.basic_qos(prefetch_count=1, global_qos=True)
    a, b = Collector(), Collector()
    channel.basic_consume(name, a, consumer_tag="a")
    channel.basic_consume(name, b, consumer_tag="b")
    assert wait_until(lambda: a.messages or b.messages, 5.0, connections=[connection])
    pump([connection], 0.2)
    assert len(a.messages) + len(b.messages) == 1
    idle = "b" if a.messages else "a"
    channel.basic_cancel(idle)
    check = connection.channel()
    assert counts(check, name) == (2, 1), "the idle consumer's waiting message is back in the queue"
    channel.close()
    assert counts(check, name) == (3, 0)
    bodies = [check.basic_get(name, auto_ack=True)[2] for _ in range(3)]
    assert bodies == [b"m0", b"m1", b"m2"]


def test_prefetch_limit_does_not_apply_to_no_ack_consumers(env):
    connection, channel, name = setup_queue(env, 5)
    channel.basic_qos(prefetch_count=1)
    collector = Collector()
    channel.basic_consume(name, collector, auto_ack=True)
    assert wait_until(lambda: len(collector.messages) == 5, 5.0, connections=[connection])


def test_prefetch_size_is_not_implemented(env):
    connection = env.connect()
    channel = connection.channel()
    with pytest.raises(ConnectionClosedByBroker) as exc:
        channel.basic_qos(prefetch_size=1000)
    assert (exc.value.reply_code, exc.value.reply_text) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (1000)")
