"""maxq-perf's command line: PerfTest's short options where they exist, amqpload's long ones.

Theory of operation: argparse fills a frozen `PerfOptions`; the mode follows from the options
(--k-queues/--k-conns: many-things mode s5; --backlog: backlog mode s4; otherwise throughput,
reported as s2 with --rate, s3 with --fanout, else s1), or from amqpload's --scenario, which is
accepted so that the same scenario strings drive either tool. Every count and time has an upper
bound checked here, so that no run can ask for an unbounded loop.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field

DURATION_S_MAX = 3600.0
MAX_TIME_S_MAX = 24 * 3600.0
WORKERS_MAX = 256
K_QUEUES_MAX = 1_000_000
K_CONNS_MAX = 100_000
BODY_BYTES_MAX = 128 * 1024 * 1024
_INT = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True)
class PerfOptions:
    host: str = "127.0.0.1"
    port: int = 5672
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    producers: int = 1
    consumers: int = 1
    queues: int = 1
    body_bytes: int = 16
    duration_s: float = 10.0
    warmup_s: float = 2.0
    manual_ack: bool = False
    multi_ack: int = 1
    prefetch: int = 1000
    confirm_window: int = 0
    persistent: bool = False
    durable: bool = False
    queue_args: dict = field(default_factory=dict)
    rate_total: float = 0.0
    fanout: bool = False
    backlog: int = 0
    sample_every: int = 0
    settle_s: float = 0.0
    k_queues: int = 0
    k_conns: int = 0
    hold_s: float = 2.0
    broker_pids: tuple[int, ...] = ()
    queue_prefix: str = "perf-q"
    label: str = ""
    drain_timeout_s: float = 10.0
    max_msgs: int = 0
    max_time_s: float = 900.0
    keep_queues: bool = False
    no_declare: bool = False
    batch_bytes: int = 32768
    frame_max: int = 131072
    table: bool = True
    scenario: str = "s1"

    @property
    def mode(self) -> str:
        return {"s4": "backlog", "s5": "many"}.get(self.scenario, "throughput")


def queue_arg_value(text: str):
    """--qarg values: integers as int (amqpload sends them as long), true/false as bool, else str."""
    if _INT.match(text):
        return int(text)
    if text in ("true", "false"):
        return text == "true"
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="maxq-perf",
        description="Load generator for AMQP 0-9-1 brokers: one JSON line on stdout, a table on stderr.",
        epilog="Modes: throughput (default; s2 with --rate, s3 with --fanout), backlog (--backlog N), "
        "many queues/connections (--k-queues K, --k-conns K). See docs/perf-tool.md.",
    )
    g = p.add_argument_group("connection")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=5672)
    g.add_argument("--user", default="guest")
    g.add_argument("--pass", dest="password", default="guest")
    g.add_argument("--vhost", default="/")
    g = p.add_argument_group("throughput")
    g.add_argument("-x", "-P", "--producers", type=int, default=1, help="producer connections (1)")
    g.add_argument("-y", "-C", "--consumers", type=int, default=1, help="consumer connections (1)")
    g.add_argument("-Q", "--queues", type=int, default=1, help="queues (1); producer/consumer i uses queue i %% Q")
    g.add_argument("-s", "--size", dest="body_bytes", type=int, default=16, help="body bytes (16, at least 8)")
    g.add_argument("-d", "--duration", dest="duration_s", type=float, default=10.0, help="measured seconds (10)")
    g.add_argument("--warmup", dest="warmup_s", type=float, default=2.0, help="seconds before measuring (2)")
    g.add_argument("--manual-ack", action="store_true", help="consumers ack (default: auto-ack)")
    g.add_argument("--multi-ack", type=int, default=1, help="ack every N deliveries with multiple=true (1: each)")
    g.add_argument("-q", "--prefetch", type=int, default=1000, help="basic.qos prefetch with --manual-ack (1000)")
    g.add_argument(
        "--confirm",
        dest="confirm_window",
        type=int,
        default=0,
        help="publisher confirms with at most W unconfirmed per producer (0: off)",
    )
    g.add_argument("--persistent", action="store_true", help="delivery_mode 2")
    g.add_argument("--durable", action="store_true", help="durable queues (and exchange)")
    g.add_argument(
        "--qarg",
        action="append",
        default=[],
        metavar="K=V",
        help="queue argument, repeatable; integers are sent as integers",
    )
    g.add_argument("--rate", dest="rate_total", type=float, default=0.0, help="total publish msgs/s (0: unlimited)")
    g.add_argument("--fanout", action="store_true", help="publish to one fanout exchange bound to all queues")
    g = p.add_argument_group("backlog (s4)")
    g.add_argument("--backlog", type=int, default=0, help="publish N with confirms and no consumer, then drain")
    g.add_argument("--sample-every", type=int, default=0, help="sample rate and RSS every M messages (N/10)")
    g.add_argument("--settle", dest="settle_s", type=float, default=0.0, help="seconds between publish and drain")
    g = p.add_argument_group("many queues / connections (s5)")
    g.add_argument("--k-queues", type=int, default=0, help="declare then delete K queues")
    g.add_argument("--k-conns", type=int, default=0, help="open, hold and close K connections")
    g.add_argument("--hold", dest="hold_s", type=float, default=2.0, help="seconds to hold the K connections (2)")
    g = p.add_argument_group("measurement and misc")
    g.add_argument("--broker-pid", default="", metavar="PID[,PID...]", help="broker process(es): CPU and RSS")
    g.add_argument("--scenario", choices=("s1", "s2", "s3", "s4", "s5"), help="amqpload's scenario names")
    g.add_argument("--queue-prefix", default="perf-q")
    g.add_argument("--label", default="")
    g.add_argument(
        "--drain-timeout",
        dest="drain_timeout_s",
        type=float,
        default=10.0,
        help="seconds to wait for confirms and for consumers to drain after the run (10)",
    )
    g.add_argument("--max-msgs", type=int, default=0, help="cap on messages per run (0: none)")
    g.add_argument(
        "--max-time", dest="max_time_s", type=float, default=900.0, help="bound on backlog/many phases, seconds (900)"
    )
    g.add_argument("--keep-queues", action="store_true")
    g.add_argument("--no-declare", action="store_true", help="use existing queues as they are")
    g.add_argument("--batch-bytes", type=int, default=32768, help="bytes per publish write (32768)")
    g.add_argument("--frame-max", type=int, default=131072)
    g.add_argument("--no-table", dest="table", action="store_false", help="no table on stderr")
    return p


def parse_options(argv: list[str] | None = None) -> PerfOptions:
    parser = build_parser()
    a = parser.parse_args(argv)
    queue_args = {}
    for item in a.qarg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--qarg needs K=V, got {item!r}")
        queue_args[key] = queue_arg_value(value)
    try:
        broker_pids = tuple(int(x) for x in a.broker_pid.split(",") if x.strip())
    except ValueError:
        parser.error(f"--broker-pid needs PID[,PID...], got {a.broker_pid!r}")
    scenario = a.scenario
    if scenario is None:
        if a.k_queues or a.k_conns:
            scenario = "s5"
        elif a.backlog:
            scenario = "s4"
        elif a.fanout:
            scenario = "s3"
        elif a.rate_total:
            scenario = "s2"
        else:
            scenario = "s1"
    fanout = a.fanout or scenario == "s3"
    checks = [
        (a.body_bytes >= 8, "--size must be at least 8 (the timestamp)"),
        (a.body_bytes <= BODY_BYTES_MAX, f"--size must be at most {BODY_BYTES_MAX}"),
        (0 < a.duration_s <= DURATION_S_MAX, f"--duration must be in (0, {DURATION_S_MAX:.0f}]"),
        (0 <= a.warmup_s <= DURATION_S_MAX, "--warmup out of range"),
        (1 <= a.queues <= WORKERS_MAX * 64, "--queues out of range"),
        (
            0 <= a.producers <= WORKERS_MAX and 0 <= a.consumers <= WORKERS_MAX,
            f"at most {WORKERS_MAX} producers and {WORKERS_MAX} consumers",
        ),
        (a.multi_ack >= 1, "--multi-ack must be at least 1"),
        (1 <= a.prefetch <= 65535, "--prefetch must be in [1, 65535]"),
        (0 <= a.confirm_window <= 1_000_000, "--confirm must be in [0, 1000000]"),
        (a.rate_total >= 0, "--rate must not be negative"),
        (0 <= a.backlog <= 10**10 and a.sample_every >= 0, "--backlog/--sample-every out of range"),
        (0 <= a.k_queues <= K_QUEUES_MAX, f"--k-queues must be at most {K_QUEUES_MAX}"),
        (0 <= a.k_conns <= K_CONNS_MAX, f"--k-conns must be at most {K_CONNS_MAX}"),
        (0 <= a.hold_s <= DURATION_S_MAX and 0 <= a.settle_s <= DURATION_S_MAX, "--hold/--settle out of range"),
        (0 < a.drain_timeout_s <= DURATION_S_MAX, "--drain-timeout out of range"),
        (0 < a.max_time_s <= MAX_TIME_S_MAX, "--max-time out of range"),
        (a.max_msgs >= 0, "--max-msgs must not be negative"),
        (1024 <= a.batch_bytes <= 16 * 1024 * 1024, "--batch-bytes must be in [1 KiB, 16 MiB]"),
        (a.frame_max == 0 or a.frame_max >= 4096, "--frame-max must be 0 or at least 4096"),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    if scenario in ("s1", "s2", "s3") and a.producers < 1:
        parser.error("throughput mode needs at least one producer")
    if scenario == "s2" and a.rate_total <= 0:
        parser.error("s2 needs --rate")
    if scenario == "s4" and a.backlog <= 0:
        parser.error("backlog mode needs --backlog N")
    if scenario == "s5" and not (a.k_queues or a.k_conns):
        parser.error("s5 needs --k-queues and/or --k-conns")
    confirm_window = a.confirm_window
    producers = a.producers
    if scenario == "s4":
        confirm_window = confirm_window or 1000  # backlog mode always publishes with confirms
        producers = max(producers, 1)
    return PerfOptions(
        host=a.host,
        port=a.port,
        user=a.user,
        password=a.password,
        vhost=a.vhost,
        producers=producers,
        consumers=a.consumers,
        queues=a.queues,
        body_bytes=a.body_bytes,
        duration_s=a.duration_s,
        warmup_s=a.warmup_s,
        manual_ack=a.manual_ack,
        multi_ack=a.multi_ack,
        prefetch=a.prefetch,
        confirm_window=confirm_window,
        persistent=a.persistent,
        durable=a.durable,
        queue_args=queue_args,
        rate_total=a.rate_total,
        fanout=fanout,
        backlog=a.backlog,
        sample_every=a.sample_every,
        settle_s=a.settle_s,
        k_queues=a.k_queues,
        k_conns=a.k_conns,
        hold_s=a.hold_s,
        broker_pids=broker_pids,
        queue_prefix=a.queue_prefix,
        label=a.label,
        drain_timeout_s=a.drain_timeout_s,
        max_msgs=a.max_msgs,
        max_time_s=a.max_time_s,
        keep_queues=a.keep_queues,
        no_declare=a.no_declare,
        batch_bytes=a.batch_bytes,
        frame_max=a.frame_max,
        table=a.table,
        scenario=scenario,
    )
