#!/usr/bin/env python3
"""The backlog benchmark of the storage issue: a deep durable queue, its RSS, its restart.

Not a test: it prints numbers. Run with the project venv (it uses pika, a test dependency):

    .venv/bin/python scripts/bench_backlog.py                     # 1 M x 1 KiB
    .venv/bin/python scripts/bench_backlog.py --messages 10000000 # the full run
    .venv/bin/python scripts/bench_backlog.py --rabbit            # also RabbitMQ, via scripts/bench

Pass 1 starts a `maxq-server` on a fresh data folder under /tmp and runs amqpload's scenario s4
(`--backlog N -s 1024 --sample-every N/10 --confirm 1000 --persistent --durable --manual-ack
--settle 5`): publish N persistent messages with confirms and no consumer, then drain them. It
prints the publish rate and the broker's RSS at every sample, the drain, and the peak RSS seen
by its own sampler (every 0.5 s, so peaks between amqpload's samples count too).

Pass 2 publishes the same backlog on a fresh folder (s4 with a settle longer than the run), and
when the queue holds all N it SIGKILLs the broker, starts it again and measures the time from
the new process's start to the first basic.get that returns a message; then the same after a
clean stop (SIGTERM). Every server it starts is stopped at the end; the folders are removed
unless --keep.

`--nodes 3` does the same against a 3-member cluster (every member on loopback, the load
generator and the probes on the first member; pass 2 SIGKILLs and restarts every member).

Targets (storage issue): RSS under 300 MiB throughout; the publish rate at N within 10 % of the
rate at 0; restart to the first message under 5 s. Issue #22's 100 M run (RSS at 100 M within
1.2x of RSS at 1 M, the first sample):

    .venv/bin/python scripts/bench_backlog.py --messages 100000000 --size 128 --sample-every 1000000
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
import urllib.request
from pathlib import Path

import pika
from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parent.parent
LOADGEN = ROOT / "scripts" / "loadgen"
READY_TIMEOUT_S = 1800.0  # (a cluster member replays its whole log when no snapshot could be taken)
STOP_TIMEOUT_S = 60.0
FIRST_MESSAGE_TIMEOUT_S = 1800.0
RSS_SAMPLE_S = 0.5
STORE_SAMPLE_S = 2.0
RSS_TARGET_MIB = 300
RATE_DROP_MAX = 0.10
CLUSTER_SECRET = "bench-backlog-secret"
RSS_GROWTH_MAX = 1.2  # issue #22: RSS at 100 M within 1.2x of RSS at 1 M
RESTART_TARGET_S = 5.0
QUEUE = "bench-q-0"  # amqpload's first queue (--queue-prefix bench-q)


def amqpload_path() -> str:
    built = Path(os.environ.get("BENCH_BIN") or LOADGEN / "bin")
    if not (built / "amqpload").exists():
        print(f"amqpload not found: building it into {built}", flush=True)
        subprocess.run(["bash", str(LOADGEN / "build.sh")], check=True, env={**os.environ, "BENCH_BIN": str(built)})
    return str(built / "amqpload")


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")


def rss_all(server: Server | Members) -> str:
    return ", ".join(f"{rss_mib(pid):.1f}" for pid in server.pids)


def disk_mib(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total / 2**20


class Server:
    """One maxq-server process on a data folder; `start` returns once it logged ready.
    `cluster`: the member's own arguments (--node-id, --raft-addr, --peer ...), for `Members`."""

    def __init__(self, data_dir: Path, extra: list[str], cluster: list[str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra = [*extra, *(cluster or [])]
        self.port = free_port()
        self.metrics_port = free_port()  # (Prometheus: the store's memtables and block cache)
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / "server.log"
        self.started_at = 0.0
        self._offset = 0

    @property
    def pids(self) -> list[int]:
        return [self.pid]

    def start(self) -> float:
        """Start; the seconds from the process's start to its ready line."""
        self.launch()
        return self.wait_ready()

    def launch(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self._offset = self.log_path.stat().st_size
        command = [
            sys.executable,
            "-m",
            "maxq_raft",
            "--data-dir",
            str(self.data_dir),
            "--amqp-port",
            str(self.port),
            "--http-port",
            "0",
            "--prometheus-port",
            str(self.metrics_port),
            *self.extra,
        ]
        self.started_at = time.monotonic()
        # cwd outside the repo: our amqp/ folder must not shadow anything on sys.path.
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(self.data_dir.parent))

    def wait_ready(self) -> float:
        assert self.proc is not None
        deadline = self.started_at + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"maxq-server exited with {self.proc.returncode}; log: {self.log_path}")
            with open(self.log_path, "rb") as f:
                f.seek(self._offset)
                if b"maxq-server ready" in f.read():
                    return time.monotonic() - self.started_at
            time.sleep(0.005)
        self.kill()
        raise RuntimeError(f"maxq-server not ready after {READY_TIMEOUT_S}s; log: {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> tuple[int | None, float]:
        """SIGTERM; (exit code, seconds it took)."""
        if self.proc is None or self.proc.poll() is not None:
            return (None if self.proc is None else self.proc.returncode), 0.0
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()
        return self.proc.returncode, time.monotonic() - t0


class Members:
    """A cluster of `count` members on loopback with `Server`'s verbs; the load generator and
    the probes talk to the first member (which forwards to each group's leader)."""

    def __init__(self, folder: Path, extra: list[str], count: int) -> None:
        names = [f"n{i + 1}" for i in range(count)]
        raft_ports = [free_port() for _ in names]
        self.data_dir = folder
        self.members: list[Server] = []
        for i, name in enumerate(names):
            peers = [
                arg
                for j, other in enumerate(names)
                if j != i
                for arg in ("--peer", f"{other}@127.0.0.1:{raft_ports[j]}")
            ]
            own = ["--node-id", name, "--raft-addr", f"127.0.0.1:{raft_ports[i]}", "--cluster-secret", CLUSTER_SECRET]
            self.members.append(Server(folder / name / "data", extra, [*own, *peers]))

    @property
    def port(self) -> int:
        return self.members[0].port

    @property
    def pid(self) -> int:
        return self.members[0].pid

    @property
    def metrics_port(self) -> int:
        return self.members[0].metrics_port

    @property
    def pids(self) -> list[int]:
        return [member.pid for member in self.members]

    @property
    def started_at(self) -> float:
        return self.members[0].started_at

    def start(self) -> float:
        """Start every member at once (each waits for a majority); the seconds until the last is ready."""
        for member in self.members:
            member.launch()
        return max(member.wait_ready() for member in self.members)

    def kill(self) -> None:
        for member in self.members:
            member.kill()

    def stop(self) -> tuple[int | None, float]:
        stopped = [member.stop() for member in self.members]
        return stopped[0][0], max(took for _code, took in stopped)


def make_server(args, folder: Path) -> Server | Members:
    if args.nodes == 1:
        return Server(folder / "data", args.server_arg)
    return Members(folder, args.server_arg, args.nodes)


def store_mib(metrics_port: int) -> tuple[float, float]:
    """(memtables, block cache) of a node's message store in MiB, from its Prometheus endpoint
    (NaN when it does not answer): the part of RSS that RocksDB's settings bound."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return float("nan"), float("nan")
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("maxq_store_memtable_bytes", "maxq_store_block_cache_bytes"):
            found[name] = float(value) / 2**20
    return found.get("maxq_store_memtable_bytes", float("nan")), found.get("maxq_store_block_cache_bytes", float("nan"))


class RssSampler(threading.Thread):
    """Peak RSS of processes (each member of a cluster), sampled every RSS_SAMPLE_S until stopped;
    with `metrics_port`, the first one's store figures every STORE_SAMPLE_S too (`store_series`)."""

    def __init__(self, pids: list[int], metrics_port: int | None = None) -> None:
        super().__init__(daemon=True)
        self.pids = pids
        self.metrics_port = metrics_port
        self.peak_mib = 0.0
        self.peak_at_s = 0.0
        self.peaks_mib = [0.0 for _ in pids]
        self.store_series: list[tuple[float, float, float, float]] = []  # (t s, RSS, memtables, block cache)
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def run(self) -> None:
        next_store_at = 0.0
        while not self._stop_event.wait(RSS_SAMPLE_S):
            now = time.monotonic() - self._t0
            for i, pid in enumerate(self.pids):
                rss = rss_mib(pid)
                self.peaks_mib[i] = max(self.peaks_mib[i], rss)
                if rss > self.peak_mib:
                    self.peak_mib, self.peak_at_s = rss, now
            if self.metrics_port is not None and now >= next_store_at:
                next_store_at = now + STORE_SAMPLE_S
                memtables, block_cache = store_mib(self.metrics_port)
                self.store_series.append((now, rss_mib(self.pids[0]), memtables, block_cache))

    def finish(self) -> float:
        self._stop_event.set()
        self.join(5)
        return self.peak_mib


def s4_args(
    amqpload: str, port: int, pid: int, n: int, size: int, settle_s: int, max_time_s: int, sample_every: int = 0
) -> list[str]:
    return [
        amqpload,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--scenario",
        "s4",
        "--backlog",
        str(n),
        "-s",
        str(size),
        "--sample-every",
        str(sample_every or max(1, n // 10)),
        "--confirm",
        "1000",
        "--persistent",
        "--durable",
        "--manual-ack",
        "--settle",
        str(settle_s),
        "--max-time",
        str(max_time_s),
        "--broker-pid",
        str(pid),
    ]


def print_store(series: list[tuple[float, float, float, float]], rows: int = 12) -> None:
    """What of the (first) node's RSS RocksDB's own bounded buffers hold, over the pass: RSS
    minus memtables and block cache is what the broker itself holds."""
    if not series:
        return
    print("  the store's share of RSS (Prometheus, every ~10th sample):")
    print(f"    {'t s':>8} {'RSS MiB':>8} {'memtables':>10} {'block cache':>12} {'the rest':>9}")
    step = max(1, len(series) // rows)
    for t, rss, memtables, block_cache in [*series[::step], *series[-1:]]:
        print(
            f"    {t:>8.0f} {rss:>8.1f} {memtables:>10.1f} {block_cache:>12.1f} {rss - memtables - block_cache:>9.1f}"
        )


def print_samples(title: str, samples: list[dict]) -> None:
    print(f"  {title}:")
    print(f"    {'messages':>10} {'t s':>8} {'rate msg/s':>11} {'RSS MiB':>8}")
    for s in samples:
        print(f"    {s['n']:>10} {s['t']:>8.2f} {s['rate']:>11.0f} {s['rss_mb']:>8.1f}")


def pass_publish_drain(args, amqpload: str, folder: Path) -> dict:
    print(f"== pass 1: s4 publish {args.messages:,} x {args.size} B persistent, confirmed, then drain", flush=True)
    server = make_server(args, folder / "pass1")
    ready_s = server.start()
    sampler = RssSampler(server.pids, server.metrics_port)
    sampler.start()
    command = s4_args(amqpload, server.port, server.pid, args.messages, args.size, 5, args.max_time, args.sample_every)
    print("  " + " ".join(command), flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=3 * args.max_time + 60)
    finally:
        peak = sampler.finish()
        disk = disk_mib(server.data_dir)
        code, stop_s = server.stop()
    if result.returncode != 0 or not result.stdout.strip():
        print(f"  amqpload failed ({result.returncode}): {result.stderr.strip()}")
        return {"failed": True, "peak_rss_mib": peak}
    run = json.loads(result.stdout.strip().splitlines()[-1])
    if result.stderr.strip():
        print("  amqpload: " + result.stderr.strip())
    print(f"  server ready in {ready_s:.2f} s; stopped (SIGTERM) in {stop_s:.2f} s, exit {code}")
    print_samples("publish (confirmed)", run["pub_samples"])
    print_samples("drain", run["drain_samples"])
    print_store(sampler.store_series)
    # The rate at 0 and at N: over the first and the last fifth of the samples (one sample is
    # noisy on a small machine: the load generator and the broker share its CPUs).
    pub = run["pub_samples"]
    k = max(1, len(pub) // 5)
    first_rate, last_rate = float("nan"), float("nan")
    if len(pub) > k:
        first_rate = pub[k - 1]["n"] / pub[k - 1]["t"]
        last_rate = (pub[-1]["n"] - pub[-1 - k]["n"]) / (pub[-1]["t"] - pub[-1 - k]["t"])
    print(
        f"  published {run['published']:,} confirmed {run['confirmed']:,} nacked {run['nacked']} "
        f"in {run['publish_s']:.1f} s: {run['pub_rate']:,.0f} msg/s"
    )
    print(f"  drained {run['drained']:,} in {run['drain_s']:.1f} s: {run['drain_rate']:,.0f} msg/s")
    print(
        f"  RSS MiB: idle {run.get('rss_mb_idle', 0):.1f}, full {run.get('rss_mb_full', 0):.1f}, "
        f"settled {run.get('rss_mb_settled', 0):.1f}, drained {run.get('rss_mb_drained', 0):.1f}, "
        f"peak (sampled every {RSS_SAMPLE_S} s) {peak:.1f} at {sampler.peak_at_s:.0f} s"
    )
    if len(server.pids) > 1:
        print(
            "  (RSS above: the first member's) peak RSS MiB of each member: "
            + ", ".join(f"{p:.1f}" for p in sampler.peaks_mib)
        )
    print(
        f"  broker CPU s per M messages: publish {run.get('broker_cpu_s_per_M_pub', 0):.1f}, "
        f"drain {run.get('broker_cpu_s_per_M_drain', 0):.1f}; data folder after the drain {disk:.0f} MiB"
    )
    print(f"  confirm latency us: {run.get('confirm_lat_us')}")
    return {
        "first_rate": first_rate,
        "last_rate": last_rate,
        "peak_rss_mib": peak,
        "rss_first_sample_mib": pub[0]["rss_mb"] if pub else float("nan"),
        "rss_last_sample_mib": pub[-1]["rss_mb"] if pub else float("nan"),
        "run": run,
    }


def queue_depth(port: int) -> int | None:
    """The queue's message_count, or None if it cannot be had now (not declared yet, ...)."""
    try:
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(port=port, heartbeat=0, socket_timeout=5, blocked_connection_timeout=5)
        )
    except pika.exceptions.AMQPError:
        return None
    try:
        return connection.channel().queue_declare(QUEUE, passive=True).method.message_count
    except pika.exceptions.AMQPError:
        return None
    finally:
        try:
            if connection.is_open:
                connection.close()
        except pika.exceptions.AMQPError:
            pass


def first_message(server: Server) -> tuple[float, int, bytes]:
    """Seconds from the process's start to the first basic.get returning a message; the queue's
    message_count (in queue.declare-ok) and the message body's first bytes."""
    deadline = time.monotonic() + FIRST_MESSAGE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            connection = pika.BlockingConnection(pika.ConnectionParameters(port=server.port, heartbeat=0))
        except pika.exceptions.AMQPConnectionError:
            time.sleep(0.005)
            continue
        try:
            channel = connection.channel()
            count = channel.queue_declare(QUEUE, passive=True).method.message_count
            method, _props, body = channel.basic_get(QUEUE, auto_ack=False)
            took = time.monotonic() - server.started_at
            if method is None:
                raise RuntimeError(f"the queue is empty after the restart (declare-ok said {count})")
            return took, count, body[:16]
        finally:
            try:
                if connection.is_open:
                    connection.close()
            except pika.exceptions.AMQPError:
                pass
    raise RuntimeError(f"no message {FIRST_MESSAGE_TIMEOUT_S}s after the restart")


def pass_restart(args, amqpload: str, folder: Path) -> dict:
    print(f"== pass 2: publish the {args.messages:,} backlog again, then restart with it", flush=True)
    server = make_server(args, folder / "pass2")
    server.start()
    sampler = RssSampler(server.pids)
    sampler.start()
    # A settle longer than the run: amqpload publishes, then waits; the broker dies meanwhile.
    command = s4_args(amqpload, server.port, server.pid, args.messages, args.size, 10 * args.max_time, args.max_time)
    load = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict = {}
    try:
        t0 = time.monotonic()
        depth = None
        while time.monotonic() - t0 < args.max_time:
            time.sleep(1.0)
            depth = queue_depth(server.port)
            if depth is not None and depth >= args.messages:
                break
            if load.poll() is not None:
                raise RuntimeError(f"amqpload ended ({load.returncode}) with the queue at {depth}")
        print(
            f"  queue holds {depth:,} after {time.monotonic() - t0:.1f} s; RSS {rss_all(server)} MiB; "
            f"data folder {disk_mib(server.data_dir):.0f} MiB"
        )
        out["peak_rss_publish_mib"] = sampler.finish()

        server.kill()
        ready_s = server.start()
        sampler = RssSampler(server.pids)
        sampler.start()
        took, count, body = first_message(server)
        time.sleep(1.0)
        print(
            f"  after SIGKILL: ready in {ready_s:.2f} s, first message in {took:.2f} s from the process start; "
            f"declare-ok message_count {count:,}; RSS {rss_all(server)} MiB 1 s later"
        )
        out["kill_first_s"], out["kill_ready_s"], out["kill_count"] = took, ready_s, count

        code, stop_s = server.stop()
        out["peak_rss_restart_mib"] = sampler.finish()
        ready_s = server.start()
        sampler = RssSampler(server.pids)
        sampler.start()
        took, count, body = first_message(server)
        time.sleep(1.0)
        print(
            f"  after SIGTERM (stopped in {stop_s:.2f} s, exit {code}): ready in {ready_s:.2f} s, first message in "
            f"{took:.2f} s; declare-ok message_count {count:,}; RSS {rss_all(server)} MiB 1 s later"
        )
        out["term_first_s"], out["term_count"] = took, count
        out["peak_rss_restart_mib"] = max(out["peak_rss_restart_mib"], sampler.finish())
    finally:
        if load.poll() is None:
            load.kill()
            load.wait(10)
        server.stop()
    return out


def run_rabbit(args) -> None:
    scenario = {1_000_000: "s4-backlog-1m", 5_000_000: "s4-backlog-5m"}.get(args.messages)
    if scenario is None:
        print(f"== RabbitMQ: scripts/bench has presets for 1 M and 5 M only, not {args.messages:,}")
        return
    command = [
        str(ROOT / "scripts" / "bench"),
        "--scenario",
        scenario,
        "--targets",
        "rabbit,rabbit-qq1",
        "-n",
        "1",
        "--loadgen",
        "amqpload",
        "--amqpload",
        amqpload_path(),
    ]
    print("== RabbitMQ: " + " ".join(command), flush=True)
    subprocess.run(command, timeout=4 * 3600)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="backlog depth N (default 1,000,000)")
    parser.add_argument("--nodes", type=int, default=1, choices=(1, 3, 5), help="a single node, or a cluster of 3 or 5")
    parser.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    parser.add_argument(
        "--sample-every", type=int, default=0, help="messages between publish/drain samples (default N/10)"
    )
    parser.add_argument("--max-time", type=int, help="amqpload --max-time per phase (default: from N)")
    parser.add_argument("--rabbit", action="store_true", help="also RabbitMQ classic and quorum (scripts/bench)")
    parser.add_argument("--rabbit-only", action="store_true", help="only RabbitMQ")
    parser.add_argument("--skip-restart", action="store_true", help="pass 1 only")
    parser.add_argument("--restart-only", action="store_true", help="pass 2 only")
    parser.add_argument("--server-arg", action="append", default=[], help="extra maxq-server argument (repeatable)")
    parser.add_argument("--dir", help="parent folder for the data folders (default: a new one under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the data folders")
    args = parser.parse_args()
    args.max_time = args.max_time or max(600, args.messages // 2000)
    if args.rabbit_only:
        run_rabbit(args)
        return 0
    amqpload = amqpload_path()
    folder = Path(tempfile.mkdtemp(prefix="maxq-bench-backlog-", dir=args.dir or "/tmp"))
    print(
        f"maxq-server {' '.join(args.server_arg)} (python {sys.version.split()[0]}), data under {folder}, "
        f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        flush=True,
    )
    ok = False
    try:
        first = {} if args.restart_only else pass_publish_drain(args, amqpload, folder)
        if not args.keep:
            shutil.rmtree(folder / "pass1", ignore_errors=True)  # (its disk, before pass 2 fills as much again)
        restart = {} if args.skip_restart or first.get("failed") else pass_restart(args, amqpload, folder)
        ok = True
    finally:
        if not args.keep and ok:
            shutil.rmtree(folder, ignore_errors=True)
        elif not ok:
            print(f"kept {folder} (server logs: {folder}/pass*/server.log)", flush=True)
    print("== targets")
    peak = max([first.get("peak_rss_mib", 0.0)] + [v for k, v in restart.items() if k.startswith("peak_rss")])
    # (pass 2's peaks are sampled too: publishing, and each restart until 1 s after its first message)
    print(
        f"  RSS under {RSS_TARGET_MIB} MiB throughout: peak {peak:.1f} MiB -> {'PASS' if peak < RSS_TARGET_MIB else 'FAIL'}"
    )
    if "first_rate" in first:
        drop = 1 - first["last_rate"] / first["first_rate"] if first["first_rate"] else float("nan")
        print(
            f"  publish rate at N within {RATE_DROP_MAX:.0%} of the rate at 0: first fifth {first['first_rate']:,.0f}, "
            f"last fifth {first['last_rate']:,.0f} msg/s ({-drop:+.1%}) -> {'PASS' if drop <= RATE_DROP_MAX else 'FAIL'}"
        )
    if "rss_first_sample_mib" in first:
        grown = first["rss_last_sample_mib"] / first["rss_first_sample_mib"]
        print(
            f"  RSS at N within {RSS_GROWTH_MAX:.1f}x of RSS at the first sample: {first['rss_first_sample_mib']:.1f} -> "
            f"{first['rss_last_sample_mib']:.1f} MiB (x{grown:.2f}) -> {'PASS' if grown <= RSS_GROWTH_MAX else 'FAIL'}"
        )
    if "kill_first_s" in restart:
        worst = max(restart["kill_first_s"], restart["term_first_s"])
        ok = worst < RESTART_TARGET_S and restart["kill_count"] == args.messages == restart["term_count"]
        print(
            f"  restart to first message under {RESTART_TARGET_S:.0f} s with the backlog: after SIGKILL "
            f"{restart['kill_first_s']:.2f} s, after SIGTERM {restart['term_first_s']:.2f} s, all "
            f"{args.messages:,} there: {restart['kill_count'] == args.messages == restart['term_count']} "
            f"-> {'PASS' if ok else 'FAIL'}"
        )
    if args.rabbit:
        run_rabbit(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
