"""Limits that hold under abuse, against a real node: what one connection can make the server
hold in memory is bounded. Every wait is bounded."""

from __future__ import annotations

import os
import struct
import time

import pika
import pytest

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import encode_frame, encode_method_frame

from ..raw_client import RawClient

pytestmark = pytest.mark.timeout(90)

BODY_BYTES = 512 * 1024
ROUNDS = 2000  # 1 GiB of get-oks if the server wrote them all into its own memory


def rss_mb(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


def test_a_peer_that_never_reads_its_get_oks_stops_being_read(start_broker):
    server = start_broker()
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=server.amqp_port))
    channel = connection.channel()
    channel.queue_declare("big")
    channel.basic_publish("", "big", b"x" * BODY_BYTES)
    time.sleep(0.5)
    before_mb = rss_mb(server.proc.pid)

    client = RawClient(server.amqp_port)
    client.open()
    client.open_channel(1)
    # basic.get and a requeueing reject, pipelined: delivery tags are 1, 2, 3, ... on the channel
    requests = b"".join(
        encode_method_frame(1, spec.BasicGet(queue="big", no_ack=False))
        + encode_method_frame(1, spec.BasicReject(delivery_tag=tag, requeue=True))
        for tag in range(1, ROUNDS + 1)
    )
    client.sock.settimeout(10)
    client.send(requests)  # ~100 KB: the kernel takes it all whether or not the server reads
    time.sleep(3.0)
    grown_mb = rss_mb(server.proc.pid) - before_mb
    assert grown_mb < 96, f"the server grew {grown_mb} MiB holding replies nobody reads"

    # The node serves everyone else meanwhile ...
    assert channel.queue_declare("big", passive=True).method.message_count == 0  # out with the get-oks
    connection.close()
    # ... and the reader is read again once it reads: every get-ok comes, in order.
    got = 0
    deadline = time.monotonic() + 60
    while got < ROUNDS and time.monotonic() < deadline:
        frame = client.next_frame(10)
        assert frame is not None, f"the connection stalled after {got} get-oks"
        if isinstance(frame[2], spec.BasicGetOk):
            got += 1
            assert frame[2].delivery_tag == got
    assert got == ROUNDS
    client.close()


def test_the_memory_alarm_stops_reading_a_publisher_in_the_middle_of_a_huge_body(start_broker):
    """A publish whose body never ends was never paused: only connections that had completed a
    publish were (issue 16). During an alarm (a 1 MiB watermark: on from the first sample) a
    connection is now also stopped once a message it is sending holds 1 MiB of body."""
    server = start_broker(["--memory-high-watermark-mb", "1"])
    time.sleep(1.5)  # the alarm samples once a second
    before_mb = rss_mb(server.proc.pid)
    client = RawClient(server.amqp_port)
    client.open()
    client.open_channel(1)
    body_bytes = 100 << 20  # (under the 128 MiB a message may have)
    frame_max = 131072
    client.send(
        encode_method_frame(1, spec.BasicPublish(exchange="", routing_key="nowhere"))
        + encode_frame(spec.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, body_bytes, 0))
    )
    chunk = encode_frame(spec.FRAME_BODY, 1, b"b" * (frame_max - 8))
    client.sock.settimeout(0.5)
    sent = 0
    deadline = time.monotonic() + 8
    while sent < body_bytes and time.monotonic() < deadline:
        try:
            client.sock.sendall(chunk)
        except TimeoutError:
            break  # the server stopped reading: the kernel's buffers are full
        sent += len(chunk)
    grown_mb = rss_mb(server.proc.pid) - before_mb
    assert sent < 64 << 20, f"{sent >> 20} MiB of the body were read during the alarm"
    assert grown_mb < 64, f"the server grew {grown_mb} MiB"
    client.close()
