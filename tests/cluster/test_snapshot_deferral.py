"""A group whose queues hold more than a snapshot can afford in memory waits to be snapshotted
(server/cluster.py, SNAPSHOT_STATE_BYTES_MAX): a 30 M backlog being drained made every member of
a 3-member cluster build a snapshot of the rest in memory, past 8 GiB (one was OOM-killed)."""

from __future__ import annotations

import types

from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.server import cluster as cluster_module
from maxq_raft.server.cluster import SNAPSHOT_MESSAGE_OVERHEAD_BYTES, SNAPSHOT_STATE_BYTES_MAX
from maxq_raft.server.trace_store import _PLACE, MemoryKV, TraceLog, queue_prefix
from maxq_raft.server.tracer import Tracer

from .test_cluster_log_shutdown import make_cluster_log

GROUP = "shard-0"


def queue(ready_count: int, body_bytes: int, unacked: int = 0) -> QueueMachine:
    """A real queue machine whose counts say what a deep backlog's would (its messages spilled,
    and `unacked` in flight to receivers), without the messages."""
    machine = make_queue_machine("/", "q", backing=None, durable=False, settings=QueueSettings())
    machine.spilled_count = ready_count
    machine.ready_bytes = ready_count * body_bytes
    machine.in_flight = dict.fromkeys(range(unacked))
    assert machine.ready_count == ready_count and machine.unacked_count == unacked
    return machine


def member_with(queues: dict, log_bytes: int, monkeypatch) -> tuple:
    cluster = make_cluster_log()
    trace_log = TraceLog(MemoryKV())
    trace_log.add("/", "q", 1, 1, 0, [("enqueued", "m", None, 0, None)])  # (buffered, not written yet)
    cluster.broker = types.SimpleNamespace(queues=queues, tracer=Tracer(trace_log))
    cluster.group_of = lambda key: GROUP  # (every queue of the test in the one group)
    cluster.node = types.SimpleNamespace()
    cluster.log_bytes_since[GROUP] = log_bytes
    dumped: list = []

    def dump_group(_cluster, group, index):
        # The trace rows of what the snapshot covers are written first (a restart replays only after it).
        assert trace_log.kv.get(queue_prefix("/", "q") + _PLACE.pack(1, 1, 0)) is not None
        dumped.append(group)
        raise RuntimeError("(the test stops here: the snapshot would be made)")

    monkeypatch.setattr(cluster_module.cluster_snapshot, "dump_group", dump_group)
    return cluster, dumped


def test_a_backlog_too_big_to_snapshot_in_memory_waits(monkeypatch, caplog):
    # Enough messages that their snapshot would pass the bound, though the log is 4x their bodies
    # (so the older rule, "most of the log is queued messages", would snapshot).
    messages = SNAPSHOT_STATE_BYTES_MAX // SNAPSHOT_MESSAGE_OVERHEAD_BYTES
    cluster, dumped = member_with({("/", "big"): queue(messages, 128)}, 4 * messages * 128, monkeypatch)
    cluster._maybe_snapshot(GROUP)
    cluster._maybe_snapshot(GROUP)
    assert dumped == [] and GROUP in cluster.snapshots_deferred
    assert caplog.text.count("snapshot deferred") == 1  # (said once per episode)
    assert cluster.snapshot_next_try[GROUP] > cluster.log_bytes_since[GROUP]


def test_unacked_messages_count_too_and_a_drained_queue_is_snapshotted(monkeypatch):
    half = SNAPSHOT_STATE_BYTES_MAX // SNAPSHOT_MESSAGE_OVERHEAD_BYTES // 2
    queues = {("/", "a"): queue(half, 16, unacked=half), ("/", "b"): queue(10, 16)}
    cluster, dumped = member_with(queues, 1 << 40, monkeypatch)
    cluster._maybe_snapshot(GROUP)
    assert dumped == [] and GROUP in cluster.snapshots_deferred
    queues[("/", "a")] = queue(1000, 16)  # drained (and acked) down to a thousand
    cluster._maybe_snapshot(GROUP)
    assert dumped == [GROUP] and GROUP not in cluster.snapshots_deferred
