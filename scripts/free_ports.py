"""A free TCP port for a broker that a benchmark script starts, outside the kernel's ephemeral range.

Why: bind(0) hands out a port from the ephemeral range, where the members' own outgoing links
take theirs: a 7-member target of scripts/bench failed "the port is in use" at its start
(2026-12-07; maxq_raft/perf/ports.py says more). 16000-19999: below the tests' 20000-29999
(tests/conftest.py) and the jepsen-style lab's 30000-32000, above scripts/cluster's and the
RabbitMQ start scripts' fixed ports (scripts/bench_brokers/).
"""

from __future__ import annotations

import random

from maxq_raft.perf.ports import free_port_in, kernel_port

SCRIPT_PORTS = (16000, 20000)

_rng = random.Random()
_handed_out: set[int] = set()  # a port is never handed out twice by one script


def free_port() -> int:
    """A port free now (the kernel's choice only when the range is crowded)."""
    port = free_port_in(*SCRIPT_PORTS, _handed_out, _rng)
    return port if port is not None else kernel_port()
