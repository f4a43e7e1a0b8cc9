#!/usr/bin/env python3
"""What monitoring costs the node (issue #17): interleaved pairs of runs, one node left alone and
one node read every second by a scraper, with the same load; medians of both.

    .venv/bin/python scripts/bench_monitoring.py                      # 6 pairs, transient 1 KiB
    .venv/bin/python scripts/bench_monitoring.py --pairs 5 --paths all \
        --args "--persistent --durable --confirm 1000 --manual-ack"

Theory of operation: `scripts/bench` runs its targets one after the other (maxq, then
maxq-scraped, then rabbit), so a machine whose speed drifts over the quarter hour (a shared
2-core box does) moves the two MaxQ-Raft figures apart by more than the 3 % the issue allows.
Here each pair runs the two back to back, a fresh node each (free ports, a new data folder,
stopped in a `finally`), `amqpload` (scripts/loadgen, built by scripts/bench's way if missing)
driving `--seconds` of s1 load; the scraper, a thread of this script, reads `--paths`
(`metrics`: /metrics only, as the issue states; `all`: also /metrics/detailed and the management
API's overview, queues, exchanges and connections, as the web UI's pages refresh) every second
as guest. Printed per run: consumed msgs/s, the broker's CPU seconds per million consumed, and
other tenants' cores (amqpload's figures); at the end the medians of each side and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_scraper import PATHS, Scraper  # this folder, sys.path[0] for a script
from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(os.environ.get("MAXQ_VENV", ROOT / ".venv")) / "bin"
AMQPLOAD = ROOT / "scripts" / "loadgen" / "bin" / "amqpload"
READY_TIMEOUT_S = 30.0


def one_run(scraped: bool, args: argparse.Namespace) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="maxq-bench-monitoring-"))
    ports = {"amqp": free_port(), "http": free_port(), "metrics": free_port()}
    log = open(folder / "server.log", "ab")
    server = subprocess.Popen(
        [str(VENV_BIN / "maxq-server"), "--data-dir", str(folder / "data"), "--amqp-port", str(ports["amqp"]),
         "--http-port", str(ports["http"]), "--prometheus-port", str(ports["metrics"])],
        stdout=log, stderr=subprocess.STDOUT, cwd=folder, start_new_session=True,
    )  # fmt: skip
    scraper = Scraper(ports, args.paths) if scraped else None
    try:
        until = time.monotonic() + READY_TIMEOUT_S
        while b"maxq-server ready" not in (folder / "server.log").read_bytes():
            if server.poll() is not None or time.monotonic() > until:
                raise RuntimeError("maxq-server did not start: " + (folder / "server.log").read_text()[-2000:])
            time.sleep(0.05)
        if scraper is not None:
            scraper.start()
        command = [str(AMQPLOAD), "--host", "127.0.0.1", "--port", str(ports["amqp"]), "-d", str(args.seconds),
                   "--warmup", "2", "--scenario", "s1", "-P", "1", "-C", "1", "-Q", "1", "-s", str(args.size),
                   *args.args.split(), "--broker-pid", str(server.pid)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + 120)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"amqpload failed: {done.stderr[-2000:]}")
        result = json.loads(lines[-1])
    finally:
        if scraper is not None:
            scraper.stop()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "scraped": scraped,
        "cons_rate": result["cons_rate"],
        "cpu_s_per_M": result["broker_cpu_s_per_M_cons"],
        "other_cores": result.get("other_cpu_util"),
        "scrape_rounds": scraper.rounds if scraper else 0,
        "scrape_failures": scraper.failures if scraper else 0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--paths", choices=tuple(PATHS), default="metrics", help="what the scraper reads (bench_scraper.py)")
    p.add_argument("--args", default="", help="more amqpload arguments (e.g. --persistent --durable ...)")
    args = p.parse_args()
    if not AMQPLOAD.exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "loadgen" / "build.sh")], check=True)
    runs = []
    for pair in range(args.pairs):
        for scraped in (False, True):
            run = one_run(scraped, args)
            runs.append(run)
            print(f"pair {pair + 1} {'scraped' if scraped else 'alone  '}: {json.dumps(run)}", flush=True)
    sides = {}
    for scraped in (False, True):
        mine = [r for r in runs if r["scraped"] is scraped]
        sides[scraped] = (
            statistics.median(r["cons_rate"] for r in mine),
            statistics.median(r["cpu_s_per_M"] for r in mine),
        )
    (rate0, cpu0), (rate1, cpu1) = sides[False], sides[True]
    print(
        f"medians of {args.pairs}: alone {rate0:,.0f} msgs/s, {cpu0:.2f} CPU s/M; scraped ({args.paths}) "
        f"{rate1:,.0f} msgs/s, {cpu1:.2f} CPU s/M; scraped/alone: rate x{rate1 / rate0:.3f}, CPU/M x{cpu1 / cpu0:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
