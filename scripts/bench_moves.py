#!/usr/bin/env python3
"""How long moving a group's replica takes, with N bytes in its log (the replication engine).

    scripts/bench_moves.py [--log-mib 1024] [--entry-kib 64] [--no-fsync] [--keep]

Four engine processes on free loopback ports (fsync on), data in a temporary folder (removed
unless --keep). Groups g0 and g1 start on n1, n2 and n3 (n4 holds nothing: a member just
added). g0's log is filled with --log-mib of entries of --entry-kib random bytes, g1 with a
tenth of it. Then, while a proposer on n1 keeps 4 small proposals in flight to g0 (the group
goes on taking them during the moves), the script times:

  move       g0's replica from n3 to n4: n4 starts g0, is added, catches up through the whole
             log (no snapshot is taken here), then n3 is removed and deletes its copy;
  drain      every replica n2 holds moves to n3 or n4 (the plan of machines/replica_moves.py,
             as `maxqctl drain` would make it): both groups, one after the other.

Printed: the log size, each timing, the catch-up rate (log bytes / seconds) and how many
proposals g0 took during each. What a broker adds on top (its snapshots, the apply of the
queue machines on the new member) is not in it: docs/benchmarks.md says so with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GROUPS = ["g0", "g1"]
SECRET = b"bench-moves-secret"


def node_main(cfg: dict) -> None:
    import logging

    from maxq_raft.replication.engine import ReplicationNode

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    threading.Timer(cfg["hard_timeout_s"], lambda: os._exit(3)).start()
    applied = {g: 0 for g in GROUPS}

    def on_commit(group: str, entries: list) -> None:
        applied[group] = entries[-1][0]

    node = ReplicationNode(
        node_id=cfg["id"],
        raft_addr=tuple(cfg["addr"]),
        peers={k: tuple(v) for k, v in cfg["peers"].items()},
        cluster_secret=SECRET,
        data_dir=Path(cfg["dir"]),
        groups=GROUPS,
        fsync=cfg["fsync"],
        on_commit=on_commit,
        propose_timeout_s=30.0,
        held=cfg["held"],
        first_members={g: {k: tuple(v) for k, v in m.items()} for g, m in cfg["first_members"].items()},
    )
    node.start()
    print(json.dumps({"ev": "ready"}), flush=True)
    trickle = {"stop": threading.Event(), "ok": 0, "failed": 0}

    def run_trickle(group: str) -> None:
        sem = threading.BoundedSemaphore(4)

        def done(_idx: int | None, err: str | None) -> None:
            trickle["ok" if err is None else "failed"] += 1
            sem.release()

        while not trickle["stop"].is_set():
            if sem.acquire(timeout=0.2):
                node.propose(group, os.urandom(256), done)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "fill":  # entries of `size` bytes until the group's log holds `total` bytes
            size, total, group = cmd["size"], cmd["total"], cmd["group"]
            sem = threading.BoundedSemaphore(64)
            errors: list[str] = []

            def filled(_idx: int | None, err: str | None) -> None:
                if err is not None:
                    errors.append(err)
                sem.release()

            t0 = time.monotonic()
            blob = os.urandom(size)
            for _ in range(total // size):
                sem.acquire()
                node.propose(group, blob, filled)
            for _ in range(64):
                sem.acquire()
            print(json.dumps({"ev": "fill", "seconds": time.monotonic() - t0, "errors": len(errors)}), flush=True)
        elif op == "trickle":
            threading.Thread(target=run_trickle, args=(cmd["group"],), daemon=True).start()
            print(json.dumps({"ev": "trickle"}), flush=True)
        elif op == "trickle_count":
            print(json.dumps({"ev": "trickle_count", "ok": trickle["ok"], "failed": trickle["failed"]}), flush=True)
        elif op == "move":
            box: list = []
            ev = threading.Event()
            add = cmd.get("add")
            t0 = time.monotonic()
            node.move_group(
                cmd["group"],
                None if add is None else (add[0], tuple(add[1])),
                cmd.get("remove"),
                lambda err: (box.append(err), ev.set()),
                timeout_s=3600.0,
            )
            ev.wait(3600)
            print(
                json.dumps({"ev": "move", "error": box[0] if box else "no answer", "seconds": time.monotonic() - t0}),
                flush=True,
            )
        elif op == "status":
            sts = node.status()
            print(
                json.dumps(
                    {
                        "ev": "status",
                        "groups": {
                            g: {"members": sorted(st["members"]), "role": st["role"], "last": st["last_index"]}
                            for g, st in sts.items()
                        },
                        "applied": applied,
                        "journal_bytes": {g: _folder_bytes(Path(cfg["dir"]) / "raft" / g) for g in sts},
                    }
                ),
                flush=True,
            )
    trickle["stop"].set()
    node.stop()
    os._exit(0)


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


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
        ready = self.q.get(timeout=30)
        assert ready.get("ev") == "ready", ready

    def _pump(self) -> None:
        for line in self.p.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                pass

    def ask(self, timeout_s: float, **cmd) -> dict:
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.q.get(timeout=timeout_s)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)
        self.err.close()


def leader_of(procs: dict[str, Proc], group: str) -> str:
    end = time.monotonic() + 20
    while time.monotonic() < end:
        for nid, p in procs.items():
            st = p.ask(10, op="status")
            if st["groups"].get(group, {}).get("role") == "leader":
                return nid
        time.sleep(0.1)
    raise SystemExit(f"no leader for {group} within 20 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-mib", type=int, default=1024)
    ap.add_argument("--entry-kib", type=int, default=64)
    ap.add_argument("--no-fsync", action="store_true")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    from maxq_raft.machines.replica_moves import plan_moves

    root = Path(tempfile.mkdtemp(prefix="bench_moves_"))
    ids = ["n1", "n2", "n3", "n4"]
    addrs = {i: ["127.0.0.1", free_port()] for i in ids}
    first = {g: {i: addrs[i] for i in ("n1", "n2", "n3")} for g in GROUPS}
    procs: dict[str, Proc] = {}
    try:
        for i in ids:
            (root / i).mkdir()
            held = [] if i == "n4" else list(GROUPS)
            cfg = {
                "id": i,
                "addr": addrs[i],
                "peers": {k: v for k, v in addrs.items() if k != i},
                "dir": str(root / i),
                "fsync": not args.no_fsync,
                "held": held,
                "first_members": {g: first[g] for g in held},
                "hard_timeout_s": 7200,
            }
            procs[i] = Proc(cfg, root / f"{i}.err")
        sizes = {"g0": args.log_mib * 1024 * 1024, "g1": args.log_mib * 1024 * 1024 // 10}
        for g in GROUPS:
            lead = leader_of(procs, g)
            r = procs[lead].ask(7200, op="fill", group=g, size=args.entry_kib * 1024, total=sizes[g])
            print(f"filled {g}: {sizes[g] / 2**20:,.0f} MiB in {r['seconds']:.1f} s ({r['errors']} errors)", flush=True)
        st = procs["n3"].ask(10, op="status")
        print("n3's logs: " + ", ".join(f"{g} {b / 2**20:,.0f} MiB" for g, b in st["journal_bytes"].items()))
        procs["n1"].ask(10, op="trickle", group="g0")

        def count() -> int:
            return procs["n1"].ask(10, op="trickle_count")["ok"]

        before = count()
        r = procs["n1"].ask(7200, op="move", group="g0", add=["n4", addrs["n4"]], remove="n3")
        moved = count() - before
        if r["error"] is not None:
            raise SystemExit(f"move failed: {r['error']}")
        log_mib = st["journal_bytes"]["g0"] / 2**20
        print(
            f"move of g0 (n3 -> n4): {r['seconds']:.1f} s, {log_mib / r['seconds']:,.0f} MiB/s of log; "
            f"g0 took {moved} proposals meanwhile",
            flush=True,
        )
        placement = {g: procs["n1"].ask(10, op="status")["groups"][g]["members"] for g in GROUPS}
        drain = plan_moves(placement, ids, 3, leaving=["n2"])
        before = count()
        t0 = time.monotonic()
        for mv in drain:
            asker = next(i for i in placement[mv.group] if i != mv.remove)
            add = None if mv.add is None else [mv.add, addrs[mv.add]]
            r = procs[asker].ask(7200, op="move", group=mv.group, add=add, remove=mv.remove)
            if r["error"] is not None:
                raise SystemExit(f"drain move {mv} failed: {r['error']}")
            print(f"  {mv.group}: {mv.remove} -> {mv.add} in {r['seconds']:.1f} s", flush=True)
        drain_s = time.monotonic() - t0
        print(f"drain of n2 ({len(drain)} moves): {drain_s:.1f} s; g0 took {count() - before} proposals meanwhile")
        final = procs["n1"].ask(10, op="status")["groups"]
        print("after: " + "; ".join(f"{g} on {', '.join(v['members'])}" for g, v in final.items()))
    finally:
        for p in procs.values():
            try:
                p.kill()
            except Exception:  # keep killing the others
                pass
        if args.keep:
            print(f"data kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--node":
        node_main(json.loads(sys.argv[2]))
    else:
        main()
