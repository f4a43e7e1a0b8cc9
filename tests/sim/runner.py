"""One seed of the simulation, start to end; and many seeds, on several processes.

Theory of operation: `World(seed)` draws everything from one `random.Random(seed)`: the shape
of the run (nodes, shards, steps, window size, how long a proposer retries, how often each
fault comes: swarm testing, so runs differ in kind, not only in detail) and every step. A step
moves the fake clock, then does one thing: a client action on a serving node (workload.py), or
a fault or a turn of the log (fake_log.py, proposer.py):

  commit    the oldest attempt in a group's log commits (with chaos: sometimes another one)
  lose      an attempt is lost; its proposer hears "not leader" or "busy"
  timeout   its proposer hears "timeout"; the attempt stays, and may commit later
  leader    a leader change: a suffix of a group's attempts is lost (with chaos: any of them,
            the rest shuffled), some are answered "timeout" although they will commit
  retry     the proposers propose again what they must
  watchdog  a node declares another down: OwnerDown("n@") and Down("n@") in every group
  restart   a node crashes and starts again from its replica's last snapshot, with a new life
  snapshot  a node's replica snapshots its groups
  pause / resume / install   a replica stops applying; catches up; or gets the witness's snapshot
  clock     a node's clock moves (entries' times go backwards between proposers)

Groups on a few nodes (layout.py, issue #19): some seeds (a draw of their own
`random.Random`, so that the others replay as before), or every one with `partial`, place each
shard group on 1 to 3 of 3 to 5 nodes, with a leader among its holders. A node's replica then
applies the metadata group and the groups it holds; for the others it has `Elsewhere`
(elsewhere.py: ClusterLog's glue around the real server/remote.py Sender and Receiver). The
leader's replica, as it applies, sends a non-holder the replies to its entries' requests and
their ends, its consumers' deliveries, "x" for an entry of its dead life; the other holders
perform only their own consumers' deliveries. A non-holder's entry is done at the leader's "e"
(or at its commit when nothing in it waits for a reply: proposer.py). Messages go over an
ordered link per pair of nodes (links.py). The events of such runs (their weights drawn from the
layout's random draw too):

  leader    as above, and the leadership moves to one of the group's holders (maybe the same);
            an old leader cut off loses the messages it had on its links
  elect     the same without the log's losses (a leadership transfer)
  link      the oldest message on a link arrives: a gap in a sender's numbers asks it for a resync
  drop      a message on a link is lost
  watch     a node's `_watch_remote` turn: resyncs for the groups it has come to lead, its queues'
            counts to the non-holders, gives up entries whose end never came
  restart / install   also: a restarted node's links are cut and its groups' leadership moves to
            another holder; a leader does not install a snapshot (it is never behind its own log)

At the drain, time passes for the counts to go out (a lost last message shows as a gap), and
every node watches and every message arrives, round after round, until nothing moves.

Two kinds of run (`chaos`): as Raft orders a group's log, where an attempt commits only after
every attempt appended before it that survives, and a later seq overtakes an earlier one only
through a retry; or in any order at all, which the apply order must still make right for each
life (the checks that rest on Raft's order, the consumers', are off then).

Then every replica not paused applies what was committed (the witness at once, entry by entry,
with the ledger's check after each; each node's batch of a group ends with its sender's
flush), and checks.py's checks run. At the end the faults stop, everything in flight commits
(`drain`), and the final checks run. Bugs of the server the checks know of (checks.py's
KNOWN_FINDINGS, all of groups on a few nodes) are counted in the outcome, not failed. No wall
clock, no set of strings iterated, no hash-dependent order: a seed replays exactly
(`python -m tests.sim --seed N`, with `--partial` for a run whose groups were put on a few nodes).
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Any

from .api import ALL_QUEUES, META_GROUP, Deliver, LivesDown, ends_life, md, qc, remote, shard_of
from .checks import Ledger, SimFailure, check_agreement, check_consumers, check_deliveries
from .elsewhere import REPLIES_WAIT_MS, STATS_EVERY_MS, Elsewhere
from .fake_log import FakeLog
from .layout import NODES_MAX, NODES_MIN, PARTIAL_SHARE, Layout, layout_rng
from .links import Links
from .proposer import Node
from .replica import Replica
from .workload import Workload

EVENTS = (
    "client",
    "commit",
    "lose",
    "timeout",
    "leader",
    "retry",
    "watchdog",
    "restart",
    "snapshot",
    "pause",
    "resume",
    "install",
    "clock",
)
BASE_WEIGHTS = {
    "client": 16,
    "commit": 16,
    "lose": 1,
    "timeout": 1,
    "leader": 0.5,
    "retry": 3,
    "watchdog": 0.3,
    "restart": 0.3,
    "snapshot": 0.7,
    "pause": 0.5,
    "resume": 1,
    "install": 0.3,
    "clock": 0.5,
}
# Events only of a run whose groups are on a few nodes (layout.py), their weights drawn from the
# layout's own random.Random (a run with every group everywhere draws as it did before them):
#   link      a message on its way between two nodes arrives (elsewhere.py)
#   drop      a message on its way is lost (the receiver asks for a resync at the next one)
#   watch     a node looks what it leads now, sends its queues' counts, gives up late entries
#   elect     a group's leadership moves to another holder, the log untouched (a transfer, or an
#             election that lost nothing); as with "leader", the old leader may have been cut off
PARTIAL_EVENTS = ("link", "drop", "watch", "elect")
PARTIAL_WEIGHTS = {"link": 8, "drop": 0.5, "watch": 2, "elect": 2}
START_MS = 1_800_000_000_000
DRAIN_ROUNDS_MAX = 40
DRAIN_COMMITS_MAX = 10_000


@dataclass
class Config:
    nodes: int
    shards: int
    steps: int
    window_max: int  # a queue's in-memory window: small ones spill to the backing
    outcome_wait_ms: int  # how long a proposer retries before it gives up (OUTCOME_WAIT_S)
    step_ms_max: int  # how far the clock moves in a step
    skew_ms_max: int  # how far a node's clock is off
    chaos: bool  # attempts commit in any order (else as Raft allows: see _commit)
    reorder: float  # with chaos: how often a commit takes another attempt than the oldest
    unknown: float  # how often a commit is answered "timeout" anyway
    weights: list[float]
    # SQS receives in the workload (workload.py): off unless asked, so that every seed without
    # them draws and does exactly what it did before they existed (the regression seeds).
    sqs: bool = False

    @classmethod
    def draw(cls, rng: random.Random, steps: int | None = None) -> Config:
        weights = [BASE_WEIGHTS[e] * rng.choice((0, 1, 1, 3)) for e in EVENTS]
        for always in ("client", "commit", "retry"):
            weights[EVENTS.index(always)] += BASE_WEIGHTS[always]
        return cls(
            nodes=rng.randint(2, 4),
            shards=rng.randint(1, 3),
            steps=steps if steps is not None else rng.randint(40, 240),
            window_max=rng.choice((2, 5, 65536, 65536)),
            outcome_wait_ms=rng.choice((0, 50, 1000, 10_000)),
            step_ms_max=rng.choice((0, 10, 200)),
            skew_ms_max=rng.choice((0, 5, 500)),
            chaos=rng.random() < 0.4,
            reorder=rng.choice((0.1, 0.5)),
            unknown=rng.choice((0.0, 0.05, 0.3)),
            weights=weights,
        )


class World:
    def __init__(
        self,
        seed: int,
        tracing: bool = False,
        steps: int | None = None,
        config: Config | None = None,
        sqs: bool = False,
        partial: bool | None = None,
    ) -> None:
        """`config`: a given shape instead of one drawn from the seed (scripted tests); `sqs`:
        SQS receives in the workload too; `partial`: groups on a few nodes (True), on every node
        (False), or as the seed's layout draw says (None; every node when `config` is given)."""
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.lines: list[str] | None = [] if tracing else None
        self.tracing = tracing
        drawn = config is None
        self.config = config = config if config is not None else Config.draw(rng, steps)
        if sqs:
            config.sqs = True
        self.shards = [f"shard-{i}" for i in range(config.shards)]
        placing = layout_rng(seed)
        if partial is None:
            partial = drawn and placing.random() < PARTIAL_SHARE
        self.partial_weights: list[float] = []
        if partial:
            config.nodes = placing.randint(NODES_MIN, NODES_MAX)
            self.layout = Layout.draw(placing, self.shards, config.nodes)
            self.partial_weights = [PARTIAL_WEIGHTS[e] * placing.choice((1, 1, 3)) for e in PARTIAL_EVENTS]
        else:
            self.layout = Layout.everywhere([f"n{i + 1}" for i in range(config.nodes)], self.shards)
        self.links = Links([f"n{i + 1}" for i in range(config.nodes)])
        self._sender_lives = 0
        self.groups = [META_GROUP, *self.shards]
        self.outcome_wait_ms = config.outcome_wait_ms
        self.now_ms = START_MS
        self.step_no = 0
        self._pids = 0
        self._numbers = 0
        self.log = FakeLog(self.groups)
        self.log.term_of = lambda group: self.layout.terms.get(group, 0)
        self.ledger = Ledger(self.log)
        self.witness = Replica("witness", self.shards, config.window_max)
        self.witness.observer = self.ledger.observe
        self.witness.on_entry = self.ledger.on_entry
        self.log.on_commit = self.ledger.on_commit
        self.nodes = [Node(self, f"n{i + 1}") for i in range(config.nodes)]
        for node in self.nodes:
            if self.layout.partial:
                node.held = frozenset(self.layout.held_by(node.name))
            self._attach(node, Replica(node.name, self.held_shards(node), config.window_max))
        if self.layout.partial:
            for node in self.nodes:
                node.elsewhere = Elsewhere(self, node)
        self.workload = Workload(self, rng)
        self.trace(f"seed {seed}: {config}")
        if self.layout.partial:
            self.trace(f"groups on a few nodes: holders {self.layout.holders}, leaders {self.layout.leaders}")
        for node in self.nodes:
            node.start()

    # ---------------------------------------------------------------- helpers

    def trace(self, line: str) -> None:
        if self.lines is not None:
            self.lines.append(line)

    def next_pid(self) -> int:
        self._pids += 1
        return self._pids

    def next_number(self) -> int:
        self._numbers += 1
        return self._numbers

    def group_of(self, key: tuple[str, str]) -> str:
        return shard_of(key, len(self.shards))

    def held_shards(self, node: Node) -> list[str]:
        return self.layout.held_by(node.name) if self.layout.partial else self.shards

    def next_sender_life(self, name: str) -> str:
        """A node's process's sending life (remote.Sender's; numbered, not drawn: a seed replays)."""
        self._sender_lives += 1
        return f"{name}~{self._sender_lives}"

    def _attach(self, node: Node, replica: Replica) -> None:
        """The node performs what its own replica applies: completions, deliveries, cut-offs; and,
        leading a group held by a few, what the others must hear of it (elsewhere.py)."""
        node.replica = replica
        prefix = node.name + "@"
        get_prefix = "get:" + prefix

        def observe(
            group: str, index: int, entry: Any, target: Any, command: Any, request: int, reply: Any, effects: list
        ) -> None:
            glue = node.elsewhere
            if glue is not None and group != META_GROUP:
                # ClusterLog._apply_entry and the Applier: a non-holder's reply goes first (its
                # consume-ok before the first delivery), then the deliveries, routed.
                elsewhere = glue.replies_to(group, entry.origin)
                if elsewhere is not None and request:
                    glue.sender.reply(elsewhere, group, entry.origin, request, reply)
                if effects and target is not None:
                    effects = glue.deliveries_here(group, effects, index)
            for effect in effects:
                kind = type(effect)
                if kind is Deliver:
                    if effect.consumer_id.startswith(prefix):
                        node.on_deliver(effect.consumer_id, effect.message)
                elif kind is LivesDown:
                    if ends_life(effect, node.life, replica.broker.groups[group].order):
                        # ClusterLog.lives_down: that ended this node's life there
                        node.cut_off(f"{effect.origin} declared {prefix} down in {group}")
                    if glue is not None and group != META_GROUP and effect.ended:
                        # the Applier: a node holding no replica is told the lives this ended
                        glue.sender.lives_ended(group, effect.prefix, effect.ended)
            if type(command) is qc.Checkout and entry.origin == node.life:
                node.on_checkout(group, entry.seq, command.consumer_id, reply is True)
            elif (
                type(command) is qc.Get
                and type(reply) is tuple
                and not command.no_ack
                and command.consumer_id.startswith(get_prefix)
            ):
                node.on_get(command.consumer_id, target, reply[0].seq)

        def on_entry(group: str, index: int, entry: Any) -> None:
            if entry.origin == node.life:
                node.applied_own(group, entry.seq)
            elif node.elsewhere is not None and group != META_GROUP:
                elsewhere = node.elsewhere.replies_to(group, entry.origin)
                if elsewhere is not None and remote.end_awaited(entry.items):
                    node.elsewhere.sender.entry_done(elsewhere, group, entry.origin, entry.seq)

        def on_dead_origin(group: str, origin: str) -> None:
            if origin == node.life:
                node.cut_off(f"an entry of its life came to {group}, where the life is dead")
            elif node.elsewhere is not None and group != META_GROUP:
                node.elsewhere.sender.dead(group, origin)  # (to its node, if it holds no replica)

        replica.observer = observe
        replica.on_entry = on_entry
        replica.on_dead_origin = on_dead_origin

    # ------------------------------------------------------------------ steps

    def run(self) -> None:
        for _ in range(self.config.steps):
            self.step()
        self.drain()
        self.final_checks()

    def step(self) -> None:
        self.step_no += 1
        rng = self.rng
        self.now_ms += rng.randint(0, self.config.step_ms_max)
        if self.partial_weights:
            event = rng.choices(EVENTS + PARTIAL_EVENTS, self.config.weights + self.partial_weights)[0]
        else:
            event = rng.choices(EVENTS, self.config.weights)[0]
        if self.tracing:
            self.trace(f"step {self.step_no} t={self.now_ms - START_MS}: {event}")
        getattr(self, "_" + event)()
        self.catch_up()
        self.check()

    def _serving(self) -> list[Node]:
        return [node for node in self.nodes if node.serving]

    def _client(self) -> None:
        serving = self._serving()
        if serving:
            self.workload.act(self.rng.choice(serving))

    def _pick_copy(self, unanswered: bool = False) -> tuple[str, int] | None:
        choices = [
            (group, i)
            for group, copies in self.log.in_flight.items()
            for i, copy in enumerate(copies)
            if not unanswered or not copy.answered
        ]
        return self.rng.choice(choices) if choices else None

    def _commit(self) -> None:
        groups = [group for group, copies in self.log.in_flight.items() if copies]
        if not groups:
            return
        group = self.rng.choice(groups)
        position = 0
        if self.config.chaos and self.rng.random() < self.config.reorder:
            position = self.rng.randrange(len(self.log.in_flight[group]))
        self.commit(group, position, self.rng.random() < self.config.unknown)

    def commit(self, group: str, position: int, unknown: bool) -> None:
        copy, index = self.log.commit(group, position)
        proposal = copy.proposal
        if self.tracing:
            self.trace(f"  commit {proposal} at {group}:{index}{' (answered timeout)' if unknown else ''}")
        if not copy.answered:
            proposal.node.answer(proposal, "timeout" if unknown else None)
        self.witness.apply(group, index, proposal.payload)
        self.ledger.after_entry(self.witness, group)

    def _lose(self) -> None:
        picked = self._pick_copy()
        if picked is not None:
            copy = self.log.lose(*picked)
            group = copy.proposal.group
            if copy.term < self.layout.terms.get(group, 0):
                # (counted before the leader's first entry at its hand-over: that entry comes one
                # place earlier now, as the new leader's log holds no such attempt)
                self.layout.term_from[group] -= 1
            error = self.rng.choice(("not leader", "busy"))
            if self.tracing:
                self.trace(f"  lose {copy.proposal}{'' if copy.answered else ': ' + error}")
            if not copy.answered:
                copy.proposal.node.answer(copy.proposal, error)

    def _timeout(self) -> None:
        picked = self._pick_copy(unanswered=True)
        if picked is not None:
            copy = self.log.in_flight[picked[0]][picked[1]]
            copy.answered = True
            if self.tracing:
                self.trace(f"  timeout {copy.proposal} (it may still commit)")
            copy.proposal.node.answer(copy.proposal, "timeout")

    def _leader(self) -> None:
        """A leader change in one group. As Raft: the new leader's log has a prefix of the old
        leader's uncommitted entries and the rest is gone; the old leader answered some of them,
        the others hear "timeout" (they may be in the new log) or "not leader". With chaos, the
        new leader has any of them, in any order."""
        group = self.rng.choice(self.groups)
        copies = self.log.in_flight[group]
        if self.config.chaos:
            self.rng.shuffle(copies)
            survives = [self.rng.random() < 0.7 for _ in copies]
        else:
            keep = self.rng.randint(0, len(copies))
            survives = [i < keep for i in range(len(copies))]
        if self.tracing:
            self.trace(f"  leader change in {group}: {sum(survives)} of {len(copies)} attempts survive")
        answers = []
        for copy, survived in zip(copies, survives, strict=False):
            if not copy.answered and (not survived or self.rng.random() < 0.5):
                copy.answered = True
                answers.append((copy.proposal, "timeout" if survived or self.rng.random() < 0.5 else "not leader"))
        self.log.in_flight[group] = [copy for copy, survived in zip(copies, survives, strict=False) if survived]
        if self.layout.partial and group != META_GROUP:
            self._move_leadership(group)
        for proposal, error in answers:  # (after: an answer may propose, a tombstone say)
            proposal.node.answer(proposal, error)

    def _move_leadership(self, group: str) -> None:
        """A holder (maybe the same) leads the group now. One that lost its leadership by being
        cut off lost what it had sent on the way (the jepsen-style harness's FIFO bug: only the
        new leader's resync covers it)."""
        old = self.layout.leaders[group]
        if self._hand_over(group, self.rng.choice(self.layout.holders[group])) and self.rng.random() < 0.5:
            lost = self.links.cut(old, outgoing_only=True)
            self.trace(f"  {old} was cut off: {lost} of its messages are lost on the way")

    def _hand_over(self, group: str, leader: str) -> bool:
        """The sending role moves with the leadership (Sender reads it at each batch); True if it moved."""
        if self.layout.leaders[group] == leader:
            return False
        old = self.layout.leaders[group]
        self.trace(f"  {leader} leads {group} now (was {old})")
        self.layout.hand_over(group, leader, self._next_term_from(group))
        return True

    def _next_term_from(self, group: str) -> int:
        """A new leader's first entry's index: after what is committed and what survives in flight
        (as Raft, its no-op follows its log; with chaos, an approximation)."""
        return len(self.log.committed[group]) + len(self.log.in_flight[group]) + 1

    def _retry(self) -> None:
        for node in self.nodes:
            node.retry()

    def _watchdog(self) -> None:
        serving = self._serving()
        if not serving:
            return
        judge = self.rng.choice(serving)
        others = [node for node in self.nodes if node is not judge]
        node = self.rng.choice(others)
        prefix = node.name + "@"
        self.trace(f"  {judge.name} declares {prefix} down")
        judge.submit(META_GROUP, [(None, md.OwnerDown(prefix))])
        for group in self.shards:
            judge.submit(group, [(ALL_QUEUES, qc.Down(prefix))])

    def _restart(self) -> None:
        node = self.rng.choice(self.nodes)
        snapshot = node.snapshot
        self.trace(
            f"  {node.name} restarts from {'nothing' if snapshot is None else {g: i for g, (i, _) in snapshot.items()}}"
        )
        replica = Replica.restored(node.name, self.held_shards(node), self.config.window_max, snapshot)
        replica.check_invariants()
        self._attach(node, replica)
        node.paused = False
        if node.elsewhere is not None:
            # Its connections went with the process; a group it led is led by another holder.
            self.links.cut(node.name)
            node.elsewhere.start()
            for group in self.layout.held_by(node.name):
                others = [h for h in self.layout.holders[group] if h != node.name]
                if self.layout.leads(node.name, group) and others:
                    self._hand_over(group, self.rng.choice(others))
                elif self.layout.leads(node.name, group):
                    # (its only holder: it leads again once elected, in a new term, and replays
                    # its log from its snapshot as that term's leader)
                    self.trace(f"  {node.name} leads {group} again, in a new term")
                    self.layout.hand_over(group, node.name, self._next_term_from(group))
        node.restart()

    def _snapshot(self) -> None:
        node = self.rng.choice(self.nodes)
        node.snapshot = node.replica.snapshot()
        self.trace(f"  {node.name} snapshots at {node.replica.applied}")

    def _pause(self) -> None:
        node = self.rng.choice(self.nodes)
        node.paused = True
        self.trace(f"  {node.name}'s replica pauses at {node.replica.applied}")

    def _resume(self) -> None:
        paused = [node for node in self.nodes if node.paused]
        if paused:
            node = self.rng.choice(paused)
            node.paused = False
            self.trace(f"  {node.name}'s replica resumes")

    def _install(self) -> None:
        """A member behind the compacted log gets the leader's snapshot (here the witness's)."""
        paused = [node for node in self.nodes if node.paused]
        if self.layout.partial:  # (a leader is never behind its own log)
            paused = [node for node in paused if not any(self.layout.leads(node.name, g) for g in self.shards)]
        if not paused:
            return
        node = self.rng.choice(paused)
        snapshot = self.witness.snapshot()
        self.trace(f"  {node.name} installs a snapshot at {self.witness.applied}")
        replica = Replica.restored(node.name, self.held_shards(node), self.config.window_max, snapshot)
        replica.check_invariants()
        old_life = node.life
        self._attach(node, replica)
        node.paused = False
        node.stale_channels.update(dict.fromkeys(node.channels))
        # ClusterLog._load_snapshot: this life's entries the snapshot covers are done; a life
        # the snapshot says is dead starts again.
        for group in replica.applied:
            order = replica.broker.groups[group].order
            below = order.applied_below(node.life)
            for (g, seq), _proposal in list(node.in_flight.items()):
                if g == group and seq < below:
                    node.applied_own(g, seq)
            if node.life == old_life and order.is_dead(node.life):
                node.cut_off(f"the snapshot of {group} says its life is dead")

    def _clock(self) -> None:
        node = self.rng.choice(self.nodes)
        node.skew_ms = self.rng.randint(-self.config.skew_ms_max, self.config.skew_ms_max)

    def _link(self) -> None:
        busy = self.links.busy()
        if busy:
            self.deliver(self.rng.choice(busy))

    def deliver(self, link: tuple[str, str]) -> None:
        """The oldest message on a link arrives."""
        sender, receiver = link
        payload = self.links.take(link)
        self.nodes[int(receiver[1:]) - 1].elsewhere.receive(sender, payload)

    def _drop(self) -> None:
        dropped = self.links.drop(self.rng)
        if dropped is not None:
            (sender, receiver), position = dropped
            self.trace(f"  a message from {sender} to {receiver} is lost (#{position + 1} on its way)")

    def _elect(self) -> None:
        groups = [group for group in self.shards if len(self.layout.holders[group]) > 1]
        if groups:
            self._move_leadership(self.rng.choice(groups))

    def _watch(self) -> None:
        self.rng.choice(self.nodes).elsewhere.watch()

    def exchange(self) -> None:
        """Every node looks (`watch`), then every message on its way arrives, until none is left."""
        for node in self.nodes:
            node.elsewhere.watch()
        for _ in range(DRAIN_COMMITS_MAX):
            busy = self.links.busy()
            if not busy:
                break
            for link in busy:
                self.deliver(link)
        else:
            raise SimFailure(f"exchange: more than {DRAIN_COMMITS_MAX} rounds of messages")
        self.catch_up()
        self.check()

    # ---------------------------------------------------------------- applying

    def catch_up(self) -> None:
        committed = self.log.committed
        for node in self.nodes:
            if node.paused:
                continue
            replica = node.replica
            for group in self.groups:
                if group not in replica.applied:
                    continue  # (a group held elsewhere)
                entries = committed[group]
                # (bounded by the log's length; a reaction may commit nothing, only propose)
                for index in range(replica.applied[group] + 1, len(entries) + 1):
                    if replica is not node.replica:
                        break  # (a reaction replaced the replica: never, but say so if it did)
                    replica.apply(group, index, entries[index - 1].payload)
                if node.elsewhere is not None:
                    node.elsewhere.flush()  # (the end of the batch: what it gathered goes out)

    def check(self) -> None:
        check_agreement(self.witness, [node.replica for node in self.nodes if not node.paused])
        self.witness.check_invariants()

    # ------------------------------------------------------------------- the end

    def drain(self) -> None:
        """The faults stop: every replica applies, every attempt commits, until nothing moves."""
        self.trace("drain")
        for node in self.nodes:
            node.paused = False
        if self.layout.partial:
            self.now_ms += STATS_EVERY_MS  # (time passes: the leaders' counts go out, a lost last message shows)
        for _ in range(DRAIN_ROUNDS_MAX):
            for node in self.nodes:
                node.retry()
            self.settle()
            if self.layout.partial:
                self.exchange()
            if self._quiet():
                return
            self.now_ms += self.outcome_wait_ms + 1  # what still waits gives up
            if self.layout.partial:
                self.now_ms += REPLIES_WAIT_MS  # (and an entry whose end never came from its leader)
        raise SimFailure(f"drain: still moving after {DRAIN_ROUNDS_MAX} rounds: {self._unsettled()}")

    def settle(self, groups: list[str] | None = None) -> None:
        """Commit every attempt in flight (in the groups given), oldest first, and apply."""
        for _ in range(DRAIN_COMMITS_MAX):
            pending = [group for group in groups or self.groups if self.log.in_flight[group]]
            if not pending:
                break
            self.commit(pending[0], 0, False)
        else:
            raise SimFailure(f"settle: more than {DRAIN_COMMITS_MAX} commits")
        self.catch_up()
        self.check()

    def _quiet(self) -> bool:
        return (
            not self.log.pending()
            and not self.links.pending()
            and all(not node.retries and not node.in_flight and node.serving for node in self.nodes)
        )

    def _unsettled(self) -> str:
        return "; ".join(
            f"{node.name} ({node.life}): in flight {list(node.in_flight.values())}, "
            f"retries {node.retries}, barrier waiting {list(node.barrier_waiting)}"
            for node in self.nodes
        )

    def final_checks(self) -> None:
        replicas = [node.replica for node in self.nodes]
        for group in self.groups:
            for replica in replicas:
                if group in replica.applied:
                    assert replica.applied[group] == self.witness.applied[group] == len(self.log.committed[group])
        check_agreement(self.witness, replicas)
        for replica in replicas:
            replica.check_invariants(all_queues=True)
        self.ledger.final(self.witness, [node.life for node in self.nodes])
        if not self.config.chaos:
            check_consumers(self.witness, self.nodes, self.ledger.known)
            check_deliveries(self.witness, self.nodes, self.ledger.known, self.links.asks_lost)


