"""The decisions of transactions (issue #21): recorded once, in the metadata group.

Theory of operation: a transaction's halves may sit in queues of several shard groups, so its
decision is recorded in one place first, the metadata group, by `DecideTxn`; the shell then
applies it to each queue that holds halves of it (commands.ResolveTxn, transactions.py). The
first decision recorded for a (vhost, id) stands: a later one for it is answered with the one
that stands, and changes nothing, so a producer's late commit cannot undo the rollback that its
spent check-backs caused, and a repeated commit is harmless. "expire" is recorded as such (a
rollback for the producer; the queues dead-letter the halves when they can).

Decisions are kept DECISION_KEEP_MS of metadata time after they were made (the ticker resolves
the queues long before), then forgotten, at most PRUNE_BATCH_MAX per DecideTxn; at most
DECISIONS_MAX are held (the oldest go first). Time is the entry's, never going backwards.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .queue_types import Meta, Rejected

DECISION_KEEP_MS = 3_600_000
DECISIONS_MAX = 100_000
PRUNE_BATCH_MAX = 1024
DECISION_ACTIONS = ("commit", "rollback", "expire")


class DecideTxn(NamedTuple):
    """Record `action` ("commit", "rollback" or "expire") for transaction `txn_id` of `vhost`,
    unless one is recorded. The reply is the action that stands."""

    vhost: str
    txn_id: str
    action: str


class TxnDecisions:
    def __init__(self) -> None:
        self.decided: dict[tuple[str, str], tuple[str, int]] = {}  # in the order decided
        self.now_ms = 0

    def get(self, vhost: str, txn_id: str) -> str | None:
        found = self.decided.get((vhost, txn_id))
        return None if found is None else found[0]

    def apply(self, meta: Meta, command: DecideTxn) -> tuple[str | Rejected, list[Any]]:
        vhost, txn_id, action = command
        if type(vhost) is not str or type(txn_id) is not str or type(action) is not str:
            return Rejected(541, f"malformed DecideTxn: {command!r}"[:200]), []
        if action not in DECISION_ACTIONS or not txn_id:
            return Rejected(541, f"malformed DecideTxn: {command!r}"[:200]), []
        if type(meta.time_ms) is int and meta.time_ms > self.now_ms:
            self.now_ms = meta.time_ms
        self._prune()
        key = (vhost, txn_id)
        found = self.decided.get(key)
        if found is not None:
            return found[0], []
        self.decided[key] = (action, self.now_ms)
        if len(self.decided) > DECISIONS_MAX:
            del self.decided[next(iter(self.decided))]
        return action, []

    def _prune(self) -> None:
        decided = self.decided
        horizon = self.now_ms - DECISION_KEEP_MS
        for _ in range(min(PRUNE_BATCH_MAX, len(decided))):
            key, (_action, at_ms) = next(iter(decided.items()))
            if at_ms > horizon:
                return
            del decided[key]

    def dump(self) -> dict[str, Any]:
        return {"now_ms": self.now_ms, "decided": [[v, t, a, at] for (v, t), (a, at) in self.decided.items()]}

    def load(self, dumped: dict[str, Any]) -> None:
        self.now_ms = int(dumped["now_ms"])
        for vhost, txn_id, action, at_ms in dumped["decided"]:
            if action not in DECISION_ACTIONS or type(at_ms) is not int:
                raise ValueError(f"bad transaction decision {txn_id!r}")
            self.decided[(str(vhost), str(txn_id))] = (action, at_ms)
