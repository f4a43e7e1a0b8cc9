"""x-message-deduplication in the queue machine (machines/dedup.py): examples, then a stateful test.

The examples: a duplicate within the window is confirmed (counted as accepted) and not queued;
eviction by count; expiry by the log's time (a proposer's clock behind does not revive an id);
a publish's own x-cache-ttl; one Enqueue with the same id twice; an id a full queue refused is
not recorded; a queue without the argument ignores ids; a policy switching it on, resizing it,
switching it off; snapshots and a single node's restart keep the window; malformed ids refused
before anything changes; the shell's key of a header value; the arguments' checks.

The stateful test drives a deduplicating queue (random x-cache-size, x-cache-ttl, a length
limit with reject-publish, durable or not) through publishes with ids from a small alphabet,
time, ticks, consumption, policy changes, snapshot round trips and restarts, against a model
that is a plain list of recordings: an id is a duplicate exactly when its latest recording is
among the last x-cache-size ones and its time is not over. After every step the queue holds
exactly the messages the model says were enqueued, and a durable queue's store holds exactly
the window's slots.
"""

from __future__ import annotations

import copy
from decimal import Decimal

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from maxq_raft.machines import dedup
from maxq_raft.machines.commands import Enqueue, Get, Tick, UpdateSettings
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import (
    DEDUP_CACHE_SIZE_DEFAULT,
    DEDUP_CACHE_SIZE_MAX,
    QueueArgumentError,
    QueueSettings,
    parse_queue_arguments,
)
from maxq_raft.machines.queue_types import Meta, Overflowed, Rejected
from maxq_raft.machines.snapshot import dump_queue, load_queue
from maxq_raft.replication.entries import decode_command, encode_command

from .test_queue_machine import DictBacking

DEDUP = QueueSettings(deduplication=True)


class Clocked:
    """A machine and a log index; `q(time_ms, command)` applies one entry."""

    def __init__(self, machine: QueueMachine) -> None:
        self.machine = machine
        self.index = 0

    def __call__(self, time_ms: int, command):
        self.index += 1
        reply, effects = self.machine.apply(Meta(self.index, time_ms), command)
        self.machine.check_invariants()
        return reply

    def publish(self, time_ms: int, *ids: str | None, ttl_ms: int | None = None):
        """One Enqueue of one message per id (None: without the header)."""
        messages = [Message("", "q", b"", f"m{self.index}-{i}".encode()) for i in range(len(ids))]
        items = [(p, key, ttl_ms) for p, key in enumerate(ids) if key is not None]
        return self(time_ms, Enqueue(messages, items))


def queued(machine: QueueMachine) -> int:
    return machine.ready_count


def make(settings: QueueSettings = DEDUP, **kwargs) -> Clocked:
    return Clocked(make_queue_machine("/", "q", settings=settings, **kwargs))


def test_a_duplicate_within_the_window_is_confirmed_and_not_queued() -> None:
    q = make()
    assert q.publish(1, "sa", "sb", None) == 3
    assert q.publish(2, "sa", None, "sc") == 3  # all three confirmed: the duplicate is "taken"
    assert queued(q.machine) == 5
    assert q.machine.dedup_window.duplicates == 1


def test_the_window_evicts_the_oldest_id_by_count() -> None:
    q = make(DEDUP._replace(dedup_cache_size=2))
    q.publish(1, "sa")
    q.publish(1, "sb")
    q.publish(1, "sc")  # "sa" leaves
    assert queued(q.machine) == 3
    q.publish(1, "sa")  # kept: outside the window; it evicts "sb"
    q.publish(1, "sc")  # still in it
    assert queued(q.machine) == 4
    q.publish(1, "sb")
    assert queued(q.machine) == 5


def test_ids_expire_by_the_logs_time_and_a_clock_behind_revives_nothing() -> None:
    q = make(DEDUP._replace(dedup_cache_ttl_ms=100))
    q.publish(1_000, "sa")
    q.publish(1_099, "sa")  # within 100 ms
    assert queued(q.machine) == 1
    q.publish(1_100, "sa")  # over: kept, and recorded again until 1,200
    assert queued(q.machine) == 2
    q.publish(1_050, "sa")  # an entry stamped by a proposer whose clock is behind: queue time is 1,100
    assert queued(q.machine) == 2
    q.publish(1_200, "sa")
    assert queued(q.machine) == 3


