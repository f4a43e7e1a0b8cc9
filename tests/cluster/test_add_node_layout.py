"""A new member's layout must be the cluster's: `maxqctl add-node` refuses one that would be added
to groups it does not run (admin.py, `_layout_mismatch`), and changes nothing.

The docs' way to grow a cluster placed with --replication-factor 3 is to start the new member
with --join on --replication-factor 3. A cluster of 3 started so holds every group on every
member (the factor is not below the number of members), so add-node added the new member to
every group while it ran only the metadata group: each group had a voter that never answered,
and the new member never got ready ("waiting for a quorum of the cluster")."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import free_port
from tests.helpers import publish_confirmed

from .conftest import Cluster, Member
from .test_maxqctl_cluster import maxqctl

pytestmark = pytest.mark.timeout(240)

NAMES = ("n1", "n2", "n3")


def test_a_member_started_for_a_placed_cluster_is_refused_by_one_holding_every_group(tmp_path):
    cluster = Cluster(tmp_path, extra=["--replication-factor", "3"]).start()
    ports = {name: cluster[name].raft_port for name in NAMES}
    new = Member("n4", tmp_path, free_port(), ports, ["--join", "on", "--replication-factor", "3"])
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
