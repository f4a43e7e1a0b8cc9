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
given --shards takes it like any first start: if that is not the others' count, the replication
engine cuts it off from every group and says why (replication/engine.py, group lists).

A new member started with --join and no --shards does not know the cluster's count, and the
default (two per core) is the others' only when its machine is like theirs. So its count is
provisional (a second file, `shard_groups.default`, says so) until a peer announces its group
list, which happens once the member is added (maxqctl add-node): the same list makes the count
final; another list of shard groups replaces it, and the member starts again with the cluster's
groups (server/main.py). The groups its first life started and the cluster does not run stay
empty in its folder: no peer ever wrote to them.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Protocol

from ..config import SHARDS_MAX
from ..replication.raft_journal import write_atomic

log = logging.getLogger("maxq.server")

PIN_FILE = "shard_groups"
PROVISIONAL_FILE = "shard_groups.default"  # present while the count is only this member's default
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


def member_shard_count(raft_dir: Path, requested: int, default: int, joining: bool = False) -> int:
    """The count to run: the one the data folder holds, else `requested` (--shards; 0 when not
    given) or `default`, written to the folder before any group starts; a `joining` member's
    default is provisional (`settle_count`)."""
    pinned = read_pinned(raft_dir)
    if pinned is not None and requested and is_provisional(raft_dir):
        _write_pinned(raft_dir, requested)  # never joined: an explicit --shards is the operator's choice
        (raft_dir / PROVISIONAL_FILE).unlink(missing_ok=True)
        return requested
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
    if joining and not requested:
        # (the mark first: a crash between the two writes leaves no count, chosen again next start)
        raft_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(raft_dir, PROVISIONAL_FILE, b"", fsync=True)
    _write_pinned(raft_dir, count)
    return count


def is_provisional(raft_dir: Path) -> bool:
    """Whether this member's count is still its own default, waiting for a peer's list."""
    return (raft_dir / PROVISIONAL_FILE).exists()


def count_of(groups: list[str], meta_group: str) -> int | None:
    """The shard count a group list stands for (the metadata group and shard-0 .. shard-N-1), or
    None for a list that is not one."""
    numbers = sorted(int(m.group(1)) for name in groups if (m := _GROUP_FOLDER.fullmatch(name)))
    count = len(numbers)
    if numbers != list(range(count)) or set(groups) != {meta_group, *(f"shard-{i}" for i in range(count))}:
        return None
    return count if 1 <= count <= SHARDS_MAX else None


def settle_count(raft_dir: Path, own: int, peer_count: int) -> bool:
    """A peer runs `peer_count` shard groups and this member's count (`own`) is provisional:
    make it final, the peer's. True when that differs from `own` (the member must start again)."""
    if peer_count != own:
        _write_pinned(raft_dir, peer_count)
    # (not made durable: a mark that comes back after a crash only lets the same list settle again)
    (raft_dir / PROVISIONAL_FILE).unlink(missing_ok=True)
    return peer_count != own


class _Restarter(Protocol):  # (main.py's StopRequest)
    def start_again(self, reason: str) -> None: ...

    def fail(self, reason: str) -> None: ...


class ProvisionalCount:
    """A joining member's default count, until the first peer's group list settles it: the
    engine's `on_peer_groups` (its hub thread, so each call comes after the one before)."""

    def __init__(self, raft_dir: Path, own: int, meta_group: str, restarter: _Restarter) -> None:
        self.raft_dir = raft_dir
        self.own = own
        self.meta_group = meta_group
        self.restarter = restarter
        self.settled = False

    def on_peer_groups(self, peer: str, groups: list[str]) -> bool:
        """True when this member starts again with `groups`' count."""
        if self.settled:
            return False
        count = count_of(groups, self.meta_group)
        if count is None:
            log.warning("%s announced groups that are no shard count (%s): this member's count stays", peer, groups[:8])
            return False
        self.settled = True
        try:
            changed = settle_count(self.raft_dir, self.own, count)
        except OSError as exc:  # (a full disk: the pin is written atomically, so the old one stands)
            self.restarter.fail(f"cannot record the cluster's {count} shard groups: {exc}")
            return False
        if changed:
            self.restarter.start_again(
                f"it joined with this machine's default of {self.own} shard groups and {peer} runs {count}: "
                f"it takes the cluster's {count}"
            )
        else:
            log.info("%s runs the same %d shard groups: this member's count is kept", peer, count)
        return changed
