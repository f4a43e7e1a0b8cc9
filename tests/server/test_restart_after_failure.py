"""A cluster member after a storage failure (server/main.py): the test write it takes before it
starts again (a disk with room but a failing fsync is not a healed one), and which start
failures send it back to waiting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from maxq_raft.config import Settings
from maxq_raft.server import main
from maxq_raft.server.main import WRITE_PROBE_NAME, write_probe_error

from ..helpers import build_fsync_shim


def test_a_working_folder_passes_and_keeps_no_probe_file(tmp_path: Path) -> None:
    assert write_probe_error(str(tmp_path)) is None
    assert not (tmp_path / WRITE_PROBE_NAME).exists()


def test_a_missing_folder_is_an_error_not_an_exception(tmp_path: Path) -> None:
    error = write_probe_error(str(tmp_path / "gone"))
    assert error is not None and "No such file" in error


def test_a_disk_whose_fsync_fails_is_an_error(tmp_path: Path) -> None:
    shim = build_fsync_shim(tmp_path)
    trigger = tmp_path / "fail-fsync-now"
    trigger.touch()
    env = dict(os.environ, LD_PRELOAD=str(shim), MAXQ_FAIL_FSYNC_FILE=str(trigger))
    code = "import sys; from maxq_raft.server.main import write_probe_error; print(write_probe_error(sys.argv[1]))"
    folder = tmp_path / "data"
    folder.mkdir()
    answer = subprocess.run(
        [sys.executable, "-c", code, str(folder)], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert answer.stdout.strip() == "Input/output error", answer
    assert not (folder / WRITE_PROBE_NAME).exists()


@pytest.fixture
def waits(monkeypatch) -> list[tuple[str, int]]:
    """restart_when_room's calls (it would wait and re-execute the test process)."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(main, "restart_when_room", lambda settings, why, tries: calls.append((why, tries)) or 0)
    monkeypatch.delenv(main.RESTARTED_ENV, raising=False)
    monkeypatch.delenv(main.FAILED_STARTS_ENV, raising=False)
    return calls


MEMBER = Settings(node_id="n3", raft_addr="127.0.0.1:7103")


def test_a_member_restarted_after_a_failure_whose_disk_fails_again_waits(monkeypatch, waits) -> None:
    monkeypatch.setenv(main.RESTARTED_ENV, "1")
    assert main.start_failed(MEMBER, "cannot open the message store: EIO", 3, disk=True) == 0
    monkeypatch.setenv(main.FAILED_STARTS_ENV, "4")
    assert main.start_failed(MEMBER, "cannot open the Raft data: EIO", 1, disk=True) == 0
    assert [tries for _, tries in waits] == [1, 5]


def test_after_the_last_try_it_exits_with_the_starts_code(monkeypatch, waits) -> None:
    monkeypatch.setenv(main.RESTARTED_ENV, "1")
    monkeypatch.setenv(main.FAILED_STARTS_ENV, str(main.FAILED_STARTS_MAX))
    assert main.start_failed(MEMBER, "cannot open the message store: EIO", 3, disk=True) == 3
    assert waits == []


def test_what_is_not_the_disk_or_not_after_a_failure_exits_at_once(monkeypatch, waits) -> None:
    assert main.start_failed(MEMBER, "cannot open the message store: EIO", 3, disk=True) == 3  # by hand
    monkeypatch.setenv(main.RESTARTED_ENV, "1")
    assert main.start_failed(MEMBER, "store is damaged", 3, disk=False) == 3
    assert main.start_failed(MEMBER, "this member stopped: halted", 1, disk=False) == 1
    single = Settings(node_id="n1")
    assert not single.clustered
    assert main.start_failed(single, "cannot open the message store: EIO", 3, disk=True) == 3
    assert waits == []


def test_a_store_whose_creation_did_not_finish_is_no_damage_to_check_or_repair(tmp_path: Path) -> None:
    from maxq_raft.server.member_repair import member_problems

    store = tmp_path / "data" / "store"
    store.mkdir(parents=True)
    for name in ("LOCK", "LOG", "rocksdict-config.json"):  # what a creation on a failing disk left
        (store / name).write_bytes(b"")
    assert member_problems(tmp_path / "data") == []
    checked = subprocess.run(
        [sys.executable, "-m", "maxq_raft", "--check", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked
    assert "no message store here (a creation that did not finish" in checked.stdout, checked
    assert sorted(os.listdir(store)) == ["LOCK", "LOG", "rocksdict-config.json"]  # --check changes nothing
