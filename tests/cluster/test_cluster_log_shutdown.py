"""The broker's cluster glue at shutdown (long profile, seeds 2002-2006: seven broker logs ended in
TrioInternalError). A consumer release given up while the node stops must not be proposed again,
and a command submitted once the trio run has finished must not raise into the caller."""

from __future__ import annotations

import types

import trio

from maxq_raft.machines import commands as qc
from maxq_raft.machines.metadata import MetadataMachine
from maxq_raft.server.cluster import ClusterLog
from maxq_raft.server.proposer import OpenEntry


def make_cluster_log() -> ClusterLog:
    # No queue record in `meta`: a queue's group is the hash of its name (ClusterLog.group_of).
    broker = types.SimpleNamespace(node_id="n1", clock_ms=lambda: 0, meta=MetadataMachine())
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


def test_an_entry_of_a_newer_version_halts_the_member_before_anything_after_it():
    """Skipping it, as a malformed entry is skipped, would leave this member's machines unlike
    those of the members that applied it (a rolling upgrade's older member): it stops instead."""
    import msgpack

    from maxq_raft.replication.entries import encode_entry

    cluster = make_cluster_log()
    cluster.broker = types.SimpleNamespace(
        node_id="n1",
        clock_ms=lambda: 0,
        groups={"shard-0": types.SimpleNamespace(order=None)},
        send_queued=lambda: None,
    )
    told: list[str] = []
    cluster.on_fatal = told.append
    applied: list = []
    cluster._apply_entry = lambda group, index, entry: applied.append(index)
    newer = msgpack.packb([1, 0, [[["/", "q"], ["HalfCommit", "t1"], 0]], "n2", 0])
    plain = encode_entry(0, [(("/", "q"), qc.Tick())], "n2", 0)
    cluster._apply("shard-0", [(6, plain), (7, newer), (8, plain)], 2 * len(plain) + len(newer))
    assert applied == [6] and len(told) == 1
    assert "shard-0: entry 7 was written by a newer version" in told[0] and "HalfCommit" in told[0]
    assert cluster.halted == told[0]
    cluster._apply("shard-0", [(9, plain)], len(plain))
    assert applied == [6] and len(told) == 1
