"""One client connection: the trio shell around a sans-IO `ServerConnection`.

Theory of operation: three tasks share a nursery. The reader takes up to 64 KiB per read,
feeds the protocol object, and handles every event of that read synchronously: publishes are
routed at once and collected per queue, then applied as one `Enqueue` per queue and confirmed
with one `basic.ack multiple` per channel (`flush_publishes`), so a read of hundreds of
publishes costs a handful of machine commands and no `await` per frame. The writer sends
whatever the protocol object has buffered whenever it is woken (by our replies, or by another
connection's publish delivering to one of our consumers), then refills the flow credit of the
consumers whose deliveries it wrote. On a plain socket, what a pass of the loop wrote is
first tried straight from the socket at that pass's end (`send_soon`, `send_now`): a task
switch sooner; the writer still sends what the socket did not take. The ticker drives
heartbeats and the handshake timeout.

Cleanup when the connection ends, however it ends: the consumers go (`Down`), their unacked
messages return to their queues, exclusive queues are deleted.
"""

from __future__ import annotations

import ipaddress
import itertools
import logging
import math
import os
import secrets
from functools import lru_cache, partial

import trio

from ..amqp import spec
from ..amqp.connection import DEFAULT_MECHANISMS, EXTERNAL, LATER, Later, ServerConnection, State
from ..amqp.errors import AMQPError
from ..amqp.events import (
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ContentReceived,
    MethodReceived,
    PublishesReceived,
)
from ..amqp.frames import encode_deliveries, encode_delivery, encode_shortstr_field
from ..amqp.properties import decode_properties
from ..machines import commands as qc
from ..machines.dedup import exchange_scope
from ..machines.features import TRACE_NUMBERS
from ..machines.maintenance import DRAINING_TEXT
from ..machines.message import Message
from ..machines.metadata import DEDUP_EXCHANGE_TYPE
from ..machines.queue_types import Overflowed
from .authorization import Authorization, vhost_refusal
from .broker import Broker
from .channel import CLUSTER_FLOW_CREDIT, CREDIT_BYTES, FLOW_CREDIT, REPLY_TO_PREFIX, REPLY_TO_QUEUE, Channel
from .confirms import ConfirmBatch, Unavailable
from .errors import ChannelError, HardError, MetadataBehind
from .proposer import message_bytes_max
from .publish_extras import EXTRAS_FLAGS, dedup_fields, delivery_props, note_refused, publish_extras, wants_extras
from .publish_plan import PublishPlan
from .tracer import TRACE_ID_DIGITS, trace_id_template
from .transactions import TXN_EXCHANGE, decide_publish, half_fields, note_half

log = logging.getLogger("maxq.session")

# The most a session reads at once. Every read has a fixed cost (about 80 us: the scheduler, the
# socket calls, one Enqueue through the applier, the consumer's writer), so larger messages gain
# from larger reads: 128 KiB against 64 KiB took s1 1 KiB from ~155,000 to ~176,000 msgs/s, 4 KiB
# +15 %, 16 KiB +55 % (docs/benchmarks.md, 2026-12-03). At 256 KiB a 1 KiB consumer fell behind
# its publisher and the queue spilled to its store (a third of the rate): not there.
READ_SIZE_BYTES = 131072
# A cluster member carries a read's publishes to a queue in one Raft entry, the largest message
# among them (proposer.message_bytes_max): its reads stay at 64 KiB, which keeps its largest
# message at 816 KiB (docs/compatibility.md).
CLUSTER_READ_SIZE_BYTES = 65536
# Fair turns: a read's publishes are routed, applied and delivered before the loop runs another
# task, so a read of 64 KiB of small publishes (about 1,100 of 16 B) held every other connection
# of the node for 4 ms. A publisher's next read is sized for about READ_TURN_MESSAGES of its
# recent messages, at least READ_SIZE_MIN_BYTES (fewer, larger reads cost more per message:
# docs/benchmarks.md, 2026-12-03, fair dispatch).
READ_TURN_MESSAGES = 256
READ_SIZE_MIN_BYTES = 16384
COALESCED_METHODS = (spec.BasicAck, spec.BasicNack, spec.BasicReject)
HANDSHAKE_TIMEOUT_S = 10.0
CREDIT_LEVELS_KEPT_MAX = 256  # consumers' credit levels a session keeps before it sweeps out gone ones
TICK_INTERVAL_S = 0.25
CLOSED_GRACE_S = 2.0  # a closed connection's last frames get this long before it is cut
# A peer that does not read what it asked for (basic.get in a loop, never reading the get-oks)
# is not read either once this much output waits for it, until it has taken most of it: the
# server's memory per connection stays bounded and TCP slows the peer down.
OUTPUT_BYTES_MAX = 16 << 20
OUTPUT_BYTES_RESUME = 4 << 20
PARTIAL_BODY_BLOCK_BYTES = 1 << 20  # see _streaming_a_big_body
LINGER_S = 1.0  # see _linger: how long a closing connection's unread input is read and dropped
LINGER_BYTES_MAX = 4 << 20  # ... and how much of it at most
# Property flag bits (AMQP 0-9-1 basic class, most significant first).
HEADERS_FLAG = 1 << 13
REPLY_TO_FLAG = 1 << 9
USER_ID_FLAG = 1 << 4
# Publishers repeat their properties and routing: what is derived from them is kept, boundedly.
PROPS_CACHED_MAX = 64  # per connection: property lists -> persistent
PROPS_CACHED_BYTES_MAX = 128
WIRE_ROUTING_CACHED_MAX = 4096  # per process: (exchange, routing key) -> their wire encoding
_wire_routing: dict[tuple[str, str], bytes] = {}

# A session's id is "node@process.n" (its channels "node@process.n/channel", their consumers
# ".../tag"). The process's own random token keeps a restarted member from reusing an id of its
# earlier process, whose counter started at 1 too: a leader applying late may still send that
# process's consumers their deliveries, which a member holding no replica of the queue's group
# wrote to a new consumer that had the same id, on another queue (the seeded simulation, seed
# 100700 of --partial). Down("node@") still names every session of a node, of any process.
PROCESS_TOKEN = secrets.token_hex(4)  # (also in the HTTP API's get requests' owners)
_session_numbers = itertools.count(1)
_trace_numbers = [1]  # the next x-maxq-trace-id's n, "node@connection-n" (tracer.py): _take_trace_numbers
_TRACE_NUMBER_END = 10**TRACE_ID_DIGITS
_TWO_DIGITS = [b"%02d" % i for i in range(100)]
_ENDINGS_CACHED_MAX = 64  # trace template tails -> _TWO_DIGITS each followed by it (_numbered)
_endings: dict[bytes, list[bytes]] = {}
_TRACE_RUN_ITEMS = 6  # [position, channel, confirm, routed queues, first trace number, count]
# A miss of the template cache, told apart by identity (None is a cached "no template").
_NOT_CACHED: tuple[bytes, bytes] = (b"", b"")


