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

Today (one node, loopback lab): `kill` (SIGKILL, restart on the same data folder at heal) and
`pause` (SIGSTOP, SIGCONT at heal). With the cluster and the namespace lab come the names in
CLUSTER_NEMESES (partitions of several shapes, loss, delay, disk stall, clock skew, membership
changes); asking for one today is an error that says so, never a silent pass.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from .lab import Lab

RESTART_TIMEOUT_S = 30.0
CYCLES_MAX = 1000

CLUSTER_NEMESES = {
    "partition-one": "isolate one random node",
    "partition-halves": "split the nodes in two halves",
    "partition-majorities-ring": "every node sees a different majority",
    "partition-leader": "isolate the current leader",
    "one-way": "drop traffic in one direction only",
    "bridge": "one node sees both sides of a split",
    "loss": "random packet loss (nft numgen)",
    "delay": "delay packets (NFQUEUE delayer)",
    "disk-stall": "hold write/fsync in a FUSE passthrough",
    "clock-skew": "skew clocks with faketime",
    "membership": "add and remove members through maxqctl",
}


class NemesisError(Exception):
    pass


class Nemesis:
    name = "abstract"

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

    def __init__(self) -> None:
        self.killed: list = []

    def start(self, lab: Lab, rng: random.Random) -> dict:
        targets = _targets(lab, rng)
        for node in targets:
            node.kill()
            self.killed.append(node)
        return {"targets": [n.name for n in targets]}

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

    def __init__(self) -> None:
        self.paused: list = []

    def start(self, lab: Lab, rng: random.Random) -> dict:
        targets = [n for n in _targets(lab, rng) if n.alive()]
        for node in targets:
            node.pause()
            self.paused.append(node)
        return {"targets": [n.name for n in targets]}

    def heal(self, lab: Lab) -> dict:
        resumed = []
        for node in list(self.paused):
            node.resume()
            resumed.append(node.name)
            self.paused.remove(node)
        return {"resumed": resumed}


NEMESES = {"kill": KillNemesis, "pause": PauseNemesis}


def parse_nemeses(spec: str) -> list[str]:
    """'kill,pause' -> ['kill', 'pause']; 'none' -> []; 'all' -> every one that runs today."""
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["none"]:
        return []
    if names == ["all"]:
        return list(NEMESES)
    for name in names:
        if name in CLUSTER_NEMESES:
            raise NemesisError(f"nemesis {name!r} ({CLUSTER_NEMESES[name]}) arrives with the cluster; "
                               f"today: {', '.join(NEMESES)}")
        if name not in NEMESES:
            raise NemesisError(f"unknown nemesis {name!r}; today: {', '.join(NEMESES)} "
                               f"(with the cluster: {', '.join(CLUSTER_NEMESES)})")
    return list(dict.fromkeys(names))


def make_nemeses(names: list[str]) -> dict[str, Nemesis]:
    return {name: NEMESES[name]() for name in names}


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
