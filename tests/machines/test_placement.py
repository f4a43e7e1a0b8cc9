"""Placement recorded in the metadata group (machines/placement.py): the shard groups with their
replicas, and the group each queue record carries."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines import metadata as md
from maxq_raft.machines.placement import FirstGroups, SetGroups, groups_refusal, hash_group
from maxq_raft.machines.queue_types import Meta, Rejected
from maxq_raft.replication.entries import decode_entry, encode_entry
from maxq_raft.server.cluster import shard_groups, shard_of
from maxq_raft.server.metadata_snapshot import dump_metadata, load_metadata

V = "/"
EVERYWHERE = ["n1", "n2", "n3"]


def declare(machine: md.MetadataMachine, name: str, vhost: str = V) -> md.QueueRecord:
    reply, _ = machine.apply(Meta(1, 0), md.DeclareQueue(vhost, name, False, True, False, False, {}, "n1@1/1"))
    assert type(reply) is md.QueueRecord
    return reply


def groups_of(count: int, members: list[str] = EVERYWHERE) -> list:
    return [[group, list(members)] for group in shard_groups(count)]


@given(vhost=st.text(max_size=8), name=st.text(max_size=20), count=st.integers(1, 64))
def test_the_recorded_hash_is_the_one_queues_had_before(vhost: str, name: str, count: int) -> None:
    assert hash_group(vhost, name, shard_groups(count)) == shard_of((vhost, name), count)


def test_the_first_list_places_every_queue_where_its_name_hashed_and_later_queues_follow_it() -> None:
    machine = md.MetadataMachine()
    before = [declare(machine, f"q{i}") for i in range(20)]
    assert all(record.group is None for record in before)  # (no list yet: the hash decides)
    assert machine.apply(Meta(2, 0), SetGroups(groups_of(4)))[0] is True
    assert [record.group for record in before] == [shard_of((V, f"q{i}"), 4) for i in range(20)]
    assert machine.apply(Meta(3, 0), SetGroups(groups_of(4)))[0] is False  # (already so)
    after = declare(machine, "later")
    assert after.group == shard_of((V, "later"), 4)
    assert sum(machine.queues_per_group().values()) == 21
    # A new list (here: fewer members) moves no queue; a queue declared again keeps its record.
    assert machine.apply(Meta(4, 0), SetGroups(groups_of(4, ["n1", "n2"])))[0] is True
    assert machine.shard_groups == {group: ["n1", "n2"] for group in shard_groups(4)}
    assert declare(machine, "q3").group == shard_of((V, "q3"), 4)


def test_a_list_that_drops_a_group_holding_queues_is_refused_and_changes_nothing() -> None:
    machine = md.MetadataMachine()
    machine.apply(Meta(1, 0), SetGroups(groups_of(2)))
    record = declare(machine, "held")
    others = [group for group in shard_groups(2) if group != record.group]
    reply, effects = machine.apply(Meta(2, 0), SetGroups([[others[0], EVERYWHERE]]))
    assert type(reply) is Rejected and reply.reply_code == 406 and effects == []
    assert f"shard group {record.group} still holds 1 queues" in reply.reply_text
    assert list(machine.shard_groups) == shard_groups(2)
    machine.apply(Meta(3, 0), md.DeleteQueueRecord(V, "held"))
    assert machine.apply(Meta(4, 0), SetGroups([[others[0], EVERYWHERE]]))[0] is True  # empty now: it may go


@pytest.mark.parametrize(
    "groups, text",
    [
        ([], "non-empty list"),
        ("shard-0", "non-empty list"),
        ([["shard-0"]], "[name, [member, ...]]"),
        ([["shard-0", ["n1"]], ["shard-0", ["n2"]]], "distinct names"),
        ([["", ["n1"]]], "distinct names"),
        ([["shard-0", []]], "distinct member names"),
        ([["shard-0", ["n1", "n1"]]], "distinct member names"),
        ([["shard-0", ["n1", 7]]], "distinct member names"),
        ([["shard-0", "n1"]], "distinct member names"),
    ],
)
def test_a_malformed_list_is_refused_by_name(groups: object, text: str) -> None:
    assert text in (groups_refusal(groups, {}) or "")
    machine = md.MetadataMachine()
    reply, _ = machine.apply(Meta(1, 0), SetGroups(groups))  # type: ignore[arg-type]
    assert type(reply) is Rejected and reply.reply_code == 406 and machine.shard_groups == {}


def test_the_record_travels_in_log_entries_and_snapshots_and_old_snapshots_load_without_it() -> None:
    command = SetGroups(groups_of(3))
    assert decode_entry(encode_entry(0, [(None, command)], "n1@1", 1)).items[0][1] == command
    machine = md.MetadataMachine()
    declare(machine, "before")
    machine.apply(Meta(1, 0), SetGroups(groups_of(3)))
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_metadata(machine)]
    restored = load_metadata(records)
    assert restored.shard_groups == machine.shard_groups
    assert restored.queue(V, "before") == machine.queue(V, "before") and restored.queue(V, "before").group
    # As an earlier release wrote it: no "shard_groups" in the header, queue records of 7 fields.
    old = [list(r) for r in records]
    del old[0][1]["shard_groups"]
    for record in old:
        if record[0] == "queue":
            del record[7]
    restored = load_metadata(old)
    assert restored.shard_groups == {} and restored.queue(V, "before").group is None


def test_the_first_placement_proposed_stands_and_later_choices_change_nothing() -> None:
    machine = md.MetadataMachine()
    waiting = declare(machine, "early")  # (a queue declared before any record: placed by the first)
    chosen = [[group, ["n1", "n2", "n3"]] for group in shard_groups(3)]
    other = [[group, ["n3", "n4"]] for group in shard_groups(3)]
    reply, effects = machine.apply(Meta(1, 0), FirstGroups([[]]))  # type: ignore[list-item]
    assert type(reply) is Rejected and reply.reply_code == 406 and effects == [] and machine.shard_groups == {}
    assert machine.apply(Meta(2, 0), FirstGroups(chosen))[0] is True
    assert waiting.group == shard_of((V, "early"), 3)
    assert machine.apply(Meta(3, 0), FirstGroups(other))[0] is False  # another member's, later: ignored
    assert machine.shard_groups == {group: ["n1", "n2", "n3"] for group in shard_groups(3)}
    assert machine.apply(Meta(4, 0), SetGroups(other))[0] is True  # (the record then follows the engine)
    # It travels in an entry like any metadata command.
    assert decode_entry(encode_entry(0, [(None, FirstGroups(chosen))], "n1@1", 1)).items[0][1] == FirstGroups(chosen)
