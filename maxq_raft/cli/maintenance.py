"""`maxqctl drain NODE [--dry-run]` and `maxqctl revive NODE`: maintenance mode
(machines/maintenance.py) through POST /api/cluster/drain and /api/cluster/revive.

`drain` prints the plan (the groups NODE leads, whose leaderships move; its client connections
close; with groups on a few members, its replicas, which move to the others: replicas.py), then,
without --dry-run, records the drain and waits, with a progress line, until NODE leads no group
(at most --timeout, default HAND_OVER_TIMEOUT_S), then moves its replicas one at a time; NODE
may then be stopped (and removed: `maxqctl remove-node`).
`revive` lets NODE serve clients and lead again (the others' balancing gives it leaderships back).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from . import progress, replicas
from .admin_client import CtlError, fetch

HAND_OVER_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 20.0  # the drain or revive itself: the node commits it within 15 s or says why
POLL_EVERY_S = 0.5
STATUS_TIMEOUT_S = 2.0


def add_commands(sub: Any, node_name: Callable[[str], str]) -> None:
    drain = sub.add_parser(
        "drain", help="put a member under maintenance: its clients go to other members, its leaderships move"
    )
    drain.add_argument("name", type=node_name, metavar="NODE")
    drain.add_argument("--dry-run", action="store_true", help="print what would change and change nothing")
    revive = sub.add_parser("revive", help="end a member's maintenance: it serves clients and leads again")
    revive.add_argument("name", type=node_name, metavar="NODE")
    for command in (drain, revive):
        command.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")


def _led_by(status: dict, node: str) -> list[str]:
    return [g["group"] for g in status.get("groups", []) if g.get("leader") == node]


def run(args: argparse.Namespace, timeout_s: float | None) -> str | None:
    """What to print; None when `args` is another command."""
    if args.command not in ("drain", "revive"):
        return None
    draining = args.command == "drain"
    dry_run = draining and args.dry_run
    body = {"node": args.name, "dry_run": dry_run}
    # Groups on a few members: its replicas move too, after its leaderships (replicas.py). A plan
    # that cannot be made now (a move under way) does not stop the drain itself: its reason is
    # the command's error once the leaderships have moved.
    moves, unplanned = None, None
    if draining:
        try:
            moves = replicas.leaving_moves(args.node, args.name)
        except CtlError as exc:
            unplanned = exc
    answer = fetch(args.node, f"/api/cluster/{args.command}", REQUEST_TIMEOUT_S, "POST", body)
    leads = ", ".join(answer.get("leads", [])) or "no group"
    if dry_run:
        plan = (
            f"drain {args.name} (dry run, nothing changed): it leads {leads}; those leaderships would move "
            f"to the members not drained, its client connections would close and new ones be refused"
        )
        if moves is not None:
            plan += "; its replicas would move: " + (", ".join(map(replicas.describe, moves)) or "it holds none")
        elif unplanned is not None:
            plan += f"; its replicas cannot be planned now: {unplanned}"
        return json.dumps({**answer, "moves": [list(m) for m in moves or []]}, indent=1) if args.json else plan
    if not draining:
        said = "revived" if answer.get("changed") else "was not under maintenance"
        return json.dumps(answer, indent=1) if args.json else f"{args.name} {said}: it serves clients and leads again"
    deadline = time.monotonic() + (timeout_s or HAND_OVER_TIMEOUT_S)

    def handed_over() -> list[str]:
        while True:  # bounded by the deadline
            left = _led_by(fetch(args.node, "/api/cluster/status", STATUS_TIMEOUT_S), args.name)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(POLL_EVERY_S)

    left = progress.wait_with_progress(
        handed_over,
        lambda: fetch(args.node, "/api/cluster/status", STATUS_TIMEOUT_S),
        lambda status: f"{len(_led_by(status, args.name))} groups still led by {args.name}",
        f"draining {args.name}",
        sys.stderr,
    )
    if left:
        raise CtlError(f"{args.name} is under maintenance but still leads {', '.join(left)}: see its log", 5)
    if unplanned is not None:
        raise CtlError(
            f"{args.name} is drained (no leadership, no client) but its replicas did not move: {unplanned}", 5
        )
    moved = ""
    if moves:
        moved = replicas.execute(args.node, moves, timeout_s) + "\n"
    if args.json:
        return json.dumps({**answer, "still_leads": left, "moves": [list(m) for m in moves or []]}, indent=1)
    holds = " and holds no replica" if moves is not None else ""
    return moved + (
        f"{args.name} drained: it leads no group{holds} and serves no client; it can be stopped "
        "(revive: maxqctl revive)"
    )
