"""The checker's txn verdicts on synthetic histories (jepsen-style/maxq_jepsen/checker.py, the txn
rules): a delivered half of a transaction meant to be rolled back is fatal
(rolled_back_delivered), so is a confirmed half of a transaction whose commit was confirmed and
that is never delivered (committed_lost), and so are two different copies (publish attempts) of
one id delivered (txn_duplicates). The benign cases pass: a confirmed half of a rolled-back
transaction is not `lost`, a commit that was never confirmed proves nothing, one copy delivered
twice (flagged or not) is a redelivery, a retry whose first attempt was indeterminate is
recovered, not nacked-and-delivered. No broker here (`jepsen-style/run --workload txn` runs real
ones, tests/jepsen/test_txn_run.py)."""

from __future__ import annotations

import sys
from pathlib import Path

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen.checker import FAILED, FATAL_KINDS, PASS, check  # noqa: E402


class TxnH:
    """A synthetic txn history: one clock tick per record, records in call order."""

    def __init__(self) -> None:
        meta = {"spec": {"workload": {"queue": "jepsen", "checks_queue": "jepsen-txn-checks"}}}
        self.records: list[dict] = [{"time": 0.0, "process": "runner", "type": "meta", "f": "meta", "value": meta}]
        self.t = 0.0

    def add(self, type: str, f: str, process: str, **fields) -> None:
        self.t += 0.01
        self.records.append({"time": round(self.t, 6), "process": process, "type": type, "f": f, **fields})

    def txn(self, txn: str, intention: str, answer: str = "commit", ids: tuple[str, ...] = ()) -> None:
        value = {"intention": intention, "answer": answer, "size": len(ids), "ids": list(ids)}
        self.add("invoke", "txn", "pub0", txn=txn, value=value)

    def half(
        self,
        mid: str,
        txn: str,
        outcome: str | None = "ok",
        attempt: int = 1,
        error: str | None = None,
        node: str = "n1",
    ) -> None:
        fields = {"id": mid, "seq": int(mid.rsplit("-", 1)[1]), "txn": txn, "attempt": attempt, "node": node}
        self.add("invoke", "publish", "pub0", crc=crc(mid, attempt), **fields)
        if outcome is not None:
            self.add(outcome, "publish", "pub0", **fields, **({"error": error} if error else {}))

    def decide(self, txn: str, action: str, outcome: str = "ok", by: str = "publisher", error: str | None = None):
        self.add("invoke", "decide", "pub0" if by == "publisher" else "chk0", txn=txn, action=action, by=by)
        extra = {"error": error} if error else {}
        self.add(outcome, "decide", "pub0" if by == "publisher" else "chk0", txn=txn, action=action, by=by, **extra)

    def check(self, txn: str, attempt: int = 1) -> None:
        self.add("ok", "check", "chk0", txn=txn, attempt=attempt, redelivered=False)

    def deliver(self, mid: str, attempt: int = 1, redelivered: bool = False, process: str = "con0") -> None:
        self.add("ok", "deliver", process, id=mid, crc=crc(mid, attempt), redelivered=redelivered, queue="jepsen")

    def drain_done(self) -> None:
        self.add("ok", "drain", "drain", value={"remaining": 0, "drained": 0})


def crc(mid: str, attempt: int) -> int:
    return 1000 * int(mid.rsplit("-", 1)[1]) + attempt  # every attempt's body differs


def test_the_new_kinds_are_fatal() -> None:
    assert {"rolled_back_delivered", "committed_lost", "txn_duplicates"} <= set(FATAL_KINDS)


