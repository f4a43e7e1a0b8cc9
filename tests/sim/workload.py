"""What the simulated clients do: the commands a serving node proposes, from what it knows.

Theory of operation: one client action of a node (`act`) picks an operation by the run's
weights and proposes its commands as the server's channels would submit them: a queue is
declared by `Create` in its shard and then its record (`DeclareQueue`) in the metadata group
once the shard has it; publishes are `Enqueue`s of uniquely numbered messages (body b"m<n>")
to queues that exist; consumers attach (`Checkout`, ack or no-ack, with prefetch and a credit
window), ack, requeue or reject what was delivered to them (`Settle`, `Requeue`, `Discard`),
take credit (`Credit`), cancel, `Get`; a channel closes (`Down` of its owner in each queue it
used); time passes for a queue (`Tick`); a queue is purged. With `Config.sqs`, SQS receivers
share the queues: `Receive`, `DeleteReceived` and `ChangeVisibility` with handles read from the
witness (current ones, or an earlier receive id: stale), and purges that take what is in flight;
and some queues are SQS FIFO queues, sent to with `EnqueueFifo` (groups, deduplication ids,
repeats of earlier ids), where AMQP consumers and gets are refused. Each queue name has arguments for
the run (TTL, length limits, priorities, a delivery limit with or without retry back-off, single
active consumer) and some publishes carry a TTL and a priority. An action may do a few operations
whose commands for one group go in one entry, as one scheduler pass of the server batches them.

Clients act on what their node knows, which may be stale by the time their entry applies (an
ack for a message already returned, a consume on a queue whose record is not there yet): the
machines must cope, and the ledger says whether they did.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from .api import META_GROUP, VHOST, md, qc
from .checks import new_messages
from .proposer import Channel, ConsumerView, Node

if TYPE_CHECKING:
    from .runner import World

QUEUE_NAMES = ("q0", "q1", "q2", "q3", "q4", "q5", "q6", "q7")
TAGS = ("t1", "t2", "t3")  # few tags per channel, so a cancelled tag is often reused
CHANNELS_PER_NODE_MAX = 4
OPERATIONS = (
    "declare",
    "record",
    "bind",
    "publish",
    "consume",
    "ack",
    "requeue",
    "reject",
    "cancel",
    "credit",
    "get",
    "close",
    "tick",
    "purge",
)
# Queue features whose state the machines keep: their digests and the ledger cover them too.
# (Not here: reject-publish overflow, x-expires, x-delay and dead-lettering, which the ledger
# does not follow yet.)
QUEUE_ARGUMENTS = (
    (),
    (),
    (),
    (("x-message-ttl", 0),),
    (("x-message-ttl", 50),),
    (("x-message-ttl", 1000),),
    (("x-max-length", 3),),
    (("x-max-length-bytes", 10),),
    (("x-max-priority", 5),),
    (("x-max-priority", 10), ("x-message-ttl", 100)),
    (("x-delivery-limit", 1),),
    (("x-single-active-consumer", True),),
    (("x-retry-backoff-ms", 20), ("x-delivery-limit", 3)),
)
SQS_OPERATIONS = ("receive", "delete_received", "change_visibility")
BASE_WEIGHTS = {
    "receive": 4,
    "delete_received": 6,
    "change_visibility": 1,
    "declare": 2,
    "record": 1,
    "bind": 1,
    "publish": 12,
    "consume": 4,
    "ack": 8,
    "requeue": 2,
    "reject": 1,
    "cancel": 1,
    "credit": 3,
    "get": 2,
    "close": 1,
    "tick": 2,
    "purge": 0.3,
}


class Workload:
    def __init__(self, world: World, rng: random.Random) -> None:
        self.world = world
        self.rng = rng
        # Swarm testing: each run leans on some operations and leaves others out.
        self.operations = list(OPERATIONS)
        self.weights = [BASE_WEIGHTS[op] * rng.choice((0, 1, 1, 3)) for op in OPERATIONS]
        self.weights[OPERATIONS.index("declare")] += 1  # without queues nothing else happens
        self.weights[OPERATIONS.index("publish")] += 1
        if world.config.sqs:  # (drawn after everything else: a run without them is as it was)
            self.operations += SQS_OPERATIONS
            self.weights += [BASE_WEIGHTS[op] * rng.choice((0, 1, 1, 3)) for op in SQS_OPERATIONS]
        self.queue_count = rng.randint(1, len(QUEUE_NAMES))
        self.batch_max = rng.choice((1, 1, 2, 4))
        # Each queue name's arguments for the run (a later Create of it changes nothing).
        self.arguments = {name: dict(rng.choice(QUEUE_ARGUMENTS)) for name in QUEUE_NAMES}
        self.message_ttl = rng.random() < 0.2  # some publishes carry an expiration
        self.messages_max = rng.choice((1, 3, 8))
        self._batch: dict[str, tuple[list, list]] = {}
        # SQS FIFO queues (machines/fifo.py): some names are FIFO queues, whose sends are
        # EnqueueFifo with a group and a deduplication id, sometimes a repeat (drawn last).
        if world.config.sqs:
            for name in QUEUE_NAMES:
                if rng.random() < 0.3:
                    self.arguments[name] = {"x-sqs-fifo": True}

    def act(self, node: Node) -> None:
        for _ in range(self.rng.randint(1, self.batch_max)):
            operation = self.rng.choices(self.operations, self.weights)[0]
            getattr(self, "_" + operation)(node)
        self._flush(node)

    def _flush(self, node: Node) -> None:
        """The end of the node's scheduler pass: one entry per group of what was submitted."""
        batch, self._batch = self._batch, {}
        for group, (items, publishes) in batch.items():
            proposal = node.submit(group, items, tuple(publishes))
            for _target, command in items:
                if type(command) is qc.Checkout:
                    channel = node.channels.get(command.owner)
                    consumer = None if channel is None else channel.consumers.get(command.consumer_id)
                    if consumer is not None:
                        consumer.checkout_at = (proposal.origin, group, proposal.seq)

    def _add(self, group: str, target, command, publishes: list[int] | None = None) -> None:
        items, numbers = self._batch.setdefault(group, ([], []))
        items.append((target, command))
        if publishes:
            numbers.extend(publishes)

    # --------------------------------------------------------------- what it knows

    def _created(self) -> list[tuple[str, str]]:
        """Queues whose machine the (witness) shards have."""
        witness = self.world.witness
        return [key for group in self.world.shards for key in witness.queues(group)]

    def _pick_queue(self) -> tuple[str, str] | None:
        created = self._created()
        return self.rng.choice(created) if created else None

    def _channel(self, node: Node, new: bool = False) -> Channel:
        if node.channels and (not new or len(node.channels) >= CHANNELS_PER_NODE_MAX):
            return node.channels[self.rng.choice(list(node.channels))]
        channel = Channel(f"{node.new_session()}/1")
        node.channels[channel.owner] = channel
        return channel

    # ---------------------------------------------------------------- operations

    def _declare(self, node: Node) -> None:
        key = (VHOST, self.rng.choice(QUEUE_NAMES[: self.queue_count]))
        self._add(self.world.group_of(key), key, qc.Create(False, self.arguments[key[1]]))

    def _record(self, node: Node) -> None:
        key = self._pick_queue()
        if key is not None:
            owner = node.session_id()
            self._add(META_GROUP, None, md.DeclareQueue(VHOST, key[1], False, False, False, False, {}, owner))

    def _bind(self, node: Node) -> None:
        key = self._pick_queue()
        if key is not None:
            owner = node.session_id()
            kind = md.Bind if self.rng.random() < 0.7 else md.Unbind
            self._add(META_GROUP, None, kind(VHOST, "amq.direct", key[1], False, key[1], {}, owner))

    def _publish(self, node: Node) -> None:
        key = self._pick_queue()
        if key is None:
            return
        group = self.world.group_of(key)
        numbers = [self.world.next_number() for _ in range(self.rng.randint(1, self.messages_max))]
        ttl_ms = self.rng.choice((None, 0, 20, 300)) if self.message_ttl else None
        messages = new_messages(numbers, key[1], ttl_ms, self.rng.choice((0, 0, 1, 5, 9)))
        if self.arguments[key[1]].get("x-sqs-fifo"):
            self._add(group, key, self._fifo_send(group, key, numbers, messages, ttl_ms), numbers)
        else:
            self._add(group, key, qc.Enqueue(messages), numbers)

    def _fifo_send(
        self, group: str, key: tuple[str, str], numbers: list[int], messages: list, ttl_ms: int | None
    ) -> qc.EnqueueFifo:
        """Each message with a group and its own deduplication id ("n<number>": enqueued once,
        as the ledger expects of a publish); sometimes one more message repeating an id the
        witness's queue has already enqueued (so the repeat applies after it), numbered but not
        a publish: the ledger checks that it is deduplicated against the first send while that
        is in its window (checks.py)."""
        fields = [(self.rng.choice(("a", "b", "c")), f"n{n}", f"m{n}") for n in numbers]
        machine = self.world.witness.broker.groups[group].queues.get(key)
        known = list(machine.dedup)[-8:] if machine is not None else []
        if known and self.rng.random() < 0.3:
            extra = self.world.next_number()
            messages = messages + new_messages([extra], key[1], ttl_ms)
            fields.append((self.rng.choice(("a", "b", "c")), self.rng.choice(known), f"m{extra}"))
        return qc.EnqueueFifo(messages, fields)

    def _consume(self, node: Node) -> None:
        key = self._pick_queue()
        if key is None:
            return
        channel = self._channel(node, new=self.rng.random() < 0.3)
        tag = self.rng.choice(TAGS)
        consumer_id = f"{channel.owner}/{tag}"
        known = channel.consumers.get(consumer_id)
        if known is not None:
            if known.active:
                return  # the channel refuses a tag in use (AMQP 530): nothing is proposed
            key = known.key  # a cancelled tag used again: the same queue (it holds its deliveries)
        no_ack = self.rng.random() < 0.25
        if known is not None:
            known.active = True
            known.confirmed = False
            known.no_ack = no_ack
            known.reused = True
        else:
            channel.consumers[consumer_id] = ConsumerView(key, no_ack)
        channel.keys[key] = None
        prefetch = self.rng.choice((0, 1, 2, 5))
        credit = self.rng.choice((1, 3, 10, 100))
        self._add(
            self.world.group_of(key), key, qc.Checkout(consumer_id, channel.owner, prefetch, no_ack, 0, False, credit)
        )

    def _settle(self, node: Node, kind) -> None:
        """Acks (and requeues, rejects) come from whichever client holds deliveries: the one of
        this node, or of another serving node, so that they are as common as deliveries."""
        holders = []
        for other in [node] + [n for n in self.world.nodes if n is not node and n.serving]:
            for channel in other.channels.values():
                holders.extend(
                    (other, consumer_id, c.key, c.unacked, c)
                    for consumer_id, c in channel.consumers.items()
                    if c.unacked
                )
                holders.extend((other, channel.get_holder, key, got, None) for key, got in channel.got.items() if got)
            if holders:
                break
        if not holders:
            return
        other, holder, key, unacked, view = self.rng.choice(holders)
        switched = other is not node
        if switched:
            self._flush(node)  # (what this node's client did so far goes in its own entries)
        seqs = list(unacked)
        seqs = self.rng.sample(seqs, self.rng.randint(1, len(seqs)))
        for seq in seqs:
            del unacked[seq]
        if view is not None:
            view.settled.update(dict.fromkeys(seqs))
        self._add(self.world.group_of(key), key, kind(holder, seqs))
        if switched:
            self._flush(other)

    def _ack(self, node: Node) -> None:
        self._settle(node, qc.Settle)

    def _requeue(self, node: Node) -> None:
        self._settle(node, qc.Requeue)

    def _reject(self, node: Node) -> None:
        self._settle(node, qc.Discard)

    def _consumers(self, node: Node, active: bool = True) -> list[tuple[str, ConsumerView]]:
        return [
            (consumer_id, c)
            for channel in node.channels.values()
            for consumer_id, c in channel.consumers.items()
            if c.active or not active
        ]

    def _cancel(self, node: Node) -> None:
        consumers = self._consumers(node)
        if consumers:
            consumer_id, consumer = self.rng.choice(consumers)
            consumer.active = False
            self._add(self.world.group_of(consumer.key), consumer.key, qc.Cancel(consumer_id))

    def _credit(self, node: Node) -> None:
        consumers = self._consumers(node)
        if consumers:
            consumer_id, consumer = self.rng.choice(consumers)
            self._add(
                self.world.group_of(consumer.key), consumer.key, qc.Credit(consumer_id, self.rng.choice((1, 5, 20)))
            )

    def _get(self, node: Node) -> None:
        key = self._pick_queue()
        if key is None:
            return
        channel = self._channel(node)
        channel.keys[key] = None
        self._add(self.world.group_of(key), key, qc.Get(channel.get_holder, channel.owner, self.rng.random() < 0.3))

    def _close(self, node: Node) -> None:
        if node.channels:
            channel = node.channels.pop(self.rng.choice(list(node.channels)))
            for group, target, command in node.closing(channel):
                self._add(group, target, command)

    def _tick(self, node: Node) -> None:
        key = self._pick_queue()
        if key is not None:
            self._add(self.world.group_of(key), key, qc.Tick())

    def _purge(self, node: Node) -> None:
        key = self._pick_queue()
        if key is not None:
            in_flight = self.world.config.sqs and self.rng.random() < 0.5  # SQS PurgeQueue
            self._add(self.world.group_of(key), key, qc.Purge(in_flight) if in_flight else qc.Purge())

    # ------------------------------------------------------------ SQS receives

    def _receive(self, node: Node) -> None:
        key = self._pick_queue()
        if key is not None:
            command = qc.Receive(self.rng.randint(1, 10), self.rng.choice((0, 10, 50, 500, 5_000)))
            self._add(self.world.group_of(key), key, command)

    def _handles(self) -> tuple[tuple[str, str], list[tuple[int, int]]] | None:
        """Handles of messages in flight in a queue, as the witness has them now (stale by the
        time the entry applies, maybe), a few with an earlier receive id (stale at once)."""
        witness = self.world.witness
        queues = [
            (key, machine)
            for group in self.world.shards
            for key, machine in witness.broker.groups[group].queues.items()
            if machine.in_flight
        ]
        if not queues:
            return None
        key, machine = self.rng.choice(queues)
        flights = list(machine.in_flight.values())
        chosen = self.rng.sample(flights, self.rng.randint(1, min(3, len(flights))))
        return key, [(f.message.seq, f.receive_id - (self.rng.random() < 0.2)) for f in chosen]

    def _delete_received(self, node: Node) -> None:
        found = self._handles()
        if found is not None:
            key, handles = found
            self._add(self.world.group_of(key), key, qc.DeleteReceived(handles))

    def _change_visibility(self, node: Node) -> None:
        found = self._handles()
        if found is not None:
            key, handles = found
            visibility_ms = self.rng.choice((0, 20, 200))
            command = qc.ChangeVisibility([(seq, receive_id, visibility_ms) for seq, receive_id in handles])
            self._add(self.world.group_of(key), key, command)
