"""A member started on another member's data folder is refused before it speaks Raft: its log,
term and vote are the other's (server/folder_owner.py)."""

from __future__ import annotations

import pytest

from tests.helpers import publish_confirmed

from .conftest import Cluster

pytestmark = pytest.mark.timeout(180)


def test_a_member_started_on_another_members_folder_is_refused_and_the_cluster_goes_on(tmp_path):
    cluster = Cluster(tmp_path).start()
    try:
        publish_confirmed(cluster["n1"], "kept", b"before")
        n2 = cluster["n2"]
        n2.stop()
        own_args = n2.extra_args
        n2.extra_args = [*own_args, "--node-id", "n3"]  # (the last --node-id counts)
        n2.launch()
        assert n2.proc.wait(60) != 0
        refused = n2.log_text()
        assert "this data folder belongs to cluster member 'n2', not 'n3'" in refused, refused[-2000:]
        assert "maxq-server ready" not in refused.split("received SIGTERM")[-1]
        n2.extra_args = own_args
        n2.launch()
        n2.wait_ready(60)
        with n2.connect() as connection:
            method, _props, body = connection.channel().basic_get("kept", auto_ack=True)
        assert method is not None and body == b"before"
    finally:
        cluster.stop()
