"""A single node whose disk fills up or whose fsyncs fail confirms nothing it did not store.

The data folder is on a tmpfs of a few tens of MB, mounted by the test (as root; skipped
otherwise) and removed after it; the alarm's free-space limit is 0, so only the failed writes
themselves stop the publisher. Every message carries its own number, so the test knows which
were acked, and checks after a SIGKILL and a restart that every one of them is there: a confirm
means stored. The node must also recover by itself once the filesystem is made bigger, take new
publishes, deliver everything, and stop on SIGTERM without a traceback.

Failing fsyncs come from an LD_PRELOAD shim (tests/faults/fsync_fail.c, built here with the C
compiler): while a trigger file exists, fsync and fdatasync return EIO.
"""

from __future__ import annotations

import os
import struct

import pika
import pytest

from ..helpers import build_fsync_shim, can_mount, grow_filesystem, small_filesystem, wait_until

pytestmark = pytest.mark.timeout(180)

BODY_BYTES = 32 * 1024
FS_SIZE = "48m"
PUBLISH_MAX = 4000  # more than a 48 MB filesystem can take of 32 KiB messages


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of FS_SIZE at tmp_path/fs (start_broker, requested after it, stops its servers first)."""
    if not can_mount():
        pytest.skip("mounting a small filesystem needs root")
    with small_filesystem(tmp_path / "fs", FS_SIZE) as mount_point:
        yield mount_point


def body(number: int) -> bytes:
    return struct.pack(">Q", number) + b"m" * (BODY_BYTES - 8)


def publish_until_refused(port: int, first: int, limit: int) -> tuple[set[int], set[int]]:
    """Publish numbered persistent messages with confirms, one at a time, until a nack, a
    blocked connection (5 s) or `limit`; returns (acked, nacked) numbers."""
    acked: set[int] = set()
    nacked: set[int] = set()
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0, blocked_connection_timeout=5)
    connection = pika.BlockingConnection(params)
    try:
        channel = connection.channel()
        channel.queue_declare("q", durable=True)
        channel.confirm_delivery()
        for number in range(first, first + limit):
            try:
                channel.basic_publish("", "q", body(number), pika.BasicProperties(delivery_mode=2))
            except pika.exceptions.NackError:
                nacked.add(number)
                if len(nacked) >= 3:
                    break
                continue
            except (pika.exceptions.ConnectionBlockedTimeout, pika.exceptions.AMQPConnectionError):
                break
            acked.add(number)
    finally:
        if connection.is_open:
            try:
                connection.close()
            except pika.exceptions.AMQPError:
                pass
    return acked, nacked


def publish_all(port: int, first: int, count: int) -> set[int]:
    acked, nacked = publish_until_refused(port, first, count)
    assert not nacked and len(acked) == count, (len(acked), sorted(nacked))
    return acked


def drain(port: int) -> set[int]:
    """Every message of q, acked as it comes (numbers, with repeats counted away)."""
    numbers: set[int] = set()
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    try:
        channel = connection.channel()
        for _ in range(PUBLISH_MAX * 3):  # bounded
            method, _props, payload = channel.basic_get("q", auto_ack=True)
            if method is None:
                break
            numbers.add(struct.unpack_from(">Q", payload)[0])
    finally:
        connection.close()
    return numbers


def test_a_full_disk_confirms_nothing_it_did_not_store(small_fs, start_broker):
    server = start_broker(["--disk-free-limit-mb", "0"], data_dir=small_fs / "data")
    acked, nacked = publish_until_refused(server.amqp_port, 0, PUBLISH_MAX)
    assert acked and len(acked) < PUBLISH_MAX, "the filesystem never filled"
    assert wait_until(lambda: "cannot write" in server.log_text(), 10)
    server.kill()
    grow_filesystem(small_fs)
    server.start()
    stored = drain(server.amqp_port)
    assert acked <= stored, f"{len(acked - stored)} confirmed messages lost, e.g. {sorted(acked - stored)[:5]}"
    assert not stored - acked - nacked - {max(acked | nacked) + 1}, "a message nobody published"


def test_the_node_recovers_by_itself_when_space_returns_and_stops_cleanly(small_fs, start_broker):
    server = start_broker(["--disk-free-limit-mb", "0"], data_dir=small_fs / "data")
    acked, _nacked = publish_until_refused(server.amqp_port, 0, PUBLISH_MAX)
    assert acked and wait_until(lambda: "cannot write" in server.log_text(), 10)
    grow_filesystem(small_fs)
    assert wait_until(lambda: "writes again" in server.log_text(), 15), server.log_text()[-3000:]
    acked |= publish_all(server.amqp_port, 100_000, 200)
    stored = drain(server.amqp_port)
    assert acked <= stored, f"{len(acked - stored)} confirmed messages not delivered"
    assert server.stop() == 0
    log = server.log_text()
    assert "Traceback" not in log, log[-5000:]
    server.start()  # and it comes back, with the drained queue empty
    assert not drain(server.amqp_port)


@pytest.fixture(scope="module")
def fsync_shim(tmp_path_factory):
    return build_fsync_shim(tmp_path_factory.mktemp("shim"))


def test_a_failed_fsync_confirms_nothing_it_covered(tmp_path, fsync_shim, start_broker):
    trigger = tmp_path / "fail-fsync-now"
    env = dict(os.environ, LD_PRELOAD=str(fsync_shim), MAXQ_FAIL_FSYNC_FILE=str(trigger))
    server = start_broker(["--disk-free-limit-mb", "0"], env=env)
    acked = publish_all(server.amqp_port, 0, 50)
    trigger.touch()
    refused_acked, refused_nacked = publish_until_refused(server.amqp_port, 1000, 50)
    # Every publish from the trigger on is covered by a failed fsync: none may be acked.
    assert not refused_acked, f"acked although their fsync failed: {sorted(refused_acked)[:5]}"
    assert refused_nacked, "no nack for the publishes whose fsync failed"
    assert "fsync failed" in server.log_text()
    trigger.unlink()
    assert wait_until(lambda: "writes again" in server.log_text(), 15), server.log_text()[-3000:]
    acked |= publish_all(server.amqp_port, 2000, 50)
    server.kill()
    server.start()
    stored = drain(server.amqp_port)
    assert acked <= stored, f"{len(acked - stored)} confirmed messages lost"
