"""The queue machine's features, by example: TTL, x-expires, length limits, dead lettering.

Time is the entry's `time_ms`, given explicitly here, so nothing depends on a clock.
RabbitMQ's documented behaviour is the reference (ttl.md, maxlength.md, dlx.md).
"""

from __future__ import annotations

from maxq_raft.machines.commands import (
    Cancel,
    Checkout,
    DeadLettered,
    Discard,
    Down,
    Enqueue,
    Get,
    Requeue,
    Settle,
    Tick,
    Touch,
)
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_limits import DROP_BATCH_MAX
from maxq_raft.machines.queue_types import DeadLetter, Deliver, Meta, Overflowed, QueueExpired, Rejected


class Clocked:
    """A machine driven with explicit entry times."""

    def __init__(self, backing=None, **settings) -> None:
        self.machine = QueueMachine(
            "/",
            "q",
            settings=QueueSettings(**settings),
            backing=backing,
            durable=backing is not None,
            window_max=3 if backing else 1 << 20,
        )
        self.index = 0

    def at(self, time_ms: int, command):
        self.index += 1
        reply, effects = self.machine.apply(Meta(self.index, time_ms), command)
        self.machine.check_invariants()
        return reply, effects

    def publish(self, time_ms: int, *bodies: bytes, ttl_ms: int | None = None):
        return self.at(time_ms, Enqueue([Message("ex", "rk", b"", body, ttl_ms=ttl_ms) for body in bodies]))


def bodies(effects, kind=Deliver) -> list:
    out = []
    for effect in effects:
        if type(effect) is kind:
            out.extend([effect.message.body] if kind is Deliver else [m.body for m in effect.messages])
    return out


# ------------------------------------------------------------------------------ TTL


def test_queue_ttl_expires_at_the_deadline_without_traffic():
    q = Clocked(message_ttl_ms=100)
    q.publish(1000, b"a", b"b")
    q.publish(1050, b"c")
    assert q.machine.next_deadline_ms == 1100
    q.at(1099, Tick())
    assert q.machine.ready_count == 3
    q.at(1100, Tick())
    assert q.machine.ready_count == 1 and q.machine.dropped["expired"] == 2
    assert q.machine.next_deadline_ms == 1150
    q.at(1150, Tick())
    assert q.machine.ready_count == 0 and q.machine.next_deadline_ms is None


def test_an_entry_from_a_proposer_whose_clock_is_behind_does_not_revive_an_expired_message():
    # Each proposer stamps its own clock, so after a leader change (or with skewed clocks) a
    # later entry may carry an earlier time. At 1200 "short" is past its deadline (1100) but
    # waits behind an unexpired head; an entry stamped 1050 must not make it deliverable again.
    q = Clocked()
    q.at(
        1000, Enqueue([Message("ex", "rk", b"", b"long", ttl_ms=1000), Message("ex", "rk", b"", b"short", ttl_ms=100)])
    )
    q.at(1200, Tick())
    assert q.machine.ready_count == 2 and q.machine.now_ms == 1200
    _, effects = q.at(1050, Checkout("c", "o", 0, True, 0, False, 10))
    assert bodies(effects) == [b"long"] and q.machine.dropped["expired"] == 1
    assert q.machine.now_ms == 1200


def test_a_ttl_is_measured_from_the_queues_time_not_an_earlier_entry_time():
    q = Clocked(message_ttl_ms=100, expires_ms=500)
    q.at(1000, Touch())
    q.publish(900, b"m")  # a proposer 100 ms behind
    (message,) = q.machine.ready
    assert message.expires_at_ms == 1100 and q.machine.next_deadline_ms == 1100
    q.at(1050, Tick())  # nothing is due at the queue's 1000
    assert q.machine.ready_count == 1 and not q.machine.expired
    q.at(1099, Tick())
    assert q.machine.ready_count == 1
    q.at(1100, Tick())
    assert q.machine.ready_count == 0 and q.machine.dropped["expired"] == 1
    # x-expires from the last use at the queue's 1000, not the entry's 900
    assert q.machine.next_deadline_ms == 1500
    q.at(1499, Tick())
    assert not q.machine.expired
    reply, effects = q.at(1500, Tick())
    assert reply is True and effects == [QueueExpired("/", "q")]


