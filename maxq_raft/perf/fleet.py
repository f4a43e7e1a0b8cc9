"""The worker processes of one run: start, steer, watch, collect, and always stop them.

Theory of operation: `Fleet` forks one process per consumer and per producer (workers.py),
waits (bounded) until each says it is ready — a consumer once basic.consume-ok arrived, a
producer once its connection is open (and confirm.select done) — and then releases all
producers at one instant (`go`, which also fixes t0 for rate schedules). While the parent
sleeps through warm-up and the measured window it polls the result pipes: a worker sends its
result only at the end, so anything that arrives early is a failure (a broker close, a lost
connection) and stops the run. `shutdown()` is called in a finally: workers are asked to stop
through the flags, joined with a timeout, and terminated (then killed) if they do not go.
"""

from __future__ import annotations

import multiprocessing
import time

from .histogram import Histogram
from .options import PerfOptions
from .procstat import cpu_s
from .workers import (
    CLOSE_PRODUCERS,
    GO,
    MEASURING,
    STOP_CONSUMERS,
    STOP_PRODUCERS,
    T0_NS,
    Control,
    consumer_main,
    producer_main,
)

READY_TIMEOUT_S = 30.0
POLL_S = 0.01
JOIN_TIMEOUT_S = 10.0
COLLECT_TIMEOUT_S = 30.0


class RunFailed(Exception):
    pass


class Fleet:
    def __init__(self, options: PerfOptions, deadline: float) -> None:
        self.options = options
        self.deadline = deadline
        self.context = multiprocessing.get_context("fork")
        self.control = Control(options.producers, options.consumers)
        self.producers: list = []  # (process, pipe)
        self.consumers: list = []
        self.results: dict = {}  # (role, index) -> result dict
        self.io: dict = {}  # socket calls of all workers over the whole run (reads return data)

    # -- starting ------------------------------------------------------------------------

    def start_consumers(self, count: int) -> None:
        for i in range(count):
            here, there = self.context.Pipe(duplex=False)
            proc = self.context.Process(
                target=consumer_main,
                name=f"maxq-perf-consumer-{i}",
                args=(self.control, i, self.options, there, self.deadline),
                daemon=True,
            )
            proc.start()
            there.close()
            self.consumers.append((proc, here))
        self._wait_ready(self.control.consumer_ready, count, "consumers")

    def start_producers(self, limits: list[int]) -> None:
        for i, limit in enumerate(limits):
            here, there = self.context.Pipe(duplex=False)
            proc = self.context.Process(
                target=producer_main,
                name=f"maxq-perf-producer-{i}",
                args=(self.control, i, self.options, limit, there, self.deadline),
                daemon=True,
            )
            proc.start()
            there.close()
            self.producers.append((proc, here))
        self._wait_ready(self.control.producer_ready, len(limits), "producers")

    def _wait_ready(self, ready, count: int, what: str) -> None:
        until = time.monotonic() + READY_TIMEOUT_S
        while sum(ready[:count]) < count:
            self.check()
            if time.monotonic() > until:
                raise RunFailed(f"{what} not ready within {READY_TIMEOUT_S:.0f} s")
            time.sleep(POLL_S)

    def go(self) -> int:
        t0_ns = time.monotonic_ns()
        self.control.flags[T0_NS] = t0_ns
        self.control.flags[GO] = 1
        return t0_ns

    # -- steering and watching -----------------------------------------------------------

    def set_measuring(self, on: bool) -> None:
        self.control.flags[MEASURING] = 1 if on else 0

    def published(self) -> int:
        return self.control.total(self.control.published, len(self.producers))

    def confirmed(self) -> int:
        return self.control.total(self.control.confirmed, len(self.producers))

    def consumed(self) -> int:
        return self.control.total(self.control.consumed, len(self.consumers))

    def producers_done(self) -> bool:
        return sum(self.control.producer_done[: len(self.producers)]) == len(self.producers)

    def worker_pids(self) -> list[int]:
        return [p.pid for p, _ in self.producers + self.consumers if p.pid]

    def worker_cpu_s(self) -> float:
        return cpu_s(self.worker_pids())

    def check(self) -> None:
        """Raise RunFailed if any worker reported (= failed) early or died."""
        for role, workers in (("producer", self.producers), ("consumer", self.consumers)):
            for i, (proc, pipe) in enumerate(workers):
                if (role, i) not in self.results and pipe.poll():
                    try:
                        self.results[(role, i)] = pipe.recv()
                    except EOFError:
                        self.results[(role, i)] = {"error": f"{role} {i} exited (code {proc.exitcode})"}
                result = self.results.get((role, i))
                if result and result.get("error"):
                    raise RunFailed(result["error"] + ("\n" + result["traceback"] if result.get("traceback") else ""))
        if time.monotonic() > self.deadline:
            raise RunFailed("run deadline passed")

    def sleep_until(self, t_mono: float) -> None:
        while True:
            left = t_mono - time.monotonic()
            if left <= 0:
                return
            self.check()
            time.sleep(min(left, POLL_S))

    def wait_for(self, predicate, timeout_s: float) -> bool:
        until = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > until:
                return False
            self.check()
            time.sleep(POLL_S)
        return True

    # -- ending --------------------------------------------------------------------------

    def stop_producers(self) -> None:
        self.control.flags[STOP_PRODUCERS] = 1

    def stop_consumers(self) -> None:
        self.control.flags[STOP_CONSUMERS] = 1

    def close_producers(self) -> None:
        self.control.flags[CLOSE_PRODUCERS] = 1

    def collect(self) -> tuple[Histogram, Histogram]:
        """Every worker's result: (end-to-end latency, confirm latency), merged."""
        self.stop_producers()
        self.stop_consumers()
        self.close_producers()
        until = time.monotonic() + COLLECT_TIMEOUT_S
        latency, confirm_latency = Histogram(), Histogram()
        self.io = {"producer_reads": 0, "producer_writes": 0, "consumer_reads": 0, "consumer_writes": 0}
        for role, workers in (("producer", self.producers), ("consumer", self.consumers)):
            for i, (proc, pipe) in enumerate(workers):
                if (role, i) not in self.results:
                    left = until - time.monotonic()
                    if left > 0 and pipe.poll(left):
                        try:
                            self.results[(role, i)] = pipe.recv()
                        except EOFError:
                            self.results[(role, i)] = {"error": f"{role} {i} exited (code {proc.exitcode})"}
                    else:
                        late = f"{role} {i} sent no result within {COLLECT_TIMEOUT_S:.0f} s"
                        self.results[(role, i)] = {"error": late}
                result = self.results[(role, i)]
                if result.get("error"):
                    raise RunFailed(result["error"] + ("\n" + result["traceback"] if result.get("traceback") else ""))
                self.io[f"{role}_reads"] += result.get("reads", 0)
                self.io[f"{role}_writes"] += result.get("writes", 0)
                if "latency_histogram" in result:
                    latency.merge(Histogram.from_wire(result["latency_histogram"]))
                if "confirm_histogram" in result:
                    confirm_latency.merge(Histogram.from_wire(result["confirm_histogram"]))
        return latency, confirm_latency

    def shutdown(self) -> None:
        flags = self.control.flags
        flags[STOP_PRODUCERS] = flags[STOP_CONSUMERS] = flags[CLOSE_PRODUCERS] = 1
        until = time.monotonic() + JOIN_TIMEOUT_S
        everyone = [p for p, _ in self.producers + self.consumers]
        for proc in everyone:
            proc.join(max(0.0, until - time.monotonic()))
        for proc in everyone:
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
        for _, pipe in self.producers + self.consumers:
            pipe.close()
