"""Bugs the simulation found (and one it must find), planted back on purpose.

Theory of operation: a seed reproduces a bug only as long as the simulation draws what it drew
when the bug was found; any change to the simulation changes that. So each bug found is kept
here as a plant, the code as it was before its fix, and a regression seed is one that fails
with the plant and passes without it (test_sim.py checks both). After a change to the
simulation, find new seeds with `python -m tests.sim --seeds 20000 --workers 2 --plant NAME`.

`planted(name)` is a context manager that puts the old code back for its duration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from . import elsewhere, proposer, runner
from .api import ApplyOrder, remote


def _admit_replacing_held(self, origin: str, seq: int, item) -> bool:
    """ApplyOrder.admit before 9d0325e: a later copy of a held seq replaced the held entry."""
    if origin in self.dead:
        return False
    next_seq = self.expected.get(origin, 1)
    if seq < next_seq:
        self.duplicates += 1
        return False
    if seq > next_seq:
        self.held.setdefault(origin, {})[seq] = item
        self.held_count += 1
        return False
    self.expected[origin] = next_seq + 1
    return True


def _admit_copies_too(self, origin: str, seq: int, item) -> bool:
    """Never was: a repeated proposal applied again (the simulation must catch it at once)."""
    if origin not in self.dead and seq < self.expected.get(origin, 1):
        return True
    return _ADMIT(self, origin, seq, item)


def _ends_life_shard_0_only(effect, life: str, order) -> bool:
    """ClusterLog.lives_down before 20ba793: only shard-0's Down, and only from another node."""
    return life.startswith(effect.prefix) and not effect.origin.startswith(effect.prefix) and effect.group == "shard-0"


def _cut_off_dropping_clean_ups(self, why: str) -> None:
    """Proposer.new_life before d43b8b3: the clean-ups it abandoned were not proposed again."""
    saved = proposer.CLEANUP_COMMANDS
    proposer.CLEANUP_COMMANDS = ()
    try:
        _CUT_OFF(self, why)
    finally:
        proposer.CLEANUP_COMMANDS = saved


def _retry_any_life(self) -> int:
    """Proposer.retry_proposals before its fix: entries of a life cut off were proposed again."""
    retries, self.retries = self.retries, []
    for proposal in retries:
        self.world.log.append(proposal)
    return len(retries)


def _deliveries_here_resync_at_watch_only(self, group: str, effects: list, index: int = 0) -> list:
    """ClusterLog.deliveries_here before its fix (the jepsen-style harness, seed 2004): a member
    that came to lead a group sent its first deliveries before the resync its watch sends later;
    a non-holder wrote a message the old leader had checked out (and whose delivery was lost
    with it) after a later one: FIFO order broken."""
    return self.local_deliveries(self.sender.take_deliveries(group, effects))


def _done_at_commit_unless_requested(items: list, requested: bool) -> bool:
    """Proposer._proposed before its fix (found by this simulation, seed 65 of --partial): an
    entry of a group held elsewhere with no request was done at its commit, its publishes
    confirmed; skipped later (its life declared dead in the group first), they were never
    enqueued."""
    return requested


def _act_at_once(self, peer: str, items: list, gap: bool, now: float, acking=None) -> list:
    """remote.GapHold.order before its fix (found by this simulation, and by the jepsen-style
    run of seed 2008): after a gap, the deliveries of the message that showed it were written
    before the resync asked for, which carried earlier ones: a consumer's order broke."""
    return items


def _held_all_written(self, peer: str, items: list, gap: bool, now: float, acking=None) -> list:
    """remote.GapHold.order before its fix (found by this simulation: seed 421196 of --partial):
    every delivery held since a gap was written after the resync, also one to a consumer that
    acknowledges whose message the resync did not carry (no longer checked out to it: acked,
    returned or redelivered since), after later deliveries: a consumer's order broke."""
    return _ORDER(self, peer, items, gap, now, None)


