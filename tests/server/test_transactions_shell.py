"""The shell's transaction glue (server/transactions.py) on real machines, with a log that only
records what is submitted: the ticker's retry resolves a queue still holding halves of a decided
transaction (once in flight at a time), and of several queues holding one transaction only the
first sends check-backs. (End to end, over pika: tests/integration/test_transactions.py.)"""

from __future__ import annotations

from maxq_raft.amqp.properties import BasicProperties, decode_properties, encode_properties
from maxq_raft.machines import commands as qc
from maxq_raft.machines.features import TXN_HOLDERS, EnableFeatures
from maxq_raft.machines.message import Message
from maxq_raft.machines.metadata import DeclareQueue, MetadataMachine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import Meta, Rejected, TxnCheck
from maxq_raft.machines.shard import ALL_QUEUES
from maxq_raft.machines.txn_decisions import DecideTxn
from maxq_raft.server import transactions


class RecordingLog:
    synchronous = False
    shards = ["shard-0", "shard-1"]

    def __init__(self) -> None:
        self.submitted: list[tuple] = []
        self.callbacks: list = []
        self.held = set(self.shards)

    def holds(self, group: str) -> bool:
        return group in self.held

    def group_of(self, key) -> str:
        return "shard-0" if key[1] < "m" else "shard-1"

    def leads_queue(self, key) -> bool:
        return True

    def submit(self, target, command, then, group=None):
        self.submitted.append((target, command))
        if then is not None:
            self.callbacks.append(then)
        return object()


class Broker:
    def __init__(self) -> None:
        self.meta = MetadataMachine()
        self.queues: dict[tuple[str, str], QueueMachine] = {}
        self.log = RecordingLog()


def with_halves(broker: Broker, name: str, txn_id: str, props_raw: bytes = b"") -> None:
    queue = broker.queues[("/", name)] = QueueMachine("/", name)
    queue.apply(Meta(1, 1), qc.Enqueue([Message("", name, props_raw, b"h")], None, [(0, txn_id, 100, 1)]))


def test_the_ticker_resolves_what_is_decided_once_in_flight() -> None:
    broker = Broker()
    with_halves(broker, "a", "t")
    with_halves(broker, "z", "t")
    with_halves(broker, "b", "open")
    broker.meta.apply(Meta(1, 1), DecideTxn("/", "t", "commit"))
    in_flight: dict = {}
    transactions.resolve_decided(broker, {"shard-0"}, in_flight)  # leads the shard of "a" and "b" only
    assert broker.log.submitted == [(("/", "a"), qc.ResolveTxn("t", "commit"))]
    transactions.resolve_decided(broker, {"shard-0"}, in_flight)
    assert len(broker.log.submitted) == 1, "one in flight per queue and transaction"
    broker.log.callbacks[0](1)  # applied: the next turn may submit again if it still holds them
    assert not in_flight


def test_only_the_first_holder_sends_checks() -> None:
    broker = Broker()
    broker.meta.apply(Meta(1, 1), DeclareQueue("/", "checks", False, False, False, False, {}, ""))
    props = encode_properties(BasicProperties(reply_to="checks", correlation_id="c1"))
    with_halves(broker, "a", "t", props)
    with_halves(broker, "b", "t", props)
    transactions.perform_effect(broker, TxnCheck("/", "b", "t", 1, props))  # not the first: silent
    assert broker.log.submitted == []
    transactions.perform_effect(broker, TxnCheck("/", "a", "t", 1, props))
    [(target, command)] = broker.log.submitted
    assert target == ("/", "checks") and type(command) is qc.Enqueue
    sent = decode_properties(command.messages[0].props_raw)
    assert sent.headers["x-transaction-id"] == "t" and sent.headers["x-transaction-check-attempt"] == 1
    assert sent.correlation_id == "c1" and command.messages[0].body == b"t"


def test_a_leader_holding_fewer_groups_asks_them_before_it_checks() -> None:
    """This member holds shard-1 (queue "n") and not shard-0: queue "a" there may hold halves
    too, and shard-0's leader sees only its own. The check goes out only when no queue of
    shard-0 before "n" holds some, or when shard-0 cannot say (a second check is harmless)."""
    broker = Broker()
    broker.meta.apply(Meta(1, 1), DeclareQueue("/", "checks", False, False, False, False, {}, ""))
    broker.meta.apply(Meta(2, 1), EnableFeatures([TXN_HOLDERS]))
    broker.log.held = {"shard-1"}
    props = encode_properties(BasicProperties(reply_to="checks"))
    with_halves(broker, "n", "t", props)
    for answer, checked in ((["a", "n"], False), (["z"], True), ([], True), (Rejected(503, "no quorum"), True)):
        broker.log.submitted.clear()
        broker.log.callbacks.clear()
        transactions.perform_effect(broker, TxnCheck("/", "n", "t", 1, props))
        [(target, query)] = broker.log.submitted
        assert target == ALL_QUEUES and query == qc.TxnHolders("/", "t")
        broker.log.callbacks[0](answer)
        sent = [t for t, c in broker.log.submitted if type(c) is qc.Enqueue]
        assert sent == ([("/", "checks")] if checked else []), answer
