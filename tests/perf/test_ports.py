"""maxq_raft/perf/ports.py: a port from a range, free now, never one already handed out."""

from __future__ import annotations

import random
import socket

from maxq_raft.perf.ports import free_port_in, kernel_port


def _bound_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


def test_a_port_in_use_or_handed_out_is_never_returned_and_the_pick_is_recorded() -> None:
    with _bound_port() as busy, _bound_port() as other:
        in_use = busy.getsockname()[1]
        # a range of one port that is bound: nothing, after the tries
        assert free_port_in(in_use, in_use + 1, set(), random.Random(1), tries=20) is None
        # a port already handed out is skipped, free or not (its broker may not have bound it yet)
        handed_out = other.getsockname()[1]
        other.close()
        assert free_port_in(handed_out, handed_out + 1, {handed_out}, random.Random(1), tries=20) is None


def test_picks_in_a_row_differ_and_stay_in_the_range() -> None:
    taken: set[int] = set()
    rng = random.Random(7)
    picks = [free_port_in(16000, 20000, taken, rng) for _ in range(20)]
    assert all(p is not None and 16000 <= p < 20000 for p in picks)
    assert len(set(picks)) == 20 and taken == set(picks)


def test_the_kernels_port_binds_at_once() -> None:
    port = kernel_port()
    assert 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # free a moment later, as a broker would find it
