"""SQS FIFO queues in the queue machine (machines/fifo.py): examples, then a stateful test.

The examples: deduplication within the window (by id, within one batch, a refused send not
remembered), the window pruned by the log's time and carried by snapshots, sequence numbers,
groups held while in flight and released in order, AMQP consumers refused, the settings that
cannot change. The stateful test drives a FIFO queue with a tiny in-memory window (so messages
spill to a backing and come back) through random sends, receives, deletes, visibility changes,
time and snapshot round trips, against a model of SQS's rules: every receive hands out, for
each group it touches, the group's oldest messages in order and only groups with nothing in
flight; a duplicate within 5 minutes gets the first send's id and number and is not queued;
nothing sent is lost.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from maxq_raft.machines import fifo
from maxq_raft.machines.commands import (
    ChangeVisibility,
    Checkout,
    DeleteReceived,
    Enqueue,
    EnqueueFifo,
    Get,
    Receive,
    Tick,
    UpdateSettings,
)
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueArgumentError, QueueSettings, parse_queue_arguments
from maxq_raft.machines.queue_types import HandleResult, Meta, Overflowed, Rejected
from maxq_raft.machines.snapshot import dump_queue, load_queue

from .test_queue_machine import DictBacking

WINDOW = fifo.DEDUP_WINDOW_MS


class FifoBacking(DictBacking):
    """DictBacking that also keeps what the store's FIFO flag keeps: group id, sequence number
    (the deduplication window's records are DictBacking's own)."""

    def __init__(self) -> None:
        super().__init__()
        self.fifo: dict[int, tuple[str | None, int | None]] = {}

    def write(self, messages: list) -> None:
        super().write(messages)
        for m in messages:
            self.fifo[m.seq] = (m.group_id, m.sequence_number)

    def load(self, seq_from: int, limit: int, seq_below: int | None = None) -> list:
        loaded = super().load(seq_from, limit, seq_below)
        for m in loaded:
            m.group_id, m.sequence_number = self.fifo[m.seq]
        return loaded


class Clocked:
    def __init__(self, machine: QueueMachine | None = None, **fields) -> None:
        self.machine = machine or QueueMachine("/", "q.fifo", settings=QueueSettings(fifo=True, **fields))
        self.index = 0

    def __call__(self, time_ms: int, command):
        self.index += 1
        reply, effects = self.machine.apply(Meta(self.index, time_ms), command)
        self.machine.check_invariants()
        return reply, effects

    def send(self, time_ms: int, *sends: tuple[bytes, str, str | None]):
        """`sends`: (body, group, dedup id); message ids are "id-<body>"."""
        messages = [Message("", "q.fifo", b"", body, persistent=True) for body, _, _ in sends]
        fields = [(group, dedup, f"id-{body.decode()}") for body, group, dedup in sends]
        return self(time_ms, EnqueueFifo(messages, fields))[0]

    def receive(self, time_ms: int, max_count: int = 10, visibility_ms: int = 30_000) -> list:
        reply, _ = self(time_ms, Receive(max_count, visibility_ms))
        assert type(reply) is list, reply
        return reply


def bodies(received: list) -> list[bytes]:
    return [r.message.body for r in received]


def round_trip(machine: QueueMachine, backing=None) -> QueueMachine:
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(machine)]
    restored = load_queue(records, backing=backing)
    restored.check_invariants()
    return restored


# ------------------------------------------------------------------ deduplication


def test_a_duplicate_within_the_window_gets_the_first_sends_id_and_number_and_is_not_queued() -> None:
    q = Clocked()
    assert q.send(1_000, (b"a", "g", "d1"), (b"b", "g", "d2")) == [("id-a", 1), ("id-b", 2)]
    assert q.send(2_000, (b"c", "h", "d1")) == [("id-a", 1)]
    assert q.machine.ready_count == 2
    # the window runs from the first send: 5 minutes later the id is new again
    assert q.send(1_000 + WINDOW - 1, (b"d", "g", "d1")) == [("id-a", 1)]
    assert q.send(1_000 + WINDOW, (b"e", "g", "d1")) == [("id-e", 3)]
    assert q.machine.ready_count == 3


def test_duplicates_within_one_batch_and_sends_without_an_id() -> None:
    q = Clocked()
    reply = q.send(1_000, (b"a", "g", "d"), (b"b", "g", "d"), (b"c", "g", None), (b"e", "g", None))
    assert reply == [("id-a", 1), ("id-a", 1), ("id-c", 2), ("id-e", 3)]
    assert bodies(q.receive(1_000)) == [b"a", b"c", b"e"]


def test_a_send_refused_by_a_full_queue_is_not_remembered() -> None:
    q = Clocked(max_length=1, overflow="reject-publish")
    assert q.send(1_000, (b"a", "g", "d1"), (b"b", "g", "d2"), (b"c", "g", "d2")) == [("id-a", 1), None, None]
    assert list(q.machine.dedup) == ["d1"]
    q(1_000, DeleteReceived([(r.seq, r.receive_id) for r in q.receive(1_000)]))
    assert q.send(1_001, (b"b", "g", "d2")) == [("id-b", 3)]  # (2 was given to the refused send)


def test_the_window_is_pruned_by_the_logs_time_and_bounded(monkeypatch) -> None:
    q = Clocked()
    q.send(1_000, (b"a", "g", "d1"))
    q.send(2_000, (b"b", "g", "d2"))
    q(1_000 + WINDOW, Tick())
    assert list(q.machine.dedup) == ["d2"]
    q(2_000 + WINDOW, Tick())
    assert q.machine.dedup == {} and not q.machine._dedup_order
    monkeypatch.setattr(fifo, "DEDUP_ENTRIES_MAX", 2)
    q.send(3_000 + WINDOW, (b"c", "g", "d3"), (b"d", "g", "d4"))
    reply = q.send(3_001 + WINDOW, (b"e", "g", "d5"))
    assert type(reply) is Rejected and reply.reply_code == 403
    assert q.machine.ready_count == 4  # nothing of the refused send


def test_a_snapshot_carries_the_window_sequence_numbers_and_groups() -> None:
    q = Clocked()
    q.send(1_000, (b"a", "g", "d1"), (b"b", "g", "d2"), (b"c", "h", "d3"))
    assert bodies(q.receive(1_100, max_count=1)) == [b"a"]
    restored = Clocked(round_trip(q.machine))
    assert restored.machine.dedup == q.machine.dedup and restored.machine.groups_in_flight == {"g": 1}
    for side in (q, restored):
        assert side.send(2_000, (b"x", "g", "d2"), (b"y", "g", "d4")) == [("id-b", 2), ("id-y", 4)]
        assert bodies(side.receive(2_000)) == [b"c"]  # g is held by a
        # a and c are back (returned first, in sequence order), then g's ready ones
        assert [r.message.sequence_number for r in side.receive(40_000)] == [1, 3, 2, 4]


def test_a_durable_queue_keeps_its_window_in_its_backing_for_a_restart() -> None:
    backing = FifoBacking()
    q = Clocked(QueueMachine("/", "q.fifo", backing=backing, durable=True, settings=QueueSettings(fifo=True)))
    q.send(1_000, (b"a", "g", "d1"), (b"b", "g", "d2"))
    q.send(2_000, (b"c", "g", "d3"), (b"dup", "g", "d1"))
    q(1_000 + WINDOW, Tick())  # d1 and d2 leave the window, and the backing
    assert [entry[2] for entry in backing.dedup_stored()[0]] == ["d3"]
    # A restarted node: a new machine over the same backing, as server/recovery.py makes it.
    restarted = QueueMachine("/", "q.fifo", backing=backing, durable=True, settings=QueueSettings(fifo=True))
    restarted.recover(next_seq=3, spilled_count=3, spill_cursor=0)
    restarted.recover_fifo()
    r = Clocked(restarted)
    assert r.send(3_000, (b"c again", "g", "d3"), (b"d", "g", "d4")) == [("id-c", 3), ("id-d", 4)]
    assert [(m.message.body, m.message.group_id) for m in r.receive(3_000)] == [
        (b"a", "g"),
        (b"b", "g"),
        (b"c", "g"),
        (b"d", "g"),
    ]


def test_a_version_2_snapshot_still_loads() -> None:
    q = Clocked(QueueMachine("/", "q"))
    q(1_000, Enqueue([Message("", "q", b"", b"a")]))
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(q.machine)]
    records[0][1]["version"] = 2
    del records[0][1]["dedup"], records[0][1]["next_sequence_number"]
    for record in records[1:-1]:
        record[3] = [fields[:19] for fields in record[3]]
    restored = load_queue(records)
    assert restored.ready_count == 1 and restored.next_sequence_number == 1 and restored.dedup == {}
    assert restored.ready[0].group_id is None


# ------------------------------------------------------------------ groups


def test_a_group_in_flight_is_held_from_every_receiver_and_released_in_order() -> None:
    q = Clocked()
    q.send(1_000, (b"a0", "a", "1"), (b"b0", "b", "2"), (b"a1", "a", "3"), (b"b1", "b", "4"), (b"a2", "a", "5"))
    first = q.receive(1_000, max_count=1, visibility_ms=1_000)
    assert bodies(first) == [b"a0"]
    assert bodies(q.receive(1_000)) == [b"b0", b"b1"]  # a is held; one receive takes b in order
    assert q.receive(1_500) == []
    # a0's visibility runs out: it comes back before a1 and a2, and the group goes out together
    again = q.receive(2_000)
    assert bodies(again) == [b"a0", b"a1", b"a2"] and again[0].receive_count == 2
    # a visibility change to 0 of a2 alone does not free the group: a0 and a1 are in flight
    reply, _ = q(2_100, ChangeVisibility([(again[2].seq, again[2].receive_id, 0)]))
    assert reply == [HandleResult.DONE] and q.receive(2_100) == []
    q(2_200, DeleteReceived([(r.seq, r.receive_id) for r in again[:2]]))
    assert bodies(q.receive(2_200)) == [b"a2"]


def test_messages_without_a_group_are_served_in_order_and_hold_nothing() -> None:
    q = Clocked()
    q(1_000, Enqueue([Message("", "q.fifo", b"", b"amqp")]))
    q.send(1_000, (b"a", "g", "1"), (b"b", "g", "2"))
    received = q.receive(1_000, max_count=1)
    assert bodies(received) == [b"amqp"] and received[0].message.sequence_number is None
    assert bodies(q.receive(1_000)) == [b"a", b"b"]


def test_a_spilled_fifo_queue_keeps_groups_and_order() -> None:
    q = Clocked(
        QueueMachine(
            "/", "q.fifo", backing=FifoBacking(), durable=True, window_max=2, settings=QueueSettings(fifo=True)
        )
    )
    q.send(1_000, *[(b"m%d" % i, "ab"[i % 2], str(i)) for i in range(8)])
    assert q.machine.spilled_count == 6
    first = q.receive(1_000, max_count=1)
    assert bodies(first) == [b"m0"]
    assert bodies(q.receive(1_000)) == [b"m1", b"m3", b"m5", b"m7"]  # past a, loading the spilled tail
    q(1_000, DeleteReceived([(first[0].seq, first[0].receive_id)]))
    assert bodies(q.receive(1_000)) == [b"m2", b"m4", b"m6"]


@pytest.mark.parametrize("held_ahead", [5, 12])
def test_a_receive_looks_past_a_held_group_up_to_twice_the_window(held_ahead: int) -> None:
    # Group a has one message in flight and `held_ahead` ready behind it; b's message comes
    # after them. The window is 3: a receive loads the spilled tail up to 6 ready messages.
    q = Clocked(
        QueueMachine(
            "/", "q.fifo", backing=FifoBacking(), durable=True, window_max=3, settings=QueueSettings(fifo=True)
        )
    )
    q.send(1_000, *[(b"a%d" % i, "a", None) for i in range(held_ahead + 1)], (b"b", "b", None))
    assert bodies(q.receive(1_000, max_count=1)) == [b"a0"]
    found = q.receive(1_000)
    assert bodies(found) == ([b"b"] if held_ahead < 6 else [])  # (SQS too scans a bounded head)
    assert len(q.machine.ready) < 6 + 3  # twice the window, and at most one more load


def test_amqp_consumers_and_basic_get_are_refused_and_fifo_cannot_change() -> None:
    q = Clocked()
    reply, _ = q(1_000, Checkout("c", "o", 0, False, 0, False, 10))
    assert type(reply) is Rejected and reply.reply_code == 405
    reply, _ = q(1_000, Get("c", "o", False))
    assert type(reply) is Rejected and reply.reply_code == 405
    reply, _ = q(1_000, UpdateSettings(QueueSettings()))
    assert type(reply) is Rejected and q.machine.settings.fifo
    standard = Clocked(QueueMachine("/", "q"))
    reply, _ = standard(1_000, EnqueueFifo([Message("", "q", b"", b"a")], [("g", "d", "m")]))
    assert type(reply) is Rejected and standard.machine.ready_count == 0


def test_fifo_arguments() -> None:
    assert parse_queue_arguments("/", "q.fifo", {"x-sqs-fifo": True}).fifo
    with pytest.raises(QueueArgumentError, match="fifo_with_max_priority"):
        parse_queue_arguments("/", "q.fifo", {"x-sqs-fifo": True, "x-max-priority": 5})
    with pytest.raises(QueueArgumentError, match="unacceptable_type"):
        parse_queue_arguments("/", "q.fifo", {"x-sqs-fifo": "yes"})


@pytest.mark.parametrize(
    "fields",
    [
        [("g", "d")],
        [(None, "d", "m")],
        [("g", 5, "m")],
        [("g" * 129, None, "m")],
        [("", None, "m")],
        [("g", None, "m"), ("g", None, "n")],  # one more than the messages
    ],
)
def test_malformed_fifo_sends_change_nothing(fields) -> None:
    q = Clocked()
    reply, _ = q(1_000, EnqueueFifo([Message("", "q.fifo", b"", b"a")], fields))
    assert type(reply) is Rejected and reply.reply_code == 541
    assert q.machine.ready_count == 0 and q.machine.dedup == {} and q.machine.next_sequence_number == 1


# ------------------------------------------------------------------ stateful


WINDOW_MESSAGES = 3  # the machine's in-memory window: small, so that receives go past it


class FifoStateful(RuleBasedStateMachine):
    """A FIFO queue against SQS's rules (see the module notes)."""

    @initialize(spill=st.booleans())
    def start(self, spill: bool) -> None:
        backing = FifoBacking() if spill else None
        self.q = Clocked(
            QueueMachine(
                "/",
                "q.fifo",
                backing=backing,
                durable=spill,
                window_max=WINDOW_MESSAGES,
                settings=QueueSettings(fifo=True),
            )
        )
        self.now = 1_000
        self.sent = 0
        self.window: dict[str, tuple[int, tuple[str, int]]] = {}  # dedup id -> (first send ms, reply)
        self.pending: dict[str, list[int]] = {}  # group -> sequence numbers not deleted, in order
        self.in_flight: dict[int, tuple[int, int, str, int]] = {}  # seq -> (receive id, deadline, group, number)
        self.deleted: set[int] = set()

    def _expire(self) -> None:
        """What the model's visibility deadlines say is back (the machine releases them as time passes)."""
        for seq, (_rid, deadline, _g, _n) in list(self.in_flight.items()):
            if deadline <= self.now:
                del self.in_flight[seq]

    @rule(ms=st.sampled_from([0, 1, 500, 10_000, WINDOW // 2, WINDOW]))
    def advance(self, ms: int) -> None:
        self.now += ms
        self.q(self.now, Tick())
        self._expire()

    @rule(
        sends=st.lists(
            st.tuples(st.sampled_from(["a", "b", "c"]), st.one_of(st.none(), st.sampled_from(["d1", "d2", "d3"]))),
            min_size=1,
            max_size=4,
        )
    )
    def send(self, sends: list) -> None:
        batch = []
        for group, dedup in sends:
            self.sent += 1
            batch.append((b"%d" % self.sent, group, dedup))
        reply = self.q.send(self.now, *batch)
        assert type(reply) is list and len(reply) == len(batch)
        for (body, group, dedup), result in zip(batch, reply, strict=True):
            seen = self.window.get(dedup) if dedup is not None else None
            if seen is not None and self.now < seen[0] + WINDOW:
                assert result == seen[1], "a duplicate gets the first send's id and number"
                continue
            assert result is not None and result[0] == f"id-{body.decode()}"
            if dedup is not None:
                self.window[dedup] = (self.now, result)
            numbers = self.pending.setdefault(group, [])
            assert not numbers or numbers[-1] < result[1], "sequence numbers go up"
            numbers.append(result[1])
        self._expire()

    @rule(max_count=st.integers(1, 10), visibility_ms=st.sampled_from([0, 1, 1_000, 60_000]))
    def receive(self, max_count: int, visibility_ms: int) -> None:
        self._expire()
        held = {group for (_r, _d, group, _n) in self.in_flight.values()}
        received = self.q.receive(self.now, max_count, visibility_ms)
        assert len(received) <= max_count
        by_group: dict[str, list[int]] = {}
        for r in received:
            group, number = r.message.group_id, r.message.sequence_number
            assert group not in held, "a group in flight is not handed out"
            by_group.setdefault(group, []).append(number)
            self.in_flight[r.seq] = (r.receive_id, self.now + visibility_ms, group, number)
        for group, numbers in by_group.items():
            assert numbers == self.pending[group][: len(numbers)], "a group's oldest messages, in order"
        if not received:
            # Nothing for this receive: no free group's oldest message is within what a receive
            # looks at. That is every returned message and the ready ones up to twice the window
            # (a spilled tail is loaded that far, no further: memory stays bounded, as SQS scans
            # only the first 120,000). A message's place among those not in flight, in sequence
            # order, is at least its place among the ready ones.
            in_flight = {number for (_r, _d, _g, number) in self.in_flight.values()}
            waiting = sorted(n for numbers in self.pending.values() for n in numbers if n not in in_flight)
            reachable = set(waiting[: 2 * WINDOW_MESSAGES])
            free = [g for g, numbers in self.pending.items() if g not in held and set(numbers) & reachable]
            assert not free, (free, self.pending, held)
        if visibility_ms == 0:
            self._expire()

    @precondition(lambda self: getattr(self, "in_flight", None))
    @rule(data=st.data(), stale=st.booleans())
    def delete(self, data, stale: bool) -> None:
        seq = data.draw(st.sampled_from(sorted(self.in_flight)))
        receive_id, _deadline, group, number = self.in_flight[seq]
        reply, _ = self.q(self.now, DeleteReceived([(seq, receive_id + 1 if stale else receive_id)]))
        assert reply == [HandleResult.STALE if stale else HandleResult.DONE]
        if not stale:
            del self.in_flight[seq]
            self.pending[group].remove(number)

    @precondition(lambda self: getattr(self, "in_flight", None))
    @rule(data=st.data())
    def make_visible(self, data) -> None:
        seq = data.draw(st.sampled_from(sorted(self.in_flight)))
        receive_id = self.in_flight[seq][0]
        reply, _ = self.q(self.now, ChangeVisibility([(seq, receive_id, 0)]))
        assert reply == [HandleResult.DONE]
        del self.in_flight[seq]

    @rule()
    def snapshot(self) -> None:
        machine = self.q.machine
        backing = FifoBacking() if machine.backing is not None else None
        restored = round_trip(machine, backing)
        if backing is not None:
            backing.fifo = dict(machine.backing.fifo)  # (as a snapshot's stored messages carry them)
        assert list(dump_queue(restored))[0] == list(dump_queue(machine))[0]
        index = self.q.index
        self.q = Clocked(restored)
        self.q.index = index

    @invariant()
    def counts_agree(self) -> None:
        if not hasattr(self, "q"):
            return
        machine = self.q.machine
        assert machine.ready_count + len(machine.in_flight) == sum(len(n) for n in self.pending.values())

    def teardown(self) -> None:
        if not hasattr(self, "q"):
            return
        # Nothing is lost: far in the future, everything left comes out, each group in order.
        self.now += 24 * 3600 * 1000
        left: dict[str, list[int]] = {}
        for _ in range(1000):  # bounded: each round deletes what it got
            received = self.q.receive(self.now, 10, 60_000)
            if not received:
                break
            for r in received:
                left.setdefault(r.message.group_id, []).append(r.message.sequence_number)
            self.q(self.now, DeleteReceived([(r.seq, r.receive_id) for r in received]))
        assert left == {g: n for g, n in self.pending.items() if n}


TestFifoStateful = FifoStateful.TestCase
TestFifoStateful.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_overflowed_is_what_enqueue_answers_a_full_queue() -> None:
    # (EnqueueFifo maps Enqueue's Overflowed positions back to its own: the case it relies on)
    q = Clocked(QueueMachine("/", "q", settings=QueueSettings(max_length=1, overflow="reject-publish")))
    reply, _ = q(1_000, Enqueue([Message("", "q", b"", b"a"), Message("", "q", b"", b"b")]))
    assert reply == Overflowed(1, [1])
