"""The pure parts of reading the trace across members (server/trace_gather.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.server.trace_gather import members_to_ask, merged, query_from_item

MEMBERS = [f"n{i}" for i in range(1, 7)]


@given(
    holders=st.dictionaries(
        st.sampled_from([f"shard-{i}" for i in range(8)]), st.lists(st.sampled_from(MEMBERS), unique=True), max_size=8
    )
)
def test_the_members_asked_cover_every_group_that_has_a_holder(holders: dict[str, list[str]]) -> None:
    groups = sorted(holders)
    asked, uncovered = members_to_ask(groups, holders)
    assert uncovered == sorted(g for g in groups if not holders[g])
    assert len(set(asked)) == len(asked)
    for group in groups:
        if holders[group]:
            assert set(holders[group]) & set(asked), (group, asked)
    assert len(asked) <= len([g for g in groups if holders[g]])


def test_a_member_holding_most_groups_is_asked_first_and_alone_when_it_covers_them() -> None:
    holders = {"shard-0": ["n2", "n3"], "shard-1": ["n3", "n4"], "shard-2": ["n3"], "shard-3": []}
    assert members_to_ask(sorted(holders), holders) == (["n3"], ["shard-3"])


def test_answers_are_merged_each_record_once_oldest_first_within_the_limit() -> None:
    a = {"time_ms": 5, "log_index": 2, "n": 1, "vhost": "/", "queue": "q", "event": "enqueued"}
    b = {"time_ms": 3, "log_index": 1, "n": 1, "vhost": "/", "queue": "r", "event": "published"}
    c = {"time_ms": 9, "log_index": 7, "n": 2, "vhost": "/", "queue": "q", "event": "acked"}
    assert merged([[a, c], [dict(a), b], [c]], 10) == [b, a, c]
    assert merged([[a, c], [b]], 2) == [b, a]


@pytest.mark.parametrize(
    "item",
    [
        None,
        ["queue", "/", "q", 0, None],
        ["name", "/", "q", 0, None, 10],
        ["queue", "/", "q", "0", None, 10],
        ["queue", "/", "q", 0, "later", 10],
        ["queue", "/", "q", 0, None, 0],
        ["queue", "/", "q", 0, None, 10_001],
        ["queue", "/", 7, 0, None, 10],
    ],
)
def test_a_malformed_query_from_a_member_is_refused(item: object) -> None:
    with pytest.raises(ValueError, match="bad trace query"):
        query_from_item(item)


def test_a_query_round_trips_as_an_item() -> None:
    query = query_from_item(["message_id", "/", "m-1", 10, None, 100])
    assert query_from_item(list(query)) == query
