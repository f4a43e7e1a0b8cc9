"""The workload: pika publishers and consumers that survive faults and write down everything.

Theory of operation: every client is a `Worker` thread that runs connection *sessions* one after
another until told to stop (or its hard deadline passes): connect to a node, work, and when the
connection breaks, back off (seeded jitter) and reconnect. A session is a pika `SelectConnection`
on its own I/O loop, so a publisher keeps a window of unconfirmed messages in flight (a blocking
client would have one) and a ~10 ms tick drives everything else: the publish rate, the confirm
timeout and the stop. The tick is also the session's watchdog: every way out of a session ends in
`ioloop.stop()`, at the latest at the hard deadline.

Publisher (docs/reliability.md, "Verdict"): unique ids "<process>-<seq>" in `message_id` and in the body,
persistent, mandatory, confirms. It records `invoke` before the bytes leave, then `ok` on
basic.ack, `fail` on basic.nack ("nack") or on a basic.return followed by its ack ("returned"),
and `info` for whatever is in flight when the connection dies or a confirm takes longer than
`confirm_timeout_s` (then the connection is aborted: we stop waiting, the broker may still have it).
With `unsafe_confirm_early` it records `ok` at send time instead: a deliberately wrong client
whose "confirmed" messages a crash can lose, to prove the checker sees losses.

Every session connects to a node of the lab chosen by the worker's seeded RNG; after a session
ends (the node died, was paused or cut off, or closed us with 320 CONNECTION_FORCED) the next
one goes to a different node. Sessions are bounded (SESSIONS_MAX) and so is the time.

Consumer: manual ack, prefetch, a seeded small delay before each ack (so that a crash finds
messages delivered but unacked). Every delivery is recorded with its `redelivered` flag, the
body's CRC and the queue it came from, then the ack.

The dead-letter variant (`dead_letter_queue` set, workload kind "dlx"): the work queue is declared
with `x-message-ttl` and `x-dead-letter-exchange` "" / `x-dead-letter-routing-key` naming a second
durable queue, declared first. Even-numbered consumers take from the work queue, odd-numbered ones
from the dead-letter queue; a work-queue consumer pauses now and then (basic.cancel for a seeded
`pause_s`, then basic.consume again after a seeded `consume_s`), so that a real share of the
messages expires and travels to the dead-letter queue (as do messages held unacked past their
deadline when a consumer dies: requeued, they are dead-lettered at once). A delivery records its
`x-death` entries (queue, reason, count) so the checker can tell a legitimate dead letter.

`drain` and `probe` are blocking helpers for the end of a run: take every message left in the
queue (recorded like deliveries), and check that a node confirms publishes again.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
import zlib
from dataclasses import asdict, dataclass

import pika
from pika.exceptions import AMQPError

from .history import FAIL, INFO, INVOKE, OK, HistoryWriter

TICK_S = 0.01
SESSIONS_MAX = 10_000
CLOSE_GRACE_S = 3.0
ABORT_GRACE_S = 2.0
DRAIN_EMPTY_POLLS = 3
DRAIN_POLL_S = 0.2
DRAIN_GETS_MAX = 10_000_000
DRAIN_ROUNDS_MAX = 3  # passes over every node and queue when there is a dead-letter queue
# A drain still taking messages when its time runs out goes on: each message taken leaves it at
# least DRAIN_PROGRESS_S more, up to DRAIN_EXTEND_MAX times its timeout in all (a backlog of a
# high --rate run takes longer to read one by one than the profile allows; stopping early would
# count what is still queued as lost). Enough, after the last message, to see every node's
# queues empty on a busy machine: 10 s was not (the campaign's dlx run 3028, two queues on
# three nodes, UNKNOWN with nothing left).
DRAIN_PROGRESS_S = 30.0
DRAIN_EXTEND_MAX = 10
# A later pass (a dead-letter queue's: messages that expired during the pass before) gets at
# least this long, within DRAIN_EXTEND_MAX: the pass before could end with its last message just
# before the deadline, leaving the next too little time to see every node's queues empty (the
# campaign's dlx runs 3008, 3016 and 3024 on a busy machine: UNKNOWN with nothing left).
DRAIN_PASS_S = DRAIN_PROGRESS_S
PROBE_QUEUE = "jepsen-probe"

logging.getLogger("pika").setLevel(logging.CRITICAL)  # pika logs every refused reconnect; the history has them


class ClientAbort(Exception):
    """Why the harness itself dropped a connection (e.g. a confirm took too long)."""


@dataclass(frozen=True)
class WorkloadConfig:
    queue: str = "jepsen"
    publishers: int = 3
    consumers: int = 2
    rate_per_publisher_hz: float = 20.0
    confirm_window: int = 16
    messages_per_publisher_max: int = 100_000
    body_bytes: int = 256
    prefetch: int = 10
    ack_delay_ms_max: float = 20.0
    heartbeat_s: int = 2
    connect_timeout_s: float = 3.0
    confirm_timeout_s: float = 5.0
    reconnect_delay_s: tuple[float, float] = (0.2, 0.6)
    unsafe_confirm_early: bool = False
    # The dead-letter variant (None: off): the work queue's TTL and dead-letter target, and the
    # work-queue consumers' duty cycle (seconds consuming, then seconds paused, both seeded).
    dead_letter_queue: str | None = None
    message_ttl_ms: int | None = None
    consume_s: tuple[float, float] | None = None
    pause_s: tuple[float, float] | None = None
    # The sqs workload (sqs_workload.py): the receivers' visibility timeout, and the share of
    # received messages they leave alone so that the timeout runs out and they come back.
    visibility_timeout_s: int = 4
    abandon_ratio: float = 0.15
    # The txn workload (txn_workload.py): the work queue deduplicates (x-message-deduplication),
    # halves of 1-3 messages per transaction, check-backs to checks_queue after a seeded timeout.
    deduplication: bool = False
    checks_queue: str | None = None
    check_responders: int = 1
    txn_size: tuple[int, int] = (1, 3)
    txn_timeout_ms: tuple[int, int] = (1000, 2000)
    txn_checks: int = 3
    txn_retries_max: int = 3  # attempts per half and per decision
    # The partitioned workload: the work queue has this many partitions (x-partitions, with
    # x-single-active-consumer: one consumer per partition at a time), and each publish an
    # x-partition-key header, one of `partition_keys` per publisher ("k<seq mod keys>"): the
    # checker's key order rule (checker.py) holds each key's messages to publish order.
    partitions: int = 0
    partition_keys: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    def queues(self) -> list[str]:
        """Every queue the workload uses, the work queue first (the drain takes them in this order)."""
        return [self.queue] + ([self.dead_letter_queue] if self.dead_letter_queue else [])

    def consumer_queue(self, index: int) -> str:
        """The queue consumer number `index` takes from: with a dead-letter queue, odd ones take from it."""
        return self.dead_letter_queue if self.dead_letter_queue and index % 2 == 1 else self.queue


def message_body(message_id: str, seed: int, size_bytes: int) -> bytes:
    """A body that is a pure function of (id, seed): the consumer's CRC can be checked offline."""
    head = f"{message_id} seed={seed} ".encode()
    filler = random.Random(f"{seed}:{message_id}").randbytes(max(0, size_bytes - len(head)))
    return head + filler


