#!/usr/bin/env python3
"""Fair dispatch (issue #20, item 4): do quiet queues wait behind a hot one on the same node?

    .venv/bin/python scripts/bench_fair_dispatch.py [--quiet-queues 1000] [--seconds 20] [--sample-hot] [--out F]

A fresh single node (its own data folder and port) gets `--quiet-queues` queues, each sent one
16-byte message a second (spread evenly over the second) by one connection and consumed (no-ack)
by one other connection that consumes all of them: the latency of each quiet message, from just
before its publish is written to its delivery read, both in this process. That runs twice: alone,
and next to a hot queue driven by the C load generator (amqpload s1: one producer at full speed,
one consumer, 16 B) on the same node. Printed and appended to `--out` as JSON: p50 / p99 / max of
the quiet latency both ways, and the hot queue's rate. `--sample-hot` also reads the hot queue's
backlog every 50 ms and splits the quiet latencies by it (at a consumer's flow credit, 2,000
ready messages).

The quiet side is light (1,000 messages/s at the default), so this Python process measures with
little delay of its own; its receive thread reads with the GIL switch interval lowered.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import json
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # noqa: E402 - run from a checkout

from bench_node import Node  # noqa: E402 (scripts/ is on sys.path when a script runs)

from maxq_raft.amqp import spec  # noqa: E402
from maxq_raft.amqp.frames import FrameReader, encode_content  # noqa: E402
from maxq_raft.perf.client import AmqpClient, BrokerClosed  # noqa: E402
from maxq_raft.server.channel import FLOW_CREDIT  # noqa: E402

HOT_READY_SPLIT = FLOW_CREDIT  # a consumer's flow credit: a refill's most deliveries
STAMP = struct.Struct(">Q")  # the first 8 body bytes: monotonic ns just before the publish was written


def client(port: int) -> AmqpClient:
    return AmqpClient("127.0.0.1", port, user="guest", password="guest", vhost="/").connect()


def quiet_run(port: int, queues: list[str], seconds: float, samples: list | None = None) -> list[float]:
    """Publish one message a second to each queue for `seconds`; the latencies in ms. With
    `samples`, each message's (publish time ns, latency ms) is appended to it too."""
    consumer = client(port)
    for name in queues:
        consumer.basic_consume(name, no_ack=True)
    sock = consumer.detach()
    latencies: list[float] = []
    stop = threading.Event()

    def receive() -> None:
        reader = FrameReader(0)
        sock.settimeout(0.2)
        expect_body = False
        while not stop.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            if not data:
                return
            now = time.monotonic_ns()
            reader.feed(data)
            for frame_type, _channel, payload in reader.read_frames():
                if frame_type == spec.FRAME_METHOD and bytes(payload[:4]) == b"\x00\x3c\x00\x3c":  # basic.deliver
                    expect_body = True
                elif frame_type == spec.FRAME_BODY and expect_body:
                    expect_body = False
                    sent_ns = STAMP.unpack_from(payload, 0)[0]
                    latencies.append((now - sent_ns) / 1e6)
                    if samples is not None:
                        samples.append((sent_ns, latencies[-1]))

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    producer = client(port)
    out = producer.detach()
    gap_s = 1.0 / len(queues)
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        name = queues[sent % len(queues)]
        due = start + sent * gap_s
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        body = STAMP.pack(time.monotonic_ns()) + b"q" * 8
        out.sendall(encode_content(1, spec.BasicPublish(exchange="", routing_key=name), b"\x00\x00", body, 131072))
        sent += 1
    time.sleep(1.0)  # the last ones arrive
    stop.set()
    receiver.join(5)
    out.close()
    sock.close()
    if len(latencies) < sent * 0.99:
        print(f"warning: {len(latencies)} of {sent} quiet messages arrived", file=sys.stderr)
    return latencies


