"""Helpers the tests share: bounded waits, small filesystems.

Every wait here is bounded in time and in turns; a predicate is polled, never a sleep of a
guessed length.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path


def wait_until(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.05) -> bool:
    """Poll `predicate` until it is true (returns True) or `timeout_s` passes (returns False)."""
    deadline = time.monotonic() + timeout_s
    while True:  # bounded by the deadline
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)


@contextlib.contextmanager
def small_filesystem(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's size=, e.g. "48m") at `mount_point`, unmounted after (the
    caller stops what uses it first). Needs root; the caller skips otherwise (`can_mount`)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        for _ in range(50):  # bounded: a process still stopping may hold it for a moment
            if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode == 0:
                break
            if subprocess.run(["mountpoint", "-q", str(mount_point)]).returncode != 0:
                break
            time.sleep(0.1)


def grow_filesystem(mount_point: Path, size: str = "1g") -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


FAULTS = Path(__file__).resolve().parent / "faults"


def build_fsync_shim(folder: Path) -> Path:
    """Build tests/faults/fsync_fail.c (an LD_PRELOAD shim: fsync and fdatasync fail with EIO
    while the file named by MAXQ_FAIL_FSYNC_FILE exists); skips the test without a C compiler."""
    import pytest

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("building the fsync fault shim needs a C compiler")
    out = folder / "fsync_fail.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(FAULTS / "fsync_fail.c"), "-ldl"],
                   check=True, capture_output=True)
    return out
