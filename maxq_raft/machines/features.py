"""Feature flags: the replicated behaviours every member of a cluster can apply.

Why (RabbitMQ's feature flags, for the same reason: rolling upgrades): a member that meets a
command its code does not know stops (replication/entries.py, NewerEntry) rather than skip it
and drift from the others. So a release that adds a kind of replicated command (a feature) must
not propose it while a member of an earlier release is still in the cluster.

How: each member announces the features its code supports to every peer it links to (the
replication engine's group-list message: an earlier release sends none, so it supports none).
On the metadata group's leader the membership watchdog enables, with one `EnableFeatures`
command of the metadata machine, the features that every member of the metadata group has
announced over a link that is up now (`features_to_enable`); a single node (a one-member log)
enables all of its own at start. The metadata machine keeps the enabled names, in the order
they were enabled, in its snapshot. Code that proposes a new kind of command checks
`MetadataMachine.feature_enabled(name)` first. An enabled feature stays enabled: a member of an
earlier release must not join a cluster after that (it would stop at the first new command).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import NamedTuple

from .maintenance import FEATURE as MAINTENANCE
from .partitions import FEATURE as PARTITIONS
from .placement import FEATURE as PLACEMENT
from .placement import LOCATOR_FEATURE as QUEUE_LOCATOR

# x-trace (server/tracer.py): an Enqueue's publish tuples gain a fifth item, which an earlier
# release's decoder refuses.
TRACE_NUMBERS = "trace_numbers"

# A member holding no replica of a publish's group confirms it once its group's leader says it
# was applied (server/remote.py, `end_awaited`), not at its commit: a leader of an earlier
# release sends no such word for an entry without a request.
PUBLISH_ENDS = "publish_ends"

# The deliveries a group's leader sends a member holding no replica go as short records (the
# fields a channel writes: server/remote.py `delivery_record`), which an earlier release refuses.
SHORT_DELIVERIES = "short_deliveries"

# SQS SetQueueAttributes with an empty RedrivePolicy or RedriveAllowPolicy removes it:
# SetQueueArguments names an argument with no value (None), which an earlier release would store.
QUEUE_ARGUMENTS_REMOVED = "queue_arguments_removed"

# A member holding no replica of a queue's group asks the group which of its queues hold halves
# of a transaction it decides (commands.TxnHolders), which an earlier release does not know.
TXN_HOLDERS = "txn_holders"

# A member answering GET /api/connections, /api/channels or /api/consumers asks every other
# member for its own (http/cluster_lists.py): an earlier release would drop the question.
CLUSTER_LISTS = "cluster_lists"

# A member showing queues of groups held elsewhere asks their leaders for the counts first
# (http/fresh_stats.py): an earlier release would drop the question.
FRESH_QUEUE_STATS = "fresh_queue_stats"

# name -> what it allows. The first one is the mechanism itself: EnableFeatures is a command
# that an earlier release does not know, so it too waits until every member announces it.
FEATURES: dict[str, str] = {
    "feature_flags": "Members agree on the features the cluster uses before any is used",
    MAINTENANCE: "Members can be drained for maintenance and revived (maxqctl drain / revive)",
    PLACEMENT: "The metadata group records the shard groups, their replicas and each queue's group",
    TRACE_NUMBERS: "A traced publish carries the number of the x-maxq-trace-id its node gave it",
    PUBLISH_ENDS: "A publish through a member without its queue's replica is confirmed once applied",
    PARTITIONS: "A queue may be partitioned (x-partitions): its partitions' records and routing",
    SHORT_DELIVERIES: "Deliveries to a member without the queue's replica carry only what a channel writes",
    QUEUE_LOCATOR: "A member places a queue it declares in a group it leads (x-queue-leader-locator client-local)",
    QUEUE_ARGUMENTS_REMOVED: "SQS SetQueueAttributes can remove a queue's RedrivePolicy or RedriveAllowPolicy",
    TXN_HOLDERS: "A transaction decided through a member without its queues' replicas reaches those queues",
    CLUSTER_LISTS: "The management API lists every member's connections, channels and consumers",
    FRESH_QUEUE_STATS: "The management API shows a queue held elsewhere with its group leader's counts of now",
}
SUPPORTED: frozenset[str] = frozenset(FEATURES)


class EnableFeatures(NamedTuple):
    names: list[str]  # sorted; names already enabled are skipped when applied


def features_to_enable(
    enabled: Collection[str], supported: Iterable[str], announced: Mapping[str, Collection[str]], others: Iterable[str]
) -> list[str]:
    """The features this code `supported` that are not `enabled` yet and that every member in
    `others` (the other members of the metadata group) `announced`, sorted. A member absent from
    `announced` (not linked now, or of an earlier release) holds every feature back."""
    ready = set(supported) - set(enabled)
    for member in others:
        ready &= set(announced.get(member, ()))
        if not ready:
            break
    return sorted(ready)
