"""GET /api/feature-flags: RabbitMQ's list of feature flags (rabbit_mgmt_wm_feature_flags, for
administrators), for this cluster's flags (machines/features.py).

A flag is "enabled" once the metadata group applied it; "disabled" while every member announced
it (the metadata leader enables it within a second or so); "unavailable" while some member has not
(a member of an earlier release, or one not linked to this node now). `missing_features`: what a
node about to be added lacks of the enabled ones (POST /api/cluster/members refuses it then).
"""

from __future__ import annotations

from typing import Any

import trio

from ..machines.features import FEATURES, SUPPORTED
from ..replication.engine import MEMBER_PROBE_S
from ..server.feature_flags import supported_everywhere

ANNOUNCE_WAIT_S = MEMBER_PROBE_S  # a joining node's link: as long as the engine waits for its answer
ANNOUNCE_AFTER_LINK_S = 2.0  # its announcement, once linked (it is the first thing sent on a link)
ANNOUNCE_POLL_S = 0.1


def feature_flags(broker: Any) -> list[dict[str, Any]]:
    enabled = broker.meta.features_enabled
    ready = set(supported_everywhere(broker))
    names = [*enabled, *sorted(SUPPORTED - set(enabled))]
    return [
        {
            "name": name,
            "desc": FEATURES.get(name, ""),
            "doc_url": "",
            "state": "enabled" if name in enabled else "disabled" if name in ready else "unavailable",
            "stability": "stable",
            "provided_by": "maxq_raft",
        }
        for name in names
    ]


async def missing_features(broker: Any, name: str) -> list[str] | None:
    """The enabled features that node `name` (about to be added) did not announce: a member of
    an earlier release would stop at the first command of one of them, so it must not join.
    Empty when nothing is enabled, or when `name` opened no link with this node within
    ANNOUNCE_WAIT_S (the engine then probes it, and refuses a node that does not answer); None
    when it linked but announced nothing within ANNOUNCE_AFTER_LINK_S (a release from before
    feature flags). A node just started links within a second or two: it is waited for."""
    enabled = broker.meta.features_enabled
    node = broker.log.replication_node
    if not enabled or node is None:
        return []
    deadline = trio.current_time() + ANNOUNCE_WAIT_S
    while True:  # bounded by the deadlines
        announced = node.peer_features().get(name)
        if announced is not None:
            return [feature for feature in enabled if feature not in announced]
        if node.peer_linked(name):
            deadline = min(deadline, trio.current_time() + ANNOUNCE_AFTER_LINK_S)
        if trio.current_time() >= deadline:
            return None if node.peer_linked(name) else []
        await trio.sleep(ANNOUNCE_POLL_S)
