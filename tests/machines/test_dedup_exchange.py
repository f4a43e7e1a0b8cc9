"""Exchange windows in the queue machine (machines/dedup.py, "Exchange windows"): the
x-message-deduplication exchange's window, kept in each queue it routes to.

Examples: a queue without a window of its own drops an id its exchange's window has seen (and
confirms it); two exchanges have two windows; a queue's own window and an exchange's both apply;
the exchange's size and TTL come with each Enqueue; a Tick drops an emptied window; snapshots
and a single node's store keep the windows, each in its own store range; malformed exchange
items are refused before anything changes; the items survive a log entry; the declare's checks.
"""

from __future__ import annotations

import copy

import msgpack
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from maxq_raft.machines import dedup
from maxq_raft.machines.commands import Enqueue, Tick
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue_args import DEDUP_CACHE_SIZE_MAX, QueueSettings
from maxq_raft.machines.queue_types import Overflowed, Rejected
from maxq_raft.machines.snapshot import SnapshotError, dump_queue, load_queue
from maxq_raft.replication.entries import decode_command, encode_command

from .test_dedup import Clocked, ClockedQueueRules, queued, round_trip
from .test_queue_machine import DictBacking

STRIDE = dedup.EXCHANGE_WINDOW_STRIDE


PLAIN = QueueSettings()


def make(settings: QueueSettings = PLAIN, **kwargs) -> Clocked:
    return Clocked(make_queue_machine("/", "q", settings=settings, **kwargs))


def via(q: Clocked, time_ms: int, exchange: str | None, *keys: str, size: int = 100, ttl_ms: int | None = None):
    """One Enqueue of one message per key, published to `exchange` (None: not a dedup exchange)."""
    messages = [Message(exchange or "", "q", b"", f"m{q.index}-{i}".encode()) for i in range(len(keys))]
    scope = () if exchange is None else (exchange, size, ttl_ms)
    return q(time_ms, Enqueue(messages, [(p, key, None, *scope) for p, key in enumerate(keys)]))


def test_an_exchange_window_drops_and_confirms_a_duplicate_in_a_queue_without_its_own() -> None:
    q = make()
    assert via(q, 0, "ex", "sa", "sb") == 2
    assert via(q, 1, "ex", "sa", "sc", "sc") == 3  # all confirmed: "sa" seen, the second "sc" repeats
    assert queued(q.machine) == 3
    assert via(q, 2, None, "sa") == 1  # not through the exchange: its window does not apply
    assert via(q, 3, "other", "sa") == 1  # another exchange: another window
    assert queued(q.machine) == 5
    assert sorted(q.machine.exchange_windows) == ["ex", "other"]
    assert q.machine.exchange_windows["ex"].store_base != q.machine.exchange_windows["other"].store_base


def test_the_queues_own_window_and_the_exchanges_both_apply() -> None:
    q = make(QueueSettings(deduplication=True))
    via(q, 0, None, "sa")  # recorded in the queue's window only
    via(q, 1, "ex", "sa", "sb")  # "sa": the queue's window has it; "sb" recorded in both
    assert queued(q.machine) == 2
    via(q, 2, None, "sb")  # the queue's window saw "sb" through the exchange
    via(q, 3, "ex", "sb")
    assert queued(q.machine) == 2
    assert q.machine.dedup_window.duplicates == 3


def test_the_exchanges_size_and_ttl_come_with_each_enqueue() -> None:
    q = make()
    via(q, 0, "ex", "sa", "sb", "sc", size=3)
    via(q, 1, "ex", "sd", size=2)  # resized: "sa" and "sb" leave
    assert list(q.machine.exchange_windows["ex"].entries) == ["sc", "sd"]
    via(q, 2, "ex", "sa", size=2, ttl_ms=100)  # kept; recorded until 102 ("sc" leaves)
    via(q, 101, "ex", "sa", size=2, ttl_ms=100)
    assert queued(q.machine) == 5
    via(q, 102, "ex", "sa", size=2, ttl_ms=100)
    assert queued(q.machine) == 6
    messages = [Message("ex", "q", b"", b"own ttl")]
    q(110, Enqueue(messages, [(0, "se", 5, "ex", 2, 100)]))  # the publish's x-cache-ttl wins
    assert q.machine.exchange_windows["ex"].entries["se"][0] == 115


