"""Every holder of a queue's group restarts while a member without its replica serves that
queue's consumer: 7 members, factor 3, so the cluster keeps its majority meanwhile.

The restarted holders replay the group's log, and the one elected applies it as leader. Until
2026-12-06 it sent the member every delivery of that replay: the member wrote again what its
consumer had acked long before (its memory of the deliveries written keeps the last 1,024 per
consumer), none flagged redelivered (1,816 of 3,000 in a first run by hand). A leader now sends
no delivery of an entry appended before its leadership, and resyncs once it has applied them
(server/remote.py, `Sender.catching_up`).

The replay also told the member of the deletions in it again: a queue deleted and declared
again under the same name, in the same group or another, lost its consumers there (cancelled,
while the group's machine kept them, so what it checked out to them was stuck). A deletion of
an earlier term is told with the new leader's resync, if its name is not in the group again,
and the member drops one whose name its metadata places in another group now. (A member saves
its commit index once a second and applies up to it as a follower when it starts: the
deletions here come just before the kill, to be in the part it applies as leader.)
"""

from __future__ import annotations

import time
from pathlib import Path

import pika

from ..helpers import wait_for
from .conftest import running_cluster
from .test_held_groups import held_by

MEMBERS = 7
FACTOR = 3
SHARDS = 7
ACKED = 1500  # more than a member remembers per consumer (remote.DELIVERIES_SEEN_MAX)
AFTER = 100


def test_a_group_whose_holders_all_restart_sends_no_acked_message_again(tmp_path: Path) -> None:
    extra = ["--shards", str(SHARDS), "--replication-factor", str(FACTOR)]
    with running_cluster(tmp_path, extra, MEMBERS) as cluster:
        n1 = cluster["n1"]
        conn = n1.connect(heartbeat=0)
        channel = conn.channel()
        held = held_by(n1)
        name = group = ""
        for i in range(100):
            name = f"restart-{i}"
            channel.queue_declare(name, durable=True)
            group = n1.admin(f"/api/queues/%2F/{name}")["group"]
            if group not in held:
                break
            channel.queue_delete(name)
        assert group not in held, "no queue of a group n1 holds no replica of"
        holders = sorted(m.name for m in cluster.alive() if group in held_by(m))
        assert len(holders) == FACTOR, holders
        declared_again = names_in(channel, n1, group, "again", 2)

        channel.confirm_delivery()
        for n in range(ACKED):
            channel.basic_publish("", name, str(n).encode(), pika.BasicProperties(delivery_mode=2))
        got: list[tuple[int, bool]] = []
        channel.basic_qos(prefetch_count=50)
        channel.basic_consume(
            name, lambda c, m, _p, b: (got.append((int(b), m.redelivered)), c.basic_ack(m.delivery_tag))
        )

        def pump(until, limit_s: float) -> None:
            deadline = time.monotonic() + limit_s
            while not until() and time.monotonic() < deadline:
                conn.process_data_events(0.1)

        pump(lambda: len(got) >= ACKED, 60)
        assert sorted(n for n, _ in got) == list(range(ACKED))

        def all_acked() -> bool:
            conn.process_data_events(0)
            queue = cluster[holders[0]].admin(f"/api/queues/%2F/{name}")
            return queue["messages"] == 0 and queue["messages_unacknowledged"] == 0

        wait_for(all_acked, 20, "every ack applied before the restart")

        # Deleted in `group` and declared again: one in it again (its hash), one in a group n1
        # holds (client-local); each consumed on n1 at once.
        got_again: dict[str, list[int]] = {q: [] for q in declared_again}
        cancelled: list = []
        channel.add_on_cancel_callback(cancelled.append)
        for queue, locator in zip(declared_again, ("balanced", "client-local"), strict=True):
            channel.queue_delete(queue)
            channel.queue_declare(queue, durable=True, arguments={"x-queue-leader-locator": locator})
            channel.basic_consume(
                queue, lambda c, m, _p, b, q=queue: (got_again[q].append(int(b)), c.basic_ack(m.delivery_tag))
            )
        for holder in holders:
            cluster[holder].kill()
        for holder in holders:
            cluster[holder].launch()
        for holder in holders:
            cluster[holder].wait_ready(60)
        wait_for(lambda: cluster.leader_of(group, cluster[holders[0]]) is not None, 30, f"a leader of {group}")
        pump(lambda: False, 5)
        again = [(n, redelivered) for n, redelivered in got[ACKED:]]
        assert again == [], f"{len(again)} acked messages came again after the restart, e.g. {again[:5]}"

        assert cancelled == [], "a consumer of a queue declared again was cancelled by the replay of its deletion"
        assert n1.admin(f"/api/queues/%2F/{declared_again[0]}")["group"] == group
        assert n1.admin(f"/api/queues/%2F/{declared_again[1]}")["group"] in held

        # And the group serves the consumer as before: what is published now comes, once.
        for n in range(ACKED, ACKED + AFTER):
            for queue in (name, *declared_again):
                channel.basic_publish("", queue, str(n).encode(), pika.BasicProperties(delivery_mode=2))
        pump(lambda: len(got) >= ACKED + AFTER and all(len(g) >= AFTER for g in got_again.values()), 30)
        assert [n for n, _ in got[ACKED:]] == list(range(ACKED, ACKED + AFTER))
        assert got_again == {queue: list(range(ACKED, ACKED + AFTER)) for queue in declared_again}
        conn.close()


def names_in(channel, node, group: str, prefix: str, count: int) -> list[str]:
    """`count` queues declared through `node` (balanced: by their names' hash) in `group`."""
    names: list[str] = []
    for i in range(200):
        if len(names) == count:
            break
        name = f"{prefix}-{i}"
        channel.queue_declare(name, durable=True)
        if node.admin(f"/api/queues/%2F/{name}")["group"] == group:
            names.append(name)
        else:
            channel.queue_delete(name)
    assert len(names) == count, f"{len(names)} of {count} names in {group}"
    return names
