"""Python's cyclic garbage collector, tuned for a broker's allocation pattern.

Why: every message the node handles allocates a few container objects (its `Message`, the
lists and tuples of a batch), nearly all freed by reference counting within milliseconds; none
of them form cycles. CPython 3.11's default thresholds (700, 10, 10) still run a young
collection every 700 net allocations and, as queues grow, full collections over every message
held in memory. py-spy with native frames (`py-spy record --native`, `gc_collect_main`) put the
collector at 8-12 % of the node's CPU under transient 16-byte load (docs/benchmarks.md,
2026-12-02). With a young threshold of YOUNG_ALLOCATIONS it fell to no sample at all.

What still makes cycles (trio's cancelled tasks and their exceptions, tracebacks, closures) is
collected as before, only after more allocations: at most YOUNG_ALLOCATIONS container objects of
garbage wait, a few MiB. `freeze_startup` moves what start-up allocated (modules, the metadata,
recovered queues) into the permanent generation, so full collections stop walking it again.
"""

from __future__ import annotations

import gc

YOUNG_ALLOCATIONS = 50_000  # net container allocations between young collections (default 700)
MIDDLE_COLLECTIONS = 20  # young collections per middle one (default 10)
OLD_COLLECTIONS = 10  # middle collections per full one, as the default


def tune() -> None:
    gc.set_threshold(YOUNG_ALLOCATIONS, MIDDLE_COLLECTIONS, OLD_COLLECTIONS)


def freeze_startup() -> None:
    """Once the node is ready: what exists now lives as long as the process (mostly)."""
    gc.collect()
    gc.freeze()
