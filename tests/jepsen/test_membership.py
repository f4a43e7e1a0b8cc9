"""The membership nemesis's pure parts: the maxqctl command lines, the reading of its answers,
the bounded retry loop (with a fake maxqctl), and `--join on` on a wiped member's command line.
The nemesis itself runs in real runs (`--nemesis membership`); no broker is started here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen import nemesis as nem  # noqa: E402
from maxq_jepsen.lab import MAXQCTL_ENV, Node, maxqctl_command  # noqa: E402


def member(name: str, i: int, netns: bool = True, tmp: Path = Path("/tmp/x")) -> Node:
    ns = f"mxqj-1-{name}" if netns else None
    node = Node(
        name,
        f"10.77.0.{i}" if netns else "127.0.0.1",
        5672,
        tmp / name / "data",
        tmp / f"{name}.log",
        [],
        http_port=15672,
        raft_port=7000,
        prefix=["ip", "netns", "exec", ns] if netns else [],
        netns=ns,
    )
    node.shards = 2
    return node


def test_maxqctl_runs_in_the_askers_namespace_against_its_loopback_admin_api(monkeypatch):
    monkeypatch.delenv(MAXQCTL_ENV, raising=False)
    cmd = maxqctl_command(member("n3", 3), "remove-node", "n2")
    assert cmd == [
        "ip",
        "netns",
        "exec",
        "mxqj-1-n3",
        sys.executable,
        "-m",
        "maxq_raft.cli.maxqctl",
        "--node",
        "127.0.0.1:15672",
        "--json",
        "remove-node",
        "n2",
    ]
    local = member("n1", 1, netns=False)
    local.http_port = 21001
    assert maxqctl_command(local, "add-node", "n2", "--raft-addr", "127.0.0.1:7002")[:5] == [
        sys.executable,
        "-m",
        "maxq_raft.cli.maxqctl",
        "--node",
        "127.0.0.1:21001",
    ]
    monkeypatch.setenv(MAXQCTL_ENV, "env PYTHONPATH=/tmp/b python -P -m maxq_raft.cli.maxqctl")
    assert maxqctl_command(local, "status")[:4] == ["env", "PYTHONPATH=/tmp/b", "python", "-P"]


def test_a_wiped_member_starts_with_join_on_and_its_own_address():
    node = member("n2", 2)
    node.peers = {"n1": "10.77.0.1:7000", "n3": "10.77.0.3:7000"}
    assert "--join" not in node.command()
    node.join = True
    cmd = node.command()
    assert cmd[cmd.index("--join") + 1] == "on"
    assert cmd[cmd.index("--node-id") + 1] == "n2" and cmd[cmd.index("--raft-addr") + 1] == "10.77.0.2:7000"
    assert node.raft_address == "10.77.0.2:7000" and node.admin_address == "127.0.0.1:15672"


def test_reading_maxqctl_answers():
    body = json.dumps(
        {"error": "a membership change is already in progress in shard-0; wait and retry", "reason": "pending"}
    )
    assert nem.change_reason(body, "maxqctl: a membership change ...") == "pending"
    assert nem.change_reason("", "maxqctl: cannot reach 127.0.0.1:15672\n") == "maxqctl: cannot reach 127.0.0.1:15672"
    assert nem.change_outcome("remove-node", 0, "ok") == "done"
    assert nem.change_outcome("remove-node", 4, "unknown node") == "done"  # a timed-out removal that went through
    assert nem.change_outcome("add-node", 4, "already a member") == "done"
    assert nem.change_outcome("add-node", 4, "unknown node") == "retry"
    for code, reason in ((4, "pending"), (4, "would lose quorum"), (5, "timeout"), (3, ""), (None, "")):
        assert nem.change_outcome("remove-node", code, reason) == "retry"
    assert nem.change_outcome("add-node", 2, "usage") == "give-up"


class FakeNode:
    def __init__(self, name: str, up: bool = True) -> None:
        self.name, self.up, self.paused = name, up, False

    def alive(self) -> bool:
        return self.up


def answering(answers: list, asked: list):
    """A stand-in for run_maxqctl: the next of `answers`, each call noted in `asked`."""

    def fake(asker, *args, timeout_s):
        asked.append((asker.name, args))
        return answers.pop(0)

    return fake


def test_a_refused_change_is_retried_on_live_members_and_bounded(monkeypatch):
    answers = [(4, json.dumps({"reason": "pending"}), ""), (5, json.dumps({"reason": "timeout"}), ""), (0, "{}", "")]
    asked: list = []
    monkeypatch.setattr(nem, "run_maxqctl", answering(answers, asked))
    n1, n2, n3 = FakeNode("n1"), FakeNode("n2", up=False), FakeNode("n3")
    out = nem.membership_change(None, "remove-node", ["n2"], [n2, n1, n3], sleep=lambda s: None)
    assert out == {"done": True, "attempts": [["n1", 4, "pending"], ["n3", 5, "timeout"], ["n1", 0, "ok"]]}
    assert all(a == ("remove-node", "n2") for _, a in asked)  # never the dead member

    monkeypatch.setattr(nem, "run_maxqctl", lambda asker, *a, timeout_s: (4, json.dumps({"reason": "pending"}), ""))
    out = nem.membership_change(None, "add-node", ["n2"], [n1], sleep=lambda s: None)
    assert out["done"] is False and len(out["attempts"]) == nem.CHANGE_TRIES_MAX
    assert nem.membership_change(None, "add-node", ["n2"], [n2], sleep=lambda s: None) == {
        "done": False,
        "attempts": [],
    }


def test_heal_with_nothing_removed_does_nothing():
    assert nem.MembershipNemesis().heal(None) == {"rejoined": []}


class FakeLab:
    def __init__(self, nodes) -> None:
        self.nodes = nodes


def test_a_drain_is_done_once_recorded_and_a_revive_is_retried_until_it_is(monkeypatch):
    # maintenance nemesis: exit 5 ("still leads" after the wait) means the drain is recorded
    asked: list = []
    monkeypatch.setattr(
        nem, "run_maxqctl", answering([(4, json.dumps({"reason": "last member"}), ""), (5, "{}", "")], asked)
    )
    n1, n2, n3 = FakeNode("n1"), FakeNode("n2", up=False), FakeNode("n3")
    out = nem.DrainNemesis._ask(FakeLab([n1, n2, n3]), "drain", n3, (0, 5), sleep=lambda s: None)
    assert out == {"done": True, "attempts": [["n1", 4, "last member"], ["n3", 5, ""]]}
    assert [a for _, a in asked] == [("--timeout", "15", "drain", "n3")] * 2 and "n2" not in [n for n, _ in asked]
    monkeypatch.setattr(nem, "run_maxqctl", lambda asker, *a, timeout_s: (5, "{}", ""))
    out = nem.DrainNemesis._ask(FakeLab([n1, n3]), "revive", n3, (0,), sleep=lambda s: None)
    assert out["done"] is False and len(out["attempts"]) == nem.CHANGE_TRIES_MAX
    assert nem.DrainNemesis().heal(FakeLab([n1])) == {"revived": []}
