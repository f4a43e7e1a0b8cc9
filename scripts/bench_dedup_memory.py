"""The memory of an x-message-deduplication window (docs/queue-features.md, "Deduplication").

Run from the repository: `.venv/bin/python scripts/bench_dedup_memory.py [ids]` (default
1,000,000). A queue machine with `x-cache-size` = ids is given that many publishes with
distinct 36-character ids (a UUID's text) through `Enqueue`, 1,000 at a time, and purged after
each batch, so only the window stays; tracemalloc measures what it holds. Also prints the size
of the window in a snapshot header (msgpack).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
import uuid

import msgpack

from maxq_raft.machines.commands import Enqueue, Purge
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import Meta

BATCH = 1000


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    ids = [str(uuid.UUID(int=i)) for i in range(count)]
    queue = QueueMachine("/", "q", settings=QueueSettings(deduplication=True, dedup_cache_size=count))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = 0
    for start in range(0, count, BATCH):
        n = min(BATCH, count - start)
        batch = [Message("", "q", b"", b"") for _ in range(n)]
        index += 1
        queue.apply(Meta(index, index), Enqueue(batch, [(p, "s" + ids[start + p], None) for p in range(n)]))
        index += 1
        queue.apply(Meta(index, index), Purge())  # the messages go: only the window stays
    del batch
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    window = queue.dedup_window
    assert window is not None
    print(f"ids in the window: {len(window.entries)}, slots: {len(window.order)}, queued: {queue.ready_count}")
    print(f"traced memory held: {held / 2**20:.1f} MiB, {held / count:.0f} bytes per id (37-character keys)")
    header = msgpack.packb(window.dump(), use_bin_type=True)
    print(f"in a snapshot header: {len(header) / 2**20:.1f} MiB, {len(header) / count:.0f} bytes per id")


if __name__ == "__main__":
    main()
