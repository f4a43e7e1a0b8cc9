"""A transactional outbox with MaxQ-Raft's half messages and pika (docs/outbox-example.md).

An order service must change its database and publish an event, both or neither, exactly once,
even if it crashes between the two. With half messages it needs no outbox table scanner:

1. publish the event as a half message (`x-transaction-id`, `reply_to` for check-backs): the
   broker stores it and confirms it, and delivers it to no one yet;
2. commit the database transaction (the order row names the transaction id);
3. publish the decision `commit` to `amq.maxq.transaction`.

A crash after 1 leaves the event undecided. After `x-transaction-timeout` ms the broker asks
the `reply_to` queue; `answer_checks` (run by every instance of the service) looks the id up in
the database: the row is there (the crash came after 2) → commit; it is not (the crash came
before 2, so the database rolled back) → rollback. The event is delivered once, or never.

Run: `python outbox_service.py --port 5672 place 17` (add `--crash-after-db-commit` to stop
between 2 and 3), then `python outbox_service.py --port 5672 answer-checks --for-s 10`.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import time

import pika
from pika.exceptions import ChannelClosedByBroker

TXN_EXCHANGE = "amq.maxq.transaction"


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path)
    db.execute("create table if not exists orders (id integer primary key, txn_id text unique, total integer)")
    return db


def decide(channel, txn_id: str, action: str) -> None:
    """The producer's commit or rollback: a confirmed publish to the reserved exchange."""
    channel.basic_publish(TXN_EXCHANGE, txn_id, b"", pika.BasicProperties(headers={"x-transaction-action": action}))


def place_order(db, channel, prefix: str, order_id: int, total: int, timeout_ms: int, crash: str | None) -> None:
    txn_id = f"{prefix}order-{order_id}"
    event = json.dumps({"order": order_id, "total": total}).encode()
    props = pika.BasicProperties(
        delivery_mode=2,
        message_id=txn_id,
        reply_to=f"{prefix}orders.checks",
        headers={"x-transaction-id": txn_id, "x-transaction-timeout": timeout_ms},
    )
    channel.basic_publish("", f"{prefix}orders.events", event, props)  # 1. stored, not delivered
    if crash == "after-half":
        os._exit(17)  # (the database never saw the order: the check-back will roll back)
    with db:  # 2. the business change, in one database transaction with the transaction id
        db.execute("insert into orders (id, txn_id, total) values (?, ?, ?)", (order_id, txn_id, total))
    if crash == "after-db-commit":
        os._exit(17)  # (the event is undecided: the check-back will commit it)
    decide(channel, txn_id, "commit")  # 3. delivered from now on


def answer_checks(db, connection, prefix: str, for_s: float) -> int:
    """Answer the broker's check-backs for `for_s` seconds; how many were answered."""
    checks = connection.channel()
    decisions = connection.channel()
    decisions.confirm_delivery()
    answered = 0
    deadline = time.monotonic() + for_s
    for method, props, _body in checks.consume(f"{prefix}orders.checks", inactivity_timeout=0.2):
        if time.monotonic() > deadline:
            break
        if method is None:
            continue
        txn_id = props.headers["x-transaction-id"]
        found = db.execute("select 1 from orders where txn_id = ?", (txn_id,)).fetchone()
        try:
            decide(decisions, txn_id, "commit" if found else "rollback")
        except ChannelClosedByBroker as err:  # already decided (a repeated check) or resolved
            print(f"{txn_id}: {err.reply_code} {err.reply_text}")
            decisions = connection.channel()
            decisions.confirm_delivery()
        checks.basic_ack(method.delivery_tag)
        answered += 1
    checks.cancel()
    return answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("--db", default="orders.sqlite")
    parser.add_argument("--prefix", default="", help="a prefix for the queue and transaction names")
    parser.add_argument("--timeout-ms", type=int, default=2000, help="x-transaction-timeout of a half")
    sub = parser.add_subparsers(dest="command", required=True)
    place = sub.add_parser("place")
    place.add_argument("order_id", type=int)
    place.add_argument("--total", type=int, default=100)
    place.add_argument("--crash", choices=["after-half", "after-db-commit"])
    answer = sub.add_parser("answer-checks")
    answer.add_argument("--for-s", type=float, default=10.0)
    args = parser.parse_args()
    db = open_db(args.db)
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=args.port))
    channel = connection.channel()
    channel.queue_declare(f"{args.prefix}orders.events", durable=True)
    channel.queue_declare(f"{args.prefix}orders.checks", durable=True)
    channel.confirm_delivery()
    if args.command == "place":
        place_order(db, channel, args.prefix, args.order_id, args.total, args.timeout_ms, args.crash)
    else:
        print(f"answered {answer_checks(db, connection, args.prefix, args.for_s)} checks")
    connection.close()


if __name__ == "__main__":
    main()
