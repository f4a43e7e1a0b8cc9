"""A member's consumers of a queue whose machine is on other members are told of its deletion
when its record goes from the metadata, whether or not the word from the group's leader ("q",
server/remote.py) came: a link that drops loses it, and the resync after the gap does not
carry it, so such a consumer stayed, consuming nothing, and its client never heard of it."""

from __future__ import annotations

from typing import Any

from maxq_raft.machines import commands as qc
from maxq_raft.machines import metadata as md
from maxq_raft.machines.placement import SetGroups
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import Meta
from maxq_raft.machines.shard import MetaGroup
from maxq_raft.server.applier import Applier
from maxq_raft.server.broker import Broker, ConsumerHandle


class Submits:
    """What the applier and the broker propose (a cluster log's part here)."""

    def __init__(self) -> None:
        self.submitted: list[tuple[Any, Any, str | None]] = []

    def submit(self, target: Any, command: Any, then: Any, group: str | None = None) -> None:
        self.submitted.append((target, command, group))

    def holds_queue(self, key: tuple[str, str]) -> bool:
        return False  # (its group is held by other members)


class Channel:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.told: list[str] = []

    def consumer_gone(self, handle: ConsumerHandle) -> None:
        self.told.append(handle.tag)


def member_with_queue(group: str) -> tuple[Broker, Applier, Submits, Channel]:
    """Member n1 with the record of queue "q" (placed in `group`) and a consumer of it on a channel here."""
    broker = Broker("n1")
    broker.groups = {md.META_GROUP: MetaGroup()}
    submits = Submits()
    broker.log = submits
    applier = Applier(broker, submits)
    groups = SetGroups([[f"shard-{i}", ["n2", "n3", "n4"]] for i in range(5)])  # (none on n1)
    applier.apply(broker.groups[md.META_GROUP], Meta(1, 0), None, groups, "n2@1", False, None)
    declare = md.DeclareQueue("/", "q", False, True, False, False, {}, "", group)
    applier.apply(broker.groups[md.META_GROUP], Meta(2, 0), None, declare, "n2@1", False, None)
    assert broker.meta.queue("/", "q").group == group
    channel = Channel(broker)
    broker.consumers["n1@1/1/ctag"] = ConsumerHandle("n1@1/1/ctag", "ctag", channel, ("/", "q"), False)
    return broker, applier, submits, channel


def delete_record(broker: Broker, applier: Applier) -> None:
    command = md.DeleteQueueRecord("/", "q")
    applier.apply(broker.groups[md.META_GROUP], Meta(3, 0), None, command, "n2@1", False, None)


def test_a_consumer_of_a_queue_held_elsewhere_is_told_when_its_record_goes_and_cancelled_in_its_group() -> None:
    broker, applier, submits, channel = member_with_queue("shard-3")
    delete_record(broker, applier)
    assert channel.told == ["ctag"]
    assert broker.consumers == {}
    assert submits.submitted == [(("/", "q"), qc.Cancel("n1@1/1/ctag"), "shard-3")]  # (the record's group: gone now)
    delete_record(broker, applier)  # (a second word of it: nothing is left to tell)
    assert channel.told == ["ctag"] and len(submits.submitted) == 1


def test_a_consumer_told_by_the_groups_leader_is_not_told_again() -> None:
    broker, applier, submits, channel = member_with_queue("shard-3")
    broker.queue_consumers_gone(("/", "q"))  # the leader's "q" came first (cluster.py)
    delete_record(broker, applier)
    assert channel.told == ["ctag"] and submits.submitted == []


def test_a_queue_whose_machine_is_here_is_left_to_its_machine() -> None:
    """A member holding the group: its own shard's deletion tells them (the record may go first:
    an exclusive queue's owner closed, or the metadata committed before the shard here)."""
    broker, applier, submits, channel = member_with_queue("shard-3")
    broker.queues[("/", "q")] = QueueMachine("/", "q")
    delete_record(broker, applier)
    assert channel.told == [] and submits.submitted == []
    assert "n1@1/1/ctag" in broker.consumers


def test_other_queues_consumers_stay() -> None:
    broker, applier, submits, channel = member_with_queue("shard-3")
    broker.consumers["n1@1/1/other"] = ConsumerHandle("n1@1/1/other", "other", channel, ("/", "q2"), False)
    delete_record(broker, applier)
    assert channel.told == ["ctag"] and list(broker.consumers) == ["n1@1/1/other"]
    assert [command for _target, command, _group in submits.submitted] == [qc.Cancel("n1@1/1/ctag")]
