"""Profiles: named sets of runs (seeds, nemeses, durations, workload sizes).

Theory of operation: a profile is data. `ci` is small and fixed (two seeded runs, ~30 s each, a
few publishers and consumers at modest rates) so that it can gate a merge; `long` is for a human
with an hour (more, longer runs over every fault that exists today). The command line may
override seeds, nemeses, duration and workload; a run is then fully described by its RunSpec,
which goes into the history's first record, so `--seed S` with the same options repeats it.

Both profiles are single-node today (the broker has no cluster): the cluster nemeses
(partitions, membership, loss, delay, disk stall, clock skew) and the 3/5-host namespace lab come
with the cluster, and the profiles will grow to RELIABILITY.md's sizes then.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .workload import WorkloadConfig

CLUSTER_NOTICE = ("cluster nemeses (partitions, membership changes, loss, delay, disk stall, clock skew) "
                  "and the namespace lab arrive with the cluster; today: one node, kill -9/restart and pause")


@dataclass(frozen=True)
class RunSpec:
    seed: int
    nemeses: tuple[str, ...]
    workload_kind: str  # "queue" (several publishers and consumers) or "fifo" (one of each)
    workload: WorkloadConfig
    time_s: float
    quiet_s: tuple[float, float]
    fault_s: tuple[float, float]
    tail_s: float = 3.0  # quiet time at the end of the schedule before the final heal
    nodes: int = 1
    lab: str = "local"
    recovery_timeout_s: float = 30.0
    settle_s: float = 10.0  # after publishers stop: consumers take what is left
    drain_timeout_s: float = 30.0
    server_args: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["workload"] = self.workload.to_dict()
        return d


@dataclass(frozen=True)
class Profile:
    name: str
    runs: tuple[RunSpec, ...]
    notes: tuple[str, ...] = field(default=())


def workload_for(kind: str, base: WorkloadConfig) -> WorkloadConfig:
    if kind == "fifo":
        # One publisher, one consumer: every first delivery must come in publish order.
        return replace(base, publishers=1, consumers=1, rate_per_publisher_hz=base.rate_per_publisher_hz * 2)
    if kind == "queue":
        return base
    raise ValueError(f"unknown workload {kind!r} (queue, fifo)")


# confirm_timeout_s below the longest pause, so that some pauses end in aborted connections (info).
CI_WORKLOAD = WorkloadConfig(publishers=3, consumers=2, rate_per_publisher_hz=25.0, confirm_window=16, prefetch=10,
                             confirm_timeout_s=3.0)
LONG_WORKLOAD = WorkloadConfig(publishers=5, consumers=3, rate_per_publisher_hz=40.0, confirm_window=32, prefetch=20)


def _ci() -> Profile:
    common = dict(time_s=30.0, quiet_s=(3.0, 5.0), fault_s=(2.0, 4.0))
    return Profile("ci", (
        RunSpec(seed=11, nemeses=("kill", "pause"), workload_kind="queue", workload=CI_WORKLOAD, **common),
        RunSpec(seed=22, nemeses=("kill", "pause"), workload_kind="fifo", workload=workload_for("fifo", CI_WORKLOAD),
                **common),
    ), (CLUSTER_NOTICE,))


def _long() -> Profile:
    runs = []
    for i in range(10):
        kind = "fifo" if i % 3 == 2 else "queue"
        runs.append(RunSpec(seed=1001 + i, nemeses=("kill", "pause"), workload_kind=kind,
                            workload=workload_for(kind, LONG_WORKLOAD), time_s=300.0, quiet_s=(10.0, 20.0),
                            fault_s=(5.0, 20.0), tail_s=10.0, recovery_timeout_s=60.0, drain_timeout_s=120.0))
    return Profile("long", tuple(runs), (CLUSTER_NOTICE,))


PROFILES = {"ci": _ci, "long": _long}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]()
    except KeyError:
        raise ValueError(f"unknown profile {name!r} ({', '.join(PROFILES)})") from None
