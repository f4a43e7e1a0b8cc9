"""The message trace's storage (x-trace): records by queue and time, found by message id and
correlation id with prefix scans, compacted by time and size.

Theory of operation: `server/tracer.py` turns each applied command of a traced queue into
records (`Record` tuples) and hands them here with their place in the log, `(time ms, log index,
n)`. Each member writes them to its own key-value store (RocksDB in `<data dir>/trace`, or memory
for a node without a data folder); the same log gives the same records under the same keys on
every member. A cluster member replays its log from its last snapshot when it starts: a row
whose key is there already is skipped (one read per row, only on a cluster member), so nothing
is counted twice. (Not by comparing log indexes: a member admits entries in each origin's
order, machines/apply_order.py, so a queue may apply index 10 after 11. A single node never
replays queue commands, and its log's index starts again at each start: it writes every row.)
Keys are big-endian so that key order is time order:

    q ‖ vhost ‖ queue ‖ time ms ‖ log index ‖ n          -> the records of one command (msgpack)
    m ‖ vhost ‖ message id ‖ time ms ‖ queue ‖ index ‖ n  -> empty: the key names the q row
    n ‖ vhost ‖ id bucket ‖ time ms ‖ queue ‖ index ‖ n   -> likewise, for a publish group's ids
    c ‖ vhost ‖ correlation id ‖ ...                      -> likewise
    k ‖ vhost ‖ queue ‖ seq bucket ‖ time ms ‖ index ‖ n  -> likewise, for a row's seqs
    s ‖ vhost ‖ queue                                     -> the queue's trace bytes (u64)

(each name as a 2-byte length and its UTF-8). A query by queue and time range is one scan of a q
range; by message id or correlation id, one scan of an m, n or c prefix and a get per hit, then
the rows of the found messages' seq buckets (k) for their deliveries and acks.

Why groups and buckets: a traced message has four steps at least (published, enqueued,
delivered, acked), and a record and an index key for each cost a traced node more than the
message itself (issue #20's ×0.8). The hot steps are therefore stored as groups of one command
(`PUBLISH_GROUP`, `DELIVER_GROUP`, `ACK_GROUP`): a delivery or an ack names only the message's
seq, whose ids a query reads from its enqueue; a publish group's ids are indexed by bucket (a
trace id "node@connection-000000000042" and its 99 neighbours share one key, a query keeps the
exact matches), and a row's seqs by buckets of 256 (SEQ_BUCKET_BITS). A record of the other steps
(`Record`) carries its ids and is indexed by them, as every record was before the groups, so a
store written by an older version is read and compacted by the same rules.
Compaction (`compact`, run by a task of the shell) deletes a queue's oldest records while they
are older than its retention or its bytes exceed its size limit, with their m and c entries, a
bounded batch per queue per pass. It uses the member's clock, so members may drop a record a
few seconds apart: retention is a bound on what is kept, not part of the replicated state.
"""

from __future__ import annotations

import base64
import bisect
import logging
import struct
import time
from collections.abc import Callable, Iterable
from itertools import repeat
from pathlib import Path
from typing import Any, Protocol

import msgpack

_U64 = struct.Struct(">Q")
log = logging.getLogger("maxq.trace")

_PLACE = struct.Struct(">QQI")  # time ms, log index, n
WRITE_FAILURE_LOG_EVERY_S = 60.0
NAME_BYTES_MAX = 0xFFFF
QUERY_LIMIT_DEFAULT = 1000
QUERY_LIMIT_MAX = 10_000
# Rows are written in batches (one RocksDB write cost a traced node about 10 µs, more than the
# records of a small command): at this many puts, and at least every FLUSH_INTERVAL_S.
FLUSH_PUTS_MAX = 512
FLUSH_INTERVAL_S = 0.05
COMPACT_BATCH_MAX = 2000  # rows deleted per queue per pass: a pass never stalls the loop long
TRACE_RETENTION_MS_DEFAULT = 24 * 3_600_000
TRACE_RETENTION_BYTES_DEFAULT = 256 << 20


class TraceKV(Protocol):
    """The few verbs the trace needs of a sorted key-value store."""

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        """One atomic batch."""

    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        """Up to `limit` items with start <= key < end, in key order."""

    def close(self) -> None: ...


