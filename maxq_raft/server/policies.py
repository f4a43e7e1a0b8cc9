"""Policies: the broker side of `SetPolicy` / `ClearPolicy` (the metadata machine holds them).

Theory of operation: a queue's settings come from its effective arguments, the metadata
machine's `effective_arguments` (its policy's, with its own declared arguments winning). When a
vhost's policies change, `apply_policies` recomputes the settings of each of its queues and
applies `UpdateSettings` to those whose settings changed, so the queue machine (and every
replica of it) switches at one point in its log.
"""

from __future__ import annotations

from ..machines import commands as qc
from ..machines.queue_args import settings_or_default


def queue_settings(broker, vhost: str, name: str):
    return settings_or_default(vhost, name, broker.meta.effective_arguments(vhost, name))


def apply_policies(broker, vhost: str) -> None:
    for (queue_vhost, name), queue in list(broker.queues.items()):
        if queue_vhost != vhost:
            continue
        settings = queue_settings(broker, vhost, name)
        # (a policy cannot change a queue's kind: those two come from its own arguments only)
        settings = settings._replace(
            max_priority=queue.settings.max_priority, single_active_consumer=queue.settings.single_active_consumer
        )
        if settings != queue.settings:
            broker.queue_cast((vhost, name), qc.UpdateSettings(settings))  # in a cluster: through its shard