def test_ttl_zero_delivers_to_a_waiting_consumer_and_is_dropped_otherwise():
    q = Clocked(message_ttl_ms=0)
    q.publish(1000, b"nobody-waits")
    assert q.machine.ready_count == 0 and q.machine.dropped["expired"] == 1
    q.at(1001, Checkout("c", "o", 0, True, 0, False, 10))
    _, effects = q.publish(1002, b"delivered")
    assert bodies(effects) == [b"delivered"]


def test_expired_message_at_the_head_is_never_delivered():
    q = Clocked()
    q.publish(1000, b"short", ttl_ms=10)
    q.publish(1000, b"long", ttl_ms=10_000)
    _, effects = q.at(1500, Checkout("c", "o", 0, False, 0, False, 10))
    assert bodies(effects) == [b"long"]
    assert q.machine.dropped["expired"] == 1
    reply, _ = q.at(1501, Get("g", "o", True))
    assert reply is None


def test_per_message_ttl_and_queue_ttl_take_the_lower():
    q = Clocked(message_ttl_ms=1000)
    q.publish(0, b"m", ttl_ms=5000)
    q.publish(0, b"n", ttl_ms=10)
    assert q.machine.ready[0].expires_at_ms == 1000 and q.machine.ready[1].expires_at_ms == 10


def test_expired_behind_an_unexpired_head_waits_for_the_head_as_in_rabbitmq():
    q = Clocked()
    q.publish(0, b"long", ttl_ms=1000)
    q.publish(0, b"short", ttl_ms=10)
    q.at(500, Tick())
    assert q.machine.ready_count == 2  # RabbitMQ expires at the head only
    reply, _ = q.at(501, Get("g", "o", True))
    assert reply[0].body == b"long"
    assert q.machine.ready_count == 0 and q.machine.dropped["expired"] == 1  # now at the head: gone


def test_requeued_message_keeps_its_deadline():
    q = Clocked(message_ttl_ms=100)
    q.at(0, Checkout("c", "o", 1, False, 0, False, 10))
    _, effects = q.publish(0, b"a")
    seq = effects[0].message.seq
    q.at(10, Cancel("c"))
    q.at(200, Requeue("c", [seq]))
    assert q.machine.ready_count == 0 and q.machine.dropped["expired"] == 1


def test_expiry_reaches_into_spilled_messages_in_bounded_batches():
    from tests.machines.test_queue_machine import DictBacking

    backing = DictBacking()
    q = Clocked(backing=backing, message_ttl_ms=5)
    n = DROP_BATCH_MAX + 10
    q.at(0, Enqueue([Message("ex", "rk", b"", b"x%d" % i) for i in range(n)]))
    assert q.machine.spilled_count == n - 3
    q.at(10, Tick())
    assert q.machine.ready_count == 10 and q.machine.next_deadline_ms == 10  # more due at once
    q.at(11, Tick())
    assert q.machine.ready_count == 0 and q.machine.dropped["expired"] == n
    assert backing.records == {}


# ------------------------------------------------------------------------ x-expires


def test_unused_queue_expires_and_use_postpones_it():
    q = Clocked(expires_ms=1000)
    q.at(0, Touch())
    assert q.machine.next_deadline_ms == 1000
    q.at(900, Get("g", "o", True))
    assert q.at(1000, Tick()) == (False, [])
    q.at(1100, Checkout("c", "o", 0, True, 0, False, 10))
    assert q.machine.next_deadline_ms is None  # a consumer: in use
    q.at(5000, Cancel("c"))
    assert q.machine.next_deadline_ms == 6000
    assert q.at(5999, Tick())[1] == []
    assert q.at(6000, Tick()) == (True, [QueueExpired("/", "q")])
    assert q.machine.next_deadline_ms is None


