"""Placement: the shard groups, the members that hold each, and the group each queue lives in,
as a replicated record of the metadata group (issue #19; step 2 of docs/scale-out-plan.md).

Why: a queue's group was a hash of its vhost and name over the member's own count of shard
groups, worked out again by every member at every use. Moving groups, adding groups and
placing them on a few members (the later steps) need the answer kept, not derived: a queue must
stay in the group it was made in when the list of groups changes. So, behind the `placement`
feature flag (machines/features.py), the metadata machine keeps the list of shard groups with
each group's replicas (`SetGroups`, proposed by the metadata group's leader whenever the
engine's memberships differ from the record: server/watchdog.py), and every queue record
carries its group: a queue declared while a list is recorded takes the group its name hashes to
over that list (`hash_group`, the same as the hash used before, so a cluster that enables the
feature keeps its layout), and the first list recorded places every queue that exists then.
A queue record without a group (a single node, or a cluster before the feature) lives where the
hash over the member's own groups says (server/cluster.py, `group_of`).

The queue leader locator (RabbitMQ's `x-queue-leader-locator` argument, `queue-leader-locator`
policy key, and `--queue-leader-locator` here for the default): "balanced" is the hash above;
"client-local" puts a new queue in a group led by the member that declares it (else one it
holds), so that its clients' publishes and deliveries skip a hop, and a member holding no
replica of the hashed group serves them from its own. The member's choice must be the one
every member routes by before the queue's record exists, because the queue's machine is made
in its group first (server/command_log.py): so it is recorded first, `PlaceQueue`, first
placement wins (two members declaring one new queue at once end in one group), and the
declare then names the group its member made the machine in (DeclareQueue.group). A placement
stays until a declare of its name uses it, made or refused (one whose declare never came, its
member stopped or its shard unavailable, only says where that name goes when declared), or its
vhost goes, or its group leaves the list.

With every group on every member the record follows the engine. With groups on a few members
(--replication-factor) the record comes first: the first placement is chosen in the metadata
group (`FirstGroups`: the first proposed and committed stands) and every member starts the
groups it lists for it (server/first_placement.py); later the record follows the engine again as
replicas move (server/watchdog.py). A list that would drop a group still holding a queue is
refused.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .partitions import parent_of

FEATURE = "placement"
LOCATOR_FEATURE = "queue_locator"  # PlaceQueue: an earlier release stops at it (features.py)

LOCATOR_ARGUMENT = "x-queue-leader-locator"
CLIENT_LOCAL = "client-local"
BALANCED = "balanced"
# RabbitMQ 3.10's values, and 3.12's "balanced" (for which "random" and "least-leaders" stand
# since): every value but client-local is the hash here.
LOCATORS = (CLIENT_LOCAL, BALANCED, "random", "least-leaders")


class SetGroups(NamedTuple):
    groups: list[Any]  # [[group name, [member, ...]], ...]: every shard group, in order, and its replicas


class FirstGroups(NamedTuple):
    """A member's choice of the first placement (as SetGroups), proposed at a cluster's first
    start by every member that waits for one (server/first_placement.py): recorded only while
    none is, so the first committed is the cluster's, whatever the others chose."""

    groups: list[Any]


class PlaceQueue(NamedTuple):
    """A member's choice of the group for a queue not declared yet (what its
    x-queue-leader-locator says), recorded unless the queue or an earlier placement of it
    exists: the reply is the group the queue goes to (None: no shard groups recorded yet)."""

    vhost: str
    name: str
    group: str


def local_group(
    vhost: str, name: str, groups: Sequence[str], leads: Callable[[str], bool], holds: Callable[[str], bool]
) -> str | None:
    """The group a member puts a new queue in for client-local: one of the `groups` it leads,
    else of those it holds, picked by the hash of the queue's name (so that its queues spread
    over them); None if it holds none."""
    for mine in (leads, holds):
        candidates = [group for group in groups if mine(group)]
        if candidates:
            return candidates[hash_index(vhost, name, len(candidates))]
    return None


def hash_group(vhost: str, name: str, groups: Sequence[str]) -> str:
    """The group a queue's vhost and name hash to among `groups` (a non-empty list, in order);
    partition i of a partitioned queue (partitions.py), the group i after its parent's, so
    that its partitions are in as many groups as there are."""
    return groups[hash_index(vhost, name, len(groups))]


def hash_index(vhost: str, name: str, count: int) -> int:
    """`hash_group`'s choice as an index into a list of `count` groups."""
    partition = parent_of(name)
    if partition is not None:
        parent, index = partition
        return (zlib.crc32(vhost.encode() + b"\0" + parent.encode()) + index) % count
    return zlib.crc32(vhost.encode() + b"\0" + name.encode()) % count


def groups_refusal(groups: object, holding: Mapping[str, int]) -> str | None:
    """Why `groups` (a SetGroups' list) cannot be recorded (None: it can): a non-empty list of
    distinct group names, each with a non-empty list of distinct member names, that keeps every
    group in `holding` (group -> how many queues it holds)."""
    if type(groups) is not list or not groups:
        return f"the shard groups must be a non-empty list, not {groups!r}"[:200]
    names: set[str] = set()
    for item in groups:
        if type(item) is not list or len(item) != 2:
            return f"each shard group must be [name, [member, ...]], not {item!r}"[:200]
        name, members = item
        if type(name) is not str or not name or name in names:
            return f"shard group names must be distinct names, not {name!r}"[:200]
        if (
            type(members) is not list
            or not members
            or not all(type(m) is str and m for m in members)
            or len(set(members)) != len(members)
        ):
            return f"shard group {name} needs a list of distinct member names, not {members!r}"[:200]
        names.add(name)
    dropped = sorted(group for group, count in holding.items() if count and group not in names)
    if dropped:
        return f"shard group {dropped[0]} still holds {holding[dropped[0]]} queues: it cannot leave the list"
    return None
