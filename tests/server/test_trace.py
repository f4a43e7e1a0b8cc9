"""The message trace's pure parts: records made from a queue machine's applied commands, as the
applier makes them (server/tracer.py), and the trace store's keys, queries and retention
(server/trace_store.py), in memory and on RocksDB."""

from __future__ import annotations

import random

import msgpack
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.amqp.properties import BasicProperties, decode_properties, encode_properties
from maxq_raft.machines.commands import Checkout, Credit, Discard, Down, Enqueue, Get, Requeue, Settle, Tick
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueArgumentError, QueueSettings, parse_queue_arguments
from maxq_raft.machines.queue_types import DeadLetter, Deliver, Meta
from maxq_raft.replication.entries import decode_entry, encode_entry
from maxq_raft.server.trace_store import (
    _PLACE,
    FLUSH_INTERVAL_S,
    MemoryKV,
    RocksKV,
    TraceLog,
    _expand,
    _id_name,
    _name,
    _row_index_keys,
    id_bucket,
)
from maxq_raft.server.tracer import (
    COMPACT_INTERVAL_S,
    TRACE_ID_HEADER,
    Tracer,
    compact_trace,
    trace_id_template,
    with_trace_id,
)

TRACED = QueueSettings(trace=True, dead_letter_exchange="dlx", message_ttl_ms=1000)
KEY = ("/", "q")


def props(message_id: str | None = None, correlation_id: str | None = None) -> bytes:
    return encode_properties(BasicProperties(message_id=message_id, correlation_id=correlation_id))


class Replica:
    """A queue machine and a tracer, applied to as the applier does (before, apply, after)."""

    def __init__(self, settings: QueueSettings = TRACED) -> None:
        self.machine = QueueMachine("/", "q", settings=settings)
        self.tracer = Tracer(TraceLog(MemoryKV()))
        self.tracer.settings_changed(KEY, self.machine)

    def apply(self, index: int, time_ms: int, command) -> object:
        before = self.tracer.before(self.machine, command)
        reply, effects = self.machine.apply(Meta(index, time_ms), command)
        self.tracer.after(Meta(index, time_ms), KEY, self.machine, command, reply, effects, before)
        return reply


def life(replica: Replica, decode: bool = False) -> None:
    """Publish three, deliver, ack one, requeue one, reject one (dead-lettered), let one expire."""
    context = ("alice", "n1@7", "10.0.0.9", [(0, 1, True, ["q", "other"]), (1, 1, True, ["q"])])
    commands = [
        Enqueue(
            [
                Message("ex", "rk", props("m1", "c1"), b"one"),
                Message("ex", "rk", props("m2"), b"two"),
                Message("", "q", props("m3"), b"three"),
            ],
            trace=context,
        ),
        Checkout("n1@7/1/tag", "n1@7/1", 10, False, 0, False, 10),
        Settle("n1@7/1/tag", [0]),
        Requeue("n1@7/1/tag", [1]),
        Discard("n1@7/1/tag", [2]),
        Down("n1@7/1"),
        Enqueue([Message("", "q", props("m4"), b"four")]),
        Tick(),
    ]
    times = [1000, 1001, 1002, 1003, 1004, 1005, 1006, 5000]
    for index, (time_ms, command) in enumerate(zip(times, commands, strict=True), start=1):
        if decode:  # as a cluster member gets it: through the log's encoding
            command = decode_entry(encode_entry(time_ms, [(KEY, command)])).items[0][1]
        replica.apply(index, time_ms, command)


