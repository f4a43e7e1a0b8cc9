"""A 3-node cluster of the previous release, upgraded one member at a time under confirmed load
(issue #23, part 3): nothing confirmed is lost, and the cluster serves throughout.

The previous release is the commit named in `tests/upgrade/previous_release`, taken from this
clone's git history (`git archive`) and laid out as the installed package is (`amqp/` and
`storage/` inside `maxq_raft/`); a member runs it with that folder first on PYTHONPATH. Each
member in turn is stopped with SIGTERM, as an upgrade stops it, and started again on the same
data folder with this checkout's code, while a publisher keeps publishing persistent messages
with confirms to the members in turn. At the end every confirmed message is consumed. Feature
flags (machines/features.py) stay off while a member of the previous release is in the cluster
and are enabled once the last one is replaced; after that, a member of the previous release
cannot join.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from maxq_raft.machines.features import SUPPORTED
from maxq_raft.server.cluster import shard_of
from tests.cluster.conftest import Cluster, ConfirmingPublisher, Member, drain
from tests.conftest import free_port
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
PREVIOUS = (Path(__file__).parent / "previous_release").read_text().split()[0]
CONFIRMS_PER_STEP = 30
STEP_TIMEOUT_S = 60.0
GIT_TIMEOUT_S = 60
MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


@pytest.fixture(scope="module")
def previous_tree(tmp_path_factory) -> Path:
    """The previous release's package folder, for PYTHONPATH."""
    root = tmp_path_factory.mktemp("previous")
    archive = root / "src.tar"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git history in this copy: the previous release's code cannot be had")
    made = subprocess.run(
        [
            "git",
            "-C",
            str(REPO),
            "archive",
            "--format=tar",
            "-o",
            str(archive),
            PREVIOUS,
            "maxq_raft",
            "amqp",
            "storage",
        ],
        capture_output=True,
        timeout=GIT_TIMEOUT_S,
    )
    if made.returncode != 0:  # a shallow clone: say so rather than pass by testing nothing
        pytest.skip(f"commit {PREVIOUS} is not in this clone's history: {made.stderr.decode(errors='replace')[:200]}")
    with tarfile.open(archive) as tar:
        tar.extractall(root / "src", filter="data")
    package = root / "pkg" / "maxq_raft"
    shutil.move(root / "src" / "maxq_raft", package)
    shutil.move(root / "src" / "amqp", package / "amqp")
    shutil.move(root / "src" / "storage", package / "storage")
    return root / "pkg"


