"""`missing_features`: what a node about to be added lacks of the enabled feature flags (the
admin API refuses such a node: POST /api/cluster/members). The engine and metadata are stand-ins
holding what the real ones report; process tests: tests/upgrade/test_rolling_upgrade.py."""

from __future__ import annotations

from types import SimpleNamespace

import trio

from maxq_raft.http import feature_flags_api


class Engine:
    def __init__(self, announced: dict[str, frozenset[str]], after_polls: int = 0, linked: tuple = ("n4",)) -> None:
        self.announced = announced
        self.polls_left = after_polls  # announcements arrive after this many reads
        self.linked = linked

    def peer_linked(self, node_id: str) -> bool:
        return node_id in self.linked

    def peer_features(self) -> dict[str, frozenset[str]]:
        if self.polls_left:
            self.polls_left -= 1
            return {}
        return dict(self.announced)


def broker(enabled: list[str], engine: Engine | None) -> SimpleNamespace:
    return SimpleNamespace(meta=SimpleNamespace(features_enabled=enabled), log=SimpleNamespace(replication_node=engine))


def missing(b: SimpleNamespace, name: str) -> list[str] | None:
    return trio.run(feature_flags_api.missing_features, b, name)


def test_a_node_lacking_an_enabled_feature_is_named_with_what_it_lacks():
    engine = Engine({"n4": frozenset({"feature_flags"})}, after_polls=3)
    assert missing(broker(["feature_flags", "maintenance_mode"], engine), "n4") == ["maintenance_mode"]
    assert missing(broker(["feature_flags"], engine), "n4") == []
    assert missing(broker(["feature_flags"], Engine({"n4": frozenset()})), "n4") == ["feature_flags"]


def test_nothing_is_checked_before_any_feature_is_enabled_or_on_a_single_node():
    assert missing(broker([], Engine({})), "n4") == []
    assert missing(broker(["feature_flags"], None), "n4") == []


def test_a_linked_node_that_announces_nothing_in_time_is_none(monkeypatch):
    monkeypatch.setattr(feature_flags_api, "ANNOUNCE_WAIT_S", 0.3)
    assert missing(broker(["feature_flags"], Engine({"n5": frozenset({"feature_flags"})})), "n4") is None


def test_a_node_with_no_link_here_is_left_to_the_engine_which_refuses_an_unreachable_one(monkeypatch):
    monkeypatch.setattr(feature_flags_api, "ANNOUNCE_WAIT_S", 0.3)
    assert missing(broker(["feature_flags"], Engine({}, linked=())), "n4") == []
