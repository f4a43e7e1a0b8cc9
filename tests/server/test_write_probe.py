"""The test write a failed member takes before it starts again (server/main.py): a disk with
room but a failing fsync must not be taken for a healed one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
