#!/usr/bin/env python3
"""What deduplication (x-message-deduplication) costs per message: the broker's own work, no I/O.

    .venv/bin/python scripts/bench_dedup_cost.py [--batch 64] [--batches 2000] [--repeat 7]

Two parts of a publish change when its queue deduplicates (issue #21, part 3):
- the session reads the `x-deduplication-header` out of the message's properties
  (`publish_extras.dedup_fields`: a byte search, then a decode of the properties);
- the queue machine looks the id up in its window and records it (`machines/dedup.py`), with the
  window at its bound (`x-cache-size`), so every new id also evicts the oldest.

Each scenario applies the same prepared commands to a fresh machine `--repeat` times and prints
the best CPU time per message (process time: the least disturbed by other processes), for a plain
queue with plain publishes, for a deduplicating queue with unique ids, and for a plain queue fed
by an x-message-deduplication exchange (its window kept in the queue, at the same size). Compare with what a
whole publish costs the broker (`broker_cpu_s_per_M_pub` of scripts/bench's s1 runs, in µs per
message) to read the share.
"""

from __future__ import annotations

import argparse
import time

from maxq_raft.amqp.properties import BasicProperties, encode_properties
from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import Meta
from maxq_raft.server.publish_extras import HEADERS_FLAG, dedup_fields

WINDOW = 100_000  # the default x-cache-size


def props(i: int, with_id: bool) -> bytes:
    headers = {"x-deduplication-header": f"order-{i:012d}"} if with_id else {"app": "bench"}
    return encode_properties(BasicProperties(delivery_mode=1, headers=headers))


def commands(n_batches: int, batch: int, dedup: bool, exchange: bool = False) -> list:
    out = []
    scope = ("dedup-exchange", WINDOW, None) if exchange else ()  # (machines/dedup.py: ExchangeScope)
    for b in range(n_batches):
        messages = [Message("", "q", props(b * batch + k, dedup), b"x" * 100, False) for k in range(batch)]
        ids = None
        if dedup:
            ids = [(k, f"order-{b * batch + k:012d}", None, *scope) for k in range(batch)]
        out.append(qc.Enqueue(messages, ids))
    return out


def machine(queue_window: bool) -> QueueMachine:
    m = QueueMachine("/", "q")
    if queue_window:
        m.apply(Meta(0, 0), qc.UpdateSettings(QueueSettings(deduplication=True, dedup_cache_size=WINDOW)))
    return m


def apply_seconds(n_batches: int, batch: int, dedup: bool, exchange: bool = False) -> float:
    prepared = commands(n_batches, batch, dedup, exchange)
    m = machine(dedup and not exchange)
    start = time.process_time()
    for i, command in enumerate(prepared):
        m.apply(Meta(i + 1, i), command)
        if i % 16 == 15:
            m.apply(Meta(i + 1, i), qc.Purge())  # keep the ready queue small: the window stays
    return time.process_time() - start


def header_seconds(n: int, dedup: bool) -> float:
    raws = [props(i, dedup) for i in range(n)]
    start = time.process_time()
    for raw in raws:
        dedup_fields(HEADERS_FLAG, raw)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    n = args.batch * args.batches
    for name, fn in (
        ("machine apply", lambda d: apply_seconds(args.batches, args.batch, d)),
        ("header read", lambda d: header_seconds(n, d)),
    ):
        best = {d: min(fn(d) for _ in range(args.repeat)) / n * 1e9 for d in (False, True)}
        print(
            f"{name}: plain {best[False]:.0f} ns/msg, deduplicating {best[True]:.0f} ns/msg, "
            f"+{best[True] - best[False]:.0f} ns/msg ({n} messages, best of {args.repeat})"
        )
    by_exchange = min(apply_seconds(args.batches, args.batch, True, True) for _ in range(args.repeat)) / n * 1e9
    print(f"machine apply, ids through an x-message-deduplication exchange: {by_exchange:.0f} ns/msg")


if __name__ == "__main__":
    main()
