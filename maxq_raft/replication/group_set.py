"""Which of the cluster's Raft groups this member holds, and each one's first members, on disk.

Theory of operation: by default every member holds every group, each first started with the
member and its peers (`ReplicationNode(peers=...)`), and no `held_groups.json` is written. A
member that holds only some groups (issue #19: groups placed on a few members) records which.
Both layouts record each group's first members. Under `<data dir>/raft/`, each record written
whole or not at all (`write_atomic`, fsynced):

- `held_groups.json`: `{"held": [group, ...]}`, the groups this member holds. Written at the
  first start from what the engine was given, and again whenever the member joins a group (a
  move onto it) or leaves one (removed from it). A later start takes it over what it is given:
  a member that gained or lost a group since keeps that. A folder that a member started in
  the layout of every group (no record: `holds_every_group`) stays so whatever a later start
  is given: that member is a voting member of every group.
- `<group>/first_members.json`: `{"members": {node: [host, port], ...}}`, the members the group
  had when this member started it (for a group it joined, the members before it was added).
  pysyncobj starts a group from such a list and replays its log's membership changes on top
  (and a snapshot's header replaces the list: group.py, `_adopt`), so a restart must start from
  the same list as the first start, whatever the member's own peer list says then. Written for
  every group a member starts in a new folder (since 2026-12-07 in the layout of every group
  too: a member restarted there without its --peer list started each group alone over the
  cluster's log and confirmed what no other member saw); a folder of an earlier release without
  it starts from the member's peers, as it did.

- `peer_incarnations.json`: `{"peers": {node: incarnation}}`, the data folder each peer announced
  (server/folder_owner.py): a peer that is a member of a group held here and announces another
  lost its data and is refused (engine.py, `_check_incarnation`).

- `placement_pending`: present while this member waits for the metadata group's first placement
  (a cluster's first start with --replication-factor: it starts holding the metadata group only,
  server/first_placement.py); removed once it started the groups that placement gives it, in
  the same step that records them as held.

A group absent from `held_groups.json` has no folder worth keeping: the engine deletes the folder
of a group it left once the removal is committed (engine.py, `_leave_group`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .raft_journal import write_atomic

HELD_FILE = "held_groups.json"
INCARNATIONS_FILE = "peer_incarnations.json"
PENDING_MARKER = "placement_pending"
FIRST_MEMBERS_FILE = "first_members.json"

Members = dict[str, tuple[str, int]]


class GroupSetError(ValueError):
    """A record here cannot be read: the member does not start rather than guess its groups."""


def _read_field(path: Path, key: str) -> tuple[bool, object]:
    """(False, None) when `path` does not exist, else (True, its JSON object's `key`)."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return False, None
    except (OSError, ValueError) as exc:
        raise GroupSetError(f"{path}: {exc}") from exc
    return True, data.get(key) if type(data) is dict else None


def read_held(raft_dir: Path) -> list[str] | None:
    """The groups recorded as held, or None when no record was ever written (every group)."""
    path = raft_dir / HELD_FILE
    found, held = _read_field(path, "held")
    if not found:
        return None
    if type(held) is not list or not all(type(name) is str for name in held):
        raise GroupSetError(f"{path}: expected {{'held': [group names]}}")
    return list(held)


def holds_every_group(raft_dir: Path, groups: list[str]) -> bool:
    """Whether a member started here before in the layout of every group: a folder of one of
    `groups` is there and no record was ever written."""
    return read_held(raft_dir) is None and any((raft_dir / group).is_dir() for group in groups)


def write_held(raft_dir: Path, held: list[str], fsync: bool) -> None:
    raft_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(raft_dir, HELD_FILE, json.dumps({"held": sorted(held)}).encode(), fsync)


def read_first_members(group_dir: Path) -> Members | None:
    path = group_dir / FIRST_MEMBERS_FILE
    found, members = _read_field(path, "members")
    if not found:
        return None
    if type(members) is not dict:
        raise GroupSetError(f"{path}: expected {{'members': {{node: [host, port]}}}}")
    out: Members = {}
    for node, addr in members.items():
        if type(addr) is not list or len(addr) != 2 or type(addr[0]) is not str or type(addr[1]) is not int:
            raise GroupSetError(f"{path}: bad address {addr!r} for {node!r}")
        out[node] = (addr[0], addr[1])
    return out


def write_first_members(group_dir: Path, members: Members, fsync: bool) -> None:
    group_dir.mkdir(parents=True, exist_ok=True)
    body = {"members": {node: [host, port] for node, (host, port) in sorted(members.items())}}
    write_atomic(group_dir, FIRST_MEMBERS_FILE, json.dumps(body).encode(), fsync)


def placement_pending(raft_dir: Path) -> bool:
    """Whether this member still waits for the first placement (`PENDING_MARKER`)."""
    return (raft_dir / PENDING_MARKER).exists()


def mark_placement_pending(raft_dir: Path, fsync: bool) -> None:
    raft_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(raft_dir, PENDING_MARKER, b"", fsync)


def clear_placement_pending(raft_dir: Path) -> None:
    """After the groups it gave are recorded held: a crash before this starts them again from
    their records, and the metadata group's record is taken again (groups held are skipped)."""
    (raft_dir / PENDING_MARKER).unlink(missing_ok=True)


def read_incarnations(raft_dir: Path) -> dict[str, str]:
    """The incarnation each peer announced (engine.py, `_check_incarnation`); {} when none was
    recorded."""
    path = raft_dir / INCARNATIONS_FILE
    found, known = _read_field(path, "peers")
    if not found:
        return {}
    if type(known) is not dict or not all(type(k) is str and type(v) is str for k, v in known.items()):
        raise GroupSetError(f"{path}: expected {{'peers': {{node: incarnation}}}}")
    return dict(known)


def write_incarnations(raft_dir: Path, known: dict[str, str], fsync: bool) -> None:
    raft_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(raft_dir, INCARNATIONS_FILE, json.dumps({"peers": dict(sorted(known.items()))}).encode(), fsync)
