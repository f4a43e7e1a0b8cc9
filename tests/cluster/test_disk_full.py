"""A 3-node cluster where one member's disk fills, or its fsyncs fail: the cluster keeps
confirming through the other two, the failed member stops (it must not count toward a majority)
and, once its disk works again, starts again by itself and catches up; no confirmed message is
lost.

Disk full: n3's data folder is on a tmpfs of 64 MB mounted by the test (root only); n1 and n2
have room. Messages are numbered 32 KiB persistent messages published with confirms through n1,
so n3's Raft logs (and the store its queues overflow into) fill its filesystem in a few seconds.
Failing fsyncs: n3 runs with the LD_PRELOAD shim of tests/faults/fsync_fail.c, and its trigger
file is created once publishing has started, then removed.
"""

from __future__ import annotations

import contextlib
import os
import struct

import pika
import pytest

from maxq_raft.server.main import RESTARTED_ENV

from ..helpers import build_fsync_shim, can_mount, grow_filesystem, small_filesystem, wait_until
from .conftest import Cluster

pytestmark = pytest.mark.timeout(300)

BODY_BYTES = 32 * 1024
PUBLISH_MAX = 6000  # far more than n3's 64 MB can hold
AFTER_FULL = 300  # published once n3 has stopped: the other two must confirm them all


def publish(member, first: int, count: int, until=None) -> set[int]:
    """Numbered persistent messages with confirms, one at a time; stops early when until() is
    true. A connection the member closes (a shard's leader changed: the outcome of the last
    publish is unknown) is opened again; only confirmed numbers are returned."""
    acked: set[int] = set()
    number = first
    for _attempt in range(20):  # bounded: reconnects
        connection = member.connect(heartbeat=0, socket_timeout=10)
        try:
            channel = connection.channel()
            channel.queue_declare("q", durable=True)
            channel.confirm_delivery()
            while number < first + count:
                number += 1
                channel.basic_publish(
                    "",
                    "q",
                    struct.pack(">Q", number - 1) + b"m" * (BODY_BYTES - 8),
                    pika.BasicProperties(delivery_mode=2),
                )
                acked.add(number - 1)
                if until is not None and number % 50 == 0 and until():
                    return acked
            return acked
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError):
            continue  # in doubt: not counted
        finally:
            if connection.is_open:
                connection.close()
    raise AssertionError(f"publishing through {member.name} kept failing")


def depth(member) -> int:
    connection = member.connect(heartbeat=0, socket_timeout=10)
    try:
        return connection.channel().queue_declare("q", passive=True).method.message_count
    finally:
        connection.close()


def drain_numbers(member, wanted: set[int]) -> set[int]:
    """The numbers consumed from the member until every wanted one came (or 5 s of nothing).
    Not until a count: a publish in doubt (its connection closed when a leader changed) may be
    in the queue too, and stopping at len(wanted) messages then missed the last confirmed one."""
    numbers: set[int] = set()
    connection = member.connect(heartbeat=0, socket_timeout=10)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=200)
        for method, _props, payload in channel.consume("q", inactivity_timeout=5):
            if method is None:
                break
            numbers.add(struct.unpack_from(">Q", payload)[0])
            channel.basic_ack(method.delivery_tag)
            if wanted <= numbers:
                break
        channel.cancel()
    finally:
        connection.close()
    return numbers


