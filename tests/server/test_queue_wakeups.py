"""Long-poll wake-ups (server/queue_wakeups.py): a queue with a ready message wakes its waiters once."""

from __future__ import annotations

from types import SimpleNamespace

from maxq_raft.server.queue_wakeups import QueueWakeups

KEY = ("/", "q")


def test_only_a_queue_with_a_ready_message_wakes_its_waiters_once() -> None:
    wakeups = QueueWakeups()
    woken: list[str] = []
    wakeups.watch(KEY, lambda: woken.append("a"))
    wakeups.watch(KEY, lambda: woken.append("b"))
    wakeups.watch(("/", "other"), lambda: woken.append("other"))
    wakeups.applied(KEY, SimpleNamespace(ready_count=0))  # e.g. a Receive that found nothing
    wakeups.applied(KEY, None)  # the queue is gone
    assert woken == [] and wakeups.waiting() == 3
    wakeups.applied(KEY, SimpleNamespace(ready_count=1))
    assert woken == ["a", "b"] and wakeups.waiting() == 1
    wakeups.applied(KEY, SimpleNamespace(ready_count=1))  # each callback once
    assert woken == ["a", "b"]


def test_an_unwatched_waiter_is_not_woken() -> None:
    wakeups = QueueWakeups()
    woken: list[str] = []
    token = wakeups.watch(KEY, lambda: woken.append("a"))
    wakeups.unwatch(KEY, token)
    wakeups.unwatch(KEY, token)  # twice is harmless (woken and then unwatched, as the poller does)
    wakeups.applied(KEY, SimpleNamespace(ready_count=5))
    assert woken == [] and wakeups.waiting() == 0
