#!/usr/bin/env python3
"""What message trace (x-trace) costs per message in the broker's own work: the queue machine
and the tracer, with the trace store in memory or in RocksDB, no sockets.

    .venv/bin/python scripts/bench_trace_cost.py [--batch 64] [--batches 1000] [--repeat 5] [--profile]

One traced queue lives a life like scripts/bench's s1: a consumer with a prefetch of 4 x batch
and manual acks; each round publishes `--batch` messages in one Enqueue (with the publishers'
trace context and each message's trace id header, as server/session.py adds them; the messages
are made in the timed part, traced or not), then acks what was delivered in one Settle. Each
command goes through the applier's trace calls (`Tracer.before` / `after`, applier.py). Printed:
the best CPU time per message (process time, the least disturbed by other processes) of the
machine alone, with trace records kept in memory (`MemoryKV`), and in RocksDB (`RocksKV`, a
temporary folder): the difference is what a traced message costs. `--profile` prints the
cProfile of one RocksDB run instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from maxq_raft.amqp.properties import BasicProperties, encode_properties
from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import Deliver, Meta
from maxq_raft.server.channel import FLOW_CREDIT
from maxq_raft.server.trace_store import MemoryKV, RocksKV, TraceLog
from maxq_raft.server.tracer import Tracer, trace_id_template, with_trace_id

KEY = ("/", "q")


def run(batches: int, batch: int, store: str | None, folder: Path) -> float:
    """CPU seconds for `batches` rounds; `store`: None (no trace), "memory" or "rocks"."""
    machine = QueueMachine("/", "q")
    tracer = None
    if store is not None:
        kv = MemoryKV() if store == "memory" else RocksKV(folder / f"trace-{time.monotonic_ns()}")
        tracer = Tracer(TraceLog(kv))
    index = 0

    def apply(command) -> list:
        nonlocal index
        index += 1
        meta = Meta(index, index)
        before = tracer.before(machine, command) if tracer is not None else None
        reply, effects = machine.apply(meta, command)
        if tracer is not None:
            tracer.after(meta, KEY, machine, command, reply, effects, before)
        return effects

    if tracer is not None:
        apply(qc.UpdateSettings(QueueSettings(trace=True)))
        tracer.settings_changed(KEY, machine)
    apply(qc.Checkout("c1", "conn-1/1", 4 * batch, False, 0, False, FLOW_CREDIT))
    template = trace_id_template(encode_properties(BasicProperties(delivery_mode=1)), "bench@conn-1")
    assert template is not None
    context = ("guest", "bench@conn-1", "127.0.0.1:5000")
    untraced = encode_properties(BasicProperties(delivery_mode=1))
    start = time.process_time()
    for b in range(batches):
        if tracer is not None:  # (the publishing session's part: server/session.py, _with_trace_id)
            # (the session's run of them: server/session.py, _note_traced, not timed here)
            messages = [
                Message("", "q", with_trace_id(template, b * batch + k), b"x" * 16, False) for k in range(batch)
            ]
            trace = (*context, [(0, 1, True, ["q"], b * batch, batch)])
        else:
            messages = [Message("", "q", untraced, b"x" * 16, False) for k in range(batch)]
            trace = None
        delivered = [e.message.seq for e in apply(qc.Enqueue(messages, None, None, trace)) if type(e) is Deliver]
        while delivered:  # (bounded: each ack delivers what was queued, and nothing is added)
            delivered = [e.message.seq for e in apply(qc.Settle("c1", delivered)) if type(e) is Deliver]
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    n = args.batch * args.batches
    with tempfile.TemporaryDirectory(prefix="maxq-trace-bench-") as tmp:
        folder = Path(tmp)
        if args.profile:
            profile = cProfile.Profile(time.process_time)  # (CPU time: other processes do not count)
            profile.runcall(run, args.batches, args.batch, "rocks", folder)
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)
            return
        best = {}
        for store in (None, "memory", "rocks"):
            best[store] = min(run(args.batches, args.batch, store, folder) for _ in range(args.repeat)) / n * 1e9
        print(
            f"trace off {best[None]:.0f} ns/msg, on (memory) {best['memory']:.0f} ns/msg "
            f"(+{best['memory'] - best[None]:.0f}), on (RocksDB) {best['rocks']:.0f} ns/msg "
            f"(+{best['rocks'] - best[None]:.0f}); {n} messages, best of {args.repeat}"
        )


if __name__ == "__main__":
    main()
