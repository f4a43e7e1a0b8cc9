"""Transactional half messages in the queue machine (machines/transactions.py) and the decision
record (machines/txn_decisions.py): examples, then a stateful test against a model.

Examples: halves are not delivered until a commit, which enqueues them all in one command in
publish order; rollback drops them; a repeated resolve changes nothing; check-backs come at
the log's times with rising attempt numbers, then time-outs; an expired transaction is
dead-lettered when the queue has a dead-letter exchange; a snapshot (format 5) keeps open
transactions; malformed items are refused before anything changes; the first decision stands.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from maxq_raft.machines.commands import Checkout, Create, Enqueue, Get, ResolveTxn, Tick, TxnHolders
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import DeadLetter, Deliver, Meta, Overflowed, Rejected
from maxq_raft.machines.shard import ALL_QUEUES, ShardMachine
from maxq_raft.machines.snapshot import dump_queue, load_queue
from maxq_raft.machines.transactions import TXN_MESSAGES_MAX, TxnCheck, TxnTimedOut
from maxq_raft.machines.txn_decisions import DECISION_KEEP_MS, DecideTxn, TxnDecisions
from maxq_raft.replication.entries import decode_command, encode_command


class Clocked:
    def __init__(self, machine: QueueMachine) -> None:
        self.machine = machine
        self.index = 0

    def __call__(self, time_ms: int, command):
        self.index += 1
        reply, effects = self.machine.apply(Meta(self.index, time_ms), command)
        self.machine.check_invariants()
        return reply, effects


def msg(body: str, reply_to: bytes = b"") -> Message:
    return Message("", "q", reply_to, body.encode())


def half(
    q: Clocked,
    time_ms: int,
    txn_id: str,
    *bodies: str,
    plain: tuple[str, ...] = (),
    timeout_ms: int = 1000,
    checks: int = 2,
):
    messages = [msg(b) for b in bodies] + [msg(b) for b in plain]
    items = [(i, txn_id, timeout_ms, checks) for i in range(len(bodies))]
    return q(time_ms, Enqueue(messages, None, items))


def bodies_got(q: Clocked, time_ms: int) -> list[str]:
    got = []
    for _ in range(100):
        reply, _ = q(time_ms, Get("g", "o", True))
        if reply is None:
            return got
        got.append(reply[0].body.decode())
    raise AssertionError("more than 100 messages")


def test_halves_wait_for_commit_then_come_together_in_order() -> None:
    q = Clocked(QueueMachine("/", "q"))
    assert half(q, 10, "t1", "a", "b", plain=("p",))[0] == 3
    assert bodies_got(q, 11) == ["p"]  # only the plain publish is ready
    assert half(q, 12, "t1", "c")[0] == 1
    assert q.machine.ready_count == 0 and q.machine.txn_messages == 3
    reply, _ = q(13, ResolveTxn("t1", "commit"))
    assert reply == 3
    assert bodies_got(q, 14) == ["a", "b", "c"]
    assert q(15, ResolveTxn("t1", "commit"))[0] == 0  # a repeat: nothing more


def test_commit_delivers_to_a_consumer_in_one_command() -> None:
    q = Clocked(QueueMachine("/", "q"))
    q(1, Checkout("c1", "o", 0, True, 0, False, 100))
    _, effects = half(q, 2, "t", "a", "b")
    assert effects == []
    _, effects = q(3, ResolveTxn("t", "commit"))
    assert [e.message.body for e in effects if type(e) is Deliver] == [b"a", b"b"]


def test_rollback_discards() -> None:
    q = Clocked(QueueMachine("/", "q"))
    half(q, 1, "t", "a", "b")
    assert q(2, ResolveTxn("t", "rollback"))[0] == 2
    assert q.machine.ready_count == 0 and not q.machine.txns
    assert q(3, ResolveTxn("t", "commit"))[0] == 0  # decided elsewhere already: nothing held


def test_check_backs_then_time_outs_from_log_time() -> None:
    q = Clocked(QueueMachine("/", "q"))
    half(q, 1000, "t", "a", timeout_ms=500, checks=2)
    assert q.machine.next_deadline_ms == 1500
    assert q(1499, Tick())[1] == []
    _, effects = q(1500, Tick())
    assert [(type(e), e.attempt) for e in effects] == [(TxnCheck, 1)]
    assert effects[0].txn_id == "t" and effects[0].queue == "q"
    assert q.machine.next_deadline_ms == 2000
    _, effects = q(2000, Tick())
    assert [e.attempt for e in effects] == [2]
    _, effects = q(2500, Tick())
    assert effects == [TxnTimedOut("/", "q", "t")]
    _, effects = q(3000, Tick())
    assert effects == [TxnTimedOut("/", "q", "t")]  # again, until it is resolved
    q(3001, ResolveTxn("t", "expire"))
    assert q.machine.next_deadline_ms is None


def test_expire_dead_letters_when_the_queue_has_a_dlx() -> None:
    q = Clocked(QueueMachine("/", "q", settings=QueueSettings(dead_letter_exchange="dlx")))
    half(q, 1, "t", "a", "b")
    _, effects = q(2, ResolveTxn("t", "expire"))
    dead = [e for e in effects if type(e) is DeadLetter]
    assert len(dead) == 1 and dead[0].reason == "expired" and [m.body for m in dead[0].messages] == [b"a", b"b"]
    plain = Clocked(QueueMachine("/", "p"))
    half(plain, 1, "t", "a")
    _, effects = plain(2, ResolveTxn("t", "expire"))
    assert effects == [] and plain.machine.dropped["expired"] == 1


def test_a_snapshot_keeps_open_transactions() -> None:
    q = Clocked(QueueMachine("/", "q"))
    half(q, 1, "t1", "a", "b", timeout_ms=100, checks=3)
    half(q, 2, "t2", "c")
    q(101, Tick())  # t1 checked once
    restored = Clocked(load_queue(list(dump_queue(q.machine))))
    restored.index = q.index
    assert list(restored.machine.txns) == ["t1", "t2"] and restored.machine.txns["t1"].attempts == 1
    _, effects = restored(201, Tick())
    assert [(e.txn_id, e.attempt) for e in effects] == [("t1", 2)]
    assert restored(202, ResolveTxn("t1", "commit"))[0] == 2
    assert bodies_got(restored, 203) == ["a", "b"]


def test_malformed_items_are_refused_before_anything_changes() -> None:
    q = Clocked(QueueMachine("/", "q"))
    for items in ([(0, 5, 10, 1)], [(0, "t", 0, 1)], [(0, "t", 10, -1)], [(1, "t", 10, 1)], [(0, "t", 10)], "x"):
        reply, _ = q(1, Enqueue([msg("a")], None, items))
        assert type(reply) is Rejected and reply.reply_code == 541
    assert q(1, ResolveTxn("t", "maybe"))[0].reply_code == 541
    assert q.machine.ready_count == 0 and not q.machine.txns


def test_too_many_halves_are_refused_as_overflow(monkeypatch) -> None:
    from maxq_raft.machines import transactions

    monkeypatch.setattr(transactions, "TXN_MESSAGES_MAX", 2)
    q = Clocked(QueueMachine("/", "q"))
    reply, _ = half(q, 1, "t", "a", "b", "c")
    assert reply == Overflowed(2, [2])
    assert TXN_MESSAGES_MAX > 2


def test_commands_round_trip_through_entries() -> None:
    command = Enqueue([msg("a"), msg("b")], [(1, "sk", None)], [(0, "t", 10, 1)])
    decoded = decode_command(encode_command(command), False)
    assert [m.body for m in decoded.messages] == [b"a", b"b"]
    assert decoded.dedup == command.dedup and decoded.txn == command.txn
    plain = decode_command(encode_command(Enqueue([msg("a")], None, [(0, "t", 10, 1)])), False)
    assert plain.dedup is None and plain.txn == [(0, "t", 10, 1)]
    assert decode_command(encode_command(ResolveTxn("t", "commit")), False) == ResolveTxn("t", "commit")
    assert decode_command(encode_command(DecideTxn("/", "t", "rollback")), True) == DecideTxn("/", "t", "rollback")
    assert decode_command(encode_command(TxnHolders("/", "t")), False) == TxnHolders("/", "t")


def test_a_shard_names_its_queues_holding_halves_of_a_transaction_and_changes_nothing() -> None:
    shard = ShardMachine("shard-0", lambda key, _create: QueueMachine(key[0], key[1]))
    for key in [("/", "b"), ("/", "a"), ("other", "a"), ("/", "c")]:
        shard.apply(Meta(1, 0), key, Create(True, {}), "n1@x")
    for key in [("/", "b"), ("/", "a"), ("other", "a")]:
        q = Clocked(shard.queues[key])
        half(q, 0, "t", "one")
    half(Clocked(shard.queues[("/", "c")]), 0, "u", "two")

    def state() -> dict:
        return {key: (q.ready_count, q.txn_messages, sorted(q.txns)) for key, q in shard.queues.items()}

    before = state()
    assert shard.apply(Meta(2, 0), ALL_QUEUES, TxnHolders("/", "t"), "n2@y") == (["a", "b"], [])
    assert shard.apply(Meta(3, 0), ALL_QUEUES, TxnHolders("/", "none"), "n2@y") == ([], [])
    reply, effects = shard.apply(Meta(4, 0), ALL_QUEUES, TxnHolders("/", ["unhashable"]), "n2@y")  # type: ignore[arg-type]
    assert type(reply) is Rejected and reply.reply_code == 406 and effects == []
    assert state() == before


def test_the_first_decision_stands_and_old_ones_are_forgotten() -> None:
    d = TxnDecisions()
    assert d.apply(Meta(1, 100), DecideTxn("/", "t", "rollback")) == ("rollback", [])
    assert d.apply(Meta(2, 200), DecideTxn("/", "t", "commit")) == ("rollback", [])
    assert d.get("/", "t") == "rollback" and d.get("v", "t") is None
    assert type(d.apply(Meta(3, 300), DecideTxn("/", "t", "maybe"))[0]) is Rejected
    d.apply(Meta(4, 100 + DECISION_KEEP_MS + 1), DecideTxn("/", "u", "commit"))
    assert d.get("/", "t") is None and d.get("/", "u") == "commit"
    copy = TxnDecisions()
    copy.load(d.dump())
    assert copy.decided == d.decided and copy.now_ms == d.now_ms


class TxnModel(RuleBasedStateMachine):
    """Halves of a few transactions, plain publishes, resolves and ticks, against a model: the
    ready messages are exactly the plain ones and the committed halves, in the order they
    became ready (each transaction's halves in publish order)."""

    def __init__(self) -> None:
        super().__init__()
        self.q = Clocked(QueueMachine("/", "q"))
        self.time_ms = 0
        self.n = 0
        self.open: dict[str, list[str]] = {}
        self.ready: list[str] = []

    @rule(txn=st.sampled_from(["t1", "t2", "t3"]), count=st.integers(1, 3), plain=st.integers(0, 2))
    def publish(self, txn: str, count: int, plain: int) -> None:
        bodies = [f"h{self.n + i}" for i in range(count)]
        plains = [f"p{self.n + count + i}" for i in range(plain)]
        self.n += count + plain
        assert half(self.q, self.time_ms, txn, *bodies, plain=tuple(plains))[0] == count + plain
        self.open.setdefault(txn, []).extend(bodies)
        self.ready.extend(plains)

    @rule(txn=st.sampled_from(["t1", "t2", "t3"]), action=st.sampled_from(["commit", "rollback", "expire"]))
    def resolve(self, txn: str, action: str) -> None:
        held = self.open.pop(txn, [])
        assert self.q(self.time_ms, ResolveTxn(txn, action))[0] == len(held)
        if action == "commit":
            self.ready.extend(held)

    @rule(ms=st.integers(0, 3000))
    def tick(self, ms: int) -> None:
        self.time_ms += ms
        _, effects = self.q(self.time_ms, Tick())
        assert {e.txn_id for e in effects} <= set(self.open)

    @rule()
    def snapshot(self) -> None:
        index = self.q.index
        self.q = Clocked(load_queue(list(dump_queue(self.q.machine))))
        self.q.index = index

    @invariant()
    def holds_what_the_model_says(self) -> None:
        machine = self.q.machine
        assert [m.body.decode() for m in machine.ready] == self.ready
        assert {t: [m.body.decode() for m in h.messages] for t, h in machine.txns.items()} == self.open


TestTxnModel = TxnModel.TestCase
TestTxnModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def persistent(body: str) -> Message:
    return Message("", "q", b"", body.encode(), True)


def test_a_durable_queue_keeps_its_persistent_halves_for_a_restart() -> None:
    import copy

    from .test_queue_machine import DictBacking

    backing = DictBacking()
    q = Clocked(QueueMachine("/", "q", backing=backing, durable=True))
    q(
        1,
        Enqueue(
            [persistent("a"), msg("transient"), persistent("b")],
            None,
            [(0, "t", 500, 2), (1, "t", 500, 2), (2, "u", 500, 2)],
        ),
    )
    q(2, Enqueue([persistent("c")], None, [(0, "t", 500, 2)]))
    assert sorted(h[0] for h in backing.halves.values()) == ["t", "t", "u"]  # the transient one is not stored
    q(3, ResolveTxn("u", "rollback"))
    assert sorted(h[0] for h in backing.halves.values()) == ["t", "t"]
    restarted = Clocked(QueueMachine("/", "q", backing=copy.deepcopy(backing), durable=True))
    restarted.machine.recover_txns()
    restarted.machine.check_invariants()
    assert {t: [m.body for m in h.messages] for t, h in restarted.machine.txns.items()} == {"t": [b"a", b"c"]}
    _, effects = restarted(10_000, Tick())  # the check-backs start over, the first at once
    assert [(e.txn_id, e.attempt) for e in effects] == [("t", 1)]
    assert restarted(10_001, ResolveTxn("t", "commit"))[0] == 2
    assert not restarted.machine.backing.halves  # resolved: gone from the halves, stored as messages
    assert bodies_got(restarted, 10_002) == ["a", "c"]


def test_a_snapshot_of_a_durable_queue_writes_its_halves_to_the_new_backing() -> None:
    from .test_queue_machine import DictBacking

    q = Clocked(QueueMachine("/", "q", backing=DictBacking(), durable=True))
    q(1, Enqueue([persistent("a")], None, [(0, "t", 500, 2)]))
    fresh = DictBacking()
    restored = load_queue(list(dump_queue(q.machine)), backing=fresh)
    restored.check_invariants()
    assert [h[0] for h in fresh.halves.values()] == ["t"]


def test_the_metadata_snapshot_keeps_the_decisions() -> None:
    from maxq_raft.machines.metadata import MetadataMachine
    from maxq_raft.server.metadata_snapshot import dump_metadata, load_metadata

    machine = MetadataMachine()
    assert machine.apply(Meta(1, 1000), DecideTxn("/", "t", "commit")) == ("commit", [])
    machine.apply(Meta(2, 2000), DecideTxn("/", "u", "expire"))
    restored = load_metadata(list(dump_metadata(machine)))
    assert restored.txn_decisions.decided == machine.txn_decisions.decided
    assert restored.apply(Meta(3, 3000), DecideTxn("/", "t", "rollback")) == ("commit", [])


DEDUP = QueueSettings(deduplication=True)


def test_a_deduplicating_queue_drops_a_half_published_again() -> None:
    """A publisher that lost a half's confirm publishes it again with the same
    x-deduplication-header: the copy is accepted (confirmed) and not held; a commit delivers one.
    A half's id is recorded like any publish's (a plain publish repeating it is dropped too), and
    two halves with one id in one Enqueue keep the first."""
    q = Clocked(QueueMachine("/", "q", settings=DEDUP))
    assert q(1, Enqueue([msg("a1")], [(0, "m1", None)], [(0, "t", 500, 2)]))[0] == 1
    assert (
        q(2, Enqueue([msg("a2"), msg("b")], [(0, "m1", None), (1, "m2", None)], [(0, "t", 500, 2), (1, "t", 500, 2)]))[
            0
        ]
        == 2
    )
    assert (
        q(3, Enqueue([msg("c1"), msg("c2")], [(0, "m3", None), (1, "m3", None)], [(0, "t", 500, 2), (1, "t", 500, 2)]))[
            0
        ]
        == 2
    )
    assert q.machine.txn_messages == 3 and q.machine.dedup_window.duplicates == 2
    assert q(4, Enqueue([msg("plain")], [(0, "m2", None)]))[0] == 1  # the half's id is in the window
    assert q(5, ResolveTxn("t", "commit"))[0] == 3
    assert bodies_got(q, 6) == ["a1", "b", "c1"]
    # A queue without deduplication holds both copies (the ids mean nothing there).
    plain = Clocked(QueueMachine("/", "q"))
    plain(1, Enqueue([msg("a1")], [(0, "m1", None)], [(0, "t", 500, 2)]))
    plain(2, Enqueue([msg("a2")], [(0, "m1", None)], [(0, "t", 500, 2)]))
    assert plain(3, ResolveTxn("t", "commit"))[0] == 2


def test_a_halfs_id_survives_a_snapshot_and_a_single_node_restart() -> None:
    import copy

    from .test_queue_machine import DictBacking

    q = Clocked(QueueMachine("/", "q", settings=DEDUP))
    q(1, Enqueue([msg("a1")], [(0, "m1", None)], [(0, "t", 500, 2)]))
    restored = Clocked(load_queue(list(dump_queue(q.machine))))
    restored.index = q.index
    assert restored(2, Enqueue([msg("a2")], [(0, "m1", None)], [(0, "t", 500, 2)]))[0] == 1
    assert restored(3, ResolveTxn("t", "commit"))[0] == 1
    assert bodies_got(restored, 4) == ["a1"]

    backing = DictBacking()
    d = Clocked(QueueMachine("/", "q", settings=DEDUP, backing=backing, durable=True))
    d(1, Enqueue([persistent("a1")], [(0, "m1", None)], [(0, "t", 500, 2)]))
    restarted = Clocked(QueueMachine("/", "q", settings=DEDUP, backing=copy.deepcopy(backing), durable=True))
    restarted.machine.recover_txns()
    restarted.machine.recover_dedup()
    restarted.machine.check_invariants()
    assert restarted(2, Enqueue([persistent("a2")], [(0, "m1", None)], [(0, "t", 500, 2)]))[0] == 1
    assert restarted(3, ResolveTxn("t", "commit"))[0] == 1
    assert bodies_got(restarted, 4) == ["a1"]
