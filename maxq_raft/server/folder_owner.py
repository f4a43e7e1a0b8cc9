"""Whose a data folder is: a single node's, or a cluster member's and which one.

A single node keeps its metadata and messages in its store (persistence.py, recovery.py); a
cluster member keeps its state in the Raft groups (raft/) and empties its store at every start
(it holds only what overflowed memory: Broker.open_for_cluster). So a single node's folder
started as a member would lose every message and definition it holds, silently, and a member's
folder started as a single node would serve an empty broker beside the member's data: both are
refused, and the message says what to do (`single_node_data`, `member_data`).

Which member: a member's Raft data (each group's log, term and vote) speaks for that member only. The
folder of n2 started as n3 (a volume mounted on the wrong machine, a folder copied to make a new
member) would make n3 a voter that forgot its own log and its vote and repeats n2's instead: the
others count its acknowledgements and votes as n3's, which can lose a committed entry or elect
two leaders in one term. RabbitMQ too refuses a node whose data belongs to another node name.

The name is recorded in the member's Raft folder (`NAME_FILE`, written whole or not at all) at
its first start as a cluster member, with the folder's incarnation (a random id); a folder of an
earlier release, which has Raft data and no record, takes the name it is started with then.

Which data: an empty folder started under a member's name (a disk replaced, a volume that did
not mount) is a member that forgot its log and its vote, which can elect a leader missing
committed entries. Its peers know it by its incarnation, as Ra knows a server by its uid: one
they did not know, from a member of their groups started as the member it was, is refused
(replication/engine.py, `_check_incarnation`) until its folder is back or it is repaired
(`maxqctl repair-member`, then --repair-from-peers, which starts it as a new member).
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

from ..replication.raft_journal import write_atomic
from . import persistence

__all__ = ["NAME_FILE", "NodeNameError", "check_node_name", "member_data", "single_node_data"]

NAME_FILE = "node_name"
NAME_BYTES_MAX = 255
INCARNATION_BYTES = 8
_INCARNATION = re.compile(r"[0-9a-f]{16}")


class NodeNameError(Exception):
    """The folder was another member's, or its record cannot be read: the message says which."""


def check_node_name(raft_dir: Path, node_id: str, fsync: bool = True) -> str:
    """Record `node_id` as the member of `raft_dir` if none is; raise NodeNameError if another is.
    Returns the folder's incarnation: a random id made with the record, which the member
    announces to its peers (replication/engine.py): a folder made again under the name (the old
    one lost) has another, and peers that knew the old one refuse it."""
    path = raft_dir / NAME_FILE
    try:
        recorded = path.read_bytes()
    except FileNotFoundError:
        return _write(raft_dir, node_id, fsync)
    except OSError as exc:
        raise NodeNameError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        lines = recorded.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        lines = [""]
    name = lines[0]
    if not name or len(recorded) > NAME_BYTES_MAX or len(lines) > 2:
        raise NodeNameError(f"{path} does not hold a node name ({recorded[:40]!r})")
    if name != node_id:
        raise NodeNameError(
            f"this data folder belongs to cluster member {name!r}, not {node_id!r}: a member's Raft data "
            f"(its log, term and vote) is its own. Start {name!r} with it (--node-id {name}), or give "
            f"{node_id!r} its own folder (a new member joins with --join on and maxqctl add-node)"
        )
    incarnation = lines[1] if len(lines) == 2 else ""
    if not incarnation:  # (a record of the name alone: given its incarnation now)
        return _write(raft_dir, node_id, fsync)
    if not _INCARNATION.fullmatch(incarnation):
        raise NodeNameError(f"{path} does not hold an incarnation id ({incarnation[:40]!r})")
    return incarnation


def _write(raft_dir: Path, node_id: str, fsync: bool) -> str:
    incarnation = secrets.token_hex(INCARNATION_BYTES)
    raft_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(raft_dir, NAME_FILE, f"{node_id}\n{incarnation}".encode(), fsync)
    return incarnation


def single_node_data(store: Any) -> str | None:
    """What of a single node's `store` holds (its metadata, its queues' messages), or None when
    no single node ever started on it."""
    if store.get_meta(persistence.SNAPSHOT_KEY) is None and store.get_meta(persistence.LOG_NEXT_KEY) is None:
        return None
    queues = len(list(store.queue_ids()))
    return f"a single node's data (its users, vhosts and durable topology, and the messages of {queues} queues)"


def member_data(raft_dir: Path) -> str | None:
    """Whose Raft data `raft_dir` holds (a cluster member's), or None when it holds none."""
    try:
        name = (raft_dir / NAME_FILE).read_bytes().decode("utf-8", "replace").split("\n")[0]
    except FileNotFoundError:
        name = ""
    except OSError as exc:
        return f"Raft data that cannot be read ({exc.strerror or exc})"
    if name:
        return f"the Raft data of cluster member {name!r}"
    groups = raft_dir / "raft"
    if groups.is_dir() and any(entry.is_dir() for entry in groups.iterdir()):
        return "a cluster member's Raft data"
    return None
