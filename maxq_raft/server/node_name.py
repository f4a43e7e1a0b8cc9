"""Which member a cluster data folder belongs to: the --node-id it was first started with.

Why: a member's Raft data (each group's log, term and vote) speaks for that member only. The
folder of n2 started as n3 (a volume mounted on the wrong machine, a folder copied to make a new
member) would make n3 a voter that forgot its own log and its vote and repeats n2's instead: the
others count its acknowledgements and votes as n3's, which can lose a committed entry or elect
two leaders in one term. RabbitMQ too refuses a node whose data belongs to another node name.

The name is recorded in the member's Raft folder (`NAME_FILE`, written whole or not at all) at
its first start as a cluster member; a folder of an earlier release, which has Raft data and no
record, takes the name it is started with then.
"""

from __future__ import annotations

from pathlib import Path

from ..replication.raft_journal import write_atomic

__all__ = ["NAME_FILE", "NodeNameError", "check_node_name"]

NAME_FILE = "node_name"
NAME_BYTES_MAX = 255


class NodeNameError(Exception):
    """The folder was another member's, or its record cannot be read: the message says which."""


def check_node_name(raft_dir: Path, node_id: str, fsync: bool = True) -> None:
    """Record `node_id` as the member of `raft_dir` if none is; raise NodeNameError if another is."""
    path = raft_dir / NAME_FILE
    try:
        recorded = path.read_bytes()
    except FileNotFoundError:
        raft_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(raft_dir, NAME_FILE, node_id.encode("utf-8"), fsync)
        return
    except OSError as exc:
        raise NodeNameError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        name = recorded.decode("utf-8")
    except UnicodeDecodeError:
        name = ""
    if not name or len(recorded) > NAME_BYTES_MAX:
        raise NodeNameError(f"{path} does not hold a node name ({recorded[:40]!r})")
    if name != node_id:
        raise NodeNameError(
            f"this data folder belongs to cluster member {name!r}, not {node_id!r}: a member's Raft data "
            f"(its log, term and vote) is its own. Start {name!r} with it (--node-id {name}), or give "
            f"{node_id!r} its own folder (a new member joins with --join on and maxqctl add-node)"
        )
