"""Transactional (half) messages through pika (machines/transactions.py, server/transactions.py,
docs/queue-features.md "Transactional (half) messages").

A publish with `x-transaction-id` is stored, confirmed, and not delivered; a publish to the
reserved exchange `amq.maxq.transaction` (routing key: the id; header `x-transaction-action`)
commits or rolls back every half of it, in every queue. With no decision after
`x-transaction-timeout` ms the broker publishes a check to the reply_to queue of the first half;
after `x-transaction-checks` unanswered checks it rolls the transaction back (dead-letters the
halves where the queue has a dead-letter exchange).

The tests on the shared broker also run against a 3-node cluster (scripts/test); a leader kill
between half and commit is tests/cluster/test_transactions_cluster.py.
"""

from __future__ import annotations

import os
import time
import uuid

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import STATS_SHOWN_S, api, drain, get_one, message_count, wait_until

pytestmark = pytest.mark.timeout(90)

TXN_EXCHANGE = "amq.maxq.transaction"


def half(channel, queue: str, body: bytes, txn_id, exchange: str = "", **headers) -> None:
    props = pika.BasicProperties(delivery_mode=2, headers={"x-transaction-id": txn_id, **headers})
    channel.basic_publish(exchange, queue, body, props)


def decide(channel, txn_id: str, action: str) -> None:
    channel.basic_publish(TXN_EXCHANGE, txn_id, b"", pika.BasicProperties(headers={"x-transaction-action": action}))


def new_id() -> str:
    return f"txn-{uuid.uuid4().hex[:12]}"


def half_counts(broker, queue: str) -> tuple[int, int]:
    status, view, _ = api(broker, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200
    return view["messages_half"], view["transactions_open"]


def test_commit_makes_every_half_visible_in_every_queue(env, broker):
    channel = env.channel()
    a, b = env.queue_name("txa"), env.queue_name("txb")
    exchange = env.exchange_name("txf")
    channel.exchange_declare(exchange, "fanout")
    for name in (a, b):
        channel.queue_declare(name, durable=True)
        channel.queue_bind(name, exchange)
    channel.confirm_delivery()
    txn_id = new_id()
    half(channel, "", b"one", txn_id, exchange=exchange)
    half(channel, a, b"two", txn_id)
    channel.basic_publish("", a, b"plain")  # not in the transaction: delivered at once
    assert message_count(channel, a) == 1 and message_count(channel, b) == 0
    # what the API shows (through a member without the group's replica: its leader's last report)
    assert wait_until(lambda: half_counts(broker, a) == (2, 1) and half_counts(broker, b) == (1, 1), STATS_SHOWN_S)
    assert drain(channel, a) == [b"plain"]
    decide(channel, txn_id, "commit")  # confirmed: the decision is recorded and the queues resolved
    assert wait_until(lambda: half_counts(broker, a) == (0, 0), STATS_SHOWN_S)
    assert drain(channel, a) == [b"one", b"two"]
    assert drain(channel, b) == [b"one"]
    decide(channel, txn_id, "commit")  # the same answer again is harmless (a late check's)
    assert drain(channel, a) == []


def test_a_consumer_gets_nothing_before_the_commit(env):
    channel = env.channel()
    name = env.queue_name("txc")
    channel.queue_declare(name)
    channel.confirm_delivery()
    txn_id = new_id()
    for i in range(5):
        half(channel, name, f"m{i}".encode(), txn_id)
    got: list[bytes] = []
    channel.basic_consume(name, lambda ch, method, props, body: got.append(body), auto_ack=True)
    channel.connection.process_data_events(time_limit=0.5)
    assert got == []
    decide(channel, txn_id, "commit")
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.1)
    assert got == [b"m0", b"m1", b"m2", b"m3", b"m4"]


def test_rollback_discards_and_a_later_commit_is_refused(env):
    channel = env.channel()
    name = env.queue_name("txr")
    channel.queue_declare(name)
    channel.confirm_delivery()
    txn_id = new_id()
    half(channel, name, b"x", txn_id)
    half(channel, name, b"y", txn_id)
    decide(channel, txn_id, "rollback")
    assert message_count(channel, name) == 0
    with pytest.raises(ChannelClosedByBroker) as err:
        decide(channel, txn_id, "commit")
    assert err.value.reply_code == 406 and "rolled back" in err.value.reply_text
    channel = env.channel()
    with pytest.raises(ChannelClosedByBroker) as err:
        half(channel, name, b"late", txn_id)  # a decided id takes no more halves
        channel.queue_declare(name, passive=True)  # (the channel error arrives before its reply)
    assert err.value.reply_code == 406
    assert message_count(env.channel(), name) == 0


