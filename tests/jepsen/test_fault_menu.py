"""The fault menu's pure parts: the cuts each partition shape makes and the minority it may claim,
the majorities ring, the nft script (cuts + loss in one transaction), the delay rules, the
faketime environment, the preflight, and the schedule with membership overlapping other faults.
No broker, namespace or tool is needed here; the faults themselves run in real runs
(`jepsen-style/run --nemesis ...`, see docs/reliability.md)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen import cli, faults  # noqa: E402
from maxq_jepsen import nemesis as nem  # noqa: E402

FIVE = ["n1", "n2", "n3", "n4", "n5"]
THREE = ["n1", "n2", "n3"]


def test_minority_is_a_component_below_quorum():
    assert faults.minority_of(THREE, faults.isolate(THREE, ["n2"])) == ["n2"]
    assert faults.minority_of(FIVE, faults.isolate(FIVE, ["n1", "n4"])) == ["n1", "n4"]
    assert faults.minority_of(FIVE, []) == []
    # one-way: n1 -> others cut, the other direction open; no two-way link left, so n1 is alone
    one_way = [("n1", b) for b in THREE if b != "n1"]
    assert faults.minority_of(THREE, one_way) == ["n1"]  # what *could* be claimed; OneWayNemesis claims nothing
    # a chain a - b - c (a and c cut) is one component: a reaches a leader at b that commits with c
    assert faults.minority_of(THREE, [("n1", "n3"), ("n3", "n1")]) == []


@pytest.mark.parametrize("names", [THREE, FIVE, [f"n{i}" for i in range(1, 8)]])
@pytest.mark.parametrize("seed", range(6))
def test_bridge_cuts_the_two_sides_and_claims_no_minority(names, seed):
    cuts, extra = faults.bridge_plan(names, random.Random(seed))
    left, right = extra["sides"]
    bridge = extra["bridge"]
    assert sorted(left + right + [bridge]) == sorted(names) and abs(len(left) - len(right)) <= 1
    seen = faults.visible(names, cuts)
    assert seen[bridge] == sorted(names)  # the bridge sees everyone
    for a in left:
        assert seen[a] == sorted(left + [bridge])
    for b in right:
        assert seen[b] == sorted(right + [bridge])
    assert set(cuts) == {(a, b) for a in left for b in right} | {(b, a) for a in left for b in right}
    assert faults.minority_of(names, cuts) == []  # connected through the bridge


def test_bridge_on_four_nodes_still_claims_nothing():
    # sides of 1 and 2 plus the bridge: the lone side sees 2 of 4 (no quorum), yet a leader at the
    # bridge commits with the other side and may confirm for it, so claiming it would be wrong.
    cuts, extra = faults.bridge_plan(["n1", "n2", "n3", "n4"], random.Random(3))
    assert faults.minority_of(["n1", "n2", "n3", "n4"], cuts) == []


@pytest.mark.parametrize("count", [5, 6, 7, 9])
@pytest.mark.parametrize("seed", range(4))
def test_the_ring_gives_every_node_a_different_majority(count, seed):
    names = [f"n{i}" for i in range(1, count + 1)]
    cuts, extra = faults.ring_plan(names, random.Random(seed))
    seen = faults.visible(names, cuts)
    assert seen == extra["sees"]
    majorities = [tuple(v) for v in seen.values()]
    assert all(len(m) >= faults.quorum(count) for m in majorities)
    assert len(set(majorities)) == count  # each a different majority
    assert all(len(m) < count for m in majorities)  # and nobody sees everyone
    assert faults.minority_of(names, cuts) == []
    order = extra["ring"]
    assert set(seen[order[0]]) >= {order[-1], order[0], order[1]}  # neighbours on the ring


def test_the_ring_of_five_is_each_node_and_its_two_neighbours():
    cuts, extra = faults.ring_plan(FIVE, random.Random(0))
    order = extra["ring"]
    for i, name in enumerate(order):
        assert extra["sees"][name] == sorted([order[i - 1], name, order[(i + 1) % 5]])
    assert len(cuts) == 5 * 2  # each node cut from its two non-neighbours


def test_the_ring_refuses_three_nodes_with_the_reason():
    with pytest.raises(ValueError, match="5 or more"):
        faults.ring_plan(THREE, random.Random(0))
    refused = nem.unsupported(["partition-majorities-ring"], 3, "netns")
    assert "needs 5 or more nodes" in refused["partition-majorities-ring"]
    assert nem.unsupported(["partition-majorities-ring"], 5, "netns") == {}
    assert "namespace lab" in nem.unsupported(["partition-majorities-ring"], 5, "local")["partition-majorities-ring"]


def test_nft_script_states_cuts_and_loss_in_one_transaction():
    hosts = {"n1": "10.77.0.1", "n2": "10.77.0.2", "n3": "10.77.0.3"}
    script = faults.nft_script("mxqj", hosts, [("n1", "n2")], {"n3": 25})
    lines = [line.strip() for line in script.splitlines()]
    assert lines[:3] == ["table bridge mxqj", "delete table bridge mxqj", "table bridge mxqj {"]
    assert "ip saddr 10.77.0.1 ip daddr 10.77.0.2 drop" in lines
    assert "ip saddr 10.77.0.3 numgen random mod 100 < 25 counter drop" in lines
    assert "ip daddr 10.77.0.3 numgen random mod 100 < 25 counter drop" in lines
    empty = faults.nft_script("mxqj", hosts, [], {})
    assert "drop" not in empty and "policy accept" in empty


def test_loss_counters_are_read_from_the_table_listing():
    listing = """table bridge mxqj {
	chain cut {
		type filter hook forward priority filter; policy accept;
		ip saddr 10.77.0.1 ip daddr 10.77.0.2 drop
		ip saddr 10.77.0.3 numgen random mod 100 < 25 counter packets 17 bytes 2000 drop
		ip daddr 10.77.0.3 numgen random mod 100 < 25 counter packets 5 bytes 300 drop
	}
}"""
    assert faults.loss_counters(listing) == 22
    assert faults.loss_counters("") == 0


def test_delay_rules_leave_loopback_alone_and_bypass_a_dead_delayer():
    add = faults.delay_rules("-A", "10.77.0.0/24", 101)
    assert [r[4] for r in add] == ["OUTPUT", "INPUT"]
    for rule in add:
        assert rule[:4] == ["iptables", "-w", "5", "-A"]
        assert "--queue-bypass" in rule and rule[rule.index("--queue-num") + 1] == "101"
        assert "!" in rule and "lo" in rule  # clients are co-located over loopback: never delayed
    delete = faults.delay_rules("-D", "10.77.0.0/24", 101)
    assert [r[3] for r in delete] == ["-D", "-D"] and [r[4:] for r in delete] == [r[4:] for r in add]


def test_faketime_fakes_the_wall_clock_only():
    env = faults.faketime_env("/lib/libfaketimeMT.so.1", "/tmp/n1.skew")
    assert env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"  # Raft's and trio's timers stay real
    assert env["FAKETIME_NO_CACHE"] == "1"  # a new skew is seen at once (the cache hid it)
    assert env["FAKETIME_TIMESTAMP_FILE"] == "/tmp/n1.skew" and env["LD_PRELOAD"] == "/lib/libfaketimeMT.so.1"
    assert faults.faketime_offset(90) == "+90" and faults.faketime_offset(-30.5) == "-30.5"
    assert faults.faketime_offset(0) == "+0"


def test_nothing_on_the_menu_is_missing_and_features_follow_the_nemeses():
    assert nem.NOT_YET == {}
    for name in ("bridge", "partition-majorities-ring", "kill-majority", "loss", "delay", "disk-stall", "clock-skew"):
        assert name in nem.NEMESES
    assert nem.parse_nemeses("loss,delay") == ["loss", "delay"]
    assert nem.lab_features(["kill", "disk-stall", "clock-skew"]) == frozenset({"disk", "clock"})
    assert nem.lab_features(["loss", "bridge"]) == frozenset()


def test_a_missing_tool_refuses_the_nemesis_with_how_to_get_it(monkeypatch):
    monkeypatch.setattr(nem.shutil, "which", lambda name: None)
    monkeypatch.setattr(nem, "faketime_library", lambda: None)
    missing = nem.missing_tools(["loss", "delay", "clock-skew", "kill"])
    assert "nft (apt-get install -y nftables)" in missing["loss"]
    assert "iptables" in missing["delay"]
    assert "faketime" in missing["clock-skew"]
    assert "kill" not in missing
    refused = nem.unsupported(["loss", "kill"], 3, "netns")
    assert refused["loss"].startswith("MISSING") and "kill" not in refused


def test_a_named_nemesis_that_cannot_run_is_an_error_not_a_silent_pass(monkeypatch):
    monkeypatch.setattr(nem, "faketime_library", lambda: None)
    args = cli.parse_args(["--profile", "cluster", "--runs", "1", "--nemesis", "clock-skew"])
    with pytest.raises(nem.NemesisError, match="MISSING"):
        cli.build_specs(args)


def test_kill_majority_claims_the_survivors_as_minority():
    class FakeNode:
        extra_args = ("--replication-factor", "0")  # (every group on every member: no placement to read)

        def __init__(self, name):
            self.name, self.killed = name, False

        def kill(self):
            self.killed = True

        def alive(self):
            return not self.killed

    class FakeLab:
        nodes = [FakeNode(n) for n in FIVE]

        def node(self, name):
            return next(n for n in self.nodes if n.name == name)

    lab = FakeLab()
    out = nem.KillMajorityNemesis().start(lab, random.Random(4))
    assert len(out["targets"]) == 3 and len(out["minority"]) == 2
    assert sorted(out["targets"] + out["minority"]) == FIVE
    assert all(lab.node(n).killed for n in out["targets"])


def test_schedule_without_overlap_is_unchanged_by_the_option():
    args = (
        54,
        ["kill", "kill-leader", "pause-leader", "partition-one", "partition-leader"],
        35.0,
        (2.0, 4.0),
        (4.0, 6.0),
        3.0,
    )
    assert nem.make_schedule(*args) == nem.make_schedule(*args, overlap=("membership",))  # no membership in it
    assert all("with_" not in c.to_dict() for c in nem.make_schedule(*args))  # the history's meta as before


def test_membership_overlaps_other_faults_and_never_kill_majority():
    names = ["kill", "kill-majority", "partition-one", "membership"]
    schedule = nem.make_schedule(7, names, 600.0, (5.0, 10.0), (5.0, 10.0), 5.0, overlap=("membership",))
    assert schedule and all(c.nemesis != "membership" for c in schedule)  # it rides, never alone
    riding = [c for c in schedule if c.with_ == "membership"]
    assert riding and len(riding) < len(schedule)  # about half of the cycles
    assert all(c.nemesis != "kill-majority" for c in riding)  # a change there could only time out
    assert nem.make_schedule(7, names, 600.0, (5.0, 10.0), (5.0, 10.0), 5.0, ("membership",)) == schedule  # seeded
    alone = nem.make_schedule(7, ["membership"], 60.0, (5.0, 10.0), (5.0, 10.0), 5.0, overlap=("membership",))
    assert alone and all(c.nemesis == "membership" and c.with_ is None for c in alone)


def test_the_long_profile_starts_with_five_node_runs_over_the_whole_menu():
    specs = cli.build_specs(cli.parse_args(["--profile", "long", "--runs", "6", "--time", "300"]))
    assert len(specs) == 6 and {s.nodes for s in specs} == {5} and {s.time_s for s in specs} == {300.0}
    assert len({s.seed for s in specs}) == 6
    full = set(nem.NEMESES)
    for spec in specs:
        # every nemesis that this machine can run (a missing tool is refused loudly, not silently)
        refused = nem.unsupported(list(full), 5, "netns")
        assert set(spec.nemeses) == full - set(refused)
        assert spec.overlap == ("membership", "maintenance", "move")
    # every second run, and the partitioned twelfth, with groups on 3 of the 5 members
    twelve = cli.build_specs(cli.parse_args(["--profile", "long", "--runs", "12"]))
    held = [s.seed for s in twelve if s.shards == 5]
    assert held == [2002, 2004, 2006, 2008, 2010, 2012]
    # the other queue runs keep every group on every member (no longer the server's default),
    # and the TTL + dead-letter eleventh runs at the default, 3 of the 5
    every = [s.seed for s in twelve if s.server_args[-2:] == ("--replication-factor", "0")]
    assert every == [2001, 2003, 2005, 2007, 2009]
    assert "--replication-factor" not in twelve[10].server_args
    ci = cli.build_specs(cli.parse_args(["--profile", "ci"]))
    assert [s.nemeses for s in ci][-1] == ("kill", "kill-leader", "pause-leader", "partition-one", "partition-leader")


def test_disk_full_rides_along_other_faults_too():
    names = ["kill-leader", "partition-one", "membership", "disk-full"]
    schedule = nem.make_schedule(9, names, 600.0, (5.0, 10.0), (5.0, 10.0), 5.0, overlap=("membership", "disk-full"))
    riders = {c.with_ for c in schedule}
    assert {"membership", "disk-full"} <= riders and all(c.nemesis not in riders for c in schedule)
    assert cli.parse_overlap("disk-full") == ["disk-full"]
    # An overlap must be one of the run's nemeses: asked for and not run, it would pass unseen.
    with pytest.raises(nem.NemesisError, match="add it to --nemesis"):
        cli.build_specs(cli.parse_args(["--profile", "cluster", "--nemesis", "kill,pause", "--overlap", "move"]))
    (spec,) = cli.build_specs(cli.parse_args(["--profile", "cluster", "--nemesis", "kill,move", "--overlap", "move"]))
    assert spec.overlap == ("move",) and "move" in spec.nemeses


def test_the_campaign_is_a_hundred_cluster_runs_over_every_fault_and_a_hundred_kills_of_one_node():
    from maxq_jepsen.profiles import get_profile

    runs = get_profile("campaign").runs
    cluster = [r for r in runs if r.nodes > 1]
    single = [r for r in runs if r.nodes == 1]
    assert len(cluster) >= 100 and len({r.seed for r in runs}) == len(runs)
    assert {r.nodes for r in cluster} == {3, 5} and sum(r.nodes == 5 for r in cluster) >= 20
    for nodes in (3, 5):
        assert {r.workload_kind for r in cluster if r.nodes == nodes} == {"queue", "fifo", "dlx"}
    assert all(
        set(r.nemeses) >= {"disk-full", "kill-leader", "partition-leader", "membership", "maintenance"} for r in cluster
    )
    riders = ("membership", "disk-full", "maintenance")
    assert all(
        r.overlap == riders and r.shards == 2 and "--replication-factor" not in r.server_args
        for r in cluster
        if r.nodes == 3
    )
    # on 5 nodes each group on 3 of them (issue #19), replicas moving during the other faults
    assert all(
        r.overlap == (*riders, "move") and r.shards == 5 and r.server_args[-2:] == ("--replication-factor", "3")
        for r in cluster
        if r.nodes == 5
    )
    kills = sum(
        1
        for r in single
        for c in nem.make_schedule(r.seed, list(r.nemeses), r.time_s, r.quiet_s, r.fault_s, r.tail_s)
        if c.nemesis == "kill"
    )
    assert kills >= 100, kills


def test_a_campaign_stopped_part_way_goes_on_with_from_run(capsys):
    whole = cli.build_specs(cli.parse_args(["--profile", "campaign"]))
    rest = cli.build_specs(cli.parse_args(["--profile", "campaign", "--from-run", "76"]))
    assert rest == whole[75:] and rest[0].seed == 3076
    some = cli.build_specs(cli.parse_args(["--profile", "campaign", "--from-run", "76", "--runs", "2"]))
    assert some == whole[75:77]
    with pytest.raises(SystemExit):
        cli.parse_args(["--profile", "ci", "--from-run", "4"])  # the ci profile has 3 runs
    assert "--from-run must be 1..3" in capsys.readouterr().err


def test_the_move_nemesis_acts_only_where_groups_are_on_a_few_members():
    from types import SimpleNamespace

    def lab(*args: str, nodes: int = 5):
        return SimpleNamespace(nodes=[SimpleNamespace(extra_args=list(args))] * nodes)

    assert nem.partial_placement(lab("--snapshot-every-mb", "0.1", "--replication-factor", "3"))
    assert nem.partial_placement(lab("--replication-factor=3"))
    assert nem.partial_placement(lab("--replication-factor", "5"))  # (every group on every member, placed)
    assert nem.partial_placement(lab("--snapshot-every-mb", "0.1"))  # (the default, 3)
    assert not nem.partial_placement(lab("--replication-factor", "0"))  # (the layout of every group)
    assert not nem.partial_placement(lab("--replication-factor", "3", "--replication-factor", "0"))  # (the last)
    skipped = nem.MoveNemesis().start(lab("--snapshot-every-mb", "0.1", "--replication-factor", "0"), None)
    assert "every member holds every group" in skipped["skipped"]
    assert nem.unsupported(["move"], 1, "local") == {"move": "needs a cluster (--nodes 3 or more), not 1 node(s)"}


def test_a_minority_is_claimed_per_group_where_groups_are_on_a_few_members():
    """Seed 2002's false alarm: n1 and n4, two of five, were two of the three members of the
    queue's group, and confirmed during partition-halves; with groups on a few members a node is
    claimed only when its side holds a majority of no group."""
    names = ["n1", "n2", "n3", "n4", "n5"]
    cuts = [(a, b) for a in ("n1", "n4") for b in ("n2", "n3", "n5")]
    cuts += [(b, a) for a, b in cuts]
    sides = {n: c for c in faults.components(names, cuts) for n in c}
    cluster_minority = faults.minority_of(names, cuts)
    assert cluster_minority == ["n1", "n4"]
    assert nem.held_minority(None, cluster_minority, sides) == ["n1", "n4"]  # every group on every member
    placement = {"shard-0": ["n1", "n4", "n5"], "shard-1": ["n2", "n3", "n5"]}
    assert nem.held_minority(placement, cluster_minority, sides) == []  # they hold 2 of shard-0's 3
    placement = {"shard-0": ["n1", "n2", "n5"], "shard-1": ["n2", "n3", "n4"]}
    assert nem.held_minority(placement, cluster_minority, sides) == ["n1", "n4"]
    assert nem.held_minority({}, cluster_minority, sides) == []  # the placement unknown: no claim
