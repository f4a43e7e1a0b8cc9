"""What the harness reports from a node's log: CRITICAL records, and each traceback whole enough
to tell what raised where (the run's folder, log included, is usually deleted afterwards)."""

from __future__ import annotations

import sys
from pathlib import Path

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen.lab import log_problems  # noqa: E402

LOG = """\
2026-12-06 00:27:04,100 INFO maxq.server: node n3 ready
2026-12-06 00:27:04,200 ERROR maxq.trace: writing 3 trace records of queue 'q' failed
Traceback (most recent call last):
  File "/x/maxq_raft/server/tracer.py", line 260, in flush
    self.store.write(records)
  File "/x/maxq_raft/server/trace_store.py", line 88, in write
    os.write(fd, data)
OSError: [Errno 28] No space left on device

2026-12-06 00:27:04,987 CRITICAL maxq_raft.replication.journal: journal j: a write failed
2026-12-06 00:27:05,000 INFO maxq.server: stopping
Traceback (most recent call last):"""


def test_a_traceback_is_one_line_with_its_record_and_its_exception() -> None:
    found = log_problems(LOG.splitlines())
    assert found == [
        "Traceback (most recent call last): in: 2026-12-06 00:27:04,200 ERROR maxq.trace: writing 3 trace "
        "records of queue 'q' failed ... "
        'File "/x/maxq_raft/server/trace_store.py", line 88, in write -> OSError: [Errno 28] No space left on device',
        "2026-12-06 00:27:04,987 CRITICAL maxq_raft.replication.journal: journal j: a write failed",
        "Traceback (most recent call last): in: 2026-12-06 00:27:05,000 INFO maxq.server: stopping ...  "
        "-> (no exception line)",
    ]


def test_a_log_without_problems_has_none() -> None:
    assert log_problems(["2026-12-06 00:00:00,000 INFO x: fine", "", "WARNING-ish text"]) == []
