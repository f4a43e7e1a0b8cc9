"""The node's message store: queue backings over one SegmentStore, and the group-commit syncer.

Theory of operation: each queue machine gets a `QueueBacking` that turns its calls (write,
remove, remove_from, load, delivered, drop) into atomic batches on the node's store, keyed
`queue_id ‖ seq`. Persistent messages of durable queues are written through the WAL; everything
else (spilled transient messages) skips it, because it need not survive a restart. With every
durable batch go the queue's small counters (`persistent` messages present, `next_seq`,
`delivered` watermark), so after a crash the store says exactly what is queued without a scan.

A confirm means "fsynced". Writes return at once; `WalSyncer` is one thread that fsyncs the WAL
for everything written before it started (group commit) and then reports the ticket it covered,
through `on_durable`, to the trio loop, which releases the publisher confirms waiting for it.

Records carry the boot epoch that wrote them: a transient record of an earlier run that RocksDB
happened to flush to disk is not a message of this run and is dropped when met.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable

import msgpack

from ..machines.delayed import DELAYED_BASE
from ..machines.message import Message
from ..machines.queue import SEQ_MASK, WINDOW_BYTES_MAX
from ..storage.errors import StorageError
from ..storage.sync_latency import SyncLatency

log = logging.getLogger("maxq.store")

_HEADER = struct.Struct(">BIBB")  # flags, epoch, exchange length, routing-key length
_PROPS_LEN = struct.Struct(">I")
FLAG_PERSISTENT = 1
FLAG_DURABLE = 2  # written through the WAL: survives a restart
FLAG_EXPIRES = 4  # an 8-byte deadline (ms, TTL) follows the header
FLAG_DELAYED = 8  # a delayed message (x-delay): due ms, TTL ms (-1: none), priority follow
FLAG_RETURNS = 16  # its delivery count (returns so far, x-delivery-limit) follows: u32
# An SQS FIFO message (machines/fifo.py): at the end of the fixed fields, its sequence number
# (u64) and its group id (u8 length, UTF-8), so a spilled or restarted one keeps its group.
FLAG_FIFO = 32
_DELAYED = struct.Struct(">QqB")
_DELAYED_COUNTERS = struct.Struct(">QQ")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
# A load (one refill of a queue's window) brings in at most this much body: the queue machine's
# own window bound, which it applies to enqueues but not to the count it asks `load` for.
LOAD_BYTES_MAX = WINDOW_BYTES_MAX
LOAD_SCAN_BYTES = 4 << 20  # per store scan, so a load's transient copies stay small
LOAD_SCAN_RECORDS_FIRST = 256  # before the record size is known
LOAD_SCAN_RECORDS_MAX = 8192


def encode_record(message: Message, durable: bool, epoch: int) -> bytes:
    exchange = message.exchange.encode()
    routing_key = message.routing_key.encode()
    flags = (FLAG_PERSISTENT if message.persistent else 0) | (FLAG_DURABLE if durable else 0)
    expires_at = message.expires_at_ms
    fifo = b""
    if message.group_id is not None:
        flags |= FLAG_FIFO
        group = message.group_id.encode()
        fifo = b"".join((_U64.pack(message.sequence_number or 0), bytes((len(group),)), group))
    if message.seq >= DELAYED_BASE:
        # Not enqueued yet: its TTL and priority apply when it falls due.
        ttl = -1 if message.ttl_ms is None else message.ttl_ms
        priority = message.priority if type(message.priority) is int and 0 <= message.priority <= 255 else 0
        return b"".join(
            (
                _HEADER.pack(flags | FLAG_DELAYED, epoch, len(exchange), len(routing_key)),
                _DELAYED.pack(message.due_ms, ttl, priority),
                fifo,
                exchange,
                routing_key,
                _PROPS_LEN.pack(len(message.props_raw)),
                message.props_raw,
                message.body,
            )
        )
    extra = b""
    if message.count_header and message.delivery_count:
        flags |= FLAG_RETURNS
        extra = _U32.pack(min(message.delivery_count, 0xFFFFFFFF))
    if expires_at is not None:
        return b"".join(
            (
                _HEADER.pack(flags | FLAG_EXPIRES, epoch, len(exchange), len(routing_key)),
                _U64.pack(expires_at),
                extra,
                fifo,
                exchange,
                routing_key,
                _PROPS_LEN.pack(len(message.props_raw)),
                message.props_raw,
                message.body,
            )
        )
    return b"".join(
        (
            _HEADER.pack(flags, epoch, len(exchange), len(routing_key)),
            extra,
            fifo,
            exchange,
            routing_key,
            _PROPS_LEN.pack(len(message.props_raw)),
            message.props_raw,
            message.body,
        )
    )


def decode_record(seq: int, record: bytes) -> tuple[Message, int, int]:
    flags, epoch, exchange_len, routing_key_len = _HEADER.unpack_from(record, 0)
    offset = _HEADER.size
    expires_at = None
    delayed = None
    if flags & FLAG_EXPIRES:
        (expires_at,) = _U64.unpack_from(record, offset)
        offset += 8
    elif flags & FLAG_DELAYED:
        delayed = _DELAYED.unpack_from(record, offset)
        offset += _DELAYED.size
    returns = 0
    if flags & FLAG_RETURNS:
        (returns,) = _U32.unpack_from(record, offset)
        offset += 4
    group_id = sequence_number = None
    if flags & FLAG_FIFO:
        (sequence_number,) = _U64.unpack_from(record, offset)
        group_len = record[offset + 8]
        group_id = bytes(record[offset + 9 : offset + 9 + group_len]).decode()
        offset += 9 + group_len
    exchange = record[offset : offset + exchange_len].decode()
    offset += exchange_len
    routing_key = record[offset : offset + routing_key_len].decode()
    offset += routing_key_len
    (props_len,) = _PROPS_LEN.unpack_from(record, offset)
    offset += 4
    props_raw = record[offset : offset + props_len]
    body = record[offset + props_len :]
    message = Message(exchange, routing_key, props_raw, body, bool(flags & FLAG_PERSISTENT))
    message.seq = seq
    message.expires_at_ms = expires_at
    message.group_id = group_id
    message.sequence_number = sequence_number
    if returns:
        message.delivery_count = returns
        message.count_header = True
    if delayed is not None:
        message.due_ms, ttl, message.priority = delayed
        message.ttl_ms = None if ttl < 0 else ttl
    return message, flags, epoch


def counters_key(queue_id: int) -> str:
    return f"queue-counters/{queue_id}"


# An SQS FIFO queue's deduplication window (machines/fifo.py) on a single node: one record per
# entry under the queue's id with this bit set, keyed by the entry's sequence number, so the
# window's expiry is one range delete from 0; `fifo_key` holds the next sequence number.
DEDUP_QUEUE_BIT = 1 << 62
# A durable queue's persistent half messages (machines/transactions.py): under its id with this
# bit set, keyed by the queue's half number; a record is msgpack [transaction id, timeout ms,
# checks max, the message's record].
TXN_QUEUE_BIT = 1 << 61
TXN_LOAD_MAX = 1 << 20  # halves read back at a restart (a queue holds at most 100,000)
_DEDUP = struct.Struct(">QB")  # expires ms, deduplication id length; then the id, the message id
DEDUP_LOAD_MAX = 1 << 20  # entries read back at a restart (the machine keeps at most 100,000)


def fifo_key(queue_id: int) -> str:
    return f"queue-fifo/{queue_id}"


def pauses_key(queue_id: int) -> str:
    """A durable queue's consumer pause rules (machines/consumer_pauses.py), msgpack [[scope, key], ...]."""
    return f"queue-pauses/{queue_id}"