# ----------------------------------------------------------------------- length limits


def test_drop_head_keeps_the_newest():
    q = Clocked(max_length=2)
    q.publish(0, b"1", b"2", b"3")
    q.publish(0, b"4")
    assert [m.body for m in q.machine.ready] == [b"3", b"4"]
    assert q.machine.dropped["maxlen"] == 2


def test_drop_head_by_bytes():
    q = Clocked(max_length_bytes=5)
    q.publish(0, b"aaa", b"bb", b"c")
    assert [m.body for m in q.machine.ready] == [b"bb", b"c"] and q.machine.ready_bytes == 3


def test_max_length_counts_ready_messages_only():
    q = Clocked(max_length=1)
    q.at(0, Checkout("c", "o", 2, False, 0, False, 10))
    _, effects = q.publish(0, b"1", b"2", b"3", b"4")
    assert bodies(effects) == [b"1", b"2"]
    assert [m.body for m in q.machine.ready] == [b"4"]  # 3 dropped, 2 unacked do not count


def test_reject_publish_refuses_what_would_go_over():
    q = Clocked(max_length=2, overflow="reject-publish")
    messages = [Message("ex", "rk", b"", b"%d" % i) for i in range(4)]
    reply, effects = q.at(0, Enqueue(messages))
    assert reply == Overflowed(2, [2, 3]) and effects == []  # positions in the Enqueue's list
    assert q.machine.rejected_publishes == 2 and q.machine.ready_count == 2


def test_overflowed_positions_are_in_the_enqueue_with_delayed_messages_among_them():
    # A delayed message is held, not judged against the limit; the positions skip nothing.
    q = Clocked(max_length=1, overflow="reject-publish")
    batch = [
        Message("ex", "rk", b"", b"a"),
        Message("ex", "rk", b"", b"later", delay_ms=50),
        Message("ex", "rk", b"", b"b"),
        Message("ex", "rk", b"", b"c"),
    ]
    reply, _ = q.at(0, Enqueue(batch))
    assert reply == Overflowed(2, [2, 3])
    assert [m.body for m in q.machine.ready] == [b"a"]


def test_reject_publish_delivers_each_before_judging_the_next():
    q = Clocked(max_length=0, overflow="reject-publish")
    q.at(0, Checkout("c", "o", 0, True, 0, False, 2))
    reply, effects = q.publish(0, b"1", b"2", b"3")
    # RabbitMQ checks the limit before delivery: with max-length 0 every publish is refused.
    assert type(reply) is Overflowed and reply.accepted == 0 and effects == []


def test_a_refused_command_flushes_what_the_releases_before_it_dead_lettered():
    # A delayed message falls due at the start of a command that the machine then refuses (a
    # reused consumer tag); the reject-publish-dlx queue at its limit dead-letters it. `apply`
    # used to return the refusal before flushing, leaving the message in `_dying` until the
    # next command (check_invariants failed here; shrunk by hypothesis in test_snapshot.py).
    q = Clocked(max_length=0, overflow="reject-publish-dlx", dead_letter_exchange="dlx")
    q.at(0, Enqueue([Message("ex", "rk", b"", b"later", delay_ms=7)]))
    q.at(0, Checkout("c", "o", 0, False, 0, False, 0))
    reply, effects = q.at(10, Checkout("c", "o", 0, False, 0, False, 0))
    assert type(reply) is Rejected and reply.reply_code == 530
    (effect,) = effects
    assert type(effect) is DeadLetter and effect.reason == "maxlen" and [m.body for m in effect.messages] == [b"later"]
    assert q.machine.rejected_publishes == 1 and q.machine.dead_lettered["maxlen"] == 1


