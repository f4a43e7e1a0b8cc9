"""SQS receives in the queue machine, by example: in flight until a visibility deadline.

Each rule of receives.py has its example: a receive takes what a consumer would get, a handle
deletes or changes only the receive it names (a re-receive makes it stale), deadlines fall
due in queue time (which never goes back), x-delivery-limit counts receives, purge and delete
handle what is in flight, `Down` does not, TTL waits while in flight, the counts, a durable
backing, and a snapshot round trip with messages in flight. Time is the entry's `time_ms`.
"""

from __future__ import annotations

import msgpack
import pytest

from maxq_raft.machines import receives
from maxq_raft.machines.commands import (
    ChangeVisibility,
    Checkout,
    DeadLettered,
    DeleteQueue,
    DeleteReceived,
    Down,
    Enqueue,
    Get,
    Purge,
    Receive,
    Settle,
    Tick,
)
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import DeadLetter, Deliver, HandleResult, Meta, Received, Rejected
from maxq_raft.machines.receives import RECEIVE_ID_TIME_SHIFT, VISIBILITY_MS_MAX, VISIBILITY_SLACK
from maxq_raft.machines.snapshot import dump_queue, load_queue

from .test_queue_machine import DictBacking

DONE, STALE, NOT_IN_FLIGHT = HandleResult.DONE, HandleResult.STALE, HandleResult.NOT_IN_FLIGHT


class Clocked:
    """A machine driven with explicit entry times; invariants checked after every command."""

    def __init__(self, machine: QueueMachine | None = None, **settings) -> None:
        self.machine = machine if machine is not None else QueueMachine("/", "q", settings=QueueSettings(**settings))
        self.index = 0

    def __call__(self, time_ms: int, command):
        self.index += 1
        reply, effects = self.machine.apply(Meta(self.index, time_ms), command)
        self.machine.check_invariants()
        return reply, effects

    def send(self, time_ms: int, *bodies: bytes, **fields) -> None:
        reply, effects = self(time_ms, Enqueue([Message("", "q", b"", body, **fields) for body in bodies]))
        assert reply == len(bodies), reply

    def receive(self, time_ms: int, max_count: int = 10, visibility_ms: int = 30_000) -> list[Received]:
        reply, effects = self(time_ms, Receive(max_count, visibility_ms))
        assert type(reply) is list and effects == [], reply
        return reply


def bodies(received: list[Received]) -> list[bytes]:
    return [r.message.body for r in received]


def handles(received: list[Received]) -> list[tuple[int, int]]:
    return [(r.seq, r.receive_id) for r in received]


def delivered(effects: list) -> list[tuple[str, bytes, bool]]:
    return [(e.consumer_id, e.message.body, e.redelivered) for e in effects if type(e) is Deliver]


# ------------------------------------------------------------------ receive


def test_a_receive_takes_ready_messages_in_order_with_what_the_shell_needs() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b", b"c")
    received = q.receive(2_000, max_count=2, visibility_ms=500)
    assert bodies(received) == [b"a", b"b"]
    first = received[0]
    assert (first.seq, first.receive_count, first.first_received_ms, first.sent_ms) == (0, 1, 2_000, 1_000)
    # Ids: unique, counting up, floored by the queue's time.
    assert [r.receive_id for r in received] == [2_000 << RECEIVE_ID_TIME_SHIFT, (2_000 << RECEIVE_ID_TIME_SHIFT) + 1]
    assert q.machine.ready_count == 1 and q.machine.unacked_count == 2
    assert sorted(q.machine.in_flight) == [0, 1]
    assert q.machine.next_deadline_ms == 2_500
    assert bodies(q.receive(2_001)) == [b"c"]
    assert q.receive(2_002) == []  # everything in flight: nothing ready


def test_receivers_and_consumers_share_the_queue() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    assert bodies(q.receive(1_000, max_count=1, visibility_ms=100)) == [b"a"]
    _, effects = q(1_000, Checkout("c", "o", 0, False, 0, False, 10))
    assert delivered(effects) == [("c", b"b", False)]  # the received one is not ready
    # When its visibility runs out, it goes to the waiting consumer, flagged redelivered, and
    # the delivery counts on: the consumer sees a second delivery.
    _, effects = q(1_100, Tick())
    assert delivered(effects) == [("c", b"a", True)]
    assert effects[0].message.delivery_count == 2
    assert not q.machine.in_flight and q.machine.unacked_count == 2


