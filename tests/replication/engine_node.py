"""One ReplicationNode in its own process, driven by a test over stdin/stdout (JSON lines).

argv[1]: JSON {node_id, raft_addr: [host, port], peers: {id: [host, port]}, secret (hex), data_dir,
               groups, fsync, joining, propose_timeout_s, out_dir, incarnation, hard_timeout_s, settings,
               held (optional: the groups this node holds), first_members (optional: {group: {id: [host, port]}})}
stdin  : {"op": "status"} | {"op": "snapshot", "group"} | {"op": "chain"} | {"op": "propose", "group", "n", "size", "wait_s"}
         | {"op": "load", "group", "window", "size", "anywhere"} | {"op": "load_stop"}
         | {"op": "add_member", "node", "addr"} | {"op": "remove_member", "node"}
         | {"op": "move_group", "group", "add": [id, [host, port]] | null, "remove": id | null}
         | {"op": "held"}
         | {"op": "transfer", "group", "node"} | {"op": "quit"}
stdout : one JSON line per command ({"op": ..., ...}); {"ev": "ready"} once started.

Evidence that survives SIGKILL (one os.write per record, O_APPEND), in out_dir:
  applied_<node>_<incarnation>.log    "<group> <index> <sha1 of payload>" for every on_commit entry
  confirmed_<node>_<incarnation>.log  the same for every proposal whose callback reported committed
A payload is "<node>|<incarnation>|<seq>|" padded to the requested size, so every one is unique.
The process exits by itself after hard_timeout_s (a test that forgets it cannot leak it forever).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path

from maxq_raft.replication.engine import ReplicationNode
from maxq_raft.replication.snapshot_file import read_body

cfg = json.loads(sys.argv[1])
logging.basicConfig(
    level=logging.INFO, stream=sys.stderr, format=f"%(asctime)s {cfg['node_id']} %(levelname)s %(name)s: %(message)s"
)
threading.Timer(cfg.get("hard_timeout_s", 120), lambda: os._exit(3)).start()
out_dir = Path(cfg["out_dir"])
tag = f"{cfg['node_id']}_{cfg.get('incarnation', 1)}"
applied_fd = os.open(out_dir / f"applied_{tag}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
confirmed_fd = os.open(out_dir / f"confirmed_{tag}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
out_lock = threading.Lock()


def emit(**kw) -> None:
    with out_lock:
        sys.stdout.write(json.dumps(kw) + "\n")
        sys.stdout.flush()


def digest(payload: bytes) -> str:
    return hashlib.sha1(payload).hexdigest()[:16]


applied_last: dict[str, int] = collections.defaultdict(int)
order_errors = [0]
# The state a snapshot holds here: a hash chained over every applied payload, in order.
chain: dict[str, str] = collections.defaultdict(lambda: "0" * 16)
state_lock = threading.Lock()


def on_commit(group: str, entries: list[tuple[int, bytes]]) -> None:
    lines = []
    with state_lock:
        for idx, payload in entries:
            if idx <= applied_last[group]:
                order_errors[0] += 1
            applied_last[group] = idx
            d = digest(payload)
            chain[group] = digest((chain[group] + d).encode())
            lines.append(f"{group} {idx} {d}\n")
        # Written before the lock is let go: a "chain" answer that shows these entries applied
        # must find them in the file too (the install test read it between the two and saw none).
        os.write(applied_fd, "".join(lines).encode())


def on_snapshot(group: str, header) -> None:
    st = json.loads(b"".join(read_body(header)))
    with state_lock:
        if header.index <= applied_last[group]:
            order_errors[0] += 1
        applied_last[group] = header.index
        chain[group] = st["chain"]
        os.write(applied_fd, f"{group} {header.index} snapshot:{st['chain']}\n".encode())


node = ReplicationNode(
    node_id=cfg["node_id"],
    raft_addr=tuple(cfg["raft_addr"]),
    peers={k: tuple(v) for k, v in cfg["peers"].items()},
    cluster_secret=bytes.fromhex(cfg["secret"]),
    data_dir=Path(cfg["data_dir"]),
    groups=cfg["groups"],
    fsync=cfg.get("fsync", True),
    on_commit=on_commit,
    on_snapshot=on_snapshot,
    propose_timeout_s=cfg.get("propose_timeout_s", 5.0),
    joining=cfg.get("joining", False),
    raft_settings=cfg.get("settings"),
    held=cfg.get("held"),
    first_members={g: {k: tuple(v) for k, v in m.items()} for g, m in (cfg.get("first_members") or {}).items()},
)
node.start()
seq = [0]
seq_lock = threading.Lock()


def make_payload(size: int) -> bytes:
    with seq_lock:
        seq[0] += 1
        s = seq[0]
    head = f"{tag}|{s}|".encode()
    return head + b"x" * max(0, size - len(head))


def proposal_cb(
    group: str,
    payload: bytes,
    results: collections.Counter,
    done: threading.Semaphore | None,
    record: list | None = None,
):
    def cb(idx, err):
        if err is None:
            os.write(confirmed_fd, f"{group} {idx} {digest(payload)}\n".encode())
            results["ok"] += 1
        else:
            results[err] += 1
        if record is not None:
            record.append([idx, err])
        if done is not None:
            done.release()

    return cb


class Load:
    """Proposals kept in flight, `window` at a time: on the group's leader only, or from this
    node whatever its role (`anywhere`: a follower forwards; a node not holding the group sends
    it to one that does)."""

    def __init__(self, group: str, window: int, size: int, anywhere: bool = False) -> None:
        self.group, self.window, self.size, self.anywhere = group, window, size, anywhere
        self.results: collections.Counter = collections.Counter()
        self.stop = threading.Event()
        self.sem = threading.BoundedSemaphore(window)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        failed_before = 0
        while not self.stop.is_set():
            if not self.anywhere and not node.is_leader(self.group):
                time.sleep(0.01)
                continue
            failed = sum(n for k, n in self.results.items() if k != "ok")
            if failed > failed_before:  # (no member to take it right now: do not spin)
                failed_before = failed
                time.sleep(0.02)
            if not self.sem.acquire(timeout=0.2):
                continue
            payload = make_payload(self.size)
            node.propose(self.group, payload, proposal_cb(self.group, payload, self.results, self.sem))


loads: dict[str, Load] = {}
emit(ev="ready")
for line in sys.stdin:
    try:
        cmd = json.loads(line)
    except ValueError:
        continue
    op = cmd.get("op")
    if op == "quit":
        break
    if op == "status":
        try:
            st = node.status()
        except Exception as exc:  # report rather than die
            st = {"error": repr(exc)}
        emit(op="status", status=st, order_errors=order_errors[0])
    elif op == "propose":
        n, group = cmd["n"], cmd["group"]
        results: collections.Counter = collections.Counter()
        record: list = []
        done = threading.Semaphore(0)
        for _ in range(n):
            payload = make_payload(cmd.get("size", 64))
            node.propose(group, payload, proposal_cb(group, payload, results, done, record))
        end = time.monotonic() + cmd.get("wait_s", 10)
        got = 0
        while got < n and done.acquire(timeout=max(0.0, end - time.monotonic())):
            got += 1
        emit(op="propose", results=dict(results), record=record, answered=got)
    elif op == "snapshot":
        group = cmd["group"]
        with state_lock:
            idx, body = applied_last[group], json.dumps({"chain": chain[group]}).encode()
        box: list = []
        done_ev = threading.Event()
        node.take_snapshot(group, idx, [body], lambda h, err: (box.append(err), done_ev.set()))
        done_ev.wait(10)
        emit(op="snapshot", index=idx, error=box[0] if box else "no answer")
    elif op == "chain":
        with state_lock:
            emit(op="chain", chain={g: [applied_last[g], chain[g]] for g in applied_last})
    elif op == "load":
        loads[cmd["group"]] = Load(
            cmd["group"], cmd.get("window", 8), cmd.get("size", 1024), cmd.get("anywhere", False)
        )
        emit(op="load")
    elif op == "load_stop":
        res = {}
        for g, ld in loads.items():
            ld.stop.set()
            ld.thread.join(2)
            res[g] = dict(ld.results)
        loads.clear()
        emit(op="load_stop", results=res)
    elif op == "held":
        emit(op="held", held=sorted(node.held()), peer_held={k: sorted(v) for k, v in node.peer_held().items()})
    elif op in ("add_member", "remove_member", "transfer", "move_group"):
        box: list = []
        ev = threading.Event()

        def cb(err, box=box, ev=ev):
            box.append(err)
            ev.set()

        t0 = time.monotonic()
        if op == "add_member":
            node.add_member(cmd["node"], tuple(cmd["addr"]), cb)
        elif op == "remove_member":
            node.remove_member(cmd["node"], cb)
        elif op == "move_group":
            add = cmd.get("add")
            node.move_group(cmd["group"], None if add is None else (add[0], tuple(add[1])), cmd.get("remove"), cb)
        else:
            node.transfer_leadership(cmd["group"], cmd["node"], cb)
        ev.wait(cmd.get("wait_s", 40))
        emit(op=op, error=box[0] if box else "no answer", seconds=round(time.monotonic() - t0, 3))
for ld in loads.values():
    ld.stop.set()
node.stop()
emit(ev="stopped")
os._exit(0)