@pytest.mark.parametrize("fault", ["disk full", "fsync fails"])
def test_a_member_whose_disk_fails_stops_and_catches_up_once_it_works(tmp_path, fault, request):
    cluster = Cluster(tmp_path, extra=["--disk-free-limit-mb", "0"])
    n1, n3 = cluster["n1"], cluster["n3"]
    trigger = tmp_path / "fail-fsync-now"
    with contextlib.ExitStack() as stack:
        if fault == "disk full":
            if not can_mount():
                pytest.skip("mounting a small filesystem needs root")
            mount_point = stack.enter_context(small_filesystem(tmp_path / "fs", "64m"))
            n3.data_dir = mount_point / "n3"
            heal = lambda: grow_filesystem(mount_point)  # noqa: E731
        else:
            n3.env = dict(
                os.environ, LD_PRELOAD=str(request.getfixturevalue("fsync_shim")), MAXQ_FAIL_FSYNC_FILE=str(trigger)
            )
            heal = trigger.unlink  # noqa: E731
        try:
            cluster.start()
            stopped = lambda: "this member stops serving" in n3.log_text()  # noqa: E731
            if fault == "fsync fails":
                publish(n1, 0, 20)
                trigger.touch()
            acked = publish(n1, 0, PUBLISH_MAX, until=stopped)
            assert wait_until(stopped, 30), f"n3 never stopped ({fault}):\n" + n3.log_text()[-3000:]
            assert n3.alive(), "a member whose disk failed waits; it does not exit"
            acked |= publish(n1, 100_000, AFTER_FULL)  # n1 and n2 are a majority: all confirmed
            if fault == "fsync fails":  # it has room, but it does not start again while its disk fails
                probe_failed = lambda: "a test write in" in n3.log_text()  # noqa: E731
                assert wait_until(probe_failed, 30), n3.log_text()[-3000:]
                assert n3.alive() and n3.log_text().count("maxq-server ready") == 1, n3.log_text()[-3000:]
            heal()
            assert wait_until(lambda: n3.log_text().count("maxq-server ready") >= 2, 60), n3.log_text()[-4000:]
            assert wait_until(lambda: depth(n3) >= len(acked), 60, step_s=0.5), (depth(n3), len(acked))
            numbers = drain_numbers(n3, acked)
            assert acked <= numbers, f"{len(acked - numbers)} confirmed messages missing on n3"
        finally:
            cluster.stop()
    assert "Traceback" not in n3.log_text(), n3.log_text()[-6000:]


@pytest.fixture(scope="module")
def fsync_shim(tmp_path_factory):
    return build_fsync_shim(tmp_path_factory.mktemp("shim"))


def test_a_member_whose_start_after_a_failure_fails_again_waits_and_tries_again(tmp_path, request):
    # As if n3 had been re-executed after a storage failure (the mark server/main.py passes to
    # its next life) and its disk failed once more before the open: it must wait for a test
    # write to pass and start again, not exit and stay down.
    cluster = Cluster(tmp_path)
    n3 = cluster["n3"]
    trigger = tmp_path / "fail-fsync-now"
    trigger.touch()
    n3.env = dict(
        os.environ,
        LD_PRELOAD=str(request.getfixturevalue("fsync_shim")),
        MAXQ_FAIL_FSYNC_FILE=str(trigger),
        **{RESTARTED_ENV: "1"},
    )
    try:
        for name in ("n1", "n2"):
            cluster[name].launch()
        n3.launch()
        for name in ("n1", "n2"):
            cluster[name].wait_ready(60)
        assert wait_until(lambda: "a test write in" in n3.log_text(), 30), n3.log_text()[-3000:]
        assert n3.alive(), n3.log_text()[-3000:]
        assert "maxq-server ready" not in n3.log_text()
        trigger.unlink()
        assert wait_until(lambda: "maxq-server ready" in n3.log_text(), 60), n3.log_text()[-3000:]
        assert publish(cluster["n1"], 0, 20) == set(range(20))
        assert wait_until(lambda: depth(n3) == 20, 30, step_s=0.5), depth(n3)
    finally:
        cluster.stop()
    assert "Traceback" not in n3.log_text(), n3.log_text()[-6000:]


def test_a_member_started_by_hand_on_a_failing_disk_exits_with_the_error(tmp_path, request):
    cluster = Cluster(tmp_path)
    n3 = cluster["n3"]
    trigger = tmp_path / "fail-fsync-now"
    trigger.touch()
    n3.env = dict(os.environ, LD_PRELOAD=str(request.getfixturevalue("fsync_shim")), MAXQ_FAIL_FSYNC_FILE=str(trigger))
    try:
        n3.launch()
        assert wait_until(lambda: not n3.alive(), 30), n3.log_text()[-3000:]
        assert n3.proc.returncode == 3 and "Input/output error" in n3.log_text(), n3.log_text()[-3000:]
        assert "a test write in" not in n3.log_text()  # no waiting: an operator sees it at once
        # The store it began to create is no damage: once the disk works, it starts (it used to
        # refuse the half-made folder, "no CURRENT file", for good).
        trigger.unlink()
        cluster.start()  # (ready needs a quorum: the other two as well)
        assert "a creation that did not finish" in n3.log_text(), n3.log_text()[-3000:]
    finally:
        cluster.stop()
