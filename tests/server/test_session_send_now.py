"""Broker.send_queued runs in run_sync_soon callbacks (a committed batch, an fsync outcome),
where an exception would end the node: one connection's failure to send is logged, the others
are still sent, and the failing one's writer is woken to do it."""

from __future__ import annotations

import logging

from maxq_raft.server.broker import Broker


class _Session:
    def __init__(self, name: str, fails: bool) -> None:
        self.id = name
        self.fails = fails
        self.sent = self.woken = 0

    def send_now(self) -> None:
        if self.fails:
            raise RuntimeError("a bug of ours")
        self.sent += 1

    def wake(self) -> None:
        self.woken += 1


def test_one_connections_failure_to_send_is_logged_and_the_others_are_sent(caplog) -> None:
    broker = Broker.__new__(Broker)  # (only its queue of sessions to send: no node behind it)
    failing, fine = _Session("a", fails=True), _Session("b", fails=False)
    broker.send_now = [failing, fine]
    with caplog.at_level(logging.ERROR, logger="maxq.broker"):
        broker.send_queued()
    assert (failing.sent, failing.woken) == (0, 1)
    assert (fine.sent, fine.woken) == (1, 0)
    assert broker.send_now == []
    assert "sending straight to connection a failed" in caplog.text
