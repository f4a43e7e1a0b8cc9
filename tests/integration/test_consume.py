"""Consumers through pika: tags, exclusive consumers, cancel both ways, basic.get, mandatory
returns, round robin, consumer priorities, requeue on channel close and channel.flow.

References: rabbit_channel handle_method for basic.consume / basic.cancel / basic.get and
cancel_consumer (server-sent basic.cancel with the consumer_cancel_notify capability),
process_routing_mandatory (basic.return 312 NO_ROUTE).
"""

from __future__ import annotations

import uuid

import pika
import pytest
from pika import spec
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from ..helpers import Collector, pump, wait_until

pytestmark = pytest.mark.timeout(60)


def raw_rpc(connection, channel, method, replies):
    """Send a method pika's BlockingChannel would not send (or would check locally) and wait for the reply."""
    got = []
    channel._impl._rpc(method, got.append, replies)
    assert wait_until(lambda: got, 5.0, connections=[connection]), f"no reply to {method}"
    return got[0].method


# ------------------------------------------------------------------------------ returns


def test_mandatory_unroutable_publish_is_returned(env):
    connection = env.connect()
    channel = connection.channel()
    returned = []
    channel.add_on_return_callback(lambda ch, method, props, body: returned.append((method, props, body)))
    key = "nobody-" + uuid.uuid4().hex
    channel.basic_publish("amq.direct", key, b"back", pika.BasicProperties(headers={"h": "v"}), mandatory=True)
    channel.basic_publish("amq.direct", key, b"dropped")  # not mandatory: silently dropped
    assert wait_until(lambda: returned, 5.0, connections=[connection])
    pump([connection], 0.2)
    assert len(returned) == 1
    method, props, body = returned[0]
    assert (method.reply_code, method.reply_text, method.exchange, method.routing_key) == (
        312,
        "NO_ROUTE",
        "amq.direct",
        key,
    )
    assert body == b"back" and props.headers == {"h": "v"}


# ------------------------------------------------------------------------------ consume


