#!/usr/bin/env python3
"""How long a drain and a rebalance take on brokers with 1 GiB of queued messages (issue #19).

    scripts/bench_broker_moves.py [--queued-mib 1024] [--body-kib 16] [--queues 20] [--keep]

Starts a 5-member cluster with `scripts/cluster up --hosts 5 --replication-factor 3` (10 shard
groups, each on 3 members; data in a temporary folder, removed unless --keep), publishes
--queued-mib of persistent messages with confirms through n1 into --queues durable queues
(spread over the groups by their names), then times, through n1's admin API, as an operator
would run them:

  drain      `maxqctl drain n3`: leaderships, clients, then every replica n3 holds moves to
             the other members (each a learner catching up through the group's snapshot and
             log, then added, then n3 removed);
  rebalance  `maxqctl revive n3` and `maxqctl rebalance`: n3 gets its share back.

While each runs, a publisher on n2 keeps publishing small persistent messages with confirms to
one more queue, so the figure says what the queues' clients saw meanwhile (confirmed, failed).
At the end every queue is counted and consumed through n3 (each body compared with the one
published): the script exits 1 if any message went missing or came back changed.
A line of JSON goes to stdout's last line (and --results FILE).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
import pika.exceptions

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "scripts" / "cluster"
MAXQCTL = ROOT / ".venv" / "bin" / "maxqctl"
BODY = os.urandom(1 << 20)  # every message's body is its first --body-kib KiB
BASE = 3300  # MAXQ_CLUSTER_BASE: AMQP 8981+, admin 18981+, Prometheus 18993+, Raft 10401+


def port(first: int, member: int) -> int:
    return first + BASE + member


def ctl(*args: str, timeout_s: float = 3600) -> tuple[float, str]:
    """Run maxqctl against n1; (seconds it took, its output). Raises on a non-zero exit."""
    started = time.monotonic()
    done = subprocess.run(
        [str(MAXQCTL), "--node", f"127.0.0.1:{port(15680, 1)}", "--timeout", str(int(timeout_s)), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"maxqctl {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return time.monotonic() - started, done.stdout + done.stderr


def fill(queues: list[str], total_bytes: int, body_bytes: int, connections: int = 8) -> tuple[int, float]:
    """Publish persistent messages with confirms through n1 until total_bytes of bodies, on
    `connections` connections at once (each waits for its confirm: one Raft commit per message)."""
    body = BODY[:body_bytes]
    count = total_bytes // body_bytes
    errors: list[BaseException] = []

    def publish(part: int) -> None:
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port(5680, 1), heartbeat=0))
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                props = pika.BasicProperties(delivery_mode=2)
                for i in range(part, count, connections):
                    ch.basic_publish("", queues[i % len(queues)], body, props)
            finally:
                conn.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port(5680, 1)))
    try:
        for name in queues:
            conn.channel().queue_declare(name, durable=True)
    finally:
        conn.close()
    started = time.monotonic()
    threads = [threading.Thread(target=publish, args=(part,)) for part in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError(f"filling failed: {errors[0]!r}")
    return count, time.monotonic() - started


class Publisher(threading.Thread):
    """Small persistent messages with confirms through n2, one at a time, reconnecting on errors."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.stop = threading.Event()
        self.confirmed = 0
        self.failed = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port(5680, 2), heartbeat=0))
                ch = conn.channel()
                ch.confirm_delivery()
                ch.queue_declare(self.queue, durable=True)
                while not self.stop.is_set():
                    ch.basic_publish("", self.queue, b"x" * 128, pika.BasicProperties(delivery_mode=2))
                    self.confirmed += 1
                    time.sleep(0.01)
                conn.close()
            except (pika.exceptions.AMQPError, OSError):
                self.failed += 1
                self.stop.wait(0.5)