def test_each_step_is_a_record_with_the_publishers_context() -> None:
    replica = Replica()
    life(replica)
    trace = replica.tracer.log
    assert [r["event"] for r in trace.by_message_id("/", "m1")] == ["published", "enqueued", "delivered", "acked"]
    published = trace.by_message_id("/", "m1")[0]
    assert (
        published["user"] == "alice" and published["connection"] == "n1@7" and published["client_address"] == "10.0.0.9"
    )
    assert published["routed_queues"] == ["q", "other"] and published["confirmed"] is True
    assert published["exchange"] == "ex" and published["routing_key"] == "rk" and published["time_ms"] == 1000
    delivered = trace.by_message_id("/", "m1")[2]
    assert delivered["consumer_tag"] == "tag" and delivered["connection"] == "n1@7" and delivered["delivery_count"] == 1
    assert [r["event"] for r in trace.by_message_id("/", "m2")] == [
        "published",
        "enqueued",
        "delivered",
        "requeued",
        "delivered",
        "requeued",  # (its consumer's channel went: Down)
        "dead-lettered",  # (its TTL passed, and the queue has a dead-letter exchange)
    ]
    assert trace.by_message_id("/", "m2")[-1]["reason"] == "expired"
    assert trace.by_message_id("/", "m2")[4]["redelivered"] is True
    assert [r["event"] for r in trace.by_message_id("/", "m3")] == [
        "enqueued",
        "delivered",
        "rejected",
        "dead-lettered",
    ]
    assert trace.by_message_id("/", "m3")[-1]["exchange"] == "dlx"
    assert [r["event"] for r in trace.by_message_id("/", "m4")] == ["enqueued", "dead-lettered"]
    assert [r["event"] for r in trace.by_correlation_id("/", "c1")] == ["published", "enqueued", "delivered", "acked"]
    assert [r["time_ms"] for r in trace.by_queue("/", "q", 1004, 1004)] == [1004, 1004]


def test_replicas_make_the_same_records_from_the_same_log() -> None:
    a, b = Replica(), Replica()
    life(a)
    life(b, decode=True)
    assert a.tracer.log.by_queue("/", "q") == b.tracer.log.by_queue("/", "q")
    assert len(a.tracer.log.by_queue("/", "q")) == 4 + 7 + 4 + 2  # m1 to m4


def test_a_delivery_and_an_ack_name_their_message_through_its_seq() -> None:
    """Deliveries and acks are stored by seq alone (trace_store.py's groups): a query by message
    id finds them through the seq's bucket, a query by queue fills the ids in, also when the
    enqueue is before the range asked for; a queue declared again starts its seqs again, and the
    old message's steps stop at the new enqueue of its seq."""
    replica = Replica(QueueSettings(trace=True))
    replica.apply(1, 100, Checkout("n1@1/1/t", "n1@1/1", 1000, False, 0, False, 1000))
    replica.apply(2, 101, Enqueue([Message("", "q", props(f"a{i}", "c"), b"") for i in range(300)]))
    replica.apply(3, 102, Settle("n1@1/1/t", list(range(300))))
    trace = replica.tracer.log
    assert [(r["event"], r["seq"]) for r in trace.by_message_id("/", "a299")] == [
        ("enqueued", 299),
        ("delivered", 299),
        ("acked", 299),
    ]
    acks = trace.by_queue("/", "q", 102, 102)
    assert len(acks) == 300 and {(r["event"], r["message_id"], r["correlation_id"]) for r in acks[:1]} == {
        ("acked", "a0", "c")
    }
    assert [r["message_id"] for r in acks] == [f"a{i}" for i in range(300)]
    assert len(trace.by_correlation_id("/", "c")) == 900
    # The queue is deleted and declared again: seq 5 is another message's.
    again = Replica(QueueSettings(trace=True))
    again.tracer = replica.tracer
    again.tracer.settings_changed(KEY, again.machine)
    again.apply(4, 200, Checkout("n1@1/2/t", "n1@1/2", 1000, False, 0, False, 1000))
    again.apply(5, 201, Enqueue([Message("", "q", props(f"b{i}"), b"") for i in range(6)]))
    assert [r["event"] for r in trace.by_message_id("/", "a5")] == ["enqueued", "delivered", "acked"]
    assert [(r["event"], r["message_id"]) for r in trace.by_message_id("/", "b5")] == [
        ("enqueued", "b5"),
        ("delivered", "b5"),
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["a", "b"]), st.booleans(), st.integers(1, 3)), min_size=1, max_size=30),
    st.integers(0, 600),
    st.booleans(),
    st.booleans(),
)
def test_deliveries_grouped_at_once_read_as_one_by_one(deliveries, first_seq, in_a_row, fresh) -> None:
    """A command whose effects are all deliveries to one consumer has its DELIVER_GROUP made at
    once (Tracer._records), as a run when they are first deliveries of seqs in a row; with
    anything else among them each delivery is added in turn. Both read as the same records."""
    effects = []
    for i, (consumer, redelivered, delivery_count) in enumerate(deliveries):
        message = Message("", "q", b"\x00\x00", b"")
        message.seq = first_seq + i if in_a_row else first_seq + 7 * i % 11
        message.delivery_count = 1 if fresh else delivery_count
        effects.append(Deliver("a" if fresh else consumer, message, False if fresh else redelivered))
    dead = Message("", "q", props("gone"), b"")
    other = DeadLetter("/", "q", "expired", [dead], 0, "dlx", None)
    tracer = Tracer(TraceLog(MemoryKV()))
    machine = QueueMachine("/", "q", settings=TRACED)
    at_once, at_once_count = tracer._records(Tick(), None, effects, None, machine)
    one_by_one, _ = tracer._records(Tick(), None, [*effects, other], None, machine)
    assert one_by_one[-1][0] == "dead-lettered"
    place = _PLACE.pack(1, 1, 0)
    read = _expand("/", "q", place, msgpack.packb(at_once))
    assert read == _expand("/", "q", place, msgpack.packb(one_by_one[:-1]))
    assert [(r["seq"], r["consumer_tag"], r["redelivered"], r["delivery_count"]) for r in read] == [
        (e.message.seq, "", e.redelivered, e.message.delivery_count) for e in effects
    ]
    assert at_once_count == len(effects)
    seqs = [e.message.seq for e in effects]
    as_run = (
        len({e.consumer_id for e in effects}) == 1
        and not any(e.redelivered for e in effects)
        and all(e.message.delivery_count == 1 for e in effects)
        and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    )
    assert (len(at_once) == 1 and len(at_once[0]) == 4) == as_run, at_once


