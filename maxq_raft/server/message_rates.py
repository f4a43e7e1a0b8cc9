"""The node's message counts and their rates, in RabbitMQ's `message_stats` shape.

Theory of operation: the hot paths only increment plain integers on the broker and its sessions
(costs measured in docs/operations.md); nothing here runs per message. `node_counts` reads them
as RabbitMQ names them (publish, confirm, deliver, deliver_no_ack, get, get_no_ack, get_empty,
deliver_get, redeliver, ack, return_unroutable, drop_unroutable). A task (`sample_every`) stores
the counts every SAMPLE_INTERVAL_S in a ring of SAMPLES_KEPT; `message_stats` answers each count
with `{"rate": per second}` over the last interval, as RabbitMQ's "basic" rates mode does (its
default sample interval is 5 s too). Samples are taken with the caller's clock, so the pure
part is tested without waiting.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import trio

SAMPLE_INTERVAL_S = 5.0
SAMPLES_KEPT = 13  # a minute of intervals


def node_counts(broker: Any) -> dict[str, int]:
    """What this node counted since it started, in RabbitMQ's message_stats names."""
    sessions = broker.sessions.values()
    delivered, got = broker.messages_delivered, broker.messages_got_auto_ack + broker.messages_got_manual_ack
    return {
        "publish": broker.messages_received_closed
        + broker.messages_received_http
        + sum(s.messages_in for s in sessions),
        "confirm": broker.messages_confirmed,
        "deliver": delivered - broker.messages_delivered_auto_ack,
        "deliver_no_ack": broker.messages_delivered_auto_ack,
        "get": broker.messages_got_manual_ack,
        "get_no_ack": broker.messages_got_auto_ack,
        "get_empty": broker.messages_get_empty,
        "deliver_get": delivered + got,
        "redeliver": broker.messages_redelivered,
        "ack": broker.messages_acknowledged,
        "return_unroutable": broker.messages_unroutable_returned,
        "drop_unroutable": broker.messages_unroutable_dropped,
    }


class MessageRates:
    def __init__(self, samples_kept: int = SAMPLES_KEPT) -> None:
        self.samples: deque[tuple[float, dict[str, int]]] = deque(maxlen=samples_kept)

    def sample(self, now_s: float, counts: dict[str, int]) -> None:
        self.samples.append((now_s, counts))

    def message_stats(self, now_s: float, counts: dict[str, int]) -> dict[str, Any]:
        """`counts` with a `_details` rate each, over the span since the latest sample (at least
        one interval back, so a read just after a sample still covers one)."""
        base = None
        for taken_s, taken in reversed(self.samples):
            base = (taken_s, taken)
            if now_s - taken_s >= SAMPLE_INTERVAL_S:
                break
        stats: dict[str, Any] = {}
        for name, count in counts.items():
            rate = 0.0
            if base is not None and now_s > base[0]:
                rate = max(0.0, (count - base[1].get(name, 0)) / (now_s - base[0]))
            stats[name] = count
            stats[name + "_details"] = {"rate": round(rate, 1)}
        return stats

    async def sample_every(self, broker: Any, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        """Take a sample of `broker`'s counts every `interval_s`, for as long as the node runs."""
        while True:
            self.sample(trio.current_time(), node_counts(broker))
            await trio.sleep(interval_s)
