"""Loaded (as `sitecustomize`) only into nodes the harness runs under libfaketime for clock-skew.

libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 makes clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME) fail with EINVAL, which is what Python 3.11's time.sleep calls (measured: every
time.sleep raises OSError 22; Event.wait, select and epoll are fine). Without this a node would
die of the tool, not of the skew. time.sleep becomes a select(2) wait on the real monotonic clock:
the same semantics (at least `seconds`), nothing else of the process changes.
"""

import os
import select
import time

if os.environ.get("FAKETIME_DONT_FAKE_MONOTONIC") == "1" and os.environ.get("LD_PRELOAD", "").find("faketime") >= 0:
    _monotonic = time.monotonic

    def _sleep(seconds: float) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        end = _monotonic() + seconds
        while True:
            left = end - _monotonic()
            if left <= 0:
                return
            select.select([], [], [], left)

    time.sleep = _sleep
