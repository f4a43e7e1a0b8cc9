"""Consumer pauses on a 3-node cluster (issue #20, item 2): the rule is in the queue's replicated
machine, so the member that leads the queue's shard after a kill still holds it."""

from __future__ import annotations

import time
from urllib.parse import quote

import pika

from maxq_raft.server.cluster import shard_of

from ..helpers import api, wait_for

SHARDS = 2


def test_a_pause_outlives_the_death_of_the_shard_leader(cluster):
    queue = "paused-failover"
    group = shard_of(("/", queue), SHARDS)
    leader = cluster.leader_of(group)
    survivor = next(m for m in cluster.members.values() if m.name != leader)
    conn = survivor.connect(heartbeat=0)
    channel = conn.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for i in range(5):
        channel.basic_publish("", queue, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
    path = f"/api/queues/%2F/{quote(queue, safe='')}"
    assert api(survivor, "POST", f"{path}/actions", {"action": "pause_consumers"})[0] == 204

    cluster[leader].kill()
    assert wait_for(lambda: cluster.leader_of(group, via=survivor) not in (None, leader), 30, "a new leader")
    got: list[bytes] = []
    channel.basic_consume(queue, lambda ch, method, props, body: got.append(body), auto_ack=True, consumer_tag="c")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert got == []  # the new leader's machine has the rule
    view = api(survivor, "GET", path)[1]
    assert view["consumer_pauses"] == [{"scope": "queue", "key": ""}] and view["paused_consumers"] == 1

    assert api(survivor, "POST", f"{path}/actions", {"action": "resume_consumers"})[0] == 204
    deadline = time.monotonic() + 10.0
    while len(got) < 5 and time.monotonic() < deadline:
        conn.process_data_events(time_limit=0.05)
    assert got == [b"p%d" % i for i in range(5)]
    conn.close()
