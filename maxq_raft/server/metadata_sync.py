"""Read-your-writes across members: a barrier through the metadata group.

A member routes and looks objects up in the metadata it has applied. A declare answered by one
member is applied by another a moment later (milliseconds; longer on a busy machine), so a
client that declares on one member and publishes, consumes or deletes through another at once
could find nothing there: its publish returned or dropped as unroutable, its consume refused
with 404, its delete a no-op. RabbitMQ commits metadata on every node before the declare-ok, so
no RabbitMQ client expects that.

So a lookup that finds nothing on a cluster member is not the answer yet (`MetadataBehind`,
raised by the channel before it changed anything): the method waits for a barrier and runs
again. The barrier is an entry with no commands proposed to the metadata group after the method
arrived (`Proposer.sync`); it commits after everything the group had committed by then, which
includes any declare a client was answered for, and once it is applied here so is that declare.
Only what finds nothing waits (a routed publish never does), about one metadata commit (a few
ms on 3 members). Callers that arrive while a barrier is out wait for the next one: the one out
may have been appended before their declare committed. One barrier is out at a time, however
many callers wait. A barrier also covers every method read before it was proposed: the channel's
frames held behind the method go on without another (Session._after_metadata_barrier), so a
publisher whose messages go nowhere waits one barrier per batch it sent meanwhile, not one per
message. If the metadata group cannot commit (no quorum), the barrier is given up on after the
proposer's OUTCOME_WAIT_S and the method runs on what this member has.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import trio

log = logging.getLogger("maxq.cluster")


class MetadataSync:
    def __init__(self, propose_barrier: Callable[[Callable[[str | None], None]], None]) -> None:
        self._propose_barrier = propose_barrier  # proposes one barrier; calls back when it is done
        self._waiting: list[Callable[[float], None]] = []  # for the next barrier
        self._out = False  # a barrier is proposed and not done
        self.barriers = 0  # proposed (counted; not shown in any status yet)
        self.failures = 0  # given up on (the method ran on this member's metadata)

    def after_barrier(self, then: Callable[[float], None]) -> None:
        """`then(proposed_at)` once a barrier proposed after this call is applied here: what was
        read by trio time `proposed_at` is covered by it (-inf: given up on, nothing is)."""
        self._waiting.append(then)
        if not self._out:
            self._start()

    def _start(self) -> None:
        waiting, self._waiting = self._waiting, []
        self._out = True
        self.barriers += 1
        proposed_at = trio.current_time()
        self._propose_barrier(lambda error: self._done(waiting, proposed_at, error))

    def _done(self, waiting: list[Callable[[float], None]], proposed_at: float, error: Any) -> None:
        self._out = False
        if error is not None:
            self.failures += 1
            proposed_at = -math.inf
            log.warning("a metadata barrier was not committed (%s): %d methods go on without it", error, len(waiting))
        for then in waiting:
            try:
                then(proposed_at)
            except Exception:  # each caller's own errors are its own (Session.continuation)
                log.exception("a method waiting for a metadata barrier failed")
        if self._waiting:
            self._start()
