"""Consumer pause and resume in the queue machine (consumer_pauses.py), against a reference.

The model keeps only the set of rules. After every command: no delivery went to a consumer a
rule covers; each consumer's `paused` is exactly "a rule covers it"; a pause leaves every
consumer's unacked deliveries where they were; and nothing waits while a consumer no rule
covers has room (a resume hands out at once). A snapshot round trip keeps rules and flags.
"""

from __future__ import annotations

import msgpack
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from maxq_raft.machines.commands import Cancel, Checkout, Enqueue, PauseConsumers, Settle
from maxq_raft.machines.consumer_pauses import PAUSE_RULES_MAX
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import Deliver, Meta, Rejected
from maxq_raft.machines.snapshot import dump_queue, load_queue

from .test_queue_machine import DictBacking

# consumer id -> (owner, tag): tag "t0" on two connections, two channels of connection n1@1
CONSUMERS = {
    "n1@1/1/t0": ("n1@1/1", "t0"),
    "n1@1/2/t1": ("n1@1/2", "t1"),
    "n2@7/1/t0": ("n2@7/1", "t0"),
}
RULES = [("queue", ""), ("tag", "t0"), ("tag", "t1"), ("connection", "n1@1"), ("connection", "n2@7")]


def covers(rules: set[tuple[str, str]], consumer_id: str) -> bool:
    owner, tag = CONSUMERS[consumer_id]
    return ("queue", "") in rules or ("tag", tag) in rules or ("connection", owner.rpartition("/")[0]) in rules


class Pauses(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.machine = QueueMachine("/", "q")
        self.rules_model: set[tuple[str, str]] = set()
        self.index = 0
        self.bodies = 0

    def apply(self, command):
        self.index += 1
        before = {cid: set(c.checked_out) for cid, c in self.machine.consumers.items()}
        reply, effects = self.machine.apply(Meta(self.index, 1_000 + self.index), command)
        self.machine.check_invariants()
        for effect in effects:
            if type(effect) is Deliver:
                assert not covers(self.rules_model, effect.consumer_id), f"delivered to paused {effect.consumer_id}"
        if type(command) is PauseConsumers:
            for cid, seqs in before.items():
                consumer = self.machine.consumers.get(cid)
                # a pause hands nothing back; a resume may only add deliveries
                assert consumer is not None and seqs <= set(consumer.checked_out)
                if command.paused:
                    assert seqs == set(consumer.checked_out)
        return reply, effects

    @rule(cid=st.sampled_from(sorted(CONSUMERS)), prefetch=st.integers(0, 3), no_ack=st.booleans())
    def checkout(self, cid, prefetch, no_ack) -> None:
        consumer = self.machine.consumers.get(cid)
        if consumer is not None and consumer.active:
            return
        owner, _ = CONSUMERS[cid]
        reply, _ = self.apply(Checkout(cid, owner, prefetch, no_ack, 0, False, 1000))
        assert reply is True
        assert self.machine.consumers[cid].paused == covers(self.rules_model, cid)

    @rule(cid=st.sampled_from(sorted(CONSUMERS)))
    def cancel(self, cid) -> None:
        self.apply(Cancel(cid))

    @rule(n=st.integers(1, 4))
    def enqueue(self, n) -> None:
        start, self.bodies = self.bodies, self.bodies + n
        self.apply(Enqueue([Message("", "q", b"\x00\x00", b"m%d" % i, False) for i in range(start, start + n)]))

    @rule(cid=st.sampled_from(sorted(CONSUMERS)))
    def settle_all(self, cid) -> None:
        consumer = self.machine.consumers.get(cid)
        if consumer is not None and consumer.checked_out:
            self.apply(Settle(cid, list(consumer.checked_out)))

    @rule(which=st.sampled_from(RULES), paused=st.booleans())
    def pause(self, which, paused) -> None:
        scope, key = which
        if paused:
            self.rules_model.add(which)
        else:
            self.rules_model.discard(which)
        reply, _ = self.apply(PauseConsumers(scope, key, paused))
        assert reply == sum(
            1 for cid, c in self.machine.consumers.items() if c.active and covers(self.rules_model, cid)
        )

    @invariant()
    def flags_follow_the_rules(self) -> None:
        assert self.machine.pause_rules == self.rules_model
        for cid, consumer in self.machine.consumers.items():
            assert consumer.paused == covers(self.rules_model, cid)

    @invariant()
    def nothing_waits_for_a_free_consumer_with_room(self) -> None:
        if self.machine.ready_count:
            assert not any(c.has_room() for c in self.machine.consumers.values())

    def teardown(self) -> None:
        records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(self.machine)]
        restored = load_queue(records, backing=None)
        restored.check_invariants()
        assert restored.pause_rules == self.machine.pause_rules
        assert {cid: c.paused for cid, c in restored.consumers.items()} == {
            cid: c.paused for cid, c in self.machine.consumers.items()
        }