def test_reject_publish_dlx_dead_letters_the_refused():
    q = Clocked(max_length=1, overflow="reject-publish-dlx", dead_letter_exchange="dlx")
    reply, effects = q.publish(0, b"1", b"2")
    assert type(reply) is Overflowed and reply.accepted == 1
    (effect,) = effects
    assert effect.reason == "maxlen" and [m.body for m in effect.messages] == [b"2"]
    assert effect.messages[0].seq == -1 and q.machine.dead_lettering == {}


# --------------------------------------------------------------------- dead lettering


def test_rejected_expired_and_maxlen_are_dead_lettered_and_held_until_done():
    from tests.machines.test_queue_machine import DictBacking

    backing = DictBacking()
    q = Clocked(
        backing=backing, dead_letter_exchange="dlx", dead_letter_routing_key="dead", max_length=3, message_ttl_ms=1000
    )
    q.at(0, Checkout("c", "o", 1, False, 0, False, 10))
    for i in range(5):
        q.at(0, Enqueue([Message("ex", "rk", b"", b"%d" % i, persistent=True)]))
    # c holds 0; 1..4 ready, max 3: 1 dropped (maxlen)
    assert list(q.machine.dead_lettering) == [1]
    reply, effects = q.at(1, Discard("c", [0]))
    assert reply == 1
    kinds = [(e.reason, [m.seq for m in e.messages]) for e in effects if type(e) is DeadLetter]
    assert kinds == [("rejected", [0])]
    assert bodies(effects) == [b"2"]  # the prefetch slot freed by the reject
    (dead,) = [e for e in effects if type(e) is DeadLetter]
    assert (dead.vhost, dead.queue, dead.exchange, dead.routing_key, dead.time_ms) == ("/", "q", "dlx", "dead", 1)
    assert sorted(q.machine.dead_lettering) == [0, 1]
    assert 0 in backing.records and 1 in backing.records  # still stored: at-least-once
    q.at(2, DeadLettered([0, 1, -1, 99]))
    assert q.machine.dead_lettering == {} and 0 not in backing.records and 1 not in backing.records
    _, effects = q.at(5000, Tick())
    (effect,) = [e for e in effects if type(e) is DeadLetter]
    assert effect.reason == "expired" and [m.seq for m in effect.messages] == [3, 4]  # c holds 2
    assert q.machine.dead_lettered == {"rejected": 1, "expired": 2, "maxlen": 1, "delivery_limit": 0}


def test_discard_without_dlx_drops():
    q = Clocked()
    q.at(0, Checkout("c", "o", 1, False, 0, False, 10))
    _, effects = q.publish(0, b"a")
    assert q.at(0, Discard("c", [effects[0].message.seq])) == (1, [])
    assert q.machine.dropped["rejected"] == 1


def test_malformed_feature_commands_are_refused():
    q = Clocked()
    assert type(q.at(0, DeadLettered("x"))[0]) is Rejected
    assert type(q.publish(0, b"x", ttl_ms=-1)[0]) is Rejected
    assert type(q.at(0, Enqueue([Message("", "", b"", b"", ttl_ms="5")]))[0]) is Rejected
    assert q.machine.ready_count == 0
    assert type(q.machine.apply(Meta(99, None), Tick())[0]) is Rejected


# ----------------------------------------------------------------------- regressions


def test_regression_drop_head_exposed_an_expired_head():
    """Shrunk by test_queue_features_model: max-length 1 (drop-head), enqueue m0 (no TTL), then
    m1 with TTL 0 and no consumer. Expiry ran before the length limit, so dropping m0 left m1 at
    the head past its deadline: queued, although TTL 0 with nobody waiting must drop it."""
    q = Clocked(max_length=1)
    q.publish(1000, b"m0")
    q.publish(1000, b"m1", ttl_ms=0)
    assert q.machine.ready_count == 0
    assert q.machine.dropped == {"rejected": 0, "expired": 1, "maxlen": 1, "delivery_limit": 0}


