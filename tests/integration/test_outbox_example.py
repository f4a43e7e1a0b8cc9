"""docs/examples/outbox_service.py against the broker: a service killed between its database
commit and its commit publish still has its event delivered, once, thanks to the check-back;
killed before its database commit, the event is never delivered; without a crash, no check."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ..helpers import drain, message_count

pytestmark = pytest.mark.timeout(90)

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "outbox_service.py"


def service(env, db: Path, prefix: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--port",
            str(env.port),
            "--db",
            str(db),
            "--prefix",
            prefix,
            "--timeout-ms",
            "300",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def outbox(env, tmp_path):
    prefix = f"ob{uuid.uuid4().hex[:6]}-"
    env.queues += [f"{prefix}orders.events", f"{prefix}orders.checks"]
    return prefix, tmp_path / "orders.sqlite"


def test_a_crash_after_the_database_commit_is_delivered_once_by_check_back(env, outbox):
    prefix, db = outbox
    crashed = service(env, db, prefix, "place", "17", "--crash", "after-db-commit")
    assert crashed.returncode == 17, crashed.stderr
    channel = env.channel()
    assert message_count(channel, f"{prefix}orders.events") == 0  # undecided: not delivered
    answered = service(env, db, prefix, "answer-checks", "--for-s", "2")
    assert answered.returncode == 0 and "answered" in answered.stdout, answered.stderr
    assert drain(channel, f"{prefix}orders.events") == [b'{"order": 17, "total": 100}']
    time.sleep(1.0)  # later checks (if any were still queued) change nothing: still once
    service(env, db, prefix, "answer-checks", "--for-s", "1")
    assert drain(channel, f"{prefix}orders.events") == []


def test_a_crash_before_the_database_commit_is_never_delivered(env, outbox):
    prefix, db = outbox
    assert service(env, db, prefix, "place", "18", "--crash", "after-half").returncode == 17
    answered = service(env, db, prefix, "answer-checks", "--for-s", "2")
    assert answered.returncode == 0 and "answered 0 checks" not in answered.stdout, answered.stdout + answered.stderr
    channel = env.channel()
    assert drain(channel, f"{prefix}orders.events") == []


def test_without_a_crash_the_event_is_delivered_and_nobody_is_asked(env, outbox):
    prefix, db = outbox
    placed = service(env, db, prefix, "place", "19")
    assert placed.returncode == 0, placed.stderr
    channel = env.channel()
    assert drain(channel, f"{prefix}orders.events") == [b'{"order": 19, "total": 100}']
    time.sleep(0.8)  # past the 300 ms timeout: a decided transaction is never checked
    assert message_count(channel, f"{prefix}orders.checks") == 0
