#!/usr/bin/env python3
"""Micro-benchmark of the deliveries a group's leader sends a member without the queue's replica
(server/remote.py): the leader's encoding of a run of deliveries and the member's decoding of it,
full records (snapshot.message_record) against short ones (remote.delivery_record).

    .venv/bin/python scripts/bench_remote_records.py [--messages 1000] [--body-bytes 128] [--repeat 7]

Prints the best time per 1,000 deliveries in milliseconds of `--repeat` rounds (the best is the
least disturbed by other processes), and the payload bytes. Only relative: compare the two kinds
on the same machine in the same run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from maxq_raft.machines.message import Message
from maxq_raft.machines.queue_types import Deliver
from maxq_raft.server import remote

CONSUMER_ID = "n2@3fa0c2d1/1/amq.ctag-1"
ROUNDS_PER_REPEAT = 20


class _Group:
    is_leader = True
    term = 1

    def member_ids(self) -> list[str]:
        return ["n1", "n3", "n4"]


class _Node:
    partial = True
    groups = {"shard-0": _Group()}

    def peer_held(self) -> dict[str, tuple[str, ...]]:
        return {}


def _effects(count: int, body_bytes: int) -> list:
    out = []
    for seq in range(count):
        message = Message("", "bench-q", b"\x80\x00\x02", b"x" * body_bytes, persistent=True)
        message.seq, message.delivery_count, message.sent_ms = seq, 1, 1_700_000_000_000
        out.append(Deliver(CONSUMER_ID, message, False))
    return out


def _sender(short: bool, payloads: list[bytes]) -> remote.Sender:
    sender = remote.Sender("n1", lambda _member, payload: payloads.append(payload))
    sender.node = _Node()
    sender.short_deliveries = lambda: short
    return sender


def _best_ms(run: Callable[[], None], repeat: int, per: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(ROUNDS_PER_REPEAT):
            run()
        best = min(best, (time.perf_counter() - start) / ROUNDS_PER_REPEAT)
    return best * 1000 * 1000 / per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--body-bytes", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    effects = _effects(args.messages, args.body_bytes)
    for short in (False, True):
        payloads: list[bytes] = []
        sender = _sender(short, payloads)

        def encode(sender: remote.Sender = sender) -> None:
            sender.take_deliveries("shard-0", effects)
            sender.flush()

        encode_ms = _best_ms(encode, args.repeat, args.messages)
        payload = payloads[-1]

        def decode(payload: bytes = payload) -> None:
            receiver = remote.Receiver()
            items, _gap = receiver.take("n1", payload)
            receiver.deliveries(items[0][1])

        decode_ms = _best_ms(decode, args.repeat, args.messages)
        kind = "short" if short else "full"
        print(
            f"{kind:5} records: encode {encode_ms:.2f} ms, decode {decode_ms:.2f} ms per 1,000 deliveries; "
            f"{len(payload) / args.messages:.0f} bytes each"
        )


if __name__ == "__main__":
    main()
