"""A channel's methods on a partitioned queue (machines/partitions.py): the same command, one
partition after another.

Why one after another: each partition is a queue in its own shard group, so the commands commit
in different logs; doing them in turn keeps the client's view simple (declare-ok, consume-ok,
cancel-ok and delete-ok are sent once every partition has done its part, and a refusal stops
the rest). A partitioned queue's declare, consume or delete takes one commit per partition.

Which partitions exist: those whose records exist. A declare makes partition 0 (the queue of
that name) first and the others after it, a delete removes them in the reverse order, so a
crash in between leaves a queue whose missing partitions route to partition 0 (metadata.py,
`_partition_for`) and that a redeclare completes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines import partitions
from ..machines.queue_types import Rejected
from .confirms import Unavailable
from .errors import ChannelError

# step(done): starts one partition's command; done(reply) is its continuation
Step = Callable[[Callable[[Any], None]], None]


def partition_keys(broker: Any, vhost: str, name: str) -> list[tuple[str, str]]:
    """The keys of the partitions of queue `name` whose records exist, partition 0 first;
    [(vhost, name)] for a queue that is not partitioned."""
    meta = broker.meta
    record = meta.queue(vhost, name)
    count = partitions.partition_count(record.arguments) if record is not None else 1
    if count == 1:
        return [(vhost, name)]
    return [(vhost, n) for n in partitions.partition_names(name, count) if meta.queue(vhost, n) is not None]


def missing_partitions(broker: Any, vhost: str, name: str, owner: str) -> list[md.DeclareQueue]:
    """The declares of the partitions of queue `name` (declared, partitioned) that have no record
    yet: durable as it is, with its own arguments but `x-partitions`."""
    meta = broker.meta
    record = meta.queue(vhost, name)
    count = partitions.partition_count(record.arguments) if record is not None else 1
    if record is None or count == 1:
        return []
    own = {key: value for key, value in record.arguments.items() if key != partitions.ARGUMENT}
    return [
        md.DeclareQueue(vhost, n, False, record.durable, False, False, own, owner)
        for n in partitions.partition_names(name, count)[1:]
        if meta.queue(vhost, n) is None
    ]


NOT_ENABLED = "not every member of the cluster supports partitioned queues yet (feature flag 'partitions')"


def unavailable(broker: Any, arguments: dict[str, Any]) -> str | None:
    """Why a queue with these arguments cannot be declared now (None: it can): partitions before
    every member supports them (machines/features.py)."""
    if partitions.partition_count(arguments) > 1 and not broker.meta.feature_enabled(partitions.FEATURE):
        return NOT_ENABLED
    return None


def with_policy_partitions(broker: Any, command: md.DeclareQueue) -> md.DeclareQueue:
    """A declare of a new queue whose policy says `partitions` carries that count as its own
    x-partitions (a partitioned queue's count is fixed when it is made), unless it names one
    itself, or could not be partitioned (exclusive, auto-delete, its own x-expires: then the
    policy's count does not apply to it, as a policy key that does not fit a queue is ignored; a
    policy's x-expires does not apply to a partitioned queue: metadata.arguments_under_policies)."""
    if command.passive or partitions.ARGUMENT in command.arguments:
        return command
    if broker.meta.queue(command.vhost, command.name) is not None:
        return command
    effective = broker.meta.arguments_under_policies(command.vhost, command.name, command.arguments)
    count = partitions.partition_count(effective)
    if count == 1 or unavailable(broker, effective) is not None:
        return command
    if partitions.declare_refusal(command.name, count, command.exclusive, command.auto_delete, command.arguments):
        return command
    return command._replace(arguments={**command.arguments, partitions.ARGUMENT: count})


def ready_count(broker: Any, keys: list[tuple[str, str]]) -> int:
    """The messages ready in these partitions, as this member's replicas have them (a group held
    elsewhere: as its leader replied to the last Sync, broker.queue_view)."""
    view = broker.queue_view
    return sum(queue.ready_count for key in keys if (queue := view(key)) is not None)


def held_elsewhere(broker: Any, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Those of `keys` whose group this member holds no replica of (groups on a few members,
    issue #19): their counts here are only what a Sync last brought back (none: zero)."""
    holds_queue = broker.log.holds_queue
    return [key for key in keys if not holds_queue(key)]


def with_fresh_counts(
    broker: Any,
    keys: list[tuple[str, str]],
    then_of: Callable[[Callable[[Any], None]], Callable[[Any], None]],
    then: Callable[[], None],
) -> None:
    """`then()` once `ready_count` and `broker.queue_view` read `keys` as of a commit: each held
    elsewhere is synced (its group's leader replies with its counts: `broker.note_counts`), all
    at once; one held here is read from its machine. Without it such a partition counted as its
    last Sync left it, or as empty: declare-ok and get-ok came short, and a delete if-empty
    through a member without the replicas removed a queue holding messages (the AMQP suite
    against 5 members at factor 3). `then_of` is the channel's `_then` (a Sync the cluster could
    not commit closes the connection, as any); right away when every key is held here (a single
    node)."""
    sync_alongside(broker, keys, then_of, strict=True)(then)


def sync_alongside(
    broker: Any,
    keys: list[tuple[str, str]],
    then_of: Callable[[Callable[[Any], None]], Callable[[Any], None]],
    *,
    strict: bool = False,
) -> Callable[[Callable[[], None]], None]:
    """`with_fresh_counts` without waiting for it: the Syncs of `keys` held elsewhere start now,
    and the returned `after(fn)` runs fn() once they have all answered (at once if they have),
    the channel held meanwhile by `then_of`. For a basic.get, whose Get goes out beside them
    (one commit's wait, not two). Not `strict`, a Sync that fails leaves that count as it was:
    its Get may have taken a message already, which an error here would lose."""
    elsewhere = held_elsewhere(broker, keys)
    state: dict[str, Any] = {"left": len(elsewhere), "waiting": None, "failure": None}

    def synced(key: tuple[str, str]) -> Callable[[Any], None]:
        def done(reply: Any) -> None:
            broker.note_counts(key, reply)  # (a Rejected one: the partition went meanwhile)
            if strict and type(reply) is Unavailable and state["failure"] is None:
                state["failure"] = reply
            state["left"] -= 1
            waiting = state["waiting"]
            if not state["left"] and waiting is not None:
                state["waiting"] = None
                waiting(state["failure"])

        return done

    for key in elsewhere:
        broker.queue_call(key, qc.Sync(), synced(key))

    def after(fn: Callable[[], None]) -> None:
        if not state["left"] and state["failure"] is None:
            fn()
            return
        resume = then_of(lambda _reply: fn())  # (an Unavailable reply closes the connection instead)
        if state["left"]:
            state["waiting"] = resume
        else:
            resume(state["failure"])

    return after


def in_turn(
    then_of: Callable[[Callable[[Any], None]], Callable[[Any], None]], steps: list[Step], then: Callable[[list], None]
) -> None:
    """Run `steps` one after another, each once the one before has replied; `then(replies)` after
    the last. A `Rejected` reply stops the rest: it is raised as the channel's error.
    `then_of` is the channel's `_then` (a cluster's replies come after a commit)."""
    replies: list = []

    def step(i: int) -> None:
        if i == len(steps):
            then(replies)
            return

        def done(reply: Any) -> None:
            if type(reply) is Rejected:
                raise ChannelError(reply.reply_code, reply.reply_text)
            replies.append(reply)
            step(i + 1)

        steps[i](then_of(done))

    step(0)


def share(limit: int, count: int) -> int:
    """A consumer's limit (its prefetch, its consume rate) for each of `count` partitions: its
    own spread over them, rounded up (at least one each), so that together they stay near what
    it asked for; 0 (no limit) stays 0."""
    if limit == 0:
        return 0
    return max(1, -(-limit // count))
