"""A cluster data folder is its member's: the first start records the name, another is refused."""

from __future__ import annotations

import pytest

from maxq_raft.server.node_name import NAME_FILE, NodeNameError, check_node_name


def test_the_first_start_records_the_name_and_later_starts_under_it_pass(tmp_path):
    raft = tmp_path / "raft"
    check_node_name(raft, "n2")
    assert (raft / NAME_FILE).read_bytes() == b"n2"
    check_node_name(raft, "n2")
    assert not list(raft.glob("*.tmp"))


def test_a_folder_of_an_earlier_release_takes_the_name_it_is_started_with(tmp_path):
    raft = tmp_path / "raft"
    (raft / "raft" / "meta").mkdir(parents=True)  # (Raft data, no record)
    check_node_name(raft, "n3")
    assert (raft / NAME_FILE).read_bytes() == b"n3"


def test_another_members_folder_is_refused_and_says_whose_it_is(tmp_path):
    raft = tmp_path / "raft"
    check_node_name(raft, "n2")
    with pytest.raises(NodeNameError) as refused:
        check_node_name(raft, "n3")
    said = str(refused.value)
    assert "belongs to cluster member 'n2', not 'n3'" in said and "--node-id n2" in said
    assert (raft / NAME_FILE).read_bytes() == b"n2"  # (unchanged)


@pytest.mark.parametrize("body", [b"", b"\xff\xfe", b"x" * 300])
def test_a_damaged_record_is_an_error_not_a_guess(tmp_path, body):
    raft = tmp_path / "raft"
    raft.mkdir()
    (raft / NAME_FILE).write_bytes(body)
    with pytest.raises(NodeNameError, match="does not hold a node name"):
        check_node_name(raft, "n1")
    assert (raft / NAME_FILE).read_bytes() == body
