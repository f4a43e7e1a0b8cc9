"""Maintenance mode's pure parts (machines/maintenance.py) and the metadata machine's record."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines import metadata as md
from maxq_raft.machines.maintenance import SetMaintenance, drain_refusal, leader_target
from maxq_raft.machines.queue_types import Meta, Rejected
from maxq_raft.server.metadata_snapshot import dump_metadata, load_metadata

MEMBERS = ["n1", "n2", "n3", "n4"]


def test_drain_and_revive_are_recorded_once_in_order_and_kept_in_the_snapshot():
    machine = md.MetadataMachine()
    assert machine.apply(Meta(1, 0), SetMaintenance("n3", True))[0] is True
    assert machine.apply(Meta(2, 0), SetMaintenance("n3", True))[0] is False
    assert machine.apply(Meta(3, 0), SetMaintenance("n1", True))[0] is True
    assert machine.draining == ["n3", "n1"]
    assert load_metadata(list(dump_metadata(machine))).draining == ["n3", "n1"]
    assert machine.apply(Meta(4, 0), SetMaintenance("n3", False))[0] is True
    assert machine.apply(Meta(5, 0), SetMaintenance("n3", False))[0] is False
    assert machine.draining == ["n1"]
    for bad in (SetMaintenance("", True), SetMaintenance("n2", 1), SetMaintenance(None, False)):  # type: ignore[arg-type]
        reply, effects = machine.apply(Meta(6, 0), bad)
        assert type(reply) is Rejected and reply.reply_code == 406 and effects == []
    assert machine.draining == ["n1"]


def test_a_drain_needs_a_member_and_another_member_left_serving():
    assert drain_refusal("n3", ["n1", "n2", "n3"], []) is None
    assert "not a member" in drain_refusal("n9", ["n1", "n2", "n3"], [])
    assert "no member" in drain_refusal("n3", ["n1", "n2", "n3"], ["n1", "n2"])
    assert drain_refusal("n3", ["n1", "n2", "n3"], ["n1", "n3"]) is None  # (already drained: no harm)


@given(
    candidates=st.sets(st.sampled_from(MEMBERS)),
    draining=st.sets(st.sampled_from(MEMBERS)),
    up=st.sets(st.sampled_from(MEMBERS)),
    leads=st.dictionaries(st.sampled_from(MEMBERS), st.integers(0, 5)),
)
def test_a_leadership_goes_to_a_member_up_not_drained_leading_fewest(candidates, draining, up, leads):
    target = leader_target(sorted(candidates), draining, up, leads)
    fit = [m for m in candidates if m in up and m not in draining]
    if not fit:
        assert target is None
        return
    assert target in fit
    assert leads.get(target, 0) == min(leads.get(m, 0) for m in fit)
    assert target == leader_target(sorted(candidates, reverse=True), draining, up, leads)  # order does not choose
