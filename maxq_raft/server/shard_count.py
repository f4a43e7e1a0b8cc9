"""How many shard groups a cluster member runs: chosen at its first start, then kept in its data
folder for good.

Every member must run the same groups, because each queue lives in the group its name hashes to
by their number (cluster.py, `shard_of`). The count comes from --shards, whose default is two per
core; left to itself a member would change its groups when its machine does (a resized VM), or
when an operator drops or changes the option, and its queues would then hash elsewhere than on
the others. So the first start writes the count to `<data dir>/raft/shard_groups`, and every
later start uses it: an explicit --shards that differs is refused (the member does not start);
no --shards takes it. A folder of an earlier release, which has no such file, is read from the
groups it holds (raft/raft/shard-N). The file lives under raft/; a member repaired from its peers
(--repair-from-peers moves raft/ aside) takes the count it had into its new raft/. A new member
takes --shards or the default like any first start: if that is not the others' count, the
replication engine cuts it off from every group and says why (replication/engine.py, group lists).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..config import SHARDS_MAX
from ..replication.raft_journal import write_atomic

PIN_FILE = "shard_groups"
_GROUP_FOLDER = re.compile(r"shard-(\d+)")


class ShardCountError(Exception):
    """The data folder's count and --shards disagree, or the folder's record is unreadable."""


def _held_groups(raft_dir: Path) -> int | None:
    """The count an earlier release's folder holds: one more than its highest shard-N group."""
    groups_dir = raft_dir / "raft"
    try:
        names = [entry.name for entry in groups_dir.iterdir() if entry.is_dir()]
    except FileNotFoundError:
        return None
    numbers = [int(m.group(1)) for name in names if (m := _GROUP_FOLDER.fullmatch(name))]
    return max(numbers) + 1 if numbers else None


def read_pinned(raft_dir: Path) -> int | None:
    """The count this member's data holds, or None for a member that never started."""
    path = raft_dir / PIN_FILE
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return _held_groups(raft_dir)
    except (OSError, UnicodeDecodeError) as exc:
        raise ShardCountError(f"cannot read {path}: {exc}") from None
    if not text.isdigit() or not 1 <= int(text) <= SHARDS_MAX:
        raise ShardCountError(f"{path} holds {text[:40]!r}, not a shard group count (1-{SHARDS_MAX})")
    return int(text)


def _write_pinned(raft_dir: Path, count: int) -> None:
    raft_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(raft_dir, PIN_FILE, f"{count}\n".encode("ascii"), fsync=True)


def member_shard_count(raft_dir: Path, requested: int, default: int) -> int:
    """The count to run: the one the data folder holds, else `requested` (--shards; 0 when not
    given) or `default`, written to the folder before any group starts."""
    pinned = read_pinned(raft_dir)
    if pinned is not None:
        if requested and requested != pinned:
            raise ShardCountError(
                f"this member's data in {raft_dir.parent} runs {pinned} shard groups and --shards says "
                f"{requested}: the count is fixed when a member first starts (every member must run the "
                f"same groups). Start it with --shards {pinned} or without --shards"
            )
        if not (raft_dir / PIN_FILE).exists():
            _write_pinned(raft_dir, pinned)  # (an earlier release's folder: its groups tell)
        return pinned
    count = requested or default
    _write_pinned(raft_dir, count)
    return count
