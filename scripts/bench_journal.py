#!/usr/bin/env python3
"""Benchmark the Raft journal (maxq_raft/replication/journal.py): appends/s and fdatasyncs/s.

For 128 B and 1 KiB payloads, with fsync on and off, one thread appends as fast as it can for
--seconds (group commit does the rest); then it waits until everything is durable. Printed:
appends/s while appending, entries/s until all durable, fdatasyncs/s, entries per fdatasync,
MB/s, and the append -> on_durable latency of sampled entries. A full-speed appender keeps the
writer's queue full, so its latency is mostly queueing; the `paced` rows append at a fixed rate
below saturation to show the latency a confirm sees under moderate load.

Usage: .venv/bin/python scripts/bench_journal.py [--dir DIR] [--seconds S]
Not a test. With fsync off nothing is durable; those rows measure the CPU path only.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from maxq_raft.replication.journal import Journal

ENTRIES_MAX = 5_000_000  # bound on any one run
SAMPLE_EVERY = 64  # latency sample: one entry in this many


def run(folder: Path, payload_bytes: int, fsync: bool, seconds: float, rate_per_s: float | None) -> dict:
    samples: collections.deque[tuple[int, float]] = collections.deque()  # (index, t_append); main appends, writer pops
    latencies_s: list[float] = []

    def on_durable(durable: int) -> None:
        now = time.perf_counter()
        while samples and samples[0][0] <= durable:  # bounded by the samples taken
            latencies_s.append(now - samples.popleft()[1])

    payload = os.urandom(payload_bytes)
    journal = Journal.open(folder, fsync=fsync, on_durable=on_durable)
    try:
        t0 = time.perf_counter()
        deadline = t0 + seconds
        index = 0
        while index < ENTRIES_MAX:
            now = time.perf_counter()
            if now >= deadline:
                break
            if rate_per_s is not None and index >= (now - t0) * rate_per_s:
                time.sleep(0.0005)
                continue
            index += 1
            if index % SAMPLE_EVERY == 0:
                samples.append((index, time.perf_counter()))
            journal.append(index, 1, payload)
        t_appended = time.perf_counter()
        if not journal.wait_durable(index, 120.0):
            raise RuntimeError("journal did not catch up within 120 s")
        t_durable = time.perf_counter()
        stats = journal.stats()
    finally:
        journal.close()
    lat = sorted(latencies_s)
    return {
        "entries": index,
        "appends_per_s": index / (t_appended - t0),
        "durable_per_s": index / (t_durable - t0),
        "fsyncs_per_s": stats["fdatasyncs"] / (t_durable - t0),
        "entries_per_batch": index / max(stats["batches"], 1),
        "mb_per_s": stats["bytes_written"] / (t_durable - t0) / 1e6,
        "lat_p50_ms": statistics.median(lat) * 1e3 if lat else float("nan"),
        "lat_p99_ms": lat[int(len(lat) * 0.99)] * 1e3 if lat else float("nan"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to put the journal (default: a temp dir)")
    parser.add_argument("--seconds", type=float, default=2.0, help="append phase per run")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench_journal_", dir=args.dir))
    print(
        f"journal bench in {base}, python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.seconds:g} s per run"
    )
    print(
        f"{'payload':>8} {'fsync':>5} {'mode':>12} {'entries':>9} {'appends/s':>10} {'durable/s':>10} {'fsyncs/s':>9} "
        f"{'per fsync':>9} {'MB/s':>6} {'lat p50 ms':>10} {'lat p99 ms':>10}"
    )
    runs = [(size, fsync, None) for size in (128, 1024) for fsync in (True, False)]
    runs += [(128, True, 20_000.0), (1024, True, 20_000.0)]
    try:
        for k, (size, fsync, rate) in enumerate(runs):
            r = run(base / f"run{k}", size, fsync, args.seconds, rate)
            mode = "max" if rate is None else f"paced {rate / 1000:g}k/s"
            print(
                f"{size:>8} {'on' if fsync else 'off':>5} {mode:>12} {r['entries']:>9} {r['appends_per_s']:>10.0f} "
                f"{r['durable_per_s']:>10.0f} {r['fsyncs_per_s']:>9.0f} {r['entries_per_batch']:>9.0f} {r['mb_per_s']:>6.1f} "
                f"{r['lat_p50_ms']:>10.2f} {r['lat_p99_ms']:>10.2f}",
                flush=True,
            )
            shutil.rmtree(base / f"run{k}")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
