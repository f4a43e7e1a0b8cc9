"""Maintenance mode (machines/maintenance.py) on a single node: refused, with RabbitMQ's kind of
answer, since no other member could take its clients; bad requests are 400; nothing changes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ..helpers import api

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def test_a_single_node_cannot_be_drained_and_says_why(start_broker):
    node = start_broker()
    name = api(node, "GET", "/api/overview")[1]["node"]
    status, answer, _ = api(node, "POST", "/api/cluster/drain", {"node": name})
    assert status == 409 and "single node cannot be drained" in answer["error"]
    for body in ({"node": name, "dry_run": 1}, {"node": "no spaces"}, {}):
        assert api(node, "POST", "/api/cluster/drain", body)[0] == 400, body
    assert api(node, "GET", "/api/nodes")[1][0]["being_drained"] is False
    result = subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{node.http_port}", "drain", name], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "409" in result.stderr and "single node" in result.stderr
    with node.connect() as connection:  # still serving
        connection.channel().queue_declare("", exclusive=True)
