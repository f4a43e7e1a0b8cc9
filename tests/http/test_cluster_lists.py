"""What a member answers another's question about its clients (http/cluster_lists.py `answer`):
its own items, or why not; closing one of its connections only for the user it names. (End to
end, over real members: tests/cluster/test_cluster_lists.py.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from maxq_raft.http import cluster_lists


class Session:
    def __init__(self, user: str) -> None:
        self.user = user
        self.closed_with: str | None = None

    def force_close(self, reason: str) -> None:
        self.closed_with = reason


def broker_with(sessions: dict[str, Session]) -> SimpleNamespace:
    return SimpleNamespace(sessions=sessions, consumers={}, node_id="n1")


def test_a_list_of_an_unknown_kind_is_answered_why_not() -> None:
    broker = broker_with({})
    assert cluster_lists.answer(broker, "lv", ["totals"]) == [[{"connections": 0, "channels": 0, "consumers": 0}], None]
    for asked in (["queues"], [7], []):
        items, why = cluster_lists.answer(broker, "lv", asked)
        assert items is None and why


def test_a_connection_is_closed_only_for_the_user_named() -> None:
    ann = Session("ann")
    broker = broker_with({"n1@x.1": ann})
    assert cluster_lists.answer(broker, "lx", ["n1@x.2", "r", None]) == [cluster_lists.NOT_FOUND]
    assert cluster_lists.answer(broker, "lx", ["n1@x.1", "r", "bob"]) == [cluster_lists.FORBIDDEN]
    assert ann.closed_with is None
    assert cluster_lists.answer(broker, "lx", ["n1@x.1", "moved", "ann"]) == [cluster_lists.CLOSED]
    assert ann.closed_with == "moved"
    other = Session("bob")
    broker.sessions["n1@x.3"] = other
    assert cluster_lists.answer(broker, "lx", ["n1@x.3", "x" * 500, None]) == [cluster_lists.CLOSED]
    assert other.closed_with == "x" * 200  # (bounded: it goes into connection.close's text)
    broker.sessions["n1@x.4"] = wide = Session("bob")
    assert cluster_lists.answer(broker, "lx", ["n1@x.4", "é" * 150, None]) == [cluster_lists.CLOSED]
    assert wide.closed_with == "é" * 100  # (200 bytes: a shortstr holds 255)


@pytest.mark.parametrize("asked", [[], ["n1@x.1"], [1, "r", None], ["n1@x.1", 2, None]])
def test_a_malformed_close_request_is_refused(asked: list) -> None:
    with pytest.raises(ValueError):
        cluster_lists.answer(broker_with({"n1@x.1": Session("ann")}), "lx", asked)
