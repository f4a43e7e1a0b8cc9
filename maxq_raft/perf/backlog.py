"""Backlog mode (amqpload's s4): publish N with confirms and no consumer, then drain.

Theory of operation: the producers publish N messages in total under a confirm window (1000
unless --confirm says otherwise) while nobody consumes, so the broker must hold the whole
backlog. Every --sample-every confirmed messages the parent records the rate since the last
sample and the broker's RSS: the shape of the curve (does publishing slow down, does memory
grow with the backlog) is the point of this mode. After an optional --settle pause the
consumers (at least one) drain the queues, sampled the same way. Both phases are bounded by
--max-time; the drain clock starts before the consumers connect.
"""

from __future__ import annotations

import time

from . import topology
from .fleet import Fleet
from .options import PerfOptions
from .procstat import cpu_s, rss_mb
from .report import common_fields, round_rate
from .throughput import split

SAMPLE_POLL_S = 0.02


class _Sampler:
    def __init__(self, every: int, pids: list[int], t0: float) -> None:
        self.every = every
        self.pids = pids
        self.t0 = t0
        self.next = every
        self.last_n = 0
        self.last_t = t0
        self.samples: list[dict] = []

    def observe(self, n: int, final: bool = False) -> None:
        if n < self.next and not (final and n > self.last_n):
            return
        t = time.monotonic()
        rate = (n - self.last_n) / (t - self.last_t) if t > self.last_t else 0.0
        self.samples.append({"n": n, "t": round(t - self.t0, 2), "rate": round_rate(rate), "rss_mb": rss_mb(self.pids)})
        self.last_n, self.last_t = n, t
        self.next = (n // self.every + 1) * self.every


def run_backlog(options: PerfOptions, deadline: float) -> dict:
    topology.declare(options)
    pids = list(options.broker_pids)
    consumers = max(options.consumers, 1)
    total = options.backlog
    every = options.sample_every or max(total // 10, 1)
    fleet = Fleet(options, deadline)
    try:
        cpu0 = cpu_s(pids)
        rss_idle = rss_mb(pids)
        fleet.set_measuring(True)  # confirm latency over the whole publish phase
        fleet.start_producers(split(total, options.producers))
        t0 = time.monotonic()
        fleet.go()
        phase_end = t0 + options.max_time_s
        pub = _Sampler(every, pids, t0)
        hit_max_time = False
        while not fleet.producers_done():
            fleet.check()
            pub.observe(fleet.confirmed())
            if time.monotonic() > phase_end:
                hit_max_time = True
                fleet.stop_producers()
                fleet.wait_for(fleet.producers_done, options.drain_timeout_s + 30.0)
                break
            time.sleep(SAMPLE_POLL_S)
        pub.observe(fleet.confirmed(), final=True)
        t_pub = time.monotonic()
        published, confirmed = fleet.published(), fleet.confirmed()
        cpu1 = cpu_s(pids)
        rss_full = rss_mb(pids)
        fleet.sleep_until(time.monotonic() + options.settle_s)
        rss_settled = rss_mb(pids)
        target = published * (options.queues if options.fanout else 1)
        td0 = time.monotonic()
        fleet.start_consumers(consumers)
        drain = _Sampler(every, pids, td0)
        drain_end = td0 + options.max_time_s
        while fleet.consumed() < target:
            fleet.check()
            drain.observe(fleet.consumed())
            if time.monotonic() > drain_end:
                hit_max_time = True
                break
            time.sleep(SAMPLE_POLL_S)
        drain.observe(fleet.consumed(), final=True)
        td1 = time.monotonic()
        drained = fleet.consumed()
        cpu2 = cpu_s(pids)
        rss_drained = rss_mb(pids)
        nacked = sum(fleet.control.nacked[: options.producers])
        _, confirm_latency = fleet.collect()
    finally:
        fleet.shutdown()
    topology.delete(options)

    publish_s = t_pub - t0
    drain_s = td1 - td0
    out = common_fields(options)
    out["params"]["consumers"] = consumers
    out.update(
        backlog=total,
        published=published,
        confirmed=confirmed,
        nacked=nacked,
        publish_s=round(publish_s, 2),
        pub_rate=round_rate(published / publish_s),
        drained=drained,
        drain_s=round(drain_s, 2),
        drain_rate=round_rate(drained / drain_s),
        confirm_lat_us=confirm_latency.summary(),
        hit_max_time=hit_max_time,
    )
    if pids:
        out.update(
            broker_cpu_s_publish=round(cpu1 - cpu0, 2),
            broker_cpu_s_drain=round(cpu2 - cpu1, 2),
            broker_cpu_s_per_M_pub=round((cpu1 - cpu0) / (published / 1e6), 2) if published else None,
            broker_cpu_s_per_M_drain=round((cpu2 - cpu1) / (drained / 1e6), 2) if drained else None,
            rss_mb_idle=rss_idle,
            rss_mb_full=rss_full,
            rss_mb_settled=rss_settled,
            rss_mb_drained=rss_drained,
        )
    out["pub_samples"] = pub.samples
    out["drain_samples"] = drain.samples
    return out
