"""A cluster data folder is its member's: the first start records the name, another is refused."""

from __future__ import annotations

import pytest

from maxq_raft.server import persistence
from maxq_raft.server.folder_owner import NAME_FILE, NodeNameError, check_node_name, member_data, single_node_data
from maxq_raft.storage.memory import MemorySegmentStore


def test_the_first_start_records_the_name_and_later_starts_under_it_pass(tmp_path):
    raft = tmp_path / "raft"
    check_node_name(raft, "n2")
    assert (raft / NAME_FILE).read_bytes().split(b"\n")[0] == b"n2"
    check_node_name(raft, "n2")
    assert not list(raft.glob("*.tmp"))


def test_a_folder_keeps_its_incarnation_and_a_new_folder_under_the_name_gets_another(tmp_path):
    raft = tmp_path / "raft"
    first = check_node_name(raft, "n2")
    assert len(first) == 16 and check_node_name(raft, "n2") == first
    (raft / NAME_FILE).write_bytes(b"n2")  # (a record of the name alone, as first written)
    given = check_node_name(raft, "n2")
    assert given != first and check_node_name(raft, "n2") == given
    assert check_node_name(tmp_path / "again", "n2") not in (first, given)
    (raft / NAME_FILE).write_bytes(b"n2\nnot-hex")
    with pytest.raises(NodeNameError, match="does not hold an incarnation id"):
        check_node_name(raft, "n2")


def test_a_folder_of_an_earlier_release_takes_the_name_it_is_started_with(tmp_path):
    raft = tmp_path / "raft"
    (raft / "raft" / "meta").mkdir(parents=True)  # (Raft data, no record)
    check_node_name(raft, "n3")
    assert (raft / NAME_FILE).read_bytes().split(b"\n")[0] == b"n3"


def test_another_members_folder_is_refused_and_says_whose_it_is(tmp_path):
    raft = tmp_path / "raft"
    check_node_name(raft, "n2")
    with pytest.raises(NodeNameError) as refused:
        check_node_name(raft, "n3")
    said = str(refused.value)
    assert "belongs to cluster member 'n2', not 'n3'" in said and "--node-id n2" in said
    assert (raft / NAME_FILE).read_bytes().split(b"\n")[0] == b"n2"  # (unchanged)


@pytest.mark.parametrize("body", [b"", b"\xff\xfe", b"x" * 300])
def test_a_damaged_record_is_an_error_not_a_guess(tmp_path, body):
    raft = tmp_path / "raft"
    raft.mkdir()
    (raft / NAME_FILE).write_bytes(body)
    with pytest.raises(NodeNameError, match="does not hold a node name"):
        check_node_name(raft, "n1")
    assert (raft / NAME_FILE).read_bytes() == body


def test_a_store_a_single_node_started_on_is_told_apart_from_a_members(tmp_path):
    members = MemorySegmentStore()
    members.write((), (), {persistence.EPOCH_KEY: (1).to_bytes(8, "big")}, wal=True)  # (open_for_cluster's)
    assert single_node_data(members) is None
    single = MemorySegmentStore()
    single.write((), (), {persistence.SNAPSHOT_KEY: b"\x90"}, wal=True)
    assert "a single node's data" in single_node_data(single)


def test_a_raft_folder_says_whose_it_is(tmp_path):
    raft = tmp_path / "raft"
    assert member_data(raft) is None
    (raft / "raft").mkdir(parents=True)
    assert member_data(raft) is None  # (nothing started in it)
    (raft / "raft" / "meta").mkdir()
    assert member_data(raft) == "a cluster member's Raft data"
    check_node_name(raft, "n2")
    assert member_data(raft) == "the Raft data of cluster member 'n2'"
