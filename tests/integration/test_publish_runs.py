"""Runs of alike publishes (amqp PublishesReceived; server/publish_plan.py): a client that
writes many publishes at once gets every one routed, queued in order with its own properties,
and confirmed under its own seq, whatever breaks the runs (channels, exchanges, properties,
an unroutable publish, a mandatory return)."""

from __future__ import annotations

import pytest

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import encode_content
from maxq_raft.amqp.properties import BasicProperties, encode_properties

from ..raw_client import RawClient

pytestmark = pytest.mark.timeout(60)

TRANSIENT = encode_properties(BasicProperties())
PERSISTENT_JSON = encode_properties(BasicProperties(delivery_mode=2, content_type="application/json"))
ACKS_WAIT_S = 10.0


def publish(channel: int, exchange: str, routing_key: str, props: bytes, body: bytes, mandatory=False) -> bytes:
    return encode_content(
        channel, spec.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=mandatory), props, body, 131072
    )


def test_one_write_of_many_publishes_routes_queues_and_confirms_each(env, broker):
    connection = env.connect()
    setup = connection.channel()
    a, b, fanout = env.queue_name(), env.queue_name(), env.queue_name()
    setup.queue_declare(a, durable=True)
    setup.queue_declare(b, durable=True)
    setup.exchange_declare(fanout, "fanout")
    setup.queue_bind(a, fanout)
    setup.queue_bind(b, fanout)

    client = RawClient(broker.amqp_port)
    try:
        client.open()
        client.open_channel(1)
        client.open_channel(2)
        assert client.call(1, spec.ConfirmSelect(), spec.ConfirmSelectOk)
        data = b"".join(
            [publish(1, "", a, TRANSIENT, b"p%d" % i) for i in range(50)]  # seqs 1-50
            + [publish(2, fanout, "", TRANSIENT, b"f%d" % i) for i in range(30)]  # no confirms
            + [publish(1, fanout, "", PERSISTENT_JSON, b"g%d" % i) for i in range(20)]  # 51-70
            + [publish(1, "", "nowhere", TRANSIENT, b"u%d" % i) for i in range(5)]  # 71-75, dropped
            + [publish(1, "", "nowhere", TRANSIENT, b"r%d" % i, mandatory=True) for i in range(3)]  # 76-78
            + [publish(1, "", a, TRANSIENT, b"p%d" % i) for i in range(50, 60)]  # 79-88
        )
        client.send(data)
        acked: set[int] = set()
        returned: list[bytes] = []
        while len(acked) < 88:
            frame = client.next_frame(ACKS_WAIT_S)
            assert frame is not None, f"confirms stopped at {sorted(acked)[-3:]} of 88"
            _type, channel, payload = frame
            if isinstance(payload, spec.BasicAck):
                assert channel == 1
                upto = payload.delivery_tag
                acked |= set(range(1 if payload.multiple else upto, upto + 1))
            elif isinstance(payload, spec.BasicReturn):
                assert (payload.reply_code, payload.routing_key) == (312, "nowhere")
                client.next_frame()  # its content header
                returned.append(client.next_frame()[2])
            else:
                raise AssertionError(f"unexpected {frame}")
        assert acked == set(range(1, 89))
        assert returned == [b"r0", b"r1", b"r2"]
    finally:
        client.close()

    def drain(name: str) -> list[tuple[bytes, int | None, str | None]]:
        got = []
        for _ in range(200):
            method, props, body = setup.basic_get(name, auto_ack=True)
            if method is None:
                break
            got.append((body, props.delivery_mode, props.content_type))
        return got

    pushed = [(b"f%d" % i, None, None) for i in range(30)] + [(b"g%d" % i, 2, "application/json") for i in range(20)]
    assert drain(a) == (
        [(b"p%d" % i, None, None) for i in range(50)] + pushed + [(b"p%d" % i, None, None) for i in range(50, 60)]
    )
    assert drain(b) == pushed
