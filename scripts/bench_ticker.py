#!/usr/bin/env python3
"""What many idle queues cost a node: its CPU with nothing to do, and the latency of a few
quiet queues beside them (the ticker that makes time pass for queues, server/queue_timers.py).

    .venv/bin/python scripts/bench_ticker.py [--queues 1000,10000] [--ttl-share 0.1] [--seconds 10]

For each count a fresh single node (its own data folder and port) gets that many queues; a
`--ttl-share` of them hold one message with a 10-minute TTL (a queue with a deadline, which the
ticker must watch), the rest are empty. Then, with no traffic, the node's CPU over `--seconds`
(from /proc), and the delivery latency of 100 of the queues each sent one message a second
(bench_fair_dispatch.py's quiet run). Printed, and appended as JSON lines to `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # noqa: E402 - run from a checkout

from bench_fair_dispatch import client, quiet_run, summary  # noqa: E402 (scripts/ is on sys.path)
from bench_node import Node  # noqa: E402

from maxq_raft.amqp import spec  # noqa: E402
from maxq_raft.amqp.frames import encode_content  # noqa: E402
from maxq_raft.perf.procstat import cpu_s  # noqa: E402

TTL_MS = 600_000


def run(count: int, ttl_share: float, seconds: float) -> dict:
    node = Node("maxq-ticker-")
    try:
        setup = client(node.port)
        timed = int(count * ttl_share)
        for i in range(count):
            arguments = {"x-message-ttl": TTL_MS} if i < timed else None
            setup.queue_declare(f"idle-{i}", durable=False, arguments=arguments)
        out = setup.detach()
        for i in range(timed):
            publish = spec.BasicPublish(exchange="", routing_key=f"idle-{i}")
            out.sendall(encode_content(1, publish, b"\x00\x00", b"held", 131072))
        time.sleep(2.0)  # the declares and publishes applied
        before = cpu_s([node.proc.pid])
        time.sleep(seconds)
        idle_cpu = (cpu_s([node.proc.pid]) - before) / seconds
        latency = summary(quiet_run(node.port, [f"idle-{i}" for i in range(count - 100, count)], seconds))
        out.close()
        return {"queues": count, "timed_queues": timed, "idle_cpu_cores": round(idle_cpu, 3), "quiet": latency}
    finally:
        node.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queues", default="1000,10000", help="comma-separated queue counts (each >= 100)")
    p.add_argument("--ttl-share", type=float, default=0.1, help="share of the queues holding a message with a TTL")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--label", default="", help="what this run measures (kept in the results file)")
    p.add_argument("--out", default=str(ROOT / "docs/bench-results" / f"{datetime.date.today()}-ticker.jsonl"))
    args = p.parse_args()
    try:
        counts = [int(c) for c in args.queues.split(",")]
    except ValueError:
        p.error("--queues: comma-separated integers")
    if any(not 100 <= c <= 100_000 for c in counts) or not 0 <= args.ttl_share <= 1 or not 2 <= args.seconds <= 600:
        p.error("--queues 100..100000 each, --ttl-share 0..1, --seconds 2..600")
    sys.setswitchinterval(0.0005)  # (as bench_fair_dispatch.py: the receive thread is not held back)
    for count in counts:
        record = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "label": args.label,
            **run(count, args.ttl_share, args.seconds),
            "load_avg_1m": os.getloadavg()[0],
        }
        print(json.dumps(record), flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
