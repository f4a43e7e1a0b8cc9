"""The order a group applies its entries in: each origin's entries once each, in the origin's order.

Theory of operation: a replicated log commits entries in the order its leader appended them,
but a proposer may repeat an entry after a leader change (the first attempt's outcome was
unknown), and a later entry of the same proposer may commit before the repeat of an earlier one.
So every entry names its origin (a node and one life of its process) and a sequence number in
that life (1, 2, ...), and every replica applies an origin's entries in that order, each once:

- `admit(origin, seq, item)`: True when the entry is the origin's next: apply it now (and then
  ask `next_due` for the ones it unblocks). A copy of one already applied or held is skipped
  (the first committed copy of a seq counts); one that came early is held (`item` is kept as
  given, e.g. the raw payload, so a snapshot carries it); an entry of a life declared dead is
  skipped.
- `lives_down(prefix, keep)`: a node went (its `Down`): its lives other than `keep` are dead from
  here on, and what they had held is dropped (never applied here, so never confirmed to anyone);
  it returns the lives it ended (a node holding no replica of the group learns it from them).

This is replicated state: every replica decides alike from the same log, and a snapshot carries
it (`dump`/`load`). Dicts only, no sets: iteration order is the same on every replica.
Entries with seq 0 are not sequenced and are applied as they come.

`apply_committed` is the loop every replica runs for each committed entry (server/cluster.py,
and the seeded simulation in tests/sim/): admit it, apply it, then apply the held ones it unblocks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ApplyOrder", "apply_committed"]


class ApplyOrder:
    def __init__(self) -> None:
        self.expected: dict[str, int] = {}  # origin -> the next seq to apply
        self.held: dict[str, dict[int, Any]] = {}  # origin -> seq -> an item that came early
        self.dead: dict[str, None] = {}  # lives declared down: their entries are skipped
        self.duplicates = 0
        self.held_count = 0  # entries that were ever held (a counter, not the current number)

    def admit(self, origin: str, seq: int, item: Any) -> bool:
        """True: `item` is `origin`'s next entry, apply it now (it counts as applied)."""
        if origin in self.dead:
            return False
        next_seq = self.expected.get(origin, 1)
        if seq < next_seq:
            self.duplicates += 1
            return False
        if seq > next_seq:
            waiting = self.held.setdefault(origin, {})
            if seq in waiting:
                # A copy of one held already: the first committed counts, here as when applied
                # (a tombstone filling the seq of an entry given up on, or that entry committing
                # after all: whichever came first). Replacing it would lose a committed entry.
                self.duplicates += 1
                return False
            waiting[seq] = item
            self.held_count += 1
            return False
        self.expected[origin] = next_seq + 1
        return True

    def next_due(self, origin: str) -> Any | None:
        """After applying one of `origin`'s entries: the held one that is now due, if any (it
        counts as applied); None when there is none, or the origin was declared dead meanwhile."""
        if origin in self.dead:
            return None
        waiting = self.held.get(origin)
        if not waiting:
            return None
        next_seq = self.expected.get(origin, 1)
        item = waiting.pop(next_seq, None)
        if not waiting:
            del self.held[origin]
        if item is None:
            return None
        self.expected[origin] = next_seq + 1
        return item

    def lives_down(self, prefix: str, keep: str) -> tuple[str, ...]:
        """Every life starting with `prefix` (a node's "name@") except `keep` is dead from now on;
        returns those this ended (lives this group had seen, not dead before)."""
        ended = tuple(dict.fromkeys(o for o in (*self.expected, *self.held) if o.startswith(prefix) and o != keep))
        for life in ended:
            self.dead[life] = None
            self.expected.pop(life, None)
            self.held.pop(life, None)
        return ended

    def is_dead(self, origin: str) -> bool:
        return origin in self.dead

    def applied_below(self, origin: str) -> int:
        """The origin's entries with a seq below this were applied here."""
        return self.expected.get(origin, 1)

    # -- snapshots -----------------------------------------------------------------------------

    def dump(self) -> tuple[dict[str, int], list[list[Any]], list[str]]:
        """(expected, [[origin, seq, item], ...], dead lives), plain data for a snapshot."""
        held = [[origin, seq, item] for origin, items in self.held.items() for seq, item in items.items()]
        return dict(self.expected), held, sorted(self.dead)

    @classmethod
    def load(cls, expected: dict[str, int], held: list[list[Any]], dead: list[str]) -> ApplyOrder:
        order = cls()
        order.expected = {str(origin): int(seq) for origin, seq in expected.items()}
        for origin, seq, item in held:
            order.held.setdefault(str(origin), {})[int(seq)] = item
        order.dead = {str(life): None for life in dead}
        return order

    def digest(self) -> tuple[object, ...]:
        """A comparable summary, for replicas that must agree (tests, simulation)."""
        return (
            tuple(sorted(self.expected.items())),
            tuple(sorted((o, tuple(sorted(h))) for o, h in self.held.items())),
            tuple(sorted(self.dead)),
        )


def apply_committed(
    order: ApplyOrder,
    origin: str,
    seq: int,
    item: Any,
    entry: Any,
    apply_one: Callable[[Any], None],
    decode: Callable[[Any], Any],
) -> int:
    """Apply one committed entry in its origin's order; returns how many entries were applied.

    `item` is the entry as committed (kept as it is if it came early, so a snapshot carries it),
    `entry` the same decoded; `apply_one(entry)` applies a decoded entry to the machines, and
    `decode(item)` decodes a held one once it is due. 0: a copy of one applied already, one that
    came early (held now), or one of a life declared dead (the caller may want to know which:
    `order.is_dead(origin)`). Seq 0: not sequenced, applied as it comes."""
    if not seq:
        apply_one(entry)
        return 1
    if not order.admit(origin, seq, item):
        return 0
    apply_one(entry)
    applied = 1
    for _ in range(len(order.held.get(origin, ()))):  # bounded: each turn applies a held one
        waiting = order.next_due(origin)
        if waiting is None:
            break
        apply_one(decode(waiting))
        applied += 1
    return applied
