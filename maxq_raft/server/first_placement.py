"""The first placement of a cluster whose groups are held by a few members (issue #19): chosen
in the metadata group, not by each member.

Why: each member used to work out the first placement from its own --peer list and
--replication-factor. Members given different ones (or resolving a host name differently)
started different replica sets of one group, and each set could elect a leader of it: two
logs for one group, which nothing checked. Now, at a cluster's first start, a member with
--replication-factor below the number of members starts holding the metadata group only
(replication/group_set.py, `placement_pending`) and, before it serves anyone:

1. commits its Down in the metadata group: what was committed before is then applied here;
2. while the metadata machine records no placement, proposes its own choice (`FirstGroups`,
   recorded only while none is: the first committed stands, the later ones change nothing);
3. starts the shard groups the recorded placement gives it, with the members recorded for
   each (ReplicationNode.start_groups), as at a first start.

A member that starts later, or again before it got there, does the same and finds the record
as it is then, replica moves included. From then on the record follows the engine
(watchdog.py, `_record_placement`).

`FirstGroups` is proposed without waiting for a feature flag (machines/features.py): only
members at a cluster's first start propose it, and a member of a release without it stops at
it (NewerEntry) rather than start a placement of its own.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ..machines.metadata import META_GROUP
from ..machines.placement import FirstGroups
from ..machines.replica_moves import first_placement

log = logging.getLogger("maxq.cluster")

PROPOSE_AGAIN_S = 10.0  # the proposer retries an entry this long (proposer.OUTCOME_WAIT_S)
RECORD_POLL_S = 0.05  # how often the metadata machine's record is looked at while none is
WAITING_SAID_AFTER_S = 5.0


def choice(
    shards: list[str], addresses: dict[str, tuple[str, int]], factor: int, hosts: dict[str, str]
) -> list[list[Any]]:
    """This member's proposal: `first_placement` over the members it knows of (each with the
    machine its Raft address names), as `FirstGroups` carries it."""
    placement = first_placement(shards, list(addresses), factor, hosts)
    return [[group, list(placement[group])] for group in shards]


async def take_first_placement(cluster: Any, proposal: list[list[Any]], own_address: tuple[str, int]) -> str | None:
    """Steps 1-3 above for `cluster` (the ClusterLog) while its node waits for the first
    placement. None once its groups are started, else why they cannot be (a restart would meet
    the same: the placement names a member whose Raft address this member was not given)."""
    node = cluster.node
    log.info("node %s: waiting for the cluster's first placement of the shard groups", cluster.node_id)
    await cluster.barrier([META_GROUP])
    meta = cluster.broker.meta
    started = proposed_at = trio.current_time()
    cluster.submit(None, FirstGroups(proposal), None)
    said = False
    while not meta.shard_groups:  # until the record comes (stopping cancels the wait)
        await trio.sleep(RECORD_POLL_S)
        now = trio.current_time()
        if now - proposed_at >= PROPOSE_AGAIN_S:
            proposed_at = now
            cluster.submit(None, FirstGroups(proposal), None)
        if not said and now - started >= WAITING_SAID_AFTER_S:
            said = True
            log.info("node %s: no placement recorded yet: proposing this member's again", cluster.node_id)
    members_of: dict[str, dict[str, tuple[str, int]]] = {}
    for group, members in meta.shard_groups.items():
        if cluster.node_id not in members:
            continue
        addresses = {}
        for member in members:
            address = own_address if member == cluster.node_id else node.peer_address(member)
            if address is None:
                return f"the cluster's placement puts {group} on {member}, whose Raft address is not among --peer"
            addresses[member] = address
        members_of[group] = addresses
    error = await cluster.hub_answer(lambda done: node.start_groups(members_of, done))
    if error is None:
        log.info(
            "node %s: holds %s of the cluster's first placement",
            cluster.node_id,
            ", ".join(sorted(members_of)) or "no shard group",
        )
    return error
