"""Leaders spread over members holding groups on a few of them, then stay put.

7 members at factor 3 with 14 shard groups (as `scripts/cluster up --hosts 7
--replication-factor 3` starts them). Until 2026-12-06 each member counted the leaders of the
groups it holds a replica of only: n1 saw itself at 3 and n7 at 1 and handed shard-13 to n7,
which saw itself at 3 and n1 at 1 and handed it back, every 5 s for good, each hand-over an
election (the terms of an idle cluster's groups rose by 6-8 in 25 s). Every member now counts
every group (machines/leader_balance.py), the leaders of those held elsewhere as they say.
"""

from __future__ import annotations

import time
from pathlib import Path

from maxq_raft.server.watchdog import BALANCE_EVERY_S

from .conftest import running_cluster

MEMBERS = 7
SETTLE_LIMIT_S = 90.0  # the first spread makes a few moves, one per member per round


def terms(cluster) -> dict[tuple[str, str], int]:
    """(member, group) -> the group's Raft term on that member."""
    out = {}
    for member in cluster.alive():
        for group in member.admin("/api/cluster/status")["groups"]:
            out[(member.name, group["group"])] = group["term"]
    return out


def test_an_idle_clusters_leaders_settle_and_elect_no_more(tmp_path: Path) -> None:
    extra = ["--shards", "14", "--replication-factor", "3"]
    with running_cluster(tmp_path, extra, MEMBERS) as cluster:
        window_s = 2 * BALANCE_EVERY_S + 1  # (two rounds of every member's balancing)
        deadline = time.monotonic() + SETTLE_LIMIT_S
        before = terms(cluster)
        changed: list = []
        while time.monotonic() < deadline:
            time.sleep(window_s)
            now = terms(cluster)
            changed = sorted(key for key in now if now[key] != before.get(key))
            if not changed:
                break
            before = now
        assert not changed, f"elections went on in an idle cluster after {SETTLE_LIMIT_S} s: {changed[:10]}"
        leads: dict[str, int] = {}
        for member in cluster.alive():
            for group in member.admin("/api/cluster/status")["groups"]:
                if group["role"] == "leader":
                    leads[member.name] = leads.get(member.name, 0) + 1
        assert sum(leads.values()) == 15 and max(leads.values()) <= 4, leads  # (15 groups over 7)
