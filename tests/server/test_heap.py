"""heap.py: freed C heap that glibc keeps goes back to the OS when asked."""

from __future__ import annotations

import ctypes
import platform

import pytest

from maxq_raft.server import heap
from maxq_raft.server.alarms import rss_bytes

CHUNK_BYTES = 100 << 10  # under glibc's mmap threshold (128 KiB at start): from the heap, not mmap
CHUNKS = 300  # ~29 MiB


@pytest.mark.skipif(heap._malloc_trim is None or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_heap_in_the_middle_of_an_arena_is_returned() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    chunks = [libc.malloc(CHUNK_BYTES) for _ in range(CHUNKS)]
    for chunk in chunks:
        ctypes.memset(chunk, 1, CHUNK_BYTES)  # resident
    # Every other chunk freed: each free one lies between two in use, so it can neither merge
    # into the heap's top nor be trimmed from it; it stays resident until asked for.
    freed, kept = chunks[0::2], chunks[1::2]
    try:
        for chunk in freed:
            libc.free(chunk)
        before = rss_bytes()
        heap.return_free_heap_to_os()
        after = rss_bytes()
    finally:
        for chunk in kept:
            libc.free(chunk)
    freed_bytes = len(freed) * CHUNK_BYTES
    assert before - after > freed_bytes // 2, (before >> 20, after >> 20, freed_bytes >> 20)
