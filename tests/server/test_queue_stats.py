"""The counts a group's leader sends of its queues (server/queue_stats.py): the wire form."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines.commands import Checkout, Enqueue
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import Meta
from maxq_raft.server.queue_stats import QueueStats, from_record
from tests.machines.test_queue_machine import messages

counts = st.integers(0, 2**40)
names = st.text(max_size=20)


@given(
    names,
    names,
    st.lists(counts, min_size=14, max_size=14),
    st.booleans(),
    st.lists(st.tuples(names, names), max_size=3),
)
def test_a_record_comes_back_as_it_went(vhost, name, numbers, trace, rules) -> None:
    stats = QueueStats("n2", *numbers, trace=trace, pause_rules=tuple(rules))
    wire = msgpack.unpackb(msgpack.packb(stats.record(vhost, name), use_bin_type=True), raw=False)
    assert from_record("n2", wire) == ((vhost, name), stats)


def test_the_counts_of_a_machine() -> None:
    queue = QueueMachine("/", "q")
    queue.apply(Meta(1, 1000), Enqueue(messages(1, 5)))
    queue.apply(Meta(2, 1000), Checkout("c1", "n1@1", 2, False, 0, False, 100))  # prefetch 2
    stats = QueueStats.of("n3", queue)
    assert (stats.node, stats.ready_count, stats.unacked_count, stats.active_consumer_count) == ("n3", 3, 2, 1)
    assert stats.stats_published == 5 and stats.stats_delivered == 2 and stats.trace is False
    assert from_record("n3", stats.record("/", "q")) == (("/", "q"), stats)


@pytest.mark.parametrize(
    "record",
    [
        None,
        ["/", "q"],
        ["/", "q", *[0] * 13, -1, False, []],  # a negative count
        ["/", 7, *[0] * 14, False, []],
        ["/", "q", *[0] * 14, "yes", []],
        ["/", "q", *[0] * 14, False, [["only-scope"]]],
        ["/", "q", *[0] * 13, 1.5, False, []],
    ],
)
def test_a_malformed_record_is_refused(record) -> None:
    with pytest.raises(ValueError):
        from_record("n2", record)
