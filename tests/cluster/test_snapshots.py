"""Snapshots and log compaction on a real 3-node cluster (--snapshot-every-mb 1): the log is
compacted below each snapshot, a restart starts from the snapshot, and a member that was down
while the others compacted past it is installed with a snapshot and then serves every message."""

from __future__ import annotations

import pika
import pytest

from ..helpers import wait_for
from .conftest import drain, running_cluster

pytestmark = pytest.mark.timeout(240)

BODY = b"x" * 4000


@pytest.fixture(params=["1"])
def snap_cluster(tmp_path, request):
    with running_cluster(tmp_path, ["--snapshot-every-mb", request.param]) as c:
        yield c


def groups(member) -> dict[str, dict]:
    return {g["group"]: g for g in member.admin("/api/cluster/status")["groups"]}


def publish_and_consume(member, queue: str, n: int) -> None:
    """n persistent messages, confirmed, then consumed and acked: log grows, state stays small."""
    conn = member.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.confirm_delivery()
        for _ in range(n):
            ch.basic_publish("", queue, BODY, pika.BasicProperties(delivery_mode=2))
    finally:
        conn.close()
    assert len(drain(member, queue, quiet_s=1.0)) == n


def compacted(member) -> bool:
    return any(g["snapshot_index"] and g["first_index"] > 1 for g in groups(member).values())


