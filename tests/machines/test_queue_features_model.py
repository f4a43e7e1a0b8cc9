"""Property test: with TTL, length limits and dead lettering, no message is lost or duplicated.

Hypothesis picks a queue's settings (queue TTL, max-length, max-length-bytes, overflow mode,
dead-letter exchange or not) and drives the machine, with a backing and a tiny window so that
messages spill, through random commands at advancing entry times. The test keeps its own ledger
of every accepted message, built only from replies and effects, and after every step checks:

- every accepted seq is in exactly one place: ready, unacked, dead-lettering (awaiting
  `DeadLettered`), acked, delivered without ack, dead-lettered and done, purged, or dropped;
  the dropped ones (no dead-letter exchange) number exactly the machine's `dropped` counters,
  per reason; dead-letter effects match its `dead_lettered` counters, per reason;
- nothing is delivered after its deadline; an `expired` dead letter was due; a `maxlen` one
  happened only with a limit; nothing is dead-lettered without an exchange, nothing dropped with
  one (except refused publishes, which were never queued);
- after each command the heads are not expired and drop-head queues are within their limits
  (unless the machine said more is due), and reject-publish never lets a queue go over;
- a twin machine fed equal commands is in the same state (determinism).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from maxq_raft.machines.commands import (
    Cancel,
    Checkout,
    Credit,
    DeadLettered,
    Discard,
    Down,
    Enqueue,
    Get,
    Purge,
    Requeue,
    Settle,
    Tick,
)
from maxq_raft.machines.message import Message
from maxq_raft.machines.priority_queue import PriorityQueueMachine, make_queue_machine
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import DeadLetter, Deliver, Meta, Overflowed, Rejected

from .test_queue_machine import DictBacking, norm

CONSUMERS = {"c0": "o0", "c1": "o0", "c2": "o1"}
GETTERS = {"g0": "o0", "g1": "o1"}


def snapshot(machine: QueueMachine):
    return (
        machine.next_seq,
        [norm(m) for m in machine.ready],
        [(s, norm(m)) for s, m in machine.returned],
        [(c.consumer_id, c.credit, c.active, list(c.checked_out)) for c in machine.consumers.values()],
        sorted(machine.dead_lettering),
        machine.spilled_count,
        machine.ready_bytes,
        dict(machine.dropped),
        dict(machine.dead_lettered),
        sorted(machine.backing.records.items()),
        machine.next_deadline_ms,
    )


class FeaturesModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.index = 0
        self.body_counter = 0
        self.deadline: dict[int, int | None] = {}  # seq -> deadline (ms) or None
        self.size: dict[int, int] = {}
        self.accepted: set[int] = set()
        self.held: dict[str, dict[int, None]] = {}  # consumer/getter -> seqs
        self.acked: set[int] = set()
        self.noack: set[int] = set()
        self.pending_dl: dict[int, str] = {}  # seq -> reason
        self.dl_done: set[int] = set()
        self.purged: set[int] = set()
        self.discarded_no_dlx = 0
        self.dl_counts = {"rejected": 0, "expired": 0, "maxlen": 0, "delivery_limit": 0}
        self.refused = 0
        # consumer -> what it held when it was last cancelled: a cancelled consumer hands its
        # partition over at once (queue.py, `_sac_consumer`), so those may overlap the next
        # consumer's, also once it attaches again
        self.held_at_cancel: dict[str, set[int]] = {}

    @initialize(
        ttl=st.sampled_from([None, None, 0, 5, 30]),
        max_length=st.sampled_from([None, None, 0, 1, 3]),
        max_bytes=st.sampled_from([None, None, 12]),
        overflow=st.sampled_from(["drop-head", "reject-publish", "reject-publish-dlx"]),
        dlx=st.booleans(),
        max_priority=st.sampled_from([None, None, 2]),
        delivery_limit=st.sampled_from([None, None, 0, 1]),
        backoff=st.sampled_from([None, None, 5]),
        sac=st.booleans(),
        # a partition of a partitioned queue (partitions.py) serves its SAC consumers in turn
        name=st.sampled_from(["q", "q", "amq.partition-1.p", "amq.partition-3.p"]),
    )
    def setup(
        self, ttl, max_length, max_bytes, overflow, dlx, max_priority, delivery_limit, backoff, sac, name
    ) -> None:
        self.settings = QueueSettings(
            message_ttl_ms=ttl,
            max_length=max_length,
            max_length_bytes=max_bytes,
            overflow=overflow,
            dead_letter_exchange="dlx" if dlx else None,
            max_priority=max_priority,
            delivery_limit=delivery_limit,
            retry_backoff_ms=backoff,
            retry_backoff_max_ms=20,
            single_active_consumer=sac,
        )
        self.machine = make_queue_machine(
            "/", name, backing=DictBacking(), durable=True, window_max=3, window_bytes_max=12, settings=self.settings
        )
        self.twin = make_queue_machine(
            "/", name, backing=DictBacking(), durable=True, window_max=3, window_bytes_max=12, settings=self.settings
        )

    # ------------------------------------------------------------------ applying

    def apply(self, make, observe: bool = True):
        self.index += 1
        meta = Meta(self.index, self.now)
        reply, effects = self.machine.apply(meta, make())
        twin_reply, twin_effects = self.twin.apply(meta, make())
        assert norm(reply) == norm(twin_reply) and norm(effects) == norm(twin_effects)
        # A refused command changes nothing, not even expiry (the next one or a Tick does it).
        self.last_refused = type(reply) is Rejected
        if observe:
            self.observe(effects)
        return reply, effects

    def observe(self, effects: list) -> None:
        for effect in effects:
            if type(effect) is Deliver:
                if self.settings.single_active_consumer:
                    self.check_single_active(effect.consumer_id)
                self.delivered(effect.consumer_id, effect.message, no_ack=effect.consumer_id in self.no_ack_ids())
            else:
                assert type(effect) is DeadLetter, effect
                assert self.settings.dead_letter_exchange == "dlx" == effect.exchange
                self.dl_counts[effect.reason] += len(effect.messages)
                for message in effect.messages:
                    if message.seq == -1:
                        assert effect.reason == "maxlen" and self.settings.overflow == "reject-publish-dlx"
                        continue
                    seq = message.seq
                    assert seq in self.accepted and seq not in self.pending_dl
                    self.pending_dl[seq] = effect.reason
                    if effect.reason == "expired":
                        assert self.deadline[seq] is not None and self.deadline[seq] <= self.now
                    elif effect.reason == "maxlen":
                        assert self.settings.limited and self.settings.overflow == "drop-head"
                    elif effect.reason == "delivery_limit":
                        assert message.delivery_count > self.settings.delivery_limit

    def check_single_active(self, consumer_id: str) -> None:
        """Only one attached consumer is served: the first; in partition i, the i-th of them
        modulo their number, and only once no other attached consumer holds a message unsettled
        (so a partition's messages are never processed by two consumers at once), but for what
        a consumer held when it was cancelled (handed over at once, as in RabbitMQ)."""
        machine = self.machine
        order = machine._sac_order
        slot = machine._sac_slot
        assert consumer_id == order[slot % len(order)]
        others = [
            cid
            for cid in order
            if cid != consumer_id and set(machine.consumers[cid].checked_out) - self.held_at_cancel.get(cid, set())
        ]
        assert not slot or not others, others

    def no_ack_ids(self) -> list:
        return [cid for cid, c in self.machine.consumers.items() if c.no_ack]

    def delivered(self, holder: str, message: Message, no_ack: bool) -> None:
        seq = message.seq
        deadline = self.deadline[seq]
        assert deadline is None or deadline >= self.now, f"seq {seq} delivered at {self.now}, due {deadline}"
        for held in self.held.values():
            assert seq not in held
        if no_ack:
            self.noack.add(seq)
        else:
            self.held.setdefault(holder, {})[seq] = None

    # --------------------------------------------------------------------- rules

    @rule(ms=st.sampled_from([1, 3, 10, 40]))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(n=st.integers(1, 4), ttl=st.sampled_from([None, None, 0, 3, 50]), priority=st.sampled_from([0, 1, 5]))
    def enqueue(self, n: int, ttl, priority) -> None:
        bodies = []
        for _ in range(n):
            self.body_counter += 1
            bodies.append(b"b%d" % self.body_counter)
        made = []
        # (back-offs that are over are released first: they count as there before the publish)
        due = [m for when, _, m in self.machine.backoff if when <= self.now]
        before = (self.machine.ready_count + len(due), self.machine.ready_bytes + sum(len(m.body) for m in due))

        def make():
            batch = [Message("ex", "rk", b"", body, persistent=True, ttl_ms=ttl, priority=priority) for body in bodies]
            made.append(batch)
            return Enqueue(batch)

        reply, effects = self.apply(make, observe=False)
        batch = made[0]
        if type(reply) is Overflowed:
            assert self.settings.overflow != "drop-head"
            self.refused += len(reply.rejected)
            assert reply.accepted + len(reply.rejected) == n
            # Named by position in the batch: exactly the messages that got no seq.
            assert reply.rejected == [i for i, message in enumerate(made[0]) if message.seq == -1]
        else:
            assert reply == n
        queue_ttl = self.settings.message_ttl_ms
        for message in batch:
            if message.seq == -1:
                continue
            self.accepted.add(message.seq)
            effective = ttl if queue_ttl is None or (ttl is not None and ttl < queue_ttl) else queue_ttl
            self.deadline[message.seq] = None if effective is None else self.now + effective
            self.size[message.seq] = len(message.body)
        self.observe(effects)  # now that the ledger knows the new seqs
        if self.settings.limited and self.settings.overflow != "drop-head":
            # Each accepted publish fitted when judged; requeues (not publishes) may go over,
            # as in RabbitMQ, so the bound is the limit or what was there already.
            if self.settings.max_length is not None:
                assert self.machine.ready_count <= max(self.settings.max_length, before[0])
            if self.settings.max_length_bytes is not None:
                assert self.machine.ready_bytes <= max(self.settings.max_length_bytes, before[1])

    @rule(
        consumer_id=st.sampled_from(sorted(CONSUMERS)),
        prefetch=st.integers(0, 2),
        no_ack=st.booleans(),
        credit=st.integers(0, 3),
    )
    def checkout(self, consumer_id, prefetch, no_ack, credit) -> None:
        self.apply(lambda: Checkout(consumer_id, CONSUMERS[consumer_id], prefetch, no_ack, 0, False, credit))

    @rule(consumer_id=st.sampled_from(sorted(CONSUMERS)))
    def cancel(self, consumer_id) -> None:
        self.apply(lambda: Cancel(consumer_id))
        consumer = self.machine.consumers.get(consumer_id)
        self.held_at_cancel[consumer_id] = set(consumer.checked_out) if consumer is not None else set()

    @rule(consumer_id=st.sampled_from(sorted(CONSUMERS)), n=st.integers(1, 3))
    def credit(self, consumer_id, n) -> None:
        self.apply(lambda: Credit(consumer_id, n))

    @rule(
        holder=st.sampled_from(sorted(CONSUMERS) + sorted(GETTERS)),
        kind=st.sampled_from([Settle, Requeue, Discard]),
        data=st.data(),
    )
    def settle(self, holder, kind, data) -> None:
        held = list(self.held.get(holder, {}))
        seqs = data.draw(st.lists(st.sampled_from(held), unique=True, max_size=3) if held else st.just([]))
        reply, effects = self.apply(lambda: kind(holder, list(seqs)), observe=False)
        assert reply == len(seqs)
        for seq in seqs:
            del self.held[holder][seq]
        self.observe(effects)  # after the ledger let go: a requeued one may be delivered again
        if kind is Settle:
            self.acked.update(seqs)
        elif kind is Discard and self.settings.dead_letter_exchange is None:
            self.discarded_no_dlx += len(seqs)
        elif kind is Discard:
            for seq in seqs:
                assert self.pending_dl.get(seq) == "rejected"

    @rule(holder=st.sampled_from(sorted(GETTERS)), no_ack=st.booleans())
    def get(self, holder, no_ack) -> None:
        reply, effects = self.apply(lambda: Get(holder, GETTERS[holder], no_ack))
        if reply is not None:
            self.delivered(holder, reply[0], no_ack)

    @rule(owner=st.sampled_from(["o0", "o1"]))
    def down(self, owner) -> None:
        reply, effects = self.apply(lambda: Down(owner), observe=False)
        for holder, o in {**CONSUMERS, **GETTERS}.items():
            if o == owner:
                self.held.pop(holder, None)  # back in the queue (checked by the invariant)
        self.observe(effects)

    @rule()
    def tick(self) -> None:
        self.apply(Tick)

    @rule(data=st.data())
    def dead_lettered(self, data) -> None:
        pending = sorted(self.pending_dl)
        seqs = data.draw(st.lists(st.sampled_from(pending), unique=True) if pending else st.just([]))
        reply, _ = self.apply(lambda: DeadLettered(list(seqs)))
        assert reply == len(seqs)
        for seq in seqs:
            del self.pending_dl[seq]
            self.dl_done.add(seq)

    @rule()
    def purge(self) -> None:
        # (back-offs that are over are released at the start of the command, then purged)
        ready = self.ready() + [seq for due, seq, _ in self.machine.backoff if due <= self.now]
        reply, _ = self.apply(Purge)
        assert reply == len(ready)
        self.purged.update(ready)

    # ----------------------------------------------------------------- invariants

    def ready(self) -> list[int]:
        m = self.machine
        if type(m) is PriorityQueueMachine:
            out = [s for s, _ in m.returned]
            for lane in m.lanes.values():
                out += [x.seq for x in lane.ready]
                if lane.may_load():
                    out += sorted(
                        s for s in m.backing.records if lane.spill_cursor <= s < lane.end and s not in m.dead_lettering
                    )
            return out
        spilled = sorted(
            s for s in m.backing.records if m.spilled_count and s >= m.spill_cursor and s not in m.dead_lettering
        )
        return [s for s, _ in m.returned] + [x.seq for x in m.ready] + spilled

    def heads(self) -> list[Message]:
        m = self.machine
        heads = [m.returned[0][1]] if m.returned else []
        if type(m) is PriorityQueueMachine:
            return heads + [lane.ready[0] for lane in m.lanes.values() if lane.ready]
        return heads + ([m.ready[0]] if m.ready else [])

    def within_limits(self) -> None:
        m = self.machine
        if self.settings.max_length is not None:
            assert m.ready_count <= self.settings.max_length
        if self.settings.max_length_bytes is not None:
            assert m.ready_bytes <= self.settings.max_length_bytes

    def last_refused_or_due(self) -> bool:
        return getattr(self, "last_refused", False)

    @invariant()
    def every_message_in_exactly_one_place(self) -> None:
        if not hasattr(self, "machine"):
            return
        m = self.machine
        m.check_invariants()
        assert snapshot(m) == snapshot(self.twin)
        # held, as the machine says, equals the ledger (Down returned some)
        machine_held = {cid: list(c.checked_out) for cid, c in m.consumers.items() if c.checked_out}
        ledger_held = {h: list(s) for h, s in self.held.items() if s}
        assert {h: sorted(s) for h, s in machine_held.items()} == {h: sorted(s) for h, s in ledger_held.items()}
        assert dict(sorted(m.dead_lettering.items())).keys() == dict(sorted(self.pending_dl.items())).keys()
        ready = self.ready()
        assert len(ready) == m.ready_count
        waiting = [seq for _, seq, _ in m.backoff]
        assert len(set(waiting)) == len(waiting)
        for due, _, _message in m.backoff:
            # waiting out its back-off (released by the first command at or after `due`)
            assert due > m.now_ms and due - m.now_ms <= self.settings.retry_backoff_max_ms
            assert self.settings.retry_backoff_ms is not None
        places = [
            set(ready),
            {s for held in self.held.values() for s in held},
            set(self.pending_dl),
            self.acked,
            self.noack,
            self.dl_done,
            self.purged,
            set(waiting),
        ]
        seen = set()
        for place in places:
            assert not (place & seen), "a message in two places"
            seen |= place
        assert seen <= self.accepted
        dropped = self.accepted - seen
        assert len(dropped) == sum(m.dropped.values()), (len(dropped), m.dropped)
        if self.settings.dead_letter_exchange is None:
            assert m.dead_lettered == {"rejected": 0, "expired": 0, "maxlen": 0, "delivery_limit": 0}
            assert m.dropped["rejected"] == self.discarded_no_dlx
        else:
            assert m.dropped == {"rejected": 0, "expired": 0, "maxlen": 0, "delivery_limit": 0}
            assert m.dead_lettered == self.dl_counts
        if not self.settings.limited or self.settings.overflow == "drop-head":
            assert m.dropped["maxlen"] + m.dead_lettered["maxlen"] == 0 or self.settings.limited
        assert m.rejected_publishes == self.refused
        assert m.next_deadline_ms is None or m.next_deadline_ms >= m.now_ms or m._more_due or self.last_refused_or_due()
        # After a command: no expired head, limits kept (unless more is due at once).
        if not m._more_due and not getattr(self, "last_refused", False):
            for head in self.heads():
                assert head.expires_at_ms is None or head.expires_at_ms > m.now_ms
            if self.settings.limited and self.settings.overflow == "drop-head":
                self.within_limits()
        if m.backing is not None and m._spilled_total() == 0:
            assert m.ready_bytes == sum(self.size[s] for s in ready)


FeaturesModel.TestCase.settings = settings(max_examples=1000, stateful_step_count=60, deadline=None)
test_queue_features_against_ledger = FeaturesModel.TestCase


def test_a_consumer_cancelled_holding_a_partition_message_hands_over_at_once():
    """Found by the model (CI, 2026-12-05): c0 is cancelled holding a message of partition 3,
    the partition goes on to the next consumers, and c0 attaches again still holding it; the
    consumer the partition serves then gets messages beside c0's old one. That is the rule
    (queue.py, `_sac_consumer`: a cancelled consumer hands over at once, as in RabbitMQ), which
    the model's check missed when c0 came back."""
    m = FeaturesModel()
    m.setup(
        ttl=None,
        max_length=None,
        max_bytes=None,
        overflow="drop-head",
        dlx=False,
        max_priority=None,
        delivery_limit=None,
        backoff=None,
        sac=True,
        name="amq.partition-3.p",
    )
    steps = [
        ("checkout", {"consumer_id": "c0", "credit": 0, "no_ack": False, "prefetch": 0}),
        ("credit", {"consumer_id": "c0", "n": 1}),
        ("checkout", {"consumer_id": "c1", "credit": 0, "no_ack": False, "prefetch": 0}),
        ("enqueue", {"n": 2, "priority": 0, "ttl": None}),
        ("checkout", {"consumer_id": "c2", "credit": 0, "no_ack": False, "prefetch": 0}),
        ("advance", {"ms": 1}),
        ("cancel", {"consumer_id": "c0"}),
        ("credit", {"consumer_id": "c1", "n": 1}),
        ("checkout", {"consumer_id": "c0", "credit": 0, "no_ack": False, "prefetch": 0}),
    ]
    for name, kwargs in steps:
        getattr(m, name)(**kwargs)
        m.every_message_in_exactly_one_place()
    m.teardown()
    assert list(m.machine.consumers["c0"].checked_out) == [0]  # from before its cancel
    assert list(m.machine.consumers["c1"].checked_out) == [1]  # the partition's consumer now