def _delivered_read(records: list) -> list[dict]:
    """The delivered records of `records` (a command's, from Tracer._records), as a query reads them."""
    groups = [item for item in records if item[0] == "D"]
    place = _PLACE.pack(1, 1, 0)
    return [r for r in _expand("/", "q", place, msgpack.packb(groups)) if r["event"] == "delivered"]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["enqueue", "ack", "requeue"]), st.lists(st.integers(0, 2), min_size=1, max_size=6)),
        min_size=1,
        max_size=25,
    ),
    st.sampled_from([(0, True), (3, False), (8, False)]),
    st.sampled_from(["plain", "max-length", "priority"]),
    st.booleans(),
)
def test_an_enqueues_deliveries_read_as_one_by_one(steps, consumer, kind, second_consumer) -> None:
    """A consumer that keeps up is handed the very messages an Enqueue queued, in its order:
    their group is a run told by its ends (Tracer._records). Through any life of a machine (a
    prefetch that holds some back, requeues, a max-length that refuses some, priorities that
    reorder them, a second consumer that takes its turns), the group of each applied command
    reads as its deliveries one by one."""
    settings = {
        "plain": QueueSettings(trace=True),
        "max-length": QueueSettings(trace=True, max_length=5, overflow="reject-publish"),
        "priority": QueueSettings(trace=True, max_priority=2),
    }[kind]
    machine = make_queue_machine("/", "q", settings=settings)
    tracer = Tracer(TraceLog(MemoryKV()))
    prefetch, no_ack = consumer
    machine.apply(Meta(1, 1), Checkout("c", "n1@1/1", prefetch, no_ack, 0, False, 1000))
    if second_consumer:
        machine.apply(Meta(1, 1), Checkout("d", "n1@1/2", 1, False, 0, False, 1000))
    runs = 0
    for index, (step, priorities) in enumerate(steps, 2):
        checked_out = list(machine.consumers["c"].checked_out)
        if step == "enqueue":
            command = Enqueue(
                [Message("", "q", props(f"m{index}-{i}"), b"", priority=p) for i, p in enumerate(priorities)]
            )
        elif step == "ack":
            command = Settle("c", checked_out[: len(priorities)])
        else:
            command = Requeue("c", checked_out[: len(priorities)])
        reply, effects = machine.apply(Meta(index, index), command)
        at_once, _count = tracer._records(command, reply, effects, None, machine)
        other = DeadLetter("/", "q", "expired", [Message("", "q", props("gone"), b"")], 0, "dlx", None)
        one_by_one, _count = tracer._records(Tick(), None, [*effects, other], None, machine)
        read = _delivered_read(at_once)
        assert read == _delivered_read(one_by_one)
        assert [(r["seq"], r["redelivered"], r["delivery_count"]) for r in read] == [
            (e.message.seq, e.redelivered, e.message.delivery_count) for e in effects
        ]
        runs += any(item[0] == "D" and len(item) == 4 for item in at_once)
    if no_ack and kind == "plain" and not second_consumer and any(step == "enqueue" for step, _priorities in steps):
        assert runs  # (a no-ack consumer takes each Enqueue's messages as they come: a run)


