"""`maxqctl` against real 3-node clusters: status shows every member and each group's leader,
transfer-leadership moves a leader, add-node then remove-node under publish load with confirms
loses no confirmed message, and every refusal (unknown node, bad address, a change already in
progress, a removal that would lose quorum, a single node that is no cluster member) exits
non-zero with a clear message."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from maxq_raft.http.admin import quorum_after_removal
from maxq_raft.server.cluster import shard_of

from ..conftest import free_port
from ..helpers import api, wait_for
from .conftest import ConfirmingPublisher, Member, drain

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")
NAMES = ("n1", "n2", "n3")
GROUPS = ["meta", "shard-0", "shard-1"]  # the cluster conftest starts members with --shards 2


def maxqctl(member, *args: str, timeout_s: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{member.http_port}", *args], capture_output=True, text=True, timeout=timeout_s
    )


def status_of(member) -> dict:
    result = maxqctl(member, "status", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def leaders(status: dict) -> dict[str, str | None]:
    return {g["group"]: g["leader"] for g in status["groups"]}


def memberships(status: dict) -> dict[str, list[str]]:
    return {g["group"]: [m["node"] for m in g["members"]] for g in status["groups"]}


def settled(member, names: list[str]):
    """The status once every group lists exactly `names` and has a leader among them (else None)."""
    status = status_of(member)
    ok = all(ms == names for ms in memberships(status).values()) and all(
        leader in names for leader in leaders(status).values()
    )
    return status if ok else None


def spread_over(member, names: list[str]):
    """The placement once the metadata group lists exactly `names`, every shard group has 3 of
    them and a leader among those, and each member holds a replica (else None)."""
    status = status_of(member)
    placement = {g["group"]: sorted(g["members"]) for g in member.admin("/api/cluster/placement")["groups"]}
    ok = (
        memberships(status)["meta"] == names
        and all(len(replicas) == 3 and set(replicas) <= set(names) for replicas in placement.values())
        and {m for replicas in placement.values() for m in replicas} == set(names)
        and all(leader in names for leader in leaders(status).values())
    )
    return placement if ok else None


def test_status_shows_members_leaders_and_lag(cluster):
    status = wait_for(lambda: settled(cluster["n1"], list(NAMES)), 30, "every group to have a leader")
    assert status["node"] == "n1" and status["clustered"] is True and status["removed"] is False
    assert [g["group"] for g in status["groups"]] == GROUPS
    assert [(m["node"], m["state"], m["groups"]) for m in status["members"]] == [(n, "up", "3/3") for n in NAMES]
    assert sum(m["leads"] for m in status["members"]) == len(GROUPS)
    meta_leader = leaders(status)["meta"]
    assert [m["node"] for m in status["members"] if m["role"] == "leader"] == [meta_leader]
    for g in status["groups"]:
        assert g["applied_index"] <= g["commit_index"] <= g["last_index"], g
        assert g["role"] == ("leader" if g["leader"] == "n1" else "follower"), g
    # The group's leader knows every member's match index and lag.
    led = status_of(cluster[meta_leader])
    [meta] = [g for g in led["groups"] if g["group"] == "meta"]
    assert meta["role"] == "leader"
    assert all(
        isinstance(m["match_index"], int) and isinstance(m["lag"], int) and m["lag"] >= 0 for m in meta["members"]
    ), meta

    # Placement (machines/placement.py): once every member announced the feature, the metadata
    # leader records the shard groups with their members, and each queue's record its group.
    with cluster["n3"].connect() as connection:
        channel = connection.channel()
        for i in range(6):
            channel.queue_declare(f"placed-{i}", durable=True)

    def placed(member):
        status = status_of(member)
        shards = [g for g in status["groups"] if g["group"] != "meta"]
        if not status["placement_recorded"] or sum(g["queues"] for g in shards) != 6:
            return None
        return status

    for name in NAMES:  # every member applied the same record
        status = wait_for(lambda: placed(cluster[name]), 30, f"the placement recorded on {name}")
        assert [(g["group"], g["replicas"]) for g in status["groups"]] == [("meta", None)] + [
            (group, list(NAMES)) for group in GROUPS[1:]
        ], status["groups"]
        assert [g["queues"] for g in status["groups"]][1:] == [
            sum(1 for i in range(6) if shard_of(("/", f"placed-{i}"), 2) == group) for group in GROUPS[1:]
        ]

    table = maxqctl(cluster["n2"], "status")
    assert table.returncode == 0, table.stderr
    assert "queues: how many queues the metadata group records in the shard group" in table.stdout
    lines = table.stdout.splitlines()
    assert lines[0] == "node n2"
    rows = [line.split() for line in lines]
    assert ["node", "state", "role", "leads", "groups"] in rows
    for name in NAMES:
        assert any(r[:2] == [name, "up"] and r[2] in ("leader", "follower") and r[-1] == "3/3" for r in rows), (
            table.stdout
        )
    for group in GROUPS:
        [row] = [r for r in rows if r and r[0] == group]
        # group, leader, term, commit, applied, here, [change], lag...
        assert row[1] in NAMES, row
        assert row[2].isdigit() and row[3].isdigit() and row[4].isdigit()
        assert all(f"{n}=" in " ".join(row) for n in NAMES)


def test_transfer_leadership_moves_the_meta_leader(cluster):
    status = wait_for(lambda: settled(cluster["n1"], list(NAMES)), 30, "every group to have a leader")
    old = leaders(status)["meta"]
    new = next(n for n in NAMES if n != old)
    bystander = next(n for n in NAMES if n not in (old, new))

    # Only the leader can hand over: a follower says who leads.
    refused = maxqctl(cluster[bystander], "transfer-leadership", "meta", new)
    assert refused.returncode == 4, refused
    assert f"node {bystander} does not lead meta; {old} leads it" in refused.stderr

    moved = maxqctl(cluster[old], "transfer-leadership", "meta", new)
    assert moved.returncode == 0, moved.stderr
    assert ["meta", "moved"] in [line.split() for line in moved.stdout.splitlines()]
    for name in NAMES:
        wait_for(lambda: leaders(status_of(cluster[name]))["meta"] == new, 30, f"{name} to see {new} lead meta")

    # `all`: every group the asked node leads goes to the target; the rest are reported.
    everything = maxqctl(cluster[new], "--json", "transfer-leadership", "all", bystander)
    assert everything.returncode == 0, everything.stderr
    answer = json.loads(everything.stdout)
    assert answer["ok"] is True and set(answer["results"]) == set(GROUPS)
    assert answer["results"]["meta"] == "moved"
    wait_for(lambda: leaders(status_of(cluster[bystander]))["meta"] == bystander, 30, f"{bystander} to lead meta")
    # (Which groups `new` leads afterwards is not checked: members spread shard leaders over
    # themselves again within seconds, so the balance may already have moved one back.)

    unknown_group = maxqctl(cluster[bystander], "transfer-leadership", "shard-99", new)
    assert unknown_group.returncode == 4 and "no group 'shard-99'" in unknown_group.stderr, unknown_group
    unknown_node = maxqctl(cluster[bystander], "transfer-leadership", "meta", "ghost")
    assert unknown_node.returncode == 4 and "node ghost is not a member of group meta" in unknown_node.stderr, (
        unknown_node
    )


def test_add_node_then_remove_node_under_load_loses_no_confirmed_message(cluster, tmp_path):
    n1, n2, n3 = (cluster[n] for n in NAMES)
    wait_for(lambda: settled(n1, list(NAMES)), 30, "every group to have a leader")
    setup = n1.connect()
    setup.channel().queue_declare("ctl-load", durable=True)
    setup.close()
    new = Member("n4", tmp_path, free_port(), {n: cluster[n].raft_port for n in NAMES}, ["--join", "on"])
    publisher = ConfirmingPublisher([n1], "ctl-load", pause_s=0.005)  # the 2-core machine runs 4 nodes
    try:
        new.launch()
        publisher.start()
        wait_for(lambda: len(publisher.confirmed) >= 100, 60, "confirms before the change")

        # (the default factor, 3: n4 joins the metadata group, and the rebalance gives it a share
        # of the shard groups' replicas, each group staying on 3 members)
        added = maxqctl(n2, "add-node", "n4", "--raft-addr", f"127.0.0.1:{new.raft_port}", "--rebalance", timeout_s=240)
        assert added.returncode == 0, (added.stdout, added.stderr, new.log_text()[-3000:])
        assert "moves done" in added.stdout and "n4" in added.stderr, added
        new.wait_ready(90)
        four = ["n1", "n2", "n3", "n4"]
        for member in (n1, n3, new):
            wait_for(lambda: spread_over(member, four), 60, f"{getattr(member, 'name', '?')} to see 4 members")
        again = maxqctl(n3, "add-node", "n4", "--raft-addr", f"127.0.0.1:{new.raft_port}")
        assert again.returncode == 4 and "node n4 is already a member" in again.stderr, again
        before = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) >= before + 100, 60, "confirms with 4 members")

        # An operator drains a member before removing it; the removal takes its maintenance
        # record away (a member added back under the name must not start drained): reviving
        # the removed name is then "not a member".
        wait_for(lambda: maxqctl(n1, "drain", "n4").returncode == 0, 60, "n4 drained")
        removed = maxqctl(n3, "remove-node", "n4")
        assert removed.returncode == 0, (removed.stdout, removed.stderr)
        assert "node n4 removed" in removed.stdout
        for member in (n1, n2, n3):
            wait_for(lambda: settled(member, list(NAMES)), 60, f"{member.name} to list 3 members again")
        status, answer, _ = api(n1, "POST", "/api/cluster/revive", {"node": "n4"})
        assert status == 404 and "n4 is not a member" in json.dumps(answer), (status, answer)
        before = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) >= before + 100, 60, "confirms after the removal")
    finally:
        publisher.stop_flag.set()
        publisher.join(30)
        new.stop()
    assert not publisher.is_alive()
    confirmed = publisher.confirmed_numbers()
    got = {int(body) for body, _ in drain(n2, "ctl-load", quiet_s=5.0, limit_s=120.0)}
    lost = sorted(confirmed - got)
    print(
        f"\n{len(confirmed)} confirmed, {publisher.in_doubt} in doubt, {len(got)} consumed; errors {publisher.errors[:3]}"
    )
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {lost[:10]}"


def test_refusals_exit_non_zero_with_a_clear_message(cluster):
    n1 = cluster["n1"]
    wait_for(lambda: settled(n1, list(NAMES)), 30, "every group to have a leader")

    unknown = maxqctl(n1, "remove-node", "ghost")
    assert unknown.returncode == 4, unknown
    assert "node ghost is not a member of the cluster (members: n1, n2, n3)" in unknown.stderr
    itself = maxqctl(n1, "remove-node", "n1")
    assert itself.returncode == 4 and "node n1 cannot remove itself: ask another member" in itself.stderr, itself
    as_json = maxqctl(n1, "--json", "remove-node", "ghost")
    assert as_json.returncode == 4 and json.loads(as_json.stdout)["reason"] == "unknown node", as_json

    for args, message in [
        (["add-node", "n9", "--raft-addr", "nope"], "expected HOST:PORT with a port 1-65535, got 'nope'"),
        (["add-node", "n9", "--raft-addr", "127.0.0.1:0"], "expected HOST:PORT"),
        (["add-node", "n9"], "the following arguments are required: --raft-addr"),
        (["add-node", "bad name", "--raft-addr", "127.0.0.1:7000"], "a node name is 1-64 of letters"),
        (["remove-node", "a/b"], "a node name is 1-64 of letters"),
        (["transfer-leadership", "meta"], "the following arguments are required: NODE"),
    ]:
        result = maxqctl(n1, *args)
        assert result.returncode == 2, (args, result)
        assert message in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr

    # A node nobody started: the handshake probe fails after 5 s (exit 5). While that change is
    # under way, another change asked of the same node is refused as pending (exit 4). Which of
    # the two requests reaches the engine first is up to the scheduler: one of each is expected.
    first = subprocess.Popen(
        [
            MAXQCTL,
            "--node",
            f"127.0.0.1:{n1.http_port}",
            "add-node",
            "ghost",
            "--raft-addr",
            f"127.0.0.1:{free_port()}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    outcomes: list[tuple[int, str]] = []
    try:
        time.sleep(0.5)
        deadline = time.monotonic() + 60
        while first.poll() is None and time.monotonic() < deadline:
            second = maxqctl(n1, "add-node", "ghost2", "--raft-addr", f"127.0.0.1:{free_port()}")
            outcomes.append((second.returncode, second.stderr))
            if second.returncode == 4:
                break
            time.sleep(0.2)
        _out, err = first.communicate(timeout=90)
        outcomes.append((first.returncode, err))
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
    assert [
        o for o in outcomes if o[0] == 5 and "unreachable: ghost" in o[1] and "did not complete the handshake" in o[1]
    ], outcomes
    assert [o for o in outcomes if o[0] == 4 and "a membership change is already in progress" in o[1]], outcomes
    assert not [o for o in outcomes if o[0] not in (4, 5)], outcomes
    wait_for(lambda: settled(n1, list(NAMES)), 30, "the membership to be unchanged")

    # A member is down: removing another connected member would leave 1 of 2 reachable.
    cluster["n3"].stop()
    wait_for(
        lambda: [m["state"] for m in status_of(n1)["members"] if m["node"] == "n3"] == ["unreachable"],
        60,
        "n1 to see n3 down",
    )
    refused = maxqctl(n1, "remove-node", "n2")
    assert refused.returncode == 4, refused
    assert "removing n2 would leave groups without a quorum" in refused.stderr and "--force" in refused.stderr
    assert memberships(status_of(n1))["meta"] == list(NAMES)
    # Removing the member that is down is safe (the two left are both up): replacing a dead node.
    gone = maxqctl(n1, "remove-node", "n3")
    assert gone.returncode == 0, (gone.stdout, gone.stderr)
    wait_for(lambda: settled(n1, ["n1", "n2"]), 60, "n3 to leave every group")


def test_a_single_node_is_no_cluster_member(start_broker):
    single = start_broker()
    for args in (
        ["add-node", "n2", "--raft-addr", "127.0.0.1:7102"],
        ["remove-node", "n2"],
        ["remove-node", "n2", "--force"],
        ["transfer-leadership", "meta", "n2"],
    ):
        result = maxqctl(single, *args)
        assert result.returncode == 4, (args, result)
        assert "this node is not a cluster member (started without --raft-addr/--peer)" in result.stderr, result.stderr
    status = maxqctl(single, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["clustered"] is False


def _group(members: dict[str, tuple[bool, bool]]) -> dict:
    return {"members": {n: {"self": s, "connected": c} for n, (s, c) in members.items()}}


def test_quorum_after_removal_counts_the_reachable_members_of_the_new_configuration():
    three_one_down = {"meta": _group({"n1": (True, True), "n2": (False, True), "n3": (False, False)})}
    assert quorum_after_removal(three_one_down, "n3") == []  # n1, n2 both up: 2 of 2
    assert quorum_after_removal(three_one_down, "n2") == ["meta: 1 of 2 remaining members reachable"]
    all_up = {g: _group({"n1": (True, True), "n2": (False, True), "n3": (False, True)}) for g in GROUPS}
    assert quorum_after_removal(all_up, "n2") == []
    five_two_down = {
        "meta": _group(
            {"a": (True, True), "b": (False, True), "c": (False, True), "d": (False, False), "e": (False, False)}
        )
    }
    assert quorum_after_removal(five_two_down, "d") == []  # 3 of 4 up
    assert quorum_after_removal(five_two_down, "c") == ["meta: 2 of 4 remaining members reachable"]
    assert quorum_after_removal({"meta": _group({"a": (True, True)})}, "a") == [
        "meta: 0 of 0 remaining members reachable"
    ]
    assert quorum_after_removal(three_one_down, "ghost") == []  # not a member: the caller says so
