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
The leader comes from the cluster status (`Lab.leader_of`, highest term wins); when no member
names one, the nemesis falls back to a random node and says so (`leader: null`).
Still to come (NOT_YET): loss and delay (this kernel has no tc netem: CONFIG_NET_SCH_NETEM is
unset and there are no modules), disk stall, clock skew, bridge, majorities ring; asking for one
is an error that says so, never a silent pass.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import asdict, dataclass

from .lab import Lab, LabError, Node, run_maxqctl, shard_of

RESTART_TIMEOUT_S = 90.0  # a restarted member is ready once it has caught up: slow on 2 shared cores
CYCLES_MAX = 1000
VHOST = "/"

NOT_YET = {
    "partition-majorities-ring": "every node sees a different majority",
    "bridge": "one node sees both sides of a split",
    "loss": "random packet loss (tc netem is not in this kernel, CONFIG_NET_SCH_NETEM unset; nft numgen would do)",
    "delay": "delay packets (tc netem is not in this kernel; an NFQUEUE delayer would do)",
    "disk-stall": "hold write/fsync in a FUSE passthrough",
    "clock-skew": "skew clocks with faketime",
}
CLUSTER_NEMESES = NOT_YET  # the old name (the cluster nemeses that are not built yet)


class NemesisError(Exception):
    pass


class Nemesis:
    name = "abstract"
    needs_cluster = False  # needs more than one node
    needs_network = False  # needs a lab that can cut links (netns)

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
    group = shard_of((VHOST, queue), lab.shards())
    leader = lab.leader_of(group)
    if leader is None:
        live = [n for n in lab.nodes if n.alive() and not n.paused] or list(lab.nodes)
        return rng.choice(live), {"group": group, "leader": None}
    return leader, {"group": group, "leader": leader.name}


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
        lab.partition(cuts)
        self.active = True
        return {"cuts": [f"{a}->{b}" for a, b in cuts], "minority": sorted(minority), **extra}

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
        minority = sorted(names[:(len(names) - 1) // 2] or names[:1])
        return _isolate(lab, minority), minority, {"majority": sorted(set(names) - set(minority))}


class OneWayNemesis(PartitionNemesis):
    name = "one-way"

    def plan(self, lab, rng):
        node = rng.choice(lab.nodes).name
        return [(node, other.name) for other in lab.nodes if other.name != node], [], {"silenced": node}


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


def membership_change(lab: Lab, verb: str, args: list[str], askers: list[Node], deadline_s: float = CHANGE_TIMEOUT_S,
                      sleep=time.sleep) -> dict:
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
        shard = shard_of((VHOST, self.queue), lab.shards())
        idle = [n for n in live if n.name not in leaders.values()]
        candidates = idle or [n for n in live if n.name != leaders.get(shard)]
        if len(live) < 2 or not candidates:
            return {"skipped": "no live follower to remove", "leaders": leaders}
        target = rng.choice(candidates)
        askers = [n for n in live if n is not target]
        rng.shuffle(askers)
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
        return {"targets": [target.name] if removed else [], "asked_to_remove": target.name, "removed": removed,
                "stopped_itself": stopped_itself, "attempts": result["attempts"], "leaders": leaders}

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
        return {"rejoined": [node.name], "attempts": result["attempts"], "seconds": round(time.monotonic() - began, 2)}


NEMESES = {cls.name: cls for cls in (KillNemesis, KillLeaderNemesis, PauseNemesis, PauseLeaderNemesis,
                                      PartitionOneNemesis, PartitionLeaderNemesis, PartitionHalvesNemesis, OneWayNemesis,
                                      MembershipNemesis)}


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
            raise NemesisError(f"nemesis {name!r} ({NOT_YET[name]}) is not built yet; "
                               f"today: {', '.join(NEMESES)}")
        if name not in NEMESES:
            raise NemesisError(f"unknown nemesis {name!r}; today: {', '.join(NEMESES)} "
                               f"(not built yet: {', '.join(NOT_YET)})")
    return list(dict.fromkeys(names))


def unsupported(names: list[str], nodes: int, lab: str) -> dict[str, str]:
    """The nemeses a lab of this shape cannot run, each with the reason."""
    out = {}
    for name in names:
        cls = NEMESES[name]
        if cls.needs_cluster and nodes < 3:
            out[name] = f"needs a cluster (--nodes 3 or more), not {nodes} node(s)"
        elif cls.needs_network and lab != "netns":
            out[name] = "cuts links: needs the namespace lab (--lab netns, root, nftables)"
    return out


def make_nemeses(names: list[str], queue: str = "jepsen") -> dict[str, Nemesis]:
    return {name: NEMESES[name](queue) for name in names}


@dataclass(frozen=True)
class Cycle:
    quiet_s: float
    nemesis: str
    fault_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def make_schedule(seed: int, nemeses: list[str], time_s: float, quiet_s: tuple[float, float],
                  fault_s: tuple[float, float], tail_s: float) -> list[Cycle]:
    """Cycles of quiet then fault that fit in `time_s` minus a quiet tail; a pure function of its
    arguments (the seed picks durations and the order of nemeses)."""
    assert quiet_s[0] <= quiet_s[1] and fault_s[0] <= fault_s[1] and time_s > 0
    rng = random.Random(f"{seed}:schedule")
    cycles: list[Cycle] = []
    used = 0.0
    budget = time_s - tail_s
    if not nemeses:
        return cycles
    for _ in range(CYCLES_MAX):
        quiet = round(rng.uniform(*quiet_s), 2)
        fault = round(rng.uniform(*fault_s), 2)
        if used + quiet + fault > budget:
            break
        cycles.append(Cycle(quiet, rng.choice(nemeses), fault))
        used += quiet + fault
    return cycles
