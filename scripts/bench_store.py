#!/usr/bin/env python3
"""Benchmark RocksSegmentStore the way a deep queue uses it (not a test; prints numbers).

Writes N records of R bytes into one queue in batches of B (as put_batch would receive them from
the shell), printing the write rate and process RSS every 500,000 records; then times bounds(), a
scan of the first 1,000, delete_range of the first 90 % (an acked prefix), the head after it, a
stream of small prefix acks, close, reopen, and compaction. Run with the project venv:

    .venv/bin/python scripts/bench_store.py [--records 2000000] [--no-wal] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from maxq_raft.storage import RocksSegmentStore

PROGRESS_EVERY_RECORDS = 500_000
QUEUE_ID = 1


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def disk_mib(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total / 2**20


def timed(label: str, fn):
    t0 = time.perf_counter()
    result = fn()
    print(f"{label:<44} {(time.perf_counter() - t0) * 1e3:10.2f} ms", flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--no-wal", action="store_true", help="wal=False (the Raft journal is the durable record)")
    parser.add_argument("--dir", help="parent folder for the store (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the store folder afterwards")
    args = parser.parse_args()
    n, size, batch_size = args.records, args.record_bytes, args.batch
    assert n % batch_size == 0 and n >= PROGRESS_EVERY_RECORDS

    parent = tempfile.mkdtemp(prefix="maxq-bench-store-", dir=args.dir)
    path = os.path.join(parent, "store")
    wal = not args.no_wal
    print(f"RocksSegmentStore wal={wal}: {n:,} records x {size} B in batches of {batch_size}, at {path}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, RSS at start {rss_mib():.0f} MiB", flush=True)
    try:
        store = RocksSegmentStore(path, wal=wal)
        record = os.urandom(size)
        t0 = t_mark = time.perf_counter()
        written = written_mark = 0
        while written < n:
            store.put_batch([(QUEUE_ID, seq, record) for seq in range(written, written + batch_size)])
            written += batch_size
            if written % PROGRESS_EVERY_RECORDS == 0:
                now = time.perf_counter()
                print(
                    f"  {written:>10,} written  {(written - written_mark) / (now - t_mark):>9,.0f} records/s "
                    f"(interval)  {written / (now - t0):>9,.0f} records/s (overall)  RSS {rss_mib():6.0f} MiB",
                    flush=True,
                )
                t_mark, written_mark = now, written
        elapsed = time.perf_counter() - t0
        print(
            f"write: {n / elapsed:,.0f} records/s, {n * size / elapsed / 1e6:.0f} MB/s, {elapsed:.1f} s; "
            f"RSS {rss_mib():.0f} MiB; disk {disk_mib(path):.0f} MiB",
            flush=True,
        )

        timed("flush()", store.flush)
        b = timed("bounds()", lambda: store.bounds(QUEUE_ID))
        assert b == (0, n - 1), b
        head = timed("scan(first 1,000)", lambda: store.scan(QUEUE_ID, 0, 1000))
        assert len(head) == 1000 and head[0][0] == 0
        cut = n * 9 // 10
        timed("delete_range(first 90 %)", lambda: store.delete_range(QUEUE_ID, 0, cut))
        b = timed("bounds() after delete_range", lambda: store.bounds(QUEUE_ID))
        assert b == (cut, n - 1), b
        head = timed("scan(1,000 from seq 0) after delete_range", lambda: store.scan(QUEUE_ID, 0, 1000))
        assert head[0][0] == cut

        # Acks arriving as many small prefixes (1,000 delete_ranges of 100 records).
        t_acks = time.perf_counter()
        for i in range(1000):
            store.delete_range(QUEUE_ID, cut + i * 100, cut + (i + 1) * 100)
        print(f"{'1,000 x delete_range(100 records)':<44} {(time.perf_counter() - t_acks) * 1e3:10.2f} ms", flush=True)
        head_seq = cut + 100_000
        b = timed("bounds() after 1,000 small delete_ranges", lambda: store.bounds(QUEUE_ID))
        assert b == (head_seq, n - 1), b
        head = timed("scan(1,000) after 1,000 small delete_ranges", lambda: store.scan(QUEUE_ID, head_seq, 1000))
        assert head[0][0] == head_seq

        timed("close()", store.close)
        store = timed("reopen (RocksSegmentStore(path))", lambda: RocksSegmentStore(path, wal=wal))
        moves = store.iterator_moves
        b = timed("bounds() after reopen", lambda: store.bounds(QUEUE_ID))
        assert b == (head_seq, n - 1), b
        ids = timed("queue_ids() after reopen", store.queue_ids)
        assert ids == [QUEUE_ID]
        print(f"iterator moves for bounds() + queue_ids() after reopen: {store.iterator_moves - moves}")
        print(f"RSS {rss_mib():.0f} MiB; disk before compaction {disk_mib(path):.0f} MiB", flush=True)
        timed("compact()", store.compact)
        print(f"disk after compaction {disk_mib(path):.0f} MiB (live: {n - head_seq:,} records)")
        store.close()
    finally:
        if args.keep:
            print(f"kept {parent}")
        else:
            shutil.rmtree(parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
