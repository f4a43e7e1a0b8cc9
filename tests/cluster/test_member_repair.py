"""A member with a damaged journal is rebuilt from its peers (issue #23, part 2), on a real
3-node cluster: it refuses to start, naming the file and offset and the way out; `maxqctl
repair-member` refuses while the member is up or while the others could not form a majority
without it; once asked rightly it removes and re-adds the member, which, started with
`--repair-from-peers`, moves its damaged data aside and is installed from the others with every
confirmed message."""

from __future__ import annotations

import subprocess

import pika

from ..helpers import wait_for
from .conftest import Cluster, drain
from .test_maxqctl_cluster import MAXQCTL, NAMES, maxqctl, settled

MESSAGES = 200
CLUSTER_READY_S = 60.0


def publish_confirmed(member, queue: str, first: int, count: int) -> set[int]:
    with member.connect() as connection:
        channel = connection.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for n in range(first, first + count):
            channel.basic_publish("", queue, str(n).encode(), pika.BasicProperties(delivery_mode=2))
    return set(range(first, first + count))


def flip_a_byte_inside(segment) -> int:
    """Damage a record in the middle of a journal segment (not a torn tail): returns the offset."""
    data = bytearray(segment.read_bytes())
    offset = len(data) // 2
    data[offset] ^= 0xFF
    segment.write_bytes(bytes(data))
    return offset