def test_a_publishes_own_x_cache_ttl_wins_and_no_ttl_means_until_evicted() -> None:
    q = make(DEDUP._replace(dedup_cache_ttl_ms=1_000))
    q.publish(0, "sa", ttl_ms=10)
    q.publish(0, "sb")
    q.publish(10, "sa", "sb")  # "sa" is over after 10 ms, "sb" lives 1,000
    assert queued(q.machine) == 3
    forever = make()  # no x-cache-ttl: an id leaves only by count
    forever.publish(0, "sa")
    forever.publish(10**12, "sa")
    assert queued(forever.machine) == 1


def test_the_same_id_twice_in_one_enqueue_and_an_id_a_full_queue_refused() -> None:
    q = make(DEDUP._replace(max_length=1, overflow="reject-publish"))
    # "sa" is queued; "sb" is refused (full), and so is its repeat; the repeat of "sa" is confirmed.
    assert q.publish(0, "sa", "sb", "sa", "sb") == Overflowed(2, [1, 3])
    q(0, Get("g", "o", True))  # room again
    assert q.publish(0, "sb") == 1  # a refused id was not recorded: publishing it again works
    assert queued(q.machine) == 1
    assert q.publish(0, "sa", "sb") == 2  # both duplicates now, though the queue is full
    assert queued(q.machine) == 1


def test_a_delayed_publish_is_checked_and_recorded_when_published() -> None:
    q = make()
    delayed = Message("", "q", b"", b"later", delay_ms=100)
    assert q(0, Enqueue([delayed], [(0, "sa", None)])) == 1
    assert q.publish(1, "sa") == 1  # a duplicate while the first still waits for its due time
    assert queued(q.machine) == 0 and q.machine.delayed.count == 1
    q(100, Tick())
    assert queued(q.machine) == 1


def test_an_id_stays_recorded_when_its_message_is_consumed() -> None:
    q = make()
    q.publish(0, "sa")
    q(0, Get("g", "o", True))
    assert queued(q.machine) == 0
    q.publish(1, "sa")
    assert queued(q.machine) == 0  # (docs/queue-features.md: unlike the plugin's queue mode)


def test_a_queue_without_the_argument_ignores_ids_and_a_policy_switches_it() -> None:
    q = make(QueueSettings())
    assert q.machine.dedup_window is None
    q.publish(0, "sa")
    q.publish(0, "sa")
    assert queued(q.machine) == 2
    assert q(0, UpdateSettings(DEDUP._replace(dedup_cache_size=2))) is True
    q.publish(0, "sa", "sb", "sc", "sc")
    assert queued(q.machine) == 5  # the window starts empty; "sa" is evicted by count
    q.publish(0, "sb", "sc")
    assert queued(q.machine) == 5
    assert q(0, UpdateSettings(DEDUP._replace(dedup_cache_size=1))) is True  # "sb" leaves
    q.publish(0, "sb")
    assert queued(q.machine) == 6
    assert q(0, UpdateSettings(QueueSettings())) is True
    assert q.machine.dedup_window is None
    q.publish(0, "sb")
    assert queued(q.machine) == 7


def test_an_sqs_fifo_queue_keeps_its_own_deduplication() -> None:
    q = make(QueueSettings(fifo=True, deduplication=True))
    assert q.machine.dedup_window is None


def round_trip(machine: QueueMachine, backing=None) -> QueueMachine:
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(machine)]
    return load_queue(records, backing=backing)


def test_a_snapshot_carries_the_window_stale_slots_and_all() -> None:
    q = make(DEDUP._replace(dedup_cache_size=3, dedup_cache_ttl_ms=50))
    q.publish(0, "i7", ttl_ms=1_000)
    q.publish(0, "sa")
    q.publish(60, "sa")  # expired behind a live slot: recorded again, its first slot is stale
    restored = round_trip(q.machine)
    assert restored.dedup_window.dump() == q.machine.dedup_window.dump()
    assert [s[2] for s in restored.dedup_window.dump()["slots"]] == [1_000, None, 110]
    r = Clocked(restored)
    r.index = q.index
    for clocked in (q, r):
        clocked.publish(70, "sa", "i7", "sb")  # "sb" is new and evicts the oldest slot ("i7")
        clocked.publish(200, "sa", "i7")  # the stale and expired slots go first; both are new
    assert r.machine.dedup_window.dump() == q.machine.dedup_window.dump()
    assert queued(r.machine) == queued(q.machine) == 6


def test_pruning_is_bounded_per_command_and_changes_no_answer() -> None:
    window = dedup.DedupWindow(100, 10)
    for i in range(10):
        window.record(f"s{i}", 10)
    window.prune(10, limit=3)
    assert len(window.order) == 7 and not window.seen("s9", 10)
    window.prune(10)
    assert not window.order and not window.entries
    window.check_invariants()