def counts(queues: list[str]) -> int:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port(5680, 1)))
    try:
        ch = conn.channel()
        return sum(ch.queue_declare(name, passive=True).method.message_count for name in queues)
    finally:
        conn.close()


def read_back(queues: list[str], body: bytes) -> tuple[int, int, float]:
    """Consume every queue through n3 (the member drained and refilled) with acks: (messages
    whose body is the one published, others, seconds)."""
    good = bad = 0
    started = time.monotonic()
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port(5680, 3), heartbeat=0))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=200)
        for name in queues:
            expected = ch.queue_declare(name, passive=True).method.message_count
            for taken, (method, _props, got) in enumerate(ch.consume(name, inactivity_timeout=30), 1):
                if method is None:
                    break
                good, bad = (good + 1, bad) if got == body else (good, bad + 1)
                ch.basic_ack(method.delivery_tag)
                if taken == expected:
                    break
            ch.cancel()
    finally:
        conn.close()
    return good, bad, time.monotonic() - started


def timed(what: str, publisher_queue: str, *steps: tuple[str, ...]) -> dict:
    publisher = Publisher(publisher_queue)
    publisher.start()
    started = time.monotonic()
    outputs = []
    try:
        for step in steps:
            outputs.append(ctl(*step)[1])
    finally:
        took = time.monotonic() - started
        publisher.stop.set()
        publisher.join(30)
    moves = sum(line.count("] done in") for out in outputs for line in out.splitlines())
    print(
        f"{what}: {took:.1f} s, {moves} moves; meanwhile {publisher.confirmed} confirmed, "
        f"{publisher.failed} publisher reconnects",
        flush=True,
    )
    return {"seconds": round(took, 1), "moves": moves, "confirmed": publisher.confirmed, "reconnects": publisher.failed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queued-mib", type=int, default=1024)
    parser.add_argument("--body-kib", type=int, default=16)
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--keep", action="store_true", help="keep the cluster's folder")
    parser.add_argument("--results", help="append the JSON line to this file")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (the cluster is stopped on the way out)
    folder = Path(tempfile.mkdtemp(prefix="maxq-bench-moves-"))
    env = {**os.environ, "MAXQ_CLUSTER_DIR": str(folder), "MAXQ_CLUSTER_BASE": str(BASE)}
    result: dict = {"queued_mib": args.queued_mib, "body_kib": args.body_kib, "queues": args.queues}
    try:
        up = subprocess.run([str(CLUSTER), "up", "--hosts", "5", "--replication-factor", "3"], env=env, timeout=300)
        if up.returncode != 0:
            return 2
        queues = [f"backlog-{i}" for i in range(args.queues)]
        sent, took = fill(queues, args.queued_mib << 20, args.body_kib << 10)
        print(f"filled: {sent:,} messages of {args.body_kib} KiB ({args.queued_mib} MiB) in {took:.1f} s", flush=True)
        _t, placement = ctl("placement")
        print(placement, flush=True)
        result["drain"] = timed("drain of n3", "during-moves", ("drain", "n3"))
        result["rebalance"] = timed("revive and rebalance onto n3", "during-moves", ("revive", "n3"), ("rebalance",))
        _t, placement = ctl("placement")
        print(placement, flush=True)
        left = counts(queues)
        print(f"queued after both: {left:,} of {sent:,}", flush=True)
        du = subprocess.run(["du", "-sm", str(folder)], capture_output=True, text=True).stdout.split()[0]
        result["disk_mib"] = int(du)
        good, bad, took = read_back(queues, BODY[: args.body_kib << 10])
        print(f"read back through n3: {good:,} bodies as published, {bad} not, in {took:.1f} s", flush=True)
        result["kept"] = left == sent == good and bad == 0
        line = json.dumps(result)
        print(line)
        if args.results:
            with open(args.results, "a") as out:
                out.write(line + "\n")
        return 0 if result["kept"] else 1
    finally:
        subprocess.run([str(CLUSTER), "down"], env=env, timeout=120)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
