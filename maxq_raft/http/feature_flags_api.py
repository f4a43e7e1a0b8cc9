"""GET /api/feature-flags: RabbitMQ's list of feature flags (rabbit_mgmt_wm_feature_flags, for
administrators), for this cluster's flags (machines/features.py).

A flag is "enabled" once the metadata group applied it; "disabled" while every member announced
it (the metadata leader enables it within a second or so); "unavailable" while some member has not
(a member of an earlier release, or one not linked to this node now).
"""

from __future__ import annotations

from typing import Any

from ..machines.features import FEATURES, SUPPORTED, features_to_enable


def feature_flags(broker: Any) -> list[dict[str, Any]]:
    enabled = broker.meta.features_enabled
    node = broker.log.replication_node
    announced = node.peer_features() if node is not None else {}
    others = [member for member in broker.log.members() if member != broker.node_id]
    ready = set(features_to_enable(enabled, SUPPORTED, announced, others))
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
