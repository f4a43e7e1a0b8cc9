"""server/remote.py's two sides without processes: what a group's leader sends a member that
holds no replica of it, and how that member numbers, de-duplicates and reads it. (The whole
path runs on process clusters in tests/cluster/test_held_groups.py.)"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.machines.commands import Checkout, Enqueue
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import DeadLetter, Deliver, Meta, Rejected
from maxq_raft.server import remote


class FakeGroup:
    def __init__(self, members: list[str], leader: bool) -> None:
        self.members = members
        self.is_leader = leader
        self.term = 1

    def member_ids(self) -> list[str]:
        return list(self.members)


def sender(leads: bool = True, partial: bool = True, everywhere: bool = False) -> tuple[remote.Sender, list]:
    sent: list = []
    s = remote.Sender("n1", lambda member, payload: sent.append((member, msgpack.unpackb(payload, raw=False))))
    s.node = SimpleNamespace(
        partial=partial,
        held_everywhere=everywhere,
        groups={"shard-0": FakeGroup(["n1", "n2", "n3"], leads)},
        peer_held=lambda: {"n2": frozenset({"shard-0"}), "n4": frozenset({"meta"})},
    )
    return s, sent


def deliver(consumer_id: str, seq: int, body: bytes = b"x") -> Deliver:
    message = Message("", "q", b"", body)
    message.seq = seq
    message.delivery_count = 1
    return Deliver(consumer_id, message, False)


def test_only_a_leader_sends_and_only_to_members_holding_no_replica() -> None:
    s, sent = sender()
    assert s.active
    assert s.remote_node("shard-0", "n4@ab12") == "n4"
    assert s.remote_node("shard-0", "n2@ab12") is None  # holds a replica: applies it itself
    assert s.remote_node("shard-0", "n1@ab12") is None
    effects = [
        deliver("n4@1/1/t", 1),
        deliver("n2@1/1/t", 2),
        DeadLetter("/", "q", "expired", [], 0, None, None),
        deliver("n4@1/1/t", 3),
    ]
    rest = s.take_deliveries("shard-0", effects)
    assert rest == effects[1:3]
    s.flush()
    [(member, (_life, number, items))] = sent
    assert member == "n4" and number == 1
    assert [item[0] for item in items] == ["d"]
    assert [(cid, record[0]) for cid, record, _r in items[0][1]] == [("n4@1/1/t", 1), ("n4@1/1/t", 3)]

    follower, nothing = sender(leads=False)
    assert follower.remote_node("shard-0", "n4@ab12") is None
    assert follower.take_deliveries("shard-0", effects) == effects
    follower.flush()
    assert nothing == []
    assert not sender(partial=False)[0].active
    # Placed, but every member holds every group (3 at the default factor): nothing to send.
    assert not sender(everywhere=True)[0].active


@settings(max_examples=200, deadline=None)
@given(
    seq=st.integers(min_value=0, max_value=2**63 - 1),
    exchange=st.text(max_size=20),
    routing_key=st.text(max_size=40),
    props=st.binary(max_size=40),
    body=st.binary(max_size=300),
    delivery_count=st.integers(min_value=0, max_value=1000),
    count_header=st.booleans(),
    short=st.booleans(),
)
def test_a_delivery_crosses_as_the_channel_writes_it(
    seq, exchange, routing_key, props, body, delivery_count, count_header, short
) -> None:
    """Short records once every member reads them (SHORT_DELIVERIES), full ones before: the
    member writes the same either way."""
    s, sent = sender()
    s.short_deliveries = lambda: short
    message = Message(exchange, routing_key, props, body, persistent=True, ttl_ms=5)
    message.seq, message.delivery_count, message.count_header = seq, delivery_count, count_header
    s.take_deliveries("shard-0", [Deliver("n4@1/1/t", message, True)])
    s.flush()
    [(_member, (_life, _number, [item]))] = sent
    [[consumer_id, record, redelivered]] = item[1]
    assert len(record) == (remote.DELIVERY_FIELDS if short else 21)
    got = remote.Receiver().fresh(consumer_id, record)
    assert (got.seq, got.exchange, got.routing_key, got.props_raw, got.body) == (
        seq,
        exchange,
        routing_key,
        props,
        body,
    )
    assert (got.delivery_count, got.count_header, redelivered) == (delivery_count, count_header, True)
    [(in_run_consumer, in_run, in_run_redelivered)] = remote.Receiver().deliveries(item[1])  # (the path of a "d")
    assert (in_run_consumer, in_run_redelivered) == ("n4@1/1/t", True)
    assert [getattr(in_run, field) for field in Message.__slots__] == [
        getattr(got, field) for field in Message.__slots__
    ]


@pytest.mark.parametrize(
    "record",
    [
        "not a list",
        [1, "", "q", b"", b"x", 1],  # a field short
        [1, "", "q", "text", b"x", 1, False],  # properties as text
        [1, "", "q", b"", None, 1, False],
        ["1", "", "q", b"", b"x", 1, False],
        [1, 5, "q", b"", b"x", 1, False],  # an exchange not text
        [1, "", None, b"", b"x", 1, False],
        [1, "", "q", b"", b"x", "1", False],
    ],
)
def test_a_malformed_delivery_record_is_refused(record) -> None:
    with pytest.raises(remote.ReplyError):
        remote.Receiver().fresh("n4@1/1/t", record)
    good = remote.delivery_record(deliver("n4@1/1/t", 1).message)
    with pytest.raises(remote.ReplyError):  # in a run, after a good one: the run goes (`_remote_items` logs it)
        remote.Receiver().deliveries([["n4@1/1/t", good, False], ["n4@1/1/t", record, False]])


def test_a_run_of_deliveries_is_written_once_each_and_shares_its_routing() -> None:
    r = remote.Receiver()
    records = [remote.delivery_record(deliver("n4@1/1/a", seq).message) for seq in (1, 2, 3)]
    full = remote.message_record(deliver("n4@1/1/a", 4).message)  # (a leader of an earlier release)
    run = [["n4@1/1/a", record, False] for record in records] + [["n4@1/1/a", full, True]]
    effects = r.deliveries(run)
    assert [(e.consumer_id, e.message.seq, e.redelivered) for e in effects] == [
        ("n4@1/1/a", 1, False),
        ("n4@1/1/a", 2, False),
        ("n4@1/1/a", 3, False),
        ("n4@1/1/a", 4, True),
    ]
    assert all(type(e) is Deliver for e in effects)
    first, second = effects[0].message, effects[1].message
    assert first.routing_key is second.routing_key and first.exchange is second.exchange
    again = list(records[1])
    again[5] = 2  # delivered again (came back): a new delivery
    assert [
        e.message.seq for e in r.deliveries([*run, ["n4@1/1/b", records[0], False], ["n4@1/1/a", again, True]])
    ] == [
        1,  # another consumer's
        2,
    ]
    assert r.duplicates_dropped == 4
    assert r.fresh("n4@1/1/a", records[2]) is None  # one memory for both paths


def test_replies_and_the_entry_end_go_in_order_numbered_per_member() -> None:
    s, sent = sender()
    s.reply("n4", "shard-0", "n4@ab", 7, Rejected(404, "no queue"))
    s.reply("n4", "shard-0", "n4@ab", 8, object())  # (cannot cross: refused, not dropped)
    s.entry_done("n4", "shard-0", "n4@ab", 3)
    s.dead("shard-0", "n5@cd")
    s.flush()
    s.ask_resync("n4")
    s.flush()
    assert [(m, number) for m, (_l, number, _i) in sent] == [("n4", 1), ("n5", 1), ("n4", 2)]
    items = sent[0][1][2]
    assert items[0] == ["r", "shard-0", "n4@ab", 7, ["R", 404, "no queue"]]
    assert items[1][:4] == ["r", "shard-0", "n4@ab", 8] and items[1][4][:2] == ["R", 541]
    assert items[2] == ["e", "shard-0", "n4@ab", 3]
    assert sent[1][1][2] == [["x", "shard-0", "n5@cd"]]
    assert sent[2][1][2] == [["?"]]


def test_a_resync_lists_what_is_checked_out_to_that_members_consumers() -> None:
    s, sent = sender()
    queue = QueueMachine("/", "q")
    queue.apply(Meta(1, 0), Enqueue([Message("", "q", b"", b"%d" % i) for i in range(4)]))
    queue.apply(Meta(2, 0), Checkout("n4@1/1/a", "n4@1/1", 2, False, 0, False, 2))
    queue.apply(Meta(3, 0), Checkout("n2@1/1/b", "n2@1/1", 2, False, 0, False, 2))
    s.resync("n4", "shard-0", [queue])
    s.flush()
    [(_member, (_life, _number, [item]))] = sent
    assert item[0] == "s" and item[1] == "shard-0"
    assert sorted((cid, record[4]) for cid, record, _r in item[2]) == [("n4@1/1/a", b"0"), ("n4@1/1/a", b"1")]


def test_numbers_reveal_a_missing_message_and_a_new_life_starts_at_one() -> None:
    r = remote.Receiver()

    def payload(life: str, number: int) -> bytes:
        return msgpack.packb([life, number, [["?"]]])

    assert r.take("n2", payload("a", 1)) == ([["?"]], False)
    assert r.take("n2", payload("a", 2))[1] is False
    assert r.take("n2", payload("a", 4))[1] is True  # 3 went missing
    assert r.take("n2", payload("b", 1))[1] is False  # n2 started again
    assert r.take("n3", payload("c", 2))[1] is True  # the first from n3 we hear of is not its first
    assert r.gaps == 2
    for bad in (b"\xc1", msgpack.packb(["a", "1", []]), msgpack.packb({"a": 1})):
        with pytest.raises(remote.ReplyError):
            r.take("n2", bad)


def test_a_delivery_is_written_once_and_a_redelivery_again() -> None:
    r = remote.Receiver()
    record = remote.message_record(deliver("n4@1/1/a", 5).message)
    assert r.fresh("n4@1/1/a", record) is not None
    assert r.fresh("n4@1/1/a", record) is None  # a second copy (two leaders in turn, a resync)
    assert r.fresh("n4@1/1/b", record) is not None  # another consumer's
    again = list(record)
    again[5] = 2  # delivery count: the message came back and was delivered again
    assert r.fresh("n4@1/1/a", again) is not None
    assert r.duplicates_dropped == 1
    r.forget("n4@1/1/a")
    assert r.fresh("n4@1/1/a", record) is not None
    with pytest.raises(remote.ReplyError):
        r.fresh("n4@1/1/a", ["not", "a", "record"])


def test_the_deliveries_remembered_per_consumer_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(remote, "DELIVERIES_SEEN_MAX", 3)
    r = remote.Receiver()
    records = [remote.message_record(deliver("c", seq).message) for seq in range(5)]
    for record in records:
        assert r.fresh("c", record) is not None
    assert len(r.seen["c"]) == 3
    assert r.fresh("c", records[0]) is not None  # forgotten (the oldest went first)
    assert r.fresh("c", records[4]) is None


def test_the_oldest_deliveries_are_forgotten_in_steps_of_an_eighth(monkeypatch) -> None:
    monkeypatch.setattr(remote, "DELIVERIES_SEEN_MAX", 16)
    r = remote.Receiver()
    records = [remote.delivery_record(deliver("c", seq).message) for seq in range(19)]
    sizes = [len(r.seen["c"]) for record in records if r.deliveries([["c", record, False]]) is not None]
    assert sizes == [*range(1, 19), 16]  # 16 + 2 held, then back to the last 16
    assert [seq for seq, _count in r.seen["c"]] == list(range(3, 19))


def test_who_leads_is_read_again_after_each_flush() -> None:
    """A follower that becomes the group's leader sends from its next batch on (the cluster log
    flushes after every batch it applies: a leadership read once and kept stalled a consumer)."""
    s, sent = sender(leads=False)
    effects = [deliver("n4@1/1/t", 1)]
    assert s.take_deliveries("shard-0", effects) == effects
    s.node.groups["shard-0"].is_leader = True
    assert s.take_deliveries("shard-0", effects) == effects  # (within one batch: as read at its start)
    s.flush()
    assert s.take_deliveries("shard-0", effects) == []
    s.flush()
    assert [m for m, _ in sent] == ["n4"]


def test_a_member_that_says_it_holds_no_replica_is_sent_to_though_the_configuration_names_it() -> None:
    s, _sent = sender()
    assert s.remote_node("shard-0", "n2@ab") is None  # a member that holds it
    assert s.remote_node("shard-0", "n3@ab") is None  # a member not linked: taken at its word, a holder
    s.node.peer_held = lambda: {"n2": frozenset({"meta"}), "n3": frozenset({"shard-0"})}
    s.flush()
    assert s.remote_node("shard-0", "n2@ab") == "n2"  # its replica went: it applies nothing of it


def test_a_message_above_the_fragment_size_goes_in_fragments_and_is_joined(monkeypatch) -> None:
    monkeypatch.setattr(remote, "FRAGMENT_BYTES", 1000)
    raw: list[tuple[str, bytes]] = []
    s = remote.Sender("n1", lambda member, payload: raw.append((member, payload)))
    s.node = SimpleNamespace(
        partial=True,
        held_everywhere=False,
        groups={"shard-0": FakeGroup(["n1", "n2", "n3"], True)},
        peer_held=lambda: {},
    )
    effects = [deliver("n4@1/1/t", seq, b"%04d" % seq * 100) for seq in range(1, 6)]  # 5 x 400 B
    assert s.take_deliveries("shard-0", effects) == []
    s.flush()
    s.ask_resync("n4")
    s.flush()
    assert len(raw) == 4 and all(len(payload) <= 1100 for _m, payload in raw)  # 3 fragments, then one
    r = remote.Receiver()
    taken = [r.take("n1", payload) for _m, payload in raw]
    assert [items for items, _gap in taken[:2]] == [[], []]
    items, gap = taken[2]
    assert not gap and [record[4] for _c, record, _r in items[0][1]] == [b"%04d" % seq * 100 for seq in range(1, 6)]
    assert taken[3] == ([["?"]], False)

    # A fragment lost on the way: the message counts as missing, once; the next follows on.
    s.take_deliveries("shard-0", effects)
    s.flush()
    s.ask_resync("n4")
    s.flush()
    fragments, last = raw[4:7], raw[7]
    assert r.take("n1", fragments[0][1]) == ([], False)
    assert r.take("n1", fragments[2][1]) == ([], True)  # the second never came
    assert r.take("n1", last[1]) == ([["?"]], False)
    assert r.gaps == 1 and not r.fragments
    for bad in ([s.life, 9, 0, 0, b""], [s.life, 9, 3, 2, b""], [s.life, 9, 0, 2, "text"]):
        with pytest.raises(remote.ReplyError):
            r.take("n1", msgpack.packb(bad, use_bin_type=True))


def test_a_full_fragment_fits_under_the_engines_cap_on_one_message() -> None:
    from maxq_raft.replication.engine import MESSAGE_ENVELOPE_BYTES
    from maxq_raft.replication.group import PAYLOAD_BYTES_MAX

    fragment = msgpack.packb(["a" * 12, 2**62, 8190, 8191, b"\0" * remote.FRAGMENT_BYTES], use_bin_type=True)
    assert len(fragment) <= PAYLOAD_BYTES_MAX + MESSAGE_ENVELOPE_BYTES


def test_a_new_leader_resyncs_a_member_before_it_sends_that_members_new_deliveries() -> None:
    """The old leader applied the entry that checked message 0 out to n4's consumer and lost
    the leadership before sending it; this member, the new leader, applies the next entry,
    which checks out message 1: n4 must get 0 (the resync) before 1 (jepsen-style seed 2004)."""
    import functools

    from maxq_raft.server.cluster import ClusterLog

    s, sent = sender()
    queue = QueueMachine("/", "q")
    queue.apply(Meta(1, 0), Checkout("n4@1/1/a", "n4@1/1", 10, False, 0, False, 10))
    _reply, checked_out = queue.apply(Meta(2, 0), Enqueue([Message("", "q", b"", b"0")]))  # (applied as a follower)
    log = SimpleNamespace(remote_out=s, node_id="n1", _queues_of=lambda group: [queue])
    log._resync_as_new_leader = functools.partial(ClusterLog._resync_as_new_leader, log)
    log.local_deliveries = lambda group, effects: effects
    _reply, effects = queue.apply(Meta(3, 0), Enqueue([Message("", "q", b"", b"1")]))
    assert [e.message.body for e in effects if type(e) is Deliver] == [b"1"]
    assert ClusterLog.deliveries_here(log, "shard-0", effects, 3) == []  # type: ignore[arg-type]
    s.flush()
    [(member, (_life, _number, items))] = sent
    assert member == "n4" and [item[0] for item in items] == ["s", "d"]
    assert [record[4] for _c, record, _r in items[0][2]] == [b"0", b"1"]  # both checked out, in order
    assert [record[4] for _c, record, _r in items[1][1]] == [b"1"]  # (a second copy: dropped there)
    assert not s.newly_led("shard-0")  # (resynced in this term)


def test_a_member_moved_off_the_group_is_resynced_before_its_first_deliveries_from_the_leader() -> None:
    """n3 held shard-0 when the entry checking message 0 out to its consumer was applied, so
    the leader counted on n3 to write it; the leader then appended n3's removal, after which
    pysyncobj sends n3 nothing, so n3 may never learn that entry's commit. The next entry checks
    out message 1, which the leader sends n3 itself: 0 must go first (the watch's resync came
    up to 0.2 s later, after 1)."""
    import functools

    from maxq_raft.server.cluster import ClusterLog

    s, sent = sender()
    queue = QueueMachine("/", "q")
    queue.apply(Meta(1, 0), Checkout("n3@1/1/a", "n3@1/1", 10, False, 0, False, 10))
    log = SimpleNamespace(remote_out=s, node_id="n1", _queues_of=lambda group: [queue])
    log._resync_as_new_leader = functools.partial(ClusterLog._resync_as_new_leader, log)
    log.local_deliveries = lambda group, effects: effects
    here = functools.partial(ClusterLog.deliveries_here, log, "shard-0")  # type: ignore[arg-type]
    _reply, effects = queue.apply(Meta(2, 0), Enqueue([Message("", "q", b"", b"0")]))
    assert [e.message.body for e in here(effects, 2) if type(e) is Deliver] == [b"0"]  # n3's to write
    s.flush()
    assert sent == []  # (n3 holds the group: nothing for it)
    s.node.groups["shard-0"].members = ["n1", "n2"]  # (the removal, appended here)
    _reply, effects = queue.apply(Meta(3, 0), Enqueue([Message("", "q", b"", b"1")]))
    assert here(effects, 3) == []
    s.flush()
    [(member, (_life, _number, items))] = sent
    assert member == "n3" and [item[0] for item in items] == ["s", "d"]
    assert [record[4] for _c, record, _r in items[0][2]] == [b"0", b"1"]  # both checked out, in order
    _reply, effects = queue.apply(Meta(4, 0), Enqueue([Message("", "q", b"", b"2")]))
    here(effects, 4)
    s.flush()
    assert [item[0] for item in sent[-1][1][2]] == ["d"]  # (resynced once)


def learner_of_one_queue(group: Any, held_by: Callable[[list], set[int]]) -> tuple[QueueMachine, list, Callable]:
    """The member-side pieces of ClusterLog a promotion goes through, over one queue of "shard-0"
    (its replica's `group` flags) with a consumer of this member's checked out: the queue, what
    is written to the consumer (`broker.perform`), and `local_deliveries`. `held_by(written)`:
    the seqs the consumer's channel holds."""
    from maxq_raft.server.cluster import ClusterLog

    consumer_id = "n1@1/1/a"
    queue = QueueMachine("/", "q")
    queue.apply(Meta(1, 0), Checkout(consumer_id, "n1@1/1", 10, False, 0, False, 10))
    written: list = []
    log = SimpleNamespace(
        node=SimpleNamespace(groups={"shard-0": group}),
        broker=SimpleNamespace(consumers={consumer_id: object()}, perform=written.extend),
        remote_in=remote.Receiver(),
        _queues_of=lambda name: [queue],
        _held_by=lambda cid: held_by(written),
    )
    log._remote_deliveries = functools.partial(ClusterLog._remote_deliveries, log)
    log._promoted = functools.partial(ClusterLog._promoted, log)
    return queue, written, functools.partial(ClusterLog.local_deliveries, log, "shard-0")  # type: ignore[arg-type]


def test_a_promoted_learner_writes_what_it_was_counted_on_for_before_its_own_next_delivery() -> None:
    """n1 applied message 0's checkout to its consumer as a learner (written by the leader, it
    counted, which had n1 as a member already and sent nothing); promoted, it applies message
    1's: 0 must be written before 1. It was written by the watch up to 0.2 s later, after 1
    (jepsen-style seed 7501, FIFO broken)."""
    group = SimpleNamespace(learning=True, promoted_unseen=False)
    queue, written, local = learner_of_one_queue(group, lambda written: set())

    _reply, effects = queue.apply(Meta(2, 0), Enqueue([Message("", "q", b"", b"0")]))
    assert local(effects) == []  # a learner writes none
    group.learning, group.promoted_unseen = False, True  # (the hub thread, at the addition)
    _reply, effects = queue.apply(Meta(3, 0), Enqueue([Message("", "q", b"", b"1")]))
    rest = local(effects)
    assert [e.message.body for e in written] == [b"0", b"1"]  # both checked out, in order
    assert [e for e in rest if type(e) is Deliver] == []  # (1 written once)
    assert not group.promoted_unseen  # (the watch has nothing left to do)


def test_a_promotion_seen_half_way_by_the_trio_thread_keeps_the_order(tmp_path) -> None:
    """The hub thread promotes a learner (`Group._stop_learning`: two writes) while the trio
    thread may be applying entries, reading `learning`, then `promoted_unseen`. Whatever it sees
    between the two writes, what it skipped as a learner is written before what comes after.
    With `learning` cleared first it could see a member neither learning nor promoted, write an
    entry's delivery itself, and the skipped one came after it (CI, 2026-12-07: 235 before 234)."""
    from maxq_raft.replication.group import Group

    seen_states: list[tuple[bool, bool]] = []

    class Promoting(SimpleNamespace):
        def __setattr__(self, name: str, value: object) -> None:
            super().__setattr__(name, value)
            if name in ("learning", "promoted_unseen"):
                seen_states.append((self.learning, self.promoted_unseen))

    group = Promoting(
        learning=True, promoted_unseen=False, _voter_timeouts=None, folder=tmp_path, name="shard-0", node_id="n1"
    )
    Group._stop_learning(group)  # type: ignore[arg-type]
    states = list(seen_states)  # what the trio thread may find after each write of the hub's
    assert states[-1] == (False, True)

    queue, written, local = learner_of_one_queue(group, lambda written: {e.message.seq for e in written})

    def apply(body: bytes) -> None:
        _reply, effects = queue.apply(Meta(len(written) + 10, 0), Enqueue([Message("", "q", b"", body)]))
        written.extend(e for e in local(effects) if type(e) is Deliver)

    group.learning, group.promoted_unseen = True, False
    apply(b"0")  # a learner writes none (its leader counted on it: it held the group by then)
    bodies = [b"0"]
    for number, (learning, promoted_unseen) in enumerate(states, 1):
        group.learning, group.promoted_unseen = learning, promoted_unseen
        bodies.append(b"%d" % number)
        apply(bodies[-1])
    group.learning = False
    bodies.append(b"last")
    apply(bodies[-1])
    assert [e.message.body for e in written] == bodies


def test_a_member_holding_no_replica_is_told_the_lives_a_down_ended() -> None:
    """Its consumers there went with its life; it must start a new one (and its clients
    reconnect), not wait for messages its queue will never send (the simulation, 6 of 20,000
    seeds of --partial)."""
    s, sent = sender()
    s.lives_ended("shard-0", "n4@", ("n4@aa", "n4@bb"))
    s.lives_ended("shard-0", "n2@", ("n2@cc",))  # (a holder: it applies the Down itself)
    s.flush()
    [(member, (_life, _number, items))] = sent
    assert member == "n4" and items == [["x", "shard-0", "n4@aa"], ["x", "shard-0", "n4@bb"]]
    s, sent = sender(leads=False)
    s.lives_ended("shard-0", "n4@", ("n4@aa",))  # (not the leader: the leader tells it)
    s.flush()
    assert sent == []


def test_a_leadership_taken_back_in_a_later_term_resyncs_again() -> None:
    """Led in term 1, lost and taken back in term 3 between two looks: the leader of term 2 may
    have checked messages out to n4's consumers and lost their deliveries with its leadership
    (the simulation, 16 of 20,000 seeds: "a group led again unseen by the watch")."""
    s, _sent = sender()
    group = s.node.groups["shard-0"]
    assert s.newly_led("shard-0")
    assert not s.newly_led("shard-0")
    group.is_leader = False
    s.flush()
    assert not s.newly_led("shard-0")  # (not led: nothing to resync)
    group.is_leader, group.term = True, 3
    s.flush()
    assert s.newly_led("shard-0")
    assert not s.newly_led("shard-0")


def test_after_a_gap_deliveries_wait_for_the_resync_and_come_after_it() -> None:
    hold = remote.GapHold()
    assert hold.order("n2", [["d", [1]], ["e", "g", "o", 1]], False, 0.0) == [["d", [1]], ["e", "g", "o", 1]]
    # The message that shows the gap: its deliveries wait, the rest is acted on.
    assert hold.order("n2", [["d", [3]], ["r", "g", "o", 7, b""]], True, 10.0) == [["r", "g", "o", 7, b""]]
    assert hold.order("n2", [["d", [4]]], False, 10.5) == []
    assert hold.order("n3", [["d", [9]]], False, 10.5) == [["d", [9]]]  # (another sender: no wait)
    # The resync first, then what waited, then the rest of its message in order.
    answer = [["d", [5]], ["s", "g", [[2], [3]]], ["e", "g", "o", 2]]
    assert hold.order("n2", answer, False, 11.0) == [
        ["s", "g", [[2], [3]]],
        ["d", [3]],
        ["d", [4]],
        ["d", [5]],
        ["e", "g", "o", 2],
    ]
    assert hold.held == {}


def test_after_a_gap_the_held_deliveries_to_an_acking_consumer_go_with_the_resync() -> None:
    """Made before the resync, each is in it if still that consumer's (the simulation, seed
    421196: m11's redelivery, requeued again before the resync was made, was written after five
    later deliveries), or in the resync of its group's leader since, if the sender leads it no
    more (seed 428946). A no-ack consumer's (in no resync) still go, after it, and so does one
    to a consumer that acknowledged only after it came (its tag consumed again with acks)."""
    hold = remote.GapHold()
    a, b, c = "n1@x.1/1/a", "n1@x.1/1/b", "n1@x.1/1/c"
    acking = {a: True, b: True, c: False}
    order = functools.partial(hold.order, acking=acking.__getitem__)
    assert order("n2", [["d", [[a, [11], False], [c, [12], False]]]], True, 0.0) == []
    assert order("n2", [["d", [[b, [13], False]]]], False, 0.1) == []
    acking[c] = True  # (c's tag consumed again, with acks: its held delivery was made no-ack)
    resync = ["s", "g", [[a, [24], False]]]  # (b's group is not in it: n2 leads it no more)
    answer = [["d", [[a, [25], False]]], resync, ["d", [[a, [26], False]]]]
    assert order("n2", answer, False, 0.2) == [
        resync,
        ["d", [[c, [12], False]]],
        ["d", [[a, [26], False]]],  # (sent after the resync was made)
    ]
    # Without the member's channels to ask, every one waited goes after the resync.
    assert hold.order("n2", [["d", [[a, [30], False]]]], True, 1.0) == []
    assert hold.order("n2", [["s", "g", []]], False, 1.1) == [["s", "g", []], ["d", [[a, [30], False]]]]


def test_a_resync_that_does_not_come_is_asked_again_then_the_deliveries_go() -> None:
    hold = remote.GapHold()
    hold.order("n2", [["d", [3]]], True, 0.0)
    assert hold.due(remote.REPLIES_WAIT_S - 0.1) == ([], [])
    asked = 0
    now = 0.0
    for _ in range(remote.RESYNC_ASKS_MAX - 1):
        now += remote.REPLIES_WAIT_S
        assert hold.due(now) == (["n2"], [])
        asked += 1
    now += remote.REPLIES_WAIT_S
    assert hold.due(now) == ([], [("n2", [["d", [3]]])])
    assert asked == remote.RESYNC_ASKS_MAX - 1 and hold.held == {}


def test_an_ask_for_a_resync_is_answered_by_a_sender_leading_none_of_the_askers_groups() -> None:
    """A sender that leads no group the asker holds no replica of answers with an empty resync:
    the asker then acts on the deliveries it held since the gap at once (their groups' leaders
    since resync it themselves), where it waited RESYNC_ASKS_MAX unanswered asks (15 s)."""
    queue = QueueMachine("/", "q")
    queue.apply(Meta(1, 0), Checkout("n4@1/1/a", "n4@1/1", 10, False, 0, False, 10))
    queue.apply(Meta(2, 0), Enqueue([Message("", "q", b"", b"0")]))
    s, sent = sender()
    s.answer_resync_ask("n4", [("shard-0", [queue])])
    s.answer_resync_ask("n2", [("shard-0", [queue])])  # (n2 holds shard-0: nothing of it to resync)
    s.flush()
    [(n4, (_life, _n, [resync])), (n2, (_life2, _n2, items))] = sent
    assert n4 == "n4" and resync[:2] == ["s", "shard-0"] and [r[1][4] for r in resync[2]] == [b"0"]
    assert n2 == "n2" and items == [["s", None, []]]
    hold = remote.GapHold()
    assert hold.order("n1", [["d", [3]]], True, 0.0) == []
    assert hold.order("n1", items, False, 0.1) == [["s", None, []], ["d", [3]]]


def test_a_deletion_replayed_by_a_new_leader_is_told_at_its_resync_unless_the_name_was_declared_again() -> None:
    """A leader applying entries of an earlier term (its term's first entry is 5) sends no
    deletion ("q") nor direct reply-to reply ("t") as it applies them: the leader of the time
    did. A deletion is told with this leadership's resync, and only for a name no queue of the
    group has by then: told at once, a replay cancelled n4's consumers of the queue declared
    again under that name, whose machine kept them (tests/cluster/test_group_restart.py)."""
    s, sent = sender()
    s.node.groups["shard-0"].term_from = 5
    members = ["n1", "n2", "n3", "n4"]
    s.queue_removed("shard-0", ("/", "again"), members, 3)
    s.queue_removed("shard-0", ("/", "gone"), members, 4)
    s.reply_to("shard-0", SimpleNamespace(key="n4~abc", exchange="", routing_key="r", props_raw=b"", body=b"x"), 4)
    s.flush()
    assert sent == []
    s.resync_consumers_of("shard-0", [QueueMachine("/", "again")])  # (declared again at 4, or after)
    s.flush()
    assert sent == [("n4", [s.life, 1, [["q", "/", "gone", "shard-0"]]])]
    s.resync_consumers_of("shard-0", [])  # (told once)
    s.queue_removed("shard-0", ("/", "now"), members, 5)  # (this leadership's own: at once)
    s.reply_to("shard-0", SimpleNamespace(key="n4~abc", exchange="", routing_key="r", props_raw=b"", body=b"x"), 6)
    s.flush()
    assert sent[1:] == [("n4", [s.life, 2, [["q", "/", "now", "shard-0"], ["t", "n4~abc", "", "r", b"", b"x"]]])]