def test_a_receive_honours_priorities_delays_and_ttl_as_a_delivery_does() -> None:
    m = make_queue_machine("/", "q", settings=QueueSettings(max_priority=5))
    q = Clocked(m)
    q(1_000, Enqueue([Message("", "q", b"", b"low", priority=1), Message("", "q", b"", b"high", priority=5)]))
    q(1_000, Enqueue([Message("", "q", b"", b"later", priority=9, delay_ms=50)]))
    assert bodies(q.receive(1_000)) == [b"high", b"low"]  # the delayed one is not ready yet
    assert bodies(q.receive(1_050)) == [b"later"]
    # TTL: an expired message met on the way (behind an unexpired head) is dead-lettered, never received.
    q = Clocked(dead_letter_exchange="dlx")
    q(1_000, Enqueue([Message("", "q", b"", b, ttl_ms=ttl) for b, ttl in [(b"a", 1_000), (b"b", 10), (b"c", None)]]))
    reply, effects = q(1_050, Receive(10, 1_000))
    assert bodies(reply) == [b"a", b"c"]
    assert [(e.reason, [m.body for m in e.messages]) for e in effects] == [("expired", [b"b"])]


def test_visibility_zero_makes_the_message_visible_at_the_next_command() -> None:
    q = Clocked()
    q.send(1_000, b"a")
    first = q.receive(1_000, visibility_ms=0)
    assert q.machine.next_deadline_ms == 1_000  # due now: the shell ticks at once
    second = q.receive(1_000)
    assert bodies(second) == [b"a"] and second[0].receive_count == 2
    assert second[0].receive_id > first[0].receive_id
    assert second[0].first_received_ms == 1_000


# ------------------------------------------------------------------ delete


def test_delete_needs_the_latest_receives_handle() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    old = q.receive(1_000, visibility_ms=100)
    new = q.receive(1_100)  # both expired and received again: the old handles are stale
    assert bodies(new) == [b"a", b"b"] and [r.receive_count for r in new] == [2, 2]
    assert [r.first_received_ms for r in new] == [1_000, 1_000]
    reply, effects = q(1_200, DeleteReceived(handles(old)))
    assert reply == [STALE, STALE] and effects == [] and sorted(q.machine.in_flight) == [0, 1]
    reply, _ = q(1_200, DeleteReceived([handles(new)[0], handles(new)[0], (7, 1), handles(old)[1]]))
    assert reply == [DONE, NOT_IN_FLIGHT, NOT_IN_FLIGHT, STALE]
    assert list(q.machine.in_flight) == [1]
    assert q(1_200, DeleteReceived([handles(new)[1]]))[0] == [DONE]
    assert q.machine.unacked_count == 0 and q.machine.ready_count == 0


def test_a_handle_whose_visibility_ran_out_deletes_nothing() -> None:
    # SQS: the request succeeds but the message may not be deleted; here it is not (the shell
    # answers success all the same): the message is visible again, someone may be receiving it.
    q = Clocked()
    q.send(1_000, b"a")
    received = q.receive(1_000, visibility_ms=100)
    reply, _ = q(1_100, DeleteReceived(handles(received)))
    assert reply == [NOT_IN_FLIGHT] and q.machine.ready_count == 1


# ------------------------------------------------------------------ change visibility


def test_change_visibility_from_now_refused_for_a_stale_handle_or_a_visible_message() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    old = q.receive(1_000, max_count=1, visibility_ms=100)
    new = q.receive(1_100, max_count=1, visibility_ms=100)  # a again: old is stale
    assert bodies(new) == [b"a"]
    reply, effects = q(1_150, ChangeVisibility([(*handles(old)[0], 500), (*handles(new)[0], 500), (1, 0, 5)]))
    assert reply == [STALE, DONE, NOT_IN_FLIGHT] and effects == []
    assert q.machine.next_deadline_ms == 1_650  # from now, not from the receive
    assert q(1_649, Tick())[1] == [] and list(q.machine.in_flight) == [0]
    q(1_650, Tick())
    assert not q.machine.in_flight and q.machine.ready_count == 2


def test_change_visibility_to_zero_releases_in_the_same_command() -> None:
    q = Clocked()
    q.send(1_000, b"a")
    received = q.receive(1_000)
    q(1_000, Checkout("c", "o", 0, False, 0, False, 10))
    reply, effects = q(1_010, ChangeVisibility([(*handles(received)[0], 0)]))
    assert reply == [DONE] and delivered(effects) == [("c", b"a", True)]


def test_repeated_changes_keep_the_deadline_heap_bounded() -> None:
    q = Clocked()
    q.send(1_000, b"a")
    handle = handles(q.receive(1_000))[0]
    for i in range(500):
        assert q(1_000 + i, ChangeVisibility([(*handle, 1_000)]))[0] == [DONE]
        assert len(q.machine._visibility) <= 2 + VISIBILITY_SLACK
    assert q.machine.next_deadline_ms == 1_499 + 1_000