def test_an_enqueue_whose_effects_begin_with_a_redelivery_is_not_read_as_its_run() -> None:
    """The Enqueue shortcut of Tracer._records takes the effects for the command's own messages
    only when they are those very messages: a redelivered one before them, whose seq happens to
    make the ends look like a run of the right length, keeps its own flags."""
    machine = make_queue_machine("/", "q", settings=QueueSettings(trace=True))
    machine.apply(Meta(1, 1), Checkout("c", "n1@1/1", 0, True, 0, False, 1000))
    tracer = Tracer(TraceLog(MemoryKV()))
    old = Message("", "q", props("old"), b"")
    old.seq, old.delivery_count = 9, 2
    fresh = [Message("", "q", props(f"m{i}"), b"") for i in range(3)]
    for seq, message in enumerate(fresh, 10):
        message.seq, message.delivery_count = seq, 1
    effects = [Deliver("c", old, True), Deliver("c", fresh[0], False), Deliver("c", fresh[1], False)]
    records, _count = tracer._records(Enqueue(fresh), None, effects, None, machine)
    assert [(r["seq"], r["redelivered"], r["delivery_count"]) for r in _delivered_read(records)] == [
        (9, True, 2),
        (10, False, 1),
        (11, False, 1),
    ]


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.integers(0, 10**12 - 1000), st.integers(1, 700))
def test_a_runs_id_bucket_keys_are_those_of_its_ids(connection, first, count) -> None:
    """A publish run's n keys, made as bytes from its connection (trace_store._row_index_keys),
    are the keys of `id_bucket` of each of its ids, which a query by one of them scans."""
    place = _PLACE.pack(5, 6, 7)
    run = [first, None, 3, "", "q", [1, ["q"], None], None, None, None, count]
    keys = _row_index_keys(_name("/"), "q", place, [["P", "u", connection, "a", [run]]])
    tail = place[:8] + _name("q") + place[8:]
    expected = {
        b"n" + _name("/") + _id_name(id_bucket(f"{connection}-{n:012d}")) + tail for n in range(first, first + count)
    }
    assert {key for key in keys if key[:1] == b"n"} == expected


def test_a_run_of_publishes_is_one_entry_read_as_each_message(trace_log) -> None:
    """A run of publishes (commands.py, Enqueue.trace) is stored as one entry (trace_store.py,
    PUBLISH_GROUP); a message in its middle is found with all its steps."""
    replica = Replica(QueueSettings(trace=True))
    replica.tracer = Tracer(trace_log)
    replica.tracer.settings_changed(KEY, replica.machine)
    template = trace_id_template(props(), "n1@3")
    assert template is not None
    replica.apply(1, 100, Checkout("n1@3/1/t", "n1@3/1", 5000, False, 0, False, 5000))
    count = 1300  # (seqs over six buckets, numbers over fourteen)
    messages = [Message("", "q" if i != 700 else "other", with_trace_id(template, 50 + i), b"") for i in range(count)]
    # (the runs the publishing session makes: the odd routing key is a run of its own)
    publishes = [(0, 1, True, ["q"], 50, 700), (700, 1, True, ["q"], 750, 1), (701, 1, True, ["q"], 751, count - 701)]
    replica.apply(2, 101, Enqueue(messages, trace=("u", "n1@3", "a", publishes)))
    replica.apply(3, 102, Settle("n1@3/1/t", list(range(count))))
    trace_log.flush()  # (rows are buffered for a moment)
    rows = trace_log.kv.scan(b"q", b"r", 10)
    assert len(rows) == 2  # (the Enqueue's and the Settle's)
    publish_group = msgpack.unpackb(rows[0][1], raw=False)[0]
    assert [entry[9] for entry in publish_group[4]] == [700, 1, 599]  # three runs
    for i in (0, 613, 700, 701, count - 1):
        records = trace_log.by_message_id("/", f"n1@3-{50 + i:012d}")
        assert [(r["event"], r["seq"]) for r in records] == [
            (e, i) for e in ("published", "enqueued", "delivered", "acked")
        ]
        assert records[0]["routing_key"] == ("other" if i == 700 else "q") and records[0]["confirmed"] is True
    assert len(trace_log.by_queue("/", "q", limit=10_000)) == 4 * count


