"""Giving the C allocator's free pages back to the operating system.

Why: glibc's malloc keeps memory that was freed in its arenas for reuse and returns it to the OS
only from the top of a heap. RocksDB's flushes (a 4 MiB memtable written out by a background
thread, the blocks read back into the cache) and bursts of large message bodies free megabytes
in the middle of those heaps, so the node's RSS rises by a step at each flush and never comes
down, although the memory is free: under the fuzz run (docs/reliability.md) RSS went 54 -> 96 MiB
while Python's heap and RocksDB's own figures stayed flat, and a `malloc_trim` gave 13 MiB of a
flush's step back at once. RabbitMQ's answer to the same problem on its side is a periodic
garbage collection of its processes.

So the node asks glibc to release its free pages (`malloc_trim(0)`: every arena, pages inside
the heaps too) every TRIM_INTERVAL_S, on a worker thread so that the event loop does not wait
while it walks the arenas, and the memory alarm asks at each sample while it is on (alarms.py):
what has been freed must not keep publishers blocked. Other C libraries (musl) have no
`malloc_trim`; there this does nothing.

Cost: glibc walks each arena under its lock, so an allocation on the event loop's thread may
wait for the trim of its arena. Measured on this machine: 7-8 ms for a heap of 130 MiB with half
of it freed in 600-4,000-byte holes (a worst case; the fuzzed node's heap is ~60 MiB), once every
30 s: a latency blip of a few ms at most, twice a minute.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import trio

TRIM_INTERVAL_S = 30.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        # The symbols this process already has (the C library among them).
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
        return trim  # glibc only
    except (OSError, AttributeError):
        return None


_malloc_trim = _load_malloc_trim()


def return_free_heap_to_os() -> None:
    """Give the C allocator's free pages back to the OS, where the C library can (glibc)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


async def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> None:
    """Release the free heap every `interval_s`, for as long as the node runs."""
    if _malloc_trim is None:
        return
    while True:
        await trio.sleep(interval_s)
        await trio.to_thread.run_sync(return_free_heap_to_os)
