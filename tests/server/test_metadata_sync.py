"""MetadataSync (server/metadata_sync.py): one barrier out at a time; a caller that comes while
one is out waits for the next (the one out may have been appended before what it must see); a
barrier given up on covers nothing."""

from __future__ import annotations

import math

import trio
import trio.testing

from maxq_raft.server.metadata_sync import MetadataSync


class Barriers:
    """Proposed barriers, each answered by the test (`finish`)."""

    def __init__(self) -> None:
        self.out: list = []

    def propose(self, then) -> None:
        self.out.append(then)

    def finish(self, error: str | None = None) -> None:
        self.out.pop(0)(error)


def test_callers_during_a_barrier_wait_for_the_next_one() -> None:
    async def main() -> None:
        barriers = Barriers()
        sync = MetadataSync(barriers.propose)
        done: list[tuple[str, float]] = []
        sync.after_barrier(lambda at: done.append(("a", at)))
        first_at = trio.current_time()
        await trio.sleep(0.01)
        sync.after_barrier(lambda at: done.append(("b", at)))
        sync.after_barrier(lambda at: done.append(("c", at)))
        assert len(barriers.out) == 1  # one out, however many wait
        barriers.finish()
        assert [name for name, _ in done] == ["a"]
        assert done[0][1] <= first_at
        assert len(barriers.out) == 1  # the next one, for b and c, proposed at once
        second_at = trio.current_time()
        barriers.finish()
        assert [name for name, _ in done] == ["a", "b", "c"]
        assert first_at < done[1][1] == done[2][1] <= second_at
        assert barriers.out == [] and sync.barriers == 2 and sync.failures == 0

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_a_barrier_given_up_on_covers_nothing_and_the_callers_go_on() -> None:
    async def main() -> None:
        barriers = Barriers()
        sync = MetadataSync(barriers.propose)
        done: list[float] = []
        sync.after_barrier(done.append)
        barriers.finish("timeout")
        assert done == [-math.inf] and sync.failures == 1
        sync.after_barrier(done.append)  # the next caller gets a barrier of its own
        assert len(barriers.out) == 1

    trio.run(main)


def test_a_caller_that_raises_does_not_stop_the_others() -> None:
    async def main() -> None:
        barriers = Barriers()
        sync = MetadataSync(barriers.propose)
        done: list[str] = []

        def fails(_at: float) -> None:
            raise RuntimeError("a caller's bug")

        sync.after_barrier(lambda _at: done.append("first"))
        sync.after_barrier(fails)
        sync.after_barrier(lambda _at: done.append("after"))
        barriers.finish()
        barriers.finish()  # (fails and after wait for the second barrier together)
        assert done == ["first", "after"]

    trio.run(main)
