"""The node's message counts and their rates, in RabbitMQ's `message_stats` shape.

Theory of operation: the hot paths only increment plain integers on the broker and its sessions
(costs measured in docs/operations.md); nothing here runs per message. `node_counts` reads them
as RabbitMQ names them (publish, confirm, deliver, deliver_no_ack, get, get_no_ack, get_empty,
deliver_get, redeliver, ack, return_unroutable, drop_unroutable). A task (`sample_every`) stores
the counts every SAMPLE_INTERVAL_S in a ring of SAMPLES_KEPT; `message_stats` answers each count
with `{"rate": per second}` over the last interval, as RabbitMQ's "basic" rates mode does (its
default sample interval is 5 s too). Samples are taken with the caller's clock, so the pure
part is tested without waiting.

Per object (`KeyedRates`, two samples per object, taken by the same task):
- a queue: the queue machine adds to its `stats_*` per batch (published, delivered, got,
  redelivered, acked); its `message_stats` (GET /api/queues...) has RabbitMQ's publish, deliver,
  get, deliver_get, redeliver and ack with their rates;
- an exchange: each connection counts what it publishes to an exchange and what of that was
  routed (a run of publishes to one exchange in two integers, ~30 ns a message: the publish
  path's only cost here; Session.exchange_totals); a closed connection's counts, and HTTP publishes, go to the broker's `exchange_counts`,
  which forgets deleted exchanges at each sample; its `message_stats` has publish_in and
  publish_out;
- a connection: bytes read and written on its socket (recv_oct, send_oct, per read and write,
  not per message) with their rates, as RabbitMQ's connection objects have them.
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
    # SQS's count in as the AMQP operations they are like: a send is a confirmed publish, a
    # received message a get waiting for its ack, a receive that found none an empty get, a
    # delete an ack (RabbitMQ's overview likewise counts every protocol's messages).
    return {
        "publish": broker.messages_received_closed
        + broker.messages_received_http
        + broker.sqs_sent
        + sum(s.messages_in for s in sessions),
        "confirm": broker.messages_confirmed + broker.sqs_sent,
        "deliver": delivered - broker.messages_delivered_auto_ack,
        "deliver_no_ack": broker.messages_delivered_auto_ack,
        "get": broker.messages_got_manual_ack + broker.sqs_received,
        "get_no_ack": broker.messages_got_auto_ack,
        "get_empty": broker.messages_get_empty + broker.sqs_received_empty,
        "deliver_get": delivered + got + broker.sqs_received,
        "redeliver": broker.messages_redelivered,
        "ack": broker.messages_acknowledged + broker.sqs_deleted,
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
        """Take a sample of `broker`'s counts, and of each queue's, every `interval_s`, for as
        long as the node runs."""
        while True:
            now_s = trio.current_time()
            self.sample(now_s, node_counts(broker))
            queues = {key: queue_counts(stats) for key, stats in broker.remote_stats.items()}  # (held elsewhere)
            queues.update((key, queue_counts(queue)) for key, queue in broker.queues.items())
            broker.queue_rates.sample(now_s, queues)
            exchanges = exchange_counts(broker)
            broker.exchange_rates.sample(now_s, exchanges)
            broker.forget_gone_exchanges(exchanges)
            broker.connection_rates.sample(
                now_s, {key: connection_counts(session) for key, session in broker.sessions.items()}
            )
            await trio.sleep(interval_s)


class KeyedRates:
    """Rates of many objects (queues, exchanges, connections), each a tuple of counts named by
    `names`: two samples per object (the latest and the one before), so an object costs two
    small tuples however long the node runs, and a rate covers one to two intervals."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.samples: dict[Any, tuple[tuple[float, tuple[int, ...]], ...]] = {}

    def sample(self, now_s: float, counts: dict[Any, tuple[int, ...]]) -> None:
        """Sample every object of `counts` (key -> its counts); forget the objects that are gone."""
        old = self.samples
        fresh: dict[Any, tuple[tuple[float, tuple[int, ...]], ...]] = {}
        for key, taken_counts in counts.items():  # bounded by the node's objects
            taken = (now_s, taken_counts)
            kept = old.get(key)
            fresh[key] = (taken,) if kept is None else (kept[-1], taken)
        self.samples = fresh

    def message_stats(self, now_s: float, key: Any, counts: tuple[int, ...]) -> dict[str, Any]:
        """`counts` with a `_details` rate each, per second since the older of the object's
        samples at least SAMPLE_INTERVAL_S back (else the oldest kept; 0.0 with none)."""
        base = None
        for taken in reversed(self.samples.get(key, ())):
            base = taken
            if now_s - taken[0] >= SAMPLE_INTERVAL_S:
                break
        stats: dict[str, Any] = {}
        for i, name in enumerate(self.names):
            rate = 0.0
            if base is not None and now_s > base[0]:
                rate = max(0.0, (counts[i] - base[1][i]) / (now_s - base[0]))
            stats[name] = counts[i]
            stats[name + "_details"] = {"rate": round(rate, 1)}
        return stats


# A queue's counts (the queue machine's stats_*), in RabbitMQ's names for a queue's message_stats.
QUEUE_COUNTS = ("publish", "deliver", "get", "deliver_get", "redeliver", "ack")


def queue_counts(queue: Any) -> tuple[int, ...]:
    """`queue`'s counts in QUEUE_COUNTS order."""
    delivered, got = queue.stats_delivered, queue.stats_got
    return (queue.stats_published, delivered, got, delivered + got, queue.stats_redelivered, queue.stats_acked)


# An exchange's, in RabbitMQ's names: messages published to it, and those of them it routed to
# at least one queue (RabbitMQ counts publish_out per message as well).
EXCHANGE_COUNTS = ("publish_in", "publish_out")


def exchange_counts(broker: Any) -> dict[tuple[str, str], tuple[int, int]]:
    """Every exchange's counts on this node, (vhost, name) -> EXCHANGE_COUNTS: the node's kept
    ones (closed connections, HTTP publishes) plus each open connection's (summed here, per
    sample or request, not per message)."""
    totals = {key: (counts[0], counts[1]) for key, counts in broker.exchange_counts.items()}
    for session in broker.sessions.values():  # bounded by connections x exchanges they used
        vhost = session.vhost
        for name, (published, routed) in session.exchange_totals().items():
            key = (vhost, name)
            kept = totals.get(key, (0, 0))
            totals[key] = (kept[0] + published, kept[1] + routed)
    return totals


# A connection's: bytes and reads/writes on its socket (RabbitMQ's recv_oct, send_oct, recv_cnt
# and send_cnt; RabbitMQ counts packets, ours socket reads and writes), and messages in and out.
CONNECTION_COUNTS = ("recv_oct", "send_oct")


def connection_counts(session: Any) -> tuple[int, int]:
    return (session.recv_oct, session.send_oct)
