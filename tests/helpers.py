"""Helpers the tests share: bounded waits.

Every wait here is bounded in time and in turns; a predicate is polled, never a sleep of a
guessed length.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout_s: float, step_s: float = 0.05) -> bool:
    """Poll `predicate` until it is true (returns True) or `timeout_s` passes (returns False)."""
    deadline = time.monotonic() + timeout_s
    while True:  # bounded by the deadline
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(step_s)
