"""A queue's counts as the management API shows them, also where its machine is not.

On a cluster whose groups are on a few members (issue #19), a member holds the machines of its
own groups only; the management API asked of it must still list every queue with its counts,
as RabbitMQ's does on any node. Each group's leader sends the counts of its queues to the
members holding no replica of it every STATS_EVERY_S (RabbitMQ's collect_statistics_interval,
5 s: its management counts are as old too), over the channel of server/remote.py (item "qs");
a member keeps the last it was sent per queue (`Broker.remote_stats`). One shape, `QueueStats`,
serves both: the view of a queue held here is made from its machine the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

STATS_EVERY_S = 5.0
STATS_PER_ITEM = 2000  # queues per "qs" item: a group with many queues is sent in several


@dataclass(frozen=True, slots=True)
class QueueStats:
    node: str  # the member whose machine counted them ("" when no count came yet)
    ready_count: int = 0
    unacked_count: int = 0
    active_consumer_count: int = 0
    paused_consumer_count: int = 0
    ready_bytes: int = 0
    spilled_count: int = 0
    delayed_count: int = 0
    txn_messages: int = 0
    txns_open: int = 0
    stats_published: int = 0
    stats_delivered: int = 0
    stats_got: int = 0
    stats_redelivered: int = 0
    stats_acked: int = 0
    trace: bool = False
    pause_rules: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, node: str, queue: Any) -> QueueStats:
        """The counts of a queue machine on `node`."""
        return cls(
            node,
            queue.ready_count,
            queue.unacked_count,
            queue.active_consumer_count,
            queue.paused_consumer_count,
            queue.ready_bytes,
            queue.spilled_count,
            queue.delayed.count,
            queue.txn_messages,
            len(queue.txns),
            queue.stats_published,
            queue.stats_delivered,
            queue.stats_got,
            queue.stats_redelivered,
            queue.stats_acked,
            bool(queue.settings.trace),
            tuple(sorted((str(scope), str(key)) for scope, key in queue.pause_rules)),
        )

    def record(self, vhost: str, name: str) -> list:
        """The wire form (msgpack): [vhost, name, 14 counts, trace, [[scope, key], ...]]."""
        counts = [getattr(self, field) for field in _COUNTS]
        return [vhost, name, *counts, self.trace, [list(rule) for rule in self.pause_rules]]


_COUNTS = (
    "ready_count",
    "unacked_count",
    "active_consumer_count",
    "paused_consumer_count",
    "ready_bytes",
    "spilled_count",
    "delayed_count",
    "txn_messages",
    "txns_open",
    "stats_published",
    "stats_delivered",
    "stats_got",
    "stats_redelivered",
    "stats_acked",
)


def from_record(node: str, record: Any) -> tuple[tuple[str, str], QueueStats]:
    """((vhost, name), its stats) from a record `node` sent; ValueError when malformed."""
    if type(record) is not list or len(record) != 4 + len(_COUNTS):
        raise ValueError(f"malformed queue stats: {record!r}"[:200])
    vhost, name, *counts, trace, rules = record
    if type(vhost) is not str or type(name) is not str or any(type(c) is not int or c < 0 for c in counts):
        raise ValueError(f"malformed queue stats: {record!r}"[:200])
    if type(trace) is not bool or type(rules) is not list:
        raise ValueError(f"malformed queue stats: {record!r}"[:200])
    pause_rules = []
    for rule in rules:
        if type(rule) is not list or len(rule) != 2 or not all(type(part) is str for part in rule):
            raise ValueError(f"malformed pause rule: {rule!r}"[:200])
        pause_rules.append((rule[0], rule[1]))
    return (vhost, name), QueueStats(
        node, **dict(zip(_COUNTS, counts, strict=True)), trace=trace, pause_rules=tuple(pause_rules)
    )
