"""Many-things mode (amqpload's s5): K queues, K connections; time and broker RSS per item.

Theory of operation: --k-queues declares K queues one synchronous RPC at a time on one
channel (the cost a client that creates queues on demand pays), waits a second, reads the
broker's RSS, deletes them all and reads RSS again. --k-conns opens K connections one after
another (TCP, handshake, channel.open), holds them --hold seconds, reads RSS, closes them.
Both loops stop early at --max-time; connection failures are counted and more than
`CONN_FAILURES_MAX` of them end the loop. The file-descriptor limit is raised to its hard
maximum first, because K connections need K descriptors in this one process.
"""

from __future__ import annotations

import resource
import sys
import time

from . import topology
from .client import AmqpClient
from .options import PerfOptions
from .procstat import cpu_s, rss_kb
from .report import common_fields, round_rate

CONN_FAILURES_MAX = 10
SETTLE_S = 1.0
FD_SPARE = 64


def _kb_per_item(before_kb, after_kb, count: int):
    if before_kb is None or after_kb is None or not count:
        return None
    return round((after_kb - before_kb) / count, 1)


def run_many(options: PerfOptions, deadline: float) -> dict:
    pids = list(options.broker_pids)
    out = common_fields(options)
    if options.k_queues:
        out.update(_many_queues(options, pids, deadline))
    if options.k_conns:
        out.update(_many_connections(options, pids, deadline))
    return out


def _many_queues(options: PerfOptions, pids: list[int], deadline: float) -> dict:
    client = topology.connect(options)
    try:
        rss0, cpu0 = rss_kb(pids), cpu_s(pids)
        t0 = time.monotonic()
        stop_at = min(t0 + options.max_time_s, deadline)
        made = 0
        for i in range(options.k_queues):
            client.queue_declare(
                f"{options.queue_prefix}-many-{i}", durable=options.durable, arguments=options.queue_args
            )
            made += 1
            if time.monotonic() > stop_at:
                break
        t1 = time.monotonic()
        time.sleep(SETTLE_S)
        rss1, cpu1 = rss_kb(pids), cpu_s(pids)
        for i in range(made):
            client.queue_delete(f"{options.queue_prefix}-many-{i}")
        t2 = time.monotonic()
        time.sleep(SETTLE_S)
        rss2 = rss_kb(pids)
    finally:
        client.close()
    return {
        "k_queues": options.k_queues,
        "queues_declared": made,
        "declare_s": round(t1 - t0, 2),
        "declare_rate": round_rate(made / (t1 - t0)),
        "delete_s": round(t2 - t1, 2),
        "q_rss_mb_before": None if rss0 is None else round(rss0 / 1024, 1),
        "q_rss_mb_after": None if rss1 is None else round(rss1 / 1024, 1),
        "q_rss_kb_per_queue": _kb_per_item(rss0, rss1, made),
        "q_rss_mb_after_delete": None if rss2 is None else round(rss2 / 1024, 1),
        "q_broker_cpu_s": round(cpu1 - cpu0, 2) if pids else None,
    }


def _raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def _many_connections(options: PerfOptions, pids: list[int], deadline: float) -> dict:
    limit = _raise_fd_limit(options.k_conns + FD_SPARE)
    if limit != resource.RLIM_INFINITY and limit < options.k_conns + FD_SPARE:
        print(
            f"maxq-perf: file descriptor limit {limit} is below {options.k_conns} connections",
            file=sys.stderr,
            flush=True,
        )
    clients: list[AmqpClient] = []
    failures = 0
    try:
        rss0, cpu0 = rss_kb(pids), cpu_s(pids)
        t0 = time.monotonic()
        stop_at = min(t0 + options.max_time_s, deadline)
        for _ in range(options.k_conns):
            try:
                clients.append(
                    AmqpClient(
                        options.host,
                        options.port,
                        user=options.user,
                        password=options.password,
                        vhost=options.vhost,
                        frame_max=options.frame_max,
                        timeout_s=15.0,
                    ).connect()
                )
            except Exception as exc:  # noqa: BLE001 - any failure is counted, as amqpload does
                failures += 1
                if failures == 1:
                    print(f"maxq-perf: connection failed: {exc}", file=sys.stderr, flush=True)
                if failures > CONN_FAILURES_MAX:
                    break
            if time.monotonic() > stop_at:
                break
        t1 = time.monotonic()
        time.sleep(min(options.hold_s, max(0.0, deadline - time.monotonic())))
        rss1, cpu1 = rss_kb(pids), cpu_s(pids)
    finally:
        t_close = time.monotonic()
        for client in clients:
            client.close()
        t2 = time.monotonic()
    time.sleep(SETTLE_S)
    rss2 = rss_kb(pids)
    made = len(clients)
    return {
        "k_conns": options.k_conns,
        "conns_opened": made,
        "conn_failures": failures,
        "open_s": round(t1 - t0, 2),
        "open_rate": round_rate(made / (t1 - t0)) if t1 > t0 else None,
        "close_s": round(t2 - t_close, 2),
        "c_rss_mb_before": None if rss0 is None else round(rss0 / 1024, 1),
        "c_rss_mb_after": None if rss1 is None else round(rss1 / 1024, 1),
        "c_rss_kb_per_conn": _kb_per_item(rss0, rss1, made),
        "c_rss_mb_after_close": None if rss2 is None else round(rss2 / 1024, 1),
        "c_broker_cpu_s": round(cpu1 - cpu0, 2) if pids else None,
    }
