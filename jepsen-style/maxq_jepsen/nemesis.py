"""Nemeses (the faults) and the seeded schedule that drives them.

Theory of operation: a nemesis has two verbs, `start(lab, rng)` (apply the fault, return what was
done) and `heal(lab)` (undo it, idempotent: the final heal calls it on every nemesis). The runner
records both in the history as nemesis operations: an `invoke` of f=<name>, then `ok` with the
description, and f="heal" for the undo. A description may name `minority` nodes (those cut off
from a majority until the next heal): the checker then treats any confirm from them, for a
publish invoked inside that window, as fatal. Only network faults ever do that, so on today's
single node no nemesis does.

The schedule is a list of cycles (quiet seconds, nemesis, fault seconds) drawn from the run's
seed alone, and fault targets come from a seeded RNG too, so a run's faults are reproducible.

What runs (NEMESES):
  kill              SIGKILL a random node (on bigger clusters sometimes a minority of them);
                    restart on the same data folder and ports at heal
  kill-leader       SIGKILL the leader of the workload queue's shard group (cluster)
  pause             SIGSTOP a random node (minority), SIGCONT at heal
  pause-leader      SIGSTOP the shard's leader (cluster)
  partition-one     isolate one random node both ways (netns lab); minority = that node
  partition-leader  isolate the shard's leader (netns lab); minority = the leader
  partition-halves  a random split into a minority and a majority (netns lab)
  one-way           drop one random node's outgoing packets only (netns lab): it still hears the
                    others; no minority is claimed (what it may confirm depends on who leads)
  membership        remove a follower (maxqctl remove-node, asked of another member; the broker
                    stops it); heal: wipe its data folder, start it with `--join on` (same name,
                    address, ports), maxqctl add-node it back, wait for its ready line (caught up)
  kill-majority     SIGKILL a majority of the nodes at once; minority = the survivors (with a
                    majority dead nothing they are asked can commit); restart all at heal
  bridge            two sides cut from each other, one node (the bridge) sees both (netns lab);
                    no minority: every node reaches a majority through the bridge
  partition-majorities-ring
                    every node sees a different majority (netns lab, 5+ nodes); no minority
  loss              drop 20-30 % (seeded) of the leader's packets to and from its peers, or of a
                    random node's (netns lab; an nft `numgen random` rule); no minority
  delay             hold the leader's packets to and from its peers 50-200 ms each (netns lab;
                    iptables NFQUEUE + delayer.py in its namespace); the delayer stops at heal
  disk-stall        hold the leader's writes and fsyncs (its data folder is a FUSE passthrough,
                    stallfs.py, mounted for the whole run when the run includes this nemesis)
  disk-full         fill the filesystem of the leader's (or, half the time, a random node's) data
                    folder but 0 B (half the time) to 8 MiB, seeded, which the node's own writes use up:
                    short writes, ENOSPC, its disk alarm; heal deletes the ballast (each data
                    folder is a 1 GiB tmpfs for the whole run, lab feature "diskfull", root).
                    No minority: a node that cannot store must not confirm, which the checker
                    judges as loss once the node has restarted from what it did store; its
                    record names the node in `full_disk` (see the checker's
                    nacked_delivered_store_failed)
  clock-skew        move one node's wall clock (libfaketime skew file, monotonic untouched) by
                    30 s to 10 min, forward or back; heal sets it back to +0
  move              (a cluster started with --replication-factor: groups on a few members) move
                    a shard group's replica (the queue's group half the time) to a member without
                    one, move every replica off a member, or rebalance (maxqctl move-group,
                    drain-replicas, rebalance); heal: rebalance. Overlaps the other faults
The leader comes from the cluster status (`Lab.leader_of`, highest term wins); when no member
names one, the nemesis falls back to a random node and says so (`leader: null`).
A partition's `minority` is `faults.minority_of(cuts)` (nodes whose connected component is below
quorum), never a guess. Each nemesis names the tools it needs (`TOOLS`); `missing_tools` is the
preflight: a nemesis whose tool is missing is refused with the reason, never silently skipped.

Overlap (`make_schedule(..., overlap=("membership",))`): the membership nemesis then runs during
other faults instead of in its own cycles: in a cycle marked `with_` the runner starts the fault,
starts the removal in a thread of its own (maxqctl calls only), heals the fault when its window
ends, waits for the removal to be done, then adds the member back. disk-full overlaps the same
way (`overlap=("membership", "disk-full")`: each cycle carries at most one of them): a member's
disk fills during another fault and is emptied after that fault's heal.
"""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
import time
from dataclasses import asdict, dataclass

from . import faults
from .lab import Lab, LabError, Node, faketime_library, run_maxqctl

RESTART_TIMEOUT_S = 90.0  # a restarted member is ready once it has caught up: slow on 2 shared cores
CYCLES_MAX = 1000
VHOST = "/"

NOT_YET: dict[str, str] = {}  # every fault on the menu is built
CLUSTER_NEMESES = NOT_YET  # the old name (the cluster nemeses that are not built yet)


class NemesisError(Exception):
    pass