def queue_arguments(config: WorkloadConfig | None = None, queue: str | None = None) -> dict:
    # RabbitMQ's name for a replicated queue; MaxQ-Raft replicates every durable queue anyway.
    args: dict = {"x-queue-type": "quorum"}
    if config is not None and config.dead_letter_queue and queue == config.queue:
        # Dead letters go through the default exchange, whose routing key is a queue's name.
        args["x-dead-letter-exchange"] = ""
        args["x-dead-letter-routing-key"] = config.dead_letter_queue
        if config.message_ttl_ms is not None:
            args["x-message-ttl"] = int(config.message_ttl_ms)
    if config is not None and config.deduplication and queue == config.queue:
        args["x-message-deduplication"] = True
    if config is not None and config.partitions and queue == config.queue:
        args["x-partitions"] = int(config.partitions)
        args["x-single-active-consumer"] = True
    return args


def x_death(properties) -> list[dict] | None:
    """The x-death header of a delivery, reduced to (queue, reason, count) per entry, most recent
    first (pika may hand string values over as bytes); None when there is none."""
    headers = getattr(properties, "headers", None) or {}
    deaths = headers.get("x-death")
    if not isinstance(deaths, list):
        return None if deaths is None else [{"malformed": _text(repr(deaths))}]
    out = []
    for entry in deaths[:8]:
        if not isinstance(entry, dict):
            out.append({"malformed": _text(repr(entry))})
            continue
        out.append(
            {"queue": _str(entry.get("queue")), "reason": _str(entry.get("reason")), "count": entry.get("count")}
        )
    return out