# ---------------------------------------------------------------------- many


@dataclass
class Outcome:
    seed: int
    ok: bool
    error: str = ""
    steps: int = 0
    known: list[str] = field(default_factory=list)  # known findings seen (checks.KNOWN_FINDINGS)


def run_seed(
    seed: int,
    tracing: bool = False,
    steps: int | None = None,
    plant: str | None = None,
    sqs: bool = False,
    partial: bool | None = None,
) -> tuple[Outcome, World]:
    """One seed; `plant`: with that bug put back (plants.py); `sqs`: with SQS receives;
    `partial`: True for groups on a few nodes whatever the seed's layout draw says (layout.py)."""
    from .plants import planted

    with planted(plant):
        world = World(seed, tracing=tracing, steps=steps, sqs=sqs, partial=partial)
        try:
            world.run()
        except Exception as exc:  # an assertion of the machines, the glue's, or a check: all failures
            if world.lines is not None:
                world.lines.append(f"FAILED at step {world.step_no}: {type(exc).__name__}: {exc}")
            return Outcome(seed, False, f"{type(exc).__name__}: {exc}", world.step_no, world.ledger.known), world
    if world.lines is not None:
        world.lines.extend(f"known finding: {known}" for known in world.ledger.known)
    return Outcome(seed, True, "", world.step_no, world.ledger.known), world