def test_commit_rollback_and_check_back_pass_and_are_counted() -> None:
    h = TxnH()
    h.txn("pub0-t1", "commit", ids=("pub0-1", "pub0-2"))
    h.half("pub0-1", "pub0-t1")
    h.half("pub0-2", "pub0-t1")
    h.decide("pub0-t1", "commit")
    h.txn("pub0-t2", "rollback", ids=("pub0-3",))
    h.half("pub0-3", "pub0-t2")  # confirmed, never delivered: not lost, it was rolled back
    h.decide("pub0-t2", "rollback")
    h.txn("pub0-t3", "check", answer="commit", ids=("pub0-4",))
    h.half("pub0-4", "pub0-t3")
    h.check("pub0-t3")
    h.decide("pub0-t3", "commit", by="responder")
    h.txn("pub0-t4", "check", answer="rollback", ids=("pub0-5",))
    h.half("pub0-5", "pub0-t4")
    h.check("pub0-t4")
    h.decide("pub0-t4", "rollback", by="responder")
    for mid in ("pub0-2", "pub0-1", "pub0-4"):  # halves come at the commit, not in publish order
        h.deliver(mid)
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS, result.to_dict()
    c = result.counts
    assert (c["txns"], c["txns_committed"], c["txns_rolled_back"], c["txns_checked_back"]) == (4, 2, 2, 2)
    assert (c["txns_intended_commit"], c["txns_intended_rollback"], c["txns_left_to_check"]) == (1, 1, 2)
    assert c["lost"] == c["fifo_violations"] == c["committed_lost"] == c["rolled_back_delivered"] == 0
    assert c["checks"] == 2 and c["decides_ok"] == 4


def test_a_delivered_half_of_a_rolled_back_transaction_is_fatal() -> None:
    for intention, answer in (("rollback", "commit"), ("check", "rollback")):
        h = TxnH()
        h.txn("pub0-t1", intention, answer=answer, ids=("pub0-1",))
        h.half("pub0-1", "pub0-t1", outcome="info")  # even an indeterminate half must not show up
        h.deliver("pub0-1")
        h.drain_done()
        result = check(h.records)
        assert result.verdict == FAILED and result.fatal == {"rolled_back_delivered": 1}, (intention, result.fatal)
        assert result.examples["rolled_back_delivered"] == ["pub0-1"]


def test_a_confirmed_half_of_a_confirmed_commit_never_delivered_is_fatal() -> None:
    for by in ("publisher", "responder"):
        h = TxnH()
        h.txn("pub0-t1", "check" if by == "responder" else "commit", answer="commit", ids=("pub0-1", "pub0-2"))
        h.half("pub0-1", "pub0-t1")
        h.half("pub0-2", "pub0-t1")
        h.decide("pub0-t1", "commit", by=by)
        h.deliver("pub0-1")
        h.drain_done()
        result = check(h.records)
        assert result.verdict == FAILED and result.fatal == {"committed_lost": 1}, result.fatal
        assert result.examples["committed_lost"] == ["pub0-2"]


def test_no_committed_lost_without_a_confirmed_commit_or_a_confirmed_half() -> None:
    h = TxnH()
    h.txn("pub0-t1", "commit", ids=("pub0-1",))
    h.half("pub0-1", "pub0-t1")
    h.decide("pub0-t1", "commit", outcome="info")  # the commit may not have happened
    h.txn("pub0-t2", "commit", ids=("pub0-2",))
    h.half("pub0-2", "pub0-t2")
    # the check-backs ran out first: the broker rolled it back and refuses the commit
    h.decide("pub0-t2", "commit", outcome="fail", error="406 transaction 'pub0-t2' was already rolled back")
    h.txn("pub0-t3", "commit", ids=("pub0-3", "pub0-4"))
    h.half("pub0-3", "pub0-t3")
    h.half("pub0-4", "pub0-t3", outcome="info")  # maybe never stored
    h.decide("pub0-t3", "commit")
    h.deliver("pub0-3")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS, result.to_dict()
    assert result.counts["decides_refused_406"] == 1 and result.counts["decides_indeterminate"] == 1


def test_two_copies_of_one_half_delivered_is_a_duplicate() -> None:
    """A retry after a lost confirm stored a second copy (the deduplication window should have
    dropped it): both copies are delivered, told apart by their bodies, whatever the flags say."""
    h = TxnH()
    h.txn("pub0-t1", "commit", ids=("pub0-1",))
    h.half("pub0-1", "pub0-t1", outcome="info")
    h.half("pub0-1", "pub0-t1", attempt=2)
    h.decide("pub0-t1", "commit")
    h.deliver("pub0-1", attempt=2)
    h.deliver("pub0-1", attempt=1, redelivered=True, process="con1")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"txn_duplicates": 1}, result.fatal
    assert result.examples["txn_duplicates"] == ["pub0-1"] and result.counts["half_retries"] == 1
    assert not result.notes  # a retry is not an id published twice by mistake


