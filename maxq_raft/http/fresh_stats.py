"""A queue's counts read through a member holding no replica of its group: asked of the group's
leader at the read.

Why: such a member shows the counts that its groups' leaders send every 5 s
(server/queue_stats.py). Read through it right after a change, a queue showed the state before
the change, where a member holding the group showed the new one: `maxqctl pause-consumers`
through n1 answered "paused" and `GET /api/queues/{vhost}/{name}` through n1 then listed no
pause rule; a queue a client had just consumed from listed no consumer in `maxqctl list
queues`; a queue just published to listed no message. What the same API showed thus depended on
the member asked, and an operator's own change did not show where it was made.

How: before it shows queues of groups held elsewhere (`GET /api/queues`, `/api/queues/{vhost}`,
`/api/queues/{vhost}/{name}`, the overview's queue_totals, SQS GetQueueAttributes), the member
asks each of those groups' leaders, in parallel, for the counts of the queues of those groups
("qa" with the groups, "qar" with records in queue_stats.py's wire form, over the members'
message channel of server/remote.py; answered by `ClusterLog.queue_counts`) and keeps them as
it keeps the 5 s reports. A leader that does not answer within ASK_WAIT_S (down, frozen, or not
known yet) leaves those queues with their last report, and the log says so.

Behind the feature flag `fresh_queue_stats`: a member of an earlier release would drop the
question and be waited for in vain. A single node holds every queue and asks nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import trio

from ..machines.features import FRESH_QUEUE_STATS

log = logging.getLogger("maxq.http")

ASK_WAIT_S = 1.0  # then the last report is shown (at most 5 s old)


def leaders_to_ask(broker: Any, keys: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """For the queues `keys`, the groups held elsewhere that hold them, by their leader (one
    linked to this member; a group whose leader is not known or not linked is left out)."""
    cluster = broker.log
    node = cluster.replication_node
    if node is None or not broker.meta.feature_enabled(FRESH_QUEUE_STATS):
        return {}
    groups = {cluster.group_of(key) for key in keys if key not in broker.queues}
    asked: dict[str, list[str]] = {}
    for group in sorted(groups):
        if group in node.groups:
            continue  # (its machines are here: a queue not made yet, or gone)
        leader = node.leader(group)
        if leader is not None and leader != broker.node_id and node.peer_is_up(leader):
            asked.setdefault(leader, []).append(group)
    return asked


async def refresh(broker: Any, keys: Iterable[tuple[str, str]]) -> None:
    """The counts of the queues `keys` whose groups are held elsewhere, fresh from their leaders
    (kept in `broker.remote_stats`, where `shown_queue` reads them)."""
    asked = leaders_to_ask(broker, keys)
    if not asked:
        return
    answers: dict[str, Any] = {}

    async def ask(leader: str, groups: list[str]) -> None:
        answers[leader] = await broker.log.ask_member(leader, ["qa", groups], ASK_WAIT_S)

    async with trio.open_nursery() as nursery:
        for leader, groups in asked.items():
            nursery.start_soon(ask, leader, groups)
    for leader, groups in asked.items():
        answer = answers.get(leader)
        if answer is None or len(answer) != 1 or type(answer[0]) is not list:
            log.warning(
                "%s did not give the counts of %s within %.0f s: their last report is shown",
                leader,
                ", ".join(groups),
                ASK_WAIT_S,
            )
            continue
        try:
            broker.take_queue_stats(leader, answer[0])
        except ValueError as exc:
            log.warning("counts from %s: %s", leader, exc)
