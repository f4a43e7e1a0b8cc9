"""The output: one JSON object per run on stdout (amqpload's field names), a table on stderr.

Theory of operation: where maxq-perf measures what amqpload measures, the key is the same
(pub_rate, cons_rate, confirm_rate, lat_us{n,p50,p90,p99,p999,max}, confirm_lat_us,
broker_cpu_s_per_M_pub/_cons, broker_rss_mb_start/_end, client_cpu_util, other_cpu_util,
pub_samples, drain_rate, declare_rate, q_rss_kb_per_queue, open_rate, c_rss_kb_per_conn...),
so scripts/bench reads either tool's lines. "tool" says which.
"""

from __future__ import annotations

import datetime
import json
import sys

from .options import PerfOptions


def round_rate(value: float) -> int:
    return int(round(value))


def common_fields(options: PerfOptions) -> dict:
    return {
        "tool": "maxq-perf",
        "scenario": options.scenario,
        "label": options.label,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "target": f"{options.host}:{options.port}",
        "params": {
            "producers": options.producers,
            "consumers": options.consumers,
            "queues": options.queues,
            "size": options.body_bytes,
            "duration": options.duration_s,
            "warmup": options.warmup_s,
            "rate": options.rate_total,
            "confirm": options.confirm_window,
            "persistent": int(options.persistent),
            "durable": int(options.durable),
            "autoack": int(not options.manual_ack),
            "prefetch": options.prefetch,
            "multi_ack": options.multi_ack,
            "fanout": int(options.fanout),
            "qargs": {k: str(v) for k, v in options.queue_args.items()},
        },
    }


def cpu_fields(
    pids: list[int],
    elapsed_s: float,
    broker_cpu_s: float,
    client_cpu_s: float,
    busy_s: float,
    published: int,
    consumed: int,
    rss_start_mb,
    rss_end_mb,
) -> dict:
    out: dict = {}
    if pids:
        out["broker_cpu_s"] = round(broker_cpu_s, 2)
        out["broker_cpu_util"] = round(broker_cpu_s / elapsed_s, 2)
        out["broker_cpu_s_per_M_pub"] = round(broker_cpu_s / (published / 1e6), 2) if published else None
        out["broker_cpu_s_per_M_cons"] = round(broker_cpu_s / (consumed / 1e6), 2) if consumed else None
        out["broker_rss_mb_start"] = rss_start_mb
        out["broker_rss_mb_end"] = rss_end_mb
    out["client_cpu_s"] = round(client_cpu_s, 2)
    out["client_cpu_util"] = round(client_cpu_s / elapsed_s, 2)
    out["machine_busy_util"] = round(busy_s / elapsed_s, 2)
    out["other_cpu_util"] = round((busy_s - client_cpu_s - (broker_cpu_s if pids else 0.0)) / elapsed_s, 2)
    return out


def emit(result: dict, table: bool) -> None:
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    if table:
        sys.stderr.write(render_table(result))
        sys.stderr.flush()


_ROWS = [
    ("pub_rate", "published msgs/s"),
    ("confirm_rate", "confirmed msgs/s"),
    ("cons_rate", "consumed msgs/s"),
    ("published_total", "published (total)"),
    ("consumed_total", "consumed (total)"),
    ("nacked", "nacked"),
    ("drained", "drained"),
    ("lat_us", "latency us"),
    ("confirm_lat_us", "confirm latency us"),
    ("broker_cpu_s_per_M_pub", "broker CPU s / M published"),
    ("broker_cpu_s_per_M_cons", "broker CPU s / M consumed"),
    ("broker_cpu_util", "broker cores used"),
    ("broker_rss_mb_start", "broker RSS MB (start)"),
    ("broker_rss_mb_end", "broker RSS MB (end)"),
    ("client_cpu_util", "maxq-perf cores used"),
    ("other_cpu_util", "other tenants' cores"),
    ("per_sec_min", "per second min"),
    ("per_sec_max", "per second max"),
    # backlog
    ("backlog", "backlog"),
    ("publish_s", "publish seconds"),
    ("drain_s", "drain seconds"),
    ("drain_rate", "drain msgs/s"),
    ("rss_mb_idle", "RSS MB idle"),
    ("rss_mb_full", "RSS MB full backlog"),
    ("rss_mb_settled", "RSS MB settled"),
    ("rss_mb_drained", "RSS MB drained"),
    ("broker_cpu_s_per_M_drain", "broker CPU s / M drained"),
    # many
    ("queues_declared", "queues declared"),
    ("declare_s", "declare seconds"),
    ("declare_rate", "queue.declare /s"),
    ("delete_s", "delete seconds"),
    ("q_rss_kb_per_queue", "RSS KB per queue"),
    ("conns_opened", "connections opened"),
    ("conn_failures", "connection failures"),
    ("open_s", "open seconds"),
    ("open_rate", "connections /s"),
    ("close_s", "close seconds"),
    ("c_rss_kb_per_conn", "RSS KB per connection"),
]


def _cell(value) -> str:
    if isinstance(value, dict):
        return " / ".join(f"{k} {_cell(value[k])}" for k in ("p50", "p90", "p99", "p999", "max") if k in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_table(result: dict) -> str:
    p = result.get("params", {})
    title = (
        f"maxq-perf {result.get('scenario')} {result.get('target')}  x{p.get('producers')} y{p.get('consumers')} "
        f"Q{p.get('queues')} s{p.get('size')}"
        + (f" confirm {p['confirm']}" if p.get("confirm") else "")
        + (" persistent" if p.get("persistent") else "")
        + ("" if p.get("autoack") else " manual-ack")
        + (f" rate {p['rate']:.0f}" if p.get("rate") else "")
        + (" fanout" if p.get("fanout") else "")
    )
    lines = [title]
    for key, label in _ROWS:
        if result.get(key) is not None:
            lines.append(f"  {label:30s} {_cell(result[key])}")
    return "\n".join(lines) + "\n"
