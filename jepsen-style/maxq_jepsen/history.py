"""The history: every operation of a run, one JSON object per line.

Theory of operation: as in Jepsen, a client operation is an `invoke` followed by exactly one
completion: `ok` (it happened: a publish was confirmed), `fail` (it certainly did not happen: a
nack or a mandatory return) or `info` (we cannot know: a timeout or a connection lost while in
flight). A delivery is observed, not invoked, so it is a lone `ok` record of f="deliver". The
nemesis records its faults the same way (invoke, then ok/info with a description in `value`),
and the runner records phase changes (f="phase") so that the checker can tell fault windows from
quiet ones. The first line is a `meta` record describing the run (seed, schedule, settings).

One clock for everything: `time` is seconds since the run began, from the monotonic clock, read
under the writer's lock so that the file order is the time order and a delivery can never be
stamped before the publish that caused it. Records written after `close()` (a straggling client
thread) are counted, not written.

Fields (absent when meaningless):
    time         float, seconds since the run began
    process      "pub0", "con1", "drain", "nemesis", "runner", "probe"
    type         "invoke" | "ok" | "fail" | "info" | "meta"
    f            "publish" | "deliver" | "ack" | "connect" | "phase" | nemesis verbs ("kill", ...) |
                 "txn" | "decide" | "check" (the txn workload)
    id           message id (unique per run: "<process>-<seq>")
    seq          the publisher's sequence number of that id
    session      the process's connection attempt number (FIFO holds within one session)
    node         the node the client was connected to
    redelivered  the broker's flag on a delivery
    crc          CRC-32 of the body (publish and deliver), to catch corruption
    txn          (the txn workload) the transaction id of a half, a decision, a check, or f="txn"
    attempt      (the txn workload) a half's publish attempt (a retry keeps the id), a check's number
    action, by   (the txn workload) a decision's commit/rollback and who sent it (publisher, responder)
    error        why a completion is fail/info
    value        anything else (nemesis targets, phase name, counts)
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO, META = "invoke", "ok", "fail", "info", "meta"
TYPES = (INVOKE, OK, FAIL, INFO, META)
RECORDS_IN_MEMORY_MAX = 5_000_000  # an in-memory history (tests) is bounded too


class HistoryWriter:
    """Thread-safe appender. `path=None` keeps the records in memory (for tests and the checker)."""

    def __init__(self, path: Path | str | None = None, clock=time.monotonic) -> None:
        self.path = Path(path) if path is not None else None
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._file = open(self.path, "w", encoding="utf-8") if self.path is not None else None
        self.records: list[dict] | None = [] if self.path is None else None
        self.closed = False
        self.dropped_after_close = 0
        self.count = 0

    def now(self) -> float:
        return round(self._clock() - self._t0, 6)

    def write(self, type: str, f: str, process: str, **fields: Any) -> dict:
        assert type in TYPES, type
        with self._lock:
            record = {"time": self.now(), "process": process, "type": type, "f": f}
            record.update((k, v) for k, v in fields.items() if v is not None)
            if self.closed:
                self.dropped_after_close += 1
                return record
            self.count += 1
            if self._file is not None:
                self._file.write(json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")
            else:
                assert self.records is not None and len(self.records) < RECORDS_IN_MEMORY_MAX
                self.records.append(record)
            return record

    def meta(self, **fields: Any) -> dict:
        return self.write(META, "meta", "runner", value=fields)

    def flush(self) -> None:
        with self._lock:
            if self._file is not None and not self.closed:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._file is not None:
                self._file.flush()
                self._file.close()


def read_history(path: Path | str) -> list[dict]:
    """All records of a history file. A torn last line (the harness itself was killed) is skipped."""
    return list(iter_history(path))


def iter_history(path: Path | str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                return  # torn tail
            raise ValueError(f"{path}:{number}: not a JSON record") from None
        if not isinstance(record, dict) or record.get("type") not in TYPES:
            raise ValueError(f"{path}:{number}: not a history record: {line[:200]}")
        yield record


def write_history(path: Path | str, records: Iterable[dict]) -> None:
    """Write records as they are (for synthetic histories and re-checks)."""
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, separators=(",", ":"), sort_keys=True) + "\n")


def run_meta(records: Iterable[dict]) -> dict:
    """The first meta record's value (the run's settings), or {}."""
    for record in records:
        if record.get("type") == META:
            return dict(record.get("value") or {})
    return {}
