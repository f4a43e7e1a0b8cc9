"""Producer and consumer processes, and the shared-memory control block that steers them.

Theory of operation: every producer and every consumer is its own process (forked), with its
own connection, so that the load generator uses as many cores as it has workers and never
contends on one interpreter lock. The parent and the workers share only `Control`: a few flags
(go, measuring, stop producers, stop consumers, close producers) and one int64 counter slot
per worker (published, confirmed, nacked, consumed, ready, done), written by one process and
read by the other, aligned 8-byte values, so no locks. Counters are updated once per batch,
not per message. At the end each worker sends one result dict through its pipe: its latency
histogram (consumers: end-to-end; producers: confirm), totals, or an error text.

Workers bound everything: each has an absolute deadline (the parent's budget for the run)
and checks, at every wait, that the parent is still alive, so an orphan never keeps loading
a broker.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.sharedctypes import RawArray

from ..amqp import spec
from .client import AmqpClient, BrokerClosed
from .histogram import RAW_SAMPLES_MAX, Recorder
from .options import PerfOptions
from .stream import RawStream
from .wire import (
    CONSUME_OK,
    ConfirmParser,
    ConfirmTracker,
    DeliveryParser,
    PublishBatch,
    acks_for,
    encode_acks,
    encode_connection_close,
    encode_consume,
)

# flag slots
GO, MEASURING, STOP_PRODUCERS, STOP_CONSUMERS, CLOSE_PRODUCERS, T0_NS = range(6)
FLAG_SLOTS = 8
WAIT_SLICE_S = 0.05
CONFIRM_WAIT_S = 0.1
RATE_SLEEP_MAX_NS = 2_000_000


class Control:
    """Shared memory between the parent and its workers (inherited through fork)."""

    def __init__(self, producers: int, consumers: int) -> None:
        self.flags = RawArray("q", FLAG_SLOTS)
        n_p = max(producers, 1)
        n_c = max(consumers, 1)
        self.published = RawArray("q", n_p)
        self.confirmed = RawArray("q", n_p)
        self.nacked = RawArray("q", n_p)
        self.producer_ready = RawArray("q", n_p)
        self.producer_done = RawArray("q", n_p)
        self.consumed = RawArray("q", n_c)
        self.consumer_ready = RawArray("q", n_c)

    def total(self, counters, count: int) -> int:
        return sum(counters[:count])


class WorkerAbort(Exception):
    pass


def queue_name(options: PerfOptions, index: int) -> str:
    return f"{options.queue_prefix}-{index}"


def exchange_name(options: PerfOptions) -> str:
    return f"{options.queue_prefix}-fanout"


def _connect(options: PerfOptions) -> AmqpClient:
    return AmqpClient(
        options.host,
        options.port,
        user=options.user,
        password=options.password,
        vhost=options.vhost,
        frame_max=options.frame_max,
    ).connect()


class _Guard:
    """The worker's bounds: the absolute deadline and the parent's life."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.parent = os.getppid()

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise WorkerAbort("worker deadline passed")
        if os.getppid() != self.parent:
            raise WorkerAbort("parent process went away")


def _raise_on_methods(methods: list, role: str) -> None:
    """Handle non-data methods: a close is fatal, flow notices are reported once."""
    for method in methods:
        if isinstance(method, (spec.ConnectionClose, spec.ChannelClose)):
            scope = "connection" if isinstance(method, spec.ConnectionClose) else "channel"
            raise BrokerClosed(scope, method.reply_code, method.reply_text)
        if isinstance(method, spec.BasicCancel):
            raise WorkerAbort(f"{role}: the broker cancelled the consumer")
        if isinstance(method, spec.ConnectionBlocked):
            print(f"maxq-perf: {role}: connection.blocked ({method.reason})", flush=True, file=sys.stderr)
        elif isinstance(method, spec.ConnectionUnblocked):
            print(f"maxq-perf: {role}: connection.unblocked", flush=True, file=sys.stderr)
    methods.clear()


def producer_main(control: Control, index: int, options: PerfOptions, limit: int, pipe, deadline: float) -> None:
    result: dict = {"role": "producer", "index": index}
    try:
        _produce(control, index, options, limit, deadline, result)
    except BaseException as exc:  # reported to the parent, which fails the run
        result["error"] = f"producer {index}: {type(exc).__name__}: {exc}"
        if not isinstance(exc, (BrokerClosed, WorkerAbort, OSError, TimeoutError)):
            result["traceback"] = traceback.format_exc()
    finally:
        control.producer_done[index] = 1
        try:
            pipe.send(result)
        finally:
            pipe.close()