def _newly_led_unless_seen_led(self, group: str) -> bool:
    """remote.Sender.newly_led before its fix (found by this simulation: 16 of 20,000 seeds of
    --partial), with `_watch_keeping_what_it_saw_led`: ClusterLog kept the groups its watch had
    seen led here, and resynced only for one not among them. A leadership lost and taken back
    between two looks resynced nothing; what the leader between had checked out to a member's
    consumers, its deliveries lost with its leadership, never reached them."""
    led = self.__dict__.setdefault("plant_led", set())
    if group in led or not self.leads(group):
        return False
    led.add(group)
    return True


def _watch_keeping_what_it_saw_led(self) -> None:
    """(With `_newly_led_unless_seen_led`) the watch's turn, then: the groups led now, kept."""
    _WATCH(self)
    self.sender.plant_led = {group for group in self.shards if self.engine.is_leader(group)}


def _lives_ended_untold(self, group: str, prefix: str, lives: tuple[str, ...]) -> None:
    """remote.Sender.lives_ended before its fix (found by this simulation: 6 of 20,000 seeds of
    --partial): a Down that ended a node's life in a group it held no replica of was not told
    to it; the node kept a consumer its queue no longer had, and it never got a message."""


def _session_id_of_any_process(self) -> str:
    """server/session.py before its fix (found by this simulation: 1 of 20,000 seeds of --partial,
    100,000-119,999): session ids "node@n" with n counted from 1 by each process. A lagging new
    leader sent a restarted member the deliveries of its earlier process's consumer, and the
    member wrote them to its new consumer with the same id, on another queue."""
    return f"{self.name}@{self.sessions}"


_ADMIT = ApplyOrder.admit
_CUT_OFF = proposer.Node.cut_off
_WATCH = elsewhere.Elsewhere.watch
_ORDER = remote.GapHold.order

# name -> what it replaces: (owner, attribute, the old code), each put back for the plant's duration
PLANTS: dict[str, list[tuple[object, str, object]]] = {
    "held-replaced": [(ApplyOrder, "admit", _admit_replacing_held)],
    "copies-applied": [(ApplyOrder, "admit", _admit_copies_too)],
    "lives-down-shard-0": [(runner, "ends_life", _ends_life_shard_0_only)],
    "cut-off-drops-clean-ups": [(proposer.Node, "cut_off", _cut_off_dropping_clean_ups)],
    "retries-outlive-cut-off": [(proposer.Node, "retry", _retry_any_life)],
    "resync-at-watch-only": [(elsewhere.Elsewhere, "deliveries_here", _deliveries_here_resync_at_watch_only)],
    "confirm-at-commit": [(proposer, "end_awaited", _done_at_commit_unless_requested)],
    "deliveries-before-resync": [(remote.GapHold, "order", _act_at_once)],
    "stale-held-written": [(remote.GapHold, "order", _held_all_written)],
    "life-ended-untold": [(remote.Sender, "lives_ended", _lives_ended_untold)],
    "session-ids-reused": [(proposer.Node, "session_id", _session_id_of_any_process)],
    # Proposer._proposed before its fix: a given-up entry's acks, requeues, rejects and credit
    # were lost (the consumer lived on, the acked messages checked out to it for good).
    "acks-given-up": [(proposer, "CONSUMER_COMMANDS", ())],
    "regained-unseen": [
        (remote.Sender, "newly_led", _newly_led_unless_seen_led),
        (elsewhere.Elsewhere, "watch", _watch_keeping_what_it_saw_led),
    ],
}


@contextlib.contextmanager
def planted(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    replaced = PLANTS[name]
    fixed = [getattr(owner, attribute) for owner, attribute, _bug in replaced]
    for owner, attribute, bug in replaced:
        setattr(owner, attribute, bug)
    try:
        yield
    finally:
        for (owner, attribute, _bug), code in zip(replaced, fixed, strict=True):
            setattr(owner, attribute, code)