def test_consumer_tags_client_and_server_generated(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    collector = Collector()
    assert channel.basic_consume(name, collector, consumer_tag="my-tag") == "my-tag"
    channel.basic_publish("", name, b"m")
    assert wait_until(lambda: collector.messages, 5.0, connections=[connection])
    assert collector.messages[0][0] == "my-tag"
    # pika always sends a tag of its own; an empty one asks the server for one (amq.ctag-…).
    other = connection.channel()
    ok = raw_rpc(connection, other, spec.Basic.Consume(queue=name, consumer_tag=""), [spec.Basic.ConsumeOk])
    assert ok.consumer_tag.startswith("amq.ctag-") and len(ok.consumer_tag) > len("amq.ctag-")
    assert channel.queue_declare(name, passive=True).method.consumer_count == 2
    cancel_ok = raw_rpc(connection, other, spec.Basic.Cancel(consumer_tag=ok.consumer_tag), [spec.Basic.CancelOk])
    assert cancel_ok.consumer_tag == ok.consumer_tag
    assert channel.queue_declare(name, passive=True).method.consumer_count == 1


def test_cancel_of_an_unknown_tag_is_answered(env):
    # rabbit_channel basic.cancel: "Spec requires we ignore this situation" (cancel-ok, no error).
    connection = env.connect()
    channel = connection.channel()
    ok = raw_rpc(connection, channel, spec.Basic.Cancel(consumer_tag="never-used"), [spec.Basic.CancelOk])
    assert ok.consumer_tag == "never-used"
    assert channel.is_open


def test_publish_with_immediate_is_not_implemented(env):
    connection = env.connect()
    channel = connection.channel()
    channel._impl._send_method(
        spec.Basic.Publish(exchange="", routing_key="x", immediate=True), (pika.BasicProperties(), b"now")
    )
    with pytest.raises(ConnectionClosedByBroker) as exc:
        pump([connection], 2.0)
    assert (exc.value.reply_code, exc.value.reply_text) == (540, "NOT_IMPLEMENTED - immediate=true")


def test_consumer_tag_reuse_on_a_channel_closes_the_connection(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_consume(name, lambda *a: None, consumer_tag="dup")
    # pika refuses a duplicate tag locally, so send the second basic.consume ourselves.
    channel._impl._send_method(spec.Basic.Consume(queue=name, consumer_tag="dup"))
    with pytest.raises(ConnectionClosedByBroker) as exc:
        pump([connection], 2.0)
    assert exc.value.reply_code == 530
    assert exc.value.reply_text == "NOT_ALLOWED - attempt to reuse consumer tag 'dup'"


def test_the_same_tag_on_two_channels_is_fine(env):
    connection = env.connect()
    name = env.queue_name()
    first, second = connection.channel(), connection.channel()
    first.queue_declare(name)
    first.basic_consume(name, lambda *a: None, consumer_tag="shared")
    second.basic_consume(name, lambda *a: None, consumer_tag="shared")
    assert first.queue_declare(name, passive=True).method.consumer_count == 2


def test_exclusive_consumer_refuses_others(env):
    connection = env.connect()
    name, busy = env.queue_name(), env.queue_name()
    channel = connection.channel()
    channel.queue_declare(name)
    channel.queue_declare(busy)
    channel.basic_consume(name, lambda *a: None, exclusive=True)
    other = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        other.basic_consume(name, lambda *a: None)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        403,
        f"ACCESS_REFUSED - queue '{name}' in vhost '/' in exclusive use",
    )
    # And an exclusive consume is refused while the queue has any consumer.
    channel.basic_consume(busy, lambda *a: None)
    other = connection.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        other.basic_consume(busy, lambda *a: None, exclusive=True)
    assert (exc.value.reply_code, exc.value.reply_text) == (
        403,
        f"ACCESS_REFUSED - queue '{busy}' in vhost '/' in exclusive use",
    )


def test_consume_from_missing_queue_is_404(env):
    channel = env.connect().channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.basic_consume(name, lambda *a: None)
    assert (exc.value.reply_code, exc.value.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")


def test_no_ack_consumer(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    collector = Collector()
    channel.basic_consume(name, collector, auto_ack=True)
    for i in range(3):
        channel.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: len(collector.messages) == 3, 5.0, connections=[connection])
    assert collector.bodies == [b"m0", b"m1", b"m2"]
    channel.basic_recover(requeue=True)  # nothing is unacked: nothing comes back
    pump([connection], 0.2)
    assert len(collector.messages) == 3
    assert channel.queue_declare(name, passive=True).method.message_count == 0


def test_client_cancel_stops_deliveries(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    collector = Collector()
    tag = channel.basic_consume(name, collector, auto_ack=True)
    channel.basic_publish("", name, b"before")
    assert wait_until(lambda: collector.messages, 5.0, connections=[connection])
    channel.basic_cancel(tag)
    channel.basic_publish("", name, b"after")
    pump([connection], 0.2)
    assert collector.bodies == [b"before"]
    assert channel.basic_get(name, auto_ack=True)[2] == b"after"


def test_queue_deletion_cancels_consumers_with_basic_cancel(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    cancels = []
    channel.add_on_cancel_callback(lambda frame: cancels.append(frame.method))
    tag = channel.basic_consume(name, lambda *a: None)
    connection.channel().queue_delete(name)
    assert wait_until(lambda: cancels, 5.0, connections=[connection])
    assert isinstance(cancels[0], spec.Basic.Cancel) and cancels[0].consumer_tag == tag
    assert channel.is_open  # only the consumer is gone


# ----------------------------------------------------------------------------------- get


def test_basic_get_and_get_empty(env):
    channel = env.connect().channel()
    name = env.queue_name()
    channel.queue_declare(name)
    for i in range(3):
        channel.basic_publish("", name, b"m%d" % i)
    counts, bodies = [], []
    for _ in range(3):
        method, _props, body = channel.basic_get(name)
        assert not method.redelivered and method.exchange == "" and method.routing_key == name
        counts.append(method.message_count)
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
    assert bodies == [b"m0", b"m1", b"m2"]
    assert counts == [2, 1, 0]  # messages left after this one
    assert channel.basic_get(name) == (None, None, None)


def test_get_from_missing_queue_is_404(env):
    channel = env.connect().channel()
    name = env.queue_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.basic_get(name)
    assert (exc.value.reply_code, exc.value.reply_text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")


# ---------------------------------------------------------------------- dispatch order


def test_round_robin_between_two_consumers(env):
    # One message at a time (each publish is its own read on the broker), so the answer does
    # not depend on how publishes are batched: equal consumers take turns.
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    collector = Collector()
    channel.basic_consume(name, collector, auto_ack=True, consumer_tag="a")
    channel.basic_consume(name, collector, auto_ack=True, consumer_tag="b")
    for i in range(6):
        channel.basic_publish("", name, b"m%d" % i)
        assert wait_until(lambda: len(collector.messages) == i + 1, 5.0, connections=[connection])
    assert collector.bodies == [b"m%d" % i for i in range(6)]
    assert [m[0] for m in collector.messages] == ["a", "b", "a", "b", "a", "b"]


def test_round_robin_burst_shares_messages(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    collector = Collector()
    channel.basic_consume(name, collector, auto_ack=True, consumer_tag="a")
    channel.basic_consume(name, collector, auto_ack=True, consumer_tag="b")
    for i in range(20):
        channel.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: len(collector.messages) == 20, 5.0, connections=[connection])
    tags = [m[0] for m in collector.messages]
    assert tags.count("a") >= 8 and tags.count("b") >= 8, tags  # both take a fair share
    assert collector.bodies == [b"m%d" % i for i in range(20)]


def test_consumer_priorities(env):
    connection = env.connect()
    name = env.queue_name()
    high_channel, low_channel = connection.channel(), connection.channel()
    high_channel.queue_declare(name)
    high_channel.basic_qos(prefetch_count=2)
    high, low = Collector(), Collector()
    low_channel.basic_consume(name, low, arguments={"x-priority": 0})
    high_channel.basic_consume(name, high, arguments={"x-priority": 10})
    for i in range(6):
        high_channel.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: len(high.messages) + len(low.messages) == 6, 5.0, connections=[connection])
    # The higher priority gets messages while it has room; the rest go to the lower one.
    assert high.bodies == [b"m0", b"m1"]
    assert low.bodies == [b"m2", b"m3", b"m4", b"m5"]
    high_channel.basic_ack(high.messages[0][1])
    high_channel.basic_publish("", name, b"m6")
    assert wait_until(lambda: len(high.messages) == 3, 5.0, connections=[connection])
    assert high.bodies[-1] == b"m6" and len(low.messages) == 4


def test_closing_a_channel_requeues_its_unacked_messages(env):
    connection = env.connect()
    name = env.queue_name()
    first = connection.channel()
    first.queue_declare(name)
    early = Collector()
    first.basic_consume(name, early)
    for i in range(3):
        first.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: len(early.messages) == 3, 5.0, connections=[connection])
    second = connection.channel()
    late = Collector()
    second.basic_consume(name, late)
    pump([connection], 0.1)
    assert late.messages == []
    first.close()
    assert wait_until(lambda: len(late.messages) == 3, 5.0, connections=[connection])
    assert late.bodies == [b"m0", b"m1", b"m2"]
    assert all(m[2] for m in late.messages), "requeued messages are redelivered=True"


def test_channel_flow_active_false_closes_the_connection_as_rabbitmq(env):
    # pika's BlockingChannel has no flow(); its underlying Channel does. The spec lets a client
    # pause deliveries with channel.flow; RabbitMQ refuses it (540, a connection error) and so
    # do we: clients use basic.qos (docs/compatibility.md).
    connection = env.connect()
    channel = connection.channel()
    flow_ok = []
    channel._impl.flow(True, flow_ok.append)
    assert wait_until(lambda: flow_ok, 5.0, connections=[connection]) and flow_ok == [True]
    channel._impl.flow(False, flow_ok.append)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        pump([connection], 2.0)
    assert (closed.value.reply_code, closed.value.reply_text) == (540, "NOT_IMPLEMENTED - active=false")


def test_closing_a_channel_gives_its_held_messages_back(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_qos(prefetch_count=1, global_qos=True)  # the channel-wide limit holds the rest
    collector = Collector()
    channel.basic_consume(name, collector)
    publisher = connection.channel()
    for i in range(3):
        publisher.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: collector.messages, 5.0, connections=[connection])
    pump([connection], 0.2)
    assert collector.bodies == [b"m0"]  # one unacked, two held back
    channel.close()
    ok = publisher.queue_declare(name, passive=True).method
    assert (ok.message_count, ok.consumer_count) == (3, 0)
    assert [publisher.basic_get(name, auto_ack=True)[2] for _ in range(3)] == [b"m0", b"m1", b"m2"]


def test_a_consumer_that_reads_late_gets_a_backlog_bigger_than_its_socket_whole_and_in_order(env):
    """Deliveries are sent straight from the pass that made them (Session.send_now) while the
    socket takes them; what it does not take goes first to the writer. 48 MiB of deliveries to
    a consumer that reads nothing meanwhile fill its socket part way through a send."""
    queue = "late-reader-" + uuid.uuid4().hex
    consumer = env.connect()
    consumer_channel = consumer.channel()
    consumer_channel.queue_declare(queue, auto_delete=True)
    got: list[bytes] = []
    consumer_channel.basic_consume(queue, lambda _c, _m, _p, body: got.append(body), auto_ack=True)
    publisher = env.connect()
    publisher_channel = publisher.channel()
    publisher_channel.confirm_delivery()
    bodies = [bytes([n]) * (256 * 1024 + n) for n in range(192)]
    for body in bodies:
        publisher_channel.basic_publish("", queue, body)  # (each confirmed: the consumer reads nothing)
    assert wait_until(lambda: len(got) == len(bodies), 30.0, connections=[consumer])
    assert [len(b) for b in got] == [len(b) for b in bodies] and got == bodies
    publisher.close()
    consumer.close()
