"""Large messages on a real 3-node cluster: a message and its properties travel in one Raft log
entry (the engine's 1 MiB cap), so a cluster member accepts bodies up to
`proposer.message_bytes_max` and refuses a larger one with RabbitMQ's own channel error (406,
"message size N is larger than configured max size M"); several large messages published without
waiting are each delivered whole (the proposer's entry cap itself: tests/server/test_proposer_entry_cap.py)."""

from __future__ import annotations

import hashlib
import time

import pika
import pika.exceptions
import pytest

from maxq_raft.server.proposer import message_bytes_max
from maxq_raft.server.session import CLUSTER_READ_SIZE_BYTES

FRAME_MAX = 131072  # the members' default
LIMIT = message_bytes_max(FRAME_MAX, CLUSTER_READ_SIZE_BYTES)


def body(n: int, size: int) -> bytes:
    seed = hashlib.sha256(str(n).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def test_the_largest_message_is_confirmed_and_one_byte_more_is_refused_as_rabbitmq_does(cluster):
    connection = cluster["n1"].connect(heartbeat=0)
    try:
        channel = connection.channel()
        channel.queue_declare("big", durable=True)
        channel.confirm_delivery()
        headers = {"h": "x" * 60_000}  # large properties too, within a frame
        channel.basic_publish("", "big", body(1, LIMIT), pika.BasicProperties(delivery_mode=2, headers=headers))
        method, _props, got = channel.basic_get("big", auto_ack=True)
        assert method is not None and got == body(1, LIMIT)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.basic_publish("", "big", body(2, LIMIT + 1), pika.BasicProperties(delivery_mode=2))
        assert closed.value.reply_code == 406
        assert f"message size {LIMIT + 1} is larger than configured max size {LIMIT}" in closed.value.reply_text
    finally:
        connection.close()


def test_several_large_messages_in_flight_are_each_delivered_whole(cluster):
    """Published without waiting (no confirms), so that several arrive in one pass of the node and
    would share an entry; every one must be enqueued."""
    connection = cluster["n2"].connect(heartbeat=0)
    size = 600 * 1024  # two of them would pass the entry cap together
    count = 8
    try:
        channel = connection.channel()
        channel.queue_declare("bigs", durable=True)
        for n in range(count):
            channel.basic_publish("", "bigs", body(n, size), pika.BasicProperties(delivery_mode=2, message_id=str(n)))
        got: dict[int, bytes] = {}
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:  # bounded
            method, props, payload = channel.basic_get("bigs", auto_ack=True)
            if method is None:
                connection.sleep(0.05)
                continue
            got[int(props.message_id)] = payload
        assert sorted(got) == list(range(count)) and all(got[n] == body(n, size) for n in got)
    finally:
        connection.close()
    assert "too large" not in cluster["n2"].log_text()