def next_read_bytes(read_bytes: int, published: int, read_bytes_max: int = READ_SIZE_BYTES) -> int:
    """The size of a publisher's next read, after one of `read_bytes` that held `published`
    messages (> 0): about READ_TURN_MESSAGES of them, within [READ_SIZE_MIN_BYTES, read_bytes_max]."""
    return min(read_bytes_max, max(READ_SIZE_MIN_BYTES, read_bytes * READ_TURN_MESSAGES // published))


def credit_target(sent_bytes: int, deliveries: int, credit_max: int) -> int:
    """A cluster consumer's credit after deliveries averaging sent_bytes / deliveries on the wire:
    about CREDIT_BYTES of them, within [FLOW_CREDIT, credit_max] (channel.py)."""
    if deliveries <= 0:
        return FLOW_CREDIT
    return min(credit_max, max(FLOW_CREDIT, CREDIT_BYTES * deliveries // max(1, sent_bytes)))


def credit_refill(level: int, written: int, target: int) -> tuple[int, int]:
    """(credit to give back, the consumer's credit after it): `level` was granted and not yet
    used before `written` deliveries were sent; the credit returns to `target` (never taken back:
    above it, what was used is not given back until it is down to it)."""
    left = max(0, level - written)
    refill = max(0, target - left)
    return refill, left + refill


@lru_cache(maxsize=4)
def server_properties(version: str) -> dict:
    """Sent in connection.start and not kept or changed after: one dict for every connection
    (made per connection it was ~270 bytes of each one's memory)."""
    return {
        "product": "MaxQ-Raft",
        "version": version,
        "platform": "Python/trio",
        "information": "https://github.com/maxq-raft (AMQP 0-9-1, Raft replicated)",
        # Advertise only what works (clients switch behaviour on these).
        "capabilities": {
            "publisher_confirms": True,
            "exchange_exchange_bindings": True,
            "basic.nack": True,
            "consumer_cancel_notify": True,
            "consumer_priorities": True,
            "authentication_failure_close": True,
            "per_consumer_qos": True,
            "direct_reply_to": True,
            "connection.blocked": True,
        },
    }


class Session:
    # Slots: CPython shares an instance dict's keys between instances only up to 30 attributes;
    # past that each session paid for a dict of its own (~1.6 KiB; docs/benchmarks.md,
    # "RSS per connection"). An attribute set anywhere must be named here.
    __slots__ = (
        "broker",
        "stream",
        "peer_host",
        "settings",
        "id",
        "vhost",
        "user",
        "authorization",
        "read_bytes_max",
        "credit_max",
        "credit_levels",
        "_credit_counted",
        "conn",
        "channels",
        "closing_channels",
        "cancels",
        "pending",
        "pending_refs",
        "pending_dedup",
        "pending_txn",
        "pending_entries",
        "txn_ids",
        "pending_trace",
        "pending_confirms",
        "pending_settles",
        "_persistent_props",
        "_trace_templates",
        "_trace_numbers",
        "_trace_template",
        "credit_pending",
        "holding",
        "read_at",
        "client_properties",
        "started_at",
        "finished",
        "_released",
        "_wake",
        "_cancel_scope",
        "_reader_scope",
        "_next_tick_at",
        "_closed_seen_at",
        "_handshake_deadline",
        "_decided",
        "_writer_done",
        "_writer_ended",
        "_plain",
        "_send_queued",
        "_peer_closed",
        "messages_in",
        "messages_routed",
        "run_exchange",
        "run_in",
        "run_out",
        "exchange_counts",
        "recv_oct",
        "recv_cnt",
        "send_oct",
        "send_cnt",
        "messages_out",
        "_sending_bytes",
        "_drained",
        "output_pauses",
        "publish_resume_at",
    )

    def __init__(
        self, broker: Broker, stream: trio.abc.Stream, peer_host: str, settings, tls_user: str | None = None
    ) -> None:
        self.broker = broker
        self.stream = stream
        # On a plain socket, what a pass of the loop wrote for this connection is sent at the
        # pass's end (send_now), a task switch sooner than by the writer; not on TLS.
        self._plain = isinstance(stream, trio.SocketStream)
        self._send_queued = False
        self.peer_host = peer_host
        self.settings = settings
        self.id = f"{broker.node_id}@{PROCESS_TOKEN}.{next(_session_numbers)}"
        self.vhost = ""
        self.user = ""
        self.authorization = Authorization(broker, "", "")  # made for the user at connection.open
        self.read_bytes_max = CLUSTER_READ_SIZE_BYTES if settings.clustered else READ_SIZE_BYTES
        # A consumer's credit: FLOW_CREDIT, raised on a cluster member for small deliveries (channel.py)
        self.credit_max = CLUSTER_FLOW_CREDIT if settings.clustered else FLOW_CREDIT
        self.credit_levels: dict[str, int] = {}  # consumer id -> credit granted and not yet used
        self._credit_counted = (0, 0)  # (bytes sent, deliveries written) at the last refill
        self.conn = ServerConnection(
            authenticate=self._login,
            vhost_allowed=self._vhost_refusal,
            server_properties=server_properties(settings.version),
            frame_max=settings.frame_max,
            heartbeat_s=settings.heartbeat_s,
            channel_max=settings.channel_max,
            channel_allowed=self._channel_refusal,
            now=trio.current_time(),
            # EXTERNAL only on TLS with a verified client certificate (server/tls.py): its CN
            mechanisms=(*DEFAULT_MECHANISMS, EXTERNAL) if tls_user else DEFAULT_MECHANISMS,
            external_user=tls_user or "",
            publish_runs=True,  # a publisher's repeated publishes checked and routed once (_publish_run)
            **(
                {"max_message_size_bytes": message_bytes_max(settings.frame_max, CLUSTER_READ_SIZE_BYTES)}
                if settings.clustered
                else {}
            ),
        )
        self.channels: dict[int, Channel] = {}
        # Channels the client closed whose close-ok waits for their confirms (Confirms sends it
        # after the last of them): RabbitMQ sends a channel's confirms before its close-ok, and a
        # client that closes right after publishing must not get them on a channel it forgot.
        self.closing_channels: dict[int, Channel] = {}
        # basic.cancel of consumers whose queue went, written by the writer: after the reply of
        # the method that removed the queue (queue.delete-ok first, as RabbitMQ orders them).
        self.cancels: list[tuple[Channel, str]] = []
        self.pending: dict[tuple, list] = {}  # queue key -> messages routed in this read
        # queue key -> [(position in its pending batch, (channel number, confirm seq))]: kept beside
        # the batch for publishes awaiting a confirm, to nack those a reject-publish queue refuses
        self.pending_refs: dict[tuple, list] = {}
        # queue key -> [(position in its pending batch, dedup key, TTL ms or None)]: the publishes
        # with an x-deduplication-header (machines/dedup.py), for the Enqueue's `dedup`
        self.pending_dedup: dict[tuple, list] = {}
        # queue key -> [(position, transaction id, timeout ms, checks max)]: the half messages
        # (server/transactions.py), for the Enqueue's `txn`; and the ResolveTxn entries a
        # transaction's decision waits for before its confirm; the ids this connection published
        # halves for (bounded).
        self.pending_txn: dict[tuple, list] = {}
        self.pending_entries: list = []
        self.txn_ids: dict[str, None] = {}
        # queue key -> [(position in its pending batch, channel number, confirm mode, routed queue
        # names)]: the publishes to queues with x-trace (tracer.py), for the Enqueue's `trace`
        self.pending_trace: dict[tuple, list] = {}
        self.pending_confirms: dict[Channel, list] = {}
        self.pending_settles: dict[tuple, list] = {}  # (command type, queue key, consumer id) -> seqs
        self._persistent_props: dict[bytes, bool] = {}  # see route_publish
        self._trace_templates: dict[bytes, tuple[bytes, bytes] | None] = {}  # see _with_trace_id
        self._trace_numbers = False  # the trace_numbers feature seen enabled (_with_trace_id)
        self._trace_template: tuple[bytes, bytes] | None = None  # the last one _with_trace_id used
        self.credit_pending: dict[str, list] = {}  # consumer id -> [handle, deliveries written]
        self.holding: dict = {}  # channels with a method waiting for a commit: their frames queue up
        self.read_at = 0.0  # (trio time) of the last read from the client
        self.client_properties: dict = {}
        self.started_at = trio.current_time()
        self.finished = False
        self._released = False
        self._wake = trio.Event()
        self._cancel_scope: trio.CancelScope | None = None
        self._reader_scope = trio.CancelScope()  # see tick: ends the reading, not the writing
        self._next_tick_at = 0.0
        self._closed_seen_at: float | None = None
        self._handshake_deadline = self.started_at + getattr(settings, "handshake_timeout_s", HANDSHAKE_TIMEOUT_S)
        # A login or connection.open that waits for a metadata barrier (`_decide_after_barrier`):
        # set once decided; nothing more is read meanwhile.
        self._decided: trio.Event | None = None
        # The writer ended (`_writer_done` made only by a `run` that waits for it: two events
        # made up front were ~430 bytes of each connection's memory).
        self._writer_ended = False
        self._writer_done: trio.Event | None = None
        self._peer_closed = False  # the peer's EOF (or a reset) was read
        self.messages_in = 0
        self.messages_routed = 0  # of messages_in, routed to at least one queue (or a direct reply-to requester)
        # Per exchange name (of this connection's vhost): published to it, and of those routed.
        # A connection mostly publishes to one exchange after another, so the hot path counts a
        # run of publishes to one exchange (a string compare and an increment, ~30 ns) and a
        # change of exchange files the run in `exchange_counts` (`exchange_totals` adds both).
        self.run_exchange = ""  # (a run of 0 publishes counts for no exchange)
        self.run_in = self.run_out = 0
        self.exchange_counts: dict[str, list[int]] = {}  # name -> [published, routed], past runs
        # On the socket: bytes and reads read, bytes and writes written (RabbitMQ's recv_oct, ...).
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0
        self.messages_out = 0
        self._sending_bytes = 0  # what the writer's send_all holds now
        self._drained: trio.Event | None = None  # set by the writer after a send, for `_output_wait`
        self.output_pauses = 0  # times reading stopped for unread output
        self.publish_resume_at = 0.0  # x-publish-rate-limit: not read before this (publish_rates.py)

    # -------------------------------------------------------------- auth

    def _authenticate(self, mechanism: str, username: str, password: str, synced: bool = False) -> bool | Later:
        user = self.broker.meta.users.get(username)
        # (the hash is compared in constant time: a refusal's timing says nothing of the password)
        if user is None or not user.password_matches(password):
            if not synced and self.broker.log.metadata_may_lag():
                # A user added, or a password changed, through another member a moment ago.
                return self._decide_after_barrier(
                    lambda: self.conn.decide_login(self._authenticate(mechanism, username, password, True) is True)
                )
            log.warning(
                "connection %s from %s: login refused for user %r (%s)", self.id, self.peer_host, username, mechanism
            )
            return False
        if username == "guest" and not is_loopback(self.peer_host):
            # As RabbitMQ's loopback_users: guest may only connect from localhost.
            log.warning("connection %s: user 'guest' can only connect via localhost (peer %s)", self.id, self.peer_host)
            return False
        return True

    def channel_name(self, number: int) -> str:
        """How the management API and /metrics name a channel: RabbitMQ appends its number to
        the connection's name."""
        return f"{self.id} ({number})"

    def force_close(self, reason: str) -> None:
        """Close the connection from the server's side (320 CONNECTION_FORCED)."""
        self.conn.close(spec.CONNECTION_FORCED, reason, now=trio.current_time())
        self.wake()

    def _decide_after_barrier(self, decide) -> Later:
        """A login or connection.open refused by what this cluster member has applied: decided
        again, by `decide()`, once a metadata barrier proposed now is applied here (what a client
        was told was committed through another member is then here too: server/metadata_sync.py).
        Only a refusal waits; nothing more is read from the client meanwhile."""
        decided = self._decided = trio.Event()

        def again(_proposed_at: float) -> None:
            self._decided = None
            decided.set()
            if self.finished:
                return
            try:
                decide()
                self.handle_events(self.conn.next_events())
            except Exception:  # a bug of ours: this connection ends, never the node
                log.exception("connection %s: internal error deciding its login or open", self.id)
                self.conn.close(spec.INTERNAL_ERROR, "internal error", now=trio.current_time())
            self.wake()

        def ask() -> None:
            try:
                self.broker.log.after_metadata_barrier(again)
            except Exception:  # (a run_sync_soon callback must not raise: it would end the node)
                log.exception("connection %s: a metadata barrier could not be asked for", self.id)
                again(-math.inf)

        # (asked once this call has returned LATER: a barrier that fails at once, on a node
        # stopping, calls back at once, and the decision would come before the wait it ends)
        trio.lowlevel.current_trio_token().run_sync_soon(ask)
        return LATER

    def _vhost_refusal(self, username: str, vhost: str) -> str | Later | None:
        v = self.broker.meta.vhosts.get(vhost)
        if (v is None or username not in v.permissions) and self.broker.log.metadata_may_lag():
            # A vhost or the user's permissions in it made through another member a moment ago.
            return self._decide_after_barrier(lambda: self.conn.decide_open(self._vhost_refusal_now(username, vhost)))
        return self._vhost_refusal_now(username, vhost)

    def _vhost_refusal_now(self, username: str, vhost: str) -> str | None:
        sessions = self.broker.sessions.values()
        limit = getattr(self.settings, "max_connections", 0)
        if limit and len(sessions) >= limit:
            return f"connection refused: node connection limit ({limit}) is reached"  # rabbit_reader
        return vhost_refusal(self.broker.meta, username, vhost, lambda match: sum(1 for s in sessions if match(s)))

    def _channel_refusal(self) -> str | None:
        user = self.broker.meta.users.get(self.user)
        limit = user.limits.get("max-channels") if user is not None else None
        if limit is None:
            return None
        opened = sum(len(s.channels) for s in self.broker.sessions.values() if s.user == self.user)
        if opened >= limit:
            return (
                f"number of channels opened for user '{self.user}' has reached the maximum allowed user limit "
                f"of ({limit})"
            )
        return None

    # ------------------------------------------------------------- tasks

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                self._cancel_scope = nursery.cancel_scope
                self.broker.live_sessions[self] = None  # ticked by `tick_sessions`
                try:
                    with self._reader_scope:
                        await self._reader()
                finally:
                    self.finished = True
                    self._release()
                    self.wake()
                    # Give the writer a moment to send the last frames (close-ok, close).
                    if not self._writer_ended:
                        self._writer_done = trio.Event()
                        with trio.move_on_after(1.0):
                            await self._writer_done.wait()
                    if self._writer_ended and not self._peer_closed:
                        await self._linger()
                    nursery.cancel_scope.cancel()
        finally:
            self.broker.live_sessions.pop(self, None)
            self._release()
            with trio.move_on_after(0.5) as scope:
                scope.shield = True
                try:
                    await self.stream.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass

    async def _reader(self) -> None:
        conn = self.conn
        receive_some = self.stream.receive_some
        alarms = self.broker.alarms
        log_ = self.broker.log
        read_bytes_max = self.read_bytes_max
        read_bytes = read_bytes_max
        while not self.finished:
            if self._decided is not None:
                await self._decided.wait()
            if alarms is not None and alarms.active and (self.messages_in or self._streaming_a_big_body()):
                await self._blocked(alarms)
            if log_.flow_blocked and self.messages_in:
                await self._flow_wait(log_)
            if conn.pending_output_bytes + self._sending_bytes > OUTPUT_BYTES_MAX:
                await self._output_wait()
            if self.publish_resume_at:
                await self._publish_rate_wait()
            try:
                data = await receive_some(read_bytes)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self._peer_closed = True
            self.recv_oct += len(data)
            self.recv_cnt += 1
            published_before = self.messages_in
            self.read_at = trio.current_time()
            conn.receive_data(data, self.read_at)
            rest = self.handle_events(conn.next_events(), bounded=True)
            # (bounded in count: each turn performs at least one event of the read)
            while rest and not self.finished and conn.state is State.OPEN:
                self.wake()
                await self._output_wait()
                rest = self.handle_events(rest, bounded=True)
            if self.messages_in != published_before:
                read_bytes = next_read_bytes(len(data), self.messages_in - published_before, read_bytes_max)
            self.wake()
            self.send_soon()
            self.broker.send_queued()
            if conn.state is State.CLOSED:
                break

    async def _linger(self) -> None:
        """We close while the peer may still be sending. A socket closed with unread input makes
        the kernel send RST, which throws away what it had not yet delivered of our last frames,
        the connection.close that says why among them (fuzz seed 24, case 7117). So first say we
        are done (FIN after the last byte), then read and drop what still comes until the peer
        closes too, bounded in time and bytes (RabbitMQ's reader likewise waits for close-ok
        after it closes a connection). TLS has no half-close: its streams skip this."""
        send_eof = getattr(self.stream, "send_eof", None)
        if send_eof is None:
            return
        dropped_bytes = 0
        with trio.move_on_after(LINGER_S):
            try:
                await send_eof()
                while dropped_bytes < LINGER_BYTES_MAX:
                    data = await self.stream.receive_some(READ_SIZE_BYTES)
                    if not data:
                        return
                    dropped_bytes += len(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, trio.BusyResourceError, OSError):
                return

    async def _publish_rate_wait(self) -> None:
        """Published over a queue's x-publish-rate-limit: not read until its bucket allows (TCP
        slows the publisher; nothing is refused or dropped)."""
        while not self.finished and self.conn.state is State.OPEN:
            wait_s = self.publish_resume_at - trio.current_time()
            if wait_s <= 0:
                break
            self.conn.note_peer_alive(trio.current_time())  # we are the ones not reading
            await trio.sleep(min(wait_s, 1.0))
        self.publish_resume_at = 0.0

    def _publish_rate(self, vhost: str, queues: list[str]) -> None:
        rates = self.broker.publish_rates
        now_s = trio.current_time()
        for name in queues:
            wait_s = rates.take((vhost, name), 1, now_s)
            if wait_s and now_s + wait_s > self.publish_resume_at:
                self.publish_resume_at = now_s + wait_s

    async def _flow_wait(self, log_) -> None:
        """This node has too much proposed and not committed (ClusterLog.flow_bytes): a
        publishing connection is not read until that drains, so TCP slows its publisher down
        (RabbitMQ's credit flow; no connection.blocked, which is for resource alarms)."""
        while log_.flow_blocked and not self.finished and self.conn.state is State.OPEN:
            # Unread heartbeats must not count against the client while we are the ones not reading.
            self.conn.note_peer_alive(trio.current_time())
            with trio.move_on_after(1.0):
                await log_.flow_room.wait()

    def _streaming_a_big_body(self) -> bool:
        """During an alarm a connection that has not completed a publish is still stopped once a
        message it is sending holds PARTIAL_BODY_BLOCK_BYTES: a body that never ends would
        otherwise be read whole. (A small message split over reads still completes.)"""
        return self.conn.content_bytes_in_progress > PARTIAL_BODY_BLOCK_BYTES

    async def _output_wait(self) -> None:
        """The peer leaves more than OUTPUT_BYTES_MAX of replies unread: read nothing more from
        it until the writer got all but OUTPUT_BYTES_RESUME of it out."""
        self.output_pauses += 1
        conn = self.conn
        while (
            conn.pending_output_bytes + self._sending_bytes > OUTPUT_BYTES_RESUME
            and not self.finished
            and conn.state is State.OPEN
        ):
            # We are the ones not reading: unread heartbeats must not count against the peer.
            conn.note_peer_alive(trio.current_time())
            self.wake()
            self._drained = drained = trio.Event()
            with trio.move_on_after(1.0):
                await drained.wait()
            self._drained = None

    async def _blocked(self, alarms) -> None:
        """A resource alarm is on and this connection publishes: stop reading it until it clears."""
        notify = bool(self.conn.client_capabilities.get("connection.blocked"))
        if notify:
            reason = "low on memory" if alarms.memory_alarm else "low on disk"
            self.conn.send_method(0, spec.ConnectionBlocked(reason=reason))
            self.wake()
        # Stop waiting when we close the connection ourselves (shutdown): its close-ok must be read.
        while alarms.active and not self.finished and self.conn.state is State.OPEN:
            # Unread heartbeats must not count against the client while we are the ones not reading.
            self.conn.note_peer_alive(trio.current_time())
            with trio.move_on_after(1.0):
                await alarms.cleared.wait()
        if notify and not alarms.active:
            self.conn.send_method(0, spec.ConnectionUnblocked())
            self.wake()

    async def _writer(self) -> None:
        conn = self.conn
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                if self.cancels:
                    self._write_cancels()
                data = conn.data_to_send(trio.current_time())
                if data:
                    self._sending_bytes = len(data)
                    try:
                        await self.stream.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        self.finished = True
                        break
                    finally:
                        self._sending_bytes = 0
                    self.send_oct += len(data)
                    self.send_cnt += 1
                    if self._drained is not None:
                        self._drained.set()
                if self.credit_pending:
                    self._refill_credit()
                if self.finished and conn.state is State.CLOSED and not conn._out:
                    break
        finally:
            self._writer_ended = True
            if self._writer_done is not None:
                self._writer_done.set()

    def tick(self, now: float) -> None:
        """Heartbeats and the handshake timeout; called by the node's one ticker (`tick_sessions`)."""
        if now < self._next_tick_at or self._cancel_scope is None:
            return
        conn = self.conn
        # Often enough to send a heartbeat within a quarter of the interval.
        self._next_tick_at = now + (TICK_INTERVAL_S if conn.heartbeat_s <= 2 else 1.0)
        if conn.state not in (State.OPEN, State.CLOSING, State.CLOSED) and now >= self._handshake_deadline:
            # RabbitMQ's handshake_timeout: the socket just closes.
            log.info("connection %s from %s: handshake timeout (state %s)", self.id, self.peer_host, conn.state.value)
            self.finished = True
            self._cancel_scope.cancel()
            return
        if conn.state is State.CLOSED:
            # Closed by a close handshake that the reader saw: `run` lets the writer send the
            # last frames (close-ok) and ends the connection. Cancelling here could cut the
            # close-ok off (the client then sees EOF instead); only a stuck one is cut.
            if self._closed_seen_at is None:
                self._closed_seen_at = now
            if now - self._closed_seen_at < CLOSED_GRACE_S:
                return
        if not conn.tick(now):
            # Our close waited too long for its close-ok, or the peer's heartbeats stopped. Only
            # the reading ends here: `run` still lets the writer finish what is queued (our
            # connection.close among it) within its bound. Cancelling everything cut that off
            # mid-frame from a peer that was slow to read (fuzz seed 24, case 7117).
            self.handle_events(conn.next_events())
            self.finished = True
            self._reader_scope.cancel()
            return
        self.wake()

    def wake(self) -> None:
        self._wake.set()

    def send_soon(self) -> None:
        """Output was written for this connection: sent at the end of this pass of the loop
        (`Broker.send_queued`: a read's, a committed batch's, an fsync's outcome)."""
        if not self._send_queued and self._plain:
            self._send_queued = True
            self.broker.send_now.append(self)

    def send_now(self) -> None:
        """Send what is queued straight from the socket, if the writer is not sending (it
        would be the next in order): a task switch sooner at low rates; what the socket does not
        take goes back first in line for the writer, which is woken for it and the credit."""
        self._send_queued = False
        if self._sending_bytes or self.finished:
            return
        # (asked each time: -1 once the socket is closed, never a number reused by another)
        fd = self.stream.socket.fileno()
        if fd < 0:
            return
        data = self.conn.data_to_send(trio.current_time())
        if not data:
            return
        try:
            sent = os.write(fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = 0  # (the writer meets the error again and ends the connection)
        if sent < len(data):
            self.conn.unsent(data[sent:])
            self.wake()
        if sent:
            self.send_oct += sent
            self.send_cnt += 1
            if self._drained is not None:
                self._drained.set()

    def cancel_later(self, channel: Channel, consumer_tag: str) -> None:
        """Tell the client its consumer is gone (consumer_cancel_notify), once the replies that
        are due now are written: a queue removed by this connection's own queue.delete (or the
        cancel that auto-deleted it) answers that method before the consumers' basic.cancel."""
        self.cancels.append((channel, consumer_tag))
        self.wake()

    def _write_cancels(self) -> None:
        kept = []
        for channel, tag in self.cancels:
            if self.channels.get(channel.number) is not channel:
                continue  # closed since (its number may be another channel's now): nothing to tell
            if channel in self.holding:
                # It waits for a commit (in a cluster, its queue.delete: the shard removes the
                # queue before the reply is due); the cancel follows that reply (`continuation`).
                kept.append((channel, tag))
            else:
                self.conn.send_method(channel.number, spec.BasicCancel(consumer_tag=tag, no_wait=True))
        self.cancels = kept

    # ------------------------------------------------------------ events

    def handle_events(self, events: list, bounded: bool = False) -> list:
        """Perform `events` in order. `bounded` (the reader's own read): stop after a method
        whose replies took the unsent output past OUTPUT_BYTES_MAX, and return the events not
        performed yet (the reader waits for the peer to read, then goes on with them)."""
        channels = self.channels
        holding = self.holding
        conn = self.conn
        for i, event in enumerate(events):
            kind = type(event)
            if holding:  # (only in a cluster; a single node answers at once)
                channel = channels.get(getattr(event, "channel", 0))
                if channel is not None and channel in holding:
                    channel.backlog.append(event)  # behind a method that waits for a commit
                    channel.backlog_read_at = self.read_at  # (or earlier: a frame of the backlog again)
                    continue
            if kind is PublishesReceived or kind is ContentReceived:
                channel = channels.get(event.channel)
                if channel is None:
                    continue
                try:
                    if kind is PublishesReceived:
                        self._publish_run(channel, event.method, event.props_raw, event.bodies)
                    else:
                        channel.publish(event.method, event.props_raw, event.body)
                        self.messages_in += 1
                except MetadataBehind:
                    self._after_metadata_barrier(channel, event)
                except ChannelError as err:
                    self._fail(channel, err, event.method)
                except AMQPError as err:  # the codec refused something decoded lazily (properties)
                    self._fail(channel, HardError(err.reply_code, err.reply_text), event.method)
                except Exception:
                    log.exception("connection %s: internal error performing basic.publish", self.id)
                    self._fail(
                        channel, HardError(spec.INTERNAL_ERROR, "internal error performing basic.publish"), event.method
                    )
                continue
            if kind is MethodReceived and type(event.method) in COALESCED_METHODS:
                pass  # acks gather until the end of the read, like publishes
            elif self.pending or self.pending_confirms or self.pending_settles:
                self.flush_publishes()
            if kind is MethodReceived:
                channel = channels.get(event.channel)
                if channel is None:
                    continue
                try:
                    channel.waiting_method = event.method
                    channel.handle(event.method)
                except MetadataBehind:
                    self._after_metadata_barrier(channel, event)
                except ChannelError as err:
                    self._fail(channel, err, event.method)
                except AMQPError as err:
                    self._fail(channel, HardError(err.reply_code, err.reply_text), event.method)
                except Exception:
                    # A bug in the broker: log it, and close this connection as RabbitMQ does
                    # when a channel process crashes (541), never the node.
                    log.exception("connection %s: internal error performing %s", self.id, event.method.NAME)
                    self._fail(
                        channel,
                        HardError(spec.INTERNAL_ERROR, f"internal error performing {event.method.NAME}"),
                        event.method,
                    )
                if bounded and conn.pending_output_bytes > OUTPUT_BYTES_MAX and i + 1 < len(events):
                    if self.pending or self.pending_confirms or self.pending_settles:
                        self.flush_publishes()
                    return events[i + 1 :]
            elif kind is ChannelOpened:
                channels[event.channel] = Channel(self, event.channel)
                self.broker.channels_opened += 1
            elif kind is ChannelClosed:
                channel = channels.pop(event.channel, None)
                if channel is not None:
                    channel.close()
                    if self.broker.log.confirms.waits.get(channel):
                        self.closing_channels[event.channel] = channel
                        continue
                self.conn.finish_peer_close(event.channel)  # (a no-op when we closed it)
            elif kind is ConnectionOpened:
                self.vhost = event.vhost
                self.user = event.user
                self.authorization = Authorization(self.broker, event.user, event.vhost)
                self.client_properties = event.client_properties
                self.broker.sessions[self.id] = self
                self.broker.connections_opened += 1
                if not self.broker.log.quorum_ok:
                    self.conn.close(
                        spec.CONNECTION_FORCED,
                        "this node is cut off from the cluster majority; connect to another node",
                        now=trio.current_time(),
                    )
                elif self.broker.node_id in self.broker.meta.draining:  # (maxqctl drain: watchdog.py)
                    self.conn.close(spec.CONNECTION_FORCED, DRAINING_TEXT, now=trio.current_time())
                log.debug(
                    "connection %s from %s opened (user %s, vhost %s)", self.id, self.peer_host, event.user, event.vhost
                )
            elif kind is ConnectionClosed:
                self.finished = True
                # A peer's own close is routine whatever its code (py-amqp sends 0); ours and
                # a peer's error codes are worth a line.
                if not event.by_peer or event.reply_code >= 300 and event.reply_code != spec.CONNECTION_FORCED:
                    log.info(
                        "connection %s from %s closed: %s %s",
                        self.id,
                        self.peer_host,
                        event.reply_code,
                        event.reply_text,
                    )
        if self.pending or self.pending_confirms or self.pending_settles:
            self.flush_publishes()
        return []

    def _fail(self, channel: Channel, err: ChannelError, method) -> None:
        if self.pending or self.pending_confirms or self.pending_settles:
            self.flush_publishes()
        class_id, method_id = method.CLASS_ID, method.METHOD_ID
        if isinstance(err, HardError):
            log.info("connection %s: %s %s", self.id, err.reply_code, err.reply_text)
            self.conn.close(err.reply_code, err.reply_text, class_id, method_id, now=trio.current_time())
            self._release()
            return
        # Release the channel's consumers and deliveries now, not at the peer's close-ok:
        # deliveries written to a closing channel would be dropped by the protocol object.
        self.channels.pop(channel.number, None)
        self.pending_confirms.pop(channel, None)
        channel.close()
        self.conn.close_channel(channel.number, err.reply_code, err.reply_text, class_id, method_id)

    # ----------------------------------------------------------- publish

    def _publish_run(self, channel: Channel, method, props_raw: bytes, bodies: list[bytes]) -> None:
        """basic.publish of each of `bodies` in order, with the same method and properties
        (PublishesReceived): the first goes the whole way; when it gives a plan (a plain publish:
        `route_publish`), the rest are routed by it, checked and looked up once for the run."""
        plan = channel.publish(method, props_raw, bodies[0])
        self.messages_in += 1
        if len(bodies) == 1:
            return
        if plan is not None:
            rest = bodies[1:]
            channel.publish_again(plan, method, rest)
            self.messages_in += len(rest)
            return
        for i in range(1, len(bodies)):
            try:
                channel.publish(method, props_raw, bodies[i])
            except MetadataBehind:  # (the route is the first's: not expected after it)
                self._after_metadata_barrier(channel, PublishesReceived(channel.number, method, props_raw, bodies[i:]))
                return
            self.messages_in += 1

    # ------------------------------------------------------- metadata barrier

    def metadata_current(self, channel: Channel) -> None:
        """Raise MetadataBehind where a lookup found nothing and this member's metadata may be
        behind what the client saw committed elsewhere (server/metadata_sync.py): unless the
        method runs again after a barrier already."""
        if not channel.metadata_synced and self.broker.log.metadata_may_lag():
            raise MetadataBehind

    def _after_metadata_barrier(self, channel: Channel, event) -> None:
        """Hold `channel` (its later frames wait behind) and perform `event` again once a metadata
        barrier proposed now is applied here; the frames held behind it meanwhile that were read
        before the barrier was proposed go on without another (it covers them too)."""

        def again(proposed_at: float) -> None:
            self.holding.pop(channel, None)  # (`event` goes first, ahead of the backlog)
            channel.metadata_synced = True
            try:
                self.handle_events([event])
                if channel.backlog and not channel.waiting and channel.backlog_read_at <= proposed_at:
                    backlog, channel.backlog = channel.backlog, []
                    self.handle_events(backlog)
            finally:
                channel.metadata_synced = False

        resume = self.continuation(channel, again)
        self.broker.log.after_metadata_barrier(resume)

    def routes_nowhere(self, method, props_raw: bytes) -> bool:
        """Whether a publish would find no exchange or no queue (a transaction's check before it
        routes its publishes: Channel.tx_commit)."""
        exchange, routing_key = method.exchange, method.routing_key
        if exchange == TXN_EXCHANGE or not exchange and routing_key.startswith(REPLY_TO_PREFIX):
            return False
        meta = self.broker.meta
        if exchange and meta.exchange(self.vhost, exchange) is None:
            return True
        flags = (props_raw[0] << 8 | props_raw[1]) if len(props_raw) >= 2 else 0
        headers = (lambda: decode_properties(props_raw).headers) if flags & HEADERS_FLAG else None
        return not meta.route(self.vhost, exchange, routing_key, headers)

    def route_publish(
        self, channel: Channel, seq: int | None, method, props_raw: bytes, body: bytes
    ) -> PublishPlan | None:
        """Check, route and queue one publish (sent at the end of the read: `flush_publishes`).
        A plain one (no headers, no publish rate limit, routed somewhere; if traced, with the
        broker's numbered id) returns its plan: another publish of the same method and
        properties would be checked, routed and made into messages just the same
        (`route_again`)."""
        broker = self.broker
        vhost = self.vhost
        exchange = method.exchange
        routing_key = method.routing_key
        flags = (props_raw[0] << 8 | props_raw[1]) if len(props_raw) >= 2 else 0
        meta = broker.meta
        self.authorization.check_publish(meta, exchange)  # before the lookup, as RabbitMQ
        if exchange == TXN_EXCHANGE:  # a transaction's decision: no exchange object (transactions.py)
            decide_publish(self, channel, seq, method, props_raw)
            return None
        dedup_scope = None  # an x-message-deduplication exchange's window (machines/dedup.py)
        if exchange:
            record = meta.exchange(vhost, exchange)
            if record is None:
                self.metadata_current(channel)
                raise ChannelError(spec.NOT_FOUND, f"no exchange '{exchange}' in vhost '{vhost}'")
            if record.internal:
                raise ChannelError(
                    spec.ACCESS_REFUSED, f"cannot publish to internal exchange '{exchange}' in vhost '{vhost}'"
                )
            if record.routing_type == "topic":
                self.authorization.check_topic("write", exchange, routing_key)
            elif record.type == DEDUP_EXCHANGE_TYPE:
                dedup_scope = exchange_scope(exchange, record.arguments)
        if flags & (REPLY_TO_FLAG | USER_ID_FLAG):
            if flags & USER_ID_FLAG:
                user_id = decode_properties(props_raw).user_id
                if user_id is not None and user_id != self.user:
                    raise ChannelError(
                        spec.PRECONDITION_FAILED,
                        f"user_id property set to '{user_id}' but authenticated user was '{self.user}'",
                    )
            if flags & REPLY_TO_FLAG and REPLY_TO_QUEUE.encode() in props_raw:
                props_raw = channel.rewrite_reply_to(props_raw)
        if exchange != self.run_exchange:  # (per-exchange rates, message_rates.py: see `exchange_totals`)
            self._next_run(exchange)
        self.run_in += 1
        if not exchange and routing_key.startswith(REPLY_TO_PREFIX):
            key = routing_key[len(REPLY_TO_PREFIX) :]
            target = broker.reply_to.get(key)
            if target is not None:
                target.deliver_reply(exchange, routing_key, props_raw, body)
                self.messages_routed += 1
                self.run_out += 1
            elif broker.log.reply_elsewhere(key, exchange, routing_key, props_raw, body):
                # the requester is connected to another member: the reply travels through a shard
                self.messages_routed += 1
                self.run_out += 1
            elif method.mandatory:
                self._return(channel, method, props_raw, body)
            else:
                broker.messages_unroutable_dropped += 1
            if seq is not None:
                self.pending_confirms.setdefault(channel, []).append(seq)
            return None
        if flags & EXTRAS_FLAGS or flags & HEADERS_FLAG and wants_extras(flags, props_raw):  # one bit test for most
            ttl_ms, priority, delay_ms = publish_extras(props_raw)
        else:
            ttl_ms, priority, delay_ms = None, 0, None
        headers = (lambda: decode_properties(props_raw).headers) if flags & HEADERS_FLAG else None
        txn = half_fields(flags, props_raw, broker, vhost) if flags & HEADERS_FLAG else None
        queues = meta.route(vhost, exchange, routing_key, headers)
        if queues:
            if broker.publish_rates.limits:  # (empty unless a queue has x-publish-rate-limit)
                self._publish_rate(vhost, queues)
            self.messages_routed += 1  # (per message: measured in docs/operations.md, Prometheus)
            self.run_out += 1
            pending = self.pending
            persistent = self._persistent_props.get(props_raw)
            if persistent is None:
                # Decoded in full once per distinct property list (the cache): one that does not
                # decode is refused here, at publish, as RabbitMQ does (502, connection closed),
                # never stored for a dead-lettering or a delivery to trip over later.
                persistent = decode_properties(props_raw).delivery_mode == 2
                if len(props_raw) <= PROPS_CACHED_BYTES_MAX:
                    if len(self._persistent_props) >= PROPS_CACHED_MAX:
                        self._persistent_props.clear()
                    self._persistent_props[props_raw] = persistent
            traced = None
            trace_number = None
            plain_props = props_raw
            if broker.tracer.publishing:  # (empty unless a queue has x-trace)
                traced = broker.tracer.publishing
                if (
                    len(queues) == 1
                    and (vhost, queues[0]) in traced
                    or len(queues) > 1
                    and self._traces_one(vhost, queues)
                ):
                    props_raw, trace_number = self._with_trace_id(props_raw)
                else:
                    traced = None
            # (the channel's number, not the channel: a queued message must not keep it alive)
            ref = None if seq is None else (channel.number, seq)
            dedup: tuple | None = dedup_fields(flags, props_raw) if flags & HEADERS_FLAG else None
            if dedup is not None and dedup_scope is not None:
                dedup = (*dedup, *dedup_scope)
            for name in queues:
                key = (vhost, name)
                message = Message(exchange, routing_key, props_raw, body, persistent, ttl_ms, priority, delay_ms)
                batch = pending.get(key)
                if batch is None:
                    batch = pending[key] = [message]
                else:
                    batch.append(message)
                if ref is not None:
                    refs = self.pending_refs.get(key)
                    if refs is None:
                        self.pending_refs[key] = [(len(batch) - 1, ref)]
                    else:
                        refs.append((len(batch) - 1, ref))
                if dedup is not None:
                    self.pending_dedup.setdefault(key, []).append((len(batch) - 1, *dedup))
                if txn is not None:
                    self.pending_txn.setdefault(key, []).append((len(batch) - 1, *txn))
                if traced is not None and key in traced:
                    self._note_traced(
                        key, len(batch) - 1, channel.number, seq is not None, queues, trace_number, message
                    )
            if txn is not None:
                note_half(self, txn[0])
            if flags & HEADERS_FLAG or broker.publish_rates.limits:
                plan = None
            elif traced is None:
                plan = PublishPlan(queues, props_raw, persistent, ttl_ms, priority, delay_ms, None)
            elif trace_number is not None:  # (its id from the template, numbered: the others' in a row)
                plan = PublishPlan(queues, plain_props, persistent, ttl_ms, priority, delay_ms, self._trace_template)
            else:
                plan = None
        elif not channel.metadata_synced and broker.log.metadata_may_lag():
            self.run_in -= 1  # (counted again when it runs after the barrier)
            raise MetadataBehind
        elif method.mandatory:
            self._return(channel, method, props_raw, body)
            plan = None
        else:
            broker.messages_unroutable_dropped += 1
            plan = None
        if seq is not None:
            confirms = self.pending_confirms.get(channel)
            if confirms is None:
                self.pending_confirms[channel] = [seq]
            else:
                confirms.append(seq)
        return plan

    def route_again(self, channel: Channel, first_seq: int | None, plan: PublishPlan, method, bodies: list) -> None:
        """Publish `bodies` as the publish that gave `plan` (same channel, method and properties,
        right after it): to the same queues, as the same kind of message, with the publish seqs
        `first_seq`, +1, ... when the channel confirms."""
        count = len(bodies)
        self.messages_routed += count
        self.run_in += count  # (the exchange's run: the first publish of the plan started it)
        self.run_out += count
        exchange, routing_key = method.exchange, method.routing_key
        queues, props_raw, persistent, ttl_ms, priority, delay_ms, trace_template = plan
        pending = self.pending
        vhost = self.vhost
        if trace_template is None:
            messages_props = None
            first_number = None
        else:  # each its own id, numbered in a row (as _with_trace_id would, one by one)
            head, tail = trace_template
            first_number = _take_trace_numbers(count)
            if first_number + count <= _TRACE_NUMBER_END:
                messages_props = _numbered(head, first_number, count, tail)
            else:  # (past 10**12 on this node: no id, as _with_trace_id)
                messages_props, first_number = [props_raw] * count, None
            traced = self.broker.tracer.publishing
        for name in queues:
            key = (vhost, name)
            batch = pending.get(key)
            if batch is None:
                batch = pending[key] = []
            start = len(batch)
            if messages_props is None:
                batch.extend(
                    [
                        Message(exchange, routing_key, props_raw, body, persistent, ttl_ms, priority, delay_ms)
                        for body in bodies
                    ]
                )
            else:
                batch.extend(
                    [
                        Message(exchange, routing_key, traced_props, body, persistent, ttl_ms, priority, delay_ms)
                        for traced_props, body in zip(messages_props, bodies, strict=True)
                    ]
                )
                if key in traced:
                    self._trace_template = trace_template
                    self._note_traced(
                        key, start, channel.number, first_seq is not None, queues, first_number, batch[start], count
                    )
            if first_seq is not None:
                number = channel.number
                refs = self.pending_refs.get(key)
                if refs is None:
                    refs = self.pending_refs[key] = []
                refs.extend([(start + i, (number, first_seq + i)) for i in range(count)])
        if first_seq is not None:
            confirms = self.pending_confirms.get(channel)
            if confirms is None:
                confirms = self.pending_confirms[channel] = []
            confirms.extend(range(first_seq, first_seq + count))

    def _with_trace_id(self, props_raw: bytes) -> tuple[bytes, int | None]:
        """A message routed to a traced queue: an x-maxq-trace-id header unless it has a
        message id (tracer.py), from a template per distinct property list (as the cache above);
        and the header's number, which the Enqueue's trace context carries (so that the tracer
        need not read the id back from the properties)."""
        templates = self._trace_templates
        template = templates.get(props_raw, _NOT_CACHED)
        if template is _NOT_CACHED:
            template = trace_id_template(props_raw, self.id)
            if len(props_raw) <= PROPS_CACHED_BYTES_MAX:
                if len(templates) >= PROPS_CACHED_MAX:
                    templates.clear()
                templates[props_raw] = template
        if template is None:
            return props_raw, None
        self._trace_template = template  # (for _note_traced's runs)
        n = _take_trace_numbers(1)
        if n >= _TRACE_NUMBER_END:
            return props_raw, None
        traced = b"%b%012d%b" % (template[0], n, template[1])  # (with_trace_id, inlined: per publish)
        # The number only once every member decodes it; until then the tracer reads the header.
        # (An enabled feature stays enabled: asked of the metadata until it is.)
        if not self._trace_numbers:
            self._trace_numbers = TRACE_NUMBERS in self.broker.meta.features_enabled
            if not self._trace_numbers:
                return traced, None
        return traced, n

    def _note_traced(
        self,
        key: tuple[str, str],
        position: int,
        channel_number: int,
        confirm: bool,
        queues: list[str],
        trace_number: int | None,
        message: Message,
        count: int = 1,
    ) -> None:
        """Add a publish (or `count` in a row, numbered in a row, alike but for their bodies:
        `route_again`) to a traced queue to the Enqueue's trace context (commands.py): a
        publish with a trace number extends the queue's last run when it follows it in every way
        (position, number, channel, confirm mode, routed queues) and has the same exchange, routing
        key, delay and property template as its first (a run's items 6-9, dropped at the flush),
        so that the tracer records a run as a whole (tracer.py, `_enqueued`)."""
        publishes = self.pending_trace.get(key)
        if publishes is None:
            publishes = self.pending_trace[key] = []
        if trace_number is None:
            publishes.extend([[position + i, channel_number, confirm, queues] for i in range(count)])
            return
        if publishes:
            run = publishes[-1]
            run_count = run[5] if len(run) > 5 else 0
            if (
                run_count
                and run[0] + run_count == position
                and run[4] + run_count == trace_number
                and run[1] == channel_number
                and run[2] == confirm
                and run[6] == message.exchange
                and run[7] == message.routing_key
                and run[8] == message.delay_ms
                and run[9] is self._trace_template
                and run[3] == queues
            ):
                run[5] = run_count + count
                return
        publishes.append(
            [
                position,
                channel_number,
                confirm,
                queues,
                trace_number,
                count,
                message.exchange,
                message.routing_key,
                message.delay_ms,
                self._trace_template,
            ]
        )

    def _traces_one(self, vhost: str, queues: list[str]) -> bool:
        """Whether a queue a publish was routed to traces."""
        traced = self.broker.tracer.publishing
        return any((vhost, name) in traced for name in queues)

    def _return(self, channel: Channel, method, props_raw: bytes, body: bytes) -> None:
        self.broker.messages_unroutable_returned += 1
        self.conn.send_content(
            channel.number,
            spec.BasicReturn(
                reply_code=spec.NO_ROUTE,
                reply_text="NO_ROUTE",
                exchange=method.exchange,
                routing_key=method.routing_key,
            ),
            props_raw,
            body,
        )

    def defer_settles(self, kind, entries: list) -> None:
        settles = self.pending_settles
        for queue_key, consumer_id, seq in entries:
            key = (kind, queue_key, consumer_id)
            seqs = settles.get(key)
            if seqs is None:
                settles[key] = [seq]
            else:
                seqs.append(seq)

    def flush_settles(self) -> None:
        settles, self.pending_settles = self.pending_settles, {}
        queue_cast = self.broker.queue_cast
        acked = 0
        for (kind, queue_key, consumer_id), seqs in settles.items():
            queue_cast(queue_key, kind(consumer_id, seqs))
            if kind is qc.Settle:
                acked += len(seqs)
        self.broker.messages_acknowledged += acked

    def flush_publishes(self) -> dict:
        """Submit what this read gathered: acks first (they free prefetch room), then one Enqueue
        per queue; this read's confirms are sent once everything carrying its messages is durable
        (a nack if something could not be: confirms.py). Returns the queues enqueued to (keys of
        the dict returned; tx.commit waits for them)."""
        if self.pending_settles:
            self.flush_settles()
        pending, self.pending = self.pending, {}
        refs, self.pending_refs = self.pending_refs, {}
        dedups, self.pending_dedup = self.pending_dedup, {}
        txns, self.pending_txn = self.pending_txn, {}
        traces = self.pending_trace
        context = (self.user, self.id, self.peer_host)
        if traces:
            self.pending_trace = {}
        broker = self.broker
        log_ = broker.log
        pendings = {}
        batch = ConfirmBatch(0)

        def note_overflow(reply, queue_refs) -> None:  # a reject-publish queue refused some
            if type(reply) is Overflowed:
                batch.refused = note_refused(batch.refused, queue_refs, reply.rejected)

        for queue_key, messages in pending.items():
            queue = broker.queues.get(queue_key)
            then = None
            if self.pending_confirms and (
                (broker.overflow_of(queue_key) if queue is None else queue.settings.overflow) != "drop-head"
                or queue_key in txns
            ):
                then = partial(note_overflow, queue_refs=refs.get(queue_key))
            trace = traces.get(queue_key) if traces else None
            if trace is not None:  # (a run's last four items are the session's: see _note_traced)
                trace = [publish if len(publish) == 4 else publish[:_TRACE_RUN_ITEMS] for publish in trace]
            entry = log_.submit(
                queue_key,
                qc.Enqueue(
                    messages, dedups.get(queue_key), txns.get(queue_key), None if trace is None else (*context, trace)
                ),
                then,
            )
            pendings[id(entry)] = entry  # (a cluster puts several queues' commands in one entry)
            broker.messages_published += len(messages)
        if self.pending_entries:  # transaction decisions' resolves (transactions.py)
            for entry in self.pending_entries:
                pendings[id(entry)] = entry
            self.pending_entries = []
        if self.pending_confirms:
            confirms, self.pending_confirms = self.pending_confirms, {}
            broker.messages_received_confirm += sum(len(seqs) for seqs in confirms.values())
            log_.confirm_after(list(pendings.values()), list(confirms.items()), batch)
        return pending

    def continuation(self, channel: Channel, fn):
        """Wrap the rest of a channel method that waits for a commit: until it has run, the
        channel's later frames wait in its backlog, in order."""
        channel.waiting += 1
        self.holding[channel] = None

        def resume(reply) -> None:
            channel.waiting -= 1
            if self.finished or self.channels.get(channel.number) is not channel:
                if not channel.waiting:
                    self.holding.pop(channel, None)
                return  # the channel or connection went meanwhile; its cleanup released everything
            method = channel.waiting_method
            try:
                if type(reply) is Unavailable:
                    raise HardError(
                        spec.CONNECTION_FORCED,
                        f"cluster unavailable ({reply.reason}): this node cannot commit; reconnect to another node",
                    )
                fn(reply)
            except ChannelError as err:
                self._fail(channel, err, method)
            except AMQPError as err:
                self._fail(channel, HardError(err.reply_code, err.reply_text), method)
            except Exception:
                log.exception("connection %s: internal error completing %s", self.id, method.NAME)
                self._fail(channel, HardError(spec.INTERNAL_ERROR, f"internal error performing {method.NAME}"), method)
            if not channel.waiting:
                backlog, channel.backlog = channel.backlog, []
                self.holding.pop(channel, None)
                if backlog and not self.finished:
                    self.handle_events(backlog)  # a method in it may start waiting again
            if self.pending or self.pending_confirms or self.pending_settles:
                self.flush_publishes()
            self.wake()

        return resume

    # -------------------------------------------------------- deliveries

    def write_delivery(self, channel_number: int, handle, delivery_tag: int, redelivered: bool, message) -> None:
        # Encoded once per (exchange, routing key) for the node, not once per delivery.
        wire_routing = _wire_routing.get((message.exchange, message.routing_key))
        if wire_routing is None:
            wire_routing = wire_routing_of(message.exchange, message.routing_key)
        self.conn.send_raw(
            channel_number,
            encode_delivery(
                channel_number,
                handle.wire_tag,
                delivery_tag,
                redelivered,
                wire_routing,
                message.props_raw if not message.count_header else delivery_props(message),
                message.body,
                self.conn.frame_max,
            ),
        )
        self.messages_out += 1
        entry = self.credit_pending.get(handle.consumer_id)
        if entry is None:
            self.credit_pending[handle.consumer_id] = [handle, 1]
            self._wake.set()
            self.send_soon()
        else:
            entry[1] += 1

    def write_deliveries(self, channel_number: int, handle, first_delivery_tag: int, run: list) -> None:
        """`write_delivery` for a run of `Deliver` effects to one consumer (tags from
        `first_delivery_tag` on): one encoding and one write for the run (frames.encode_deliveries)."""
        deliveries: list[tuple[bytes, bytes, bytes, bool]] = []
        append = deliveries.append
        exchange = routing_key = None
        wire_routing = b""
        for _consumer_id, message, redelivered in run:
            if message.exchange is not exchange or message.routing_key is not routing_key:
                exchange, routing_key = message.exchange, message.routing_key
                wire_routing = _wire_routing.get((exchange, routing_key)) or wire_routing_of(exchange, routing_key)
            append(
                (
                    wire_routing,
                    message.props_raw if not message.count_header else delivery_props(message),
                    message.body,
                    redelivered,
                )
            )
        conn = self.conn
        conn.send_raw(
            channel_number,
            encode_deliveries(channel_number, handle.wire_tag, first_delivery_tag, deliveries, conn.frame_max),
        )
        written = len(run)
        self.messages_out += written
        entry = self.credit_pending.get(handle.consumer_id)
        if entry is None:
            self.credit_pending[handle.consumer_id] = [handle, written]
            self._wake.set()
            self.send_soon()
        else:
            entry[1] += written

    def _refill_credit(self) -> None:
        pending, self.credit_pending = self.credit_pending, {}
        broker = self.broker
        if self.credit_max == FLOW_CREDIT:  # (a single node: the credit comes back at once)
            for consumer_id, (handle, written) in pending.items():
                if consumer_id in broker.consumers:
                    broker.queue_cast(handle.queue_key, qc.Credit(consumer_id, written))
            return
        sent_bytes, delivered = self._credit_counted
        self._credit_counted = (self.send_oct, self.messages_out)
        target = credit_target(self.send_oct - sent_bytes, self.messages_out - delivered, self.credit_max)
        levels = self.credit_levels
        if len(levels) > CREDIT_LEVELS_KEPT_MAX:  # (consumers cancelled since: a bounded sweep)
            levels = self.credit_levels = {cid: n for cid, n in levels.items() if cid in broker.consumers}
        for consumer_id, (handle, written) in pending.items():
            if consumer_id not in broker.consumers:
                levels.pop(consumer_id, None)
                continue
            refill, levels[consumer_id] = credit_refill(levels.get(consumer_id, FLOW_CREDIT), written, target)
            if refill:
                broker.queue_cast(handle.queue_key, qc.Credit(consumer_id, refill))

    # ----------------------------------------------------------- cleanup

    def _next_run(self, exchange: str) -> None:
        if self.run_in:
            counts = self.exchange_counts.setdefault(self.run_exchange, [0, 0])
            counts[0] += self.run_in
            counts[1] += self.run_out
        self.run_exchange = exchange
        self.run_in = self.run_out = 0

    def exchange_totals(self) -> dict[str, tuple[int, int]]:
        """name -> (published, routed) on this connection so far."""
        totals = {name: (counts[0], counts[1]) for name, counts in self.exchange_counts.items()}
        if self.run_in:
            kept = totals.get(self.run_exchange, (0, 0))
            totals[self.run_exchange] = (kept[0] + self.run_in, kept[1] + self.run_out)
        return totals

    def forget_exchanges(self, names: set[str]) -> None:
        """These exchanges were deleted: their counts go (a churn of names does not pile up)."""
        if self.run_exchange in names:
            self.run_in = self.run_out = 0
        for name in names:
            self.exchange_counts.pop(name, None)

    def _release(self) -> None:
        """Give back everything the connection held; safe to call more than once."""
        if self._released:
            return
        self._released = True
        self.broker.sessions.pop(self.id, None)
        # Its per-message counters go to the node's (in the same step: a scrape sees them once).
        self.broker.messages_received_closed += self.messages_in
        self.broker.messages_routed_closed += self.messages_routed
        self.broker.add_exchange_counts(self.vhost, self.exchange_totals())
        # What was read in full is performed, as RabbitMQ does for a connection that goes away
        # (publishes enqueued, acks applied); only confirms have nowhere to go.
        try:
            self.flush_publishes()
        except ChannelError as err:
            log.warning("cleanup of connection %s: %s", self.id, err.reply_text)
        self.pending_confirms = {}
        queue_keys: dict[tuple, None] = {}
        for channel in self.channels.values():
            queue_keys.update(channel.queues_touched)
            channel.forget()
        self.channels.clear()
        try:
            self.broker.owner_down(self.id + "/", list(queue_keys), connection_id=self.id)
        except ChannelError as err:  # a refusal here must not take the node down
            log.warning("cleanup of connection %s: %s", self.id, err.reply_text)

    # ------------------------------------------------------------- EXTERNAL

    def _login(self, mechanism: str, username: str, password: str) -> bool | Later:
        if mechanism == EXTERNAL:
            return self._authenticate_external(username)
        return self._authenticate(mechanism, username, password)

    def _authenticate_external(self, username: str, synced: bool = False) -> bool | Later:
        """EXTERNAL (RabbitMQ's rabbit_auth_mechanism_ssl): TLS verified the client's
        certificate against --tls-ca, its CN is `username`; the login stands if that user exists
        (no password is checked), with guest still held to loopback."""
        if username not in self.broker.meta.users:
            if not synced and self.broker.log.metadata_may_lag():
                return self._decide_after_barrier(
                    lambda: self.conn.decide_login(self._authenticate_external(username, True) is True)
                )
            log.warning(
                "connection %s from %s: login refused for user %r (EXTERNAL: no such user)",
                self.id,
                self.peer_host,
                username,
            )
            return False
        if username == "guest" and not is_loopback(self.peer_host):
            log.warning("connection %s: user 'guest' can only connect via localhost (peer %s)", self.id, self.peer_host)
            return False
        return True


def is_loopback(host: str) -> bool:
    """RabbitMQ's rabbit_net:is_loopback: 127.0.0.0/8, ::1, and IPv4-mapped 127.x; an exact
    address check (a prefix test let "::1:2:3", which is not loopback, pass as "::1")."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])  # (an IPv6 zone id is not the address)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


async def tick_sessions(broker) -> None:
    """One task ticks every connection (heartbeats, handshake timeouts): a timer per connection
    cost more than the connections themselves once there were thousands."""
    while True:
        await trio.sleep(TICK_INTERVAL_S)
        now = trio.current_time()
        for session in list(broker.live_sessions):
            session.tick(now)


def _numbered(head: bytes, first: int, count: int, tail: bytes) -> list[bytes]:
    """`head + n in TRACE_ID_DIGITS digits + tail` for the `count` numbers n from `first`: per
    hundred, the digits but the last two formatted once and joined to the hundred endings
    (cached per tail): one concatenation per message, in C."""
    endings = _endings.get(tail)
    if endings is None:
        if len(_endings) >= _ENDINGS_CACHED_MAX:
            _endings.clear()
        endings = _endings[tail] = [digits + tail for digits in _TWO_DIGITS]
    out: list[bytes] = []
    n, end = first, first + count
    while n < end:  # (once per hundred numbers)
        hundred, low = divmod(n, 100)
        high = min(100, low + end - n)
        out += map((b"%b%0*d" % (head, TRACE_ID_DIGITS - 2, hundred)).__add__, endings[low:high])
        n += high - low
    return out


def _take_trace_numbers(count: int) -> int:
    """The first of `count` consecutive trace numbers, taken from this process's counter."""
    first = _trace_numbers[0]
    _trace_numbers[0] = first + count
    return first


def wire_routing_of(exchange: str, routing_key: str) -> bytes:
    """basic.deliver's exchange and routing-key fields as encoded on the wire."""
    key = (exchange, routing_key)
    wire = _wire_routing.get(key)
    if wire is None:
        wire = encode_shortstr_field(exchange) + encode_shortstr_field(routing_key)
        if len(_wire_routing) >= WIRE_ROUTING_CACHED_MAX:
            _wire_routing.clear()
        _wire_routing[key] = wire
    return wire
