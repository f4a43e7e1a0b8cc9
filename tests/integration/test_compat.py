"""Behaviours third-party clients rely on, each as RabbitMQ 3.10 has it (checked side by side on
this machine; docs/compatibility.md lists them with the test that pins each). Real clients where
a client shows the behaviour, raw frames where a client hides it (their order, a method the
libraries do not send). Also run against a 3-node cluster (scripts/test, MAXQ_TEST_CLUSTER=3)."""

from __future__ import annotations

import asyncio
import uuid

import aio_pika
import pika
import pytest
from aio_pika.patterns import RPC

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import encode_content, encode_method_frame

from ..raw_client import RawClient

TRANSIENT = b"\x00\x00"  # content properties: no flags
PERSISTENT = b"\x10\x00\x02"  # delivery-mode 2


@pytest.fixture
def raw(broker):
    clients: list[RawClient] = []

    def connect(**kwargs) -> RawClient:
        client = RawClient(broker.amqp_port)
        clients.append(client)
        client.tune = client.open(**kwargs)
        return client

    yield connect
    for client in clients:
        client.close()


def closed_with(frames: list, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
    closes = [m for ch, m in frames if ch == 0 and isinstance(m, spec.ConnectionClose)]
    assert closes, frames
    close = closes[0]
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (code, text, class_id, method_id)


# ------------------------------------------------------------------ idempotent methods


def test_unbind_is_idempotent_for_missing_queues_exchanges_and_bindings(env):
    channel = env.channel()
    queue = env.queue_name()
    channel.queue_declare(queue, auto_delete=True)
    channel.queue_unbind("never-declared-" + uuid.uuid4().hex, "amq.direct", "k")
    channel.queue_unbind(queue, "no-such-exchange-" + uuid.uuid4().hex, "k")
    channel.queue_unbind(queue, "amq.direct", "never-bound")
    channel.exchange_unbind("no-such-destination", "no-such-source", "k")
    assert channel.is_open
    # ... but unbinding from the default exchange is still refused, as RabbitMQ refuses it.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_unbind(queue, "", queue)
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"


def test_unbind_after_the_cancel_that_auto_deleted_the_queue(env):
    channel = env.channel()
    queue = channel.queue_declare("", auto_delete=True).method.queue
    channel.queue_bind(queue, "amq.direct", queue)
    tag = channel.basic_consume(queue, lambda *a: None)
    channel.basic_cancel(tag)  # its last consumer: the queue goes
    channel.queue_unbind(queue, "amq.direct", queue)
    assert channel.is_open
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        channel.queue_declare(queue, passive=True)
    assert gone.value.reply_code == 404


def test_deleting_what_is_missing_and_cancelling_an_unknown_tag_succeed(env):
    channel = env.channel()
    assert channel.queue_delete("never-declared-" + uuid.uuid4().hex).method.message_count == 0
    channel.exchange_delete("never-declared-" + uuid.uuid4().hex)
    channel.basic_cancel("no-such-consumer-tag")
    assert channel.is_open


def test_aio_pika_rpc_create_call_close_100_times(broker):
    async def rounds() -> list[int]:
        connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/")
        results = []
        async with connection:
            channel = await connection.channel()
            name = "mul-" + uuid.uuid4().hex[:8]

            async def mul(*, x: int, y: int) -> int:
                return x * y

            for i in range(100):
                rpc = await RPC.create(channel)
                await rpc.register(name, mul, auto_delete=True)
                results.append(await rpc.proxy.__getattr__(name)(x=i, y=3))
                await rpc.close()  # cancels its reply consumer, then unbinds the auto-deleted queue
            assert not channel.is_closed
        return results

    assert asyncio.run(asyncio.wait_for(rounds(), 120)) == [3 * i for i in range(100)]


# ------------------------------------------------------------------ channel.flow, channel_max


def test_channel_flow_active_false_is_not_implemented(raw):
    client = raw()
    client.open_channel(1)
    assert client.call(1, spec.ChannelFlow(active=True), spec.ChannelFlowOk).active is True
    client.method(1, spec.ChannelFlow(active=False))
    closed_with(client.frames_until_quiet(), 540, "NOT_IMPLEMENTED - active=false", 20, 20)


def test_any_channel_number_opens(raw):
    client = raw()
    tune = client.tune
    assert tune.channel_max < 65535
    client.open_channel(65535)
    client.open_channel(tune.channel_max + 1)
    client.call(65535, spec.QueueDeclare(queue="", exclusive=True, arguments={}), spec.QueueDeclareOk)


def test_one_channel_more_than_channel_max_closes_the_connection(raw):
    client = raw(channel_max=2)
    client.open_channel(1)
    client.open_channel(700)
    client.method(3, spec.ChannelOpen())
    closed_with(
        client.frames_until_quiet(),
        530,
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)",
    )


