"""The Prometheus port on a 3-node cluster: every member labels each Raft group, each group has
one leader across the members, and a queue is reported by its shard's leader only."""

from __future__ import annotations

import time
import uuid

from ..integration.test_prometheus import scrape

SETTLE_S = 10.0


def test_raft_groups_and_queues_across_members(cluster):
    members = [cluster[name] for name in ("n1", "n2", "n3")]
    queue = f"prom-{uuid.uuid4().hex[:8]}"
    conn = members[0].connect()
    channel = conn.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for i in range(3):
        channel.basic_publish("", queue, f"m{i}".encode())
    conn.close()

    deadline = time.monotonic() + SETTLE_S
    while True:
        scrapes = {m.name: scrape(m.prometheus_port, "/metrics/per-object") for m in members}
        leaders: dict[str, int] = {}
        ready = 0
        for samples in scrapes.values():
            for labels, value in samples["maxq_raft_group_leader"].items():
                leaders[dict(labels)["raft_group"]] = leaders.get(dict(labels)["raft_group"], 0) + int(value)
            ready += samples.get("rabbitmq_queue_messages_ready", {}).get((("queue", queue), ("vhost", "/")), 0)
        if (set(leaders.values()) == {1} and ready == 3) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert "meta" in leaders and any(g.startswith("shard-") for g in leaders), leaders
    assert set(leaders.values()) == {1}, leaders  # one leader per group, counted over the members
    assert ready == 3  # reported once: by the leader of the queue's shard
    for name, samples in scrapes.items():
        terms = samples["rabbitmq_raft_term_total"]
        assert {dict(labels)["raft_group"] for labels in terms} == set(leaders), name
        assert all(value >= 1 for value in terms.values()), name
        assert samples["rabbitmq_raft_log_commit_index"][(("raft_group", "meta"),)] >= 1
        assert samples["rabbitmq_identity_info"][(("rabbitmq_cluster", "maxq"), ("rabbitmq_node", name))] == 1
        # Every member has known a leader of each group; the journals' fdatasyncs are timed.
        changes = samples["maxq_raft_leader_changes_total"]
        assert {dict(labels)["raft_group"] for labels in changes} == set(leaders), name
        assert all(value >= 1 for value in changes.values()), name
        assert set(samples["maxq_raft_elections_started_total"]) == set(changes), name
        meta = (("raft_group", "meta"),)
        syncs = samples["maxq_raft_journal_fdatasync_seconds_count"][meta]
        assert syncs >= 1, name
        assert samples["maxq_raft_journal_fdatasync_seconds_bucket"][(("le", "+Inf"), *meta)] == syncs
        assert meta in samples["maxq_raft_snapshot_bytes"], name
    # Some member stood for election in each group (its leader, at least).
    for group in leaders:
        label = (("raft_group", group),)
        assert sum(s["maxq_raft_elections_started_total"][label] for s in scrapes.values()) >= 1, group