Pauses.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestPauses = Pauses.TestCase


def meta(index: int) -> Meta:
    return Meta(index, 1_000 + index)


def test_malformed_pauses_are_refused_and_change_nothing() -> None:
    machine = QueueMachine("/", "q")
    for bad in (
        PauseConsumers("everything", "", True),
        PauseConsumers("queue", "x", True),  # the queue scope has no key
        PauseConsumers("tag", "", True),  # the others need one
        PauseConsumers("tag", "t", 1),  # type: ignore[arg-type]
        PauseConsumers("tag", 5, True),  # type: ignore[arg-type]
    ):
        reply, effects = machine.apply(meta(1), bad)
        assert type(reply) is Rejected and reply.reply_code == 541 and effects == []
    assert machine.pause_rules == set()


def test_rules_are_bounded_per_queue() -> None:
    machine = QueueMachine("/", "q")
    for i in range(PAUSE_RULES_MAX):
        assert machine.apply(meta(i + 1), PauseConsumers("tag", f"t{i}", True))[0] == 0
    reply, _ = machine.apply(meta(PAUSE_RULES_MAX + 1), PauseConsumers("tag", "one-more", True))
    assert type(reply) is Rejected and reply.reply_code == 406
    # pausing again what is paused, and resuming, still work at the bound
    assert machine.apply(meta(PAUSE_RULES_MAX + 2), PauseConsumers("tag", "t0", True))[0] == 0
    assert machine.apply(meta(PAUSE_RULES_MAX + 3), PauseConsumers("tag", "t0", False))[0] == 0
    assert len(machine.pause_rules) == PAUSE_RULES_MAX - 1


def test_a_resume_delivers_in_order_from_where_the_pause_stopped() -> None:
    machine = QueueMachine("/", "q")
    machine.apply(meta(1), Checkout("n1@1/1/c", "n1@1/1", 2, False, 0, False, 1000))
    _, effects = machine.apply(meta(2), Enqueue([Message("", "q", b"\x00\x00", b"%d" % i, False) for i in range(5)]))
    assert [e.message.body for e in effects] == [b"0", b"1"]  # prefetch 2
    machine.apply(meta(3), PauseConsumers("queue", "", True))
    _, effects = machine.apply(meta(4), Settle("n1@1/1/c", [0, 1]))  # acks still count while paused
    assert effects == [] and machine.unacked_count == 0 and machine.ready_count == 3
    _, effects = machine.apply(meta(5), PauseConsumers("queue", "", False))
    assert [e.message.body for e in effects] == [b"2", b"3"]


def test_a_dump_without_pause_rules_loads_with_none() -> None:
    machine = QueueMachine("/", "q")
    records = list(dump_queue(machine))
    assert records[0][1].pop("pause_rules") == []
    assert load_queue(records, backing=None).pause_rules == set()


def test_a_durable_queue_keeps_its_rules_in_its_backing_for_a_restart() -> None:
    backing = DictBacking()
    machine = QueueMachine("/", "q", backing=backing, durable=True)
    machine.apply(meta(1), PauseConsumers("tag", "t", True))
    machine.apply(meta(2), PauseConsumers("queue", "", True))
    machine.apply(meta(3), PauseConsumers("tag", "t", False))
    assert backing.pauses_stored() == [("queue", "")]
    restarted = QueueMachine("/", "q", backing=backing, durable=True)
    restarted.recover_pauses()
    restarted.apply(meta(4), Checkout("n1@1/1/c", "n1@1/1", 0, True, 0, False, 10))
    assert restarted.paused_consumer_count == 1
    transient = QueueMachine("/", "t", backing=DictBacking(), durable=False)
    transient.apply(meta(1), PauseConsumers("queue", "", True))
    assert transient.backing.pauses_stored() == []  # type: ignore[union-attr]  # nothing kept: gone at a restart anyway
