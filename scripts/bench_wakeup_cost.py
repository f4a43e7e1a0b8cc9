#!/usr/bin/env python3
"""What waking up costs on this machine: the CPU of a small piece of Python run back to back
against the same piece run after a sleep, and of a hand-off between two threads over a socket
(the way a member's threads pass a message on) against the same hand-offs paced apart.

    .venv/bin/python scripts/bench_wakeup_cost.py [--gaps-ms 1,5,20] [--out FILE]

Why: at low message rates a 3-member cluster spends 4-6 ms of CPU per message, at full speed
about 25 us (docs/benchmarks.md, "What one message costs at low rates"). A message at a low rate
wakes a dozen or more sleeping threads across the members, and each wake-up then runs cold;
this script measures that cost alone, with no broker, so the figure can be compared between
machines. CPU is the process's user + system time (time.process_time), divided by the calls.
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import sys
import threading
import time


def work(steps: int) -> int:
    """A fixed piece of interpreter work: dictionary updates, as message handling does."""
    counts: dict[int, int] = {}
    for i in range(steps):
        counts[i % 97] = counts.get(i % 97, 0) + i
    return len(counts)


def cpu_per_call_us(steps: int, gap_s: float, calls: int) -> float:
    """CPU microseconds per call of work(steps), each call after sleeping gap_s (0: none)."""
    started = time.process_time()
    for _ in range(calls):
        work(steps)
        if gap_s:
            time.sleep(gap_s)
    return (time.process_time() - started) / calls * 1e6


def handoff_cpu_us(gap_s: float, round_trips: int) -> float:
    """CPU microseconds (both threads) per round trip of one byte between two threads over a
    socketpair, the answering thread doing work(20) before it answers; the sender sleeps
    gap_s between round trips (0: back to back)."""
    ours, theirs = socket.socketpair()

    def answer() -> None:
        for _ in range(round_trips):
            if not theirs.recv(1):
                return
            work(20)
            theirs.sendall(b"a")

    peer = threading.Thread(target=answer, name="answerer", daemon=True)
    peer.start()
    started = time.process_time()
    try:
        for _ in range(round_trips):
            ours.sendall(b"q")
            if not ours.recv(1):
                break
            if gap_s:
                time.sleep(gap_s)
        return (time.process_time() - started) / round_trips * 1e6
    finally:
        peer.join(timeout=5.0)
        ours.close()
        theirs.close()


def calls_for(gap_s: float, budget_s: float = 2.0, most: int = 20_000) -> int:
    """Enough calls for a stable mean within about budget_s of sleeping."""
    return most if not gap_s else max(50, min(most, int(budget_s / gap_s)))


def measure(gaps_s: list[float]) -> dict:
    rows: dict = {"work": [], "handoff": []}
    for steps in (20, 200, 2000):
        back_to_back_calls = 2000 if steps >= 2000 else calls_for(0.0)  # (the largest work: ~0.3 s)
        row: dict = {"steps": steps, "back_to_back_us": round(cpu_per_call_us(steps, 0.0, back_to_back_calls), 2)}
        for gap in gaps_s:
            row[f"after_{gap * 1e3:g}ms_us"] = round(cpu_per_call_us(steps, gap, calls_for(gap)), 2)
        rows["work"].append(row)
    handoff: dict = {"back_to_back_us": round(handoff_cpu_us(0.0, 20_000), 2)}
    for gap in gaps_s:
        handoff[f"after_{gap * 1e3:g}ms_us"] = round(handoff_cpu_us(gap, calls_for(gap)), 2)
    rows["handoff"].append(handoff)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gaps-ms", default="1,5,20", help="comma list of sleeps between calls, in ms")
    ap.add_argument("--out", help="append the result as one JSON line to this file")
    args = ap.parse_args()
    try:
        gaps_s = [float(g) / 1e3 for g in args.gaps_ms.split(",") if g.strip()]
    except ValueError:
        print(f"bench_wakeup_cost: --gaps-ms wants numbers, got {args.gaps_ms!r}", file=sys.stderr)
        return 2
    if not gaps_s or any(g <= 0 or g > 1.0 for g in gaps_s):
        print("bench_wakeup_cost: each gap must be above 0 and at most 1000 ms", file=sys.stderr)
        return 2
    rows = measure(gaps_s)
    for row in rows["work"]:
        cells = ", ".join(f"{k}: {v}" for k, v in row.items() if k != "steps")
        print(f"work({row['steps']}): {cells}")
    print("hand-off round trip: " + ", ".join(f"{k}: {v}" for k, v in rows["handoff"][0].items()))
    if args.out:
        line = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), **rows}
        with open(args.out, "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
