"""`maxqctl trace`: a message's trace (x-trace, server/tracer.py) through GET /api/trace/{vhost}.

    maxqctl trace MESSAGE_ID                       every record of that message, in every queue
    maxqctl trace --queue Q --since 10m            a queue's records of the last ten minutes
    maxqctl trace --correlation-id X [--since ...] the records of messages with that correlation id

Exactly one of MESSAGE_ID, --queue, --correlation-id; --since/--until are ms since the epoch or a
duration back from now (90s, 10m, 2h, 7d). A bad command line exits 2 before any request.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.parse
from typing import Any

from .admin_client import CtlError, fetch

_TIME = re.compile(r"^(\d{1,16}|\d{1,12}(ms|s|m|h|d))$")
LIMIT_MAX = 10_000
# Printed as columns; everything else of a record goes, as key=value, in "details".
COLUMNS = ("time", "queue", "event", "message_id")
_NOT_DETAILS = {"time_ms", "log_index", "n", "vhost", "queue", "event", "message_id", "body_base64"}


def _time(text: str) -> str:
    if not _TIME.match(text):
        raise argparse.ArgumentTypeError(
            f"expected ms since the epoch or a duration like 90s, 10m, 2h, 7d; got {text!r}"
        )
    return text


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer 1-{LIMIT_MAX}, got {text!r}")
    return int(text)


def add_command(sub: Any) -> None:
    trace = sub.add_parser("trace", help="the trace of a message (x-trace), or of a queue or correlation id")
    trace.add_argument("message_id", nargs="?", metavar="MESSAGE_ID", help="message_id property or x-maxq-trace-id")
    trace.add_argument("--queue", help="a queue's records (with --since/--until)")
    trace.add_argument("--correlation-id", help="the records of messages with this correlation_id")
    trace.add_argument("--since", type=_time, help="from: ms since the epoch, or 90s, 10m, 2h, 7d ago")
    trace.add_argument("--until", type=_time, help="to: likewise")
    trace.add_argument("--vhost", default="/")
    trace.add_argument("--limit", type=_limit, default=1000, help=f"records at most (1-{LIMIT_MAX}, default 1000)")
    trace.add_argument("--bodies", action="store_true", help="print recorded bodies (x-trace-bodies) too")
    trace.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON records")


def _row(record: dict[str, Any], bodies: bool) -> dict[str, Any]:
    seconds, ms = divmod(record.get("time_ms", 0), 1000)
    details = " ".join(
        f"{key}={json.dumps(value) if isinstance(value, list | dict) else value}"
        for key, value in record.items()
        if key not in _NOT_DETAILS
    )
    if bodies and "body_base64" in record:
        details += f" body_base64={record['body_base64']}"
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z",
        "queue": record.get("queue"),
        "event": record.get("event"),
        "message_id": record.get("message_id"),
        "details": details,
    }


def run(args: argparse.Namespace, timeout_s: float, table: Any) -> str | None:
    """The trace as a table (or JSON); None when `args` is another command."""
    if args.command != "trace":
        return None
    chosen = [
        (key, value)
        for key, value in (
            ("message_id", args.message_id),
            ("queue", args.queue),
            ("correlation_id", args.correlation_id),
        )
        if value is not None
    ]
    if len(chosen) != 1:
        raise CtlError("trace: give exactly one of MESSAGE_ID, --queue or --correlation-id", 2)
    if not chosen[0][1]:
        raise CtlError(f"trace: the {chosen[0][0].replace('_', ' ')} must not be empty", 2)
    query = [*chosen, ("limit", str(args.limit))]
    query += [(key, value) for key, value in (("since", args.since), ("until", args.until)) if value is not None]
    path = f"/api/trace/{urllib.parse.quote(args.vhost, safe='')}?{urllib.parse.urlencode(query)}"
    records = fetch(args.node, path, timeout_s) or []
    if getattr(args, "json", False):
        return json.dumps(records, indent=1)
    if not records:
        return f"no trace records for {chosen[0][0].replace('_', ' ')} {chosen[0][1]!r} in vhost '{args.vhost}'"
    return table([_row(record, args.bodies) for record in records], [*COLUMNS, "details"])