def test_a_tick_drops_an_emptied_exchange_window() -> None:
    q = make()
    via(q, 0, "ex", "sa", ttl_ms=50)
    q(10, Tick())
    assert "ex" in q.machine.exchange_windows
    q(60, Tick())
    assert q.machine.exchange_windows == {}
    via(q, 61, "ex", "sa", ttl_ms=50)  # a new window: "sa" is new to it
    assert queued(q.machine) == 2


def test_a_snapshot_carries_the_exchange_windows() -> None:
    q = make(QueueSettings(deduplication=True, dedup_cache_ttl_ms=500))
    via(q, 0, "ex", "sa", "sb", size=5, ttl_ms=1_000)
    via(q, 0, "other", "sa", size=2)
    restored = round_trip(q.machine)
    assert {e: w.dump_scoped() for e, w in restored.exchange_windows.items()} == {
        e: w.dump_scoped() for e, w in q.machine.exchange_windows.items()
    }
    r = Clocked(restored)
    r.index = q.index
    for clocked in (q, r):
        via(clocked, 10, "ex", "sa", "sc", size=5, ttl_ms=1_000)
        via(clocked, 2_000, "ex", "sa", size=5, ttl_ms=1_000)  # expired in both windows: kept
    assert queued(r.machine) == queued(q.machine) == 4


def test_a_snapshot_with_a_bad_exchange_window_does_not_load() -> None:
    q = make()
    via(q, 0, "ex", "sa")
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(q.machine)]
    records[0][1]["exchange_windows"][0][3] = 7  # a store base off the stride
    with pytest.raises(SnapshotError, match="bad exchange deduplication window"):
        load_queue(records)


def test_a_version_5_snapshot_without_exchange_windows_still_loads() -> None:
    q = make()
    via(q, 0, "ex", "sa")
    records = [msgpack.unpackb(msgpack.packb(r, use_bin_type=True), raw=False) for r in dump_queue(q.machine)]
    header = records[0][1]
    header["version"] = 5
    del header["exchange_windows"]
    assert load_queue(records).exchange_windows == {}