class MemoryKV:
    """A node without a data folder (and tests): a dict and its sorted keys."""

    def __init__(self) -> None:
        self._items: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        for key, value in puts:
            if key not in self._items:
                bisect.insort(self._keys, key)
            self._items[key] = value
        for key in deletes:
            if self._items.pop(key, None) is not None:
                del self._keys[bisect.bisect_left(self._keys, key)]

    def get(self, key: bytes) -> bytes | None:
        return self._items.get(key)

    def scan(self, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        i = bisect.bisect_left(self._keys, start)
        out: list[tuple[bytes, bytes]] = []
        while i < len(self._keys) and len(out) < limit:
            key = self._keys[i]
            if key >= end:
                break
            out.append((key, self._items[key]))
            i += 1
        return out

    def close(self) -> None:
        pass


class RocksKV:
    """`<data dir>/trace`: a RocksDB of its own, so the message store's key space and its
    start-up scans (storage/rocks.py) never meet a trace key, and a cluster member's message
    store, emptied at each start, leaves the trace alone. Written through the WAL without
    fsync: a trace record is derived, and a member replays its log from its last snapshot."""

    def __init__(self, path: Path) -> None:
        from rocksdict import Options, Rdict, WriteBatch

        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._batch = WriteBatch
        self._db = Rdict(str(path), options)

    def write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        batch = self._batch(raw_mode=True)
        for key, value in puts:
            batch.put(key, value)
        for key in deletes:
            batch.delete(key)
        self._db.write(batch)

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def scan(self, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        from rocksdict import ReadOptions

        read_options = ReadOptions()
        read_options.set_iterate_upper_bound(end)
        it = self._db.iter(read_options)
        it.seek(start)
        out: list[tuple[bytes, bytes]] = []
        while it.valid() and len(out) < limit:
            out.append((it.key(), it.value()))
            it.next()
        if not it.valid():
            it.status()
        return out

    def close(self) -> None:
        self._db.close()


_NAMES_CACHED_MAX = 4096
_names: dict[str, bytes] = {}  # (vhost and queue names come again in every row: encoded once)


def _name(text: str) -> bytes:
    found = _names.get(text)
    if found is None:
        raw = text.encode("utf-8", "surrogatepass")[:NAME_BYTES_MAX]
        found = len(raw).to_bytes(2, "big") + raw
        if len(_names) >= _NAMES_CACHED_MAX:
            _names.clear()
        _names[text] = found
    return found


def _id_name(text: str) -> bytes:
    """`_name` of a message or correlation id or an id bucket: each comes in a row or two only,
    so it is encoded each time rather than churn the cache of vhost and queue names."""
    raw = text.encode("utf-8", "surrogatepass")[:NAME_BYTES_MAX]
    return len(raw).to_bytes(2, "big") + raw


def _after(prefix: bytes) -> bytes:
    """The first key past every key that starts with `prefix` (which never ends in 0xff here:
    it ends in a length or a name's last UTF-8 byte)."""
    return prefix[:-1] + bytes((prefix[-1] + 1,))


def queue_prefix(vhost: str, queue: str) -> bytes:
    return b"q" + _name(vhost) + _name(queue)


# A stored record: (event, message id, correlation id, seq, extra) (message id and seq None for
# a record of no message, as "purged"; seq -1 for a publish never enqueued); `extra` a dict of
# further fields, or for the two records every message has, a list whose names are these:
PUBLISHED_FIELDS = (
    "user",
    "connection",
    "client_address",
    "channel",
    "exchange",
    "routing_key",
    "routed_queues",
    "confirmed",
    "body",
)
Record = tuple  # (str, str | None, str | None, int | None, dict | list | None)

# The groups (a list whose first item names it; a Record's first item is an event name):
#   [PUBLISH_GROUP, user, connection, client address, [entry, ...]] with each entry
#       [message id, correlation id, seq, exchange, routing key, publish, body, delayed ms, fate]:
#       the message id an int n for the x-maxq-trace-id the publishing node gave it (read as
#       "connection-n", n in TRACE_ID_DIGITS digits); or a run of published and enqueued
#       messages, the same entry with a tenth item, the count: ids n, n+1, ... and seqs seq,
#       seq+1, ..., the rest the same for each (no correlation id, no body, no fate);
#       publish [channel, routed queues, confirmed] or None (not published here: a dead-lettered
#       copy, an SQS or HTTP publish); seq -1 when not enqueued, then fate "refused" (overflow) or
#       "dropped" (a duplicate); body None unless x-trace-bodies. Read as "published" (when
#       publish) and "enqueued" / "refused" / "dropped" records.
#   [DELIVER_GROUP, consumer id, [seq, ...], [redelivered, ...], [delivery count, ...]], or a
#       run [DELIVER_GROUP, consumer id, first seq, count]: seqs first seq, +1, ..., each its
#       message's first delivery (not redelivered, delivery count 1)
#   [ACK_GROUP, [seq, ...]]
PUBLISH_GROUP = "P"
DELIVER_GROUP = "D"
ACK_GROUP = "A"
TRACE_ID_DIGITS = 12  # "node@connection-000000000042" (tracer.py makes them)
SEQ_BUCKET_BITS = 8  # a k key covers the rows of 256 consecutive seqs of a queue
_SEQ_BUCKETS_SPANNED_MAX = 4  # a row whose seqs span more buckets lists the buckets it holds


def id_bucket(value: str) -> str:
    """The n key of a publish group's message id: the id less its last two characters when
    they are digits (consecutive ids share a key), else the id itself."""
    return value[:-2] if len(value) > 2 and value[-2:].isdigit() else value


def _expand(vhost: str, queue: str, place: bytes, value: bytes) -> list[dict[str, Any]]:
    """A row's records as dicts, each with its place and queue (in the key, not in the row). A
    delivery or an ack of a group answers with "message_id" None: the query fills it in."""
    time_ms, log_index, n0 = _PLACE.unpack(place)
    out: list[dict[str, Any]] = []
    append = out.append
    for item in msgpack.unpackb(value, raw=False):
        kind = item[0]
        if kind == PUBLISH_GROUP:
            _kind, user, connection, address, entries = item
            for entry in entries:
                if len(entry) > 9:  # (a run: see PUBLISH_GROUP; read as its messages one by one)
                    number, _none, seq, *alike, count = entry
                    for i in range(count):
                        _expand_entry([number + i, None, seq + i, *alike], user, connection, address, append)
                else:
                    _expand_entry(entry, user, connection, address, append)
        elif kind == DELIVER_GROUP:
            if len(item) == 4:  # (a run: see DELIVER_GROUP)
                _kind, consumer, first, count = item
                seqs, redelivered, counts = range(first, first + count), [False] * count, [1] * count
            else:
                _kind, consumer, seqs, redelivered, counts = item
            connection, channel, tag = (consumer.split("/", 2) + ["", ""])[:3]  # (a tag may hold "/")
            for seq, again, count in zip(seqs, redelivered, counts, strict=True):
                append(
                    {
                        "event": "delivered",
                        "message_id": None,
                        "seq": seq,
                        "consumer_tag": tag,
                        "connection": connection,
                        "channel": channel,
                        "redelivered": again,
                        "delivery_count": count,
                    }
                )
        elif kind == ACK_GROUP:
            for seq in item[1]:
                append({"event": "acked", "message_id": None, "seq": seq})
        else:
            append(_expand_record(item))
    for n, record in enumerate(out, n0):
        body = record.pop("body", None)
        if body is not None:  # (JSON carries no bytes)
            record["body_base64"] = base64.b64encode(body).decode("ascii")
        record.update(time_ms=time_ms, log_index=log_index, n=n, vhost=vhost, queue=queue)
    return out


def _expand_entry(entry: list, user: Any, connection: Any, address: Any, append: Callable[[dict], None]) -> None:
    """One message's records of a PUBLISH_GROUP entry."""
    message_id, correlation_id, seq, exchange, routing_key, publish, body, delayed_ms, fate = entry
    if type(message_id) is int:  # (the trace number: see PUBLISH_GROUP)
        message_id = f"{connection}-{message_id:0{TRACE_ID_DIGITS}d}"
    ids: dict[str, Any] = {"message_id": message_id}
    if correlation_id is not None:
        ids["correlation_id"] = correlation_id
    if seq >= 0:
        ids["seq"] = seq
    if publish is not None:
        channel, routed_queues, confirmed = publish
        published = {
            "event": "published",
            **ids,
            "user": user,
            "connection": connection,
            "client_address": address,
            "channel": channel,
            "exchange": exchange,
            "routing_key": routing_key,
            "routed_queues": routed_queues,
        }
        if confirmed is not None:
            published["confirmed"] = confirmed
        if body is not None:
            published["body"] = body
        append(published)
    if seq >= 0:
        enqueued = {"event": "enqueued", **ids}
        if delayed_ms:
            enqueued["delayed_ms"] = delayed_ms
        if body is not None and publish is None:
            enqueued["body"] = body
        append(enqueued)
    elif fate is not None:
        append({"event": fate, **ids, "reason": "overflow" if fate == "refused" else "duplicate"})


def _expand_record(item: list) -> dict[str, Any]:
    event, message_id, correlation_id, seq, extra = item
    record: dict[str, Any] = {"event": event}
    if seq is not None:
        record["message_id"] = message_id
        if correlation_id is not None:
            record["correlation_id"] = correlation_id
        if seq >= 0:
            record["seq"] = seq
    if type(extra) is list:
        if event == "delivered":  # [consumer id "node@connection/channel/tag", redelivered, count]
            connection, channel, tag = (extra[0].split("/", 2) + ["", ""])[:3]  # (a tag may hold "/")
            record.update(
                consumer_tag=tag,
                connection=connection,
                channel=channel,
                redelivered=extra[1],
                delivery_count=extra[2],
            )
        else:
            record.update(
                (name, value) for name, value in zip(PUBLISHED_FIELDS, extra, strict=False) if value is not None
            )
    elif extra:
        record.update(extra)
    return record


def _add_seq_span(buckets: dict[int, None], low_seq: int, high_seq: int) -> None:
    """The buckets of every seq from `low_seq` to `high_seq` (a run, or seqs close together)."""
    for bucket in range(low_seq >> SEQ_BUCKET_BITS, (high_seq >> SEQ_BUCKET_BITS) + 1):
        buckets[bucket] = None


def _add_seq_buckets(buckets: dict[int, None], seqs: list[int]) -> None:
    if not seqs:
        return
    low, high = min(seqs), max(seqs)
    if (high >> SEQ_BUCKET_BITS) - (low >> SEQ_BUCKET_BITS) < _SEQ_BUCKETS_SPANNED_MAX:  # (the usual row)
        _add_seq_span(buckets, low, high)
    else:
        for seq in seqs:
            buckets[seq >> SEQ_BUCKET_BITS] = None


def _row_index_keys(vhost_name: bytes, queue: str, place: bytes, records: list) -> list[bytes]:
    """The m, n, c and k keys of one row (written with it, deleted with it by compaction), in an
    order that depends on the records alone. (Each kind's dict made when a record needs it: this
    runs for every row a traced queue writes, mostly a publish run and a delivery run.)"""
    message_ids: dict[str, None] | None = None
    buckets: dict[str, None] | None = None
    correlation_ids: dict[str, None] | None = None
    number_heads: list[tuple[bytes, dict[int, None]]] | None = None  # (a publish group's id buckets)
    seq_buckets: dict[int, None] = {}
    for item in records:
        kind = item[0]
        if kind == PUBLISH_GROUP:
            seqs = []
            numbers: dict[int, None] = {}
            for entry in item[4]:
                message_id = entry[0]
                if len(entry) > 9:  # (a run: numbers and seqs from its first, `count` of them)
                    last = entry[9] - 1
                    for number in range(message_id // 100, (message_id + last) // 100 + 1):
                        numbers[number] = None
                    _add_seq_span(seq_buckets, entry[2], entry[2] + last)
                    continue
                if type(message_id) is int:
                    numbers[message_id // 100] = None
                elif message_id:
                    if buckets is None:
                        buckets = {}
                    buckets[id_bucket(message_id)] = None
                if entry[1]:
                    if correlation_ids is None:
                        correlation_ids = {}
                    correlation_ids[entry[1]] = None
                if entry[2] >= 0:
                    seqs.append(entry[2])
            if numbers:
                # (id_bucket of "connection-n", its last two digits dropped: `_id_name` of
                # f"{connection}-{number:010d}", made as bytes from the connection's part)
                if number_heads is None:
                    number_heads = []
                connection = str(item[2]).encode("utf-8", "surrogatepass") + b"-"
                size = len(connection) + TRACE_ID_DIGITS - 2
                if size <= NAME_BYTES_MAX:
                    number_heads.append((size.to_bytes(2, "big") + connection, numbers))
                else:  # (a name cut at NAME_BYTES_MAX: as _id_name cuts it)
                    if buckets is None:
                        buckets = {}
                    for number in numbers:
                        buckets[f"{item[2]}-{number:0{TRACE_ID_DIGITS - 2}d}"] = None
            _add_seq_buckets(seq_buckets, seqs)
        elif kind == DELIVER_GROUP:
            if len(item) == 4:  # (a run: seqs item[2] to item[2] + item[3] - 1)
                _add_seq_span(seq_buckets, item[2], item[2] + item[3] - 1)
            else:
                _add_seq_buckets(seq_buckets, item[2])
        elif kind == ACK_GROUP:
            _add_seq_buckets(seq_buckets, item[1])
        else:
            if item[1]:
                if message_ids is None:
                    message_ids = {}
                message_ids[item[1]] = None
            if item[2]:
                if correlation_ids is None:
                    correlation_ids = {}
                correlation_ids[item[2]] = None
    keys: list[bytes] = []
    if message_ids or buckets or correlation_ids or number_heads:
        tail = place[:8] + _name(queue) + place[8:]
        if message_ids:
            keys += [b"m" + vhost_name + _id_name(value) + tail for value in message_ids]
        if number_heads:
            for head, numbers in number_heads:
                head = b"n" + vhost_name + head
                keys += [b"%b%0*d%b" % (head, TRACE_ID_DIGITS - 2, number, tail) for number in numbers]
        if buckets:
            keys += [b"n" + vhost_name + _id_name(value) + tail for value in buckets]
        if correlation_ids:
            keys += [b"c" + vhost_name + _id_name(value) + tail for value in correlation_ids]
    if seq_buckets:
        head = b"k" + vhost_name + _name(queue)
        keys += [head + _U64.pack(bucket) + place for bucket in seq_buckets]
    return keys


def _at(record: dict[str, Any]) -> tuple[int, int, int]:
    """A record's place in its queue's order."""
    return record["time_ms"], record["log_index"], record["n"]


class _Reader:
    """The rows one query reads, each read and expanded once, and the seq buckets that link a
    delivery or an ack to its message's enqueue."""

    def __init__(self, kv: TraceKV, vhost: str) -> None:
        self.kv = kv
        self.vhost = vhost
        self._rows: dict[tuple[str, bytes], list[dict[str, Any]]] = {}
        self._buckets: dict[tuple[str, int], list[bytes]] = {}

    def row(self, queue: str, place: bytes) -> list[dict[str, Any]]:
        """Its records ([] once compacted)."""
        found = self._rows.get((queue, place))
        if found is None:
            value = self.kv.get(queue_prefix(self.vhost, queue) + place)
            found = self._rows[(queue, place)] = _expand(self.vhost, queue, place, value) if value else []
        return found

    def keep(self, queue: str, place: bytes, records: list[dict[str, Any]]) -> None:
        self._rows.setdefault((queue, place), records)

    def bucket(self, queue: str, seq: int) -> list[bytes]:
        """The places of the rows that hold seqs of `seq`'s bucket, in time order."""
        bucket = seq >> SEQ_BUCKET_BITS
        found = self._buckets.get((queue, bucket))
        if found is None:
            head = b"k" + _name(self.vhost) + _name(queue)
            start = head + _U64.pack(bucket)
            rows = self.kv.scan(start, head + _U64.pack(bucket + 1), QUERY_LIMIT_MAX)
            found = self._buckets[(queue, bucket)] = [key[len(start) :] for key, _empty in rows]
        return found

    def later_steps(self, queue: str, enqueued: dict[str, Any]) -> list[dict[str, Any]]:
        """The deliveries and acks of the message `enqueued` (a record of queue `queue`), its ids
        filled in: the group records of its seq after it, up to the seq's next enqueue (a queue of
        the same name declared again starts its seqs again)."""
        seq, at = enqueued["seq"], _at(enqueued)
        found: list[dict[str, Any]] = []
        for place in self.bucket(queue, seq):
            for record in self.row(queue, place):
                if record.get("seq") != seq or _at(record) <= at:
                    continue
                if record["event"] == "enqueued":
                    return found
                if record["message_id"] is None:
                    _fill(record, enqueued)
                    found.append(record)
        return found

    def enqueue_before(self, queue: str, record: dict[str, Any]) -> dict[str, Any] | None:
        """The last enqueue of `record`'s seq before it."""
        seq, at = record["seq"], _at(record)
        last = None
        for place in self.bucket(queue, seq):
            for other in self.row(queue, place):
                if _at(other) >= at:
                    return last
                if other["event"] == "enqueued" and other.get("seq") == seq:
                    last = other
        return last


def _fill(record: dict[str, Any], enqueued: dict[str, Any]) -> None:
    record["message_id"] = enqueued["message_id"]
    correlation_id = enqueued.get("correlation_id")
    if correlation_id is not None:
        record["correlation_id"] = correlation_id


class TraceLog:
    """Records in, queries and compaction out, over one `TraceKV`. `replayed`: the node replays
    its log at a start (a cluster member): skip rows written before.

    The records one command made are one row (one key, one msgpack value): a publish of a hundred
    messages is one put and a hundred index entries (empty values: the key names the row), not
    four hundred puts."""

    def __init__(self, kv: TraceKV, replayed: bool = False) -> None:
        self.kv = kv
        self.replayed = replayed
        self._counts: dict[tuple[str, str], int] = {}  # cache of the s keys: each queue's bytes
        self.records_written = 0
        self.records_compacted = 0
        # Records whose write failed (a full disk, an I/O error): a trace is derived data, so a
        # failing trace store costs records, never the apply path that made them (nor a confirm).
        self.records_lost = 0
        self._failure_logged_at = -WRITE_FAILURE_LOG_EVERY_S
        # What `add` buffered for `flush`: the puts, the queues whose byte counts they changed,
        # and how many records they hold.
        self._puts: list[tuple[bytes, bytes]] = []
        self._dirty: dict[tuple[str, str], None] = {}
        self._records_buffered = 0
        self._rows_buffered: set[bytes] = set()  # (their q keys, kept when `replayed`)
        self._pack = msgpack.Packer(use_bin_type=True).pack  # (packb makes a Packer each call)

    def _write(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes], records: int) -> bool:
        try:
            self.kv.write(puts, deletes)
        except Exception as exc:  # rocksdict raises plain Exception for RocksDB statuses
            self.records_lost += records
            now = time.monotonic()
            if now - self._failure_logged_at >= WRITE_FAILURE_LOG_EVERY_S:
                self._failure_logged_at = now
                log.warning("trace store write failed (%s): %d records lost so far", exc, self.records_lost)
            return False
        return True

    # -------------------------------------------------------------- writes

    def add(
        self, vhost: str, queue: str, time_ms: int, log_index: int, n0: int, records: list[Any], count: int = 0
    ) -> None:
        """The records one command made in queue `queue` (the n-th of its log entry from `n0`), in
        order, as the tracer made them (`Record` and groups; `count`: how many records they are
        read as, for the counters). Buffered: written with the rows of other commands by `flush`."""
        place = _PLACE.pack(time_ms, log_index, n0)
        key = queue_prefix(vhost, queue) + place
        if self.replayed:
            if key in self._rows_buffered or self.kv.get(key) is not None:
                return  # (written before this member's restart: its log replays from its snapshot)
            self._rows_buffered.add(key)
        value = self._pack(records)
        puts = self._puts
        puts.append((key, value))
        puts += zip(_row_index_keys(_name(vhost), queue, place, records), repeat(b""))
        self._counts[(vhost, queue)] = self._bytes(vhost, queue) + len(key) + len(value)
        self._dirty[(vhost, queue)] = None
        self._records_buffered += count or len(records)
        if len(puts) >= FLUSH_PUTS_MAX:
            self.flush()

    @property
    def buffered(self) -> bool:
        """Rows wait for `flush`."""
        return bool(self._puts)

    def flush(self) -> None:
        """Write what `add` buffered, in one batch with the byte counts of the queues it touched.
        The shell calls it every FLUSH_INTERVAL_S and before a snapshot; queries, compaction and
        the close call it first."""
        if not self._puts:
            return
        puts, self._puts = self._puts, []
        dirty, self._dirty = self._dirty, {}
        self._rows_buffered.clear()
        records, self._records_buffered = self._records_buffered, 0
        for vhost, queue in dirty:
            puts.append((b"s" + _name(vhost) + _name(queue), _U64.pack(self._counts[(vhost, queue)])))
        if not self._write(puts, [], records):
            for queue_key in dirty:
                self._counts.pop(queue_key, None)  # (read again from the store next time)
            return
        self.records_written += records

    def _bytes(self, vhost: str, queue: str) -> int:
        total = self._counts.get((vhost, queue))
        if total is None:
            raw = self.kv.get(b"s" + _name(vhost) + _name(queue))
            total = self._counts[(vhost, queue)] = _U64.unpack(raw)[0] if raw is not None else 0
        return total

    def queue_bytes(self, vhost: str, queue: str) -> int:
        return self._bytes(vhost, queue)

    # ------------------------------------------------------------- queries

    def by_queue(
        self, vhost: str, queue: str, since_ms: int = 0, until_ms: int | None = None, limit: int = QUERY_LIMIT_DEFAULT
    ) -> list[dict[str, Any]]:
        self.flush()
        prefix = queue_prefix(vhost, queue)
        start = prefix + _U64.pack(max(0, since_ms))
        end = prefix + _U64.pack(until_ms + 1) if until_ms is not None else _after(prefix)
        reader = _Reader(self.kv, vhost)
        out: list[dict[str, Any]] = []
        for key, value in self.kv.scan(start, end, limit):  # (a row holds one record at least)
            place = key[len(prefix) :]
            records = _expand(vhost, queue, place, value)
            reader.keep(queue, place, records)
            out.extend(records)
            if len(out) >= limit:
                break
        del out[limit:]
        enqueues: dict[int, dict[str, Any]] = {}  # seq -> its last enqueue seen so far
        for record in out:
            seq = record.get("seq")
            if seq is None:
                continue
            if record["event"] == "enqueued":
                enqueues[seq] = record
            elif record.get("message_id", "") is None:  # (a group's delivery or ack)
                enqueued = enqueues.get(seq) or reader.enqueue_before(queue, record)
                if enqueued is not None:
                    _fill(record, enqueued)
        return out

    def by_message_id(self, vhost: str, message_id: str, limit: int = QUERY_LIMIT_DEFAULT) -> list[dict[str, Any]]:
        return self._by_index(
            "message_id", vhost, message_id, [(b"m", message_id), (b"n", id_bucket(message_id))], limit
        )

    def by_correlation_id(
        self, vhost: str, correlation_id: str, limit: int = QUERY_LIMIT_DEFAULT
    ) -> list[dict[str, Any]]:
        return self._by_index("correlation_id", vhost, correlation_id, [(b"c", correlation_id)], limit)

    def _by_index(
        self, field: str, vhost: str, value: str, indexes: list[tuple[bytes, str]], limit: int
    ) -> list[dict[str, Any]]:
        """The records whose `field` is `value`: the rows its index keys name, then for each of
        its enqueues the deliveries and acks of that seq (which name no ids)."""
        self.flush()
        places: dict[tuple[str, bytes], None] = {}
        for kind, text in indexes:
            prefix = kind + _name(vhost) + _id_name(text)
            for key, _empty in self.kv.scan(prefix, _after(prefix), limit):
                at = len(prefix) + 8
                length = int.from_bytes(key[at : at + 2], "big")
                queue = key[at + 2 : at + 2 + length].decode("utf-8", "surrogatepass")
                places[(queue, key[len(prefix) : at] + key[at + 2 + length :])] = None
        reader = _Reader(self.kv, vhost)
        out: list[dict[str, Any]] = []
        taken: set[int] = set()  # (ids of the records in `out`: a group's record, once filled in, matches too)
        for queue, place in places:
            for record in reader.row(queue, place):  # (none once compacted between the two reads)
                if record.get(field) == value and id(record) not in taken:
                    found = [record, *reader.later_steps(queue, record)] if record["event"] == "enqueued" else [record]
                    out.extend(found)
                    taken.update(map(id, found))
            if len(out) >= limit:
                break
        return records_of(out)[:limit]

    # ---------------------------------------------------------- compaction

    def queues(self) -> list[tuple[str, str]]:
        """Every queue with trace records (deleted ones too, until compaction empties them)."""
        self.flush()
        out = []
        for key, _value in self.kv.scan(b"s", b"t", 1_000_000):
            n = int.from_bytes(key[1:3], "big")
            vhost = key[3 : 3 + n].decode("utf-8", "surrogatepass")
            m = int.from_bytes(key[3 + n : 5 + n], "big")
            out.append((vhost, key[5 + n : 5 + n + m].decode("utf-8", "surrogatepass")))
        return out

    def compact(self, now_ms: int, retention: Callable[[str, str], tuple[int, int]]) -> int:
        """Drop what is past each queue's retention `(ms, bytes)`; returns how many rows went."""
        dropped = 0
        for vhost, queue in self.queues():
            retention_ms, retention_bytes = retention(vhost, queue)
            dropped += self._compact_queue(vhost, queue, now_ms - retention_ms, retention_bytes)
        self.records_compacted += dropped
        return dropped

    def _compact_queue(self, vhost: str, queue: str, cutoff_ms: int, bytes_max: int) -> int:
        prefix = queue_prefix(vhost, queue)
        total = self._bytes(vhost, queue)
        if total <= bytes_max:
            # The oldest row alone says whether anything is due: most passes drop nothing, and a
            # batch read for nothing cost every traced queue COMPACT_BATCH_MAX rows per pass
            # (5 % of a traced node's time at s1, seen with py-spy).
            oldest = self.kv.scan(prefix, _after(prefix), 1)
            if not oldest or _U64.unpack_from(oldest[0][0], len(prefix))[0] >= cutoff_ms:
                return 0
        deletes: list[bytes] = []
        dropped = 0
        scanned = self.kv.scan(prefix, _after(prefix), COMPACT_BATCH_MAX)
        vhost_name = _name(vhost)
        for key, value in scanned:
            place = key[len(prefix) :]
            if _U64.unpack_from(place)[0] >= cutoff_ms and total <= bytes_max:
                break
            deletes.append(key)
            dropped += 1
            total -= len(key) + len(value)
            deletes.extend(_row_index_keys(vhost_name, queue, place, msgpack.unpackb(value, raw=False)))
        if not deletes:
            return 0
        count_key = b"s" + vhost_name + _name(queue)
        if dropped == len(scanned) and not self.kv.scan(scanned[-1][0] + b"\0", _after(prefix), 1):
            # Nothing left: the queue leaves the s keys (a cluster member that replays its log
            # may write again rows that the next pass drops).
            self._counts.pop((vhost, queue), None)
            if not self._write([], [*deletes, count_key], 0):
                return 0
        else:
            if not self._write([(count_key, _U64.pack(max(0, total)))], deletes, 0):
                self._counts.pop((vhost, queue), None)
                return 0
            self._counts[(vhost, queue)] = max(0, total)
        return dropped

    def close(self) -> None:
        self.flush()
        try:
            self.kv.close()
        except Exception as exc:  # (a disk that fails its fsync at the close: the node stops all the same)
            log.warning("trace store close failed: %s", exc)


def records_of(items: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records of several scans in one order: time, then place in the log, then (records of two
    queues at the same place: each queue's log numbers its own) vhost and queue, so that every
    query that finds the same records lists them alike."""
    return sorted(
        items,
        key=lambda r: (
            r.get("time_ms", 0),
            r.get("log_index", 0),
            r.get("n", 0),
            r.get("vhost", ""),
            r.get("queue", ""),
        ),
    )
