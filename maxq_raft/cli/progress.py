"""A progress line while `maxqctl` waits for a cluster change (add-node, remove-node, transfer).

Theory of operation: the change is one HTTP request that the node answers when every group has
carried it out (up to 35 s). `wait_with_progress` makes that request on a worker thread and,
while it waits, asks the node for its cluster status once a second and prints how far the change
has got (`describe(status)`, e.g. "3/9 groups have n4") with the seconds waited, on stderr so
that stdout stays the answer (and `--json` stays parseable). On a terminal the line is rewritten
in place every second and cleared at the end; elsewhere (a script, a log file) a line is printed
when what it says changes, and at most every NON_TTY_EVERY_S otherwise. A status that cannot be
read (the node is busy with the change) is skipped: the wait itself is what is bounded, by the
change's own timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

POLL_EVERY_S = 1.0
NON_TTY_EVERY_S = 5.0


def wait_with_progress(
    call: Callable[[], Any],
    read_status: Callable[[], dict],
    describe: Callable[[dict], str],
    label: str,
    out: TextIO,
    poll_every_s: float = POLL_EVERY_S,
) -> Any:
    """`call()`'s value (or its exception, raised here), printing progress on `out` meanwhile."""
    outcome: dict[str, Any] = {}

    def worker() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=worker, name="maxqctl-change", daemon=True)
    started = time.monotonic()
    thread.start()
    tty = out.isatty()
    shown, shown_at, width = "", 0.0, 0
    while True:
        thread.join(poll_every_s)
        if not thread.is_alive():
            break
        try:
            text = describe(read_status())
        except Exception:  # noqa: BLE001 - any failure to read it: keep waiting, say nothing new
            text = shown
        waited_s = time.monotonic() - started
        line = f"{label}: {text}, {waited_s:.0f} s" if text else f"{label}: {waited_s:.0f} s"
        if tty:
            out.write("\r" + line.ljust(width))
            width = len(line)
            out.flush()
        elif text != shown or waited_s - shown_at >= NON_TTY_EVERY_S:
            out.write(line + "\n")
            out.flush()
            shown_at = waited_s
        shown = text
    if tty and width:
        out.write("\r" + " " * width + "\r")
        out.flush()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def groups_with_member(status: dict, node: str) -> str:
    groups = status.get("groups", [])
    have = sum(1 for g in groups if any(m.get("node") == node for m in g.get("members", [])))
    return f"{have}/{len(groups)} groups have {node}"


def groups_without_member(status: dict, node: str) -> str:
    groups = status.get("groups", [])
    left = sum(1 for g in groups if not any(m.get("node") == node for m in g.get("members", [])))
    return f"{left}/{len(groups)} groups without {node}"


def groups_led_by(status: dict, node: str, group: str) -> str:
    groups = [g for g in status.get("groups", []) if group == "all" or g.get("group") == group]
    led = sum(1 for g in groups if g.get("leader") == node)
    return f"{led}/{len(groups)} groups led by {node}"
