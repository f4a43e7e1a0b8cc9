"""The log of a one-member cluster: entries commit as soon as they are proposed.

A single node runs the same machines as a replica of a Raft group; this stand-in only stamps
each entry with its index and the proposer's time (`Meta`), which is all the machines need.
The replicated log (pysyncobj groups) will offer the same `stamp` and apply order.
"""

from __future__ import annotations

from typing import Callable

from ..machines.queue_types import Meta


class LocalLog:
    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self._clock_ms = clock_ms
        self.index = 0

    def stamp(self) -> Meta:
        self.index += 1
        return Meta(self.index, self._clock_ms())