class Nemesis:
    name = "abstract"
    needs_cluster = False  # needs more than one node
    needs_network = False  # needs a lab that can cut links (netns)
    nodes_min = 1
    feature = None  # a lab feature that must be set up before the nodes start ("disk", "clock")

    def __init__(self, queue: str = "jepsen") -> None:
        self.queue = queue

    def start(self, lab: Lab, rng: random.Random) -> dict:
        raise NotImplementedError

    def heal(self, lab: Lab) -> dict:
        raise NotImplementedError


def _targets(lab: Lab, rng: random.Random) -> list:
    """One random node, or on bigger labs sometimes a minority of them (never all of a majority)."""
    nodes = list(lab.nodes)
    if len(nodes) <= 2:
        return [rng.choice(nodes)]
    return rng.sample(nodes, rng.randint(1, (len(nodes) - 1) // 2))


class KillNemesis(Nemesis):
    """SIGKILL (a crash); the node stays down for the fault window and restarts on its data at heal."""

    name = "kill"

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.killed: list = []

    def choose(self, lab: Lab, rng: random.Random) -> tuple[list[Node], dict]:
        return _targets(lab, rng), {}

    def start(self, lab: Lab, rng: random.Random) -> dict:
        targets, extra = self.choose(lab, rng)
        for node in targets:
            node.kill()
            self.killed.append(node)
        return {"targets": [n.name for n in targets], **extra}

    def heal(self, lab: Lab) -> dict:
        restarted = []
        for node in list(self.killed):
            if not node.alive():
                node.start(RESTART_TIMEOUT_S)
                restarted.append(node.name)
            self.killed.remove(node)
        return {"restarted": restarted}


class PauseNemesis(Nemesis):
    """SIGSTOP for the fault window (longer than any heartbeat), SIGCONT at heal."""

    name = "pause"

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.paused: list = []

    def choose(self, lab: Lab, rng: random.Random) -> tuple[list[Node], dict]:
        return _targets(lab, rng), {}

    def start(self, lab: Lab, rng: random.Random) -> dict:
        chosen, extra = self.choose(lab, rng)
        targets = [n for n in chosen if n.alive()]
        for node in targets:
            node.pause()
            self.paused.append(node)
        return {"targets": [n.name for n in targets], **extra}

    def heal(self, lab: Lab) -> dict:
        resumed = []
        for node in list(self.paused):
            node.resume()
            resumed.append(node.name)
            self.paused.remove(node)
        return {"resumed": resumed}


def queue_leader(lab: Lab, queue: str, rng: random.Random) -> tuple[Node, dict]:
    """The leader of the queue's shard group, or a random live node when no member names one."""
    group = lab.queue_group(VHOST, queue)
    leader = lab.leader_of(group)
    if leader is None:
        live = [n for n in lab.nodes if n.alive() and not n.paused] or list(lab.nodes)
        return rng.choice(live), {"group": group, "leader": None}
    return leader, {"group": group, "leader": leader.name}


class KillMajorityNemesis(KillNemesis):
    """SIGKILL a majority at once (`kill` takes one node or a minority); all restart at heal,
    launched together (a lone restarted member could not reach a quorum to catch up with).

    minority = the survivors: with a majority dead, nothing invoked on them from now to the heal
    can commit, so a confirm from them in that window is fatal (the checker's rule)."""

    name = "kill-majority"
    needs_cluster = True

    def start(self, lab: Lab, rng: random.Random) -> dict:
        names = [n.name for n in lab.nodes]
        targets = [lab.node(n) for n in sorted(rng.sample(names, faults.quorum(len(names))))]
        placement = held_placement(lab)  # (before the kill: the survivors may not all answer after)
        for node in targets:
            node.kill()
            self.killed.append(node)
        survivors = sorted(n for n in names if n not in {t.name for t in targets})
        minority = held_minority(placement, survivors, {n: survivors for n in survivors})
        return {"targets": [n.name for n in targets], "minority": minority, **_unclaimed(survivors, minority)}

    def heal(self, lab: Lab) -> dict:
        down = [n for n in self.killed if not n.alive()]
        for node in down:
            node.launch()
        for node in down:
            node.wait_ready(RESTART_TIMEOUT_S)
        self.killed.clear()
        return {"restarted": [n.name for n in down]}


class KillLeaderNemesis(KillNemesis):
    """SIGKILL the leader of the queue's shard (the node that orders its log), restart at heal."""

    name = "kill-leader"
    needs_cluster = True

    def choose(self, lab, rng):
        leader, extra = queue_leader(lab, self.queue, rng)
        return [leader], extra


class PauseLeaderNemesis(PauseNemesis):
    """SIGSTOP the leader of the queue's shard for the fault window (longer than the 3 s down timeout)."""

    name = "pause-leader"
    needs_cluster = True

    def choose(self, lab, rng):
        leader, extra = queue_leader(lab, self.queue, rng)
        return [leader], extra


class PartitionNemesis(Nemesis):
    """Cut links (nft drop rules in the switch namespace); heal removes them all at once.

    `minority` in the description names the nodes cut off from any majority: from this record
    to the next heal, a confirm they give for a publish invoked in the window is fatal."""

    name = "partition"
    needs_cluster = True
    needs_network = True

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.active = False

    def plan(self, lab: Lab, rng: random.Random) -> tuple[list[tuple[str, str]], list[str], dict]:
        raise NotImplementedError

    def start(self, lab: Lab, rng: random.Random) -> dict:
        cuts, minority, extra = self.plan(lab, rng)
        # A claim is only ever as strong as the cuts: never more than minority_of says.
        names = [n.name for n in lab.nodes]
        assert set(minority) <= set(faults.minority_of(names, cuts)), (minority, cuts)
        placement = held_placement(lab)
        sides = {n: component for component in faults.components(names, cuts) for n in component}
        claimed = held_minority(placement, minority, sides)
        lab.partition(cuts)
        self.active = True
        return {
            "cuts": [f"{a}->{b}" for a, b in cuts],
            "minority": sorted(claimed),
            **_unclaimed(minority, claimed),
            **extra,
        }

    def heal(self, lab: Lab) -> dict:
        was = self.active
        lab.heal_network()
        self.active = False
        return {"healed": was}


def _isolate(lab: Lab, side: list[str]) -> list[tuple[str, str]]:
    """Both directions between `side` and every other node."""
    others = [n.name for n in lab.nodes if n.name not in side]
    return [(a, b) for a in side for b in others] + [(b, a) for a in side for b in others]


class PartitionOneNemesis(PartitionNemesis):
    name = "partition-one"

    def plan(self, lab, rng):
        node = rng.choice(lab.nodes).name
        return _isolate(lab, [node]), [node], {}


class PartitionLeaderNemesis(PartitionNemesis):
    name = "partition-leader"

    def plan(self, lab, rng):
        leader, extra = queue_leader(lab, self.queue, rng)
        return _isolate(lab, [leader.name]), [leader.name], extra


class PartitionHalvesNemesis(PartitionNemesis):
    name = "partition-halves"

    def plan(self, lab, rng):
        names = [n.name for n in lab.nodes]
        rng.shuffle(names)
        minority = sorted(names[: (len(names) - 1) // 2] or names[:1])
        return _isolate(lab, minority), minority, {"majority": sorted(set(names) - set(minority))}


class OneWayNemesis(PartitionNemesis):
    name = "one-way"

    def plan(self, lab, rng):
        node = rng.choice(lab.nodes).name
        return [(node, other.name) for other in lab.nodes if other.name != node], [], {"silenced": node}


class BridgeNemesis(PartitionNemesis):
    """Two sides that cannot talk, one node that talks to both (Jepsen's bridge)."""

    name = "bridge"

    def plan(self, lab, rng):
        names = [n.name for n in lab.nodes]
        cuts, extra = faults.bridge_plan(names, rng)
        return cuts, faults.minority_of(names, cuts), extra


class MajoritiesRingNemesis(PartitionNemesis):
    """Each node sees itself and its nearest neighbours on a random ring: a different majority each."""

    name = "partition-majorities-ring"
    nodes_min = faults.RING_NODES_MIN

    def plan(self, lab, rng):
        names = [n.name for n in lab.nodes]
        try:
            cuts, extra = faults.ring_plan(names, rng)
        except ValueError as exc:
            raise NemesisError(str(exc)) from None
        return cuts, faults.minority_of(names, cuts), extra


def _leader_or_random(lab: Lab, queue: str, rng: random.Random) -> tuple[Node, dict]:
    """The queue's shard leader most of the time, a random node otherwise (seeded): a fault on the
    leader's links hurts the most, one on a follower's tests the other side of the same code."""
    if rng.random() < 0.75:
        return queue_leader(lab, queue, rng)
    return rng.choice(lab.nodes), {"random": True}


class LossNemesis(Nemesis):
    """Random loss on one node's links (both directions) with an nft `numgen random` rule in the
    switch. Raft retransmits over TCP; no minority is claimed (a lossy link still delivers)."""

    name = "loss"
    needs_cluster = True
    needs_network = True

    def start(self, lab, rng):
        node, extra = _leader_or_random(lab, self.queue, rng)
        percent = rng.randint(*faults.LOSS_PERCENT_RANGE)
        lab.set_loss({node.name: percent})
        return {"targets": [node.name], "percent": percent, "minority": [], **extra}

    def heal(self, lab):
        was = dict(getattr(lab, "loss", {}))
        dropped = lab.heal_loss()
        return {"healed": sorted(was), **({"dropped_packets": dropped} if dropped is not None else {})}


DELAY_MS = (50.0, 200.0)


class DelayNemesis(Nemesis):
    """Delay the leader's packets to and from its peers (50-200 ms each way, per packet), through
    an NFQUEUE delayer in its namespace. No minority claimed. Heal removes the rules and stops the
    delayer (it lets what it holds go first); teardown does the same if a heal never ran."""

    name = "delay"
    needs_cluster = True
    needs_network = True

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.delayed: Node | None = None

    def start(self, lab, rng):
        if self.delayed is not None:
            return {"skipped": f"{self.delayed.name} is still delayed"}
        node, extra = queue_leader(lab, self.queue, rng)
        seed = str(rng.randrange(2**32))
        self.delayed = node
        lab.start_delay(node, *DELAY_MS, seed)
        return {"targets": [node.name], "delay_ms": list(DELAY_MS), "minority": [], **extra}

    def heal(self, lab):
        node, self.delayed = self.delayed, None
        if node is None:
            return {"stopped": []}
        return {"stopped": [node.name], "delayer": lab.stop_delay(node)}


class DiskStallNemesis(Nemesis):
    """Hold every write and fsync of the leader's data folder (stallfs) for the fault window."""

    name = "disk-stall"
    feature = "disk"

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.stalled: list[Node] = []

    def start(self, lab, rng):
        if lab.clustered:
            node, extra = queue_leader(lab, self.queue, rng)
        else:
            node, extra = lab.nodes[0], {}
        lab.stall_disk(node, True)
        self.stalled.append(node)
        return {"targets": [node.name], **extra}

    def heal(self, lab):
        released = []
        for node in list(self.stalled):
            lab.stall_disk(node, False)
            released.append(node.name)
            self.stalled.remove(node)
        return {"released": released}


# Half the fills leave nothing: the node meets ENOSPC before its disk alarm (polled) blocks its
# publishers; the others leave room for its own writes to fill (short writes, then ENOSPC).
DISK_FULL_SLACK_BYTES = (0, 0, 64 << 10, 1 << 20, 8 << 20)


class DiskFullNemesis(Nemesis):
    """Fill one node's data filesystem; heal empties it (lab.fill_disk / empty_disk)."""

    name = "disk-full"
    feature = "diskfull"

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.filled: list[Node] = []

    def start(self, lab, rng):
        slack = rng.choice(DISK_FULL_SLACK_BYTES)
        if lab.clustered and rng.random() < 0.5:
            node, extra = queue_leader(lab, self.queue, rng)
        else:
            node, extra = rng.choice(lab.nodes), {}
        sizes = lab.fill_disk(node, slack)
        self.filled.append(node)
        # `full_disk`: the checker accepts a nack from this node, for a publish then delivered,
        # until the store's recovery after the heal (checker.py, nacked_delivered_store_failed).
        return {"targets": [node.name], "full_disk": [node.name], "slack_bytes": slack, **sizes, **extra}

    def heal(self, lab):
        emptied = []
        for node in list(self.filled):
            lab.empty_disk(node)
            emptied.append(node.name)
            self.filled.remove(node)
        return {"emptied": emptied}


SKEW_S = (30.0, 600.0)


class ClockSkewNemesis(Nemesis):
    """Step one node's wall clock by 30 s to 10 min, forward or back (libfaketime skew file; the
    monotonic clock that Raft's timers use is left alone, as a real NTP step would). Heal: +0."""

    name = "clock-skew"
    feature = "clock"

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.skewed: list[Node] = []

    def start(self, lab, rng):
        node = rng.choice(lab.nodes)
        seconds = round(rng.uniform(*SKEW_S), 1) * rng.choice((1, -1))
        lab.skew_clock(node, seconds)
        self.skewed.append(node)
        return {"targets": [node.name], "skew_s": seconds}

    def heal(self, lab):
        reset = []
        for node in list(self.skewed):
            lab.skew_clock(node, 0.0)
            reset.append(node.name)
            self.skewed.remove(node)
        return {"reset": reset}


CHANGE_TIMEOUT_S = 90.0  # one membership change, retries included
CHANGE_TRIES_MAX = 20
CHANGE_RETRY_S = 1.0
SELF_STOP_TIMEOUT_S = 15.0  # a removed member stops itself (its watchdog runs every 0.5 s)
UNSURE_STOP_WAIT_S = 3.0
REJOIN_STUCK_MARKERS = (b"this node was removed from the group",)
# maxqctl's exit 4/5 reasons (the admin API's error body) that mean "already done" for a verb.
ALREADY_DONE = {"remove-node": ("unknown node",), "add-node": ("already a member",)}


def change_reason(stdout: str, stderr: str) -> str:
    """The admin API's `reason` from maxqctl --json's error body, or its stderr line."""
    try:
        body = json.loads(stdout)
    except ValueError:
        body = None
    if isinstance(body, dict) and body.get("reason"):
        return str(body["reason"])
    return stderr.strip().splitlines()[-1][:200] if stderr.strip() else ""


def change_outcome(verb: str, code: int | None, reason: str) -> str:
    """What one maxqctl membership call means: "done", "retry" (refused for now: a change in
    progress, no quorum yet, a timeout whose result is unknown, the asked node unreachable) or
    "give-up" (a bad command line: retrying cannot help). Pure."""
    if code == 0:
        return "done"
    if code == 4 and reason in ALREADY_DONE.get(verb, ()):
        return "done"
    if code == 4 and reason == "self removal":
        return "retry"  # asked the target itself: ask another member
    if code == 2:
        return "give-up"
    return "retry"


def membership_change(
    lab: Lab, verb: str, args: list[str], askers: list[Node], deadline_s: float = CHANGE_TIMEOUT_S, sleep=time.sleep
) -> dict:
    """Run `maxqctl <verb> ARGS` against the live askers in turn until it is done, bounded in tries
    and time. Returns {"done": bool, "attempts": [[asker, exit, reason], ...]}."""
    deadline = time.monotonic() + deadline_s
    attempts: list = []
    for i in range(CHANGE_TRIES_MAX):
        live = [n for n in askers if n.alive() and not n.paused]
        if not live or time.monotonic() >= deadline:
            break
        asker = live[i % len(live)]
        code, out, err = run_maxqctl(asker, verb, *args, timeout_s=max(5.0, min(60.0, deadline - time.monotonic())))
        reason = change_reason(out, err) if code != 0 else "ok"
        attempts.append([asker.name, code, reason])
        outcome = change_outcome(verb, code, reason)
        if outcome == "done":
            return {"done": True, "attempts": attempts}
        if outcome == "give-up":
            break
        sleep(CHANGE_RETRY_S)
    return {"done": False, "attempts": attempts}


class MembershipNemesis(Nemesis):
    """Remove a follower with maxqctl remove-node (it stops itself); at heal wipe its data folder,
    start it again with `--join on` (same name, address, ports) and maxqctl add-node it back; it is
    back once it prints "maxq-server ready" (caught up).

    "Follower": a live member that leads no group when there is one, else one that does not lead
    the queue's shard. No minority is claimed: the removed member is stopped. Heal is safe at any
    point: whatever state the removal reached, the member is stopped, wiped and added back (an
    add-node of a member that is still in every group is "already a member": done)."""

    name = "membership"
    needs_cluster = True

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.out: Node | None = None  # the member being removed or removed (None: all in)

    def start(self, lab: Lab, rng: random.Random) -> dict:
        if self.out is not None:
            return {"skipped": f"{self.out.name} is still out"}
        live = [n for n in lab.nodes if n.alive() and not n.paused]
        leaders = lab.leaders()
        shard = lab.queue_group(VHOST, self.queue)
        idle = [n for n in live if n.name not in leaders.values()]
        candidates = idle or [n for n in live if n.name != leaders.get(shard)]
        if len(live) < 2 or not candidates:
            return {"skipped": "no live follower to remove", "leaders": leaders}
        target = rng.choice(candidates)
        askers = [n for n in live if n is not target]
        rng.shuffle(askers)
        # Groups on a few members: a member leaves once it holds no replica (remove-node refuses
        # it before); its replicas go to the others first.
        moved = MoveNemesis._ask(lab, "drain-replicas", target.name) if partial_placement(lab) else None
        result = membership_change(lab, "remove-node", [target.name], askers)
        # Not confirmed removed: a removal that committed anyway still stops the member (then it is out).
        stopped_itself = self._wait_stopped(target, SELF_STOP_TIMEOUT_S if result["done"] else UNSURE_STOP_WAIT_S)
        removed = result["done"] or stopped_itself
        if removed:
            self.out = target
            if not stopped_itself:
                target.stop()  # removed, yet still running: recorded (stopped_itself false), stopped here
        # Never wipe a member that may still be in the configuration (it would forget its votes):
        # a removal that did not happen leaves the member running, and heal has nothing to do.
        return {
            "targets": [target.name] if removed else [],
            "asked_to_remove": target.name,
            "removed": removed,
            "stopped_itself": stopped_itself,
            "attempts": result["attempts"],
            "leaders": leaders,
            **({"replicas_moved": moved} if moved is not None else {}),
        }

    @staticmethod
    def _wait_stopped(node: Node, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while node.alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        return not node.alive()

    def heal(self, lab: Lab) -> dict:
        node = self.out
        if node is None:
            return {"rejoined": []}
        began = time.monotonic()
        node.stop()
        shutil.rmtree(node.data_dir, ignore_errors=True)
        node.join = True  # until it is back: a restart by the runner must not start it as an old member
        node.launch()
        askers = [n for n in lab.nodes if n is not node]
        result = membership_change(lab, "add-node", [node.name, "--raft-addr", node.raft_address], askers)
        if not result["done"]:
            raise LabError(f"add-node {node.name} not done: {result['attempts']}")
        # A wiped member that replays its own old removal from the log and goes silent will never
        # be ready: say so now instead of after RESTART_TIMEOUT_S (it is left running, as it is).
        node.wait_ready(RESTART_TIMEOUT_S, give_up_on=REJOIN_STUCK_MARKERS)
        node.join = False
        self.out = None
        # Groups on a few members: the member came back holding none; its share moves back.
        spread = MoveNemesis._ask(lab, "rebalance") if partial_placement(lab) else None
        return {
            "rejoined": [node.name],
            "attempts": result["attempts"],
            "seconds": round(time.monotonic() - began, 2),
            **({"rebalanced": spread} if spread is not None else {}),
        }


DRAIN_WAIT_S = 15.0  # maxqctl drain's wait for the hand-over (the drain itself is recorded at once)
DRAIN_TIMEOUT_S = 60.0  # one drain or revive, retries included


class DrainNemesis(Nemesis):
    """`maxqctl drain` a live member (the queue's shard leader half the time, so that a leadership
    moves under load), during another fault when overlapped; `maxqctl revive` it at heal. Its
    clients are closed (320) and reconnect to the other members; nothing confirmed may be lost.
    A drain whose hand-over is not finished within DRAIN_WAIT_S (a partition may block it) is
    still recorded (maxqctl exit 5): the member stays drained until the heal revives it."""

    name = "maintenance"  # (not "drain": the runner's final drain of the queue has that name)
    needs_cluster = True

    def __init__(self, queue: str = "jepsen") -> None:
        super().__init__(queue)
        self.drained: Node | None = None

    @staticmethod
    def _ask(lab: Lab, verb: str, target: Node, done_codes: tuple[int, ...], sleep=time.sleep) -> dict:
        """`maxqctl VERB TARGET` asked of the live members in turn until its exit is one of
        `done_codes`, bounded in tries and time: {"done": bool, "attempts": [...]}."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        attempts: list = []
        for i in range(CHANGE_TRIES_MAX):
            live = [n for n in lab.nodes if n.alive() and not n.paused]
            if not live or time.monotonic() >= deadline:
                break
            asker = live[i % len(live)]
            code, out, err = run_maxqctl(
                asker, "--timeout", f"{DRAIN_WAIT_S:g}", verb, target.name, timeout_s=DRAIN_WAIT_S + 30.0
            )
            attempts.append([asker.name, code, change_reason(out, err) if code != 0 else "ok"])
            if code in done_codes:
                return {"done": True, "attempts": attempts}
            sleep(CHANGE_RETRY_S)
        return {"done": False, "attempts": attempts}

    def start(self, lab: Lab, rng: random.Random) -> dict:
        if self.drained is not None:
            return {"skipped": f"{self.drained.name} is still drained"}
        live = [n for n in lab.nodes if n.alive() and not n.paused]
        if len(live) < 2:
            return {"skipped": "fewer than two live members"}
        leaders = lab.leaders()
        shard = lab.queue_group(VHOST, self.queue)
        leader = next((n for n in live if n.name == leaders.get(shard)), None)
        target = leader if leader is not None and rng.random() < 0.5 else rng.choice(live)
        self.drained = target  # revived at heal whatever came of it (an unanswered drain may have committed)
        result = self._ask(lab, "drain", target, (0, 5))
        return {"targets": [target.name], "drained": result["done"], "attempts": result["attempts"], "leaders": leaders}

    def heal(self, lab: Lab) -> dict:
        node = self.drained
        if node is None:
            return {"revived": []}
        result = self._ask(lab, "revive", node, (0,))
        if not result["done"]:
            raise LabError(f"revive {node.name} not done: {result['attempts']}")
        self.drained = None
        # Groups on a few members: the drain moved its replicas away; they are spread again.
        spread = MoveNemesis._ask(lab, "rebalance") if partial_placement(lab) else None
        return {
            "revived": [node.name],
            "attempts": result["attempts"],
            **({"rebalanced": spread} if spread is not None else {}),
        }


MOVE_WAIT_S = 40.0  # one maxqctl move-group / drain-replicas / rebalance (its moves are small here)
MOVE_TRIES_MAX = 2


def held_placement(lab: Lab) -> dict[str, list[str]] | None:
    """Each group's members when the lab's groups are on a few members (read now, before a
    fault: `MoveNemesis._placement`); None when every member holds every group."""
    return MoveNemesis._placement(lab) if partial_placement(lab) else None


def held_minority(placement: dict[str, list[str]] | None, minority: list[str], side_of: dict) -> list[str]:
    """What may be claimed of `minority` (cut off from a majority of the cluster): all of it when
    every member holds every group; with groups on a few members, only the nodes whose side
    (`side_of[node]`, the nodes it still reaches) holds a majority of no group's members: a
    cluster minority may hold a majority of a group and commit in it (seed 2002: n1 and n4, two
    of five, were two of the three members of the queue's group). An unknown placement ({})
    claims nothing: never more than is known. A move during the fault cannot add a member on the
    cut-off side (its new member catches up from the group's leader first)."""
    if placement is None:
        return list(minority)
    if not placement:
        return []
    return [
        node
        for node in minority
        if all(len(set(side_of[node]) & set(members)) * 2 <= len(members) for members in placement.values())
    ]


def _unclaimed(minority: list[str], claimed: list[str]) -> dict:
    left = sorted(set(minority) - set(claimed))
    return {"not_claimed": left} if left else {}


DEFAULT_REPLICATION_FACTOR = 3  # the server's (maxq_raft/config.py)


def partial_placement(lab: Lab) -> bool:
    """Whether the lab's groups are placed (recorded in the metadata group; a member added holds
    none until a rebalance, a member removed leaves its groups short until one): its members run
    with a --replication-factor above 0 (the last given, else the server's default, 3), even one
    not below their number (every group on each of 3 members, placed). 0: every member holds
    every group, and a member added joins every group."""
    args = list(getattr(lab.nodes[0], "extra_args", ()))
    factor = DEFAULT_REPLICATION_FACTOR
    for i, arg in enumerate(args):
        if arg == "--replication-factor" or arg.startswith("--replication-factor="):
            value = arg.partition("=")[2] or (args[i + 1] if i + 1 < len(args) else "")
            factor = int(value) if value.isdigit() else 0
    return factor > 0


class MoveNemesis(Nemesis):
    """Move shard-group replicas during the other faults (a cluster started with
    `--replication-factor`, groups on a few members: issue #19). Start: one of, seeded,
    `maxqctl move-group` of the queue's group (half the time) or a random one, one holder swapped
    for a member that holds none of it; `maxqctl drain-replicas` of a random live member (every
    replica it holds goes to the others); or `maxqctl rebalance`. Heal: `maxqctl rebalance`, so the
    replicas are spread again for the next cycle. Each call is asked of live members in turn (at
    most MOVE_TRIES_MAX, MOVE_WAIT_S each, again only after a refusal); a move that a fault stops
    half way (exit 5, or no answer: it may still run, and a plan made now would interleave with
    it) is recorded as it came: what was done stays done, and the next rebalance finishes it.
    No minority is claimed: a move changes who stores a group, never who may confirm."""

    name = "move"
    needs_cluster = True

    @staticmethod
    def _ask(lab: Lab, *args: str, sleep=time.sleep) -> dict:
        attempts: list = []
        for i in range(MOVE_TRIES_MAX):
            live = [n for n in lab.nodes if n.alive() and not n.paused]
            if not live:
                break
            asker = live[i % len(live)]
            code, out, err = run_maxqctl(asker, "--timeout", f"{MOVE_WAIT_S:g}", *args, timeout_s=MOVE_WAIT_S + 10.0)
            attempts.append([asker.name, code, change_reason(out, err) if code != 0 else "ok"])
            if code == 0:
                return {"done": True, "attempts": attempts, "output": out.strip().splitlines()[-8:]}
            if code in (2, 5, None):
                # A bad command line; or a move that failed or was not answered in time, which may
                # still be running: asked again it would be planned from a placement in flux.
                break
            sleep(CHANGE_RETRY_S)
        return {"done": False, "attempts": attempts}

    @staticmethod
    def _placement(lab: Lab) -> dict[str, list[str]]:
        for node in [n for n in lab.nodes if n.alive() and not n.paused]:
            code, out, _err = run_maxqctl(node, "--json", "placement", timeout_s=20.0)
            if code == 0:
                try:
                    return {g: list(m) for g, m in json.loads(out)["groups"].items()}
                except (ValueError, KeyError, TypeError):
                    continue
        return {}

    def start(self, lab: Lab, rng: random.Random) -> dict:
        if not partial_placement(lab):
            return {"skipped": "every member holds every group (a run with --replication-factor 0)"}
        live = [n for n in lab.nodes if n.alive() and not n.paused]
        if len(live) < 2:
            return {"skipped": "fewer than two live members"}
        placement = self._placement(lab)
        if not placement:
            return {"skipped": "no member answered with the placement"}
        names = sorted(n.name for n in lab.nodes)
        kind = rng.choice(("move-group", "move-group", "drain-replicas", "rebalance"))
        if kind == "move-group":
            queue_group = lab.queue_group(VHOST, self.queue)
            group = queue_group if rng.random() < 0.5 else rng.choice(sorted(placement))
            holders = placement.get(group, [])
            others = [m for m in names if m not in holders]
            if not holders or not others:
                return {"skipped": f"{group} is on {holders}: nowhere to move it", "placement": placement}
            wanted = list(holders)
            wanted[rng.randrange(len(wanted))] = rng.choice(others)
            result = self._ask(lab, "move-group", group, "--to", ",".join(wanted))
            return {"kind": kind, "group": group, "from": holders, "to": wanted, **result}
        if kind == "drain-replicas":
            target = rng.choice(live)
            result = self._ask(lab, "drain-replicas", target.name)
            return {"kind": kind, "targets": [target.name], "placement": placement, **result}
        return {"kind": kind, "placement": placement, **self._ask(lab, "rebalance")}

    def heal(self, lab: Lab) -> dict:
        if not partial_placement(lab):
            return {"rebalanced": None}
        result = self._ask(lab, "rebalance")
        return {"rebalanced": result["done"], "attempts": result["attempts"]}


NEMESES = {
    cls.name: cls
    for cls in (
        KillNemesis,
        KillLeaderNemesis,
        KillMajorityNemesis,
        PauseNemesis,
        PauseLeaderNemesis,
        PartitionOneNemesis,
        PartitionLeaderNemesis,
        PartitionHalvesNemesis,
        OneWayNemesis,
        BridgeNemesis,
        MajoritiesRingNemesis,
        LossNemesis,
        DelayNemesis,
        DiskStallNemesis,
        DiskFullNemesis,
        ClockSkewNemesis,
        MembershipNemesis,
        DrainNemesis,
        MoveNemesis,
    )
}

# What each nemesis needs on the machine beyond the lab: (kind, name, how to get it). Kinds:
# "cmd" a program on PATH, "py" a module importable by the harness's interpreter, "file" a path
# (None: found by a lookup function), "dev" a device node.
TOOLS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "loss": (("cmd", "nft", "apt-get install -y nftables"),),
    "delay": (
        ("cmd", "iptables", "apt-get install -y iptables"),
        ("py", "netfilterqueue", "apt-get install -y libnetfilter-queue-dev gcc; .venv/bin/pip install NetfilterQueue"),
    ),
    "disk-stall": (
        ("cmd", "fusermount", "apt-get install -y fuse3 libfuse2"),
        ("dev", "/dev/fuse", "modprobe fuse"),
        ("lib", "libfuse.so.2", "apt-get install -y libfuse2"),
        ("py", "fuse", ".venv/bin/pip install fusepy"),
    ),
    "clock-skew": (("faketime", "libfaketimeMT.so.1", "apt-get install -y faketime"),),
    "disk-full": (
        ("root", "root", "run as root: it mounts a tmpfs per node"),
        ("cmd", "mount", "apt-get install -y mount"),
    ),
}


def _lib_present(name: str) -> bool:
    import ctypes.util

    return ctypes.util.find_library(name.removeprefix("lib").split(".so")[0]) is not None


def missing_tools(names: list[str]) -> dict[str, str]:
    """The preflight: for each named nemesis whose tools are not all here, what is missing and how to get it."""
    out = {}
    for name in names:
        lacking = []
        for kind, what, how in TOOLS.get(name, ()):
            present = {
                "cmd": lambda: shutil.which(what) is not None,
                "py": lambda: importlib.util.find_spec(what) is not None,
                "dev": lambda: __import__("os").path.exists(what),
                "lib": lambda: _lib_present(what),
                "faketime": lambda: faketime_library() is not None,
                "root": lambda: __import__("os").geteuid() == 0,
            }[kind]()
            if not present:
                lacking.append(f"{what} ({how})")
        if lacking:
            out[name] = "MISSING " + ", ".join(lacking)
    return out


def lab_features(names: list[str]) -> frozenset:
    """What the lab must set up before the nodes start for these nemeses."""
    return frozenset(NEMESES[n].feature for n in names if n in NEMESES and NEMESES[n].feature)


def parse_nemeses(spec: str) -> list[str]:
    """'kill,pause' -> ['kill', 'pause']; 'none' -> []; 'all' -> every one that exists (the runner
    then keeps those the lab supports, see `supported`)."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["none"]:
        return []
    if names == ["all"]:
        return list(NEMESES)
    for name in names:
        if name in NOT_YET:
            raise NemesisError(f"nemesis {name!r} ({NOT_YET[name]}) is not built yet; today: {', '.join(NEMESES)}")
        if name not in NEMESES:
            raise NemesisError(
                f"unknown nemesis {name!r}; today: {', '.join(NEMESES)} (not built yet: {', '.join(NOT_YET)})"
            )
    return list(dict.fromkeys(names))


def unsupported(names: list[str], nodes: int, lab: str) -> dict[str, str]:
    """The nemeses a lab of this shape cannot run, each with the reason."""
    out = {}
    missing = missing_tools(names)
    for name in names:
        cls = NEMESES[name]
        if cls.needs_cluster and nodes < 3:
            out[name] = f"needs a cluster (--nodes 3 or more), not {nodes} node(s)"
        elif nodes < cls.nodes_min:
            out[name] = (
                f"needs {cls.nodes_min} or more nodes, not {nodes}: on 3 every majority of one member is "
                f"also another's (use --nodes 5)"
            )
        elif cls.needs_network and lab != "netns":
            out[name] = "cuts links: needs the namespace lab (--lab netns, root, nftables)"
        elif name in missing:
            out[name] = missing[name]
    return out


def make_nemeses(names: list[str], queue: str = "jepsen") -> dict[str, Nemesis]:
    return {name: NEMESES[name](queue) for name in names}


@dataclass(frozen=True)
class Cycle:
    quiet_s: float
    nemesis: str
    fault_s: float
    with_: str | None = None  # a nemesis that overlaps this cycle's fault (membership, disk-full)

    def to_dict(self) -> dict:
        d = asdict(self)
        if d["with_"] is None:
            del d["with_"]  # histories of runs without overlap look as they always did
        return d


OVERLAP_CHANCE = 0.5
# A rider's start runs in a thread beside the fault and it is healed after it (runner.py): membership
# (maxqctl calls and a stop), disk-full (a ballast file written, then deleted), maintenance
# (maxqctl drain, then revive) and move (maxqctl move-group / drain-replicas / rebalance) all can.
OVERLAPPABLE = ("membership", "disk-full", "maintenance", "move")
# A membership change needs a quorum: during kill-majority it could only time out (90 s), and a
# removal left pending might commit after the heal and stop a member nobody holds down.
NO_OVERLAP_WITH = ("kill-majority",)


def make_schedule(
    seed: int,
    nemeses: list[str],
    time_s: float,
    quiet_s: tuple[float, float],
    fault_s: tuple[float, float],
    tail_s: float,
    overlap: tuple[str, ...] = (),
) -> list[Cycle]:
    """Cycles of quiet then fault that fit in `time_s` minus a quiet tail; a pure function of its
    arguments (the seed picks durations and the order of nemeses).

    `overlap` names nemeses (membership) that, when also in `nemeses`, run *during* the others'
    faults instead of in cycles of their own: each cycle carries one with OVERLAP_CHANCE, drawn
    from a stream of its own, so a schedule without overlap is the one it always was."""
    assert quiet_s[0] <= quiet_s[1] and fault_s[0] <= fault_s[1] and time_s > 0
    assert all(o in OVERLAPPABLE for o in overlap), overlap
    rng = random.Random(f"{seed}:schedule")
    cycles: list[Cycle] = []
    used = 0.0
    budget = time_s - tail_s
    riders = [n for n in nemeses if n in overlap]
    primary = [n for n in nemeses if n not in riders] if riders else list(nemeses)
    if not primary:  # only overlapping nemeses: nothing to overlap with, they run in cycles of their own
        primary, riders = list(nemeses), []
    if not nemeses:
        return cycles
    ride = random.Random(f"{seed}:overlap")
    for _ in range(CYCLES_MAX):
        quiet = round(rng.uniform(*quiet_s), 2)
        fault = round(rng.uniform(*fault_s), 2)
        if used + quiet + fault > budget:
            break
        nemesis = rng.choice(primary)
        with_ = ride.choice(riders) if riders and ride.random() < OVERLAP_CHANCE else None
        if nemesis in NO_OVERLAP_WITH:
            with_ = None
        cycles.append(Cycle(quiet, nemesis, fault, with_))
        used += quiet + fault
    return cycles
