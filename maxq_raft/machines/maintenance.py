"""Maintenance mode: members being drained, a replicated record of the metadata group.

RabbitMQ's `rabbitmq-upgrade drain` / `revive` (behind its `maintenance_mode_status` feature
flag): a member under maintenance serves no clients and leads nothing, so that it can be stopped
or upgraded without its clients or its groups' leaders going with it. Here the metadata machine
keeps the list of members being drained (`SetMaintenance`, gated by the `maintenance_mode`
feature flag: machines/features.py); each member acts on its own entry (server/watchdog.py): it
closes its client connections and refuses new ones, hands the leadership of every group it
leads to a member not being drained, and is never chosen as a leader by the others' balancing.
Every group keeps its replica on a drained member (each group is on every member until
placement, issue #19, lets a member hold none).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import NamedTuple

FEATURE = "maintenance_mode"
# What a drained member tells its clients (AMQP 320 CONNECTION_FORCED, SQS 503 ServiceUnavailable)
DRAINING_TEXT = "this node is being drained for maintenance; connect to another node"


class SetMaintenance(NamedTuple):
    node: str
    draining: bool  # True: drain `node`; False: revive it


def drain_refusal(node: str, members: Collection[str], draining: Collection[str]) -> str | None:
    """Why `node` may not be drained now (None: it may): it must be a member, and some other
    member must be left to serve clients and lead."""
    if node not in members:
        return f"node {node} is not a member of the cluster (members: {', '.join(sorted(members))})"
    if all(member == node or member in draining for member in members):
        return f"draining {node} would leave no member to serve clients and lead the groups"
    return None


def leader_target(
    candidates: Collection[str], draining: Collection[str], up: Collection[str], leads: Mapping[str, int]
) -> str | None:
    """The member to hand a leadership to: up, not being drained, leading fewest groups (by
    name on a tie, so every turn picks alike); None when there is none."""
    fit = [member for member in candidates if member in up and member not in draining]
    return min(fit, key=lambda member: (leads.get(member, 0), member)) if fit else None
