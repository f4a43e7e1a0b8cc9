"""A member's shard-group count, kept in its data folder (server/shard_count.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maxq_raft.config import SHARDS_MAX, Settings, SettingsError, load_settings
from maxq_raft.server.main import first_start_shards, repair_from_peers
from maxq_raft.server.shard_count import (
    PIN_FILE,
    PROVISIONAL_FILE,
    ProvisionalCount,
    ShardCountError,
    count_of,
    is_provisional,
    member_shard_count,
    read_pinned,
)


def test_the_first_start_keeps_its_count_and_later_starts_take_it(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    assert read_pinned(raft) is None
    assert member_shard_count(raft, 0, 4) == 4  # no --shards: the default, two per core
    assert (raft / PIN_FILE).read_text() == "4\n"
    assert member_shard_count(raft, 0, 16) == 4  # the machine has more cores now: still 4
    assert member_shard_count(raft, 4, 16) == 4  # the same --shards is fine


def test_another_explicit_count_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    member_shard_count(raft, 2, 4)
    with pytest.raises(ShardCountError, match="runs 2 shard groups and --shards says 3.*--shards 2"):
        member_shard_count(raft, 3, 4)
    assert (raft / PIN_FILE).read_text() == "2\n"


def test_an_earlier_releases_folder_is_read_from_its_groups(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    for name in ("meta", "shard-0", "shard-1", "shard-2"):
        (raft / "raft" / name).mkdir(parents=True)
    (raft / "raft" / "shard-notes").mkdir()  # (not a group folder)
    assert read_pinned(raft) == 3
    with pytest.raises(ShardCountError, match="runs 3 shard groups"):
        member_shard_count(raft, 4, 4)
    assert member_shard_count(raft, 0, 4) == 3
    assert (raft / PIN_FILE).read_text() == "3\n"


@pytest.mark.parametrize("text", ["", "four", "0", "-1", str(SHARDS_MAX + 1), "2\n2"])
def test_a_damaged_record_is_refused_by_name(tmp_path: Path, text: str) -> None:
    raft = tmp_path / "raft"
    raft.mkdir()
    (raft / PIN_FILE).write_text(text)
    with pytest.raises(ShardCountError, match=PIN_FILE):
        member_shard_count(raft, 0, 4)


def test_shards_beyond_the_bound_are_a_settings_error() -> None:
    with pytest.raises(SettingsError, match=f"shards must be at most {SHARDS_MAX}"):
        load_settings(["--shards", str(SHARDS_MAX + 1)], environ={})


def test_the_default_count_is_two_per_core_and_with_placed_groups_two_per_member(monkeypatch) -> None:
    """7 members of 2 cores with groups on 3 of them: 14 groups, not 4 (each member leads about
    two; with 4, three members led none and a queue they declared went through another member)."""
    monkeypatch.setattr("maxq_raft.server.cluster.os.cpu_count", lambda: 2)
    peers = [arg for i in range(2, 8) for arg in ("--peer", f"n{i}@127.0.0.1:{7100 + i}")]
    base = ["--node-id", "n1", "--raft-addr", "127.0.0.1:7101", "--cluster-secret", "s", *peers]

    def count(*args: str) -> int:
        settings, _ = load_settings([*base, *args], environ={})
        return first_start_shards(settings)

    assert count() == 14  # the default factor, 3
    assert count("--replication-factor", "0") == 4  # every member holds every group: two per core
    assert count("--join", "on") == 12  # a joiner counts the 6 members it is told of
    settings, _ = load_settings(["--node-id", "n1"], environ={})
    assert first_start_shards(settings) == 4  # a single node
    monkeypatch.setattr("maxq_raft.server.cluster.os.cpu_count", lambda: 16)
    assert count() == 32  # more cores than members: two per core, as before


def test_a_member_repaired_from_its_peers_keeps_its_count(tmp_path: Path) -> None:
    data = tmp_path / "n3"
    raft = data / "raft"
    member_shard_count(raft, 2, 4)
    (raft / "raft" / "shard-0").mkdir(parents=True)
    (raft / "raft" / "shard-0" / "raft_term").write_bytes(b"bad")  # a damaged term file
    settings = Settings(data_dir=str(data), node_id="n3")
    settings = repair_from_peers(settings)
    assert settings.join == "on" and not (raft / PIN_FILE).exists()  # moved aside with the damage
    assert list(data.glob("damaged-*/raft/raft/shard-0/raft_term"))
    assert member_shard_count(raft, settings.shards, 16) == 2


class Restarts:
    def __init__(self) -> None:
        self.again: list[str] = []
        self.failed: list[str] = []

    def start_again(self, reason: str) -> None:
        self.again.append(reason)

    def fail(self, reason: str) -> None:
        self.failed.append(reason)


def groups(count: int) -> list[str]:
    return ["meta", *(f"shard-{i}" for i in range(count))]


def test_a_joining_members_default_is_provisional_and_an_explicit_count_is_not(tmp_path: Path) -> None:
    assert member_shard_count(tmp_path / "a", 0, 4, joining=True) == 4 and is_provisional(tmp_path / "a")
    assert member_shard_count(tmp_path / "a", 0, 16, joining=True) == 4  # a restart keeps it, still provisional
    assert is_provisional(tmp_path / "a")
    assert member_shard_count(tmp_path / "b", 3, 4, joining=True) == 3 and not is_provisional(tmp_path / "b")
    assert member_shard_count(tmp_path / "c", 0, 4) == 4 and not is_provisional(tmp_path / "c")  # founding member
    # Never joined: a later explicit --shards replaces the default instead of being refused.
    assert member_shard_count(tmp_path / "a", 2, 4, joining=True) == 2
    assert (tmp_path / "a" / PIN_FILE).read_text() == "2\n" and not is_provisional(tmp_path / "a")


@pytest.mark.parametrize(
    "names, count",
    [
        (groups(1), 1),
        (groups(6), 6),
        (list(reversed(groups(3))), 3),
        (["meta"], None),  # no shard group
        (["shard-0", "shard-1"], None),  # no metadata group
        (["meta", "shard-0", "shard-2"], None),  # a gap
        (["meta", "shard-0", "shard-0"], None),
        (["meta", "shard-0", "shard-01"], None),
        (["meta", "shard-0", "queues"], None),
        (groups(SHARDS_MAX + 1), None),
    ],
)
def test_the_count_a_peers_group_list_stands_for(names: list[str], count: int | None) -> None:
    assert count_of(names, "meta") == count


def test_the_first_peers_list_settles_a_provisional_count(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    member_shard_count(raft, 0, 4, joining=True)
    restarts = Restarts()
    provisional = ProvisionalCount(raft, 4, "meta", restarts)
    assert not provisional.on_peer_groups("n1", ["meta", "shard-0", "shard-9"])  # not a count: ignored
    assert is_provisional(raft) and not restarts.again
    assert provisional.on_peer_groups("n1", groups(2))
    assert (raft / PIN_FILE).read_text() == "2\n" and not is_provisional(raft)
    assert restarts.again == [
        "it joined with this machine's default of 4 shard groups and n1 runs 2: it takes the cluster's 2"
    ]
    assert not provisional.on_peer_groups(
        "n2", groups(5)
    )  # settled: later lists change nothing here (the engine checks them)
    assert (raft / PIN_FILE).read_text() == "2\n" and len(restarts.again) == 1
    assert member_shard_count(raft, 0, 4, joining=True) == 2  # the next life runs the cluster's count


def test_the_same_list_makes_the_default_final_without_a_restart(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    member_shard_count(raft, 0, 4, joining=True)
    restarts = Restarts()
    assert not ProvisionalCount(raft, 4, "meta", restarts).on_peer_groups("n1", groups(4))
    assert not is_provisional(raft) and not restarts.again and not restarts.failed
    with pytest.raises(ShardCountError, match="runs 4 shard groups and --shards says 2"):
        member_shard_count(raft, 2, 4, joining=True)  # final now: another count is refused as for any member


def test_a_count_that_cannot_be_written_stops_the_member_until_there_is_room(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    member_shard_count(raft, 0, 4, joining=True)
    (raft / (PIN_FILE + ".tmp")).mkdir()  # the atomic write's temporary file cannot be made
    restarts = Restarts()
    assert not ProvisionalCount(raft, 4, "meta", restarts).on_peer_groups("n1", groups(2))
    assert restarts.failed and "cannot record the cluster's 2 shard groups" in restarts.failed[0]
    assert not restarts.again and (raft / PIN_FILE).read_text() == "4\n" and (raft / PROVISIONAL_FILE).exists()
