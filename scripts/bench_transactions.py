#!/usr/bin/env python3
"""Half messages + commit against plain confirmed publishes (issue #21), in the same run.

    .venv/bin/python scripts/bench_transactions.py [--seconds 5] [--rounds 3] [--batch 1,10] [--out F]

A fresh single node (its own data folder and port) and one pika BlockingConnection with
publisher confirms, so every publish waits for its confirm (the latency-bound case a producer of
business events is in). Interleaved rounds of `--seconds` each, on a durable queue, 128-byte
persistent messages, drained between rounds:
- `plain`: confirmed publishes, one at a time;
- `txn-N`: transactions of N half messages (one at a time, each confirmed) and a confirmed
  commit publish to amq.maxq.transaction.
Printed: per round the committed messages per second and transactions per second; then the
median per kind. Appended to `--out` as JSON lines when given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
import uuid
from pathlib import Path

import pika
from bench_node import Node  # (scripts/ is on sys.path when a script runs)

ROOT = Path(__file__).resolve().parent.parent
BODY = b"x" * 128
QUEUE = "bench-txn"


PERSISTENT = pika.BasicProperties(delivery_mode=2)
COMMIT = pika.BasicProperties(headers={"x-transaction-action": "commit"})


def plain_round(channel, seconds: float) -> tuple[int, int]:
    """(messages, transactions) published in `seconds`: one confirmed publish at a time."""
    n = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        channel.basic_publish("", QUEUE, BODY, PERSISTENT)
        n += 1
    return n, 0


def txn_round(channel, seconds: float, batch: int) -> tuple[int, int]:
    """(messages committed, transactions) in `seconds`: `batch` halves then a commit, each confirmed."""
    n = txns = 0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        txn_id = uuid.uuid4().hex
        props = pika.BasicProperties(delivery_mode=2, headers={"x-transaction-id": txn_id})
        for _ in range(batch):
            channel.basic_publish("", QUEUE, BODY, props)
        channel.basic_publish("amq.maxq.transaction", txn_id, b"", COMMIT)
        n += batch
        txns += 1
    return n, txns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", default="1,10", help="halves per transaction, comma separated")
    parser.add_argument("--out")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    node = Node("maxq-txn-")
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        connection = pika.BlockingConnection(pika.ConnectionParameters(port=node.port))
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        channel.confirm_delivery()
        kinds = ["plain"] + [f"txn-{b}" for b in batches]
        for round_number in range(1, args.rounds + 1):  # interleaved: the host's drift hits all alike
            for kind in kinds:
                if kind == "plain":
                    n, txns = plain_round(channel, args.seconds)
                else:
                    n, txns = txn_round(channel, args.seconds, int(kind.split("-")[1]))
                queued = channel.queue_declare(QUEUE, passive=True).method.message_count
                assert queued == n, f"{kind}: {queued} ready after {n} published"
                channel.queue_purge(QUEUE)
                rate, txn_rate = n / args.seconds, txns / args.seconds
                results.setdefault(kind, []).append((rate, txn_rate))
                print(f"round {round_number} {kind:8} {rate:8.0f} msgs/s committed  {txn_rate:7.0f} txns/s")
        connection.close()
    finally:
        node.stop()
    print("medians:")
    summary = {}
    for kind, rows in results.items():
        rate = statistics.median(r for r, _ in rows)
        txn_rate = statistics.median(t for _, t in rows)
        summary[kind] = {"msgs_per_s": round(rate), "txns_per_s": round(txn_rate)}
        print(f"  {kind:8} {rate:8.0f} msgs/s  {txn_rate:7.0f} txns/s")
    if args.out:
        with open(args.out, "a") as out:
            record = {
                "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "seconds": args.seconds,
                "rounds": args.rounds,
                "results": summary,
            }
            out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
