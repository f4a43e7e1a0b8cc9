"""The broker's cluster glue at shutdown (long profile, seeds 2002-2006: seven broker logs ended in
TrioInternalError). A consumer release given up while the node stops must not be proposed again,
and a command submitted once the trio run has finished must not raise into the caller."""

from __future__ import annotations

import types

import trio

from maxq_raft.machines import commands as qc
from maxq_raft.server.cluster import ClusterLog
from maxq_raft.server.proposer import OpenEntry


def make_cluster_log() -> ClusterLog:
    broker = types.SimpleNamespace(node_id="n1", clock_ms=lambda: 0)
    box: list = []

    async def build() -> None:
        box.append(ClusterLog(broker, None, 2))

    trio.run(build)
    return box[0]


def test_a_submit_after_the_run_finished_does_not_raise():
    cluster = make_cluster_log()  # its trio run is over, as during a node's shutdown
    entry = cluster.submit(("/", "q"), qc.Down("n1@abc/1/1"), None)
    assert entry.items and not cluster.proposer._flush_scheduled


def test_a_release_given_up_because_the_node_stops_is_not_proposed_again():
    cluster = make_cluster_log()
    entry = OpenEntry("shard-0")
    entry.items.append((("/", "q"), qc.Down("n1@abc/1/1"), 0))
    entry.seq, entry.origin = 1, cluster.origin
    entry.first_proposed = 0.0
    proposed: list = []
    proposer = cluster.proposer
    proposer._propose = lambda e: proposed.append(e)  # the engine is gone: record what would go
    proposer._proposed(entry, "stopped")
    assert entry.done and entry.error == "stopped"
    assert [e.tombstone for e in proposed] == [True], "only the seq's filler, no clean-up copy"
    assert proposer.open == {}