# ------------------------------------------------------------ delivery limit, back-off


def test_delivery_limit_dead_letters_after_limit_returns():
    q = Clocked(delivery_limit=2, dead_letter_exchange="dlx")
    q.publish(0, b"poison")
    for attempt in range(1, 4):
        reply, _ = q.at(attempt, Get("g", "o", False))
        message = reply[0]
        assert message.delivery_count == attempt
        _, effects = q.at(attempt, Requeue("g", [message.seq]))
        if attempt < 3:
            assert effects == [] and q.machine.ready_count == 1 and message.count_header
    (effect,) = effects
    assert effect.reason == "delivery_limit" and [m.body for m in effect.messages] == [b"poison"]
    assert q.machine.ready_count == 0 and q.machine.dead_lettered["delivery_limit"] == 1


def test_delivery_limit_zero_without_dlx_drops_on_the_first_return():
    q = Clocked(delivery_limit=0)
    q.at(0, Checkout("c", "o-1", 0, False, 0, False, 10))
    q.publish(0, b"m")
    q.at(1, Down("o-1"))  # a lost consumer counts as a return, as in rabbit_fifo
    assert q.machine.ready_count == 0 and q.machine.dropped["delivery_limit"] == 1


def test_retry_backoff_delays_a_returned_message():
    q = Clocked(retry_backoff_ms=100, retry_backoff_multiplier=3, retry_backoff_max_ms=500)
    q.publish(0, b"m")
    delays = []
    now = 0
    for _ in range(4):
        reply, _ = q.at(now, Get("g", "o", False))
        q.at(now, Requeue("g", [reply[0].seq]))
        due = q.machine.next_deadline_ms
        delays.append(due - now)
        assert q.at(due - 1, Get("g", "o", True))[0] is None  # not visible before its back-off ends
        assert q.machine.ready_count == 0
        q.at(due, Tick())
        assert q.machine.ready_count == 1
        now = due
    assert delays == [100, 300, 500, 500]  # 100 * 3^n, at most 500


def test_backoff_release_delivers_to_a_waiting_consumer_on_tick():
    q = Clocked(retry_backoff_ms=50)
    q.at(0, Checkout("c", "o", 1, False, 0, False, 10))
    _, effects = q.publish(0, b"m")
    q.at(1, Requeue("c", [effects[0].message.seq]))
    _, effects = q.at(51, Tick())
    assert [(e.message.body, e.redelivered) for e in effects if type(e) is Deliver] == [(b"m", True)]


# ------------------------------------------------------------ single active consumer


def test_single_active_consumer_serves_the_first_and_hands_over_in_order():
    q = Clocked(single_active_consumer=True)
    for consumer, owner in (("a", "o-a"), ("b", "o-b"), ("c", "o-c")):
        q.at(0, Checkout(consumer, owner, 0, True, 0, False, 100))
    _, effects = q.publish(0, b"1", b"2", b"3")
    assert [(e.consumer_id, e.message.body) for e in effects] == [("a", b"1"), ("a", b"2"), ("a", b"3")]
    q.at(1, Cancel("a"))
    _, effects = q.publish(1, b"4")
    assert [e.consumer_id for e in effects] == ["b"]
    q.at(2, Down("o-b"))
    _, effects = q.publish(2, b"5")
    assert [e.consumer_id for e in effects] == ["c"]
    assert q.machine.active_consumer_count == 1


def test_single_active_consumer_waiting_ones_get_nothing_while_the_active_one_is_full():
    q = Clocked(single_active_consumer=True)
    q.at(0, Checkout("a", "o-a", 1, False, 0, False, 100))
    q.at(0, Checkout("b", "o-b", 1, False, 0, False, 100))
    _, effects = q.publish(0, b"1", b"2")
    assert [e.consumer_id for e in effects] == ["a"] and q.machine.ready_count == 1
    # a's connection goes: its unacked message comes back, and b gets both, in order
    _, effects = q.at(1, Down("o-a"))
    assert [(e.consumer_id, e.message.body, e.redelivered) for e in effects] == [("b", b"1", True)]


