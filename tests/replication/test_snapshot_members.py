"""The members a group takes from a snapshot it installs or restarts from (group.py, `_adopt`).

One Group on its own (pysyncobj and our journal, no peer reachable): the snapshots are laid
as the transport lays a received one (`_installed`), and the members read back from pysyncobj.
"""

from __future__ import annotations

from pathlib import Path

from maxq_raft.replication.group import Group
from maxq_raft.replication.snapshot_file import SnapshotHeader, write_snapshot

PAYLOAD = b"\x03"  # wire.CMD_PAYLOAD
ADDR = {f"n{i}": ("127.0.0.1", 7000 + i) for i in range(1, 8)}


class NoPeerUp:
    """The engine's hub with no peer linked: nothing is sent."""

    def peer_is_up(self, node_id: str) -> bool:
        return False

    def send_raft(self, node_id: str, body: bytes) -> bool:
        return False

    def add_peer(self, group: str, node_id: str, addr: tuple[str, int] | None) -> None:
        pass

    def drop_peer(self, group: str, node_id: str) -> None:
        pass


def learner(data_dir: Path, node_id: str, members_before: list[str]) -> Group:
    """`node_id` started on a group as a move does (the members before it, learning)."""
    g = Group(
        "g0",
        node_id=node_id,
        raft_addr=ADDR[node_id],
        peers={m: ADDR[m] for m in members_before},
        data_dir=data_dir,
        fsync=False,
        link=NoPeerUp(),
        on_commit=lambda _group, _entries: None,
        on_durable=lambda _g: None,
        propose_timeout_s=5.0,
        proposals_pending_max=100,
    )
    g.start_learning()
    return g


def snapshot(index: int, members: list[str]) -> SnapshotHeader:
    return SnapshotHeader(
        "g0",
        index,
        2,
        (PAYLOAD + b"prev", index - 1, 2),
        (PAYLOAD + b"last", index, 2),
        [(m, *ADDR[m]) for m in members],
    )


def install(g: Group, header: SnapshotHeader, leader: str) -> None:
    write_snapshot(g.snap_dir, header, [b"state"])  # (as the transport's receiver does)
    g._installed(header, leader, 3)


def test_a_learner_takes_the_members_of_each_snapshot_it_installs(tmp_path: Path) -> None:
    # Seed 2006's n4: it held g0 with n1 and n5, was drained off it, then moved back while the
    # group was on n2, n3, n5. Its first snapshot (from n2, leading) was from before its
    # removal; the next (from n5), from before its return: the group's members at its index.
    g = learner(tmp_path, "n4", ["n2", "n3", "n5"])
    try:
        install(g, snapshot(322, ["n1", "n4", "n5"]), leader="n2")
        assert sorted(g.member_ids()) == ["n1", "n2", "n4", "n5"]  # (n2 leads: its addition comes after 322)
        install(g, snapshot(1000, ["n2", "n3", "n5"]), leader="n5")
        # Before: n1, n4, n5 (the second snapshot did not name n4 and changed nothing), and n4,
        # leading later, told n3 it was not a member.
        assert sorted(g.member_ids()) == ["n2", "n3", "n4", "n5"]
    finally:
        g.close()


def test_a_learner_restarted_from_a_snapshot_without_it_keeps_its_leader(tmp_path: Path) -> None:
    g = learner(tmp_path, "n4", ["n2", "n3", "n6"])
    try:
        install(g, snapshot(500, ["n2", "n3", "n5"]), leader="n6")
        assert sorted(g.member_ids()) == ["n2", "n3", "n4", "n5", "n6"]
    finally:
        g.close()
    again = learner(tmp_path, "n4", ["n2", "n3", "n6"])
    try:
        assert again.snapshot is not None and again.snapshot.index == 500
        assert sorted(again.member_ids()) == ["n2", "n3", "n4", "n5", "n6"]
    finally:
        again.close()


def test_a_member_restarted_from_its_snapshot_takes_exactly_its_members(tmp_path: Path) -> None:
    g = learner(tmp_path, "n4", ["n1", "n2"])
    try:
        install(g, snapshot(700, ["n2", "n4", "n5"]), leader="n2")
        assert sorted(g.member_ids()) == ["n2", "n4", "n5"]
    finally:
        g.close()
    again = learner(tmp_path, "n4", ["n1", "n2"])  # (its first members: the ones before the snapshot)
    try:
        assert sorted(again.member_ids()) == ["n2", "n4", "n5"]
    finally:
        again.close()
