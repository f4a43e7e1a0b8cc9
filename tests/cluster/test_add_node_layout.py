"""A new member's layout must be the cluster's: `maxqctl add-node` refuses one that would be added
to groups it does not run (admin.py, `_layout_mismatch`), and changes nothing.

The default --replication-factor is 3 (issue #19), and a cluster of 3 started with it is placed
too, every group on every member: a 4th member started with --join on holds the metadata group
only until a rebalance gives it its share, each group staying on 3 members. A cluster in the
layout of every group (--replication-factor 0) needs a new member holding every group: before the
refusal, add-node added a member holding only the metadata group to every group, which then had
a voter that never answered, and the new member never got ready."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest

from tests.conftest import free_port
from tests.helpers import publish_confirmed, wait_for

from .conftest import Cluster, Member, drain
from .test_maxqctl_cluster import maxqctl

pytestmark = pytest.mark.timeout(300)

NAMES = ("n1", "n2", "n3")
JOINER = ["--join", "on", "--shards", "4"]


def placement(member) -> dict[str, list[str]]:
    answer = member.admin("/api/cluster/placement")
    return {g["group"]: sorted(g["members"]) for g in answer["groups"]}


def test_a_member_started_for_a_placed_cluster_is_refused_by_one_holding_every_group(tmp_path):
    cluster = Cluster(tmp_path, extra=["--replication-factor", "0"]).start()
    ports = {name: cluster[name].raft_port for name in NAMES}
    new = Member("n4", tmp_path, free_port(), ports, ["--join", "on"])  # (the default factor: 3)
    try:
        new.launch()
        refused = maxqctl(cluster["n2"], "add-node", "n4", "--raft-addr", f"127.0.0.1:{new.raft_port}")
        assert refused.returncode == 4, (refused.stdout, refused.stderr)
        assert (
            "node n4 holds only meta" in refused.stderr
            and "on an empty --data-dir with --join on and --replication-factor 0" in refused.stderr
        )
        status = cluster["n1"].admin("/api/cluster/status")
        assert all(sorted(m["node"] for m in g["members"]) == list(NAMES) for g in status["groups"]), status
        new.stop()
        # Started again as it says (its folder recorded what it holds), it is added to every
        # group and serves.
        shutil.rmtree(new.data_dir)
        new.extra_args = [*new.extra_args, "--replication-factor", "0"]  # (the last one counts)
        new.launch()
        added = maxqctl(cluster["n2"], "add-node", "n4", "--raft-addr", f"127.0.0.1:{new.raft_port}")
        assert added.returncode == 0, (added.stdout, added.stderr, new.log_text()[-2000:])
        new.wait_ready(90)
        publish_confirmed(new, "on-four", b"m")
        held = {g["group"] for g in new.admin("/api/cluster/status")["groups"]}
        assert held == {"meta", "shard-0", "shard-1"}, held
    finally:
        new.stop()
        cluster.stop()


def test_a_cluster_of_three_at_the_default_factor_grows_and_shrinks_keeping_three_replicas(tmp_path):
    """No --replication-factor anywhere: 3 members hold every group, placed; a 4th gets a share
    by a rebalance and every group stays on 3; a member removed without a drain (nowhere to move
    its replicas in a cluster of 3) leaves its groups on 2, and a rebalance after a new member
    is added gives them their third again. No confirmed message is lost on the way."""
    cluster = Cluster(tmp_path, extra=["--shards", "4"]).start()
    ports = {name: cluster[name].raft_port for name in NAMES}
    new = Member("n4", tmp_path, free_port(), ports, JOINER)
    back = None
    try:
        first = wait_for(
            lambda: (answer := cluster["n1"].admin("/api/cluster/placement"))["held_everywhere"] and answer,
            10,
            "n1 to know every member holds every group",
        )
        assert first["factor"] == 3, first
        assert all(members == list(NAMES) for members in placement(cluster["n1"]).values()), first
        for i in range(8):
            publish_confirmed(cluster["n1"], f"q{i}", b"before")

        new.launch()
        added = maxqctl(cluster["n2"], "add-node", "n4", "--raft-addr", f"127.0.0.1:{new.raft_port}")
        assert added.returncode == 0, (added.stdout, added.stderr, new.log_text()[-2000:])
        new.wait_ready(90)
        assert all("n4" not in members for members in placement(cluster["n1"]).values())  # (until a rebalance)
        # n4 holds no shard group: its clients are served through the others' groups, so the
        # path through another member's group is on again (server/remote.py, `active`)
        assert not cluster["n1"].admin("/api/cluster/placement")["held_everywhere"]

        plan = maxqctl(cluster["n1"], "rebalance", "--dry-run")
        assert plan.returncode == 0, plan.stderr
        assert "n4" in plan.stdout, plan.stdout
        assert all(members == list(NAMES) for members in placement(cluster["n1"]).values())  # (a dry run)
        done = maxqctl(cluster["n1"], "rebalance", timeout_s=240)
        assert done.returncode == 0, (done.stdout, done.stderr)
        spread = placement(cluster["n1"])
        assert all(len(members) == 3 for members in spread.values()), spread
        loads = Counter(m for members in spread.values() for m in members)
        assert loads["n4"] == 3 and max(loads.values()) - min(loads.values()) <= 1, loads

        # n3 out of the 4 (it holds replicas, which go to the others), then n2 out of the 3 left:
        # the others hold every group it holds, so it leaves them without a drain.
        drained = maxqctl(cluster["n1"], "drain-replicas", "n3", timeout_s=240)
        assert drained.returncode == 0, (drained.stdout, drained.stderr)
        removed = maxqctl(cluster["n1"], "remove-node", "n3")
        assert removed.returncode == 0, (removed.stdout, removed.stderr)
        cluster["n3"].stop()
        nowhere = maxqctl(cluster["n1"], "drain-replicas", "n2")
        assert nowhere.returncode == 4 and "no replica can move" in nowhere.stderr, nowhere.stderr
        removed = maxqctl(cluster["n1"], "remove-node", "n2")
        assert removed.returncode == 0, (removed.stdout, removed.stderr)
        cluster["n2"].stop()
        short = placement(cluster["n1"])
        assert all(members == ["n1", "n4"] for members in short.values()), short
        publish_confirmed(new, "q0", b"on-two")

        # n2 back on an empty folder as a new member. With its old --peer list (n1, n3) it would
        # never hear n4, which leads groups it is added to: refused, nothing changed.
        shutil.rmtree(cluster["n2"].data_dir)
        back = Member("n2", tmp_path, cluster["n2"].raft_port, {"n1": ports["n1"], "n3": ports["n3"]}, JOINER)
        back.launch()
        stale = maxqctl(cluster["n1"], "add-node", "n2", "--raft-addr", f"127.0.0.1:{back.raft_port}")
        assert stale.returncode == 4, (stale.stdout, stale.stderr)
        assert "node n2 was started with --peer naming n1, n3, not n4" in stale.stderr, stale.stderr
        assert [m["node"] for m in cluster["n1"].admin("/api/cluster/status")["members"]] == ["n1", "n4"]
        back.stop()
        # Started again with the members now, then a rebalance: 3 replicas again.
        shutil.rmtree(cluster["n2"].data_dir)
        back = Member("n2", tmp_path, cluster["n2"].raft_port, {"n1": ports["n1"], "n4": new.raft_port}, JOINER)
        back.launch()
        added = maxqctl(cluster["n1"], "add-node", "n2", "--raft-addr", f"127.0.0.1:{back.raft_port}")
        assert added.returncode == 0, (added.stdout, added.stderr)
        back.wait_ready(90)
        done = maxqctl(cluster["n1"], "rebalance", timeout_s=240)
        assert done.returncode == 0, (done.stdout, done.stderr)
        again = placement(cluster["n1"])
        assert all(members == ["n1", "n2", "n4"] for members in again.values()), again

        bodies = [body for i in range(8) for body, _redelivered in drain(back, f"q{i}")]
        assert sorted(bodies) == sorted([b"before"] * 8 + [b"on-two"]), bodies
        shown = json.loads(maxqctl(back, "--json", "placement").stdout)["groups"]
        assert {group: sorted(members) for group, members in shown.items()} == again, shown
    finally:
        if back is not None:
            back.stop()
        new.stop()
        cluster.stop()