# ------------------------------------------------------------------ expiry


def test_expired_messages_return_at_their_place_in_sequence_order() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b", b"c", b"d")
    q.receive(1_000, max_count=1, visibility_ms=300)  # a
    q.receive(1_000, max_count=2, visibility_ms=100)  # b, c
    assert q.machine.next_deadline_ms == 1_100
    q(1_100, Tick())  # b and c back, before d
    assert q.machine.next_deadline_ms == 1_300
    _, effects = q(1_300, Checkout("c", "o", 0, True, 0, False, 10))  # a is released first
    assert delivered(effects) == [("c", b"a", True), ("c", b"b", True), ("c", b"c", True), ("c", b"d", False)]
    assert q.machine.next_deadline_ms is None


def test_queue_time_never_goes_back_for_deadlines() -> None:
    q = Clocked()
    q.send(5_000, b"a", b"b")
    [a] = q.receive(5_000, max_count=1, visibility_ms=100)  # due at 5,100
    # An entry from a proposer whose clock is behind: the queue's time stays 5,000, so a receive
    # there gets its deadline from 5,000 and nothing falls due early...
    [b] = q.receive(3_000, max_count=1, visibility_ms=100)
    assert b.first_received_ms == 5_000 and b.receive_id > a.receive_id
    assert q(3_000, ChangeVisibility([(a.seq, a.receive_id, 50)]))[0] == [DONE]
    assert q.machine.in_flight[a.seq].deadline_ms == 5_050
    assert q(4_000, Tick())[1] == [] and len(q.machine.in_flight) == 2
    # ...and once queue time has passed a deadline, an entry stamped earlier does not undo it.
    q(5_100, Tick())
    assert not q.machine.in_flight
    assert bodies(q.receive(4_500)) == [b"a", b"b"]
    assert q.machine.in_flight[0].deadline_ms == 5_100 + 30_000


def test_a_restarted_queue_gives_ids_above_those_before_the_restart() -> None:
    # A single node's log starts its indexes again and a restarted queue comes back from its
    # backing without its counter: the ids are floored by the queue's time.
    before = Clocked()
    before.send(1_000, b"a")
    for t in range(1_000, 1_010):
        [received] = before.receive(t, visibility_ms=0)
    after = Clocked()
    after.send(1_011, b"a")
    assert after.receive(1_011)[0].receive_id > received.receive_id


# ------------------------------------------------------------------ limits, purge, delete, down


def test_a_delivery_limit_counts_receives_and_dead_letters_on_expiry() -> None:
    # RedrivePolicy maxReceiveCount 2 is x-delivery-limit 1 and the dead-letter queue as target.
    q = Clocked(delivery_limit=1, dead_letter_exchange="", dead_letter_routing_key="q-dlq")
    q.send(1_000, b"a")
    assert q.receive(1_000, visibility_ms=100)[0].receive_count == 1
    assert q.receive(1_100, visibility_ms=100)[0].receive_count == 2  # came back once
    reply, effects = q(1_200, Tick())  # the second receive ran out: over the limit
    [dead] = [e for e in effects if type(e) is DeadLetter]
    assert (dead.reason, dead.exchange, dead.routing_key, [m.body for m in dead.messages]) == (
        "delivery_limit",
        "",
        "q-dlq",
        [b"a"],
    )
    assert q.receive(1_200) == [] and q.machine.dead_lettered["delivery_limit"] == 1
    q(1_200, DeadLettered([dead.messages[0].seq]))
    assert not q.machine.dead_lettering


def test_amqp_deliveries_and_receives_share_one_count() -> None:
    q = Clocked(delivery_limit=1)
    q.send(1_000, b"a")
    q(1_000, Get("g", "o", False))
    q(1_000, Down("o"))  # returned once, count 1
    assert q.receive(1_000, visibility_ms=10)[0].receive_count == 2
    q(1_010, Tick())  # over the limit, no dead-letter exchange: dropped
    assert q.machine.dropped["delivery_limit"] == 1 and q.machine.ready_count == 0