def test_a_run_of_which_some_were_refused_is_recorded_message_by_message() -> None:
    replica = Replica(QueueSettings(trace=True, max_length=3, overflow="reject-publish"))
    template = trace_id_template(props(), "n1@3")
    assert template is not None
    messages = [Message("", "q", with_trace_id(template, 10 + i), b"") for i in range(5)]
    replica.apply(1, 100, Enqueue(messages, trace=("u", "n1@3", "a", [(0, 1, True, ["q"], 10, 5)])))
    trace = replica.tracer.log
    assert [(r["event"], r.get("confirmed")) for r in trace.by_message_id("/", "n1@3-000000000012")] == [
        ("published", True),
        ("enqueued", None),
    ]
    assert [
        (r["event"], r.get("confirmed"), r.get("reason")) for r in trace.by_message_id("/", "n1@3-000000000013")
    ] == [
        ("published", False, None),
        ("refused", None, "overflow"),
    ]


def test_compaction_leaves_no_key_behind(trace_log) -> None:
    replica = Replica(QueueSettings(trace=True))
    replica.tracer = Tracer(trace_log)
    replica.tracer.settings_changed(KEY, replica.machine)
    life(replica)
    template = trace_id_template(props(), "n1@3")
    assert template is not None
    replica.apply(20, 6000, Checkout("n1@7/2/t", "n1@7/2", 1000, False, 0, False, 1000))
    publishes = [(0, 1, True, ["q"], 1000, 150)]  # (one run)
    replica.apply(
        21,
        6001,
        Enqueue(
            [Message("", "q", with_trace_id(template, 1000 + i), b"") for i in range(150)],
            trace=("u", "n1@3", "a", publishes),
        ),
    )
    replica.apply(22, 6002, Settle("n1@7/2/t", list(range(4, 154))))
    assert [r["event"] for r in trace_log.by_message_id("/", "n1@3-000000001149")] == [
        "published",
        "enqueued",
        "delivered",
        "acked",
    ]
    assert trace_log.compact(10**9, lambda vhost, queue: (1, 1 << 30)) > 0
    assert trace_log.kv.scan(b"", b"\xff", 10) == []


def test_a_cluster_member_replaying_its_log_writes_nothing_twice() -> None:
    replica = Replica()
    replica.tracer.log.replayed = True  # (a cluster member's: server/main.py)
    life(replica)
    before = replica.tracer.log.by_queue("/", "q")
    sizes = replica.tracer.log.queue_bytes("/", "q")
    again = Replica()
    again.tracer = Tracer(TraceLog(replica.tracer.log.kv, replayed=True))  # restarted: same store
    again.tracer.settings_changed(KEY, again.machine)
    life(again)
    assert again.tracer.log.by_queue("/", "q") == before and again.tracer.log.queue_bytes("/", "q") == sizes
    # A later entry is written.
    again.apply(100, 9000, Enqueue([Message("", "q", props("m9"), b"nine")]))
    assert [r["event"] for r in again.tracer.log.by_message_id("/", "m9")] == ["enqueued"]


def test_a_single_node_whose_log_index_starts_again_writes_every_record() -> None:
    replica = Replica()
    life(replica)
    restarted = Replica()
    restarted.tracer = Tracer(TraceLog(replica.tracer.log.kv))  # (replayed=False: a single node)
    restarted.tracer.settings_changed(KEY, restarted.machine)
    restarted.apply(1, 9000, Enqueue([Message("", "q", props("m9"), b"nine")]))
    assert [r["event"] for r in restarted.tracer.log.by_message_id("/", "m9")] == ["enqueued"]


def test_an_untraced_queue_makes_no_records_and_get_and_credit_are_deliveries() -> None:
    replica = Replica(QueueSettings())
    replica.tracer.settings_changed(KEY, replica.machine)
    assert replica.tracer.traced == {}
    traced = Replica(QueueSettings(trace=True))
    traced.apply(1, 10, Enqueue([Message("", "q", props("g1"), b"x"), Message("", "q", props("g2"), b"y")]))
    traced.apply(2, 11, Get("get:n1@1/1", "n1@1/1", True))
    traced.apply(3, 12, Checkout("n1@1/1/t", "n1@1/1", 0, True, 0, False, 0))
    traced.apply(4, 13, Credit("n1@1/1/t", 1))
    assert traced.tracer.log.by_message_id("/", "g1")[-1]["via"] == "basic.get"
    assert [r["event"] for r in traced.tracer.log.by_message_id("/", "g2")] == ["enqueued", "delivered"]