def _str(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def connection_parameters(host: str, port: int, config: WorkloadConfig) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host=host,
        port=port,
        heartbeat=config.heartbeat_s,
        connection_attempts=1,
        retry_delay=0,
        socket_timeout=config.connect_timeout_s,
        stack_timeout=config.connect_timeout_s + 2,
        blocked_connection_timeout=30,
    )


def no_enter(_node: str):
    """Where the harness's own network reaches every node (the loopback lab)."""
    return contextlib.nullcontext()


class Worker(threading.Thread):
    """One client process of the history: sessions one after another until stopped.

    `enter(node)` is the lab's context for opening a socket to that node (Lab.enter: the netns lab
    moves the thread into the node's namespace for the connect, see lab.py)."""

    def __init__(
        self,
        process: str,
        history: HistoryWriter,
        nodes: list[tuple[str, str, int]],
        config: WorkloadConfig,
        seed: int,
        stop: threading.Event,
        hard_deadline: float,
        enter=no_enter,
    ) -> None:
        super().__init__(name=f"jepsen-{process}", daemon=True)
        self.process = process
        self.history = history
        self.nodes = nodes
        self.config = config
        self.seed = seed
        self.stop_event = stop
        self.hard_deadline = hard_deadline
        self.rng = random.Random(f"{seed}:{process}")
        self.enter = enter
        self.session = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            last = None
            while (
                not self.stop_event.is_set() and time.monotonic() < self.hard_deadline and self.session < SESSIONS_MAX
            ):
                self.session += 1
                # Any node serves any queue: after a failure go to another one (the one that failed
                # may be down, paused or cut off); the choice is seeded like everything else.
                choices = [n for n in self.nodes if n[0] != last] or self.nodes
                name, host, port = self.rng.choice(choices)
                # The whole session runs in the lab's context for that node: pika makes its socket
                # inside the ioloop (after an address lookup), so the thread stays there until the end.
                with self.enter(name):
                    self.make_session(name, host, port).run()
                last = name
                self.stop_event.wait(self.rng.uniform(*self.config.reconnect_delay_s))
        except BaseException as exc:  # a harness bug: keep it for the runner, do not kill the run
            self.error = exc
            self.history.write(INFO, "worker-error", self.process, error=repr(exc))

    def make_session(self, node: str, host: str, port: int) -> _Session:
        raise NotImplementedError


