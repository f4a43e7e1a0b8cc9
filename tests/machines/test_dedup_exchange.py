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

from maxq_raft.machines import dedup
from maxq_raft.machines.commands import Enqueue, Tick
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue_args import DEDUP_CACHE_SIZE_MAX, QueueSettings
from maxq_raft.machines.queue_types import Rejected
from maxq_raft.machines.snapshot import SnapshotError, dump_queue, load_queue
from maxq_raft.replication.entries import decode_command, encode_command

from .test_dedup import Clocked, queued, round_trip
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
    for settings in (QueueSettings(deduplication=True), QueueSettings()):
        q = make(settings)
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
