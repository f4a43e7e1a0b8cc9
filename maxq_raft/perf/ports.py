"""A free TCP port on loopback, taken from a given range, for the brokers that tests, benchmark
scripts and the jepsen-style lab start.

Why a range, not bind(0): the kernel hands out bind(0)'s port from its ephemeral range, and
between the pick and the broker's own bind any outgoing connection (the members' Raft links,
the clients') may take it as its local port ("the port is in use" at a start under load).
Below that range only listeners compete. Each user keeps its own range (tests/conftest.py,
scripts/free_ports.py, jepsen-style's lab.py) so that they never pick each other's ports, and
its own set of ports handed out: a port is only free until its broker binds it, so two picks
in a row could otherwise return the same number.
"""

from __future__ import annotations

import random
import socket

TRIES_MAX = 200  # bounded; each try is one bind


def free_port_in(low: int, high: int, taken: set[int], rng: random.Random, tries: int = TRIES_MAX) -> int | None:
    """A port of [low, high) that binds now and is not in `taken` (added to it), else None
    after `tries` attempts."""
    for _ in range(tries):
        port = rng.randrange(low, high)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    return None


def kernel_port() -> int:
    """A port the kernel picks (bind(0)), from its ephemeral range: the fallback when a range is
    crowded, with the risk the module's docstring says."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
