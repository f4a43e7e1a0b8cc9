"""The replicated logs, faked: each group's committed entries and the attempts on their way there.

Theory of operation: a proposer's attempt to append an entry is a `Copy` in its group's
`in_flight` list. The simulation then decides its fate, step by step, as a Raft group under
faults can: it commits (usually the oldest first, sometimes another: a later seq overtakes an
earlier one), it is lost (the proposer hears "not leader"), or its outcome is reported unknown
("timeout") while the copy stays and may still commit later, any number of steps later, after
the proposer's retry did (two committed copies, possibly far apart). A leader change does the
last two to many copies at once. Nothing is ever committed that no one proposed.

`committed[group]` is the log every replica applies, index 1 first; `first[(origin, group,
seq)]` remembers which proposal was committed first for a sequence number (the original, or a
tombstone that took its seq), for the ledger's verdicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Proposal:
    """One entry a life proposed (and may propose again): its payload never changes."""

    __slots__ = (
        "pid",
        "node",
        "group",
        "origin",
        "seq",
        "items",
        "payload",
        "publishes",
        "tombstone",
        "first_proposed_ms",
        "committed",
        "maybe_appended",
        "outcome",
        "barrier",
        "commits",
        "requests",
        "committed_ms",
        "done_at_commit",
    )

    def __init__(
        self,
        pid: int,
        node: Any,
        group: str,
        origin: str,
        seq: int,
        items: list,
        payload: bytes,
        publishes: tuple[int, ...],
        tombstone: bool,
        now_ms: int,
    ) -> None:
        self.pid = pid  # its number in this run (the step log names it)
        self.node = node
        self.group = group
        self.origin = origin
        self.seq = seq
        self.items = items  # (target, command) pairs
        self.payload = payload
        self.publishes = publishes  # the message numbers its Enqueues carry
        self.tombstone = tombstone  # fills the seq of a proposal given up on (no commands)
        self.first_proposed_ms = now_ms
        self.committed = False  # an attempt was answered "committed"
        self.maybe_appended = False  # an attempt was answered "timeout"
        self.outcome: str | None = None  # what its caller heard: "ok", or the error (None: not yet)
        self.barrier = False  # a new life's Down of its node's other lives (its barrier)
        self.commits = 0  # copies committed
        self.requests: list[int] = []  # its request numbers (only in a group its node holds no replica of)
        self.committed_ms = 0  # when an attempt was first answered "committed"
        self.done_at_commit = False  # completed at its commit, not when applied (a group held elsewhere)

    def __repr__(self) -> str:
        kind = "tombstone" if self.tombstone else ",".join(type(c).__name__ for _t, c in self.items)
        return f"p{self.pid}[{self.origin} {self.group}#{self.seq} {kind}]"


class Copy:
    """One attempt of a proposal, on its way to the log."""

    __slots__ = ("proposal", "answered", "term")

    def __init__(self, proposal: Proposal, term: int = 0) -> None:
        self.proposal = proposal
        self.answered = False  # the proposer already heard "timeout" for it: it commits silently
        self.term = term  # the group's term (leadership) it was appended in (runner.py, `_lose`)


class FakeLog:
    def __init__(self, groups: list[str], on_commit=None) -> None:
        self.on_commit = on_commit  # (group, proposal), before any replica applies it
        self.committed: dict[str, list[Proposal]] = {group: [] for group in groups}
        self.in_flight: dict[str, list[Copy]] = {group: [] for group in groups}
        self.first: dict[tuple[str, str, int], Proposal] = {}
        self.term_of: Callable[[str], int] = lambda group: 0  # a group's term now (the runner's layout)

    def append(self, proposal: Proposal) -> None:
        self.in_flight[proposal.group].append(Copy(proposal, self.term_of(proposal.group)))

    def commit(self, group: str, position: int) -> tuple[Copy, int]:
        """Commit the attempt at `position` of the group's in-flight list; returns it and its index."""
        copy = self.in_flight[group].pop(position)
        proposal = copy.proposal
        self.committed[group].append(proposal)
        proposal.commits += 1
        self.first.setdefault((proposal.origin, group, proposal.seq), proposal)
        if self.on_commit is not None:
            self.on_commit(group, proposal)
        return copy, len(self.committed[group])

    def lose(self, group: str, position: int) -> Copy:
        return self.in_flight[group].pop(position)

    def pending(self) -> int:
        return sum(len(copies) for copies in self.in_flight.values())
