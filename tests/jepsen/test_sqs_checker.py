"""The checker's sqs verdict on synthetic histories: a receive invoked after a certain delete's
answer is fatal (received_after_delete); a delete too long after its receive proves nothing (its
handle may have been stale, SQS answers 200 and deletes nothing); receives invoked before the
delete's answer are not evidence; lost and duplicates work as for AMQP. No broker here
(`jepsen-style/run --workload sqs` runs real ones)."""

from __future__ import annotations

import sys
from pathlib import Path

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen.checker import FAILED, PASS, check  # noqa: E402

VISIBILITY_S = 4


class SqsH:
    """A synthetic sqs history with explicit times (the verdict depends on them)."""

    def __init__(self) -> None:
        meta = {"spec": {"workload": {"queue": "jepsen", "visibility_timeout_s": VISIBILITY_S}}}
        self.records: list[dict] = [{"time": 0.0, "process": "runner", "type": "meta", "f": "meta", "value": meta}]

    def add(self, t: float, type: str, f: str, process: str, **fields) -> None:
        self.records.append({"time": t, "process": process, "type": type, "f": f, **fields})

    def send(self, t: float, mid: str, outcome: str = "ok") -> None:
        self.add(t, "invoke", "publish", "pub0", id=mid, crc=7)
        self.add(t + 0.01, outcome, "publish", "pub0", id=mid)

    def receive(self, invoked: float, t: float, mid: str, count: int = 1, process: str = "con0") -> None:
        value = {"receive_invoke": invoked, "receive_count": count}
        self.add(t, "ok", "deliver", process, id=mid, crc=7, redelivered=count > 1, value=value)

    def delete(self, receive_invoked: float, t: float, mid: str, outcome: str = "ok") -> None:
        self.add(t - 0.01, "invoke", "delete", "con0", id=mid, value={"receive_invoke": receive_invoked})
        self.add(t, outcome, "delete", "con0", id=mid, value={"receive_invoke": receive_invoked})

    def drained(self, t: float) -> None:
        self.add(t, "ok", "drain", "drain", value={"remaining": 0})


def test_send_receive_delete_passes_and_counts_deletes():
    h = SqsH()
    h.send(1.0, "pub0-1")
    h.receive(1.0, 1.1, "pub0-1")
    h.delete(1.0, 1.2, "pub0-1")
    h.drained(5.0)
    result = check(h.records)
    assert result.verdict == PASS
    assert result.counts["received_after_delete"] == 0
    assert result.counts["deletes_ok"] == 1 and result.counts["deletes_certain"] == 1


def test_a_receive_invoked_after_a_certain_delete_is_fatal():
    h = SqsH()
    h.send(1.0, "pub0-1")
    h.receive(1.0, 1.1, "pub0-1")
    h.delete(1.0, 1.2, "pub0-1")
    h.receive(6.0, 6.1, "pub0-1", count=2, process="drain")
    h.drained(7.0)
    result = check(h.records)
    assert result.verdict == FAILED
    assert result.fatal == {"received_after_delete": 1}
    assert result.examples["received_after_delete"][0]["id"] == "pub0-1"


def test_a_delete_long_after_its_receive_proves_nothing():
    # The visibility may have run out and another receive taken the message: the handle was
    # stale, the 200 deleted nothing, and the message coming back is legal.
    h = SqsH()
    h.send(1.0, "pub0-1")
    h.receive(1.0, 1.1, "pub0-1")
    h.delete(1.0, 1.0 + VISIBILITY_S * 0.5 + 0.1, "pub0-1")
    h.receive(8.0, 8.1, "pub0-1", count=2)
    h.drained(9.0)
    result = check(h.records)
    assert result.verdict == PASS
    assert result.counts["deletes_certain"] == 0
    assert result.counts["duplicates"] == 1


def test_a_receive_invoked_before_the_delete_answered_is_not_evidence():
    h = SqsH()
    h.send(1.0, "pub0-1")
    h.receive(1.0, 1.1, "pub0-1")
    h.receive(1.15, 1.3, "pub0-1", count=2, process="con1")  # invoked before the delete's answer
    h.delete(1.0, 1.2, "pub0-1")
    h.drained(5.0)
    assert check(h.records).verdict == PASS


def test_an_indeterminate_delete_is_counted_and_not_evidence():
    h = SqsH()
    h.send(1.0, "pub0-1")
    h.receive(1.0, 1.1, "pub0-1")
    h.delete(1.0, 1.2, "pub0-1", outcome="info")
    h.receive(6.0, 6.1, "pub0-1", count=2, process="drain")
    h.delete(6.0, 6.2, "pub0-1")
    h.drained(7.0)
    result = check(h.records)
    assert result.verdict == PASS
    assert result.counts["deletes_indeterminate"] == 1 and result.counts["deletes_ok"] == 1


def test_an_acknowledged_send_never_received_is_lost():
    h = SqsH()
    h.send(1.0, "pub0-1")
    h.send(1.1, "pub0-2", outcome="info")  # indeterminate: may never have arrived
    h.drained(5.0)
    result = check(h.records)
    assert result.fatal == {"lost": 1}
    assert result.counts["unknown"] == 1