def test_one_copy_delivered_twice_is_a_redelivery_flagged_or_not() -> None:
    """The same copy again is a redelivery: flagged after a consumer's crash, and on a cluster
    even unflagged (a delivery the dead leader made but never replicated): not fatal."""
    h = TxnH()
    h.txn("pub0-t1", "commit", ids=("pub0-1", "pub0-2"))
    h.half("pub0-1", "pub0-t1", outcome="info")
    h.half("pub0-1", "pub0-t1", attempt=2)  # the retry's copy was dropped by the window
    h.half("pub0-2", "pub0-t1")
    h.decide("pub0-t1", "commit")
    h.deliver("pub0-1")
    h.deliver("pub0-1", redelivered=True, process="con1")
    h.deliver("pub0-2")
    h.deliver("pub0-2", process="con1")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS, result.to_dict()
    assert result.counts["duplicates"] == 2 and result.counts["duplicates_unflagged"] == 1
    assert result.counts["txn_duplicates"] == 0 and result.counts["retried_ids_delivered"] == 1


def test_a_retry_that_confirms_makes_the_half_confirmed_and_a_nacked_retry_leaves_it_open() -> None:
    h = TxnH()
    h.txn("pub0-t1", "commit", ids=("pub0-1", "pub0-2"))
    h.half("pub0-1", "pub0-t1", outcome="info")
    h.half("pub0-1", "pub0-t1", attempt=2)  # confirmed on the retry: it must be delivered
    h.half("pub0-2", "pub0-t1", outcome="info")
    h.half("pub0-2", "pub0-t1", attempt=2, outcome="fail", error="nack")  # the first may be stored
    h.decide("pub0-t1", "commit")
    h.deliver("pub0-2")
    h.drain_done()
    result = check(h.records)
    assert result.fatal == {"committed_lost": 1} and result.examples["committed_lost"] == ["pub0-1"]
    assert result.counts["nacked_delivered"] == 0 and result.counts["recovered"] == 1


def test_a_body_of_no_attempt_is_corrupt() -> None:
    h = TxnH()
    h.txn("pub0-t1", "commit", ids=("pub0-1",))
    h.half("pub0-1", "pub0-t1")
    h.decide("pub0-t1", "commit")
    h.deliver("pub0-1", attempt=7)
    h.drain_done()
    result = check(h.records)
    assert result.fatal == {"corrupt": 1}


def test_a_half_retried_on_the_majority_side_is_not_confirmed_by_the_minority() -> None:
    """Attempt 1 on n4, cut off alone, fails; attempt 2 on n5 is confirmed: the half was
    confirmed by n5, not by the minority (seen in a 5-node run: the checker kept attempt 1's node
    and time and counted it minority_confirmed). A half confirmed on the cut-off node still is."""
    h = TxnH()
    h.add("ok", "partition-one", "nemesis", value={"minority": ["n4"], "cuts": []})
    h.txn("pub0-t1", "check", answer="rollback", ids=("pub0-1",))
    h.half("pub0-1", "pub0-t1", outcome="info", node="n4", error="channel closed")
    h.half("pub0-1", "pub0-t1", attempt=2, node="n5")
    h.txn("pub0-t2", "check", answer="rollback", ids=("pub0-2",))
    h.half("pub0-2", "pub0-t2", node="n4")  # (what minority_confirmed is for)
    h.decide("pub0-t1", "rollback", by="responder")
    h.decide("pub0-t2", "rollback", by="responder")
    h.drain_done()
    result = check(h.records)
    assert result.fatal == {"minority_confirmed": 1} and result.examples["minority_confirmed"] == ["pub0-2"]