def test_a_window_whose_stale_slot_has_no_live_one_does_not_load() -> None:
    window = dedup.DedupWindow(5, None)
    with pytest.raises(ValueError):
        window.load({"next_number": 3, "slots": [[1, "sa", None], [2, "sb", 7]]})


def test_a_version_3_snapshot_without_a_window_still_loads() -> None:
    q = make()
    q.publish(0, "sa")
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(q.machine)]
    header = records[0][1]
    header["version"] = 3
    del header["dedup_window"]
    restored = load_queue(records)
    assert restored.dedup_window is not None and not restored.dedup_window.order


def test_a_durable_queue_keeps_its_window_in_its_backing_for_a_restart() -> None:
    backing = DictBacking()
    settings = DEDUP._replace(dedup_cache_size=3)
    q = make(settings, backing=backing, durable=True)
    q.publish(0, "sa", "sb")
    q.publish(0, "sc", "sd")  # "sa" evicted: forgotten in the store too
    assert sorted(e[2] for e in backing.dedup.values()) == ["sb", "sc", "sd"]
    restarted = make_queue_machine("/", "q", settings=settings, backing=copy.deepcopy(backing), durable=True)
    restarted.recover_dedup()
    restarted.check_invariants()
    assert restarted.dedup_window.dump() == q.machine.dedup_window.dump()
    r = Clocked(restarted)
    r.publish(1, "sb", "sa")
    assert queued(restarted) == 1  # "sb" is still a duplicate after the restart; "sa" is not


def test_a_duplicate_on_a_durable_queue_writes_to_the_store() -> None:
    """So that a single node confirms it only after the next fsync (docs/queue-features.md)."""
    backing = DictBacking()
    q = make(backing=backing, durable=True)
    q.publish(0, "sa")
    writes = []
    backing.dedup_write = lambda entries, next_number: writes.append(list(entries))  # type: ignore[method-assign]
    q.publish(0, "sa")
    assert writes == [[]]


@pytest.mark.parametrize(
    "items",
    [
        "abc",
        [(0, "sa")],
        [(1, "sa", None)],  # past the messages
        [(0, "sa", None), (0, "sb", None)],  # positions not increasing
        [(0, "", None)],
        [(0, 7, None)],
        [(0, "s" + "x" * 200, None)],
        [(0, "sa", 0)],
        [(0, "sa", "10")],
        [(-1, "sa", None)],
    ],
)
def test_malformed_ids_are_refused_before_anything_changes(items) -> None:
    for queue_settings in (DEDUP, QueueSettings()):
        q = make(queue_settings)
        reply = q(0, Enqueue([Message("", "q", b"", b"x")], items))
        assert type(reply) is Rejected and reply.reply_code == 541
        assert queued(q.machine) == 0


def test_the_key_of_a_header_value_keeps_types_apart_and_bounds_its_size() -> None:
    assert dedup.dedup_key("1") == dedup.dedup_key(b"1") == "s1"
    assert dedup.dedup_key(1) == "i1" != dedup.dedup_key(True)
    assert dedup.dedup_key(1.5) == "d1.5" and dedup.dedup_key(Decimal("1.5")) == "dDecimal('1.5')"
    assert dedup.dedup_key(b"\xff") == "xff"
    assert dedup.dedup_key([1]) is None and dedup.dedup_key({"a": 1}) is None and dedup.dedup_key(None) is None
    long = dedup.dedup_key("é" * 100)  # 201 bytes of UTF-8: kept as its hash
    assert long is not None and long.startswith("h") and len(long) == 65
    assert dedup.dedup_key("é" * 60) == "s" + "é" * 60
    assert dedup.dedup_key("\ud800").startswith("h")  # a lone surrogate: no store could hold it
    assert dedup.dedup_ttl(5) == 5 and dedup.dedup_ttl(0) is None and dedup.dedup_ttl("5") is None
    assert dedup.dedup_ttl(True) is None and dedup.dedup_ttl(1 << 40) is None


