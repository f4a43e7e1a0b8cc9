#!/usr/bin/env python3
"""Where a confirmed publish's time goes on a 3-node cluster at a fixed rate.

    scripts/trace_commit_stages.py [--rate 1000] [--seconds 8] [--size 128] [--keep]

Starts a fresh 3-node cluster on free loopback ports (data in a temporary folder, removed
afterwards unless --keep), each node run through this script's `node` mode, which wraps a few
methods of the running broker with timestamps (the broker's code knows nothing of it). It then
drives `maxq-perf` (fixed rate, persistent, confirms, manual ack, one queue) against the node
that leads the queue's shard, so the leader's stages are the whole path, asks that node
(SIGUSR2) for the percentiles of each stage of the entries it committed meanwhile, and prints
them with the load generator's end-to-end latency. Every node is stopped in a `finally`.

Stages, per Raft index, on the leader (milliseconds between two marks, `STAGE_PAIRS`):
  propose        the broker proposes the entry (trio thread)
  log_add        pysyncobj appended it to the Raft log (hub thread)
  fsync_start    the journal writer took it (writer thread) ... fsync_end: written and fdatasynced
  sent           the append_entries carrying it went to the first follower (hub; not waiting
                 for the leader's own fsync, which runs meanwhile)
  ack            the first follower's acknowledgement came back (after its own fdatasync)
  committed      the engine's commit callback (hub thread)
  apply          the broker started applying it (trio thread) ... applied: done (deliveries written)

A diagnostic, not a benchmark: timestamps cost a few microseconds per stage.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("MAXQ_VENV", ROOT / ".venv"))
VENV_BIN = VENV / "bin"
# run under the project's venv (maxq_raft and maxq-perf live there)
if (VENV_BIN / "python").exists() and Path(sys.prefix).resolve() != VENV.resolve():
    os.execv(str(VENV_BIN / "python"), [str(VENV_BIN / "python"), str(Path(__file__).resolve()), *sys.argv[1:]])
# (from, to) mark pairs: the leader's fsync runs beside the followers' round trip (its appends go
# out before its own fdatasync ends: replication/group_transport.py, seam 1), so both start at log_add.
STAGE_PAIRS = [
    ("propose", "log_add"),
    ("log_add", "fsync_start"),
    ("fsync_start", "fsync_end"),
    ("log_add", "sent"),
    ("sent", "ack"),
    ("ack", "committed"),
    ("fsync_end", "committed"),
    ("committed", "apply"),
    ("apply", "applied"),
]
READY_TIMEOUT_S = 60.0
QUEUE_PREFIX = "trace-q"


# ----------------------------------------------------------------------------- node mode


def node_main(out_path: str, server_args: list[str]) -> None:
    """Run maxq-server with stage timestamps; SIGUSR2 writes their percentiles to out_path."""
    from time import perf_counter as now

    from maxq_raft.replication import engine, group_transport, journal, raft_journal
    from maxq_raft.server import cluster
    from maxq_raft.server.main import main

    marks: dict[int, dict[str, float]] = collections.defaultdict(dict)
    traced = {"group": None}  # the shard group of the traced queue, named by the driver's file
    acked_up_to: dict[str, int] = {}

    def group_wanted(name: str) -> bool:
        if traced["group"] is None and os.path.exists(out_path + ".group"):
            traced["group"] = Path(out_path + ".group").read_text().strip()
        return name == traced["group"]

    def wrap(cls, name, make):
        setattr(cls, name, make(getattr(cls, name)))

    def propose(original):
        def traced_propose(self, group, payload, callback):
            if not group_wanted(group):
                return original(self, group, payload, callback)
            t0 = now()

            def answered(index, error):
                if index:
                    marks[index]["propose"] = t0
                    marks[index]["committed"] = now()
                callback(index, error)

            return original(self, group, payload, answered)

        return traced_propose

    def add(original):
        def traced_add(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if group_wanted(self.folder.name):
                marks[self.last_index].setdefault("log_add", now())
            return result

        return traced_add

    def write_batch(original):
        def traced_write_batch(self, batch):
            t0 = now()
            result = original(self, batch)
            if group_wanted(self.folder.name):
                t1 = now()
                for index, _term, _payload in batch:
                    marks[index]["fsync_start"] = t0
                    marks[index]["fsync_end"] = t1
            return result

        return traced_write_batch

    def wire(original):
        def traced_wire(self, nid, body, is_ack, ack_idx, term):
            if not is_ack and group_wanted(self.group):
                marks[self.log.last_index].setdefault("sent", now())
            return original(self, nid, body, is_ack, ack_idx, term)

        return traced_wire

    def receive(original):
        def traced_receive(self, nid, message):
            if message.get("type") == "next_node_idx" and group_wanted(self.group):
                t = now()
                hi = message["next_node_idx"] - 1
                for index in range(max(acked_up_to.get(nid, hi), hi - 1000) + 1, hi + 1):
                    marks[index].setdefault("ack", t)
                acked_up_to[nid] = max(acked_up_to.get(nid, 0), hi)
            return original(self, nid, message)

        return traced_receive

    def apply(original):
        def traced_apply(self, group, entries, *rest):  # (ClusterLog._apply: group, entries, size)
            if not group_wanted(group):
                return original(self, group, entries, *rest)
            t0 = now()
            result = original(self, group, entries, *rest)
            t1 = now()
            for index, _payload in entries:
                marks[index]["apply"] = t0
                marks[index]["applied"] = t1
            return result

        return traced_apply

    wrap(engine.ReplicationNode, "propose", propose)
    wrap(raft_journal.RaftLog, "add", add)
    wrap(journal.Journal, "_write_batch", write_batch)
    wrap(group_transport.GroupTransport, "_wire", wire)
    wrap(group_transport.GroupTransport, "receive", receive)
    wrap(cluster.ClusterLog, "_apply", apply)

    def dump(_signum, _frame):
        rows = [m for m in list(marks.values()) if "propose" in m and "applied" in m]
        report = {"entries": len(rows), "stages": []}
        for a, b in STAGE_PAIRS:
            spans = [(r[b] - r[a]) * 1e3 for r in rows if a in r and b in r]
            if spans:
                report["stages"].append([a, b, percentiles(spans)])
        report["total"] = percentiles([(r["applied"] - r["propose"]) * 1e3 for r in rows])
        Path(out_path + ".tmp").write_text(json.dumps(report))
        os.replace(out_path + ".tmp", out_path)
        marks.clear()

    signal.signal(signal.SIGUSR2, dump)
    sys.argv = ["maxq-server", *server_args]
    main()


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    values.sort()
    pick = lambda q: round(values[min(len(values) - 1, int(len(values) * q))], 3)  # noqa: E731
    return {"n": len(values), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


# ---------------------------------------------------------------------------- driver mode


def fetch_json(port: int, path: str) -> dict:
    guest = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}  # guest:guest, from loopback
    with urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=guest), timeout=5
    ) as r:
        return json.loads(r.read())


def perf(amqp_port: int, rate: int, seconds: float, size: int) -> dict:
    cmd = [
        str(VENV_BIN / "maxq-perf"),
        "--port",
        str(amqp_port),
        "--scenario",
        "s2",
        "--rate",
        str(rate),
        "-s",
        str(size),
        "--persistent",
        "--durable",
        "--confirm",
        "1000",
        "--manual-ack",
        "-d",
        str(seconds),
        "--warmup",
        "1",
        "--queue-prefix",
        QUEUE_PREFIX,
        "--keep-queues",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"maxq-perf failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=int, default=1000)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--keep", action="store_true", help="keep the data folder (node logs are in it)")
    args = p.parse_args()
    if not 1 <= args.rate <= 100_000 or not 1 <= args.seconds <= 600:
        p.error("--rate must be in [1, 100000] and --seconds in [1, 600]")
    folder = Path(tempfile.mkdtemp(prefix="maxq-trace-"))
    names = ["n1", "n2", "n3"]
    ports = {n: (free_port(), free_port(), free_port()) for n in names}  # amqp, http, raft
    env = dict(os.environ, MAXQ_CLUSTER_SECRET="trace-" + os.urandom(8).hex())
    procs: dict[str, subprocess.Popen] = {}
    try:
        for n in names:
            amqp, http, raft = ports[n]
            peers = [a for m in names if m != n for a in ("--peer", f"{m}@127.0.0.1:{ports[m][2]}")]
            log = open(folder / f"{n}.log", "w")
            procs[n] = subprocess.Popen(
                [
                    str(VENV_BIN / "python"),
                    str(Path(__file__).resolve()),
                    "node",
                    str(folder / f"{n}.stages"),
                    "--node-id",
                    n,
                    "--data-dir",
                    str(folder / n),
                    "--amqp-port",
                    str(amqp),
                    "--http-port",
                    str(http),
                    "--prometheus-port",
                    "0",
                    "--raft-addr",
                    f"127.0.0.1:{raft}",
                    *peers,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        for n in names:
            while "maxq-server ready" not in (folder / f"{n}.log").read_text():
                if procs[n].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{n} did not start; see {folder / (n + '.log')}")
                time.sleep(0.2)
        perf(ports["n1"][0], 100, 1, args.size)  # declares the queue
        from maxq_raft.server.cluster import shard_of

        status = fetch_json(ports["n1"][1], "/api/cluster/status")
        shards = sum(1 for g in status["groups"] if g["group"].startswith("shard-"))
        group = shard_of(("/", f"{QUEUE_PREFIX}-0"), shards)
        leader = next(g["leader"] for g in status["groups"] if g["group"] == group)
        if leader not in procs:
            raise RuntimeError(f"{group} has no leader yet ({leader!r})")
        for n in names:
            (folder / f"{n}.stages.group").write_text(group)
        result = perf(ports[leader][0], args.rate, args.seconds, args.size)
        procs[leader].send_signal(signal.SIGUSR2)
        out = folder / f"{leader}.stages"
        for _ in range(50):
            if out.exists():
                break
            time.sleep(0.1)
        report = json.loads(out.read_text())
        print(
            f"{args.rate} msgs/s of {args.size} B, persistent, confirms, manual ack; client on {leader}, "
            f"the leader of {group}; {report['entries']} entries traced on it"
        )
        print(f"{'stage (ms)':30s} {'p50':>8s} {'p90':>8s} {'p99':>8s}")
        for a, b, pc in report["stages"]:
            print(f"{a + ' -> ' + b:30s} {pc['p50']:8.3f} {pc['p90']:8.3f} {pc['p99']:8.3f}")
        t = report["total"]
        print(f"{'propose -> applied':30s} {t['p50']:8.3f} {t['p90']:8.3f} {t['p99']:8.3f}")
        lat = result.get("lat_us") or {}
        print(
            f"{'publish -> delivery (client)':30s} {lat.get('p50', 0) / 1e3:8.3f} {lat.get('p90', 0) / 1e3:8.3f} "
            f"{lat.get('p99', 0) / 1e3:8.3f}"
        )
        return 0
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if args.keep:
            print(f"data and logs kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "node":
        node_main(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main())