def _produce(control: Control, index: int, options: PerfOptions, limit: int, deadline: float, result: dict) -> None:
    guard = _Guard(deadline)
    flags = control.flags
    client = _connect(options)
    if options.confirm_window:
        client.confirm_select()
    channel = client.channel
    frame_max = client.frame_max
    if options.fanout:
        exchange, routing_key = exchange_name(options), ""
    else:
        exchange, routing_key = "", queue_name(options, index % options.queues)
    batch = PublishBatch(
        channel=channel,
        exchange=exchange,
        routing_key=routing_key,
        body_size=options.body_bytes,
        persistent=options.persistent,
        frame_max=frame_max,
        producer_id=index,
        batch_bytes=options.batch_bytes,
    )
    stream = RawStream(client.detach(), frame_max)
    tracker = ConfirmTracker()
    parser = ConfirmParser(tracker)
    window = options.confirm_window
    rate = options.rate_total / options.producers if options.rate_total else 0.0
    interval_ns = int(1e9 / rate) if rate else 0
    control.producer_ready[index] = 1
    while not flags[GO]:
        guard.check()
        time.sleep(0.001)
    t0 = flags[T0_NS]
    published = control.published
    confirmed = control.confirmed
    count_max = batch.count_max
    seq = 0
    deadline_ns = int(deadline * 1e9)
    monotonic_ns = time.monotonic_ns
    while seq < limit and not flags[STOP_PRODUCERS]:
        now = monotonic_ns()
        n = count_max if limit - seq > count_max else limit - seq
        if window:
            tracker.measuring = flags[MEASURING] != 0
            room = window - tracker.outstanding
            if room <= 0:
                guard.check()
                if stream.wait_readable(CONFIRM_WAIT_S):
                    stream.read_available(parser)
                    confirmed[index] = tracker.confirmed
                if parser.methods:
                    _raise_on_methods(parser.methods, "producer")
                continue
            if room < n:
                n = room
        if interval_ns:
            due = (now - t0) // interval_ns + 1 - seq
            if due <= 0:
                guard.check()
                wake = t0 + seq * interval_ns
                wait_ns = wake - now if wake - now < RATE_SLEEP_MAX_NS else RATE_SLEEP_MAX_NS
                if stream.wait_readable(wait_ns / 1e9):
                    stream.read_available(parser)
                    if window:
                        confirmed[index] = tracker.confirmed
                    if parser.methods:
                        _raise_on_methods(parser.methods, "producer")
                continue
            if due < n:
                n = due
        data = batch.stamp(n, now, seq)
        if window:
            tracker.sent(n, now)
        stream.write_all(data, parser, deadline)
        seq += n
        published[index] = seq
        if window:
            stream.read_available(parser)
            confirmed[index] = tracker.confirmed
        if parser.methods:
            _raise_on_methods(parser.methods, "producer")
        if now > deadline_ns:
            guard.check()
    # the run is over for this producer: wait (bounded) for the outstanding confirms
    if window:
        wait_until = min(time.monotonic() + options.drain_timeout_s, deadline)
        while tracker.outstanding and time.monotonic() < wait_until:
            if stream.wait_readable(CONFIRM_WAIT_S):
                stream.read_available(parser)
                if parser.methods:
                    _raise_on_methods(parser.methods, "producer")
        confirmed[index] = tracker.confirmed
    control.nacked[index] = tracker.nacked
    control.producer_done[index] = 1
    # Stay connected until the parent has finished draining: closing right after unconfirmed
    # publishes can lose their tail on some brokers (amqpload saw it with RabbitMQ 3.10).
    while not flags[CLOSE_PRODUCERS]:
        guard.check()
        if stream.wait_readable(WAIT_SLICE_S):
            stream.read_available(parser)
            parser.methods.clear()
    confirmed[index] = tracker.confirmed
    stream.close(parser, encode_connection_close())
    result.update(
        published=seq,
        confirmed=tracker.confirmed,
        nacked=tracker.nacked,
        confirm_histogram=tracker.histogram.to_wire(),
        reads=stream.reads,
        writes=stream.writes,
    )


def consumer_main(control: Control, index: int, options: PerfOptions, pipe, deadline: float) -> None:
    result: dict = {"role": "consumer", "index": index}
    try:
        _consume(control, index, options, deadline, result)
    except BaseException as exc:
        result["error"] = f"consumer {index}: {type(exc).__name__}: {exc}"
        if not isinstance(exc, (BrokerClosed, WorkerAbort, OSError, TimeoutError)):
            result["traceback"] = traceback.format_exc()
    finally:
        try:
            pipe.send(result)
        finally:
            pipe.close()


def _consume(control: Control, index: int, options: PerfOptions, deadline: float, result: dict) -> None:
    guard = _Guard(deadline)
    flags = control.flags
    client = _connect(options)
    if options.manual_ack:
        client.basic_qos(options.prefetch)
    channel = client.channel
    stream = RawStream(client.detach(), client.frame_max)
    parser = DeliveryParser(manual_ack=options.manual_ack)
    recorder = Recorder()
    stream.write_all(
        encode_consume(channel, queue_name(options, index % options.queues), no_ack=not options.manual_ack),
        parser,
        deadline,
    )
    consumed = control.consumed
    multi_ack = options.multi_ack
    tags = parser.tags
    while not flags[STOP_CONSUMERS]:
        guard.check()
        if flags[MEASURING]:
            if parser.samples is None:
                parser.samples = recorder.samples
        elif parser.samples is not None:
            parser.samples = None
        if stream.wait_readable(WAIT_SLICE_S):
            stream.read_available(parser)
            if tags:
                picked, multiple = acks_for(tags, multi_ack)
                stream.write_all(encode_acks(channel, picked, multiple), parser, deadline)
                tags.clear()
            consumed[index] = parser.consumed
            if parser.methods:
                for method in parser.methods:
                    if isinstance(method, spec.BasicConsumeOk):
                        control.consumer_ready[index] = 1
                parser.methods[:] = [m for m in parser.methods if not isinstance(m, spec.BasicConsumeOk)]
                _raise_on_methods(parser.methods, "consumer")
            if len(recorder.samples) >= RAW_SAMPLES_MAX:
                recorder.fold()
                if parser.samples is not None:
                    parser.samples = recorder.samples
    consumed[index] = parser.consumed
    parser.samples = None
    stream.close(parser, encode_connection_close())
    result.update(
        consumed=parser.consumed, latency_histogram=recorder.fold().to_wire(), reads=stream.reads, writes=stream.writes
    )


assert CONSUME_OK == spec.BasicConsumeOk.INDEX
