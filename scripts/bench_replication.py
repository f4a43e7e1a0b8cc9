#!/usr/bin/env python3
"""Benchmark the replication engine: 3 local processes, one group, fsync on.

The leader keeps W proposals in flight; each is one entry of 100 x 128 B messages (msgpack,
13 003 B, as in the seam probe of docs/design.md §3). Reported per window: messages/s, entries/s,
commit latency p50/p99 (propose -> callback committed), errors, and the seam counters summed
over the three nodes (follower acks that went backwards, acknowledged entries truncated, ...).

Usage: scripts/bench_replication.py [--windows 4,16] [--seconds 5] [--repeats 1] [--no-fsync]
Ports: free ports on 127.0.0.1. Data: a temporary folder, removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

MSGS_PER_ENTRY = 100
MSG_BYTES = 128


# ------------------------------------------------------------------------------- node mode


def node_main(cfg: dict) -> None:
    import logging

    import msgpack

    from maxq_raft.replication.engine import ReplicationNode

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    threading.Timer(cfg["hard_timeout_s"], lambda: os._exit(3)).start()
    applied = [0]

    def on_commit(group, entries):
        applied[0] += len(entries)

    groups = [f"bench{i}" for i in range(cfg["groups"])]
    node = ReplicationNode(
        node_id=cfg["id"],
        raft_addr=tuple(cfg["addr"]),
        peers={k: tuple(v) for k, v in cfg["peers"].items()},
        cluster_secret=b"bench-secret",
        data_dir=Path(cfg["dir"]),
        groups=groups,
        fsync=cfg["fsync"],
        on_commit=on_commit,
    )
    node.start()
    blob = msgpack.packb([os.urandom(MSG_BYTES)] * MSGS_PER_ENTRY)
    print(json.dumps({"ev": "ready"}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "status":
            sts = node.status()
            seams: dict[str, int] = {}
            for st in sts.values():
                for k, v in st["seams"].items():
                    seams[k] = seams.get(k, 0) + v
            print(
                json.dumps(
                    {
                        "ev": "status",
                        "leads": [g for g, st in sts.items() if st["role"] == "leader"],
                        "seams": seams,
                        "applied": applied[0],
                        "journal": {g: st["journal"] for g, st in sts.items()},
                    }
                ),
                flush=True,
            )
        elif cmd["op"] == "run":
            results: list[dict] = []
            threads = [
                threading.Thread(
                    target=lambda g=g: results.append(
                        run_load(node, g, blob, cmd["window"], cmd["seconds"], cmd["warmup"])
                    )
                )
                for g in cmd["groups"]
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(cmd["seconds"] + 60)
            print(json.dumps({"ev": "result", "runs": results}), flush=True)
    node.stop()
    os._exit(0)


def run_load(node, group: str, blob: bytes, window: int, seconds: float, warmup: float) -> dict:
    sem = threading.BoundedSemaphore(window)
    lat: list[float] = []
    errors: dict[str, int] = {}
    measuring = [False]

    def make_cb(t0: float):
        def cb(idx, err):
            if measuring[0]:
                if err is None:
                    lat.append(time.perf_counter() - t0)
                else:
                    errors[err] = errors.get(err, 0) + 1
            sem.release()

        return cb

    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        if sem.acquire(timeout=1):
            node.propose(group, blob, make_cb(time.perf_counter()))
    for _ in range(window):  # drain the warm-up
        sem.acquire(timeout=5)
    for _ in range(window):
        sem.release()
    measuring[0] = True
    t0 = time.perf_counter()
    end = t0 + seconds
    while True:
        now = time.perf_counter()
        if now >= end or not sem.acquire(timeout=max(0.0, end - now)):
            break
        node.propose(group, blob, make_cb(time.perf_counter()))
    elapsed = time.perf_counter() - t0
    measuring[0] = False
    n = len(lat)
    lat.sort()

    def pct(p: float) -> float | None:
        return round(lat[min(n - 1, int(n * p))] * 1e3, 2) if n else None

    for _ in range(window):  # let the tail finish before the next run
        sem.acquire(timeout=5)
    return {
        "group": group,
        "window": window,
        "entries": n,
        "elapsed": elapsed,
        "lat": lat,
        "errors": errors,
        "entry_bytes": len(blob),
    }


# ------------------------------------------------------------------------------ coordinator


class Proc:
    def __init__(self, cfg: dict, err_path: Path) -> None:
        self.err = open(err_path, "w")
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--node", json.dumps(cfg)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            cwd=cfg["dir"],
        )
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                pass

    def ask(self, timeout: float, **cmd) -> dict | None:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self.err.close()


def bench_once(window: int, seconds: float, fsync: bool, ngroups: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench_repl_"))
    ids = ["n1", "n2", "n3"]
    addrs = {i: ["127.0.0.1", free_port()] for i in ids}
    procs: dict[str, Proc] = {}
    try:
        for i in ids:
            (root / i).mkdir()
            cfg = {
                "id": i,
                "addr": addrs[i],
                "peers": {k: v for k, v in addrs.items() if k != i},
                "dir": str(root / i),
                "fsync": fsync,
                "groups": ngroups,
                "hard_timeout_s": seconds + 90,
            }
            procs[i] = Proc(cfg, root / f"{i}.err")
        for p in procs.values():
            if (p.q.get(timeout=20) or {}).get("ev") != "ready":
                raise RuntimeError("node did not start")
        leads: dict[str, list[str]] = {}
        end = time.monotonic() + 15
        while time.monotonic() < end:  # bounded: until every group has a leader
            leads = {i: (p.ask(5, op="status") or {}).get("leads", []) for i, p in procs.items()}
            if sum(len(v) for v in leads.values()) == ngroups:
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"not every group has a leader within 15 s: {leads}")
        for i, p in procs.items():  # every node drives the groups it leads, all at once
            if leads[i]:
                p.p.stdin.write(
                    json.dumps({"op": "run", "groups": leads[i], "window": window, "seconds": seconds, "warmup": 0.5})
                    + "\n"
                )
                p.p.stdin.flush()
        runs: list[dict] = []
        for i, p in procs.items():
            if leads[i]:
                r = p.q.get(timeout=seconds + 60)
                runs.extend(r["runs"])
        lat = sorted(x for r in runs for x in r["lat"])
        elapsed = max(r["elapsed"] for r in runs)
        n = sum(r["entries"] for r in runs)

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(len(lat) * q))] * 1e3, 2) if lat else None

        errors: dict[str, int] = {}
        for r in runs:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        res = {
            "window": window,
            "entries_per_s": round(n / elapsed, 1),
            "msgs_per_s": round(n * MSGS_PER_ENTRY / elapsed),
            "lat_ms_p50": pct(0.5),
            "lat_ms_p99": pct(0.99),
            "errors": errors,
            "leaders": {i: len(v) for i, v in leads.items()},
        }
        seams: dict[str, int] = {}
        fsyncs = appends = 0
        for p in procs.values():
            st = p.ask(5, op="status") or {}
            for k, v in st.get("seams", {}).items():
                seams[k] = seams.get(k, 0) + v
            for j in st.get("journal", {}).values():
                fsyncs += j.get("fdatasyncs", 0)
                appends += j.get("appends", 0)
        res["seams"] = seams
        res["journal"] = {"appends": appends, "fdatasyncs": fsyncs}
        return res
    finally:
        for p in procs.values():
            p.kill()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--node":
        node_main(json.loads(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", default="4,16")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--groups", type=int, default=1, help="groups (each driven on its leader at once)")
    args = ap.parse_args()
    fsync = not args.no_fsync
    print(
        f"3 processes on 127.0.0.1, {args.groups} group(s), entries of {MSGS_PER_ENTRY} x {MSG_BYTES} B, "
        f"fsync={'on' if fsync else 'OFF'}, {args.seconds:g} s per run, {os.cpu_count()} cores",
        flush=True,
    )
    for w in [int(x) for x in args.windows.split(",")]:
        runs = [bench_once(w, args.seconds, fsync, args.groups) for _ in range(args.repeats)]
        med = lambda k: statistics.median([r[k] for r in runs if r.get(k) is not None] or [0])  # noqa: E731
        s = runs[-1]["seams"]
        j = runs[-1]["journal"]
        print(
            f"window {w:>3}{' per group' if args.groups > 1 else ''}: {med('msgs_per_s'):>9,.0f} msgs/s  "
            f"{med('entries_per_s'):>7,.0f} entries/s  commit latency p50 {med('lat_ms_p50'):.2f} ms  "
            f"p99 {med('lat_ms_p99'):.2f} ms  errors {[r['errors'] for r in runs]}  "
            f"runs {[r['msgs_per_s'] for r in runs]}  leaders per node {runs[-1]['leaders']}",
            flush=True,
        )
        print(
            f"            last run, 3 nodes: ack regressions {s.get('ack_regressions', 0)}, acked entries truncated "
            f"{s.get('acked_entries_truncated', 0)}, guard skipped {s.get('guard_skipped_entries', 0)}, dedup "
            f"suppressed {s.get('dedup_entries', 0)}, held {s.get('held', 0)}, acks coalesced "
            f"{s.get('acks_coalesced', 0)}, stale held dropped {s.get('held_dropped_stale', 0)}; journals: "
            f"{j['appends']} appends, {j['fdatasyncs']} fdatasyncs (whole run)",
            flush=True,
        )


if __name__ == "__main__":
    main()
