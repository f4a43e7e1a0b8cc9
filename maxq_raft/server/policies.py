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
    """UpdateSettings for each queue of `vhost` whose settings the policies changed: every queue
    of the vhost's records, also those of groups held elsewhere (issue #19: their machines are
    on other members; each gets the command, and its machine takes the settings it already has
    as a no-op), not only the machines here."""
    record = broker.meta.vhosts.get(vhost)
    if record is None:
        return
    for name in list(record.queues):
        settings = queue_settings(broker, vhost, name)
        queue = broker.queues.get((vhost, name))
        # (a policy cannot change a queue's kind: those two come from its own arguments only)
        kind = queue.settings if queue is not None else settings_or_default(vhost, name, record.queues[name].arguments)
        settings = settings._replace(max_priority=kind.max_priority, single_active_consumer=kind.single_active_consumer)
        if queue is None or settings != queue.settings:
            broker.queue_cast((vhost, name), qc.UpdateSettings(settings))  # in a cluster: through its shard
