"""Which machine a cluster member runs on: the host of its Raft address, resolved.

Several members may run on one machine (one per core, issue #19); the placement then keeps a
group's replicas on different machines (machines/replica_moves.py), so that losing a machine
loses no group's majority. Members are told apart by the host of their Raft address (`--peer`,
`--raft-addr`), resolved to an IP address where it resolves, so that a name and its address
count as one machine. At a cluster's first start the first placement proposed and committed
in the metadata group stands (server/first_placement.py), so members that resolve differently
still start one placement; the plans are made on the member asked.
"""

from __future__ import annotations

import ipaddress
import socket


def machine_of(host: str) -> str:
    """The machine `host` names: its IP address (canonical form), or the name in lower case
    when it does not resolve."""
    if is_ip(host):
        return str(ipaddress.ip_address(host))
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, UnicodeError, IndexError):
        return host.lower()


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