def test_a_message_without_id_gets_the_trace_header_from_a_template() -> None:
    original = encode_properties(BasicProperties(headers={"app": "kept"}, delivery_mode=2))
    template = trace_id_template(original, "n1@3")
    assert template is not None
    raw = with_trace_id(template, 7)
    decoded = decode_properties(raw)
    assert decoded.headers == {"app": "kept", TRACE_ID_HEADER: "n1@3-000000000007"} and decoded.delivery_mode == 2
    assert decode_properties(with_trace_id(template, 10**12 - 1)).headers[TRACE_ID_HEADER] == "n1@3-999999999999"
    assert trace_id_template(raw, "n1@3") is None  # has the header already
    assert trace_id_template(props("mine"), "n1@3") is None  # has a message id
    tracer = Tracer(TraceLog(MemoryKV()))
    assert tracer.ids(raw) == ("n1@3-000000000007", None)  # (the fast path, without a decode)
    assert tracer.ids(props("mine", "c")) == ("mine", "c")
    with_both = encode_properties(BasicProperties(correlation_id="c", headers={TRACE_ID_HEADER: "n2@1-5"}))
    assert tracer.ids(with_both) == ("n2@1-5", "c")  # (the decode path)


def test_the_trace_number_of_a_publish_reads_as_the_id_its_properties_carry() -> None:
    """The publishing node sends the number of the x-maxq-trace-id it added (session.py), and the
    record reads it back as the same id the header holds (and a dead-lettered copy parses)."""
    for original in (
        encode_properties(BasicProperties(delivery_mode=2)),
        encode_properties(BasicProperties(headers={"app": "kept"}, correlation_id="c7")),
    ):
        template = trace_id_template(original, "n1@3")
        assert template is not None
        for n in (0, 42, 10**12 - 1):
            replica = Replica()
            raw = with_trace_id(template, n)
            replica.apply(
                1, 1000, Enqueue([Message("", "q", raw, b"")], trace=("u", "n1@3", "a", [(0, 1, True, ["q"], n, 1)]))
            )
            records = replica.tracer.log.by_queue("/", "q")
            assert [r["event"] for r in records] == ["published", "enqueued"]
            assert {(r["message_id"], r.get("correlation_id")) for r in records} == {replica.tracer.ids(raw)}
            assert replica.tracer.log.by_message_id("/", f"n1@3-{n:012d}") == records
            assert id_bucket(f"n1@3-{n:012d}") == f"n1@3-{n // 100:010d}"  # (the n key trace_store.py writes)
    assert replica.tracer.ids(raw) == ("n1@3-999999999999", "c7")  # (with a correlation id: decoded)


@pytest.mark.parametrize(
    "arguments",
    [{"x-trace": 1}, {"x-trace-bodies": "yes"}, {"x-trace-retention": 0}, {"x-trace-retention-bytes": -1}],
)
def test_bad_trace_arguments_are_refused(arguments) -> None:
    with pytest.raises(QueueArgumentError):
        parse_queue_arguments("/", "q", arguments)


@pytest.fixture(params=["memory", "rocksdb"])
def trace_log(request, tmp_path):
    kv = MemoryKV() if request.param == "memory" else RocksKV(tmp_path / "trace")
    log = TraceLog(kv)
    yield log
    log.close()


def record(message_id: str, correlation_id: str | None = None, pad: int = 0) -> tuple:
    """A stored record (trace_store.Record) of an enqueue."""
    return ("enqueued", message_id, correlation_id, 0, {"pad": "x" * pad} if pad else None)


def row(log: TraceLog, queue: str, time_ms: int, *records: tuple, vhost: str = "/") -> None:
    """One command's records (its log index: the time here)."""
    log.add(vhost, queue, time_ms, time_ms, 0, list(records))


def test_queries_are_prefix_scans_that_do_not_mix_names(trace_log) -> None:
    row(trace_log, "q", 10, record("m"))
    row(trace_log, "q", 20, record("m", "c"), record("m2"), record("m", "c2"))
    row(trace_log, "q2", 15, record("m"))
    row(trace_log, "q-longer", 16, record("mm"))
    row(trace_log, "q", 17, record("m"), vhost="other")
    assert [r["time_ms"] for r in trace_log.by_message_id("/", "m")] == [10, 15, 20, 20]  # in time order, across queues
    assert [r["n"] for r in trace_log.by_message_id("/", "m")] == [0, 0, 0, 2]  # (only its records of a row)
    assert [r["time_ms"] for r in trace_log.by_queue("/", "q")] == [10, 20, 20, 20]
    assert [r["time_ms"] for r in trace_log.by_queue("/", "q", 11, 20)] == [20, 20, 20]
    assert [r["time_ms"] for r in trace_log.by_queue("/", "q", 0, 19)] == [10]
    assert [r["correlation_id"] for r in trace_log.by_correlation_id("/", "c")] == ["c"]
    assert trace_log.by_queue("/", "q", limit=2)[1] == {
        "event": "enqueued",
        "message_id": "m",
        "correlation_id": "c",
        "seq": 0,
        "time_ms": 20,
        "log_index": 20,
        "n": 0,
        "vhost": "/",
        "queue": "q",
    }
    assert sorted(trace_log.queues()) == [("/", "q"), ("/", "q-longer"), ("/", "q2"), ("other", "q")]


