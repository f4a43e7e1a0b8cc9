"""A group's replicated state beyond one queue: a shard's queues, or the metadata; and its apply order.

Theory of operation: a node's state is a few groups, each applied from its own log: the metadata
group ("meta": vhosts, exchanges, queue records, bindings, policies) and shard groups that hold
the queue machines (a queue lives in the shard its name hashes to). A single node has one shard;
a cluster member as many as the cluster has. The same classes serve both, applied from a local
log or from a Raft group.

`ShardMachine.apply(meta, target, command, origin)` returns `(reply, effects)` like every machine:
- `Create` makes the queue's machine (through `make_queue`, which the shell gives: the machine's
  backing is the shell's store) unless it exists, `Sync` is a no-op whose reply tells the caller
  the shard has applied everything before it, `DeleteQueue` applies to the queue and removes it;
- a command for every queue of the shard (`ALL_QUEUES`): `Down(owner)` releases an owner's
  consumers in each (a node's "name@" owner also declares the node's other lives dead in the
  apply order), `Reply` carries a direct reply-to reply to whichever member holds its requester;
- any other command goes to its queue's machine (404 when there is none).
Effects beyond the queue machines' own tell the shell what changed: `QueueAdded`,
`QueueRemoved`, `LivesDown`, `ReplyTo`.

`MetaGroup` is the same for the metadata group: its machine and its apply order; a node's
`OwnerDown("name@")` declares its other lives dead here too.

Both are pure and deterministic: dicts in insertion order, no clocks (time comes in `meta`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeAlias

from . import commands as qc
from . import metadata as md
from .apply_order import ApplyOrder
from .queue import QueueMachine, QueueReply
from .queue_types import Effect, Meta, QueueCounts, Rejected

__all__ = [
    "ALL_QUEUES",
    "SHARD_EFFECT_COMMANDS",
    "MetaGroup",
    "ShardMachine",
    "QueueAdded",
    "QueueRemoved",
    "LivesDown",
    "ReplyTo",
    "ends_life",
]

ALL_QUEUES = "*"  # the target of a command for every queue of the shard


class QueueAdded(NamedTuple):
    """Effect: the shard made this queue's machine (the shell indexes it)."""

    key: tuple[str, str]
    machine: QueueMachine


class QueueRemoved(NamedTuple):
    """Effect: the queue's machine is gone from the shard (the shell drops its backing, tells its
    consumers' channels)."""

    key: tuple[str, str]
    machine: QueueMachine


class LivesDown(NamedTuple):
    """Effect: every life of the node `prefix` names ("name@") but `origin` is dead in `group`;
    `ended`: those this ended (the group had seen them)."""

    group: str
    prefix: str
    origin: str
    ended: tuple[str, ...] = ()


def ends_life(effect: LivesDown, life: str, order: ApplyOrder) -> bool:
    """Whether `effect` ended `life`, a node's current one, in the effect's group (`order` is
    that group's): its entries are skipped there from now on and its consumers there are gone,
    so the node must start a new life. That is so only if the group had seen the life (it is
    dead there now); whoever declared it (another node, an earlier life's late Down) and in
    whichever group."""
    return life.startswith(effect.prefix) and order.is_dead(life)


class ReplyTo(NamedTuple):
    """Effect: a direct reply-to reply for the requester `command.key` names, wherever it is held."""

    command: qc.Reply


ShardEffect: TypeAlias = Effect | QueueAdded | QueueRemoved | LivesDown | ReplyTo
# Besides the commands to ALL_QUEUES, the only ones whose effects include the shard's own
# (QueueAdded, QueueRemoved): the rest return their queue's effects as they are, which lets the
# shell skip looking for shard effects on the hot path (every publish, ack, delivery).
SHARD_EFFECT_COMMANDS = (qc.Create, qc.DeleteQueue)
MetaGroupEffect: TypeAlias = md.MetaEffect | LivesDown


class ShardMachine:
    def __init__(self, name: str, make_queue: Callable[[tuple[str, str], qc.Create], QueueMachine]) -> None:
        self.name = name
        self.make_queue = make_queue
        self.queues: dict[tuple[str, str], QueueMachine] = {}
        self.order = ApplyOrder()

    # `command` is a log entry's command, told apart by its exact class; a queue's machine
    # refuses what it does not know. `target` is a (vhost, queue) key, or ALL_QUEUES.
    def apply(self, meta: Meta, target: Any, command: Any, origin: str) -> tuple[QueueReply, Sequence[ShardEffect]]:
        if target == ALL_QUEUES:
            return self._apply_all(meta, command, origin)
        kind = type(command)
        key = target
        if kind is qc.Create:
            if key in self.queues:
                return None, []
            machine = self.queues[key] = self.make_queue(key, command)
            return None, [QueueAdded(key, machine)]
        queue = self.queues.get(key)
        if kind is qc.Sync:
            if queue is None:
                return None, []
            return QueueCounts(queue.ready_count, queue.active_consumer_count, queue.ever_had_consumer), []
        if queue is None:
            return Rejected(404, f"no queue '{key[1]}' in vhost '{key[0]}'"), []
        reply, effects = queue.apply(meta, command)
        if kind is qc.DeleteQueue:
            del self.queues[key]
            return reply, [*effects, QueueRemoved(key, queue)]
        return reply, effects

    def _apply_all(self, meta: Meta, command: Any, origin: str) -> tuple[QueueReply, Sequence[ShardEffect]]:
        kind = type(command)
        if kind is qc.Reply:
            return None, [ReplyTo(command)]
        if kind is qc.TxnHolders:
            vhost, txn_id = command
            if type(vhost) is not str or type(txn_id) is not str:
                return Rejected(406, "PRECONDITION_FAILED - malformed TxnHolders"), []
            return sorted(k[1] for k, queue in self.queues.items() if k[0] == vhost and txn_id in queue.txns), []
        if kind is not qc.Down:
            return Rejected(541, f"{kind.__name__} is not a shard-wide command"), []
        returned = 0
        effects: list[ShardEffect] = []
        for queue in list(self.queues.values()):
            reply, queue_effects = queue.apply(meta, command)
            if type(reply) is int:
                returned += reply
            effects.extend(queue_effects)
        if command.owner.endswith("@"):
            ended = self.order.lives_down(command.owner, origin)
            effects.append(LivesDown(self.name, command.owner, origin, ended))
        return returned, effects


class MetaGroup:
    """The metadata group's state: the metadata machine and the group's apply order."""

    name = md.META_GROUP

    def __init__(self, machine: md.MetadataMachine | None = None) -> None:
        self.machine = machine if machine is not None else md.MetadataMachine()
        self.order = ApplyOrder()

    def apply(
        self, meta: Meta, target: Any, command: Any, origin: str
    ) -> tuple[md.MetaReply, Sequence[MetaGroupEffect]]:
        reply, effects = self.machine.apply(meta, command)
        if type(command) is md.OwnerDown and command.owner.endswith("@"):
            ended = self.order.lives_down(command.owner, origin)
            return reply, [*effects, LivesDown(self.name, command.owner, origin, ended)]
        return reply, effects
