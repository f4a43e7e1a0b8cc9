"""The on-disk record of which groups a member holds, and each group's first members (group_set.py)."""

from __future__ import annotations

import time

import pytest

from maxq_raft.replication import group_set
from maxq_raft.replication.engine import ReplicationNode
from tests.conftest import free_port


def test_records_round_trip_and_absence_means_every_group(tmp_path):
    raft = tmp_path / "raft"
    assert group_set.read_held(raft) is None
    group_set.write_held(raft, ["g2", "g0"], fsync=True)
    assert group_set.read_held(raft) == ["g0", "g2"]
    assert group_set.read_first_members(raft / "g0") is None
    group_set.write_first_members(raft / "g0", {"n2": ("127.0.0.1", 7002), "n1": ("127.0.0.1", 7001)}, fsync=True)
    assert group_set.read_first_members(raft / "g0") == {"n1": ("127.0.0.1", 7001), "n2": ("127.0.0.1", 7002)}
    assert not list(raft.glob("*.tmp")) and not list((raft / "g0").glob("*.tmp"))


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[]", b'{"held": "g0"}', b'{"held": [1]}', b'{"other": []}'],
)
def test_a_damaged_held_record_is_an_error_not_a_guess(tmp_path, body):
    raft = tmp_path / "raft"
    raft.mkdir()
    (raft / group_set.HELD_FILE).write_bytes(body)
    with pytest.raises(group_set.GroupSetError, match="held_groups.json"):
        group_set.read_held(raft)


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"members": []}', b'{"members": {"n1": ["h"]}}', b'{"members": {"n1": ["h", "7001"]}}'],
)
def test_a_damaged_first_members_record_is_an_error(tmp_path, body):
    folder = tmp_path / "raft" / "g0"
    folder.mkdir(parents=True)
    (folder / group_set.FIRST_MEMBERS_FILE).write_bytes(body)
    with pytest.raises(group_set.GroupSetError, match="first_members.json"):
        group_set.read_first_members(folder)


def _node(tmp_path, **kw) -> ReplicationNode:
    kw.setdefault("peers", {"n2": ("127.0.0.1", 1)})
    return ReplicationNode(
        node_id="n1",
        raft_addr=("127.0.0.1", 0),
        cluster_secret=b"s",
        data_dir=tmp_path,
        groups=["g0", "g1"],
        on_commit=lambda _g, _e: None,
        **kw,
    )


def test_an_engine_refuses_to_start_on_a_damaged_record_or_unknown_groups(tmp_path):
    with pytest.raises(ValueError, match="held groups \\['g9'\\] are not among the groups"):
        _node(tmp_path, held=["g0", "g9"])
    raft = tmp_path / "raft"
    raft.mkdir()
    (raft / group_set.HELD_FILE).write_bytes(b'{"held": ["g0", "g7"]}')
    node = _node(tmp_path)
    with pytest.raises(group_set.GroupSetError, match="holds \\['g7'\\], which are not among the groups"):
        node.start()
    (raft / group_set.HELD_FILE).write_bytes(b"{")
    with pytest.raises(group_set.GroupSetError):
        _node(tmp_path).start()


def test_a_member_waiting_for_the_first_placement_says_so_until_it_starts_the_groups_given(tmp_path):
    node = _node(tmp_path, held=[], await_placement=True)
    node.start()
    try:
        assert node.awaiting_placement and node.groups == {}
        assert group_set.placement_pending(tmp_path / "raft")
        answers: list = []
        node.start_groups({"g1": {"n1": node.raft_addr, "n2": ("127.0.0.1", 1)}}, answers.append)
        deadline = time.monotonic() + 10
        while not answers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answers == [None]
        assert list(node.groups) == ["g1"] and not node.awaiting_placement
        assert group_set.read_held(tmp_path / "raft") == ["g1"]
        assert not group_set.placement_pending(tmp_path / "raft")
        assert group_set.read_first_members(tmp_path / "raft" / "g1") == {
            "n1": node.raft_addr,
            "n2": ("127.0.0.1", 1),
        }
        node.start_groups({"g7": {"n1": node.raft_addr}}, answers.append)
        deadline = time.monotonic() + 10
        while len(answers) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert answers[1] == "groups ['g7'] are not among this node's groups" and list(node.groups) == ["g1"]
    finally:
        node.stop()
    # A restart before the groups came waits again; after, it starts them from its records.
    restarted = _node(tmp_path, held=["g0"], await_placement=True)
    restarted.start()
    try:
        assert list(restarted.groups) == ["g1"] and not restarted.awaiting_placement
    finally:
        restarted.stop()


