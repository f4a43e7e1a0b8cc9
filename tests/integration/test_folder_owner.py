"""A data folder is a single node's or a cluster member's (server/folder_owner.py): started as
the other kind it is refused, and nothing in it changes. Before, a single node's folder started
as a cluster member had every queue's messages deleted (a member empties its store at start)."""

from __future__ import annotations

import pytest

from tests.conftest import BrokerProcess, free_port
from tests.helpers import publish_confirmed

pytestmark = pytest.mark.timeout(120)


def _refused(process: BrokerProcess) -> str:
    process.launch()
    assert process.proc.wait(60) != 0
    return process.log_text()


def _serves_the_kept_message(process: BrokerProcess) -> None:
    """Started as it was before, `process` still has what was published to it."""
    process.start()
    try:
        with process.connect() as connection:
            method, _props, body = connection.channel().basic_get("kept", auto_ack=True)
        assert method is not None and body == b"before"
    finally:
        process.stop()


def _member_args(name: str = "n1") -> list[str]:
    return ["--node-id", name, "--raft-addr", f"127.0.0.1:{free_port()}", "--cluster-secret", "s"]


def test_a_single_nodes_folder_started_as_a_member_is_refused_and_keeps_its_messages(tmp_path):
    node = BrokerProcess(tmp_path / "data", tmp_path / "server.log").start()
    publish_confirmed(node, "kept", b"before")
    node.stop()
    node.extra_args = _member_args()
    said = _refused(node)
    assert "holds a single node's data" in said and "a cluster member keeps its state in the Raft groups" in said
    assert "the messages of 1 queues" in said, said[-2000:]
    node.extra_args = []
    _serves_the_kept_message(node)


def test_a_members_folder_started_as_a_single_node_is_refused(tmp_path):
    member = BrokerProcess(tmp_path / "data", tmp_path / "server.log", _member_args("n1")).start()
    publish_confirmed(member, "kept", b"before")
    member.stop()
    args = member.extra_args
    member.extra_args = []
    said = _refused(member)
    assert "holds the Raft data of cluster member 'n1'" in said and "start it as that member again" in said
    member.extra_args = args
    _serves_the_kept_message(member)


@pytest.mark.parametrize("record", ["held_groups.json", "peer_incarnations.json"])
def test_a_damaged_record_of_the_groups_or_peers_stops_the_start_with_the_way_out(tmp_path, record):
    member = BrokerProcess(tmp_path / "data", tmp_path / "server.log", _member_args("n1")).start()
    member.stop()
    (tmp_path / "data" / "raft" / "raft" / record).write_bytes(b'{"held": [1], "peers": [1]}')
    said = _refused(member)
    assert f"cannot start from the Raft data in {tmp_path / 'data'}" in said and record in said, said[-2000:]
    assert "repair-member n1" in said and "Traceback" not in said