def test_a_member_with_a_damaged_journal_is_rebuilt_from_its_peers(tmp_path):
    cluster = Cluster(tmp_path).start()
    try:
        n1, n2, n3 = (cluster[name] for name in NAMES)
        wait_for(lambda: settled(n1, list(NAMES)), 30, "every group led")
        confirmed = publish_confirmed(n1, "repair-q", 0, MESSAGES)
        # Wait until n3 holds them too (its applied index), then stop it and damage its journal.
        wait_for(lambda: settled(n3, list(NAMES)), 30, "n3 caught up")
        n3.stop()
        segments = sorted((n3.data_dir / "raft" / "raft").glob("shard-*/*.seg"), key=lambda p: -p.stat().st_size)
        flip_a_byte_inside(segments[0])
        damaged_bytes = segments[0].read_bytes()

        # --check finds it offline, naming the file and offset.
        check = subprocess.run(
            [*_server_command(), "--data-dir", str(n3.data_dir), "--check"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(tmp_path),
        )
        assert check.returncode == 1 and str(segments[0]) in check.stdout and "crc mismatch at offset" in check.stdout

        # A plain start refuses, naming the file and the way out, without a traceback.
        n3.launch()
        assert n3.proc.wait(CLUSTER_READY_S) == 1
        log = n3.log_text()
        assert str(segments[0]) in log and "crc mismatch" in log and "--repair-from-peers" in log, log[-3000:]
        assert "Traceback" not in log
        assert "repair-member n3" in log

        raft_addr = f"127.0.0.1:{n3.raft_port}"
        # Refused while the others could not form a majority without n3 (n2 down as well).
        n2.stop()
        refused = maxqctl(n1, "repair-member", "n3", "--raft-addr", raft_addr)
        assert refused.returncode == 4 and "quorum" in refused.stderr, refused.stderr
        n2.launch()
        n2.wait_ready(CLUSTER_READY_S)
        wait_for(lambda: _state_of(n1, "n2") == "up" and _groups_led(n1), 30, "n2 back, as n1 sees it")
        # (alone, n1 closed its clients and refused new ones: it serves again once it sees a majority)
        wait_for(lambda: _serves(n1), 30, "n1 serving clients again")

        # Refused for a member that is up.
        up = maxqctl(n1, "repair-member", "n2", "--raft-addr", f"127.0.0.1:{n2.raft_port}")
        assert up.returncode == 4 and "is up: stop it first" in up.stderr, up.stderr

        confirmed |= publish_confirmed(n1, "repair-q", MESSAGES, MESSAGES)  # while n3 is out
        # The operator runs repair-member (it removes n3, then waits for n3 to run again) and
        # starts n3 with --repair-from-peers once told to.
        returncode, out, err = repair_member(n1, n3)
        assert returncode == 0, err
        assert "now start it with `maxq-server ... --repair-from-peers`" in err and "added back" in out
        n3.wait_ready(CLUSTER_READY_S)
        moved = list(n3.data_dir.glob("damaged-*"))
        assert len(moved) == 1 and (moved[0] / "raft" / "raft").is_dir(), moved
        assert (moved[0] / segments[0].relative_to(n3.data_dir)).read_bytes() == damaged_bytes  # kept as it was
        assert "repair from peers:" in n3.log_text() and "crc mismatch" in n3.log_text()
        wait_for(lambda: settled(n3, list(NAMES)), CLUSTER_READY_S, "n3 back in every group, each one led")
        # (the groups are placed, 3 of 3 at the default factor: added back as a new member, n3
        # held the metadata group only until repair-member moved its replicas back)
        assert [g["group"] for g in n3.admin("/api/cluster/status")["groups"]] == ["meta", "shard-0", "shard-1"]
        assert "added back to the metadata group and shard-0, shard-1" in out, out
        # Installed: n3 has applied each group up to where n1 had committed it after the publishes.
        committed = {g["group"]: g["commit_index"] for g in n1.admin("/api/cluster/status")["groups"]}
        wait_for(
            lambda: all(
                (g["applied_index"] or 0) >= committed[g["group"]] for g in n3.admin("/api/cluster/status")["groups"]
            ),
            CLUSTER_READY_S,
            "n3 applied what n1 had committed",
        )
        got = {int(body) for body, _ in drain(n3, "repair-q")}  # (read through n3)
        assert confirmed <= got, f"lost {len(confirmed - got)} confirmed messages"
    finally:
        cluster.stop()


def _serves(member) -> bool:
    try:
        with member.connect() as connection:
            connection.channel().queue_declare("repair-q", durable=True, passive=True)
        return True
    except Exception:  # refused or closed while it has no majority
        return False


def repair_member(asker, member) -> tuple[int, str, str]:
    """What the operator does: `maxqctl repair-member` asked of `asker` (it removes `member` from
    every group, then waits for it to run again), and `member` started with --repair-from-peers
    once removed. The command's exit status, stdout and stderr."""
    repair = subprocess.Popen(
        [
            MAXQCTL,
            "--node",
            f"127.0.0.1:{asker.http_port}",
            "repair-member",
            member.name,
            "--raft-addr",
            f"127.0.0.1:{member.raft_port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: _removed_everywhere(asker, member.name), 60, f"{member.name} removed from every group")
        member.extra_args = [*member.extra_args, "--repair-from-peers"]
        member.launch()
        out, err = repair.communicate(timeout=120)
    finally:
        if repair.poll() is None:
            repair.kill()
            repair.wait(10)
    return repair.returncode, out, err


def _removed_everywhere(member, name: str) -> bool:
    try:
        groups = member.admin("/api/cluster/status")["groups"]
    except Exception:
        return False
    return all(name not in [m["node"] for m in g["members"]] for g in groups)


def _state_of(member, name: str) -> str | None:
    try:
        members = member.admin("/api/cluster/status")["members"]
    except Exception:
        return None
    return next((m["state"] for m in members if m["node"] == name), None)


def _groups_led(member) -> bool:
    try:
        groups = member.admin("/api/cluster/status")["groups"]
    except Exception:
        return False
    return all(g.get("leader") for g in groups)


def test_sound_data_is_left_alone_and_a_single_node_refuses_the_option(tmp_path):
    cluster = Cluster(tmp_path).start()
    try:
        n3 = cluster["n3"]
        n3.stop()
        n3.extra_args = [*n3.extra_args, "--repair-from-peers"]
        n3.launch()
        n3.wait_ready(CLUSTER_READY_S)
        assert "passes every check; starting from it as usual" in n3.log_text()
        assert not list(n3.data_dir.glob("damaged-*"))
    finally:
        cluster.stop()
    single = subprocess.run(
        [*_server_command(), "--data-dir", str(tmp_path / "single"), "--repair-from-peers"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert single.returncode == 2 and "--repair-from-peers is for a cluster member" in single.stderr


def _server_command() -> list[str]:
    import sys

    return [sys.executable, "-m", "maxq_raft"]