def test_single_active_consumers_share_a_partitioned_queues_partitions_one_at_a_time():
    # Partition 1 of a partitioned queue (partitions.py) is served by the second attached
    # consumer, but only once the one it served before holds none of its messages.
    q = Clocked(single_active_consumer=True)
    q.machine = QueueMachine("/", "amq.partition-1.p", settings=QueueSettings(single_active_consumer=True))
    q.at(0, Checkout("a", "o-a", 0, False, 0, False, 100))
    _, effects = q.publish(0, b"1", b"2")
    assert [e.consumer_id for e in effects] == ["a", "a"]  # the only one: it serves
    q.at(1, Checkout("b", "o-b", 0, False, 0, False, 100))
    _, effects = q.publish(1, b"3")
    assert effects == [] and q.machine.ready_count == 1  # b's turn, after a settles 1 and 2
    _, effects = q.at(2, Settle("a", [0]))
    assert effects == []
    _, effects = q.at(3, Settle("a", [1]))
    assert [(e.consumer_id, e.message.body) for e in effects] == [("b", b"3")]
    _, effects = q.publish(4, b"4")
    assert [e.consumer_id for e in effects] == ["b"]
    # partition 0 (the queue of the name) and a queue not partitioned keep the first
    first = QueueMachine("/", "p", settings=QueueSettings(single_active_consumer=True))
    first.apply(Meta(1, 0), Checkout("a", "o-a", 0, False, 0, False, 100))
    first.apply(Meta(2, 0), Checkout("b", "o-b", 0, False, 0, False, 100))
    _, effects = first.apply(Meta(3, 0), Enqueue([Message("ex", "rk", b"", b"x")]))
    assert [e.consumer_id for e in effects] == ["a"]


# ------------------------------------------------------------------ settings updates


def test_update_settings_applies_limits_at_once_and_cannot_change_the_kind():
    from maxq_raft.machines.commands import UpdateSettings

    q = Clocked()
    q.publish(0, b"1", b"2", b"3")
    reply, _ = q.at(1, UpdateSettings(QueueSettings(max_length=1, dead_letter_exchange="dlx")))
    assert reply is True and q.machine.ready_count == 1 and q.machine.dead_lettered["maxlen"] == 2
    assert type(q.at(2, UpdateSettings(QueueSettings(max_priority=5)))[0]) is Rejected
    assert type(q.at(2, UpdateSettings({"max_length": 1}))[0]) is Rejected
    q.at(3, UpdateSettings(QueueSettings(message_ttl_ms=10)))
    q.publish(3, b"4")
    assert q.machine.ready[0].expires_at_ms is None  # enqueued before the TTL: none
    reply, _ = q.at(20, Get("g", "o", True))
    assert reply[0].body == b"3" and q.machine.ready_count == 0  # "4", now the head, had expired
    assert q.machine.dropped["expired"] == 1


def test_delivery_counts_survive_a_restart_of_a_durable_queue():
    from tests.machines.test_queue_machine import DictBacking

    backing = DictBacking()
    q = Clocked(backing=backing, delivery_limit=2)
    q.at(0, Enqueue([Message("", "q", b"", b"poison", persistent=True)]))
    for attempt in (1, 2):
        reply, _ = q.at(attempt, Get("g", "o", False))
        q.at(attempt, Requeue("g", [reply[0].seq]))
    # A new machine on the same backing, as after a restart.
    after = QueueMachine("/", "q", settings=QueueSettings(delivery_limit=2), backing=backing, durable=True)
    after.recover(next_seq=q.machine.next_seq, spilled_count=1, spill_cursor=min(backing.records))
    reply, _ = after.apply(Meta(10, 10), Get("g", "o", False))
    assert reply[0].delivery_count == 3 and reply[0].count_header  # x-delivery-count 2 on the wire
    after.check_invariants()
    assert after.apply(Meta(11, 11), Requeue("g", [reply[0].seq]))[0] == 1
    assert after.ready_count == 0 and after.dropped["delivery_limit"] == 1 and backing.records == {}