@pytest.mark.parametrize("await_placement", [True, False])  # (a first placement's member; one joining)
def test_a_folder_started_with_every_group_keeps_them_when_a_restart_gives_a_few(tmp_path, await_placement):
    first = _node(tmp_path)
    first.start()
    first.stop()
    assert sorted(p.name for p in (tmp_path / "raft").iterdir() if p.is_dir()) == ["g0", "g1"]
    again = _node(tmp_path, held=["g0"], await_placement=await_placement)
    again.start()
    try:
        assert list(again.groups) == ["g0", "g1"] and again.kept_every_group
        assert group_set.holds_every_group(tmp_path / "raft", ["g0", "g1"])
        assert not group_set.holds_every_group(tmp_path / "other", ["g0", "g1"])  # (never started there)
        assert not again.awaiting_placement and not group_set.placement_pending(tmp_path / "raft")
        assert group_set.read_held(tmp_path / "raft") is None  # (still the layout of every group)
    finally:
        again.stop()


def test_a_group_starts_from_its_recorded_members_at_the_addresses_the_peer_list_gives(tmp_path):
    first = _node(tmp_path)  # (n1 with peer n2 at port 1: the old layout, every group)
    first.start()
    first.stop()
    assert group_set.read_first_members(tmp_path / "raft" / "g0") == {"n1": ("127.0.0.1", 0), "n2": ("127.0.0.1", 1)}
    alone = ReplicationNode(  # restarted without its peer list: still n2's group, at its recorded address
        node_id="n1",
        raft_addr=("127.0.0.1", 0),
        peers={},
        cluster_secret=b"s",
        data_dir=tmp_path,
        groups=["g0", "g1"],
        on_commit=lambda _g, _e: None,
    )
    alone.start()
    try:
        assert sorted(alone.groups["g0"].member_ids()) == ["n1", "n2"]
        assert alone.hub.addrs["n2"] == ("127.0.0.1", 1)
    finally:
        alone.stop()
    moved = _node(tmp_path, peers={"n2": ("127.0.0.1", 2)})  # n2 at another address, as --peer says
    moved.start()
    try:
        assert moved.hub.addrs["n2"] == ("127.0.0.1", 2)
    finally:
        moved.stop()


def test_a_restart_before_the_first_placement_came_waits_for_it_again(tmp_path):
    node = _node(tmp_path, held=[], await_placement=True)
    node.start()
    node.stop()
    again = _node(tmp_path, held=[], await_placement=False)
    again.start()
    try:
        assert again.awaiting_placement and again.groups == {}
    finally:
        again.stop()


def test_a_peer_says_it_waits_for_the_first_placement_until_it_started_its_groups(tmp_path):
    ports = {"n1": free_port(), "n2": free_port()}

    def node(nid: str, **kw) -> ReplicationNode:
        other = "n2" if nid == "n1" else "n1"
        return ReplicationNode(
            node_id=nid,
            raft_addr=("127.0.0.1", ports[nid]),
            peers={other: ("127.0.0.1", ports[other])},
            cluster_secret=b"s",
            data_dir=tmp_path / nid,
            groups=["g0", "g1"],
            on_commit=lambda _g, _e: None,
            **kw,
        )

    waiting, watching = node("n1", held=[], await_placement=True), node("n2", held=["g0", "g1"])
    waiting.start()
    watching.start()
    try:
        deadline = time.monotonic() + 10
        while watching.peers_awaiting_placement() != ["n1"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watching.peers_awaiting_placement() == ["n1"] and watching.peer_held()["n1"] == frozenset()
        answers: list = []
        waiting.start_groups(
            {"g0": {"n1": ("127.0.0.1", ports["n1"]), "n2": ("127.0.0.1", ports["n2"])}}, answers.append
        )
        deadline = time.monotonic() + 10
        while (watching.peers_awaiting_placement() or "g0" not in watching.peer_held().get("n1", ())) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.02)
        assert answers == [None]
        assert watching.peers_awaiting_placement() == [] and watching.peer_held()["n1"] == frozenset({"g0"})
    finally:
        waiting.stop()
        watching.stop()
