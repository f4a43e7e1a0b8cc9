"""Profiles: named sets of runs (seeds, nemeses, durations, workload sizes).

Theory of operation: a profile is data. `ci` is small and fixed so that it can gate a merge:
two single-node runs of ~30 s (kill, pause) and one 3-node cluster run of ~60 s in all (kills of
a member and of the queue's shard leader, pauses, partitions of one node and of the leader);
`cluster` is that cluster run alone; `long` is for a human with a few hours (ten 5-node cluster
runs of 300 s over every nemesis that exists, membership changes and drains overlapping the other faults,
an eleventh with the TTL + dead-letter workload, then ten single-node runs of 300 s; the cluster
runs come first so that `--runs 6` is six of them, about 35 minutes). The
command line may override seeds, nemeses, duration and workload; a run is then fully described
by its RunSpec, which goes into the history's first record, so `--seed S` with the same options
repeats it.

Cluster runs ask for the namespace lab (partitions need it). Where namespaces or nft do not
work the CLI says so loudly and runs them on the loopback lab without the network nemeses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .workload import WorkloadConfig

CLUSTER_NOTICE = (
    "this profile's cluster run covers kill, kill-leader, pause-leader, partition-one and "
    "partition-leader; the rest of the menu (kill-majority, pause, partition-halves, one-way, bridge, "
    "partition-majorities-ring (5 nodes), loss, delay, disk-stall, disk-full, clock-skew, membership, with "
    "--overlap membership) runs in --profile long or with --nemesis"
)


@dataclass(frozen=True)
class RunSpec:
    seed: int
    nemeses: tuple[str, ...]
    # "queue" (several publishers and consumers), "fifo" (one of each), "dlx" (TTL + dead letters),
    # "sqs" (senders and receivers over the SQS endpoint), "txn" (transactional halves, txn_workload.py)
    workload_kind: str
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
    shards: int = 2  # data shard groups of a cluster (the same on every member; 2 keeps 2 cores sane)
    overlap: tuple[str, ...] = ()  # nemeses that run during the others' faults (membership)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["workload"] = self.workload.to_dict()
        return d


@dataclass(frozen=True)
class Profile:
    name: str
    runs: tuple[RunSpec, ...]
    notes: tuple[str, ...] = field(default=())


WORKLOAD_KINDS = ("queue", "fifo", "dlx", "sqs", "txn", "partitioned")
# The partitioned workload: a work queue of this many partitions, keys per publisher
PARTITIONS = 4
PARTITION_KEYS = 8
TXN_CHECKS_QUEUE = "jepsen-txn-checks"
DLX_QUEUE = "jepsen-dlq"
DLX_TTL_MS = 300
# The work queue's consumers consume for 1-3 s, then pause 0.5-2 s (seeded): with a 300 ms TTL about
# a third of the messages expire and are dead-lettered, the rest are consumed from the work queue.
DLX_CONSUME_S = (1.0, 3.0)
DLX_PAUSE_S = (0.5, 2.0)


def workload_for(kind: str, base: WorkloadConfig, ttl_ms: int | None = None) -> WorkloadConfig:
    if kind == "fifo":
        # One publisher, one consumer: every first delivery must come in publish order.
        return replace(base, publishers=1, consumers=1, rate_per_publisher_hz=base.rate_per_publisher_hz * 2)
    if kind in ("queue", "sqs"):
        # sqs: the same numbers of senders and receivers, through the SQS endpoint (sqs_workload.py).
        return base
    if kind == "dlx":
        # The work queue has a short TTL and dead-letters to DLX_QUEUE; even consumers take from the
        # work queue (pausing now and then), odd ones from the dead-letter queue: at least one of each.
        return replace(
            base,
            consumers=max(2, base.consumers),
            dead_letter_queue=DLX_QUEUE,
            message_ttl_ms=DLX_TTL_MS if ttl_ms is None else ttl_ms,
            consume_s=DLX_CONSUME_S,
            pause_s=DLX_PAUSE_S,
        )
    if kind == "txn":
        # Transactional halves (1-3 per transaction) to a deduplicating work queue, commit /
        # rollback / left to the check-back (txn_workload.py); a transaction is a few publishes,
        # so the rate (transactions per second) is a third of the queue workload's.
        return replace(
            base,
            deduplication=True,
            checks_queue=TXN_CHECKS_QUEUE,
            rate_per_publisher_hz=max(1.0, base.rate_per_publisher_hz / 3),
        )
    if kind == "partitioned":
        # A partitioned work queue with single active consumers (x-partitions): each publisher's
        # keys spread over the partitions; the checker holds every key to publish order across
        # consumers (checker.key_order_violations). At least two consumers, so that partitions move.
        return replace(base, consumers=max(2, base.consumers), partitions=PARTITIONS, partition_keys=PARTITION_KEYS)
    raise ValueError(f"unknown workload {kind!r} ({', '.join(WORKLOAD_KINDS)})")


# confirm_timeout_s below the longest pause, so that some pauses end in aborted connections (info).
CI_WORKLOAD = WorkloadConfig(
    publishers=3, consumers=2, rate_per_publisher_hz=25.0, confirm_window=16, prefetch=10, confirm_timeout_s=3.0
)
LONG_WORKLOAD = WorkloadConfig(publishers=5, consumers=3, rate_per_publisher_hz=40.0, confirm_window=32, prefetch=20)


# The cluster runs: lower rates (three brokers share two cores with the clients), faults longer
# than the 3 s after which the others declare a silent member down.
CI_CLUSTER_WORKLOAD = WorkloadConfig(
    publishers=3, consumers=2, rate_per_publisher_hz=15.0, confirm_window=16, prefetch=10, confirm_timeout_s=5.0
)
CI_CLUSTER_NEMESES = ("kill", "kill-leader", "pause-leader", "partition-one", "partition-leader")
# Cluster runs snapshot every ~100 KB of a group's log (the default is 64 MB), so that restarts
# start from snapshots and members that fall behind are installed by one, under the faults.
CLUSTER_SERVER_ARGS = ("--snapshot-every-mb", "0.1")
CLUSTER_NEMESES_ALL = (
    "kill",
    "kill-leader",
    "kill-majority",
    "pause",
    "pause-leader",
    "partition-one",
    "partition-leader",
    "partition-halves",
    "one-way",
    "bridge",
    "partition-majorities-ring",
    "loss",
    "delay",
    "disk-stall",
    "disk-full",
    "clock-skew",
    "membership",
    "maintenance",
    "move",
)
# Groups on 3 of the members (issue #19): each shard group's replicas on 3 members, 5 groups, so
# that most members serve queues whose group they do not hold and the `move` nemesis has
# replicas to move.
HELD_SERVER_ARGS = (*CLUSTER_SERVER_ARGS, "--replication-factor", "3")
# Every shard group on every member (--replication-factor 0, no longer the default since
# 2026-12-07): the long profile's odd runs keep that layout under every nemesis.
EVERY_GROUP_SERVER_ARGS = (*CLUSTER_SERVER_ARGS, "--replication-factor", "0")
HELD_SHARDS = 5


def ci_cluster_run() -> RunSpec:
    # ~35 s of workload + start, recovery, settle and drain: about 60 s on an idle machine.
    # Seed 54: kill-leader, pause-leader, partition-one, partition-leader (4 faults).
    return RunSpec(
        seed=54,
        nemeses=CI_CLUSTER_NEMESES,
        workload_kind="queue",
        workload=CI_CLUSTER_WORKLOAD,
        time_s=35.0,
        quiet_s=(2.0, 4.0),
        fault_s=(4.0, 6.0),
        tail_s=3.0,
        nodes=3,
        lab="netns",
        recovery_timeout_s=45.0,
        settle_s=10.0,
        drain_timeout_s=30.0,
        server_args=CLUSTER_SERVER_ARGS,
    )


def _ci() -> Profile:
    common = dict(time_s=30.0, quiet_s=(3.0, 5.0), fault_s=(2.0, 4.0))
    return Profile(
        "ci",
        (
            RunSpec(seed=11, nemeses=("kill", "pause"), workload_kind="queue", workload=CI_WORKLOAD, **common),
            RunSpec(
                seed=22,
                nemeses=("kill", "pause"),
                workload_kind="fifo",
                workload=workload_for("fifo", CI_WORKLOAD),
                **common,
            ),
            ci_cluster_run(),
        ),
        (CLUSTER_NOTICE,),
    )


def _cluster() -> Profile:
    return Profile("cluster", (ci_cluster_run(),), (CLUSTER_NOTICE,))


LONG_NOTICE = (
    "long: 5-node cluster runs (every nemesis; membership changes, drains and replica moves overlap the other "
    "faults; every second run, and the 12th, with each group on 3 of the 5 members and 5 groups, the 11th at the "
    "default (3 of 5, 2 groups), the others with every group on every member; the 11th is the TTL + dead-letter "
    "workload, the 12th a partitioned queue) first, then single-node runs; --runs N takes the first N, "
    "--time S shortens each"
)


LONG_OVERLAP = ("membership", "maintenance", "move")


def _long() -> Profile:
    runs = []
    # Five brokers, their clients and the helpers share two cores: a low rate, and fault windows
    # long enough for elections (3 s down timeout) and for a restarted member to catch up.
    cluster_workload = replace(
        LONG_WORKLOAD, publishers=3, consumers=2, rate_per_publisher_hz=10.0, confirm_timeout_s=10.0
    )
    for i in range(10):
        kind = "fifo" if i % 3 == 2 else "queue"
        held = i % 2 == 1  # every second run: groups on 3 of the 5 members
        runs.append(
            RunSpec(
                seed=2001 + i,
                nemeses=CLUSTER_NEMESES_ALL,
                workload_kind=kind,
                workload=workload_for(kind, cluster_workload),
                time_s=300.0,
                quiet_s=(8.0, 15.0),
                fault_s=(5.0, 15.0),
                tail_s=10.0,
                nodes=5,
                lab="netns",
                recovery_timeout_s=90.0,
                drain_timeout_s=120.0,
                overlap=LONG_OVERLAP,
                server_args=HELD_SERVER_ARGS if held else EVERY_GROUP_SERVER_ARGS,
                shards=HELD_SHARDS if held else 2,
            )
        )
    # The TTL + dead-letter variant: the eleventh cluster run, so that the ten above keep their
    # seeds and kinds (and `--runs 6` its meaning); every nemesis, clock skew included (expiry runs
    # on the leader's wall clock).
    runs.append(
        RunSpec(
            seed=2011,
            nemeses=CLUSTER_NEMESES_ALL,
            workload_kind="dlx",
            workload=workload_for("dlx", cluster_workload),
            time_s=300.0,
            quiet_s=(8.0, 15.0),
            fault_s=(5.0, 15.0),
            tail_s=10.0,
            nodes=5,
            lab="netns",
            recovery_timeout_s=90.0,
            drain_timeout_s=120.0,
            overlap=LONG_OVERLAP,
            server_args=CLUSTER_SERVER_ARGS,
        )
    )
    # A partitioned work queue (x-partitions, single active consumers): the twelfth, with every
    # nemesis, its groups on 3 of the 5 members (partitions then move with their groups); the
    # checker holds each publisher's keys to publish order across consumers.
    runs.append(
        replace(
            runs[-1],
            seed=2012,
            workload_kind="partitioned",
            workload=workload_for("partitioned", cluster_workload),
            server_args=HELD_SERVER_ARGS,
            shards=HELD_SHARDS,
        )
    )
    for i in range(10):
        kind = "fifo" if i % 3 == 2 else "queue"
        runs.append(
            RunSpec(
                seed=1001 + i,
                nemeses=("kill", "pause", "disk-stall", "disk-full", "clock-skew"),
                workload_kind=kind,
                workload=workload_for(kind, LONG_WORKLOAD),
                time_s=300.0,
                quiet_s=(10.0, 20.0),
                fault_s=(5.0, 20.0),
                tail_s=10.0,
                recovery_timeout_s=60.0,
                drain_timeout_s=120.0,
            )
        )
    return Profile("long", tuple(runs), (LONG_NOTICE,))


CAMPAIGN_CLUSTER_RUNS = 100
CAMPAIGN_NOTICE = (
    f"campaign: {CAMPAIGN_CLUSTER_RUNS} seeded cluster runs of 60 s over every nemesis (disk-full too; "
    "membership, disk-full and maintenance overlap the other faults), every fifth on 5 nodes with each group on 3 of "
    "them (replica moves overlapping too), queue, fifo and dlx workloads in turn; then single-node runs with at "
    "least 100 kill -9 / restart cycles under confirmed load. Several hours on 2 cores; --runs N takes the first N"
)
CAMPAIGN_OVERLAP = ("membership", "disk-full", "maintenance")
CAMPAIGN_KINDS = ("queue", "fifo", "queue", "dlx")  # 5-node runs meet every kind: 5 and 4 are coprime
CAMPAIGN_KILL_RUNS = 2  # of 120 s: a kill every 1.2-1.8 s, over 100 cycles in all


def _campaign() -> Profile:
    runs = []
    for i in range(CAMPAIGN_CLUSTER_RUNS):
        nodes = 5 if i % 5 == 4 else 3
        # On 5 nodes each group is on 3 of them (issue #19): most members then serve queues whose
        # group they do not hold, and replicas move during the other faults.
        held = nodes == 5
        kind = CAMPAIGN_KINDS[i % len(CAMPAIGN_KINDS)]
        # Lower rates on 5 nodes (five brokers and their clients on two cores), as in the long profile.
        base = replace(
            CI_CLUSTER_WORKLOAD, publishers=3, consumers=2, rate_per_publisher_hz=10.0 if nodes == 5 else 15.0
        )
        runs.append(
            RunSpec(
                seed=3001 + i,
                nemeses=CLUSTER_NEMESES_ALL,
                workload_kind=kind,
                workload=workload_for(kind, base),
                time_s=60.0,
                quiet_s=(4.0, 8.0),
                fault_s=(5.0, 10.0),
                tail_s=5.0,
                nodes=nodes,
                lab="netns",
                recovery_timeout_s=90.0,
                drain_timeout_s=90.0,
                overlap=(*CAMPAIGN_OVERLAP, "move") if held else CAMPAIGN_OVERLAP,
                server_args=HELD_SERVER_ARGS if held else CLUSTER_SERVER_ARGS,  # (3 nodes: the default, 3 of 3)
                shards=HELD_SHARDS if held else 2,
            )
        )
    for i in range(CAMPAIGN_KILL_RUNS):
        runs.append(
            RunSpec(
                seed=4001 + i,
                nemeses=("kill",),
                workload_kind="queue",
                workload=CI_WORKLOAD,
                time_s=120.0,
                quiet_s=(0.8, 1.2),
                fault_s=(0.4, 0.6),
                tail_s=3.0,
                recovery_timeout_s=30.0,
            )
        )
    return Profile("campaign", tuple(runs), (CAMPAIGN_NOTICE,))


PROFILES = {"ci": _ci, "cluster": _cluster, "long": _long, "campaign": _campaign}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]()
    except KeyError:
        raise ValueError(f"unknown profile {name!r} ({', '.join(PROFILES)})") from None