def test_an_enqueue_with_ids_survives_a_log_entry() -> None:
    messages = [Message("", "q", b"", b"a"), Message("", "q", b"", b"b")]
    command = Enqueue(messages, [(1, "sb", 5)])
    raw = msgpack.unpackb(msgpack.packb(encode_command(command), use_bin_type=True), raw=False)
    decoded = decode_command(raw, False)
    assert decoded.dedup == [(1, "sb", 5)] and [m.body for m in decoded.messages] == [b"a", b"b"]
    plain = encode_command(Enqueue(messages))
    assert len(plain) == 2 and decode_command(plain, False).dedup is None  # as before: older nodes read it


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (
            {"x-message-deduplication": "true"},
            "'x-message-deduplication' for queue 'q' in vhost '/': {unacceptable_type,longstr}",
        ),
        ({"x-cache-size": 0}, "'x-cache-size' for queue 'q' in vhost '/': {value_zero,0}"),
        ({"x-cache-size": -3}, "{value_negative,-3}"),
        ({"x-cache-size": "10"}, "{unacceptable_type,longstr}"),
        (
            {"x-cache-size": DEDUP_CACHE_SIZE_MAX + 1},
            f"{{value_too_large,{DEDUP_CACHE_SIZE_MAX + 1},{DEDUP_CACHE_SIZE_MAX}}}",
        ),
        ({"x-cache-ttl": 0}, "'x-cache-ttl' for queue 'q' in vhost '/': {value_zero,0}"),
        ({"x-cache-ttl": -1}, "{value_negative,-1}"),
        ({"x-cache-ttl": 1.5}, "{unacceptable_type,double}"),
        ({"x-cache-ttl": 1 << 32}, "{value_too_large,4294967296,4294967295}"),
    ],
)
def test_bad_arguments_are_refused_with_rabbitmqs_406_text(arguments, error) -> None:
    with pytest.raises(QueueArgumentError) as raised:
        parse_queue_arguments("/", "q", arguments)
    assert raised.value.reply_text.startswith("invalid arg '") and raised.value.reply_text.endswith(error)


def test_good_arguments() -> None:
    settings = parse_queue_arguments("/", "q", {"x-message-deduplication": True, "x-cache-size": 5, "x-cache-ttl": 9})
    assert (settings.deduplication, settings.dedup_cache_size, settings.dedup_cache_ttl_ms) == (True, 5, 9)
    machine = make_queue_machine("/", "q", settings=parse_queue_arguments("/", "q", {"x-message-deduplication": True}))
    assert machine.dedup_window.size_max == DEDUP_CACHE_SIZE_DEFAULT and machine.dedup_window.ttl_ms is None


# ------------------------------------------------------------------ the stateful test

KEYS = ["sa", "sb", "sc", "sd", "i1"]


class ClockedQueueRules(RuleBasedStateMachine):
    """The rules a stateful test of a queue's windows shares: time passes, ticks, consumption
    (the subclass keeps `q`, `now_ms` and the model's `queue` of bodies)."""

    q: Clocked
    now_ms: int
    queue: list[bytes]

    @rule(ms=st.sampled_from([1, 5, 20, 50]))
    def advance(self, ms: int) -> None:
        self.now_ms += ms

    @rule()
    def tick(self) -> None:
        self.q(self.now_ms, Tick())

    @rule()
    def consume(self) -> None:
        reply = self.q(self.now_ms, Get("g", "o", True))
        assert (reply[0].body if reply else None) == (self.queue.pop(0) if self.queue else None)


