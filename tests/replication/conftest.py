"""The `cluster` fixture: make(ids, groups, **kw) -> a Cluster of engine processes
(test_engine_cluster.py), every one killed when the test ends."""

from __future__ import annotations

import pytest

from .test_engine_cluster import Cluster


@pytest.fixture
def cluster(tmp_path):
    made: list[Cluster] = []

    def make(ids, groups, **kw) -> Cluster:
        c = Cluster(tmp_path, ids, groups, **kw)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
