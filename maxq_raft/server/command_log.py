"""What channels and the broker submit commands to: the node's log, local or replicated.

Theory of operation: every change to a machine goes through `submit(target, command, then)`
(target: None for the metadata group, a (vhost, queue) key for a queue, ALL_QUEUES for every
queue of a shard); `then(reply)` gets the machine's reply once the command is applied here, and
the returned `Pending` is done once the command is durable, for publisher confirms
(confirms.py). Two logs implement it, and they differ only in how a command gets to
`Applier.apply`, the one apply path (applier.py):

- `LocalLog` (local_log.py), a single node: the command is applied at once, in the caller's
  stack; its Pending is done at once, or when the store's fsync covers what it wrote.
- `ClusterLog` (cluster.py), a cluster member: the command rides in an entry proposed to its
  group's Raft log; every member applies it once committed, in each origin's order.

This base holds what both do the same way: queue declaration (the queue's machine is made in
its shard before its record is committed, so by the time anyone can route to it the shard has
it), the confirms, and time passing for queues (`tick_queues`: a `Tick` when a queue's next
deadline has come, from the member that leads its shard; a single node leads everything).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.metadata import META_GROUP
from ..machines.placement import PlaceQueue
from ..machines.queue_types import Rejected
from ..machines.shard import MetaGroup, ShardMachine
from . import transactions
from .confirms import Confirms, Pending, Unavailable
from .dead_letter import dead_letter, held_dead_letters
from .queue_timers import QueueKey, QueueTimers

log = logging.getLogger("maxq.log")

TICK_INTERVAL_S = 0.05  # the lateness bound of a TTL or x-expires with no traffic
DEAD_LETTER_CHECK_S = 2.0


def _tick_done(in_flight: dict, timers: QueueTimers, key: QueueKey, _reply: Any) -> None:
    """A queue's Tick was applied, or failed: the next one may go, once the queue is read again."""
    in_flight.pop(key, None)
    timers.touch(key)