class DedupStateful(ClockedQueueRules):
    """A deduplicating queue against a list of recordings (see the module notes)."""

    @initialize(
        size=st.sampled_from([1, 2, 3, 5]),
        ttl_ms=st.sampled_from([None, 10, 40]),
        max_length=st.sampled_from([None, None, 3]),
        durable=st.booleans(),
        priority=st.booleans(),
    )
    def start(self, size: int, ttl_ms: int | None, max_length: int | None, durable: bool, priority: bool) -> None:
        self.settings = QueueSettings(
            deduplication=True,
            dedup_cache_size=size,
            dedup_cache_ttl_ms=ttl_ms,
            max_length=max_length,
            overflow="reject-publish",
            max_priority=2 if priority else None,
        )
        self.backing = DictBacking() if durable else None
        machine = make_queue_machine("/", "q", settings=self.settings, backing=self.backing, durable=durable)
        self.q = Clocked(machine)
        self.now_ms = 0
        self.recordings: list[tuple[str, int | None]] = []  # (key, expires ms or None), oldest first
        self.size = size
        self.on = True
        self.queue: list[bytes] = []  # bodies the model says are queued, in order
        self.bodies = 0

    # ----------------------------------------------------------- the model

    def _seen(self, key: str, now_ms: int) -> bool:
        for recorded, expires_ms in reversed(self.recordings[-self.size :]):
            if recorded == key:
                return expires_ms is None or expires_ms > now_ms
        return False

    def _record(self, key: str, expires_ms: int | None) -> None:
        self.recordings.append((key, expires_ms))
        del self.recordings[: -self.size]

    # ----------------------------------------------------------- rules

    @rule(
        items=st.lists(
            st.tuples(st.sampled_from([None, *KEYS]), st.sampled_from([None, None, 5, 100])), min_size=1, max_size=5
        )
    )
    def publish(self, items: list) -> None:
        messages = []
        bodies = []
        for _ in items:
            body = b"m%d" % self.bodies
            self.bodies += 1
            bodies.append(body)
            messages.append(Message("", "q", b"", body))
        ids = [(p, key, ttl) for p, (key, ttl) in enumerate(items) if key is not None]
        reply = self.q(self.now_ms, Enqueue(messages, ids))
        # The model: in order, a duplicate is confirmed, a repeat within the batch shares its
        # first's fate, the rest are queued while there is room (reject-publish).
        max_length = self.settings.max_length
        fate: dict[str, bool] = {}  # key -> queued, for this batch
        refused = []
        recorded = []
        for position, (key, ttl) in enumerate(items):
            if self.on and key is not None:
                if self._seen(key, self.now_ms):
                    continue
                if key in fate:
                    if not fate[key]:
                        refused.append(position)
                    continue
            room = max_length is None or len(self.queue) < max_length
            if self.on and key is not None:
                fate[key] = room
                if room:
                    ttl_ms = ttl or self.settings.dedup_cache_ttl_ms
                    recorded.append((key, None if ttl_ms is None else self.now_ms + ttl_ms))
            if room:
                self.queue.append(bodies[position])
            else:
                refused.append(position)
        for key, expires_ms in recorded:
            self._record(key, expires_ms)
        if refused:
            assert reply == Overflowed(len(items) - len(refused), refused)
        else:
            assert reply == len(items)

    @rule(size=st.sampled_from([1, 2, 4]), ttl_ms=st.sampled_from([None, 10]), on=st.booleans())
    def policy(self, size: int, ttl_ms: int | None, on: bool) -> None:
        self.settings = self.settings._replace(deduplication=on, dedup_cache_size=size, dedup_cache_ttl_ms=ttl_ms)
        assert self.q(self.now_ms, UpdateSettings(self.settings)) is True
        if not on or not self.on:
            self.recordings = []  # ended, or started: an empty window
        self.on = on
        self.size = size
        del self.recordings[: -self.size]

    @rule()
    def snapshot(self) -> None:
        original = self.q.machine
        backing = DictBacking() if self.backing is not None else None
        restored = round_trip(original, backing)
        restored.check_invariants()
        if original.dedup_window is not None:
            assert restored.dedup_window.dump() == original.dedup_window.dump()
        if backing is not None:
            assert backing.dedup.keys() == self.backing.dedup.keys()
            self.backing = backing
        self.q.machine = restored

    @rule(by_policy=st.booleans())
    def restart(self, by_policy: bool) -> None:
        """A single node's restart: a new machine whose window comes from the store alone
        (`by_policy`: the replay of the metadata log gave it its settings by UpdateSettings)."""
        if self.backing is None or self.q.machine.dedup_window is None:
            return
        backing = copy.deepcopy(self.backing)
        declared = self.settings._replace(deduplication=False) if by_policy else self.settings
        restarted = make_queue_machine("/", "q", settings=declared, backing=backing, durable=True)
        if by_policy:
            assert restarted.apply(Meta(1, 0), UpdateSettings(self.settings))[0] is True
        restarted.recover_dedup()
        restarted.check_invariants()
        assert restarted.dedup_window.dump() == self.q.machine.dedup_window.dump()

    # ----------------------------------------------------------- invariants

    @invariant()
    def agrees_with_the_model(self) -> None:
        machine = self.q.machine
        assert sorted(m.body for m in machine._ready_in_memory()) == sorted(self.queue)
        window = machine.dedup_window
        if not self.on:
            assert window is None
            return
        for key in KEYS:
            # (the queue's time is the last entry's: `advance` alone does not move it)
            assert window.seen(key, machine.now_ms) == self._seen(key, machine.now_ms), key
        if self.backing is not None:
            # A durable queue's store holds exactly the window's slots (restarts read them back).
            assert sorted(self.backing.dedup) == [number for number, _ in window.order]


DedupStateful.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_dedup_against_model = DedupStateful.TestCase