def test_bodies_are_stored_as_bytes_and_answered_in_base64(trace_log) -> None:
    row(trace_log, "q", 1, ("enqueued", "b", None, 3, {"body": b"\x00\xff"}))
    assert trace_log.by_message_id("/", "b")[0]["body_base64"] == "AP8="


def test_retention_by_time_then_by_size(trace_log) -> None:
    for t in range(100):
        row(trace_log, "q", t, record(f"m{t}", "c", pad=100))
    assert trace_log.compact(150, lambda vhost, queue: (100, 1 << 30)) == 50  # older than 50 ms go
    assert [r["time_ms"] for r in trace_log.by_queue("/", "q")] == list(range(50, 100))
    assert trace_log.by_message_id("/", "m10") == [] and len(trace_log.by_correlation_id("/", "c")) == 50
    size = trace_log.queue_bytes("/", "q")
    trace_log.compact(150, lambda vhost, queue: (100, size // 2))
    kept = [r["time_ms"] for r in trace_log.by_queue("/", "q")]
    assert (
        kept == list(range(100 - len(kept), 100))
        and 20 <= len(kept) <= 26
        and trace_log.queue_bytes("/", "q") <= size // 2
    )
    trace_log.compact(10_000, lambda vhost, queue: (100, 1 << 30))
    assert (
        trace_log.by_queue("/", "q") == [] and trace_log.queues() == [] and trace_log.by_correlation_id("/", "c") == []
    )


class CountingKV(MemoryKV):
    """A MemoryKV that counts the rows its scans return."""

    def __init__(self) -> None:
        super().__init__()
        self.rows_scanned = 0

    def scan(self, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        found = super().scan(start, end, limit)
        self.rows_scanned += len(found)
        return found


def test_a_pass_with_nothing_due_reads_one_row_per_queue() -> None:
    kv = CountingKV()
    trace_log = TraceLog(kv)
    for t in range(500):
        row(trace_log, "q1", t, record(f"m{t}"))
        row(trace_log, "q2", t, record(f"n{t}"))
    kv.rows_scanned = 0
    assert trace_log.compact(500, lambda vhost, queue: (1000, 1 << 30)) == 0
    assert kv.rows_scanned == 2 + 2  # the two s keys, then each queue's oldest row
    assert trace_log.compact(1100, lambda vhost, queue: (1000, 1 << 30)) == 2 * 100  # t < 100 went
    assert [r["time_ms"] for r in trace_log.by_queue("/", "q1")] == list(range(100, 500))


def test_the_byte_count_survives_a_reopen(tmp_path) -> None:
    log = TraceLog(RocksKV(tmp_path / "trace"))
    for t in range(10):
        row(log, "q", t, record("m"))
    size = log.queue_bytes("/", "q")
    log.close()
    reopened = TraceLog(RocksKV(tmp_path / "trace"))
    try:
        assert reopened.queue_bytes("/", "q") == size and len(reopened.by_message_id("/", "m")) == 10
    finally:
        reopened.close()


def test_memory_and_rocksdb_agree(tmp_path) -> None:
    rng = random.Random(7)
    memory, rocks = TraceLog(MemoryKV()), TraceLog(RocksKV(tmp_path / "trace"))
    try:
        for step in range(200):
            queue = rng.choice(["a", "b", "ab"])
            batch = [record(rng.choice(["x", "y", "z"]), rng.choice([None, "c"])) for _ in range(3)]
            memory.add("/", queue, step, step, 0, batch)
            rocks.add("/", queue, step, step, 0, batch)
            if step % 50 == 49:
                for log in (memory, rocks):
                    log.compact(step, lambda vhost, queue: (40, 1 << 30))
        for queue in ("a", "b", "ab"):
            assert memory.by_queue("/", queue) == rocks.by_queue("/", queue)
        for value in ("x", "y", "z"):
            assert memory.by_message_id("/", value) == rocks.by_message_id("/", value)
        assert memory.by_correlation_id("/", "c") == rocks.by_correlation_id("/", "c")
    finally:
        rocks.close()


def test_a_delivery_names_its_consumer_even_with_a_slash_in_the_tag(trace_log) -> None:
    row(trace_log, "q", 1, ("delivered", "d", None, 4, ["n1@7/3/a/b", True, 2]))
    (delivered,) = trace_log.by_message_id("/", "d")
    assert (delivered["connection"], delivered["channel"], delivered["consumer_tag"]) == ("n1@7", "3", "a/b")
    assert delivered["redelivered"] is True and delivered["delivery_count"] == 2 and delivered["seq"] == 4


def test_a_cluster_members_rows_may_come_out_of_index_order() -> None:
    """An entry held for its origin's order (machines/apply_order.py) is applied after a later
    index: its rows are written all the same, and a replay of both writes nothing again."""
    log = TraceLog(MemoryKV(), replayed=True)
    row(log, "q", 5, record("later"))  # (log index 5)
    log.add("/", "q", 6, 4, 0, [record("held")])  # index 4, applied after 5
    size = log.queue_bytes("/", "q")
    row(log, "q", 5, record("later"))
    log.add("/", "q", 6, 4, 0, [record("held")])
    assert [r["message_id"] for r in log.by_queue("/", "q")] == ["later", "held"] and log.queue_bytes("/", "q") == size


@settings(deadline=None)  # (a slow example under load is not a failure)
@given(st.integers(0, 10**12 - 1000), st.integers(1, 400), st.binary(max_size=8), st.binary(max_size=8))
def test_a_runs_trace_ids_are_its_numbers_in_twelve_digits(first, count, head, tail) -> None:
    from maxq_raft.server.session import _numbered

    assert _numbered(head, first, count, tail) == [b"%b%012d%b" % (head, n, tail) for n in range(first, first + count)]


class _CountingTraceLog(TraceLog):
    def __init__(self) -> None:
        super().__init__(MemoryKV())
        self.flushes = 0
        self.compactions = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()

    def compact(self, now_ms, retention) -> int:
        self.compactions += 1
        return super().compact(now_ms, retention)


@pytest.mark.parametrize("traced", [False, True])
def test_the_trace_task_wakes_for_retention_alone_while_nothing_traces(traced) -> None:
    """compact_trace flushes every FLUSH_INTERVAL_S while a queue traces, and while none does
    wakes only every COMPACT_INTERVAL_S (a node without trace does not wake 20 times a second)."""
    trace_log = _CountingTraceLog()
    tracer = Tracer(trace_log)
    if traced:
        tracer.settings_changed(KEY, make_queue_machine("/", "q", settings=QueueSettings(trace=True)))

    async def main() -> None:
        with trio.move_on_after(10 * COMPACT_INTERVAL_S):
            await compact_trace(tracer, lambda: 0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert 9 <= trace_log.compactions <= 10
    wakeups = trace_log.flushes - trace_log.compactions  # (a retention pass flushes once more)
    if traced:
        assert wakeups >= 10 * COMPACT_INTERVAL_S / FLUSH_INTERVAL_S - 2
    else:
        assert wakeups == trace_log.compactions


def test_a_queue_that_begins_to_trace_wakes_the_idle_trace_task() -> None:
    """While nothing traces, compact_trace sleeps until its next retention pass; a queue that
    begins to trace wakes it, so its first records are written within FLUSH_INTERVAL_S or so,
    not a retention interval later."""
    trace_log = _CountingTraceLog()
    tracer = Tracer(trace_log)
    written_after: list[float] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(compact_trace, tracer, lambda: 0)
            await trio.sleep(COMPACT_INTERVAL_S / 4)  # (the task is asleep, nothing traced)
            began = trio.current_time()
            tracer.settings_changed(KEY, make_queue_machine("/", "q", settings=QueueSettings(trace=True)))
            trace_log.add("/", "q", 1, 1, 0, [("purged", None, None, None, {"count": 1})])
            while trace_log.buffered:
                await trio.sleep(FLUSH_INTERVAL_S / 10)
            written_after.append(trio.current_time() - began)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert written_after[0] <= 2 * FLUSH_INTERVAL_S