def test_purge_keeps_in_flight_messages_unless_asked() -> None:
    backing = DictBacking()
    q = Clocked(QueueMachine("/", "q", backing=backing, durable=True))
    q(1_000, Enqueue([Message("", "q", b"", b"m%d" % i, persistent=True) for i in range(4)]))
    q.receive(1_000, max_count=2)
    assert q(1_000, Purge())[0] == 2  # AMQP's queue.purge: the ready ones
    assert sorted(q.machine.in_flight) == [0, 1] and sorted(backing.records) == [0, 1]
    assert q(1_000, Purge(in_flight=True))[0] == 2  # SQS PurgeQueue: those in flight too
    assert not q.machine.in_flight and backing.records == {} and q.machine.next_deadline_ms is None
    assert type(q(1_000, Purge("yes"))[0]) is Rejected


def test_delete_queue_forgets_in_flight_messages() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    received = q.receive(1_000, max_count=1)
    assert q(1_000, DeleteQueue())[0] == 1  # the ready count, as before
    assert not q.machine.in_flight and q.machine.next_deadline_ms is None
    assert q(1_000, DeleteReceived(handles(received)))[0].reply_code == 404


def test_down_leaves_in_flight_messages_and_ttl_waits_while_in_flight() -> None:
    q = Clocked(message_ttl_ms=50, dead_letter_exchange="dlx")
    q.send(1_000, b"a")
    received = q.receive(1_000, visibility_ms=100)
    assert q(1_060, Down("o"))[0] == 0 and list(q.machine.in_flight) == [0]  # past its TTL, still in flight
    assert q(1_060, ChangeVisibility([(*handles(received)[0], 40)]))[0] == [DONE]
    reply, effects = q(1_100, Tick())  # back, and expired at once
    assert [(e.reason, [m.body for m in e.messages]) for e in effects] == [("expired", [b"a"])]


def test_a_durable_queue_keeps_in_flight_messages_stored_until_deleted() -> None:
    backing = DictBacking()
    q = Clocked(QueueMachine("/", "q", backing=backing, durable=True, window_max=2))
    q(1_000, Enqueue([Message("", "q", b"", b"m%d" % i, persistent=True) for i in range(5)]))
    received = q.receive(1_000, max_count=3)  # beyond the window: loads the spilled ones
    assert bodies(received) == [b"m0", b"m1", b"m2"] and sorted(backing.records) == [0, 1, 2, 3, 4]
    assert received[2].sent_ms is None  # spilled: read back from the backing, which keeps no sent time
    assert q(1_000, DeleteReceived(handles(received)[:2]))[0] == [DONE, DONE]
    assert sorted(backing.records) == [2, 3, 4]
    assert backing.delivered_upto == 2


# ------------------------------------------------------------------ malformed commands


@pytest.mark.parametrize(
    "command",
    [
        Receive(0, 1_000),
        Receive(11, 1_000),
        Receive(1, -1),
        Receive(1, VISIBILITY_MS_MAX + 1),
        Receive("1", 1_000),
        Receive(True, 1_000),
        Receive(1, 1.5),
        DeleteReceived(None),
        DeleteReceived("0,1"),
        DeleteReceived([(0,)]),
        DeleteReceived([(0, "1")]),
        DeleteReceived([(0, 1, 2)]),
        DeleteReceived([(0, -1)]),
        DeleteReceived([(0, True)]),
        DeleteReceived([(0, 1)] * 11),
        ChangeVisibility([(0, 1)]),
        ChangeVisibility([(0, 1, -5)]),
        ChangeVisibility([(0, 1, VISIBILITY_MS_MAX + 1)]),
        ChangeVisibility([(0, 1, 5), None]),
        ChangeVisibility({0: 1}),
    ],
)
def test_malformed_receive_commands_change_nothing(command) -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    received = q.receive(1_000, max_count=1)
    before = (q.machine.next_receive_id, list(q.machine.in_flight), list(q.machine._visibility), q.machine.ready_count)
    reply, effects = q(1_000, command)
    assert type(reply) is Rejected and reply.reply_code == 541 and effects == []
    after = (q.machine.next_receive_id, list(q.machine.in_flight), list(q.machine._visibility), q.machine.ready_count)
    assert after == before
    assert q(1_000, DeleteReceived(handles(received)))[0] == [DONE]


def test_msgpack_lists_are_handles_too() -> None:
    # A cluster's log entries carry tuples as lists (replication/entries.py).
    q = Clocked()
    q.send(1_000, b"a")
    [r] = q.receive(1_000)
    assert q(1_000, ChangeVisibility([[r.seq, r.receive_id, 10]]))[0] == [DONE]
    assert q(1_000, DeleteReceived([[r.seq, r.receive_id]]))[0] == [DONE]


# ------------------------------------------------------------------ snapshots


def round_trip(machine: QueueMachine, backing=None) -> QueueMachine:
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(machine)]
    restored = load_queue(records, backing=backing)
    restored.check_invariants()
    return restored


