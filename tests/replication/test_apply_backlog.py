"""The engine delivers committed entries no further ahead of their consumer than
APPLY_BACKLOG_BYTES_MAX (group.py): a member that replays a long log must not queue all of it
for a loop that applies slower than the hub reads. A real one-member node, its consumer stalled
and then released by the test."""

from __future__ import annotations

import collections
import threading
import time

import pytest

from maxq_raft.replication.engine import ReplicationNode
from maxq_raft.replication.group import APPLY_BACKLOG_BYTES_MAX, DELIVER_CHUNK_BYTES

from .test_engine_transport import SECRET, free_port

pytestmark = pytest.mark.timeout(180)

PAYLOAD_BYTES = 256 * 1024
ENTRIES = (3 * APPLY_BACKLOG_BYTES_MAX) // PAYLOAD_BYTES  # three times the bound


class StalledConsumer:
    """on_commit's consumer: counts what it was handed; applies only when the test says."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handed_bytes = 0
        self.applied_bytes = 0
        self.indexes: list[int] = []
        self.worst_backlog_bytes = 0

    def on_commit(self, _group: str, entries: list) -> None:
        with self.lock:
            self.handed_bytes += sum(len(p) for _i, p in entries)
            self.indexes.extend(i for i, _p in entries)
            self.worst_backlog_bytes = max(self.worst_backlog_bytes, self.backlog())

    def backlog(self) -> int:
        return self.handed_bytes - self.applied_bytes

    def apply_all(self) -> None:
        with self.lock:
            self.applied_bytes = self.handed_bytes


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_deliveries_wait_for_a_stalled_consumer_and_resume_when_it_catches_up(tmp_path):
    consumer = StalledConsumer()
    node = ReplicationNode(
        node_id="n1",
        raft_addr=("127.0.0.1", free_port()),
        peers={},
        cluster_secret=SECRET,
        data_dir=tmp_path / "n1",
        groups=["g"],
        fsync=False,
        on_commit=consumer.on_commit,
        apply_backlog_bytes=consumer.backlog,
        # A proposal is answered once delivered here, and the consumer stalls on purpose: the
        # default 10 s could time some out on a loaded machine. (CI once saw 136 of 192 delivered
        # in 30 s; rerun beside the engine cluster tests, the missing ones were refused "busy".)
        propose_timeout_s=120.0,
    )
    node.start()
    try:
        assert wait_for(lambda: node.is_leader("g"), 10), "a one-member group leads itself"
        answered: list = []
        for n in range(ENTRIES):
            node.propose("g", bytes([n % 251]) * PAYLOAD_BYTES, lambda index, error: answered.append((index, error)))
        group = node.groups["g"]
        # Stalled: the hub holds what lies beyond the bound (and says so in its stats).
        assert wait_for(lambda: group.stats["deliveries_held"] > 0, 20), group.stats
        time.sleep(0.2)  # (periodic ticks come and go: still held)
        assert consumer.handed_bytes < ENTRIES * PAYLOAD_BYTES
        assert consumer.worst_backlog_bytes <= APPLY_BACKLOG_BYTES_MAX + DELIVER_CHUNK_BYTES + PAYLOAD_BYTES
        # Released, in steps, as a loop would apply: everything committed comes, each entry once,
        # in order. (A proposal the engine refused at once as "busy", its journal behind on a
        # loaded machine, was never appended: the broker would propose it again.)
        refused = lambda: sum(1 for _index, error in answered if error == "busy")  # noqa: E731
        deadline = time.monotonic() + 90
        while len(consumer.indexes) < ENTRIES - refused() and time.monotonic() < deadline:
            consumer.apply_all()
            node.resume_deliveries()
            time.sleep(0.02)
        assert len(consumer.indexes) == ENTRIES - refused() > ENTRIES // 2, (
            len(consumer.indexes),
            collections.Counter(error for _index, error in answered),
            group.stats,
        )
        assert consumer.indexes == sorted(set(consumer.indexes))
        assert consumer.worst_backlog_bytes <= APPLY_BACKLOG_BYTES_MAX + DELIVER_CHUNK_BYTES + PAYLOAD_BYTES
        assert wait_for(lambda: len(answered) == ENTRIES, 10)
        assert {error for _index, error in answered} <= {None, "busy"}
    finally:
        node.stop()