def test_a_durable_queue_keeps_each_window_in_its_own_store_range() -> None:
    backing = DictBacking()
    settings = QueueSettings(deduplication=True, dedup_cache_size=2)
    q = make(settings, backing=backing, durable=True)
    via(q, 0, "ex", "sa", "sb", "sc", size=2)  # the queue's window and ex's both evict "sa"
    via(q, 0, "other", "sa", size=5)  # a duplicate nowhere: "sa" left both windows
    stored = backing.dedup.values()
    assert all(scope == ("" if s < STRIDE else "ex" if s < 2 * STRIDE else "other") for s, _e, _k, scope in stored)
    assert sorted((s // STRIDE, key) for s, _e, key, _scope in stored) == [
        (0, "sa"),
        (0, "sc"),
        (1, "sb"),
        (1, "sc"),
        (2, "sa"),
    ]
    restarted = make_queue_machine("/", "q", settings=settings, backing=copy.deepcopy(backing), durable=True)
    restarted.recover_dedup()
    restarted.check_invariants()
    assert restarted.dedup_window.dump() == q.machine.dedup_window.dump()
    assert {e: w.dump() for e, w in restarted.exchange_windows.items()} == {
        e: w.dump() for e, w in q.machine.exchange_windows.items()
    }
    r = Clocked(restarted)
    via(r, 1, "other", "sa", "sd", size=5)  # "sa" still a duplicate for "other"; "sd" new
    via(r, 1, "ex", "sb", size=2)  # the queue's window evicted "sb", ex's still has it
    assert queued(restarted) == 1


@pytest.mark.parametrize(
    "item",
    [
        (0, "sa", None, "", 10, None),  # no exchange name
        (0, "sa", None, "x" * 256, 10, None),
        (0, "sa", None, "ex", 0, None),
        (0, "sa", None, "ex", DEDUP_CACHE_SIZE_MAX + 1, None),
        (0, "sa", None, "ex", 10, 0),
        (0, "sa", None, "ex", "10", None),
        (0, "sa", None, 7, 10, None),
        (0, "sa", None, "ex", 10),  # 5 fields
    ],
)
def test_malformed_exchange_items_are_refused_before_anything_changes(item) -> None:
    for queue_settings in (QueueSettings(deduplication=True), QueueSettings()):
        q = make(queue_settings)
        reply = q(0, Enqueue([Message("", "q", b"", b"x")], [item]))
        assert type(reply) is Rejected and reply.reply_code == 541
        assert queued(q.machine) == 0 and q.machine.exchange_windows == {}


def test_an_enqueue_with_exchange_items_survives_a_log_entry() -> None:
    command = Enqueue([Message("ex", "", b"", b"a")], [(0, "sa", 5, "ex", 10, None)])
    raw = msgpack.unpackb(msgpack.packb(encode_command(command), use_bin_type=True), raw=False)
    assert decode_command(raw, False).dedup == [(0, "sa", 5, "ex", 10, None)]


@pytest.mark.parametrize(
    "arguments,error",
    [
        ({}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
        ({"x-cache-size": 0}, "'x-cache-size' must be an integer greater than 0"),
        ({"x-cache-size": "10"}, "'x-cache-size' must be an integer greater than 0"),
        ({"x-cache-size": DEDUP_CACHE_SIZE_MAX + 1}, f"at most {DEDUP_CACHE_SIZE_MAX}"),
        ({"x-cache-size": 10, "x-cache-ttl": 0}, "'x-cache-ttl' must be an integer greater than 0"),
        ({"x-cache-size": 10, "x-cache-persistence": "tape"}, "must be either 'disk' or 'memory'"),
    ],
)
def test_the_declares_checks(arguments, error) -> None:
    assert error in dedup.dedup_exchange_error(arguments)


def test_good_declare_arguments() -> None:
    for arguments in (
        {"x-cache-size": 10},
        {"x-cache-size": 10, "x-cache-ttl": 1000, "x-cache-persistence": "disk"},
        {"x-cache-size": DEDUP_CACHE_SIZE_MAX, "x-cache-persistence": b"memory"},
    ):
        assert dedup.dedup_exchange_error(arguments) is None
    assert dedup.exchange_scope("ex", {"x-cache-size": 10}) == ("ex", 10, None)


# ------------------------------------------------------------------ a stateful test against a model

EXCHANGES = ("ea", "eb")
KEYS = ("sa", "sb", "sc", "sd")


class ExchangeWindowsStateful(ClockedQueueRules):
    """A queue (with or without a window of its own, durable or not, length-limited with
    reject-publish or not) fed by two dedup exchanges and straight publishes, against a model
    that keeps each window as a plain list of recordings: an id is a duplicate for a window
    exactly when its latest recording is among that window's last `size` ones and its time is
    not over; a publish is a duplicate when any window that applies to it says so. After every
    step the queue holds what the model says, each window answers as its model, and a durable
    queue's store holds exactly the windows' slots, each exchange's in its own range."""

    @initialize(
        own_window=st.booleans(),
        own_size=st.sampled_from([1, 3]),
        max_length=st.sampled_from([None, None, 3]),
        durable=st.booleans(),
    )
    def start(self, own_window: bool, own_size: int, max_length: int | None, durable: bool) -> None:
        self.settings = QueueSettings(
            deduplication=own_window, dedup_cache_size=own_size, max_length=max_length, overflow="reject-publish"
        )
        self.backing = DictBacking() if durable else None
        self.q = Clocked(make_queue_machine("/", "q", settings=self.settings, backing=self.backing, durable=durable))
        self.now_ms = 0
        # window name ("" for the queue's own) -> [(key, expires ms or None)], oldest first
        self.recordings: dict[str, list[tuple[str, int | None]]] = {"": []} if own_window else {}
        self.sizes: dict[str, int] = {"": own_size}
        self.queue: list[bytes] = []
        self.bodies = 0

    def _seen(self, window: str, key: str, now_ms: int) -> bool:
        for recorded, expires_ms in reversed(self.recordings.get(window, [])[-self.sizes[window] :]):
            if recorded == key:
                return expires_ms is None or expires_ms > now_ms
        return False

    @rule(
        items=st.lists(
            st.tuples(st.sampled_from([None, *EXCHANGES]), st.sampled_from(KEYS), st.sampled_from([None, None, 5, 60])),
            min_size=1,
            max_size=5,
        ),
        sizes=st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4])),
        ttls=st.tuples(st.sampled_from([None, 10, 40]), st.sampled_from([None, 10, 40])),
    )
    def publish(self, items: list, sizes: tuple[int, int], ttls: tuple) -> None:
        scope = {e: (e, sizes[i], ttls[i]) for i, e in enumerate(EXCHANGES)}
        messages, ids, bodies = [], [], []
        for position, (exchange, key, ttl) in enumerate(items):
            body = b"m%d" % self.bodies
            self.bodies += 1
            bodies.append(body)
            messages.append(Message(exchange or "", "q", b"", body))
            ids.append((position, key, ttl, *scope[exchange]) if exchange else (position, key, ttl))
        reply = self.q(self.now_ms, Enqueue(messages, ids))
        # The model (machines/dedup.py, `_enqueue_dedup`).
        for exchange in {e for e, _k, _t in items if e is not None}:
            self.sizes[exchange] = scope[exchange][1]
            kept = self.recordings.setdefault(exchange, [])
            del kept[: -self.sizes[exchange]]
        own = "" in self.recordings
        first_of: dict[tuple[str, str], int] = {}
        queued_at: dict[int, bool] = {}
        refused, recorded = [], []
        for position, (exchange, key, ttl) in enumerate(items):
            windows = ([""] if own else []) + ([exchange] if exchange else [])
            if windows:
                if any(self._seen(w, key, self.now_ms) for w in windows):
                    continue
                first = next((first_of[(w, key)] for w in windows if (w, key) in first_of), None)
                if first is not None:
                    if not queued_at[first]:
                        refused.append(position)
                    continue
                for w in windows:
                    first_of[(w, key)] = position
            room = self.settings.max_length is None or len(self.queue) < self.settings.max_length
            queued_at[position] = room
            if room:
                self.queue.append(bodies[position])
                for w in windows:
                    ttl_ms = ttl or (scope[w][2] if w else None)
                    recorded.append((w, key, None if ttl_ms is None else self.now_ms + ttl_ms))
            else:
                refused.append(position)
        for w, key, expires_ms in recorded:
            self.recordings[w].append((key, expires_ms))
            del self.recordings[w][: -self.sizes[w]]
        assert reply == (Overflowed(len(items) - len(refused), refused) if refused else len(items))

    @rule()
    def snapshot(self) -> None:
        backing = DictBacking() if self.backing is not None else None
        restored = round_trip(self.q.machine, backing)
        restored.check_invariants()
        if backing is not None:
            assert backing.dedup.keys() == self.backing.dedup.keys()
            self.backing = backing
        self.q.machine = restored

    @rule()
    def restart(self) -> None:
        """A single node's restart: a new machine whose windows come from the store alone."""
        if self.backing is None:
            return
        original = self.q.machine
        restarted = make_queue_machine(
            "/", "q", settings=self.settings, backing=copy.deepcopy(self.backing), durable=True
        )
        restarted.recover_dedup()
        restarted.check_invariants()
        if original.dedup_window is not None:
            assert restarted.dedup_window.dump() == original.dedup_window.dump()
        # (an emptied window waits for a tick to leave; the store has nothing of it)
        assert {e: w.dump() for e, w in restarted.exchange_windows.items()} == {
            e: w.dump() for e, w in original.exchange_windows.items() if w.order
        }

    @invariant()
    def agrees_with_the_model(self) -> None:
        machine = self.q.machine
        assert sorted(m.body for m in machine._ready_in_memory()) == sorted(self.queue)
        now = machine.now_ms
        windows = {"": machine.dedup_window} if machine.dedup_window is not None else {}
        windows.update(machine.exchange_windows)
        for name in self.recordings:
            for key in KEYS:
                window = windows.get(name)
                seen = window is not None and window.seen(key, now)
                assert seen == self._seen(name, key, now), (name, key)
        if self.backing is not None:
            expected = [] if machine.dedup_window is None else [n for n, _ in machine.dedup_window.order]
            for window in machine.exchange_windows.values():
                expected += [window.store_base + n for n, _ in window.order]
            assert sorted(self.backing.dedup) == sorted(expected)


ExchangeWindowsStateful.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_exchange_windows_against_model = ExchangeWindowsStateful.TestCase