def test_held_dead_letters_are_found_again_by_reason_once_stale():
    """A shard leader performs dead letters that an earlier leader took on and never finished
    (server/dead_letter.held_dead_letters): those held for DEAD_LETTER_STALE_MS and in flight
    nowhere here, one effect per reason, with the death's time and the queue's current DLX."""
    from maxq_raft.server.dead_letter import DEAD_LETTER_STALE_MS, held_dead_letters

    q = Clocked(dead_letter_exchange="dlx", dead_letter_routing_key="dead", max_length=1)
    q.at(0, Checkout("c", "o", 1, False, 0, False, 10))
    for i in range(3):
        q.at(0, Enqueue([Message("ex", "rk", b"", b"%d" % i)]))  # c holds 0, 1 dropped by 2 (maxlen)
    q.at(100, Discard("c", [0]))  # rejected at 100
    assert sorted(q.machine.dead_lettering) == [0, 1]
    assert q.machine.dead_lettering[1].death == ("maxlen", 0)
    assert q.machine.dead_lettering[0].death == ("rejected", 100)
    assert held_dead_letters(q.machine, DEAD_LETTER_STALE_MS - 1, lambda seq: False) == []
    found = held_dead_letters(q.machine, DEAD_LETTER_STALE_MS + 100, lambda seq: False)
    assert [(e.reason, [m.seq for m in e.messages], e.time_ms, e.exchange, e.routing_key) for e in found] == [
        ("rejected", [0], 100, "dlx", "dead"),
        ("maxlen", [1], 0, "dlx", "dead"),
    ]
    in_flight = {0}
    found = held_dead_letters(q.machine, DEAD_LETTER_STALE_MS + 100, lambda seq: seq in in_flight)
    assert [(e.reason, [m.seq for m in e.messages]) for e in found] == [("maxlen", [1])]
    q.at(200, DeadLettered([0, 1]))
    assert held_dead_letters(q.machine, 10**9, lambda seq: False) == []


# ------------------------------------------------------------------------ stats


def test_the_management_counts_follow_publishes_deliveries_gets_requeues_and_acks():
    """stats_* (message_rates.QueueRates reads them): counted per batch, rejects not as acks,
    a requeued message's second delivery as a redelivery, the same on either delivery path."""
    from maxq_raft.machines.commands import Settle

    q = Clocked()
    q.publish(1, b"a", b"b", b"c", b"d")
    _, effects = q.at(2, Checkout("c", "o", 0, False, 0, False, 3))  # one consumer: the fast path
    seqs = [e.message.seq for e in effects if type(e) is Deliver]
    assert len(seqs) == 3
    q.at(3, Settle("c", seqs[:1]))
    q.at(4, Discard("c", seqs[1:2]))  # a reject: not an ack
    q.at(5, Requeue("c", seqs[2:]))
    q.at(6, Checkout("c2", "o", 0, False, 0, False, 2))  # two consumers (c has no credit left): the ring walk
    q.publish(7, b"e")  # no credit anywhere: it waits
    reply, _ = q.at(8, Get("g", "o", True))
    m = q.machine
    assert reply is not None and reply[0].body == b"e"
    assert (m.stats_published, m.stats_acked) == (5, 1)
    # c took 3; c2 the requeued one (a redelivery) and "d"; the get "e"
    assert (m.stats_delivered, m.stats_redelivered, m.stats_got) == (5, 1, 1)
