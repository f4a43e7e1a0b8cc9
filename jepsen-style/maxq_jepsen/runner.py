"""One run, start to finish: lab up, workload on, faults on schedule, heal, recover, drain, check.

Theory of operation (Jepsen's shape):

    setup       start the nodes, declare the durable queue(s), start consumers then publishers
                (the sqs workload: make an access key, CreateQueue, receivers then senders)
    schedule    for each seeded cycle: quiet, fault (nemesis start), heal (nemesis heal)
    final heal  heal every nemesis (idempotent), restart any node found dead
    recover     probe every node until it confirms a publish again (bounded)
    settle      stop publishers (their in-flight confirms get a grace period), let consumers
                take what is left (bounded), stop consumers (unacked messages go back)
    drain       basic.get everything left from every node (bounded)
    check       the pure checker on the history file; report

Every phase change is a history record (f="phase"), every fault an invoke/ok pair from the
"nemesis" process, so the history alone tells the checker and the report what happened. Every
process started here is stopped in a `finally`; every wait has a deadline; client threads that
do not stop in time are abandoned (daemon threads) and named in the result.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from pathlib import Path

from . import sqs_workload, txn_workload
from .checker import check
from .history import INFO, INVOKE, OK, HistoryWriter, read_history
from .lab import Lab, LabError, make_lab
from .nemesis import OVERLAPPABLE, RESTART_TIMEOUT_S, lab_features, make_nemeses, make_schedule
from .profiles import RunSpec
from .workload import Consumer, Publisher, declare_queue, drain, probe

JOIN_GRACE_S = 5.0
# An overlapping membership removal: its retries (90 s) plus its wait for the member to stop, and slack.
RIDER_JOIN_TIMEOUT_S = 130.0
PROBE_INTERVAL_S = 0.5
SETTLE_POLL_S = 0.5


class Run:
    def __init__(self, spec: RunSpec, run_dir: Path, profile: str = "custom", log=print) -> None:
        self.spec = spec
        self.run_dir = Path(run_dir)
        self.profile = profile
        self.log = log
        self.history_path = self.run_dir / "history.jsonl"
        self.notes: list[str] = []
        self.findings: list[str] = []  # things that look like broker bugs, beyond the checker's verdicts

    # -- recording helpers ------------------------------------------------------------------

    def phase(self, name: str, **value) -> None:
        self.history.write(OK, "phase", "runner", value={"phase": name, **value})

    def nemesis_op(self, f: str, action) -> dict | None:
        self.history.write(INVOKE, f, "nemesis")
        try:
            value = action()
        except Exception as exc:
            self.history.write(INFO, f, "nemesis", error=repr(exc)[:500])
            self.notes.append(f"nemesis {f} failed: {exc!r}")
            return None
        self.history.write(OK, f, "nemesis", value=value)
        return value

    def restart_dead_nodes(self, when: str) -> None:
        """A node that is down although no nemesis holds it down crashed by itself: a finding."""
        for node in self.lab.nodes:
            if node.alive():
                continue
            code = node.proc.returncode if node.proc is not None else None
            finding = f"{node.name} found dead ({when}, exit {code}); log tail:\n{node.log_tail(2000)}"
            self.findings.append(finding)
            self.history.write(INFO, "crashed", "nemesis", node=node.name, value={"returncode": code, "when": when})
            self.nemesis_op("restart", lambda node=node: (node.start(RESTART_TIMEOUT_S), {"restarted": [node.name]})[1])

    def sleep_until(self, t: float) -> None:
        while True:
            left = t - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.25))

    # -- the run ----------------------------------------------------------------------------

    def execute(self) -> dict:
        spec = self.spec
        self.run_dir.mkdir(parents=True, exist_ok=True)
        schedule = make_schedule(
            spec.seed, list(spec.nemeses), spec.time_s, spec.quiet_s, spec.fault_s, spec.tail_s, tuple(spec.overlap)
        )
        if spec.nemeses and not schedule:
            self.notes.append(
                f"no fault fits in {spec.time_s:g} s with quiet {spec.quiet_s} and fault {spec.fault_s} s"
            )
        self.history = HistoryWriter(self.history_path)
        sqs = spec.workload_kind == "sqs"
        features = lab_features(list(spec.nemeses)) | ({"sqs"} if sqs else set())
        self.lab: Lab = make_lab(spec.lab, self.run_dir, spec.nodes, list(spec.server_args), spec.shards, features)
        nemeses = make_nemeses(list(spec.nemeses), spec.workload.queue)
        self.history.meta(
            profile=self.profile, spec=spec.to_dict(), schedule=[c.to_dict() for c in schedule], lab=self.lab.describe()
        )
        pub_stop, con_stop = threading.Event(), threading.Event()
        workers: list = []
        drained: dict = {}
        started = time.monotonic()
        try:
            self.lab.setup()
            nodes = [(n.name, *self.lab.address(n)) for n in self.lab.nodes]
            sqs_nodes = [(n.name, self.lab.sqs_url(n)) for n in self.lab.nodes]
            if sqs:
                sqs_key = sqs_workload.setup(self.lab, spec.workload)
            else:
                declare_queue(
                    nodes[0][1], nodes[0][2], spec.workload, timeout_s=20.0, enter=lambda: self.lab.enter(nodes[0][0])
                )
            hard_deadline = (
                time.monotonic() + spec.time_s + spec.recovery_timeout_s + spec.settle_s + spec.drain_timeout_s + 60.0
            )
            consumers: list = []
            publishers: list = []
            if sqs:  # the same shape over the SQS endpoint: receivers and senders
                common = (self.history, sqs_nodes, sqs_key, spec.workload, spec.seed)
                consumers = [
                    sqs_workload.SqsReceiver(f"con{i}", *common, con_stop, hard_deadline, enter=self.lab.enter)
                    for i in range(spec.workload.consumers)
                ]
                publishers = [
                    sqs_workload.SqsSender(f"pub{i}", *common, pub_stop, hard_deadline, enter=self.lab.enter)
                    for i in range(spec.workload.publishers)
                ]
            elif spec.workload_kind == "txn":
                book = txn_workload.TxnBook()
                common_args = (self.history, nodes, spec.workload, spec.seed)
                consumers = [
                    Consumer(f"con{i}", *common_args, con_stop, hard_deadline, enter=self.lab.enter)
                    for i in range(spec.workload.consumers)
                ]
                # The check responders answer until the consumers stop (after the settle), so that
                # transactions left to the check-back are resolved before the drain.
                consumers += [
                    txn_workload.CheckResponder(
                        f"chk{i}", *common_args, con_stop, hard_deadline, enter=self.lab.enter, book=book
                    )
                    for i in range(spec.workload.check_responders)
                ]
                publishers = [
                    txn_workload.TxnPublisher(
                        f"pub{i}", *common_args, pub_stop, hard_deadline, enter=self.lab.enter, book=book
                    )
                    for i in range(spec.workload.publishers)
                ]
            else:
                # With a dead-letter queue, odd consumers take from it; the work queue's consumers
                # pause now and then (WorkloadConfig.consume_s/pause_s) so that messages expire.
                consumers = [
                    Consumer(
                        f"con{i}",
                        self.history,
                        nodes,
                        spec.workload,
                        spec.seed,
                        con_stop,
                        hard_deadline,
                        enter=self.lab.enter,
                        queue=spec.workload.consumer_queue(i),
                        pauses=spec.workload.consumer_queue(i) == spec.workload.queue,
                    )
                    for i in range(spec.workload.consumers)
                ]
                publishers = [
                    Publisher(
                        f"pub{i}",
                        self.history,
                        nodes,
                        spec.workload,
                        spec.seed,
                        pub_stop,
                        hard_deadline,
                        enter=self.lab.enter,
                    )
                    for i in range(spec.workload.publishers)
                ]
            workers = consumers + publishers
            self.phase("quiet")
            t0 = time.monotonic()
            for worker in workers:
                worker.start()
            run_end = t0 + spec.time_s
            rng = random.Random(f"{spec.seed}:nemesis")
            for cycle_index, cycle in enumerate(schedule):
                self.sleep_until(min(time.monotonic() + cycle.quiet_s, run_end))
                if time.monotonic() >= run_end:
                    break
                nemesis = nemeses[cycle.nemesis]
                self.nemesis_op(cycle.nemesis, lambda: nemesis.start(self.lab, rng))
                fault_end = time.monotonic() + cycle.fault_s
                self.phase("fault", nemesis=cycle.nemesis)
                rider = nemeses[cycle.with_] if cycle.with_ else None
                rider_thread = None
                if rider is not None:
                    # A membership change while the fault holds. Its removal only runs maxqctl and
                    # stops a process, so it may run beside the main thread: the fault is healed at
                    # the end of its window even when the change is still retrying (a disk stall
                    # or a delay is not held for the 90 s a blocked removal may take). Its own
                    # seeded RNG keeps the run's other choices what they were.
                    rider_rng = random.Random(f"{spec.seed}:rider:{cycle_index}")
                    rider_thread = threading.Thread(
                        target=self.nemesis_op,
                        args=(cycle.with_, lambda: rider.start(self.lab, rider_rng)),
                        name=f"nemesis-{cycle.with_}",
                        daemon=True,
                    )
                    rider_thread.start()
                self.sleep_until(min(fault_end, run_end))
                self.nemesis_op("heal", lambda: {cycle.nemesis: nemesis.heal(self.lab)})
                if rider_thread is not None:  # the member comes back once the fault is healed
                    rider_thread.join(RIDER_JOIN_TIMEOUT_S)
                    if rider_thread.is_alive():
                        self.notes.append(f"{cycle.with_} start still running after {RIDER_JOIN_TIMEOUT_S:g} s")
                    else:
                        self.nemesis_op("heal", lambda: {cycle.with_: rider.heal(self.lab)})
                self.restart_dead_nodes("after heal")
                self.phase("heal", nemesis=cycle.nemesis)
            self.sleep_until(run_end)

            # Final heal: every nemesis, whether or not it is active (heal is idempotent).
            # Overlapping nemeses (membership) last: a member is added back once the other faults are gone.
            order = sorted(nemeses, key=lambda name: name in OVERLAPPABLE)
            self.nemesis_op("heal", lambda: {name: nemeses[name].heal(self.lab) for name in order})
            self.restart_dead_nodes("at the final heal")
            self.phase("recover")
            self.wait_for_recovery(nodes)

            pub_stop.set()
            self.join(publishers, spec.workload.confirm_timeout_s + 10.0)
            if spec.workload.checks_queue:
                # Transactions left to the check-back: their first check comes one timeout after
                # the last half; give the responders that and a second round before the settle.
                time.sleep(2 * max(spec.workload.txn_timeout_ms) / 1000.0 + 1.0)
            self.settle(nodes)
            con_stop.set()
            self.join(consumers, 10.0)
            self.phase("drain")
            if sqs:
                drained = sqs_workload.drain(
                    self.history, sqs_nodes, sqs_key, spec.workload, spec.drain_timeout_s, enter=self.lab.enter
                )
            else:
                drained = drain(self.history, nodes, spec.workload, spec.drain_timeout_s, enter=self.lab.enter)
            self.restart_dead_nodes("at the end")
            self.phase("end")
        except LabError as exc:
            self.notes.append(f"lab: {exc}")
            self.history.write(INFO, "lab", "runner", error=str(exc)[:2000])
        finally:
            pub_stop.set()
            con_stop.set()
            self.join([w for w in workers if w.is_alive()], JOIN_GRACE_S)
            try:  # teardown resumes paused nodes before it stops them
                self.lab.teardown()
            finally:
                self.history.close()
        elapsed_s = time.monotonic() - started
        for worker in workers:
            if worker.error is not None:
                self.notes.append(f"{worker.process}: harness error {worker.error!r}")
            if worker.is_alive():
                self.notes.append(f"{worker.process} did not stop in time (abandoned)")
        for node in self.lab.nodes:
            for line in node.log_problems():
                self.findings.append(f"{node.name} log: {line}")

        result = check(read_history(self.history_path))
        out = {
            "seed": spec.seed,
            "profile": self.profile,
            "workload": spec.workload_kind,
            "nemeses": list(spec.nemeses),
            "time_s": spec.time_s,
            "elapsed_s": round(elapsed_s, 1),
            "schedule": [c.to_dict() for c in schedule],
            "faults": sum(1 for c in schedule),
            "run_dir": str(self.run_dir),
            "history": str(self.history_path),
            "drain": drained,
            **result.to_dict(),
        }
        out["notes"] = out["notes"] + self.notes
        out["findings"] = self.findings
        return out

    def join(self, workers: list, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def wait_for_recovery(self, nodes) -> None:
        """Probe every node until each confirms a publish again; record how long that took."""
        started = time.monotonic()
        deadline = started + self.spec.recovery_timeout_s
        self.history.write(INVOKE, "recover", "probe")
        pending = {name: (host, port) for name, host, port in nodes}
        why: dict[str, str] = {}
        while pending and time.monotonic() < deadline:
            for name, (host, port) in list(pending.items()):
                problem = bounded_probe(
                    host,
                    port,
                    self.spec.workload,
                    lambda name=name: self.lab.enter(name),
                    max(1.0, min(PROBE_TIMEOUT_S, deadline - time.monotonic())),
                )
                if problem is None:
                    del pending[name]
                else:
                    why[name] = problem
            if pending:
                time.sleep(PROBE_INTERVAL_S)
        seconds = round(time.monotonic() - started, 3)
        if pending:
            self.notes.append(f"not recovered after {self.spec.recovery_timeout_s}s: {why}")
            self.history.write(
                INFO, "recover", "probe", value={"seconds": seconds, "pending": sorted(pending)}, error=str(why)[:500]
            )
        else:
            self.history.write(OK, "recover", "probe", value={"seconds": seconds})

    def settle(self, nodes) -> None:
        """Consumers keep going until the queue(s) show no ready message twice in a row (bounded)."""
        from .workload import blocking_connection  # local: only the settle step needs a blocking client

        def ready_on(name: str, host: str, port: int) -> int:
            with self.lab.enter(name):
                conn = blocking_connection(host, port, self.spec.workload)
            try:
                channel = conn.channel()
                return sum(
                    channel.queue_declare(q, passive=True).method.message_count for q in self.spec.workload.queues()
                )
            finally:
                conn.close()

        deadline = time.monotonic() + self.spec.settle_s
        zeros = 0
        while time.monotonic() < deadline and zeros < 2:
            ready = 0
            for name, host, port in nodes:
                # In a thread, waited for until the deadline: a node that never answers (a bug the
                # probes report) must not stall the run; the thread ends when the node is stopped.
                box: list = []

                def ask(name=name, host=host, port=port, box=box) -> None:
                    try:
                        box.append(ready_on(name, host, port))
                    except Exception:
                        box.append(-1)

                thread = threading.Thread(target=ask, daemon=True, name=f"settle-{name}")
                thread.start()
                thread.join(max(0.1, deadline - time.monotonic()))
                count = box[0] if box else -1
                if count < 0:
                    ready = -1
                    break
                ready += count
            zeros = zeros + 1 if ready == 0 else 0
            time.sleep(SETTLE_POLL_S)


def discard_data(run_dir: Path, lab_nodes: int) -> None:
    """Data folders of a passing run are not kept (the history and logs are)."""
    for i in range(1, lab_nodes + 1):
        shutil.rmtree(run_dir / f"n{i}" / "data", ignore_errors=True)
        shutil.rmtree(run_dir / f"n{i}" / "data.backing", ignore_errors=True)  # disk-stall's FUSE backing folder


PROBE_TIMEOUT_S = 15.0


def bounded_probe(host: str, port: int, config, enter, timeout_s: float) -> str | None:
    """`probe` in a thread, waited for at most timeout_s: a broker that never answers a command
    (a bug, and exactly what a probe is for) must not stall the run. A probe left waiting ends
    when its node is stopped at teardown (its socket closes)."""
    box: list = []
    thread = threading.Thread(
        target=lambda: box.append(probe(host, port, config, enter=enter)), daemon=True, name=f"probe-{host}:{port}"
    )
    thread.start()
    thread.join(timeout_s)
    if not box:
        return f"no answer within {timeout_s:.0f} s (a command hangs on this node)"
    return box[0]