def test_a_snapshot_carries_messages_in_flight() -> None:
    original = Clocked(QueueMachine("/", "q", backing=DictBacking(), durable=True, window_max=2))
    original(1_000, Enqueue([Message("", "q", b"", b"m%d" % i, persistent=True) for i in range(4)]))
    old = original.receive(1_000, max_count=1, visibility_ms=100) + original.receive(1_000, max_count=1)
    new = original.receive(1_100, max_count=1, visibility_ms=500)  # m0 again: old[0] is stale
    original(1_150, ChangeVisibility([(*handles(old)[1], 20)]))  # m1's deadline moved: 1,170
    restored = Clocked(round_trip(original.machine, DictBacking()))
    restored.index = original.index
    for q in (original, restored):
        m = q.machine
        assert [(seq, f.receive_id, f.deadline_ms, f.message.delivery_count) for seq, f in m.in_flight.items()] == [
            (1, old[1].receive_id, 1_170, 1),
            (0, new[0].receive_id, 1_600, 2),
        ]  # in receive order
        assert m.in_flight[0].message.first_received_ms == 1_000 and m.in_flight[0].message.sent_ms == 1_000
        assert (m.next_deadline_ms, m.next_receive_id, m.unacked_count) == (1_170, original.machine.next_receive_id, 2)
        assert sorted(m.backing.records) == [0, 1, 2, 3]
    outputs = []
    for q in (original, restored):
        steps = [
            q(1_160, DeleteReceived(handles(old))),  # stale, then not yet due
            q(1_170, Tick()),  # m1 back
            q(1_170, Receive(10, 1_000)),
            q(1_600, DeleteReceived(handles(new))),
        ]
        outputs.append(
            [
                (reply if type(reply) is not list or not reply or type(reply[0]) is not Received else handles(reply))
                for reply, _ in steps
            ]
        )
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == [STALE, DONE]  # old[1] was still in flight under its receive


def test_a_version_1_snapshot_still_loads() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(q.machine)]
    records[0][1]["version"] = 1
    del records[0][1]["next_receive_id"]
    for record in records[1:-1]:
        record[3] = [fields[:17] for fields in record[3]]
    restored = load_queue(records)
    assert restored.ready_count == 2 and restored.next_receive_id == 0
    assert restored.ready[0].sent_ms is None


def test_receive_constants_are_those_of_sqs() -> None:
    assert receives.RECEIVE_MAX == 10 and VISIBILITY_MS_MAX == 43_200_000
    # Ids stay below 2**64 (the receipt's 8 bytes) for queue times up to the year 2500.
    year_2500_ms = 16_725_225_600_000
    assert (year_2500_ms << RECEIVE_ID_TIME_SHIFT) < 1 << 64


def test_settle_of_an_amqp_delivery_does_not_touch_receives() -> None:
    q = Clocked()
    q.send(1_000, b"a", b"b")
    q.receive(1_000, max_count=1)
    q(1_000, Checkout("c", "o", 0, False, 0, False, 10))
    assert q(1_000, Settle("c", [0]))[0] == 0  # seq 0 is in flight to a receiver, not the consumer's
    assert list(q.machine.in_flight) == [0]


def test_visibility_is_at_most_twelve_hours_from_the_receive_in_total() -> None:
    hour_ms = 3_600_000
    q = Clocked()
    q.send(0, b"a")
    [r] = q.receive(0, visibility_ms=7 * hour_ms)
    reply, _ = q(6 * hour_ms, ChangeVisibility([(r.seq, r.receive_id, 7 * hour_ms)]))
    assert reply == [HandleResult.TOO_LONG] and q.machine.in_flight[0].deadline_ms == 7 * hour_ms
    reply, _ = q(6 * hour_ms, ChangeVisibility([(r.seq, r.receive_id, 6 * hour_ms)]))
    assert reply == [DONE] and q.machine.next_deadline_ms == 12 * hour_ms


def test_messages_in_flight_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(receives, "IN_FLIGHT_MAX", 3)
    q = Clocked()
    q.send(1_000, b"a", b"b", b"c", b"d")
    assert bodies(q.receive(1_000, max_count=2)) == [b"a", b"b"]
    first = q.receive(1_000, max_count=2)  # room for one more
    assert bodies(first) == [b"c"]
    reply, effects = q(1_000, Receive(1, 1_000))
    assert type(reply) is Rejected and reply.reply_code == 403 and effects == []
    assert q.machine.ready_count == 1
    q(1_000, DeleteReceived(handles(first)))
    assert bodies(q.receive(1_000)) == [b"d"]
