"""A free TCP port for a broker that a benchmark script starts, outside the kernel's ephemeral range.

Why: bind(0) hands out a port from the ephemeral range, and between the pick and the broker's
own bind any outgoing connection (the members' Raft links, the load generator's) may take it
as its local port: a 7-member target of scripts/bench failed "the port is in use" at its start
(2026-12-07). Below that range only listeners compete, and a port is never handed out twice
by one script. 16000-19999: below the tests' 20000-29999 (tests/conftest.py, which does the
same) and the jepsen-style lab's 30000-32000, above scripts/cluster's and the RabbitMQ start
scripts' fixed ports (scripts/bench_brokers/).
"""

from __future__ import annotations

import random
import socket

SCRIPT_PORTS = (16000, 20000)
PICKS_MAX = 200  # bounded; each try is one bind

_rng = random.Random()
_handed_out: set[int] = set()


def free_port() -> int:
    """A port free now that this process has not handed out before (the kernel's choice only
    when the range is crowded)."""
    low, high = SCRIPT_PORTS
    for _ in range(PICKS_MAX):
        port = _rng.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