def test_a_closed_channel_makes_room_under_channel_max(raw):
    client = raw(channel_max=2)
    client.open_channel(1)
    client.open_channel(2)
    close = spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0)
    client.call(1, close, spec.ChannelCloseOk)
    client.open_channel(3)
    client.call(2, close, spec.ChannelCloseOk)
    client.open_channel(1)  # a number is free again after its close-ok


# ------------------------------------------------------------------ nothing after close-ok


@pytest.mark.parametrize("durable", [False, True], ids=["transient", "durable"])
def test_confirms_come_before_the_close_ok_and_nothing_after_it(raw, durable):
    client = raw()
    client.open_channel(1)
    queue = "compat-confirm-" + uuid.uuid4().hex[:8]
    client.call(1, spec.QueueDeclare(queue=queue, durable=durable, arguments={}), spec.QueueDeclareOk)
    client.call(1, spec.ConfirmSelect(nowait=False), spec.ConfirmSelectOk)
    publish = spec.BasicPublish(exchange="", routing_key=queue)
    props = PERSISTENT if durable else TRANSIENT
    # Three publishes and the close in one write: the server reads them together.
    data = b"".join(encode_content(1, publish, props, b"m%d" % i, 131072) for i in range(3))
    client.send(
        data + encode_method_frame(1, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    )
    frames = client.frames_until_quiet(1.0)
    kinds = [(ch, type(m).__name__) for ch, m in frames]
    assert kinds[-1] == (1, "ChannelCloseOk"), kinds
    acks = [m for ch, m in frames[:-1] if isinstance(m, spec.BasicAck)]
    assert acks and acks[-1].delivery_tag == 3, kinds  # every publish confirmed, before the close-ok
    assert all(ch == 1 and isinstance(m, spec.BasicAck) for ch, m in frames[:-1]), kinds
    client.open_channel(1)
    assert client.call(1, spec.QueueDelete(queue=queue), spec.QueueDeleteOk).message_count == 3


def test_a_read_of_many_publishes_is_performed_in_order(raw, broker):
    """A thousand publishes and a channel.close in one write (the server reads them in a few
    reads of many frames): every publish confirmed in order before the close-ok, every
    message queued in order."""
    client = raw()
    client.open_channel(1)
    queue = "compat-turns-" + uuid.uuid4().hex[:8]
    client.call(1, spec.QueueDeclare(queue=queue, arguments={}), spec.QueueDeclareOk)
    client.call(1, spec.ConfirmSelect(nowait=False), spec.ConfirmSelectOk)
    publish = spec.BasicPublish(exchange="", routing_key=queue)
    data = b"".join(encode_content(1, publish, TRANSIENT, b"m%d" % i, 131072) for i in range(1000))
    client.send(
        data + encode_method_frame(1, spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    )
    frames = client.frames_until_quiet(1.0, limit=2000)
    assert type(frames[-1][1]) is spec.ChannelCloseOk, frames[-3:]
    acks = [m for _, m in frames[:-1] if isinstance(m, spec.BasicAck)]
    confirmed = set()
    for ack in acks:  # in order, each tag once (a multiple ack covers all up to its tag)
        low = max(confirmed, default=0)
        assert ack.delivery_tag > low
        confirmed.update(range(low + 1, ack.delivery_tag + 1) if ack.multiple else [ack.delivery_tag])
    assert confirmed == set(range(1, 1001))
    connection = broker.connect()
    channel = connection.channel()
    bodies = [channel.basic_get(queue, auto_ack=True)[2] for _ in range(1000)]
    assert bodies == [b"m%d" % i for i in range(1000)]
    channel.queue_delete(queue)
    connection.close()


def test_frames_after_the_peer_close_are_dropped_until_the_close_ok(raw):
    client = raw()
    client.open_channel(1)
    close = spec.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0)
    # Anything else on the channel before our close-ok is discarded (spec 2.2.4), not an error.
    client.send(
        encode_method_frame(1, close)
        + encode_method_frame(1, spec.QueueDeclare(queue="", exclusive=True, arguments={}))
    )
    assert [(ch, type(m)) for ch, m in client.frames_until_quiet()] == [(1, spec.ChannelCloseOk)]
    client.open_channel(1)


# ------------------------------------------------------------------ update-secret, cancel order


def test_update_secret_is_answered(raw):
    client = raw()
    client.call(0, spec.ConnectionUpdateSecret(new_secret=b"guest", reason="rotation"), spec.ConnectionUpdateSecretOk)
    client.open_channel(1)  # the connection goes on


def test_queue_delete_ok_comes_before_the_cancel_of_its_consumers(raw):
    client = raw(capabilities={"consumer_cancel_notify": True})
    client.open_channel(1)
    queue = "compat-delete-" + uuid.uuid4().hex[:8]
    client.call(1, spec.QueueDeclare(queue=queue, arguments={}), spec.QueueDeclareOk)
    client.call(1, spec.BasicConsume(queue=queue, consumer_tag="c1", arguments={}), spec.BasicConsumeOk)
    client.method(1, spec.QueueDelete(queue=queue))
    kinds = [(ch, type(m)) for ch, m in client.frames_until_quiet()]
    assert kinds == [(1, spec.QueueDeleteOk), (1, spec.BasicCancel)]


def test_kombu_consumer_whose_queue_its_own_channel_deletes(broker):
    # Seen in kombu's event-loop tests (py-amqp transport): py-amqp dispatches a basic.cancel that
    # arrives while it waits for queue.delete-ok, so the order shows; RabbitMQ's is delete-ok first.
    import kombu

    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//", connect_timeout=5) as connection:
        channel = connection.default_channel  # a py-amqp Channel
        name = "compat-kombu-" + uuid.uuid4().hex[:8]
        channel.queue_declare(name, auto_delete=False)
        cancelled: list[str] = []
        tag = channel.basic_consume(name, callback=lambda message: None, on_cancel=cancelled.append)
        assert channel.queue_delete(name) == 0
        assert cancelled == [], "basic.cancel came before queue.delete-ok"
        connection.drain_events(timeout=5)
        assert cancelled == [tag]


def test_a_header_larger_than_the_consumers_frame_max_is_still_delivered(broker):
    # RabbitMQ 3.10 sends the content header as one frame whatever the consumer's frame_max
    # (it splits only the body); refusing it lost a basic.get's message and stranded a consumer's.
    queue = f"big-header-{uuid.uuid4().hex[:8]}"
    headers = {f"k{i}": i for i in range(1000)}  # ~8 KiB of properties
    publisher = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    ch = publisher.channel()
    ch.confirm_delivery()
    ch.queue_declare(queue)
    for body in (b"got", b"consumed"):
        ch.basic_publish("", queue, body, pika.BasicProperties(headers=headers))
    small = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port, frame_max=4096))
    sch = small.channel()
    method, props, body = sch.basic_get(queue, auto_ack=True)
    assert body == b"got" and props.headers == headers
    received: list = []

    def on_message(channel, method, props, body) -> None:
        received.append((body, props.headers))
        channel.basic_ack(method.delivery_tag)

    sch.basic_consume(queue, on_message)
    deadline = 50
    while not received and deadline:
        small.process_data_events(time_limit=0.1)
        deadline -= 1
    assert received == [(b"consumed", headers)]
    ch.queue_delete(queue)
    small.close()
    publisher.close()