def test_snapshots_compact_the_log_and_a_member_that_fell_behind_is_installed(snap_cluster):
    n1, n2, n3 = snap_cluster["n1"], snap_cluster["n2"], snap_cluster["n3"]
    n1.connect().close()
    publish_and_consume(n1, "work", 400)  # ~1.6 MB through one shard: at least one snapshot
    for m in (n1, n2, n3):
        wait_for(lambda m=m: compacted(m), 20, f"{m.name} compacts a group's log")

    n3.stop()
    publish_and_consume(n1, "work", 600)  # the others snapshot and compact past what n3 has
    conn = n1.connect()
    ch = conn.channel()
    ch.queue_declare("kept", durable=True)
    ch.confirm_delivery()
    for i in range(50):
        ch.basic_publish("", "kept", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    conn.close()
    # Each member snapshots at its own indices and the group's leader (n1 or n2) installs its
    # own: n3 ends at or past the lower of the two compaction points.
    on_n1, on_n2 = groups(n1), groups(n2)
    shard = next(
        name for name, g in on_n1.items() if name != "meta" and g["first_index"] > 1 and on_n2[name]["first_index"] > 1
    )
    first_on_leader_at_least = min(on_n1[shard]["first_index"], on_n2[shard]["first_index"])

    snap_cluster.restart("n3")
    wait_for(
        lambda: "installed the snapshot" in n1.log_text() + n2.log_text(), 30, "the leader installs a snapshot on n3"
    )
    assert "state loaded from the snapshot" in n3.log_text()
    g3 = groups(n3)[shard]
    assert g3["first_index"] >= first_on_leader_at_least - 1 and g3["snapshot_index"] > 0, g3
    # n3 serves what was published while it was down, in order, from the installed state.
    got = drain(n3, "kept")
    assert [int(body) for body, _ in got] == list(range(50))

    # A restart starts from the member's own snapshot and replays only the log after it.
    snap_cluster.restart("n1")
    assert "starting from the snapshot" in n1.log_text()
    conn = n1.connect()
    ch = conn.channel()
    assert ch.queue_declare("work", passive=True).method.message_count == 0
    conn.close()


@pytest.mark.parametrize("snap_cluster", ["0.005"], indirect=True)
def test_a_node_added_after_compaction_is_installed_and_serves_the_queues(snap_cluster, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from ..conftest import free_port
    from .conftest import Member

    n1, n2 = snap_cluster["n1"], snap_cluster["n2"]
    conn = n1.connect()
    ch = conn.channel()
    ch.exchange_declare("events", "topic", durable=True)
    for q in ("alpha", "beta"):
        ch.queue_declare(q, durable=True)
        ch.queue_bind(q, "events", f"{q}.#")
    for i in range(60):  # metadata traffic, so that the meta group's log is compacted too
        ch.queue_declare(f"temp-{i}")
        ch.queue_delete(f"temp-{i}")
    conn.close()
    publish_and_consume(n1, "churn", 400)
    conn = n1.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(30):
        ch.basic_publish(
            "events", f"{'alpha' if i % 2 else 'beta'}.x", str(i).encode(), pika.BasicProperties(delivery_mode=2)
        )
    conn.close()
    for m in (n1, n2):
        wait_for(
            lambda m=m: (
                groups(m)["meta"]["first_index"] > 1 and sum(g["first_index"] > 1 for g in groups(m).values()) >= 2
            ),
            20,
            f"{m.name} compacts the logs",
        )

    ports = {name: snap_cluster[name].raft_port for name in ("n1", "n2", "n3")}
    new = Member("n4", tmp_path, free_port(), ports, ["--join", "on", "--snapshot-every-mb", "1"])
    maxqctl = str(Path(sys.executable).parent / "maxqctl")
    try:
        new.launch()
        added = subprocess.run(
            [
                maxqctl,
                "--node",
                f"127.0.0.1:{n2.http_port}",
                "add-node",
                "n4",
                "--raft-addr",
                f"127.0.0.1:{new.raft_port}",
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert added.returncode == 0, (added.stdout, added.stderr, new.log_text()[-3000:])
        new.wait_ready(90)
        assert "state loaded from the snapshot" in new.log_text()
        conn = new.connect()
        ch = conn.channel()
        ch.exchange_declare("events", "topic", passive=True)
        assert ch.queue_declare("alpha", passive=True).method.message_count == 15
        conn.close()
        assert sorted(int(b) for b, _ in drain(new, "beta")) == list(range(0, 30, 2))
    finally:
        new.stop()


@pytest.mark.parametrize("snap_cluster", ["0.005"], indirect=True)
def test_a_member_declared_down_while_away_learns_it_from_the_snapshot_and_serves_again(snap_cluster):
    """jepsen long seed 2002: a member the others declared down while it was cut off caught up by
    a snapshot that held its Down; it never applied that Down itself, kept its old life, and all
    its commands were skipped by every member: its clients waited forever."""
    import os
    import signal
    import subprocess
    import sys
    import time

    n1, n3 = snap_cluster["n1"], snap_cluster["n3"]
    conn = n3.connect()
    conn.channel().queue_declare("before", durable=True)
    conn.close()
    os.kill(n3.pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: "member n3 silent" in n1.log_text() + snap_cluster["n2"].log_text(),
            30,
            "the others to declare n3 down",
        )
        # ~200 KB through each shard: both compact past the Down (shard-0's is the one a member
        # notices its own Down by, when it applies it)
        from maxq_raft.server.cluster import shard_of

        for shard in ("shard-0", "shard-1"):
            name = next(f"away-{i}" for i in range(1000) if shard_of(("/", f"away-{i}"), 2) == shard)
            publish_and_consume(n1, name, 50)
        for _ in range(60):  # and the metadata group too
            c = n1.connect()
            ch = c.channel()
            for i in range(20):
                ch.queue_declare(f"meta-{i}")
                ch.queue_delete(f"meta-{i}")
            c.close()
            if all(g["first_index"] > 1 for g in groups(n1).values()):
                break
    finally:
        os.kill(n3.pid, signal.SIGCONT)

    # Each try in its own process, killed after 10 s: the bug made a declare wait forever.
    probe = (
        "import pika, sys\n"
        "c = pika.BlockingConnection(pika.ConnectionParameters('127.0.0.1', int(sys.argv[1]), socket_timeout=5))\n"
        "ch = c.channel()\nch.confirm_delivery()\nch.queue_declare('after', durable=True)\n"
        "ch.basic_publish('', 'after', b'back', pika.BasicProperties(delivery_mode=2))\nc.close()\n"
    )

    def declares_and_confirms_on_n3() -> bool:
        try:
            done = subprocess.run([sys.executable, "-c", probe, str(n3.amqp_port)], capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    started = time.monotonic()
    wait_for(declares_and_confirms_on_n3, 60, "n3 to declare and confirm again", step_s=0.5)
    print(f"\nn3 served again {time.monotonic() - started:.1f} s after it was resumed")
    assert [b for b, _ in drain(n1, "after")] == [b"back"]


@pytest.mark.parametrize("snap_cluster", ["0.005"], indirect=True)
def test_a_member_installed_with_one_groups_snapshot_closes_only_that_groups_clients(snap_cluster):
    """n3, away for a moment (not long enough to be declared down), comes back to a new leader of
    one group whose log was compacted past n3's meanwhile (a follower compacts freely), so it is
    installed with that group's snapshot: its clients of that group's queues are closed (what
    they saw jumps), and its clients of the other group's queues stay connected and served.
    Before, every client connection of n3 was closed."""
    import os
    import signal
    import time

    from maxq_raft.server.cluster import shard_of

    from ..helpers import api

    n1, n2, n3 = snap_cluster["n1"], snap_cluster["n2"], snap_cluster["n3"]
    hot, quiet = (
        next(f"{shard}-q{i}" for i in range(1000) if shard_of(("/", f"{shard}-q{i}"), 2) == shard)
        for shard in ("shard-0", "shard-1")
    )
    shard = shard_of(("/", hot), 2)
    setup = n1.connect()
    for q in (hot, quiet):
        setup.channel().queue_declare(q, durable=True)
    setup.close()
    # The hot group led by n1, which then goes away with what it had not sent n3 yet; n2, its
    # follower meanwhile, compacted past n3's log and leads it next.
    leader = groups(n1)[shard]["leader"]
    if leader != "n1":
        status, body, _ = api(
            snap_cluster[leader], "POST", "/api/cluster/transfer-leadership", {"group": shard, "node": "n1"}
        )
        assert status == 200, body
    wait_for(lambda: groups(n1)[shard]["leader"] == "n1", 10, f"n1 to lead {shard}")

    got: dict[str, list[bytes]] = {hot: [], quiet: []}
    consumers = {}
    for q in (hot, quiet):
        conn = n3.connect()
        ch = conn.channel()
        ch.basic_consume(q, lambda c, m, p, b, q=q: (got[q].append(b), c.basic_ack(m.delivery_tag)))
        consumers[q] = conn
    idle = n3.connect()  # a connection with no channel at all
    for conn in consumers.values():
        conn.process_data_events(0.2)

    publisher = n1.connect()
    pch = publisher.channel()
    pch.confirm_delivery()
    # 8 MiB: more than n3's socket takes in while it is stopped, so that what n1 sends it after
    # that is lost with n1. Away for well under the 3 s after which the others would declare it
    # down (which closes all its clients for that reason).
    sent = [bytes([65 + i]) * (512 * 1024) for i in range(16)]
    os.kill(n3.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        for body in sent:
            pch.basic_publish("", hot, body, pika.BasicProperties(delivery_mode=2))
        publisher.close()
        last = groups(n2)[shard]["last_index"]
        while time.monotonic() - frozen_at < 2.0 and groups(n2)[shard]["first_index"] < last - 2:
            time.sleep(0.02)
        compacted = groups(n2)[shard]["first_index"] >= last - 2
        n1.kill()
        away_s = time.monotonic() - frozen_at
    finally:
        os.kill(n3.pid, signal.SIGCONT)
    if not compacted or away_s > 2.5:
        pytest.skip(f"n2 did not compact {shard} within the 2.5 s n3 could stay away (a loaded machine)")
    wait_for(lambda: "state loaded from the snapshot" in n3.log_text(), 30, "n3 to install the hot group's snapshot")
    assert "member n3 silent" not in n2.log_text()

    def closed(conn) -> bool:
        try:
            conn.process_data_events(0.1)
        except pika.exceptions.AMQPConnectionError:
            return True
        return not conn.is_open

    wait_for(lambda: closed(consumers[hot]), 10, "the hot queue's consumer on n3 to be closed")
    # The other group's consumer and the idle connection stay, and are still served.
    conn = n2.connect()
    ch = conn.channel()
    ch.confirm_delivery()
    ch.basic_publish("", quiet, b"still here", pika.BasicProperties(delivery_mode=2))
    conn.close()
    wait_for(
        lambda: (consumers[quiet].process_data_events(0.1), got[quiet] == [b"still here"])[1],
        10,
        "the quiet queue's consumer on n3 to get a message published after the install",
    )
    idle.process_data_events(0.1)
    assert idle.is_open and consumers[quiet].is_open
    idle.close()
    consumers[quiet].close()
    # Every confirmed message of the hot queue is there: acked by n3's consumer before it was
    # closed, or back in the queue.
    left = [body for body, _ in drain(n2, hot)]
    assert set(got[hot] + left) == set(sent)
    snap_cluster.restart("n1")