def delayed_key(queue_id: int) -> str:
    """The count of a durable queue's persistent delayed messages (also counted in `persistent`)."""
    return f"queue-delayed/{queue_id}"


def encode_counters(persistent: int, next_seq: int, delivered: int) -> bytes:
    return struct.pack(">QQq", persistent, next_seq, delivered)


def decode_counters(raw: bytes | None) -> tuple[int, int, int]:
    if raw is None:
        return 0, 0, -1
    return struct.unpack(">QQq", raw)


class QueueBacking:
    """One queue's view of the store (the `Backing` of maxq_raft.machines.queue_types)."""

    def __init__(self, store, queue_id: int, durable: bool, epoch: int, syncer: WalSyncer | None) -> None:
        self.store = store
        self.queue_id = queue_id
        self.durable = durable
        self.epoch = epoch
        self.syncer = syncer
        self.persistent = 0  # persistent messages of a durable queue present in the store
        self.next_seq = 0
        self.delivered_upto = -1
        self.recovered_epoch_floor = epoch  # records older than this epoch that are not durable are stale
        self.damage_logged = False
        raw = store.get_meta(delayed_key(queue_id)) if durable else None
        # (count of persistent delayed messages stored, next delayed counter)
        self.delayed_stored, self.delayed_next = _DELAYED_COUNTERS.unpack(raw) if raw else (0, 0)

    def _counters(self) -> dict:
        return {
            counters_key(self.queue_id): encode_counters(self.persistent, self.next_seq, self.delivered_upto),
            delayed_key(self.queue_id): _DELAYED_COUNTERS.pack(self.delayed_stored, self.delayed_next),
        }

    def write(self, messages: list) -> None:
        durable_puts = []
        volatile_puts = []
        queue_id, epoch = self.queue_id, self.epoch
        for m in messages:
            if self.durable and m.persistent:
                durable_puts.append((queue_id, m.seq, encode_record(m, True, epoch)))
            else:
                volatile_puts.append((queue_id, m.seq, encode_record(m, False, epoch)))
        if messages and messages[-1].seq < DELAYED_BASE:
            # (a priority queue's seqs carry the priority above SEQ_MASK: the counter is below)
            self.next_seq = max(self.next_seq, (messages[-1].seq & SEQ_MASK) + 1)
        elif messages:
            self.delayed_next = max(self.delayed_next, messages[-1].delay_counter + 1)
            if self.durable:
                self.delayed_stored += sum(1 for m in messages if m.persistent)
        if volatile_puts:
            self.store.write(volatile_puts, (), None, wal=False)
        if durable_puts:
            self.persistent += len(durable_puts)
            self.store.write(durable_puts, (), self._counters(), wal=True)
            self.syncer.dirty = True

    def rewrite(self, messages: list) -> None:
        """Store these (durable, persistent) messages again with their delivery counts; the
        counters do not change: they were stored already."""
        puts = [(self.queue_id, m.seq, encode_record(m, True, self.epoch)) for m in messages]
        self.store.write(puts, (), None, wal=True)
        self.syncer.dirty = True

    def remove(self, messages: list) -> None:
        seqs = [m.seq for m in messages]
        gone = sum(1 for m in messages if m.persistent) if self.durable else 0
        if gone:
            self.delayed_stored -= sum(1 for m in messages if m.persistent and m.seq >= DELAYED_BASE)
            self.persistent -= gone
            self.store.write((), [(self.queue_id, seq) for seq in seqs], self._counters(), wal=True)
        else:
            self.store.write((), [(self.queue_id, seq) for seq in seqs], None, wal=False)

    def remove_from(self, seq_from: int, persistent: int, seq_below: int | None = None) -> None:
        self.store.delete_range(self.queue_id, seq_from, 1 << 64 if seq_below is None else seq_below)
        if self.durable:
            self.persistent = max(0, self.persistent - persistent)
            self.store.write((), (), self._counters(), wal=True)

    def load(self, seq_from: int, limit: int, seq_below: int | None = None) -> list:
        """Up to `limit` messages from `seq_from`, and no more than LOAD_BYTES_MAX of bodies.

        The machine asks for a window's worth of messages (`window_max`) whatever their size, and
        takes fewer as fine; so the byte bound of the window holds here too. The store is read in
        scans of about LOAD_SCAN_BYTES, so the copies a scan makes (RocksDB's value, the record,
        the body) exist for one scan at a time, not for the whole load.
        """
        out = []
        body_bytes = 0
        scan_records = LOAD_SCAN_RECORDS_FIRST
        while len(out) < limit and body_bytes < LOAD_BYTES_MAX:
            want = min(scan_records, limit - len(out))
            stale = []
            try:
                records = self.store.scan(self.queue_id, seq_from, want)
            except StorageError as exc:
                # The queue machine turns this into a 541 for the client; the operator must hear
                # of it too (once per queue: every later read of the queue meets it again).
                if not self.damage_logged:
                    self.damage_logged = True
                    log.critical(
                        "queue %d cannot be read from seq %d: %s (maxq-server --check lists the damage)",
                        self.queue_id,
                        seq_from,
                        exc,
                    )
                if out:
                    return out  # what comes before the damage can still be delivered
                raise
            record_bytes = 0
            for seq, record in records:
                if seq_below is not None and seq >= seq_below:
                    return out  # the end of a priority lane
                record_bytes += len(record)
                seq_from = seq + 1
                message, flags, epoch = decode_record(seq, record)
                if epoch != self.epoch and not flags & FLAG_DURABLE:
                    stale.append((self.queue_id, seq))  # a transient message of an earlier run
                    continue
                message.redelivered = seq & SEQ_MASK <= self.delivered_upto and epoch != self.epoch
                out.append(message)
                body_bytes += len(message.body)
                if body_bytes >= LOAD_BYTES_MAX:
                    break
            if stale:
                self.store.write((), stale, None, wal=False)
            # Stale records are skipped, never a reason to stop: the machine takes an empty answer
            # for "nothing more is stored", so stopping at a run of them (transient messages that
            # RocksDB had flushed before a restart) would hide the persistent messages after it.
            if len(records) < want:
                break
            scan_records = max(1, min(LOAD_SCAN_RECORDS_MAX, LOAD_SCAN_BYTES * len(records) // max(1, record_bytes)))
        return out

    def delivered(self, seq: int) -> None:
        # One small WAL write per delivery batch (not per message), not waited for: losing the
        # last marks in a machine crash only means redelivered=false on a message delivered once.
        self.delivered_upto = seq
        self.store.write((), (), self._counters(), wal=True)

    def dedup_write(self, entries: list[tuple[int, int, str, str]], next_sequence_number: int | None) -> None:
        dedup_queue = self.queue_id | DEDUP_QUEUE_BIT
        puts = []
        for sequence, expires_ms, dedup_id, message_id in entries:
            raw_id = dedup_id.encode()
            puts.append((dedup_queue, sequence, _DEDUP.pack(expires_ms, len(raw_id)) + raw_id + message_id.encode()))
        meta = {} if next_sequence_number is None else {fifo_key(self.queue_id): _U64.pack(next_sequence_number)}
        self.store.write(puts, (), meta, wal=True)
        if self.syncer is not None:
            self.syncer.dirty = True

    def dedup_forget(self, below_sequence_number: int, from_sequence_number: int = 0) -> None:
        self.store.delete_range(self.queue_id | DEDUP_QUEUE_BIT, from_sequence_number, below_sequence_number)

    def dedup_stored(
        self, from_sequence_number: int = 0, below_sequence_number: int | None = None
    ) -> tuple[list[tuple[int, int, str, str]], int]:
        raw = self.store.get_meta(fifo_key(self.queue_id))
        next_sequence_number = _U64.unpack(raw)[0] if raw else 1
        entries: list[tuple[int, int, str, str]] = []
        seq_from = from_sequence_number
        while len(entries) < DEDUP_LOAD_MAX:  # bounded: each scan moves on, or ends the loop
            records = self.store.scan(self.queue_id | DEDUP_QUEUE_BIT, seq_from, 4096)
            for sequence, record in records:
                if below_sequence_number is not None and sequence >= below_sequence_number:
                    return entries, next_sequence_number
                expires_ms, id_len = _DEDUP.unpack_from(record, 0)
                start = _DEDUP.size
                dedup_id = bytes(record[start : start + id_len]).decode()
                entries.append((sequence, expires_ms, dedup_id, bytes(record[start + id_len :]).decode()))
                seq_from = sequence + 1
            if len(records) < 4096:
                break
        return entries, next_sequence_number

    def txn_write(self, entries: list) -> None:
        queue, epoch = self.queue_id | TXN_QUEUE_BIT, self.epoch
        puts = [
            (queue, number, msgpack.packb([txn_id, timeout_ms, checks, encode_record(m, True, epoch)]))
            for number, txn_id, timeout_ms, checks, m in entries
        ]
        self.store.write(puts, (), None, wal=True)
        if self.syncer is not None:
            self.syncer.dirty = True

    def txn_remove(self, numbers: list[int]) -> None:
        queue = self.queue_id | TXN_QUEUE_BIT
        self.store.write((), [(queue, number) for number in numbers], None, wal=True)
        if self.syncer is not None:
            self.syncer.dirty = True

    def txn_stored(self) -> list:
        queue = self.queue_id | TXN_QUEUE_BIT
        entries: list = []
        seq_from = 0
        while len(entries) < TXN_LOAD_MAX:  # bounded: each scan moves on, or ends the loop
            records = self.store.scan(queue, seq_from, 4096)
            for number, record in records:
                try:
                    txn_id, timeout_ms, checks, raw = msgpack.unpackb(bytes(record))
                    message = decode_record(number, raw)[0]
                except (ValueError, TypeError, struct.error, msgpack.UnpackException) as exc:
                    raise StorageError(f"queue {self.queue_id}: damaged half message {number} ({exc!r})") from None
                message.seq = -1
                entries.append((number, txn_id, timeout_ms, checks, message))
                seq_from = number + 1
            if len(records) < 4096:
                break
        return entries

    def pauses_write(self, rules: list[tuple[str, str]]) -> None:
        packed = msgpack.packb([list(rule) for rule in rules]) if rules else None
        self.store.write((), (), {pauses_key(self.queue_id): packed}, wal=True)
        if self.syncer is not None:
            self.syncer.dirty = True

    def pauses_stored(self) -> list[tuple[str, str]]:
        raw = self.store.get_meta(pauses_key(self.queue_id))
        if not raw:
            return []
        try:
            rules = [(scope, key) for scope, key in msgpack.unpackb(raw)]
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise StorageError(f"{pauses_key(self.queue_id)}: damaged pause rules ({exc!r})") from None
        if not all(type(scope) is str and type(key) is str for scope, key in rules):
            raise StorageError(f"{pauses_key(self.queue_id)}: damaged pause rules")
        return rules

    def drop(self) -> None:
        self.store.drop_queue(self.queue_id)
        self.store.drop_queue(self.queue_id | DEDUP_QUEUE_BIT)
        self.store.drop_queue(self.queue_id | TXN_QUEUE_BIT)
        if self.durable:
            self.store.write(
                (),
                (),
                {
                    counters_key(self.queue_id): None,
                    delayed_key(self.queue_id): None,
                    fifo_key(self.queue_id): None,
                    pauses_key(self.queue_id): None,
                },
                wal=True,
            )


class WalSyncer:
    """Group commit: one thread fsyncs the store's WAL and reports each ticket's outcome.

    `on_outcome(ticket, mark)` runs in the syncer thread (the caller hops to its loop): `mark`
    (the store's SyncMark the fsync covered) when every write made before `request()` returned
    ticket is durable, None when it is not and never will be: the store failed (a write or an
    fsync: storage/guarded.py), so the publishes waiting for that ticket are nacked. A failed fsync
    is never retried for the same ticket (PostgreSQL's "fsyncgate": after a failed fsync the page
    cache cannot be trusted); the store recovers by reopening and writing again, and later
    tickets are synced once it has. When nothing is requested for `IDLE_SYNC_S` and writes are
    waiting (acks, deliveries: not fsynced one by one), it syncs them anyway with the last ticket
    again, so the store's redo log stays short.
    """

    IDLE_SYNC_S = 1.0

    def __init__(self, store, on_outcome: Callable[[int, tuple[int, int] | None], None], fsync: bool = True) -> None:
        self.store = store
        self.on_outcome = on_outcome
        self.fsync = fsync
        self.dirty = False  # set by writers; `request` turns it into a ticket
        self._requested = 0
        self._synced = 0
        self._cond = threading.Condition()
        self._stopping = False
        self.sync_latency = SyncLatency()  # each successful fsync of the WAL, for /metrics
        self._thread = threading.Thread(target=self._run, name="maxq-wal-sync", daemon=True)
        self._thread.start()

    def request(self) -> int:
        """A ticket whose outcome is reported once the thread has synced after this call."""
        with self._cond:
            self._requested += 1
            self.dirty = False
            self._cond.notify()
            return self._requested

    def _run(self) -> None:
        while True:  # until close; every wait is bounded
            with self._cond:
                if self._requested == self._synced and not self._stopping:
                    self._cond.wait(self.IDLE_SYNC_S)
                if self._stopping and self._requested == self._synced:
                    return
                ticket = self._requested
                if ticket == self._synced and not (self.store.unsynced_writes and self.store.failure is None):
                    continue
            try:
                if self.fsync:
                    started_s = time.monotonic()
                    mark = self.store.sync_wal()
                    self.sync_latency.observe(time.monotonic() - started_s)
                else:
                    mark = None if self.store.failure else self.store.sync_mark()
            except StorageError:  # the store logged it and is failed until it recovers
                mark = None
            self._synced = ticket
            self.on_outcome(ticket, mark)

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(10.0)
