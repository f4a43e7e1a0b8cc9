"""Placements of new queues (PlaceQueue) against a reference model: a stateful hypothesis test of
the metadata machine's part of x-queue-leader-locator (machines/placement.py).

The model: the first placement of a name not declared yet stands until a declare of the name
uses it (made or refused), its vhost goes or its group leaves the list; a declare records the
group it names, else the placement, else the hash. Invariants: no name is both placed and
declared, every placement is in a listed group, and a snapshot restores the same placements."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from maxq_raft.machines import metadata as md
from maxq_raft.machines.placement import PlaceQueue, SetGroups, hash_group
from maxq_raft.machines.queue_types import Meta, Rejected
from maxq_raft.server.cluster import shard_groups
from maxq_raft.server.metadata_snapshot import dump_metadata, load_metadata

ALL_GROUPS = shard_groups(4)
VHOSTS = ["/", "v"]
NAMES = ["a", "b", "c", "amq.reserved"]
MEMBERS = ["n1", "n2", "n3"]


class Placements(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machine = md.MetadataMachine()
        self.machine.apply(Meta(1, 0), md.PutVhost("v"))
        self.groups = list(ALL_GROUPS)
        assert self.machine.apply(Meta(1, 0), SetGroups([[g, MEMBERS] for g in self.groups]))[0] is True
        self.places: dict[tuple[str, str], str] = {}  # the model: (vhost, name) -> placed group
        self.queues: dict[tuple[str, str], str] = {}  # (vhost, name) -> recorded group
        self.vhosts = set(VHOSTS)

    def apply(self, command: object) -> object:
        return self.machine.apply(Meta(2, 0), command)[0]

    @rule(vhost=st.sampled_from(VHOSTS), name=st.sampled_from(NAMES), group=st.sampled_from([*ALL_GROUPS, "shard-9"]))
    def place(self, vhost: str, name: str, group: str) -> None:
        key = (vhost, name)
        reply = self.apply(PlaceQueue(vhost, name, group))
        if vhost not in self.vhosts:
            assert type(reply) is Rejected and reply.reply_code == 404
        elif key in self.queues:
            assert reply == self.queues[key]
        elif key in self.places:
            assert reply == self.places[key]  # the first placement stands
        elif group in self.groups:
            assert reply == group
            self.places[key] = group
        else:
            assert reply == hash_group(vhost, name, self.groups)  # (not recorded)

    @rule(vhost=st.sampled_from(VHOSTS), name=st.sampled_from(NAMES), named=st.sampled_from([None, *ALL_GROUPS]))
    def declare(self, vhost: str, name: str, named: str | None) -> None:
        key = (vhost, name)
        reply = self.apply(md.DeclareQueue(vhost, name, False, True, False, False, {}, "n2@1/1", named))
        if vhost not in self.vhosts:
            assert type(reply) is Rejected
            return
        if key in self.queues:
            assert reply.group == self.queues[key]
            return
        placed = self.places.pop(key, None)  # used, made or refused
        if name.startswith("amq."):
            assert type(reply) is Rejected and reply.reply_code == 403
            return
        if named is not None and named in self.groups:
            expected = named
        elif placed is not None:
            expected = placed
        else:
            expected = hash_group(vhost, name, self.groups)
        assert type(reply) is md.QueueRecord and reply.group == expected
        self.queues[key] = expected

    @rule(vhost=st.sampled_from(VHOSTS), name=st.sampled_from(NAMES))
    def delete(self, vhost: str, name: str) -> None:
        key = (vhost, name)
        reply = self.apply(md.DeleteQueueRecord(vhost, name))
        assert (reply is True) == (key in self.queues), reply
        self.queues.pop(key, None)

    @rule(owner=st.sampled_from(["n1@1/1", "n1@", "n2@1/1"]))
    def owner_down(self, owner: str) -> None:
        self.apply(md.OwnerDown(owner))  # (placements stay: a declare may be using them)

    @rule()
    def drop_an_empty_group(self) -> None:
        holding = set(self.queues.values())
        empty = [g for g in self.groups if g not in holding]
        if len(self.groups) < 2 or not empty:
            return
        self.groups.remove(empty[-1])
        assert self.apply(SetGroups([[g, MEMBERS] for g in self.groups])) is True
        self.places = {key: group for key, group in self.places.items() if group in self.groups}

    @rule()
    def delete_vhost_v(self) -> None:
        if "v" not in self.vhosts:
            return
        assert self.apply(md.DeleteVhost("v")) is True
        self.vhosts.discard("v")
        self.places = {key: g for key, g in self.places.items() if key[0] != "v"}
        self.queues = {key: g for key, g in self.queues.items() if key[0] != "v"}

    @invariant()
    def the_machine_holds_the_models_placements(self) -> None:
        assert self.machine.queue_places == self.places
        assert not set(self.places) & set(self.queues)
        assert all(group in self.groups for group in self.places.values())

    @invariant()
    def a_snapshot_restores_them(self) -> None:
        assert load_metadata(dump_metadata(self.machine)).queue_places == self.machine.queue_places


TestPlacements = Placements.TestCase
TestPlacements.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