def environment(previous: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if previous is not None:
        env["PYTHONPATH"] = str(previous)
    return env


def code_run_by(env: dict[str, str], cwd: Path) -> Path:
    """Where `python -m maxq_raft` with this environment and folder imports the package from."""
    out = subprocess.run(
        [sys.executable, "-c", "import maxq_raft; print(maxq_raft.__file__)"],
        env=env,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=GIT_TIMEOUT_S,
        check=True,
    )
    return Path(out.stdout.strip()).resolve()


def groups_led(member) -> bool:
    try:
        groups = member.admin("/api/cluster/status")["groups"]
    except Exception:  # not answering yet
        return False
    return bool(groups) and all(g.get("leader") for g in groups)


def placed_queues(member) -> dict[str, int] | None:
    """Shard group -> queues the metadata group records in it, as this member's status shows them."""
    status = member.admin("/api/cluster/status")
    if not status.get("placement_recorded"):
        return None
    return {g["group"]: g["queues"] for g in status["groups"] if g.get("queues")}


def flag_states(member) -> dict[str, str]:
    """Feature flags (machines/features.py) as this member's /api/feature-flags shows them."""
    return {flag["name"]: flag["state"] for flag in member.admin("/api/feature-flags")}


def test_members_upgraded_one_at_a_time_under_confirmed_load_lose_nothing(tmp_path, previous_tree) -> None:
    cluster = Cluster(tmp_path, hashed=False)  # (the previous release may not know --queue-leader-locator)
    old, new = environment(previous_tree), environment(None)
    assert code_run_by(old, tmp_path).is_relative_to(previous_tree.resolve())
    assert code_run_by(new, tmp_path).is_relative_to(REPO)
    publisher = None
    try:
        for member in cluster.members.values():
            member.env = old
        cluster.start()
        first = cluster["n1"]
        with first.connect() as connection:
            connection.channel().queue_declare("upgrade-q", durable=True)
        wait_for(lambda: groups_led(first), STEP_TIMEOUT_S, "every group led")
        publisher = ConfirmingPublisher(list(cluster.members.values()), "upgrade-q", pause_s=0.002)
        publisher.start()
        for name in ("n1", "n2", "n3"):
            before = len(publisher.confirmed)
            wait_for(
                lambda: len(publisher.confirmed) >= before + CONFIRMS_PER_STEP,
                STEP_TIMEOUT_S,
                f"confirms before {name}",
            )
            member = cluster[name]
            member.stop()
            member.env = new
            member.launch()
            member.wait_ready(STEP_TIMEOUT_S)
            wait_for(lambda: groups_led(member), STEP_TIMEOUT_S, f"every group led, seen from the upgraded {name}")
            if name != "n3":  # a member of the previous release announces no feature: none is enabled
                assert flag_states(member) == dict.fromkeys(SUPPORTED, "unavailable")
        for member in cluster.members.values():  # every member runs this code: its features are enabled
            wait_for(
                lambda: flag_states(member) == dict.fromkeys(SUPPORTED, "enabled"),
                STEP_TIMEOUT_S,
                f"feature flags enabled, seen from {member.name}",
            )
        # With placement enabled the metadata group records the groups, and the queue made under
        # the previous release in the group its name hashed to there (machines/placement.py).
        home = shard_of(("/", "upgrade-q"), 2)
        for member in cluster.members.values():
            wait_for(
                lambda: placed_queues(member) == {home: 1},
                STEP_TIMEOUT_S,
                f"the placement recorded, seen from {member.name}",
            )
        before = len(publisher.confirmed)
        wait_for(
            lambda: len(publisher.confirmed) >= before + CONFIRMS_PER_STEP, STEP_TIMEOUT_S, "confirms after the upgrade"
        )
        publisher.stop_flag.set()
        publisher.join(30)
        assert not publisher.is_alive()
        confirmed = publisher.confirmed_numbers()
        got = {int(body) for body, _ in drain(first, "upgrade-q")}
        lost = confirmed - got
        assert not lost, f"lost {len(lost)} of {len(confirmed)} confirmed: {sorted(lost)[:20]}"
        assert len(confirmed) >= 4 * CONFIRMS_PER_STEP
    finally:
        if publisher is not None:
            publisher.stop_flag.set()
            publisher.join(30)
        cluster.stop()
        for member in cluster.members.values():
            if "Traceback" in member.log_text():
                print(f"\n--- {member.name} log has a traceback ---\n{member.log_text()[-15000:]}")


def test_a_member_of_the_previous_release_cannot_join_once_feature_flags_are_enabled(tmp_path, previous_tree) -> None:
    # It would stop at the first command of an enabled feature: add-node refuses it and says why.
    cluster = Cluster(tmp_path, hashed=False)  # (as above)
    ports = {n: cluster[n].raft_port for n in cluster.members}
    late = Member("n4", tmp_path, free_port(), ports, ["--join", "on"], hashed=False)
    late.env = environment(previous_tree)
    try:
        cluster.start()
        first = cluster["n1"]
        wait_for(
            lambda: flag_states(first) == dict.fromkeys(SUPPORTED, "enabled"), STEP_TIMEOUT_S, "feature flags enabled"
        )
        late.launch()
        refused = subprocess.run(
            [
                MAXQCTL,
                "--node",
                f"127.0.0.1:{first.http_port}",
                "add-node",
                "n4",
                "--raft-addr",
                f"127.0.0.1:{late.raft_port}",
            ],
            capture_output=True,
            text=True,
            timeout=STEP_TIMEOUT_S,
        )
        assert refused.returncode != 0 and "409" in refused.stderr, refused
        # (the previous release announces nothing at all: it sends no group list; a later one
        # without a feature would be named as lacking it: tests/http/test_feature_flags_api.py)
        assert "a release without feature flags cannot join this cluster" in refused.stderr, refused.stderr
        groups = first.admin("/api/cluster/status")["groups"]
        assert all("n4" not in [m["node"] for m in g["members"]] for g in groups)
    finally:
        late.stop()
        cluster.stop()
