"""Wake-ups for SQS long polls: who waits for a queue to have a ready message.

Theory of operation: a ReceiveMessage with WaitTimeSeconds that finds nothing registers a
callback for its queue and sleeps (http/sqs_actions.py); the one apply path (applier.py) calls
`applied(key, queue)` after every command applied to a queue, and when that queue has a ready
message every callback registered for it runs once and is forgotten. The callers then try their
Receive again. Waking only on a queue with something ready means a Receive that took nothing
wakes no one, so pollers of an empty queue cannot wake each other in a loop; a message taken by
someone else first just sends the others back to sleep. Thousands of polls on one queue cost a
dict entry each, and no work at all until that queue has something.

Everything runs on the node's event-loop thread (both logs apply there), so no locks; the
callbacks must not block. Nothing here knows of trio: the callback does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

QueueKey = tuple[str, str]


class QueueWakeups:
    def __init__(self) -> None:
        # queue -> its polls' callbacks; empty when nobody polls (the apply path tests that first)
        self.waiters: dict[QueueKey, dict[int, Callable[[], None]]] = {}
        self._tokens = itertools.count()

    def watch(self, key: QueueKey, wake: Callable[[], None]) -> int:
        """Call `wake()` once, the next time a command leaves queue `key` with a ready message;
        the returned token unwatches it."""
        token = next(self._tokens)
        self.waiters.setdefault(key, {})[token] = wake
        return token

    def unwatch(self, key: QueueKey, token: int) -> None:
        waiters = self.waiters.get(key)
        if waiters is not None:
            waiters.pop(token, None)
            if not waiters:
                del self.waiters[key]

    def applied(self, key: QueueKey, queue: Any) -> None:
        """A command was applied to queue `key` (its machine, or None if it is gone)."""
        waiters = self.waiters.get(key)
        if waiters is None or queue is None or queue.ready_count == 0:
            return
        del self.waiters[key]
        for wake in waiters.values():  # bounded by the polls waiting on this queue
            wake()

    def waiting(self) -> int:
        return sum(len(waiters) for waiters in self.waiters.values())
