"""`maxq-perf`: a load generator for any AMQP 0-9-1 broker, in the spirit of RabbitMQ's PerfTest.

Theory of operation: parse the options, give the whole run one deadline (the budget below,
enforced twice: by SIGALRM in this process and by every worker's own checks), run the mode,
and print one JSON line on stdout plus a table on stderr. A failed run (a broker close, a lost
connection, a worker that never got ready) prints the reason on stderr and exits 1; bad
options exit 2. SIGTERM and SIGINT unwind through the same `finally` blocks, so the worker
processes are always stopped.
"""

from __future__ import annotations

import signal
import sys
import time

from .client import BrokerClosed
from .fleet import RunFailed
from .options import PerfOptions, parse_options
from .report import emit

BUDGET_BASE_S = 120.0


class _Deadline(Exception):
    pass


def budget_s(options: PerfOptions) -> float:
    """amqpload's global alarm: generous, but finite whatever the options."""
    budget = BUDGET_BASE_S + options.warmup_s + options.duration_s + options.drain_timeout_s + options.hold_s
    budget += options.settle_s
    if options.mode != "throughput":
        budget += 2 * options.max_time_s
    return budget


def run(options: PerfOptions) -> dict:
    deadline = time.monotonic() + budget_s(options)
    if options.mode == "backlog":
        from .backlog import run_backlog

        return run_backlog(options, deadline)
    if options.mode == "many":
        from .many import run_many

        return run_many(options, deadline)
    from .throughput import run_throughput

    return run_throughput(options, deadline)


def _on_alarm(signum, frame):
    raise _Deadline("maxq-perf: the run's time budget is spent, aborting")


def _on_term(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGTERM, _on_term)
    signal.alarm(int(budget_s(options)) + 30)
    try:
        result = run(options)
    except (RunFailed, BrokerClosed, ConnectionError, TimeoutError, OSError, _Deadline) as exc:
        print(f"maxq-perf: run failed: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.alarm(0)
    emit(result, options.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
