"""Store fixtures: every behavioural test runs against each implementation and RocksDB mode."""

from __future__ import annotations

import pytest

from maxq_raft.storage import MemorySegmentStore, RocksSegmentStore

STORE_KINDS = ["memory", "rocks", "rocks-nowal"]


def open_store(kind: str, path):
    if kind == "memory":
        return MemorySegmentStore("test")
    if kind == "rocks":
        return RocksSegmentStore(path)
    if kind == "rocks-nowal":
        return RocksSegmentStore(path, wal=False)
    raise AssertionError(kind)


@pytest.fixture(params=STORE_KINDS)
def store(request, tmp_path):
    s = open_store(request.param, tmp_path / "store")
    try:
        yield s
    finally:
        s.close()