class _Session:
    """One connection. Subclasses fill in on_ready, on_tick, on_lost and begin_close."""

    def __init__(self, worker: Worker, node: str, host: str, port: int) -> None:
        self.w = worker
        self.node = node
        self.number = worker.session
        self.params = connection_parameters(host, port, worker.config)
        self.conn: pika.SelectConnection | None = None
        self.channel = None
        self.ready = False
        self.closing = False
        self.close_deadline = 0.0
        self.aborted = False
        self.finished = False

    def record(self, type: str, f: str, **fields) -> None:
        self.w.history.write(type, f, self.w.process, session=self.number, node=self.node, **fields)

    def run(self) -> None:
        self.record(INVOKE, "connect")
        self.conn = pika.SelectConnection(
            self.params,
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        self.conn.ioloop.call_later(TICK_S, self._tick)
        try:
            self.conn.ioloop.start()
        finally:
            if not self.conn.is_closed:
                self._abort("session ended")  # sockets must not outlive the session
            self.conn.ioloop.close()

    # -- plumbing ---------------------------------------------------------------------------

    def _on_open(self, conn) -> None:
        conn.channel(on_open_callback=self._on_channel_open)

    def _on_channel_open(self, channel) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._on_channel_closed)
        self.on_channel(channel)

    def _on_channel_closed(self, channel, reason) -> None:
        self.ready = False
        self.on_lost(f"channel closed: {reason}")
        if self.conn is not None and self.conn.is_open:
            try:
                self.conn.close()
            except AMQPError:
                self._abort("close after channel close failed")

    def _on_open_error(self, conn, error) -> None:
        self.record(FAIL, "connect", error=_text(error))
        self._finish()

    def _on_closed(self, conn, reason) -> None:
        if self.ready or self.channel is not None:
            self.record(INFO, "disconnect", error=_text(reason))
        self.ready = False
        self.on_lost(_text(reason))
        self._finish()

    def _abort(self, why: str) -> None:
        """Drop the TCP connection without a close handshake (a paused broker would never answer it).
        pika's own heartbeat checker ends a dead connection the same way."""
        if self.aborted or self.conn is None or self.conn.is_closed:
            return
        self.aborted = True
        try:
            self.conn._terminate_stream(ClientAbort(why))
        except Exception:
            self._finish()

    def _finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.conn.ioloop.stop()

    def _tick(self) -> None:
        if self.finished:
            return
        now = time.monotonic()
        if now > self.w.hard_deadline:
            self._abort("hard deadline")
            self._finish()
            return
        if self.w.stop_event.is_set() and not self.closing:
            self.closing = True
            self.close_deadline = now + self.close_wait_s()
            self.begin_close()
        if self.closing:
            if now > self.close_deadline:
                self._abort("close timeout")
            if now > self.close_deadline + ABORT_GRACE_S:
                self._finish()
                return
        if not self.finished:
            self.on_tick(now)
            self.conn.ioloop.call_later(TICK_S, self._tick)

    def _close(self) -> None:
        if self.conn.is_open:
            try:
                self.conn.close()
            except AMQPError:
                self._abort("close failed")
        elif not self.conn.is_closing:
            self._abort("closing before open")

    # -- for subclasses ---------------------------------------------------------------------

    def close_wait_s(self) -> float:
        return CLOSE_GRACE_S

    def on_channel(self, channel) -> None:
        raise NotImplementedError

    def on_tick(self, now: float) -> None:
        pass

    def on_lost(self, why: str) -> None:
        pass

    def begin_close(self) -> None:
        self._close()


class Publisher(Worker):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seq = 0  # across sessions: ids are unique per process

    def make_session(self, node, host, port):
        return _PublisherSession(self, node, host, port)