def replay_command(seed: int, sqs: bool = False, partial: bool | None = None) -> str:
    return f"python -m tests.sim --seed {seed}" + (" --sqs" if sqs else "") + (" --partial" if partial else "")


def _run_range(args: tuple[int, int, str | None, bool, bool | None]) -> tuple[int, list[Outcome], list[Outcome]]:
    start, count, plant, sqs, partial = args
    failures = []
    noted = []
    for seed in range(start, start + count):
        outcome, _world = run_seed(seed, plant=plant, sqs=sqs, partial=partial)
        if not outcome.ok:
            failures.append(outcome)
        elif outcome.known:
            noted.append(outcome)
    return count, failures, noted


def run_seeds(
    first: int,
    count: int,
    workers: int = 1,
    chunk: int = 500,
    progress=None,
    plant: str | None = None,
    sqs: bool = False,
    partial: bool | None = None,
    noted: list[Outcome] | None = None,
) -> tuple[int, list[Outcome], float]:
    """Seeds first .. first+count-1; returns (seeds run, failures, seconds), and adds to `noted`
    the seeds that passed with a known finding. Worker processes are started here and always
    joined here (a pool in a `with`)."""
    started = time.monotonic()
    chunks = [(s, min(chunk, first + count - s), plant, sqs, partial) for s in range(first, first + count, chunk)]
    ran = 0
    failures: list[Outcome] = []
    if workers <= 1:
        for args in chunks:
            n, failed, known = _run_range(args)
            ran += n
            failures.extend(failed)
            if noted is not None:
                noted.extend(known)
            if progress:
                progress(ran, failures, time.monotonic() - started)
    else:
        import multiprocessing

        context = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
        with context.Pool(workers) as pool:
            for n, failed, known in pool.imap(_run_range, chunks):
                ran += n
                failures.extend(failed)
                if noted is not None:
                    noted.extend(known)
                if progress:
                    progress(ran, failures, time.monotonic() - started)
    failures.sort(key=lambda o: o.seed)
    if noted is not None:
        noted.sort(key=lambda o: o.seed)
    return ran, failures, time.monotonic() - started