class BacklogSampler:
    """The hot queue's ready count every SAMPLE_EVERY_S (a passive queue.declare on its own
    connection), to see whether the quiet queues' tail follows the hot queue's backlog."""

    SAMPLE_EVERY_S = 0.05

    def __init__(self, port: int, queue: str) -> None:
        self.port, self.queue = port, queue
        self.samples: list[tuple[int, int]] = []  # (monotonic ns, ready messages)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        sampler = client(self.port)
        sampler.ensure_channel()
        try:
            while not self.stop.wait(self.SAMPLE_EVERY_S):
                try:
                    ok = sampler.rpc(spec.QueueDeclare(queue=self.queue, passive=True), (spec.QueueDeclareOk,))
                except BrokerClosed:  # (the load generator deleted its queue as it finished)
                    return
                self.samples.append((time.monotonic_ns(), ok.message_count))
        finally:
            sampler.close()

    def split(self, sent: list[tuple[int, float]], ready_min: int) -> dict:
        """The quiet latencies split by the hot backlog last sampled before each was published."""
        times = [t for t, _ in self.samples]
        over, under = [], []
        for sent_ns, latency_ms in sent:
            at = bisect.bisect_right(times, sent_ns) - 1
            if at >= 0:
                (over if self.samples[at][1] >= ready_min else under).append(latency_ms)
        counts = sorted(count for _, count in self.samples)
        return {
            "hot_ready_p50": counts[len(counts) // 2] if counts else None,
            "hot_ready_max": counts[-1] if counts else None,
            f"quiet_when_hot_ready_ge_{ready_min}": summary(over),
            f"quiet_when_hot_ready_lt_{ready_min}": summary(under),
        }


def amqpload() -> str:
    for path in (os.environ.get("AMQPLOAD", ""), str(ROOT / "scripts/loadgen/bin/amqpload")):
        if path and Path(path).exists():
            return path
    subprocess.run(["sh", str(ROOT / "scripts/loadgen/build.sh")], check=True)
    return str(ROOT / "scripts/loadgen/bin/amqpload")


def summary(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    if not ordered:
        return {"n": 0}

    def pick(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"n": len(ordered), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": round(ordered[-1], 2)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quiet-queues", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument(
        "--sample-hot",
        action="store_true",
        help="sample the hot queue's backlog and split the quiet latencies by it (adds a connection)",
    )
    p.add_argument("--label", default="", help="what this run measures (kept in the results file)")
    p.add_argument("--out", default=str(ROOT / "docs/bench-results" / f"{datetime.date.today()}-fair-dispatch.jsonl"))
    args = p.parse_args()
    if not 1 <= args.quiet_queues <= 10_000 or not 2 <= args.seconds <= 600:
        p.error("--quiet-queues 1..10000, --seconds 2..600")
    sys.setswitchinterval(0.0005)  # the receive thread is not held back by the publishing one
    node = Node("maxq-fair-")
    try:
        setup = client(node.port)
        queues = [f"quiet-{i}" for i in range(args.quiet_queues)]
        for name in queues:
            setup.queue_declare(name, durable=False)
        setup.close()
        alone = summary(quiet_run(node.port, queues, args.seconds))
        print(f"quiet queues alone:         {alone}", flush=True)
        hot = subprocess.Popen(
            [amqpload(), "--port", str(node.port), "--scenario", "s1", "-P", "1", "-C", "1", "-Q", "1", "-s", "16"]
            + ["-d", str(args.seconds + 4), "--warmup", "1", "--queue-prefix", "hot-q"],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2.0)  # the hot queue at full speed first
        sampler = BacklogSampler(node.port, "hot-q-0") if args.sample_hot else None
        sent: list[tuple[int, float]] = []
        if sampler is not None:
            sampler.thread.start()
        beside = summary(quiet_run(node.port, queues, args.seconds, sent))
        split = None
        if sampler is not None:
            sampler.stop.set()
            sampler.thread.join(5)
            split = sampler.split(sent, HOT_READY_SPLIT)
            print(f"by the hot queue's backlog:  {split}", flush=True)
        hot_out, _ = hot.communicate(timeout=args.seconds + 120)
        hot_result = json.loads(hot_out.strip().splitlines()[-1]) if hot_out.strip() else {}
        print(f"quiet queues beside hot:    {beside}", flush=True)
        print(f"hot queue: {hot_result.get('cons_rate')} msgs/s consumed", flush=True)
        record = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "label": args.label,
            "quiet_queues": args.quiet_queues,
            "seconds": args.seconds,
            "alone": alone,
            "beside_hot": beside,
            "hot_cons_rate": hot_result.get("cons_rate"),
            **({"by_hot_backlog": split} if split is not None else {}),
            "load_avg_1m": os.getloadavg()[0],
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"results: {args.out}")
    finally:
        node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
