#!/usr/bin/env python3
"""The delayed-delivery benchmark of the queue-features issue: N delayed messages, memory and lateness.

Not a test: it prints numbers. Run with the project venv (it uses pika, a test dependency):

    .venv/bin/python scripts/bench_delayed.py                      # 1 M messages
    .venv/bin/python scripts/bench_delayed.py --messages 100000 --min-delay-s 20 --spread-s 30

It starts a `maxq-server` on a fresh data folder under /tmp, declares one queue, and publishes N
messages with an `x-delay` header, the delays spread evenly (in a scrambled order) over
[min-delay, min-delay + spread] seconds, so that all are published before the first falls due.
Each body carries the wall-clock time its message is due (publish time + delay). A consumer
(auto-ack, its own process) takes them as they fall due and records `lateness = receive time -
due time`. It samples the broker's RSS every 0.5 s throughout, and prints the publish rate, RSS
before, at the end of publishing (all N pending) and at the peak, and the lateness p50/p99/max.
The server is stopped and the folder removed at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika
from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench-delayed"
BODY = struct.Struct(">dI")  # due wall time (s), index


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0.0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            rss = rss_mib(self.pid)
            if rss is not None:
                self.peak = max(self.peak, rss)


def consume(port: int, n: int, body_bytes: int, out_path: str, ready) -> None:
    """In its own process: take N messages, write their lateness (ms, float32 array) to out_path."""
    import array

    lateness = array.array("f")
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=port))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=0)

    def on_message(ch, method, props, body):
        due, _ = BODY.unpack_from(body)
        lateness.append((time.time() - due) * 1000.0)
        if len(lateness) >= n + 1:  # and the undelayed marker
            ch.stop_consuming()

    channel.basic_consume(QUEUE, on_message, auto_ack=True)
    ready.set()
    channel.start_consuming()
    connection.close()
    with open(out_path, "wb") as f:
        lateness.tofile(f)


def percentile(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(len(values) * p))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--min-delay-s", type=float, default=150.0)
    parser.add_argument("--spread-s", type=float, default=180.0)
    parser.add_argument("--body-bytes", type=int, default=64)
    parser.add_argument("--durable", action="store_true", help="a durable queue and persistent messages")
    args = parser.parse_args()
    n = args.messages
    folder = Path(tempfile.mkdtemp(prefix="bench-delayed-"))
    amqp_port, http_port = free_port(), free_port()
    log = open(folder / "server.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "maxq_raft",
            "--data-dir",
            str(folder / "data"),
            "--amqp-port",
            str(amqp_port),
            "--http-port",
            str(http_port),
            "--prometheus-port",
            "0",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(folder),
    )
    consumer = None
    try:
        deadline = time.monotonic() + 60
        while b"maxq-server ready" not in (folder / "server.log").read_bytes():
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("maxq-server did not start:\n" + (folder / "server.log").read_text())
            time.sleep(0.1)
        sampler = Sampler(server.pid)
        sampler.start()
        rss_idle = rss_mib(server.pid)
        connection = pika.BlockingConnection(pika.ConnectionParameters(port=amqp_port))
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=args.durable)
        ready = multiprocessing.Event()
        out_path = str(folder / "lateness.f32")
        consumer = multiprocessing.Process(target=consume, args=(amqp_port, n, args.body_bytes, out_path, ready))
        consumer.start()
        ready.wait(30)
        pad = b"\0" * max(0, args.body_bytes - BODY.size)
        mode = 2 if args.durable else 1
        started = time.time()
        first_due = started + args.min_delay_s
        for i in range(n):
            # Delays spread evenly over the window, in a scrambled order (7919 is prime).
            offset_ms = int(args.min_delay_s * 1000 + ((i * 7919) % n) * args.spread_s * 1000 / n)
            now = time.time()
            delay_ms = max(1, int((started * 1000 + offset_ms) - now * 1000))
            body = BODY.pack(now + delay_ms / 1000, i) + pad
            channel.basic_publish(
                "", QUEUE, body, pika.BasicProperties(headers={"x-delay": delay_ms}, delivery_mode=mode)
            )
        channel.confirm_delivery()
        channel.basic_publish("", QUEUE, BODY.pack(time.time(), n) + pad)  # confirmed: all before it were taken
        published = time.time()
        # (that last one is not delayed: the consumer takes it first and it is not counted below)
        rss_pending = rss_mib(server.pid)
        connection.close()
        print(
            f"published {n:,} delayed messages in {published - started:.1f} s "
            f"({n / (published - started):,.0f} msg/s); the first falls due "
            f"{first_due - published:.1f} s after the last was published"
        )
        print(f"broker RSS: {rss_idle:.0f} MiB idle, {rss_pending:.0f} MiB with all {n:,} pending")
        consumer.join(args.min_delay_s + args.spread_s + 600)
        sampler.stopping.set()
        sampler.join()
        import array

        lateness = array.array("f")
        with open(out_path, "rb") as f:
            lateness.frombytes(f.read())
        values = sorted(lateness.tolist()[1:])  # the first is the undelayed marker
        print(
            f"delivered {len(values):,}; lateness (delivery - due): p50 {percentile(values, 0.50):.0f} ms, "
            f"p99 {percentile(values, 0.99):.0f} ms, max {values[-1]:.0f} ms, min {values[0]:.0f} ms"
        )
        print(f"broker RSS peak over the whole run: {sampler.peak:.0f} MiB")
        return 0
    finally:
        if consumer is not None and consumer.is_alive():
            consumer.terminate()
            consumer.join(10)
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    os.chdir(tempfile.gettempdir())  # the repo root on sys.path would shadow py-amqp with our amqp/
    raise SystemExit(main())
