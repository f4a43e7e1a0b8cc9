"""Feature flags (machines/features.py): which features are ready to enable, and the metadata
machine's `EnableFeatures`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines import metadata as md
from maxq_raft.machines.features import SUPPORTED, EnableFeatures, features_to_enable
from maxq_raft.machines.queue_types import Meta, Rejected
from maxq_raft.server.metadata_snapshot import dump_metadata, load_metadata

NAMES = ["a", "b", "c", "d"]
MEMBERS = ["n2", "n3", "n4"]


@given(
    enabled=st.sets(st.sampled_from(NAMES)),
    supported=st.sets(st.sampled_from(NAMES)),
    announced=st.dictionaries(st.sampled_from(MEMBERS), st.sets(st.sampled_from(NAMES))),
    others=st.sets(st.sampled_from(MEMBERS)),
)
def test_a_feature_is_ready_exactly_when_this_code_and_every_other_member_support_it(
    enabled, supported, announced, others
):
    ready = features_to_enable(enabled, supported, announced, others)
    assert ready == sorted(ready)
    expected = {
        name
        for name in supported
        if name not in enabled and all(name in announced.get(member, set()) for member in others)
    }
    assert set(ready) == expected


def test_a_member_of_an_earlier_release_or_not_linked_holds_every_feature_back():
    assert features_to_enable([], ["a", "b"], {"n2": {"a", "b"}}, ["n2", "n3"]) == []
    assert features_to_enable([], ["a", "b"], {"n2": {"a", "b"}, "n3": set()}, ["n2", "n3"]) == []
    assert features_to_enable([], ["a", "b"], {"n2": {"a", "b"}, "n3": {"b"}}, ["n2", "n3"]) == ["b"]
    assert features_to_enable(["b"], ["a", "b"], {"n2": {"a", "b"}, "n3": {"b"}}, ["n2", "n3"]) == []
    assert features_to_enable([], SUPPORTED, {}, []) == sorted(SUPPORTED)  # a single node: all of its own


def test_enabling_keeps_the_order_skips_what_is_enabled_and_refuses_what_is_not_a_name_list():
    machine = md.MetadataMachine()
    assert machine.apply(Meta(1, 0), EnableFeatures(["b", "a", "b"]))[0] is True
    assert machine.features_enabled == ["b", "a"] and machine.feature_enabled("a")
    assert machine.apply(Meta(2, 0), EnableFeatures(["a"]))[0] is False
    assert machine.apply(Meta(3, 0), EnableFeatures(["c", "a"]))[0] is True
    assert machine.features_enabled == ["b", "a", "c"] and not machine.feature_enabled("d")
    for bad in ("abc", [""], [1], None):
        reply, effects = machine.apply(Meta(4, 0), EnableFeatures(bad))  # type: ignore[arg-type]
        assert type(reply) is Rejected and reply.reply_code == 406 and effects == []
    assert machine.features_enabled == ["b", "a", "c"]


def test_enabled_features_are_in_the_snapshot_and_an_older_snapshot_has_none():
    machine = md.MetadataMachine()
    machine.apply(Meta(1, 0), EnableFeatures(["feature_flags", "later"]))
    records = list(dump_metadata(machine))
    assert load_metadata(records).features_enabled == ["feature_flags", "later"]
    del records[0][1]["features_enabled"]  # a header written before feature flags
    assert load_metadata(records).features_enabled == []