def test_bad_inputs_get_clear_errors_and_change_nothing(env):
    name = env.queue_name("txbad")
    env.channel().queue_declare(name)
    cases = [
        (lambda ch: half(ch, name, b"b", 42), 406, "x-transaction-id"),
        (lambda ch: half(ch, name, b"b", new_id(), **{"x-transaction-timeout": 0}), 406, "x-transaction-timeout"),
        (lambda ch: half(ch, name, b"b", new_id(), **{"x-transaction-timeout": "soon"}), 406, "x-transaction-timeout"),
        (lambda ch: half(ch, name, b"b", new_id(), **{"x-transaction-checks": -1}), 406, "x-transaction-checks"),
        (lambda ch: decide(ch, new_id(), "commit"), 404, "no transaction"),
        (lambda ch: decide(ch, new_id(), "maybe"), 406, "x-transaction-action"),
    ]
    for publish, code, text in cases:
        channel = env.channel()
        channel.confirm_delivery()
        with pytest.raises(ChannelClosedByBroker) as err:
            publish(channel)
        assert err.value.reply_code == code and text in err.value.reply_text, err.value
    assert message_count(env.channel(), name) == 0


def test_an_undecided_transaction_is_checked_back_and_the_answer_applied(env):
    """The producer dies after its half publish; the broker asks its reply_to queue, a new
    process of the producer answers commit, and the message is delivered."""
    name, checks = env.queue_name("txq"), env.queue_name("txchecks")
    producer = env.connect()
    channel = producer.channel()
    channel.queue_declare(name)
    channel.queue_declare(checks)
    channel.confirm_delivery()
    txn_id = new_id()
    props = pika.BasicProperties(
        delivery_mode=2,
        reply_to=checks,
        correlation_id="order-17",
        headers={"x-transaction-id": txn_id, "x-transaction-timeout": 300, "x-transaction-checks": 3},
    )
    channel.basic_publish("", name, b"order 17 placed", props)
    producer.close()  # killed before it decided
    channel = env.channel()
    channel.confirm_delivery()
    method, check_props, body = get_one(channel, checks, auto_ack=True)
    assert check_props.headers["x-transaction-id"] == txn_id and body == txn_id.encode()
    assert check_props.headers["x-transaction-check-attempt"] == 1
    assert check_props.correlation_id == "order-17" and check_props.type == "maxq.transaction.check"
    assert message_count(channel, name) == 0
    decide(channel, txn_id, "commit")
    assert drain(channel, name) == [b"order 17 placed"]


def test_no_answer_after_the_checks_rolls_back_or_dead_letters(env):
    channel = env.channel()
    plain, dead, dlq, checks = (env.queue_name(p) for p in ("txp", "txd", "txdlq", "txck"))
    dlx = env.exchange_name("txdlx")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(dlq)
    channel.queue_bind(dlq, dlx)
    channel.queue_declare(plain)
    channel.queue_declare(dead, arguments={"x-dead-letter-exchange": dlx})
    channel.queue_declare(checks)
    channel.confirm_delivery()
    ids = {}
    for name in (plain, dead):
        ids[name] = new_id()
        props = pika.BasicProperties(
            reply_to=checks,
            headers={"x-transaction-id": ids[name], "x-transaction-timeout": 200, "x-transaction-checks": 2},
        )
        channel.basic_publish("", name, f"to {name}".encode(), props)
    _, props, body = get_one(channel, dlq, timeout_s=20, auto_ack=True)
    assert body == f"to {dead}".encode() and props.headers["x-death"][0]["reason"] == "expired"
    attempts = sorted(
        (p.headers["x-transaction-id"], p.headers["x-transaction-check-attempt"]) for p in _all(channel, checks)
    )
    assert attempts == sorted([(ids[n], k) for n in (plain, dead) for k in (1, 2)])
    assert message_count(channel, plain) == 0 and message_count(channel, dead) == 0
    with pytest.raises(ChannelClosedByBroker) as err:
        decide(channel, ids[plain], "commit")
    assert err.value.reply_code == 406 and "no answer" in err.value.reply_text
    channel = env.channel()
    channel.confirm_delivery()
    decide(channel, ids[plain], "rollback")  # agrees with what stands: confirmed
    assert message_count(channel, plain) == 0


