"""x-queue-leader-locator client-local (machines/placement.py): a member's placement of a queue it
is about to declare, recorded in the metadata group before the queue's machine is made."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines import metadata as md
from maxq_raft.machines.placement import PlaceQueue, SetGroups, hash_group, local_group
from maxq_raft.machines.queue_args import QueueArgumentError, validate_queue_arguments
from maxq_raft.machines.queue_types import Meta, Rejected
from maxq_raft.replication.entries import decode_entry, encode_command, encode_entry
from maxq_raft.server.cluster import shard_groups
from maxq_raft.server.metadata_snapshot import dump_metadata, load_metadata

V = "/"
GROUPS = shard_groups(4)
CONNECTION = "n2@5/1"


def placed_machine() -> md.MetadataMachine:
    machine = md.MetadataMachine()
    assert machine.apply(Meta(1, 0), SetGroups([[g, ["n1", "n2", "n3"]] for g in GROUPS]))[0] is True
    return machine


def declare(machine: md.MetadataMachine, name: str, vhost: str = V, arguments: dict | None = None) -> object:
    command = md.DeclareQueue(vhost, name, False, True, False, False, arguments or {}, CONNECTION)
    return machine.apply(Meta(2, 0), command)[0]


def away_from_hash(name: str) -> str:
    """A group other than the one `name` hashes to."""
    return next(g for g in GROUPS if g != hash_group(V, name, GROUPS))


def test_a_placed_queue_is_declared_in_its_placed_group_and_the_placement_is_used_up() -> None:
    machine = placed_machine()
    group = away_from_hash("work")
    assert machine.apply(Meta(2, 0), PlaceQueue(V, "work", group)) == (group, [])
    assert machine.queue_places == {(V, "work"): group}
    record = declare(machine, "work")
    assert type(record) is md.QueueRecord and record.group == group
    assert machine.queue_places == {}
    # declared again from anywhere, and placed again: the record's group stands
    assert declare(machine, "work").group == group
    assert machine.apply(Meta(3, 0), PlaceQueue(V, "work", hash_group(V, "work", GROUPS)))[0] == group


def test_the_first_placement_stands_for_a_second_declarer() -> None:
    machine = placed_machine()
    first, second = GROUPS[1], GROUPS[2]
    assert machine.apply(Meta(2, 0), PlaceQueue(V, "shared", first))[0] == first
    assert machine.apply(Meta(2, 0), PlaceQueue(V, "shared", second))[0] == first
    assert declare(machine, "shared").group == first


def test_a_placement_that_cannot_stand_is_not_recorded_and_answers_the_hash() -> None:
    machine = placed_machine()
    assert machine.apply(Meta(2, 0), PlaceQueue(V, "q", "shard-99"))[0] == hash_group(V, "q", GROUPS)
    # a partition goes where its index puts it (partitions.py), whatever a member asks
    name = "amq.partition-1.orders"
    assert machine.apply(Meta(2, 0), PlaceQueue(V, name, away_from_hash(name)))[0] == hash_group(V, name, GROUPS)
    assert machine.queue_places == {}
    reply = machine.apply(Meta(2, 0), PlaceQueue("nowhere", "q", GROUPS[0]))[0]
    assert type(reply) is Rejected and reply.reply_code == 404
    # before placement is recorded there is no group to answer
    assert md.MetadataMachine().apply(Meta(1, 0), PlaceQueue(V, "q", GROUPS[0]))[0] is None


def test_a_refused_declare_uses_up_its_placement() -> None:
    machine = placed_machine()
    machine.apply(Meta(2, 0), PlaceQueue(V, "amq.reserved", GROUPS[0]))
    assert type(declare(machine, "amq.reserved")) is Rejected
    assert machine.queue_places == {}


def test_unused_placements_stay_until_used_or_their_vhost_or_group_goes() -> None:
    machine = placed_machine()
    machine.apply(Meta(2, 0), md.PutVhost("other"))
    places = [
        (V, "a", GROUPS[0]),
        (V, "b", GROUPS[1]),
        ("other", "d", GROUPS[3]),
        (V, "e", GROUPS[3]),
    ]
    for place in places:
        machine.apply(Meta(2, 0), PlaceQueue(*place))
    # a connection or a node going says nothing of a placement: another member may be declaring
    # the name in that group right now (it was told so), so the placement stays
    machine.apply(Meta(3, 0), md.OwnerDown("n1@1/1"))
    machine.apply(Meta(3, 0), md.OwnerDown("n1@"))
    assert len(machine.queue_places) == 4
    machine.apply(Meta(3, 0), md.DeleteVhost("other"))
    assert set(machine.queue_places) == {(V, "a"), (V, "b"), (V, "e")}
    # a list without shard-3 (it holds no queue): its placements go
    assert machine.apply(Meta(4, 0), SetGroups([[g, ["n1"]] for g in GROUPS[:3]]))[0] is True
    assert set(machine.queue_places) == {(V, "a"), (V, "b")}


def test_a_declare_naming_its_group_is_recorded_there_whatever_became_of_the_placement() -> None:
    machine = placed_machine()
    group = away_from_hash("named")
    command = md.DeclareQueue(V, "named", False, True, False, False, {}, CONNECTION, group)
    assert machine.apply(Meta(2, 0), command)[0].group == group
    # and an earlier release's declare (no group) encodes as it always did
    plain = md.DeclareQueue(V, "plain", False, True, False, False, {}, CONNECTION)
    assert len(encode_command(plain)) == 9 and len(encode_command(command)) == 10
    assert decode_entry(encode_entry(0, [(None, plain)], "n1@1", 1)).items[0][1] == plain
    assert decode_entry(encode_entry(0, [(None, command)], "n1@1", 1)).items[0][1] == command


def test_placements_survive_the_entry_encoding_and_the_metadata_snapshot() -> None:
    machine = placed_machine()
    command = PlaceQueue(V, "q", GROUPS[2])
    assert decode_entry(encode_entry(0, [(None, command)], "n1@1", 1)).items[0][1] == command
    machine.apply(Meta(2, 0), command)
    restored = load_metadata(dump_metadata(machine))
    assert restored.queue_places == {(V, "q"): GROUPS[2]}
    assert declare(restored, "q").group == GROUPS[2]


@given(
    name=st.text(max_size=12),
    led=st.sets(st.sampled_from(GROUPS)),
    held=st.sets(st.sampled_from(GROUPS)),
)
def test_a_member_places_in_a_group_it_leads_else_one_it_holds(name: str, led: set, held: set) -> None:
    group = local_group(V, name, GROUPS, led.__contains__, (held | led).__contains__)
    if led:
        assert group in led
    elif held:
        assert group in held
    else:
        assert group is None
    assert group == local_group(V, name, GROUPS, led.__contains__, (held | led).__contains__)


@pytest.mark.parametrize("value", ["client-local", "balanced", "random", "least-leaders"])
def test_rabbitmqs_locators_are_accepted(value: str) -> None:
    validate_queue_arguments(V, "q", {"x-queue-leader-locator": value})


@pytest.mark.parametrize(
    ("value", "error"), [("nearest", "invalid_queue_locator_arg"), (3, "{unacceptable_type,signedint}")]
)
def test_another_locator_is_refused_as_rabbitmq_refuses_it(value: object, error: str) -> None:
    with pytest.raises(QueueArgumentError) as refused:
        validate_queue_arguments(V, "q", {"x-queue-leader-locator": value})
    assert refused.value.reply_text == f"invalid arg 'x-queue-leader-locator' for queue 'q' in vhost '/': {error}"


def test_the_policy_key_stands_for_the_argument() -> None:
    machine = placed_machine()
    reply, _ = machine.apply(
        Meta(2, 0), md.SetPolicy(V, "local", "^work", {"queue-leader-locator": "client-local"}, 0, "queues")
    )
    assert reply is True
    assert machine.arguments_under_policies(V, "work", {})["x-queue-leader-locator"] == "client-local"
    bad = machine.apply(Meta(2, 0), md.SetPolicy(V, "bad", "^x", {"queue-leader-locator": "far"}, 0, "queues"))[0]
    assert type(bad) is Rejected and bad.reply_code == 406 and "invalid_queue_locator_arg" in bad.reply_text
