"""A member that installs a snapshot tells the shell's indexes of queue settings what it
installed (server/cluster_snapshot.py through Broker.queue_settings_changed): x-trace and
x-publish-rate-limit come from the installed machines, and a queue the snapshot lacks leaves
both; the ticker's index (server/queue_timers.py) reads the installed queues' deadlines. Before, only the tracer was told: a member that caught up through a snapshot did not
limit the publishers of a queue whose limit came while it was behind."""

from __future__ import annotations

from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.server.cluster_snapshot import load_group_body

from .api import VHOST, QueueBacking, make_queue_machine
from .replica import Replica

SHARDS = ["shard-0"]
WINDOW_MAX = 64


def member_with(queues: dict[str, QueueSettings]) -> Replica:
    replica = Replica("n1", SHARDS, WINDOW_MAX)
    for queue_id, (name, settings) in enumerate(queues.items(), 1):
        backing = QueueBacking(replica.store, queue_id, False, replica.broker.epoch, None)
        machine = make_queue_machine(VHOST, name, backing=backing, durable=False, settings=settings)
        replica.broker.groups["shard-0"].queues[(VHOST, name)] = machine
    return replica


def test_an_installed_snapshot_sets_the_publish_rate_and_trace_indexes() -> None:
    leader = member_with(
        {
            "limited": QueueSettings(publish_rate_limit=100),
            "traced": QueueSettings(trace=True),
            "plain": QueueSettings(),
            "expiring": QueueSettings(expires_ms=1_000),
        }
    )
    behind = Replica.restored("n2", SHARDS, WINDOW_MAX, leader.snapshot())
    assert behind.broker.publish_rates.limits == {(VHOST, "limited"): 100}
    assert set(behind.broker.tracer.traced) == {(VHOST, "traced")}
    timers = behind.broker.queue_timers
    timers.refresh(behind.broker.queues)
    assert timers.timed() == 1, "the x-expires queue waits for its time; the others for nothing"
    assert timers.due(10**12) == [(VHOST, "expiring")]


def test_a_queue_the_snapshot_lacks_leaves_every_index() -> None:
    member = member_with({"limited": QueueSettings(publish_rate_limit=100, trace=True, expires_ms=1_000)})
    member = Replica.restored("n1", SHARDS, WINDOW_MAX, member.snapshot())
    assert member.broker.publish_rates.limits and member.broker.tracer.traced
    member.broker.queue_timers.refresh(member.broker.queues)
    assert member.broker.queue_timers.timed() == 1
    # The cluster deleted the queue while this member was behind: the snapshot it installs lacks it.
    empty = member_with({})
    index, chunks = empty.snapshot()["shard-0"]
    load_group_body(member.cluster, "shard-0", index + 1, chunks)
    assert member.broker.publish_rates.limits == {}
    assert member.broker.tracer.traced == {}
    member.broker.queue_timers.refresh(member.broker.queues)
    assert member.broker.queue_timers.timed() == 0 and member.broker.queue_timers.due(10**12) == []
