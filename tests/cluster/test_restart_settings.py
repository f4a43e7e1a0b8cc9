"""A member restarted with other cluster settings than its data was made with keeps to its data.

- --replication-factor places a cluster's groups at its first start only: a member whose data
  holds every group (a cluster started with factor 0, or before the default was 3) keeps its replicas and its logs when
  restarted with one, rather than start over from the metadata group's record with its shard
  groups' folders deleted (a voter that forgot its log and its vote).
- Each group starts from the members recorded at its first start, whatever --peer says then: a
  member restarted without its --peer list started every group alone over the cluster's logs and
  confirmed publishes no other member saw (a split brain)."""

from __future__ import annotations

from pathlib import Path

import pika
import pytest

from tests.helpers import publish_confirmed

from .conftest import Cluster
from .test_held_groups import held_by

pytestmark = pytest.mark.timeout(240)

SHARD_GROUPS = ["shard-0", "shard-1"]


def _identity(path: Path) -> tuple[int, int]:
    status = path.stat()
    return status.st_ino, status.st_mtime_ns


def test_a_member_of_an_every_member_cluster_restarted_with_a_factor_keeps_its_groups(tmp_path):
    cluster = Cluster(tmp_path, size=4, extra=["--replication-factor", "0"]).start()
    try:
        with cluster["n1"].connect() as connection:
            channel = connection.channel()
            channel.confirm_delivery()
            for i in range(2):
                name = f"kept-{i}"
                channel.queue_declare(name, durable=True)
                channel.basic_publish("", name, b"before", pika.BasicProperties(delivery_mode=2), mandatory=True)
        n4 = cluster["n4"]
        assert sorted(held_by(n4)) == ["meta", *SHARD_GROUPS]
        raft_dir = n4.data_dir / "raft" / "raft"
        journals = {group: _identity(raft_dir / group / "journal.meta") for group in SHARD_GROUPS}
        n4.stop()
        n4.extra_args = [*n4.extra_args, "--replication-factor", "3"]
        n4.launch()
        n4.wait_ready(60)
        said = n4.log_text()
        assert "--replication-factor 3 is not applied" in said, said[-3000:]
        assert sorted(held_by(n4)) == ["meta", *SHARD_GROUPS]
        assert not (raft_dir / "held_groups.json").exists()  # (the layout of every group, as before)
        # The same journals: not folders deleted and groups started over as at a first start.
        assert {group: _identity(raft_dir / group / "journal.meta") for group in SHARD_GROUPS} == journals
        with n4.connect() as connection:
            channel = connection.channel()
            for i in range(2):
                method, _props, body = channel.basic_get(f"kept-{i}", auto_ack=True)
                assert method is not None and body == b"before"
    finally:
        cluster.stop()


def _without_peers(args: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--peer":
            skip = True
        else:
            kept.append(arg)
    return kept


@pytest.mark.parametrize("layout", [[], ["--replication-factor", "0"]], ids=["placed", "every-group"])
def test_a_member_restarted_without_its_peer_list_rejoins_its_groups_instead_of_leading_alone(tmp_path, layout):
    cluster = Cluster(tmp_path, extra=layout).start()
    try:
        n1 = cluster["n1"]
        n1.stop()
        n1.extra_args = _without_peers(n1.extra_args)
        assert "--peer" not in n1.extra_args
        n1.launch()
        n1.wait_ready(60)
        publish_confirmed(n1, "through-n1", b"m")
        # Confirmed by the cluster's majority, not by n1 alone: the others have it.
        for name in ("n2", "n3"):
            with cluster[name].connect() as connection:
                channel = connection.channel()
                channel.queue_declare("through-n1", passive=True)
        with cluster["n2"].connect() as connection:
            method, _props, body = connection.channel().basic_get("through-n1", auto_ack=True)
        assert method is not None and body == b"m"
        status = n1.admin("/api/cluster/status")
        assert {m["node"] for g in status["groups"] for m in g["members"]} == {"n1", "n2", "n3"}
    finally:
        cluster.stop()
