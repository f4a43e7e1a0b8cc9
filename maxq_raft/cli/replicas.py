"""`maxqctl placement`, `move-group GROUP --to NODES`, `rebalance` and `drain-replicas NODE`:
where the shard groups' replicas are, and moving them (issue #19), one replica at a time.

Each command reads the placement (GET /api/cluster/placement), works out its moves
(machines/replica_moves.py: `plan_moves` for rebalance and drain-replicas, which keep each
group's replica count, none on a leaving member, and spread the replicas within one per
member; for move-group, the members to gain and to lose the group, paired), prints the plan,
and without --dry-run makes the moves in turn (POST /api/cluster/move-group, answered when the
move is done), a line per move on stderr. A move that fails stops the run (exit 5): what was
done stays done, and the same command again plans what is left.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..machines.replica_moves import Move, applied, plan_moves
from .admin_client import CtlError, fetch

READ_TIMEOUT_S = 10.0
MOVE_TIMEOUT_S = 660.0  # one move: the node waits up to 600 s for it (a new replica may catch up a big log)
COMMANDS = ("placement", "move-group", "rebalance", "drain-replicas")


def add_commands(sub: Any, node_name: Callable[[str], str]) -> None:
    sub.add_parser("placement", help="the shard groups, the members holding each, the replicas per member")
    move = sub.add_parser("move-group", help="give a shard group these members, one replica move at a time")
    move.add_argument("group", metavar="GROUP")
    move.add_argument("--to", required=True, help="the members to hold it, comma-separated (as many as now)")
    rebalance = sub.add_parser(
        "rebalance", help="spread the groups' replicas evenly over the members (a member just added gets its share)"
    )
    drain = sub.add_parser("drain-replicas", help="move every replica off a member (to the others, evenly)")
    drain.add_argument("name", type=node_name, metavar="NODE")
    for command in (move, rebalance, drain):
        command.add_argument("--dry-run", action="store_true", help="print the plan and change nothing")


def _layout(
    node: str, planning: bool = False
) -> tuple[dict[str, list[str]], list[str], dict[str, str] | None, list[str], int]:
    """(group -> its members, the members, member -> its machine or None from a member that
    does not say: the plans then take each member as its own machine, the members the asked one
    cannot see, its --replication-factor or 0 when it does not say). `planning`: CtlError
    (exit 5) while the asked member cannot see every member's groups (the last item: those it
    cannot see) (one not reachable from
    it: the groups it does not hold would look short of that member's replicas, and a plan
    would add replicas that exist; a jepsen-style drain planned during a kill did)."""
    answer = fetch(node, "/api/cluster/placement", READ_TIMEOUT_S)
    placement = {g["group"]: list(g["members"]) for g in answer["groups"]}
    hosts = answer.get("hosts")
    unseen = answer.get("unreachable") or []
    if planning and unseen:
        raise CtlError(
            f"the placement is not known whole: {', '.join(unseen)} not reachable from {answer.get('node', node)}, "
            "whose view of the groups it does not hold comes through its links; run this again once "
            f"{'it is' if len(unseen) == 1 else 'they are'} back",
            5,
        )
    factor = answer.get("factor")
    return (
        placement,
        sorted(answer["replicas"]),
        dict(hosts) if isinstance(hosts, dict) else None,
        list(unseen),
        factor if type(factor) is int and factor > 0 else 0,
    )


def _to_moves(group: str, now: list[str], wanted: list[str]) -> list[Move]:
    adds = [m for m in wanted if m not in now]
    removes = [m for m in now if m not in wanted]
    moves = [Move(group, a, r) for a, r in zip(adds, removes, strict=False)]
    moves += [Move(group, a, None) for a in adds[len(removes) :]]
    moves += [Move(group, None, r) for r in removes[len(adds) :]]
    return moves


def settled_factor(placement: dict[str, list[str]]) -> int:
    """The groups' replica count (the most common one), once no group has more: a group with
    more is in the middle of a move (added, not yet removed), and a plan made now would remove a
    replica that move is about to remove too (a jepsen-style run's rebalance, asked while a
    drain's move still ran, left a group with 2). CtlError (exit 5) then: run it again later,
    or give that group its members with move-group."""
    factor = Counter(len(r) for r in placement.values()).most_common(1)[0][0]
    busy = sorted(g for g, replicas in placement.items() if len(replicas) > factor)
    if busy:
        raise CtlError(
            f"{', '.join(busy)} {'has' if len(busy) == 1 else 'have'} more than {factor} replicas: a move may be "
            "under way; run this again once it is done (or `maxqctl move-group GROUP --to ...`)",
            5,
        )
    return factor


def target_factor(placement: dict[str, list[str]], configured: int) -> int:
    """The replica count a plan brings every group to: the cluster's --replication-factor
    (`configured`; the plan then puts each group on every member when there are fewer), else
    the groups' own count (`settled_factor`, which also refuses while a move is under way).
    From the setting, not the count: a member removed from a cluster of 3 at factor 3 left each
    group with 2, and a rebalance after it was added back kept 2."""
    settled = settled_factor(placement)
    return configured or settled


def describe(move: Move) -> str:
    if move.add and move.remove:
        return f"{move.group}: {move.remove} -> {move.add}"
    return f"{move.group}: + {move.add}" if move.add else f"{move.group}: - {move.remove}"


def _table(placement: dict[str, list[str]], members: list[str], hosts: dict[str, str] | None = None) -> str:
    counts = Counter(m for replicas in placement.values() for m in replicas)
    lines = [
        f"{group}: {', '.join(replicas) or '(no member linked holds it)'}" for group, replicas in placement.items()
    ]
    lines.append("replicas per member: " + ", ".join(f"{m} {counts.get(m, 0)}" for m in members))
    machines: dict[str, list[str]] = {}
    for m in members:
        machines.setdefault((hosts or {}).get(m, m), []).append(m)
    if any(len(on) > 1 for on in machines.values()):  # several members on a machine: say which
        lines.append("members per machine: " + "; ".join(f"{h}: {' '.join(on)}" for h, on in sorted(machines.items())))
    return "\n".join(lines)


def run(args: argparse.Namespace, timeout_s: float | None) -> str | None:
    """What to print; None when `args` is another command."""
    if args.command not in COMMANDS:
        return None
    placement, members, hosts, unseen, configured = _layout(
        args.node, planning=args.command in ("rebalance", "drain-replicas")
    )
    if args.command == "placement":
        if getattr(args, "json", False):
            return json.dumps({"groups": placement, "hosts": hosts, "unreachable": unseen}, indent=1)
        table = _table(placement, members, hosts)
        if unseen:
            table += f"\nnot reachable from {args.node}: {', '.join(unseen)} (their replicas of the groups it does not hold are not shown)"
        return table
    if args.command == "move-group":
        if args.group not in placement:
            raise CtlError(f"no shard group {args.group!r} (groups: {', '.join(placement)})", 4)
        wanted = [m.strip() for m in args.to.split(",") if m.strip()]
        unknown = sorted(set(wanted) - set(members))
        if unknown:
            raise CtlError(f"not members of the cluster: {', '.join(unknown)} (members: {', '.join(members)})", 4)
        if not wanted or len(set(wanted)) != len(wanted):
            raise CtlError("--to needs distinct member names", 2)
        moves = _to_moves(args.group, placement[args.group], wanted)
    elif args.command == "drain-replicas":
        if args.name not in members:
            raise CtlError(f"{args.name} is not a member (members: {', '.join(members)})", 4)
        planned = leaving_moves(args.node, args.name)
        if planned is None:
            raise CtlError(
                f"every other member holds each group {args.name} holds: no replica can move (`maxqctl "
                f"remove-node {args.name}` takes it out of them, each then has one replica less)",
                4,
            )
        moves = planned
    else:
        moves = plan_moves(placement, members, target_factor(placement, configured), host_of=hosts)
    if args.dry_run:
        plan = [describe(move) for move in moves] or ["nothing to move"]
        after = applied(placement, moves)
        return "plan (dry run, nothing changed):\n  " + "\n  ".join(plan) + "\nafter:\n" + _table(after, members, hosts)
    return execute(args.node, moves, timeout_s)


def leaving_moves(node: str, member: str) -> list[Move] | None:
    """The moves that take every replica off `member` (the others keep each group's count), or
    None when every member holds every group, or there is no placement (a single node): nothing
    can move, and `maxqctl drain` only moves leaderships and clients."""
    try:
        placement, members, _hosts, _unseen, _configured = _layout(node)
    except CtlError:
        return None
    if all(len(replicas) >= len(members) for replicas in placement.values()):
        return None
    placement, members, hosts, _unseen, _configured = _layout(node, planning=True)  # (exit 5: one not reachable)
    factor = settled_factor(placement)  # (each group keeps the count it has: a drain moves, it adds none)
    if factor > len(members) - 1:
        raise CtlError(f"each group has {factor} replicas and only {len(members) - 1} members would be left", 5)
    return plan_moves(placement, members, factor, [member], hosts)


def rebalance(node: str, timeout_s: float | None) -> str:
    """`maxqctl rebalance` (and `add-node --rebalance`): plan the moves and make them."""
    placement, members, hosts, _unseen, configured = _layout(node, planning=True)
    return execute(node, plan_moves(placement, members, target_factor(placement, configured), host_of=hosts), timeout_s)


def groups_held(node: str, member: str) -> list[str]:
    """The shard groups `member` holds a replica of, as `node` sees them (a single node: none)."""
    try:
        placement, _members, _hosts, _unseen, _configured = _layout(node)
    except CtlError as exc:
        if exc.code == 4:  # (409: a single node, no placement)
            return []
        raise
    return [group for group, replicas in placement.items() if member in replicas]


def execute(node: str, moves: list[Move], timeout_s: float | None) -> str:
    """Make `moves` in turn, a line per move on stderr; the placement after them."""
    plan = [describe(move) for move in moves] or ["nothing to move"]
    print("plan:\n  " + "\n  ".join(plan), file=sys.stderr, flush=True)
    for number, move in enumerate(moves, 1):
        started = time.monotonic()
        print(f"[{number}/{len(moves)}] {describe(move)} ...", file=sys.stderr, flush=True)
        body = {"group": move.group, "add": move.add, "remove": move.remove}
        try:
            fetch(node, "/api/cluster/move-group", timeout_s or MOVE_TIMEOUT_S, "POST", body)
        except CtlError as exc:
            raise CtlError(f"move {number} of {len(moves)} ({describe(move)}) failed: {exc}", 5) from None
        print(f"[{number}/{len(moves)}] done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
    placement, members, hosts, _unseen, _configured = _layout(node)
    return f"{len(moves)} moves done\n" + _table(placement, members, hosts)
