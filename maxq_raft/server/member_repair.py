"""A cluster member whose data fails its checks, rebuilt from its peers (`--repair-from-peers`).

Theory of operation: in a cluster the healthy members hold everything a damaged one held, so a
member with a damaged journal, term file or snapshot need not be repaired by hand. Raft forbids a
member to come back with less than it had (it may have voted, or counted toward a commit, with
the entries it lost), so the member is first removed from every group and added back under the
same name (`maxqctl repair-member NAME --raft-addr HOST:PORT`, asked of a healthy member, which
refuses when the remaining members could not form a majority without it); then this process,
started with `--repair-from-peers`, checks its folder: if anything fails, `raft/` and `store/`
are moved aside into `damaged-<UTC time>/` (kept for a post-mortem, never deleted) and the node
starts empty as a joining member, installed from a peer's snapshot and log like a new member.
A folder that passes every check is left alone and the node starts as usual.

The checks are the offline ones of each file kind: every journal record's crc and index run
(`journal.verify`, naming the file and offset), the term file's magic and crc, every snapshot
file's crc (`snapshot_file.read_header`), the store's records (`storage.rocks.verify`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..replication import journal, raft_journal, snapshot_file
from ..storage.rocks import interrupted_creation
from ..storage.rocks import verify as verify_store

RAFT_FOLDER = "raft"  # (main.py: the engine's data_dir; it keeps one folder per group under raft/)
STORE_FOLDER = "store"
SNAPSHOT_FOLDER = "snapshot"


def member_problems(data_dir: Path) -> list[str]:
    """What is damaged in a member's data folder (empty: every check passes); changes nothing."""
    problems = raft_problems(data_dir)
    store = data_dir / STORE_FOLDER
    if store.exists() and not interrupted_creation(store):  # (that is no damage: a start creates it)
        problems += [f"{store}: {problem}" for problem in verify_store(store)]
    return problems


def raft_problems(data_dir: Path) -> list[str]:
    """What is damaged in a member's Raft data: journals, term files, snapshot files."""
    problems: list[str] = []
    raft_root = data_dir / RAFT_FOLDER / RAFT_FOLDER
    groups = sorted(p for p in raft_root.iterdir() if p.is_dir()) if raft_root.is_dir() else []
    for folder in groups:
        problems += journal.verify(folder)
        try:
            raft_journal.read_term_file(folder)
        except journal.JournalCorruption as exc:
            problems.append(str(exc))
        for path in sorted((folder / SNAPSHOT_FOLDER).glob("*.snap")):
            try:
                snapshot_file.read_header(path)
            except snapshot_file.SnapshotError as exc:
                problems.append(str(exc))
    return problems


def move_aside(data_dir: Path, now_s: float | None = None) -> Path:
    """Move the member's Raft data and store into `damaged-<UTC time>/` in the same folder (a
    rename: nothing is copied or deleted) and return that folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now_s is None else now_s))
    target = data_dir / f"damaged-{stamp}"
    for attempt in range(1, 100):  # bounded: two repairs within a second get distinct folders
        if not target.exists():
            break
        target = data_dir / f"damaged-{stamp}-{attempt}"
    target.mkdir()
    for name in (RAFT_FOLDER, STORE_FOLDER):
        if (data_dir / name).exists():
            os.rename(data_dir / name, target / name)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames are durable before the node starts writing anew
    finally:
        os.close(fd)
    return target
