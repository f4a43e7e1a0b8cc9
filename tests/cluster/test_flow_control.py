"""Flow control of a cluster member (Proposer.flow_bytes): publishing connections stop being
read while the bytes this life proposed and has not seen committed are above FLOW_BYTES_HIGH,
until they are back under FLOW_BYTES_LOW. The accounting must return to zero whatever way an
entry ends (applied, given up, the node cut off), or publishers would stay paused for good.

The end-to-end effect (an unthrottled publisher against a real 3-node cluster, which stays
available) is in test_cluster.py."""

from __future__ import annotations

import types

import trio

from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.machines.metadata import MetadataMachine
from maxq_raft.server.cluster import ClusterLog
from maxq_raft.server.proposer import FLOW_BYTES_HIGH, FLOW_BYTES_LOW

BODY = b"x" * (300 * 1024)  # over ENTRY_BYTES_TARGET: every submit is proposed at once


class RecordingNode:
    """Takes proposals and never answers them: the test decides how each ends."""

    def __init__(self) -> None:
        self.proposed: list = []

    def propose(self, group, payload, callback) -> None:
        self.proposed.append((group, payload, callback))


def run_with_cluster_log(body) -> None:
    async def main() -> None:
        # No queue record in `meta`: a queue's group is the hash of its name (ClusterLog.group_of).
        broker = types.SimpleNamespace(node_id="n1", clock_ms=lambda: 0, sessions={}, meta=MetadataMachine())
        cluster = ClusterLog(broker, RecordingNode(), 2)
        body(cluster)

    trio.run(main)


def publish(cluster: ClusterLog):
    return cluster.submit(("/", "q"), qc.Enqueue([Message("", "q", b"", BODY)]), None)


def test_publishers_pause_above_the_high_mark_and_resume_under_the_low_one():
    def body(cluster: ClusterLog) -> None:
        entries = []
        while not cluster.flow_blocked:
            entries.append(publish(cluster))
            assert len(entries) <= FLOW_BYTES_HIGH // len(BODY) + 1
        assert cluster.proposer.flow_bytes >= FLOW_BYTES_HIGH and not cluster.flow_room.is_set()
        assert cluster.proposer.flow_blocks == 1
        for entry in entries:
            cluster.proposer.complete(entry, None)
            if cluster.proposer.flow_bytes > FLOW_BYTES_LOW:
                assert cluster.flow_blocked
        assert not cluster.flow_blocked and cluster.flow_room.is_set()
        assert cluster.proposer.flow_bytes == 0
        cluster.proposer.complete(entries[0], None)  # a second completion counts nothing twice
        assert cluster.proposer.flow_bytes == 0

    run_with_cluster_log(body)


def test_an_entry_given_up_and_its_filler_leave_nothing_counted():
    def body(cluster: ClusterLog) -> None:
        entry = publish(cluster)
        assert cluster.proposer.flow_bytes == entry.flow_bytes > len(BODY)
        cluster.proposer._proposed(entry, "busy")  # retried, still counted
        assert cluster.proposer.flow_bytes == entry.flow_bytes
        entry.first_proposed -= 60.0  # past OUTCOME_WAIT_S: the next failure gives it up
        cluster.proposer._proposed(entry, "not leader")
        assert entry.done and entry.error == "not leader"
        filler = cluster.node.proposed[-1]
        assert filler[0] == entry.group and cluster.proposer.flow_bytes == 0, "the filler is not counted"

    run_with_cluster_log(body)


def test_a_node_cut_off_releases_its_paused_publishers():
    def body(cluster: ClusterLog) -> None:
        while not cluster.flow_blocked:
            publish(cluster)
        room = cluster.flow_room
        cluster._cut_off()  # its life's entries are all given up
        assert cluster.proposer.flow_bytes == 0 and not cluster.flow_blocked and room.is_set()

    run_with_cluster_log(body)
