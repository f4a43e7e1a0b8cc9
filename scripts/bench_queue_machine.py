#!/usr/bin/env python3
"""Micro-benchmark of the queue machine's hot commands: Enqueue, Settle, Credit (no I/O, no server).

    .venv/bin/python scripts/bench_queue_machine.py [--batch 64] [--batches 2000] [--repeat 7]

Each scenario applies the same command sequence to a fresh machine `--repeat` times and prints
the best time per message in nanoseconds (the best of several runs is the least disturbed by
other processes). Messages are built before the clock starts: only `apply` is timed. Compare a
change by running this before and after it on the same machine (the figures are only relative).
"""

from __future__ import annotations

import argparse
import time

from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_types import Meta


def batches(n_batches: int, batch: int) -> list:
    return [
        qc.Enqueue([Message("ex", "rk", b"\x00\x00", b"x" * 100, False) for _ in range(batch)])
        for _ in range(n_batches)
    ]


def enqueue_only(n_batches: int, batch: int) -> float:
    commands = batches(n_batches, batch)
    machine = QueueMachine("/", "q")
    start = time.perf_counter()
    for i, command in enumerate(commands):
        machine.apply(Meta(i + 1, i), command)
    return time.perf_counter() - start


def enqueue_deliver_no_ack(n_batches: int, batch: int) -> float:
    commands = batches(n_batches, batch)
    machine = QueueMachine("/", "q")
    machine.apply(Meta(0, 0), qc.Checkout("c", "o", 0, True, 0, False, batch))
    credit = qc.Credit("c", batch)
    start = time.perf_counter()
    index = 1
    for i, command in enumerate(commands):
        machine.apply(Meta(index, i), command)
        machine.apply(Meta(index + 1, i), credit)
        index += 2
    return time.perf_counter() - start


def enqueue_deliver_settle(n_batches: int, batch: int) -> float:
    commands = batches(n_batches, batch)
    machine = QueueMachine("/", "q")
    machine.apply(Meta(0, 0), qc.Checkout("c", "o", batch, False, 0, False, batch))
    credit = qc.Credit("c", batch)
    start = time.perf_counter()
    index = 1
    seq = 0
    for i, command in enumerate(commands):
        machine.apply(Meta(index, i), command)
        machine.apply(Meta(index + 1, i), qc.Settle("c", list(range(seq, seq + batch))))
        machine.apply(Meta(index + 2, i), credit)
        seq += batch
        index += 3
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    messages = args.batch * args.batches
    for scenario in (enqueue_only, enqueue_deliver_no_ack, enqueue_deliver_settle):
        best = min(scenario(args.batches, args.batch) for _ in range(args.repeat))
        print(f"{scenario.__name__:28s} {best / messages * 1e9:7.0f} ns/message  (batch {args.batch})")


if __name__ == "__main__":
    main()