class _PublisherSession(_Session):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.inflight: dict[int, tuple[str, int, float]] = {}  # delivery tag -> (id, seq, sent at)
        self.returned: set[str] = set()
        self.tag = 0
        self.next_publish = 0.0

    def on_channel(self, channel) -> None:
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, _frame) -> None:
        self.ready = True
        self.next_publish = time.monotonic()
        self.record(OK, "connect")

    def close_wait_s(self) -> float:
        return self.w.config.confirm_timeout_s  # let what is in flight be confirmed first

    def begin_close(self) -> None:
        pass  # on_tick closes once nothing is in flight (or aborts when a confirm is overdue)

    def on_tick(self, now: float) -> None:
        config = self.w.config
        if self.inflight and not self.aborted:
            oldest = min(sent for _, _, sent in self.inflight.values())
            if now - oldest > config.confirm_timeout_s:
                self._abort(f"no confirm for {config.confirm_timeout_s}s")
                return
        if self.closing:
            if not self.inflight and not self.conn.is_closing:
                self._close()
            return
        if not self.ready:
            return
        interval_s = 1.0 / config.rate_per_publisher_hz
        burst_max = max(1, config.confirm_window)
        while (
            now >= self.next_publish
            and len(self.inflight) < config.confirm_window
            and burst_max > 0
            and self.w.seq < config.messages_per_publisher_max
        ):
            self.next_publish += interval_s * self.w.rng.uniform(0.5, 1.5)
            self.next_publish = max(self.next_publish, now - 1.0)  # after a stall, do not make up for lost time
            burst_max -= 1
            if not self._publish(now):
                return

    def _publish(self, now: float) -> bool:
        w = self.w
        w.seq += 1
        message_id = f"{w.process}-{w.seq}"
        body = message_body(message_id, w.seed, w.config.body_bytes)
        key = f"k{w.seq % w.config.partition_keys}" if w.config.partition_keys else None
        headers = None if key is None else {"x-partition-key": f"{w.process}:{key}"}
        keyed = {} if key is None else {"key": key}
        self.record(INVOKE, "publish", id=message_id, seq=w.seq, crc=zlib.crc32(body), **keyed)
        try:
            self.channel.basic_publish(
                "",
                w.config.queue,
                body,
                mandatory=True,
                properties=pika.BasicProperties(delivery_mode=2, message_id=message_id, headers=headers),
            )
        except AMQPError as exc:
            self.record(INFO, "publish", id=message_id, seq=w.seq, error=f"send: {_text(exc)}")
            self._abort("publish raised")
            return False
        self.tag += 1
        if w.config.unsafe_confirm_early:
            # Deliberately wrong: "confirmed" before the broker said so (see the module docstring).
            self.record(OK, "publish", id=message_id, seq=w.seq, value={"unsafe": True})
        self.inflight[self.tag] = (message_id, w.seq, now)
        return True

    def _on_return(self, _channel, _method, properties, _body) -> None:
        if properties.message_id:
            self.returned.add(properties.message_id)

    def _on_confirm(self, frame) -> None:
        method = frame.method
        ack = isinstance(method, pika.spec.Basic.Ack)
        tags = [t for t in self.inflight if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        for tag in sorted(tags):
            entry = self.inflight.pop(tag, None)
            if entry is None or self.w.config.unsafe_confirm_early:
                continue
            message_id, seq, _ = entry
            if not ack:
                self.record(FAIL, "publish", id=message_id, seq=seq, error="nack")
            elif message_id in self.returned:
                self.returned.discard(message_id)
                self.record(FAIL, "publish", id=message_id, seq=seq, error="returned")
            else:
                self.record(OK, "publish", id=message_id, seq=seq)

    def on_lost(self, why: str) -> None:
        for tag in sorted(self.inflight):
            message_id, seq, _ = self.inflight[tag]
            if not self.w.config.unsafe_confirm_early:
                self.record(INFO, "publish", id=message_id, seq=seq, error=why)
        self.inflight.clear()


class Consumer(Worker):
    """Takes from `queue` (default: the work queue). With `pauses`, it stops consuming now and
    then (the config's consume_s / pause_s), so that messages in the work queue expire."""

    def __init__(self, *args, queue: str | None = None, pauses: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.queue = queue or self.config.queue
        self.pauses = bool(pauses and self.config.consume_s and self.config.pause_s)

    def make_session(self, node, host, port):
        return _ConsumerSession(self, node, host, port)


class _ConsumerSession(_Session):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.pending_acks: dict[int, object] = {}  # delivery tag -> ioloop timer
        self.consumer_tag: str | None = None
        self.paused = False
        self.toggle_at: float | None = None  # when a pausing consumer next pauses or resumes

    def on_channel(self, channel) -> None:
        channel.basic_qos(prefetch_count=self.w.config.prefetch, callback=self._on_qos)

    def _on_qos(self, _frame) -> None:
        self.channel.add_on_cancel_callback(self._on_cancel)
        self._consume()

    def _consume(self) -> None:
        self.consumer_tag = self.channel.basic_consume(
            self.w.queue, self._on_message, auto_ack=False, callback=self._on_consume_ok
        )

    def _on_consume_ok(self, _frame) -> None:
        first = not self.ready
        self.ready = True
        self.paused = False
        if self.w.pauses:
            self.toggle_at = time.monotonic() + self.w.rng.uniform(*self.w.config.consume_s)
        if first:
            self.record(OK, "connect", value={"queue": self.w.queue})
        else:
            self.record(OK, "resume", value={"queue": self.w.queue})

    def on_tick(self, now: float) -> None:
        if not self.w.pauses or self.closing or not self.ready or self.toggle_at is None or now < self.toggle_at:
            return
        if self.channel is None or not self.channel.is_open:
            return
        self.toggle_at = None  # set again when the broker answers
        try:
            if self.paused:
                self._consume()
            elif self.consumer_tag is not None:
                # Messages already delivered stay ours (and are acked as usual); pika rejects with
                # requeue any delivery that arrives after the cancel, and we never see it.
                self.channel.basic_cancel(self.consumer_tag, callback=self._on_cancel_ok)
        except AMQPError as exc:
            self.record(INFO, "pause", error=_text(exc))
            self._abort("pause/resume raised")

    def _on_cancel_ok(self, _frame) -> None:
        self.paused = True
        pause_s = self.w.rng.uniform(*self.w.config.pause_s)
        self.toggle_at = time.monotonic() + pause_s
        self.record(OK, "pause", value={"queue": self.w.queue, "seconds": round(pause_s, 3)})

    def _on_cancel(self, _frame) -> None:
        self.record(INFO, "cancelled")  # the broker cancelled us (queue gone?): start over
        self._close()

    def _on_message(self, _channel, method, properties, body) -> None:
        self.record(
            OK,
            "deliver",
            id=properties.message_id,
            redelivered=bool(method.redelivered),
            crc=zlib.crc32(body),
            queue=self.w.queue,
            x_death=x_death(properties),
            value={"tag": method.delivery_tag},
        )
        delay_s = self.w.rng.uniform(0, self.w.config.ack_delay_ms_max) / 1000.0
        tag = method.delivery_tag
        self.pending_acks[tag] = self.conn.ioloop.call_later(delay_s, lambda: self._ack(tag, properties.message_id))

    def _ack(self, tag: int, message_id: str | None) -> None:
        self.pending_acks.pop(tag, None)
        try:
            self.channel.basic_ack(tag)
        except AMQPError as exc:
            self.record(FAIL, "ack", id=message_id, error=_text(exc))
            return
        self.record(OK, "ack", id=message_id)

    def begin_close(self) -> None:
        for timer in list(self.pending_acks.values()):
            self.conn.ioloop.remove_timeout(timer)
        pending = list(self.pending_acks)
        self.pending_acks.clear()
        if self.channel is not None and self.channel.is_open:
            for tag in pending:
                try:
                    self.channel.basic_ack(tag)
                except AMQPError:
                    break
        self._close()

    def on_lost(self, why: str) -> None:
        for timer in self.pending_acks.values():
            self.conn.ioloop.remove_timeout(timer)
        self.pending_acks.clear()


def _text(error) -> str:
    text = repr(error) if not isinstance(error, str) else error
    return text[:300]


# -- blocking helpers for the end of a run ----------------------------------------------------


def blocking_connection(host: str, port: int, config: WorkloadConfig) -> pika.BlockingConnection:
    return pika.BlockingConnection(connection_parameters(host, port, config))


def declare_queue(host: str, port: int, config: WorkloadConfig, timeout_s: float, enter=contextlib.nullcontext) -> None:
    """Declare the durable queue(s) (retrying until `timeout_s`); raises the last error. The
    dead-letter queue comes first, so that nothing can expire before it exists.
    `enter()`: the context in which a socket reaches the node (see Worker)."""
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            with enter():
                conn = blocking_connection(host, port, config)
            try:
                channel = conn.channel()
                for queue in reversed(config.queues()):
                    channel.queue_declare(queue, durable=True, arguments=queue_arguments(config, queue))
                if config.checks_queue:  # the txn workload's check-backs (not drained: not messages of the run)
                    channel.queue_declare(config.checks_queue, durable=True, arguments=queue_arguments())
                return
            finally:
                _close_quietly(conn)
        except AMQPError as exc:
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"could not declare {config.queue} in {timeout_s}s: {last!r}")


def probe(host: str, port: int, config: WorkloadConfig, enter=contextlib.nullcontext) -> str | None:
    """Publish one confirmed message to a side queue and get it back; None if the node works, else why."""
    try:
        with enter():
            conn = blocking_connection(host, port, config)
    except AMQPError as exc:
        return f"connect: {_text(exc)}"
    try:
        channel = conn.channel()
        channel.queue_declare(PROBE_QUEUE, durable=False)
        channel.confirm_delivery()
        channel.basic_publish("", PROBE_QUEUE, b"probe", mandatory=True)
        method, _, _ = channel.basic_get(PROBE_QUEUE, auto_ack=True)
        return None if method is not None else "probe message not found"
    except AMQPError as exc:
        return _text(exc)
    finally:
        _close_quietly(conn)


def drain(
    history: HistoryWriter, nodes: list[tuple[str, str, int]], config: WorkloadConfig, timeout_s: float, enter=no_enter
) -> dict:
    """Take every message left in the queue(s) from every node (basic.get, manual ack), recording each
    (with the queue it came from and its x-death).

    Done when every node reports every queue empty `DRAIN_EMPTY_POLLS` times in a row. With a
    dead-letter queue the work queue is drained before it on each node, and the whole pass is
    repeated (at most DRAIN_ROUNDS_MAX) while the last pass still found messages: a message that
    expires while the work queue is drained reaches the dead-letter queue a little later (on
    another shard's leader). Records f="drain" ok with value {"remaining": 0, ...}, or info with
    the reason when time ran out (a drain still taking messages is given more, and a repeated
    pass at least DRAIN_PASS_S, boundedly).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    deadline_max = started + DRAIN_EXTEND_MAX * timeout_s
    got = 0
    session = 0
    queues = config.queues()
    remaining_by_queue: dict[str, int | None] = {q: None for q in queues}
    last_error = None
    history.write(INVOKE, "drain", "drain")
    rounds = 0
    complete = False
    while rounds < (DRAIN_ROUNDS_MAX if len(queues) > 1 else 1) and time.monotonic() < deadline:
        rounds += 1
        got_before = got
        pairs_empty = 0
        for name, host, port in nodes:
            for queue in queues:
                empty_polls = 0
                while time.monotonic() < deadline and empty_polls < DRAIN_EMPTY_POLLS and got < DRAIN_GETS_MAX:
                    session += 1
                    try:
                        with enter(name):
                            conn = blocking_connection(host, port, config)
                    except AMQPError as exc:
                        last_error = _text(exc)
                        time.sleep(DRAIN_POLL_S)
                        continue
                    try:
                        channel = conn.channel()
                        history.write(OK, "connect", "drain", session=session, node=name, value={"queue": queue})
                        while time.monotonic() < deadline and empty_polls < DRAIN_EMPTY_POLLS and got < DRAIN_GETS_MAX:
                            method, properties, body = channel.basic_get(queue, auto_ack=False)
                            if method is None:
                                remaining = channel.queue_declare(queue, passive=True).method.message_count
                                remaining_by_queue[queue] = remaining
                                empty_polls = empty_polls + 1 if remaining == 0 else 0
                                time.sleep(DRAIN_POLL_S)
                                continue
                            empty_polls = 0
                            got += 1
                            now = time.monotonic()
                            if deadline - now < DRAIN_PROGRESS_S:
                                deadline = min(deadline_max, now + DRAIN_PROGRESS_S)
                            history.write(
                                OK,
                                "deliver",
                                "drain",
                                session=session,
                                node=name,
                                id=properties.message_id,
                                redelivered=bool(method.redelivered),
                                crc=zlib.crc32(body),
                                queue=queue,
                                x_death=x_death(properties),
                            )
                            channel.basic_ack(method.delivery_tag)
                            history.write(OK, "ack", "drain", session=session, node=name, id=properties.message_id)
                    except AMQPError as exc:
                        last_error = _text(exc)
                        remaining_by_queue[queue] = None
                        time.sleep(DRAIN_POLL_S)
                    finally:
                        _close_quietly(conn)
                pairs_empty += empty_polls >= DRAIN_EMPTY_POLLS
        complete = pairs_empty == len(nodes) * len(queues)
        if not complete or got == got_before:
            break
        deadline = min(deadline_max, max(deadline, time.monotonic() + DRAIN_PASS_S))
    counts = list(remaining_by_queue.values())
    remaining = None if None in counts else sum(counts)
    value = {
        "remaining": remaining,
        "drained": got,
        **({"remaining_by_queue": remaining_by_queue, "rounds": rounds} if len(queues) > 1 else {}),
        **({"error": last_error} if last_error and not complete else {}),
    }
    history.write(OK if complete else INFO, "drain", "drain", value=value)
    return value


def _close_quietly(conn) -> None:
    try:
        if conn.is_open:
            conn.close()
    except Exception:
        pass
