"""A member's shard-group count, kept in its data folder (server/shard_count.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maxq_raft.config import SHARDS_MAX, Settings, SettingsError, load_settings
from maxq_raft.server.main import repair_from_peers
from maxq_raft.server.shard_count import PIN_FILE, ShardCountError, member_shard_count, read_pinned


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