class CommandLog:
    """The base of LocalLog and ClusterLog (see the module docstring)."""

    synchronous = False  # True: `then` runs inside `submit` (a local log)

    def __init__(self, broker) -> None:
        self.broker = broker
        self.node_id: str = broker.node_id
        self.confirms = Confirms()
        self.dead_letters_in_flight: set[tuple] = set()  # (queue key, seq) this member is dead-lettering
        self.quorum_ok = True  # False while cut off from a majority (new connections are refused)

    # -- what the two logs define --------------------------------------------------------

    shards: list[str]
    flow_blocked: bool  # publishers are not read while this is True (a cluster's flow control)
    flow_room: trio.Event  # set when flow_blocked goes False

    def submit(
        self, target: Any, command: Any, then: Callable[[Any], None] | None, group: str | None = None
    ) -> Pending:
        raise NotImplementedError

    def group_of(self, target: Any) -> str:
        raise NotImplementedError

    def leads(self, group: str) -> bool:
        raise NotImplementedError

    def group_leader(self, group: str) -> str | None:
        """The member leading `group` as this member knows it (None: none known now)."""
        return self.node_id

    def group_members(self, group: str) -> list[str]:
        """The members holding a replica of `group`."""
        return self.members()

    def members(self) -> list[str]:
        raise NotImplementedError

    def lives_down(self, effect: Any) -> None:
        """A node's lives were declared dead in a group (machines/shard.py's LivesDown)."""

    def reply_elsewhere(self, key: str, exchange: str, routing_key: str, props_raw: bytes, body: bytes) -> bool:
        """Send a direct reply-to reply to a requester on another member (False: not one)."""
        return False

    def metadata_may_lag(self) -> bool:
        """Whether a client may have seen metadata committed that this member has not applied
        (another member answered it): a lookup that finds nothing waits for `after_metadata_barrier`
        (server/metadata_sync.py). A single node answers every declare itself."""
        return False

    def after_metadata_barrier(self, then: Callable[[float], None]) -> None:
        """`then(proposed_at)` once this member has applied what the metadata group committed
        before now (MetadataSync.after_barrier)."""
        then(trio.current_time())

    def make_groups(self, make_queue: Callable) -> dict[str, Any]:
        """The machines of every group this node applies: the metadata group and the shards."""
        return {META_GROUP: MetaGroup(), **{name: ShardMachine(name, make_queue) for name in self.shards}}

    # -- shared --------------------------------------------------------------------------

    def holds(self, group: str) -> bool:
        """Whether this member holds a replica of `group` (a single node holds every group)."""
        return True

    def holds_queue(self, key: tuple) -> bool:
        """Whether this member applies the queue's group: its machine is here, and its reads are."""
        return self.holds(self.group_of(key))

    def leads_queue(self, key: tuple) -> bool:
        """Whether this member leads the queue's shard: it alone performs the effects every
        member's machine returns that act on other queues (dead letters, expiry)."""
        return self.leads(self.group_of(key))

    def confirm_after(self, pendings: list[Pending], channel_seqs: list, batch=None) -> None:
        self.confirms.after(pendings, channel_seqs, batch)

    def when_committed(self, pendings: list[Pending], then: Callable[[bool], None]) -> None:
        self.confirms.when_done(pendings, then)

    def declare_queue(self, command: md.DeclareQueue, then: Callable[[Any], None]) -> None:
        """Make the queue in its shard first, then commit its record (see the module docstring)."""
        broker = self.broker
        key = (command.vhost, command.name)

        def synced(reply) -> None:
            # declare-ok reports the queue's counts: read them once the shard has applied what
            # this node sent it before (a closed channel's requeues, this channel's publishes).
            if type(reply) is Rejected or type(reply) is Unavailable:
                then(reply)
            else:

                def counted(counts) -> None:
                    broker.note_counts(key, counts)  # (a group held elsewhere: its leader's counts)
                    then(reply)

                self.submit(key, qc.Sync(), counted)

        if command.passive or broker.meta.queue(*key) is not None:
            self.submit(None, command, synced)
            return
        arguments = broker.meta.arguments_under_policies(command.vhost, command.name, command.arguments)
        place = self.queue_placement(command, arguments)
        if place is None:
            self._create_and_declare(command, arguments, then)
            return
        if command.name.startswith(md.SERVER_NAMED_PREFIX):
            # A name this member just made up: no other member declares it at the same time,
            # so there is nothing to agree on first (an RPC client's reply queue per request
            # pays no PlaceQueue round trip).
            self._create_and_declare(command, arguments, then, group=place.group)
            return

        def placed(reply) -> None:
            if type(reply) is Rejected or type(reply) is Unavailable:
                then(reply)
            else:  # (the placement recorded, or one made first, or the queue's record: group_of has it)
                self._create_and_declare(command, arguments, then, group=self.group_of(key))

        self.submit(None, place, placed)

    def queue_placement(self, command: md.DeclareQueue, arguments: dict) -> PlaceQueue | None:
        """Where this member would put the new queue, to be recorded before it is made (a
        cluster's x-queue-leader-locator client-local: cluster.py); None: where its name hashes."""
        return None

    def _create_and_declare(
        self, command: md.DeclareQueue, arguments: dict, then: Callable[[Any], None], group: str | None = None
    ) -> None:
        """Make the queue's machine in `group`, then commit its record naming that group; with
        None, where `group_of` puts it (its name's hash), and the record names none either."""
        broker = self.broker
        key = (command.vhost, command.name)
        durable = command.durable and not command.exclusive
        created_here = key not in broker.queues
        if group is None:
            group = self.group_of(key)
        else:  # the record takes the group the machine is made in, whatever became of the placement
            command = command._replace(group=group)

        def recorded(reply) -> None:
            if type(reply) is Rejected and created_here and broker.meta.queue(*key) is None:
                # Refused (bad arguments, an exclusive lock...): the machine made for it goes.
                self.submit(key, qc.DeleteQueue(), None, group=group)
            then(reply)

        def created(reply) -> None:
            if type(reply) is Unavailable:
                then(reply)
            else:
                self.submit(None, command, recorded)

        self.submit(key, qc.Create(durable, arguments), created, group=group)

    async def tick_queues(self) -> None:
        """Time passes for the queues whose shards this member leads: a Tick when a queue's next
        deadline (TTL, x-expires, delays, back-offs) has come, one in flight per queue. Only the
        queues that have a deadline, dead letters or open transactions are looked at
        (queue_timers.py): a pass over every queue cost most of a core at 10,000 queues."""
        in_flight: dict[tuple, None] = {}
        resolving: dict[tuple, None] = {}  # (queue key, transaction id) resolves in flight
        next_dead_letter_check = 0.0
        broker = self.broker
        timers = broker.queue_timers
        while True:  # for the life of the node; each turn sleeps
            await trio.sleep(TICK_INTERVAL_S)
            timers.refresh(broker.queues)  # (every member: what was applied since the last turn)
            now_ms = broker.clock_ms()
            led = {g for g in self.shards if self.leads(g)}
            if not led:
                continue
            if trio.current_time() >= next_dead_letter_check:
                next_dead_letter_check = trio.current_time() + DEAD_LETTER_CHECK_S
                self._perform_held_dead_letters(led, now_ms)
            if timers.with_txns:
                transactions.resolve_decided(broker, led, resolving, list(timers.with_txns))
            queues = broker.queues
            for key in timers.due(now_ms):
                if key not in queues:
                    continue
                if key in in_flight or self.group_of(key) not in led:
                    timers.touch(key)  # still due: looked at again next turn
                    continue
                in_flight[key] = None
                self.submit(key, qc.Tick(), partial(_tick_done, in_flight, timers, key))

    def _perform_held_dead_letters(self, led: set, now_ms: int) -> None:
        """Dead letters held in a queue this member's shard leads, that no one performs: the
        leader that took them on died before the source forgot them. At-least-once: a target may
        already have a copy."""
        queues = self.broker.queues
        for key in list(self.broker.queue_timers.dead_lettering):
            queue = queues.get(key)
            if queue is None or not queue.dead_lettering or self.group_of(key) not in led:
                continue
            effects = held_dead_letters(queue, now_ms, lambda seq, key=key: (key, seq) in self.dead_letters_in_flight)
            for effect in effects:
                log.warning(
                    "queue '%s' in vhost '%s': performing %d held dead letters (%s) again",
                    key[1],
                    key[0],
                    len(effect.messages),
                    effect.reason,
                )
                if queue.settings.dead_letter_exchange is None:  # the policy took the DLX away: drop them
                    self.submit(key, qc.DeadLettered([m.seq for m in effect.messages]), None)
                else:
                    dead_letter(self.broker, effect)
