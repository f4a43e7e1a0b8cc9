"""Throughput mode (amqpload's s1, s2 with --rate, s3 with --fanout): rates over a measured window.

Theory of operation: declare the queues fresh, start the consumers (ready = consume-ok), start
the producers, release them together, sleep through the warm-up, then measure a window of
--duration seconds: the counters, the broker's and our CPU and the machine's busy time are read
at both ends, the per-second rates in between, and latency is recorded only inside the window
(workers watch the measuring flag). Then producers stop, wait for their confirms, and the
consumers get up to --drain-timeout to take everything that was published (`drained`), so a
run can also check that nothing was lost. Rates are over the window only.
"""

from __future__ import annotations

import time

from . import topology
from .fleet import Fleet
from .options import PerfOptions
from .procstat import cpu_s, machine_busy_s, rss_mb, self_cpu_s
from .report import common_fields, cpu_fields, round_rate

UNLIMITED_MSGS = 1 << 62
SAMPLE_INTERVAL_S = 1.0


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def drainable(options: PerfOptions) -> bool:
    """Does every queue that gets messages have a consumer (consumer i reads queue i % Q)?"""
    covered = {i % options.queues for i in range(options.consumers)}
    targeted = set(range(options.queues)) if options.fanout else {i % options.queues for i in range(options.producers)}
    return bool(options.consumers) and targeted <= covered


def run_throughput(options: PerfOptions, deadline: float) -> dict:
    topology.declare(options)
    pids = list(options.broker_pids)
    fleet = Fleet(options, deadline)
    try:
        if options.consumers:
            fleet.start_consumers(options.consumers)
        fleet.start_producers(split(options.max_msgs or UNLIMITED_MSGS, options.producers))
        t_go = time.monotonic()
        fleet.go()
        fleet.sleep_until(t_go + options.warmup_s)
        pub0, cons0, conf0 = fleet.published(), fleet.consumed(), fleet.confirmed()
        broker_cpu0, client_cpu0, busy0 = cpu_s(pids), fleet.worker_cpu_s() + self_cpu_s(), machine_busy_s()
        rss0 = rss_mb(pids)
        t0 = time.monotonic()
        fleet.set_measuring(True)
        per_sec_pub, per_sec_cons = [], []
        last_pub, last_cons = pub0, cons0
        t_end = t0 + options.duration_s
        tick = t0
        while tick < t_end:
            tick = min(tick + SAMPLE_INTERVAL_S, t_end)
            fleet.sleep_until(tick)
            p, c = fleet.published(), fleet.consumed()
            per_sec_pub.append(p - last_pub)
            per_sec_cons.append(c - last_cons)
            last_pub, last_cons = p, c
        t1 = time.monotonic()
        pub1, cons1, conf1 = fleet.published(), fleet.consumed(), fleet.confirmed()
        broker_cpu1, client_cpu1, busy1 = cpu_s(pids), fleet.worker_cpu_s() + self_cpu_s(), machine_busy_s()
        rss1 = rss_mb(pids)
        fleet.set_measuring(False)
        fleet.stop_producers()
        fleet.wait_for(fleet.producers_done, options.drain_timeout_s + 30.0)
        published_total = fleet.published()
        expected = published_total * (options.queues if options.fanout else 1)
        drained = False
        if drainable(options):
            drained = fleet.wait_for(lambda: fleet.consumed() >= expected, options.drain_timeout_s)
        consumed_total = fleet.consumed()
        nacked = sum(fleet.control.nacked[: options.producers])
        latency, confirm_latency = fleet.collect()
    finally:
        fleet.shutdown()
    topology.delete(options)

    elapsed = t1 - t0
    out = common_fields(options)
    out.update(
        elapsed=round(elapsed, 3),
        pub_rate=round_rate((pub1 - pub0) / elapsed),
        cons_rate=round_rate((cons1 - cons0) / elapsed),
    )
    if options.confirm_window:
        out["confirm_rate"] = round_rate((conf1 - conf0) / elapsed)
    out.update(
        published_total=published_total,
        consumed_total=consumed_total,
        nacked=nacked,
        drained=drained,
        lat_us=latency.summary(),
        confirm_lat_us=confirm_latency.summary(),
    )
    out.update(
        cpu_fields(
            pids,
            elapsed,
            broker_cpu1 - broker_cpu0,
            client_cpu1 - client_cpu0,
            busy1 - busy0,
            pub1 - pub0,
            cons1 - cons0,
            rss0,
            rss1,
        )
    )
    full = [v for v in (per_sec_cons if options.consumers else per_sec_pub)]
    if len(full) > 1 and elapsed < len(full) - 0.5:
        full = full[:-1]  # a partial last second
    if len(full) > 1:
        out["per_sec_min"], out["per_sec_max"] = min(full), max(full)
    out["client_io"] = fleet.io
    return out
