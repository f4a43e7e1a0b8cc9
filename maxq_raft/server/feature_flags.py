"""The shell of feature flags (machines/features.py): enable what every member supports.

One task per node, the same for a single node and a cluster: every ENABLE_EVERY_S, on the node
that leads the metadata group, the features this code supports that every other member of the
metadata group announced over a link that is up now, and that are not enabled yet, are enabled
by one `EnableFeatures` through the metadata group. A single node (a one-member log with no
peers) enables all of its own on the first turn. Nothing is proposed again while a proposal is
out, for at most PROPOSAL_WAIT_S.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ..machines.features import SUPPORTED, EnableFeatures, features_to_enable
from ..machines.metadata import META_GROUP

log = logging.getLogger("maxq.features")

ENABLE_EVERY_S = 1.0
PROPOSAL_WAIT_S = 10.0


def supported_everywhere(broker: Any) -> list[str]:
    """The features not enabled yet that this code and every other member (linked now) support."""
    command_log = broker.log
    node = command_log.replication_node
    announced = node.peer_features() if node is not None else {}
    others = [member for member in command_log.members() if member != broker.node_id]
    return features_to_enable(broker.meta.features_enabled, SUPPORTED, announced, others)


def ready_features(broker: Any) -> list[str]:
    """What this node would enable now (empty unless it leads the metadata group)."""
    return supported_everywhere(broker) if broker.log.leads(META_GROUP) else []


async def enable_features(broker: Any) -> None:
    """For the life of the node; each turn sleeps."""
    proposed_until = 0.0
    while True:
        now = trio.current_time()
        if now >= proposed_until:
            try:
                names = ready_features(broker)
            except Exception:  # (the engine stopping under us): the next turn sees
                log.exception("feature flags: cannot read the membership")
                names = []
            if names:
                proposed_until = now + PROPOSAL_WAIT_S

                def done(reply: Any, names: list[str] = names) -> None:
                    nonlocal proposed_until
                    proposed_until = 0.0
                    if reply is True:
                        log.info("feature flags enabled (every member supports them): %s", ", ".join(names))
                    elif reply is not False:
                        log.warning("feature flags %s not enabled now (%s): trying again", ", ".join(names), reply)

                try:
                    broker.meta_call(EnableFeatures(names), done)
                except Exception:  # (never let this task take the node down: the next turn tries again)
                    log.exception("feature flags: cannot propose %s", ", ".join(names))
        await trio.sleep(ENABLE_EVERY_S)
