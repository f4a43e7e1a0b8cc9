"""The one way a command is applied: a single node's and every cluster replica's.

Theory of operation: a log (local_log.py: at once; cluster.py: once committed, in each origin's
order) hands each command to `Applier.apply` with the entry's `Meta` and its origin. The command
goes to its group's machine (machines/shard.py: the metadata group, or the shard that holds the
queue), and what follows is done here, the same way whichever log called:

1. the group's own effects: a queue machine made or removed (the broker's index of queues, its
   consumers' channels), a node's lives declared dead (the log checks whether it was this one),
   a direct reply-to reply handed to the channel that waits for it;
2. for a metadata command: its durable record (`topology`: a single node's metadata log; nothing
   in a cluster, whose Raft log is the record), and, on the node the command came from
   (`mine`), what it sets going: a queue whose record went as a side effect (an exclusive
   queue's owner closed) is deleted from its shard, a policy change updates the settings of the
   queues it matches;
3. the waiting caller's `then(reply)`, on the origin only (a local log's caller is still on the
   stack, and its channel error propagates; a cluster's continuations catch their own);
4. the queue machines' effects (`Broker.perform`): deliveries to this node's consumers (every
   replica decides every delivery; only the consumer's node sends it), dead letters, expiry.
   They come after the reply, so a consume-ok goes out ahead of the first delivery. On the
   leader of a group, deliveries to consumers of members holding no replica of it are sent
   there instead (`remote`, server/remote.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.queue_types import Meta, Rejected
from ..machines.shard import ALL_QUEUES, SHARD_EFFECT_COMMANDS, LivesDown, QueueAdded, QueueRemoved, ReplyTo
from ..storage.errors import StoreFailed
from . import policies

log = logging.getLogger("maxq.apply")


class NoTopologyRecord:
    """A cluster member's (and a replaying node's) durable-topology record: none, its log is it."""

    def before(self, machine: md.MetadataMachine, command: Any) -> bool:
        return False

    def after(self, machine: md.MetadataMachine, command: Any, effects: list, log_it: bool) -> None:
        pass


class Applier:
    def __init__(self, broker, log_: Any) -> None:
        self.broker = broker
        self.log = log_  # the log that applies through us: submit, lives_down
        self.topology: Any = NoTopologyRecord()
        # A cluster member's sender to members holding no replica of a group (server/remote.py):
        # while this member leads the group, their consumers' deliveries go to them.
        self.remote: Any = None

    def apply(
        self,
        group: Any,
        meta: Meta,
        target: Any,
        command: Any,
        origin: str,
        mine: bool,
        then: Callable[[Any], None] | None,
    ) -> None:
        broker = self.broker
        if target is None:
            reply = self._apply_meta(group, meta, command, origin, mine)
            effects = None
        else:
            traced = broker.tracer.traced
            if traced and target in traced:  # x-trace (tracer.py): nothing more when no queue traces
                machine = traced[target]
                before = broker.tracer.before(machine, command)
                reply, effects = group.apply(meta, target, command, origin)
                broker.tracer.after(meta, target, machine, command, reply, effects, before)
            else:
                reply, effects = group.apply(meta, target, command, origin)
            # The ticker reads the queues a command changed again (queue_timers.py); a shard-wide
            # Reply (a direct reply-to answer passing through a shard) changes none.
            if target != ALL_QUEUES:
                broker.queue_timers.touch(target)
            elif type(command) is not qc.Reply:
                broker.queue_timers.touch_all()
            if type(command) is qc.UpdateSettings:  # a policy changed: x-publish-rate-limit, x-trace are the shell's
                broker.queue_settings_changed(target, broker.queues.get(target))
            if effects and (target == ALL_QUEUES or type(command) in SHARD_EFFECT_COMMANDS):
                effects = self._group_effects(group.name, effects, meta.log_index)
            wakeups = broker.queue_wakeups
            if wakeups.waiters:  # SQS long polls wait on some queue
                # (a shard-wide Down hands back the messages of every queue its owner held)
                for key in list(wakeups.waiters) if target == ALL_QUEUES else (target,):
                    wakeups.applied(key, broker.queues.get(key))
        try:
            if then is not None:
                then(reply)  # a local log's caller may raise its channel error from here
        finally:
            if effects and target is not None and self.remote is not None and self.remote.active:
                effects = self.log.deliveries_here(group.name, effects, meta.log_index)
            if effects:
                try:
                    broker.perform(effects)
                except Exception:  # our glue, not the machines (they never raise): keep applying
                    log.exception("performing the effects of %s failed", type(command).__name__)

    def _apply_meta(self, group: Any, meta: Meta, command: Any, origin: str, mine: bool) -> Any:
        machine = group.machine
        log_it = self.topology.before(machine, command)
        # The group a deleted record named (gone from the machine by the time its effect is read).
        deleted = machine.queue(command.vhost, command.name) if type(command) is md.DeleteQueueRecord else None
        reply, effects = group.apply(meta, None, command, origin)
        for effect in effects:
            kind = type(effect)
            if kind is md.PolicyChanged:
                if mine:
                    policies.apply_policies(self.broker, effect.vhost)
                self.broker.queue_records_changed(effect.vhost)  # (queues held elsewhere: the shell's part)
            elif kind is md.QueueCreated or kind is md.QueueDeleted:
                if kind is md.QueueDeleted and mine and type(command) is not md.DeleteQueueRecord:
                    # Its record went as a side effect (its exclusive owner went): delete it in its shard.
                    self.log.submit((effect.vhost, effect.name), qc.DeleteQueue(), None)
                self.broker.queue_records_changed(effect.vhost, effect.name)
                if kind is md.QueueDeleted:
                    self.broker.queue_record_deleted(
                        (effect.vhost, effect.name), deleted.group if deleted is not None else None
                    )
            elif kind is md.VhostDeleted:
                self.broker.close_vhost_connections(effect.name)  # each member closes its own
            elif kind is LivesDown:
                self.log.lives_down(effect)
        if type(reply) is not Rejected:
            try:
                self.topology.after(machine, command, effects, log_it)
            except StoreFailed as exc:
                # Applied, and kept in the store's redo log (storage/guarded.py), but not durable yet.
                return Rejected(
                    541, f"the message store cannot write ({exc}): {type(command).__name__} is not stored yet"
                )
        return reply

    def _group_effects(self, group_name: str, effects: list, index: int) -> list:
        """Do the shard's own effects (of the entry at `index`); return the queue machines' for
        `Broker.perform`."""
        rest = []
        for effect in effects:
            kind = type(effect)
            if kind is QueueAdded:
                self.broker.queue_added(effect.key, effect.machine)
            elif kind is QueueRemoved:
                self.broker.queue_removed(effect.key, effect.machine)
                if self.remote is not None and self.remote.active:
                    self.remote.queue_removed(group_name, effect.key, self.log.members(), index)
            elif kind is LivesDown:
                self.log.lives_down(effect)
                if self.remote is not None and self.remote.active and effect.ended:
                    self.remote.lives_ended(group_name, effect.prefix, effect.ended)
            elif kind is ReplyTo:
                command = effect.command
                channel = self.broker.reply_to.get(command.key)
                if channel is not None:
                    channel.deliver_reply(command.exchange, command.routing_key, command.props_raw, command.body)
                elif self.remote is not None and self.remote.active:
                    self.remote.reply_to(group_name, command, index)  # (a requester on a member without this group)
            else:
                rest.append(effect)
        return rest