def _all(channel, queue: str) -> list:
    found = []
    for _ in range(100):
        method, props, _body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return found
        found.append(props)
    raise AssertionError("too many check messages")


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_open_transactions_of_a_durable_queue_survive_a_single_node_restart(start_broker, how):
    """Persistent halves are on disk once confirmed: after a restart the transaction is still
    open (checked back at once), a commit makes them visible, and a rolled-back one stays gone."""
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("tq", durable=True)
    channel.queue_declare("checks", durable=True)
    channel.confirm_delivery()
    kept, dropped = new_id(), new_id()
    channel.basic_publish(  # the first half's reply_to is where its checks go
        "",
        "tq",
        b"kept 1",
        pika.BasicProperties(
            delivery_mode=2, reply_to="checks", headers={"x-transaction-id": kept, "x-transaction-timeout": 60_000}
        ),
    )
    half(channel, "tq", b"kept 2", kept)
    half(channel, "tq", b"dropped", dropped)
    decide(channel, dropped, "rollback")
    connection.close()
    if how == "sigkill":
        server.kill()
    else:
        assert server.stop() == 0, server.log_text()
    server = start_broker(data_dir=server.data_dir)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    assert message_count(channel, "tq") == 0
    _, check, _ = get_one(channel, "checks", timeout_s=10, auto_ack=True)  # asked again at once
    assert check.headers["x-transaction-id"] == kept and check.headers["x-transaction-check-attempt"] == 1
    with pytest.raises(ChannelClosedByBroker) as err:
        decide(channel, dropped, "commit")  # resolved before the restart: nothing holds it now
    assert err.value.reply_code == 404
    channel = connection.channel()
    channel.confirm_delivery()
    decide(channel, kept, "commit")
    assert drain(channel, "tq") == [b"kept 1", b"kept 2"]
    connection.close()


def test_halves_and_decisions_inside_an_amqp_tx_are_routed_at_tx_commit(env):
    channel = env.channel()
    name = env.queue_name("txtx")
    channel.queue_declare(name)
    channel.tx_select()
    txn_id = new_id()
    half(channel, name, b"in tx", txn_id)
    channel.tx_commit()
    assert message_count(channel, name) == 0
    decide(channel, txn_id, "commit")
    assert message_count(channel, name) == 0  # the decision waits for tx.commit too
    channel.tx_commit()
    assert drain(channel, name) == [b"in tx"]


def test_halves_beyond_the_queues_bound_are_nacked(env):
    """At most 64 MiB of half bodies per queue (transactions.py): the next half is nacked,
    even on a drop-head queue, and the transaction keeps the halves it had."""
    from pika.exceptions import NackError

    channel = env.channel()
    name = env.queue_name("txbig")
    channel.queue_declare(name)
    channel.confirm_delivery()
    txn_id = new_id()
    body = b"b" * (1 << 19)  # (a cluster's log entry holds at most 1 MiB)
    for _ in range(128):
        half(channel, name, body, txn_id)
    with pytest.raises(NackError):
        half(channel, name, body, txn_id)
    decide(channel, txn_id, "commit")
    assert message_count(channel, name) == 128
    channel.queue_purge(name)


def test_halves_and_their_commit_in_one_read_reach_the_queue_before_the_decision(env):
    """Publishes without confirms are not waited for: the halves and the decision arrive in one
    read of the broker, and the halves reach their queue before the decision does (on a single
    node, applied at once: all ready by the next method's reply)."""
    channel = env.channel()
    name = env.queue_name("txread")
    channel.queue_declare(name)
    txn_id = new_id()
    props = pika.BasicProperties(headers={"x-transaction-id": txn_id})
    for i in range(20):
        channel.basic_publish("", name, f"r{i}".encode(), props)
    decide(channel, txn_id, "commit")
    if os.environ.get("MAXQ_TEST_CLUSTER", "") in ("", "0"):
        assert message_count(channel, name) == 20  # not a tick later (the ticker's retry)
    assert [get_one(channel, name, auto_ack=True)[2] for _ in range(20)] == [f"r{i}".encode() for i in range(20)]


def test_halves_and_their_decision_in_one_amqp_tx(env):
    channel = env.channel()
    name = env.queue_name("txtx1")
    channel.queue_declare(name)
    channel.tx_select()
    txn_id = new_id()
    half(channel, name, b"a", txn_id)
    half(channel, name, b"b", txn_id)
    decide(channel, txn_id, "commit")
    channel.tx_commit()
    # (the next method on the channel waits for the decision: docs/queue-features.md)
    assert [get_one(channel, name, auto_ack=True)[2] for _ in range(2)] == [b"a", b"b"]


def test_a_half_published_again_with_its_dedup_id_is_dropped(env):
    """A publisher that lost a half's confirm publishes it again (same transaction, same
    x-deduplication-header); on a deduplicating queue the copy is confirmed and dropped, so the
    commit delivers the message once (the txn workload of jepsen-style/ does this under kills)."""
    channel = env.channel()
    name = env.queue_name("txdedup")
    channel.queue_declare(name, durable=True, arguments={"x-message-deduplication": True})
    channel.confirm_delivery()
    txn_id = new_id()
    half(channel, name, b"first", txn_id, **{"x-deduplication-header": "m-1"})
    half(channel, name, b"again", txn_id, **{"x-deduplication-header": "m-1"})  # the retry
    half(channel, name, b"other", txn_id, **{"x-deduplication-header": "m-2"})
    decide(channel, txn_id, "commit")
    assert drain(channel, name) == [b"first", b"other"]
    channel.basic_publish("", name, b"plain", pika.BasicProperties(headers={"x-deduplication-header": "m-2"}))
    assert drain(channel, name) == []  # a half's id is in the window like any publish's
