#!/usr/bin/env python3
"""Benchmark the SQS endpoint (issue #18): send and receive+delete throughput, long-poll wake-up
latency, and the memory of a node holding thousands of long polls.

    .venv/bin/python scripts/bench_sqs.py --nodes 1                 # every measurement, one node
    .venv/bin/python scripts/bench_sqs.py --nodes 3 --skip-polls    # a 3-node cluster on loopback
    .venv/bin/python scripts/bench_sqs.py --endpoint http://127.0.0.1:5000 --key x:y --skip-polls
                                                                    # another SQS server (e.g. moto)

Theory of operation: the script starts its own node(s) (fresh data folders under a temporary
folder, free ports, `--sqs-port`; with --nodes 3 a cluster on loopback, clients on the first
member) and stops them in a `finally`. It makes guest an access key through the admin API and
creates one queue. Then:

  send      P client processes, each sending SendMessageBatch of 10 messages for `--seconds`;
            messages/s over all of them, and the clients' CPU seconds (a client at 100 % of a
            core is the bottleneck, not the server), and the nodes' CPU seconds.
  receive   P processes, each ReceiveMessage(10) then DeleteMessageBatch of what it got, until
            the queue is empty or `--seconds` pass; messages/s, client and node CPU.
  latency   one receiver long-polls (WaitTimeSeconds=20), a sender sends one message; the
            sample is the time from the send's 200 to the receive's answer (both in one process,
            on the monotonic clock). `--samples` of them, p50/p99.
  polls     `--polls` concurrent ReceiveMessage WaitTimeSeconds=20 on an empty queue, each on its
            own TCP connection, all with one pre-signed request (SigV4 signs the body and the
            date, valid 15 minutes), from one asyncio process; the node's RSS (VmRSS) before and
            sampled every 0.5 s with the number of polls held (sent, not answered) at that
            moment: the peak, the RSS then, and how many were answered before their wait
            (should be none). A node that takes longer than 20 s to read them all never holds
            all of them at once; held_peak says how many it did.

Each result is a JSON line appended to `--out` (default docs/bench-results/<UTC date>-sqs.jsonl).
The machine's load is whatever it is: say so beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote, urlsplit

import boto3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "bench-sqs"
REGION = "us-east-1"
READY_TIMEOUT_S = 60.0
BODY_BYTES = 128
BATCH = 10
SEND_MESSAGES_MAX = 2_000_000  # per process, a bound on the loop whatever --seconds says
RECEIVE_EMPTY_MAX = 3  # a receiver stops after this many empty long polls in a row
POLL_WAIT_S = 20
POLL_CONNECT_CONCURRENCY = 200
RSS_SAMPLE_S = 0.5


class Nodes:
    """`count` maxq-server processes on loopback with the SQS endpoint on; stop() kills them."""

    def __init__(self, count: int, root: Path, extra: list[str]) -> None:
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.ports = [
            {"amqp": free_port(), "http": free_port(), "raft": free_port(), "sqs": free_port()} for _ in range(count)
        ]
        server = str(Path(sys.executable).parent / "maxq-server")
        for i, ports in enumerate(self.ports, 1):
            cmd = [
                server,
                "--node-id",
                f"n{i}",
                "--data-dir",
                str(root / f"n{i}"),
                "--amqp-port",
                str(ports["amqp"]),
                "--http-port",
                str(ports["http"]),
                "--sqs-port",
                str(ports["sqs"]),
                *extra,
            ]
            if count > 1:
                cmd += ["--raft-addr", f"127.0.0.1:{ports['raft']}", "--cluster-secret", "bench-sqs-secret"]
                for j, other in enumerate(self.ports, 1):
                    if j != i:
                        cmd += ["--peer", f"n{j}@127.0.0.1:{other['raft']}"]
            log = open(root / f"n{i}.log", "wb")
            env = {**os.environ, "MAXQ_PROMETHEUS_PORT": "0"}
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(root)))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for i in range(1, count + 1):
            while b"maxq-server ready" not in (root / f"n{i}.log").read_bytes():
                if time.monotonic() > deadline or self.procs[i - 1].poll() is not None:
                    raise RuntimeError(f"n{i} did not start; see {root / f'n{i}.log'}")
                time.sleep(0.1)

    def cpu_s(self) -> float:
        """User + system CPU seconds of every node so far (/proc/PID/stat)."""
        total = 0
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def rss_mb(self, index: int = 0) -> float:
        for line in Path(f"/proc/{self.procs[index].pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def make_key(http_port: int) -> tuple[str, str]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{http_port}/api/users/guest/access-keys",
        method="POST",
        data=b"{}",
        headers={
            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
            "Content-Type": "application/json",
        },
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                made = json.loads(answer.read())
            return made["access_key_id"], made["secret_access_key"]
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def client(endpoint: str, key: tuple[str, str], timeout_s: float = 30.0):
    config = Config(retries={"total_max_attempts": 1}, read_timeout=timeout_s, max_pool_connections=4)
    return boto3.session.Session().client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=key[0],
        aws_secret_access_key=key[1],
        config=config,
    )


# -- throughput: client processes --------------------------------------------------------------


def _sender(endpoint, key, url, seconds, results) -> None:
    sqs = client(endpoint, key)
    body = "x" * BODY_BYTES
    entries = [{"Id": str(i), "MessageBody": body} for i in range(BATCH)]
    sent, errors = 0, 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds and sent < SEND_MESSAGES_MAX:
        try:
            answer = sqs.send_message_batch(QueueUrl=url, Entries=entries)
            sent += len(answer.get("Successful", []))
        except Exception:
            errors += 1
    cpu = os.times()
    results.put({"messages": sent, "errors": errors, "seconds": time.monotonic() - t0, "cpu_s": cpu.user + cpu.system})


def _receiver(endpoint, key, url, seconds, results) -> None:
    sqs = client(endpoint, key)
    got, errors, empty = 0, 0, 0
    t0 = time.monotonic()
    t_last = t0
    while time.monotonic() - t0 < seconds and empty < RECEIVE_EMPTY_MAX:
        try:
            messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=BATCH, WaitTimeSeconds=1).get(
                "Messages", []
            )
            if not messages:
                empty += 1
                continue
            empty = 0
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
            got += len(messages)
            t_last = time.monotonic()
        except Exception:
            errors += 1
    cpu = os.times()
    # The rate counts up to the last message taken: the empty polls at the end are not work.
    results.put({"messages": got, "errors": errors, "seconds": t_last - t0, "cpu_s": cpu.user + cpu.system})


def throughput(kind: str, endpoint, key, url, processes: int, seconds: float, nodes: Nodes | None) -> dict:
    target = _sender if kind == "send" else _receiver
    results: multiprocessing.Queue = multiprocessing.Queue()
    cpu0 = nodes.cpu_s() if nodes else None
    t0 = time.monotonic()
    procs = [
        multiprocessing.Process(target=target, args=(endpoint, key, url, seconds, results)) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    out = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    wall = time.monotonic() - t0
    messages = sum(r["messages"] for r in out)
    busy_s = max(r["seconds"] for r in out) or 1e-9
    return {
        "measure": kind,
        "processes": processes,
        "messages": messages,
        "errors": sum(r["errors"] for r in out),
        "seconds": round(busy_s, 2),
        "messages_per_s": round(messages / busy_s, 1),
        "client_cpu_s": round(sum(r["cpu_s"] for r in out), 2),
        "client_cpu_share_of_cores": round(sum(r["cpu_s"] for r in out) / wall / os.cpu_count(), 3),
        "node_cpu_s": round(nodes.cpu_s() - cpu0, 2) if nodes else None,
    }


# -- long-poll wake-up latency -----------------------------------------------------------------


def latency(endpoint, key, url, samples: int) -> dict:
    receiver, sender = client(endpoint, key), client(endpoint, key)
    lat_ms: list[float] = []
    from_invoke_ms: list[float] = []
    misses = 0
    for _ in range(samples):
        box: dict = {}

        def wait(box=box) -> None:
            answer = receiver.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=POLL_WAIT_S)
            box["t"] = time.monotonic()
            box["messages"] = answer.get("Messages", [])

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.05)  # the receive is parked on the node before the send
        invoked = time.monotonic()
        sender.send_message(QueueUrl=url, MessageBody="ping")
        sent = time.monotonic()
        thread.join(POLL_WAIT_S + 10)
        if not box.get("messages"):
            misses += 1
            continue
        # From the send's 200: negative when the receive's answer was read before the send's
        # (the node answers both once the Enqueue commits). From the send's invoke: never negative.
        lat_ms.append((box["t"] - sent) * 1000)
        from_invoke_ms.append((box["t"] - invoked) * 1000)
        m = box["messages"][0]
        receiver.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    lat_ms.sort()
    from_invoke_ms.sort()

    def pct(values: list[float], p: float) -> float | None:
        return round(values[min(len(values) - 1, int(p * len(values)))], 2) if values else None

    return {
        "measure": "long_poll_wakeup",
        "samples": len(lat_ms),
        "misses": misses,
        "p50_ms": pct(lat_ms, 0.50),
        "p99_ms": pct(lat_ms, 0.99),
        "max_ms": pct(lat_ms, 1.0),
        "mean_ms": round(statistics.fmean(lat_ms), 2) if lat_ms else None,
        "from_send_invoke_p50_ms": pct(from_invoke_ms, 0.50),
        "from_send_invoke_p99_ms": pct(from_invoke_ms, 0.99),
    }


# -- thousands of long polls held ---------------------------------------------------------------


def presigned_receive(endpoint: str, key: tuple[str, str], url: str) -> bytes:
    """One ReceiveMessage(WaitTimeSeconds=20) request, signed once, as raw HTTP/1.1 bytes."""
    body = json.dumps({"QueueUrl": url, "MaxNumberOfMessages": 1, "WaitTimeSeconds": POLL_WAIT_S}).encode()
    host = urlsplit(endpoint).netloc
    request = AWSRequest(
        method="POST",
        url=endpoint + "/",
        data=body,
        headers={
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": "AmazonSQS.ReceiveMessage",
            "Host": host,
        },
    )
    SigV4Auth(Credentials(*key), "sqs", REGION).add_auth(request)
    head = "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
    return f"POST / HTTP/1.1\r\n{head}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body


async def _hold_polls(host: str, port: int, raw: bytes, count: int, nodes: Nodes) -> dict:
    """Open `count` connections, each sending the poll, and sample the node's RSS and the number
    of polls held (sent, not yet answered) every RSS_SAMPLE_S until every poll is answered."""
    gate = asyncio.Semaphore(POLL_CONNECT_CONCURRENCY)
    held = 0
    answered = 0
    failed = 0
    early: list[str] = []  # answered sooner than the wait after the send: the node did not hold it
    waited_s: list[float] = []

    async def one() -> None:
        nonlocal held, answered, failed
        async with gate:
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
                writer.write(raw)
                await writer.drain()
            except Exception:
                failed += 1
                return
        sent = time.monotonic()
        held += 1
        try:
            first = await asyncio.wait_for(reader.read(200), POLL_WAIT_S + 30)
        except Exception:
            first = b""
        held -= 1
        answered += 1
        waited = time.monotonic() - sent
        waited_s.append(waited)
        if waited < POLL_WAIT_S - 1:
            early.append(first[:60].decode(errors="replace"))
        writer.close()

    samples: list[tuple[float, int, float]] = []
    done = asyncio.Event()

    async def sampler() -> None:
        t0 = time.monotonic()
        while not done.is_set():
            samples.append((round(time.monotonic() - t0, 1), held, nodes.rss_mb()))
            try:
                await asyncio.wait_for(done.wait(), RSS_SAMPLE_S)
            except TimeoutError:
                pass

    sampling = asyncio.create_task(sampler())
    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(count)))
    done.set()
    await sampling
    peak = max(samples, key=lambda s: (s[1], s[2]))
    waited_s.sort()
    return {
        "failed": failed,
        "answered": answered,
        "elapsed_s": round(time.monotonic() - t0, 1),
        "held_peak": peak[1],
        "rss_at_peak_mb": round(peak[2], 1),
        "rss_max_mb": round(max(s[2] for s in samples), 1),
        "answered_early": len(early),
        "early_examples": early[:3],
        "waited_p50_s": round(waited_s[len(waited_s) // 2], 2) if waited_s else None,
    }


def polls(endpoint, key, url, count: int, nodes: Nodes) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 1000), hard))
    raw = presigned_receive(endpoint, key, url)
    parts = urlsplit(endpoint)
    rss_before = nodes.rss_mb()
    cpu0 = nodes.cpu_s()
    held = asyncio.run(_hold_polls(parts.hostname or "127.0.0.1", parts.port or 80, raw, count, nodes))
    return {
        "measure": "long_polls_held",
        "polls": count,
        "rss_before_mb": round(rss_before, 1),
        **held,
        "rss_per_held_poll_kb": round((held["rss_at_peak_mb"] - rss_before) * 1024 / max(1, held["held_peak"]), 2),
        "rss_after_mb": round(nodes.rss_mb(), 1),
        "node_cpu_s": round(nodes.cpu_s() - cpu0, 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1, choices=(1, 3))
    p.add_argument("--processes", type=int, default=4, help="client processes for send and receive")
    p.add_argument("--seconds", type=float, default=10.0, help="length of the send phase (and the receive bound)")
    p.add_argument("--samples", type=int, default=300, help="long-poll wake-up samples")
    p.add_argument("--polls", type=int, default=5000, help="long polls held at once (one node)")
    p.add_argument("--skip-polls", action="store_true")
    p.add_argument("--only-polls", action="store_true", help="only the held long polls")
    p.add_argument("--server-arg", action="append", default=[], help="extra maxq-server argument")
    p.add_argument("--endpoint", help="benchmark another SQS server instead of starting nodes")
    p.add_argument("--key", help="ID:SECRET for --endpoint")
    p.add_argument("--label", default="", help="a name for this run in the results")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    out = args.out or ROOT / "docs" / "bench-results" / f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}-sqs.jsonl"
    target = f"other:{args.endpoint}" if args.endpoint else f"maxq{args.nodes}"
    common = {
        "target": target,
        "label": args.label,
        "time_utc": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H:%M:%SZ}",
        "cores": os.cpu_count(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "body_bytes": BODY_BYTES,
    }
    nodes: Nodes | None = None
    tmp = tempfile.TemporaryDirectory(prefix="bench-sqs-")
    try:
        if args.endpoint:
            endpoint = args.endpoint
            key_id, _, secret = (args.key or "x:y").partition(":")
            key = (key_id, secret)
        else:
            nodes = Nodes(args.nodes, Path(tmp.name), args.server_arg)
            endpoint = f"http://127.0.0.1:{nodes.ports[0]['sqs']}"
            key = make_key(nodes.ports[0]["http"])
        url = client(endpoint, key).create_queue(QueueName=QUEUE)["QueueUrl"]
        # Our own URL for the queue: the server's may name a host the client cannot reach (moto).
        if not args.endpoint:
            url = f"{endpoint}/{quote('/', safe='')}/{QUEUE}"
        results = []
        if not args.only_polls:
            results += [
                throughput("send", endpoint, key, url, args.processes, args.seconds, nodes),
                throughput("receive_delete", endpoint, key, url, args.processes, args.seconds * 3, nodes),
                latency(endpoint, key, url, args.samples),
            ]
        if not args.skip_polls and nodes is not None:
            results.append(polls(endpoint, key, url, args.polls, nodes))
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a", encoding="utf-8") as f:
            for r in results:
                line = json.dumps({**common, **r}, sort_keys=True)
                f.write(line + "\n")
                print(line, flush=True)
    finally:
        if nodes is not None:
            nodes.stop()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
