"""RocksSegmentStore: the SegmentStore on RocksDB (rocksdict, raw mode).

Theory of operation: one RocksDB folder per node. The default column family holds messages under
16-byte keys `queue_id ‖ seq` (records.py), so one queue is one contiguous key range; a second
column family, "meta", holds small values (snapshots) under their UTF-8 names, plus MaxQ's format
marker under a key starting with 0xff, a byte UTF-8 never produces. Every value is
`crc32(key ‖ record) ‖ record`; reads verify it and raise CorruptRecord. RocksDB's own errors on
read ("Corruption: block checksum mismatch ... 000123.sst") become StoreCorruption with RocksDB's
message, which names the file.

Seeks, never walks: `bounds` is one seek to (q, 0) and one seek_for_prev to (q, 2**64-1);
`queue_ids` is one seek per queue, jumping from each queue's first key to the next queue's
prefix. `iterator_moves` counts the seeks and steps this code makes, so tests can check that
start-up cost does not grow with depth. Acked prefixes go with `delete_range`, a single range
tombstone whatever its size; point deletes leave one tombstone per message, which a seek at the
queue head must skip until compaction removes them (see the deletion collector below), so the
shell should prefer ranges.

Durability modes (docs/design.md §4-§5):
- wal=True, sync_writes=False (default): a write that returned survives a crash of the process
  (it is in the WAL in the OS page cache); `flush()` fsyncs the WAL so it also survives a crash of
  the machine.
- wal=True, sync_writes=True: every write is fsynced before it returns (~5 k writes/s: batch).
- wal=False: writes live in memtables until RocksDB flushes them to SST files on its own or
  `flush()` does; a crash loses everything after the last flush. This is the mode for a node whose
  Raft journal is the durable record: replaying the journal redoes what was lost, provided a
  snapshot never claims more than RocksDB has flushed, hence: write the messages, `flush()`, and
  only then `put_meta` the snapshot and `flush()` again. With atomic_flush, RocksDB's own flushes
  persist both column families at the same point, so meta is never newer on disk than messages.

Opening refuses what is not a MaxQ store: a non-empty folder without RocksDB's CURRENT file (RocksDB
would happily create a new database among foreign files), a RocksDB database with data but no
format marker, and anything RocksDB itself cannot open all raise StoreCorruption naming the path
with RocksDB's message. A LOCK held by another handle raises StoreLocked. `verify(path)` opens
read-only and checks every record, for `maxq-server --check`.

Additions beyond the SegmentStore protocol: `path`, `iterator_moves`, `compact()`, context-manager
use, and the module function `verify()`. rocksdict 0.3.29 quirks worked around here:
`ReadOptions.set_iterate_lower_bound` sets the *upper* bound (so only upper bounds are used), a
column family handle must be closed before its database or the LOCK stays held, and
`WriteOptions.disable_wal` is a property although the type stub says method, and
`Rdict.items()` ends silently at a damaged block (so every iteration here uses the raw iterator
and calls `status()` when it stops).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from rocksdict import (
    AccessType,
    BlockBasedOptions,
    Cache,
    DBCompactionStyle,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

if TYPE_CHECKING:
    from rocksdict import ColumnFamily

from .errors import CorruptRecord, StorageError, StoreClosed, StoreCorruption, StoreLocked
from .records import (
    KEY_SIZE_BYTES,
    U64_MAX,
    check_u64,
    decode_value,
    describe_damage,
    encode_value,
    pack_key,
    queue_end_key,
    queue_prefix,
    range_end_key,
)

log = logging.getLogger("maxq.storage")

META_CF = "meta"
FORMAT_VERSION = b"1"
_FORMAT_KEY = b"\xffmaxq.storage.format"  # 0xff never occurs in UTF-8: no user meta key collides
_FORMAT_KEY_LABEL = "(format marker)"
_PREFIX_SIZE_BYTES = 8

# -- tuning for an append-mostly, delete-prefix workload -----------------------------------------
# Memtables absorb the append stream: 64 MiB buffers, up to 4, as in the storage probe of
# docs/design.md §5 (10 M x 1 KiB at ~195 k msgs/s, ~200 MB RSS, no stalls).
# Fewer/smaller buffers mean more L0 files and stalls under bursts; more means more RSS.
WRITE_BUFFER_BYTES = 64 << 20
WRITE_BUFFERS_MAX = 4
META_WRITE_BUFFER_BYTES = 4 << 20  # snapshots are small; keep the meta memtable from costing RAM
# Bounds WAL growth: a rarely written column family (meta) would otherwise pin old WAL files.
WAL_TOTAL_BYTES_MAX = 512 << 20
# The block cache also holds index blocks (cache_index_and_filter_blocks): without that every open
# SST keeps its index on the heap and RSS grows with depth, which docs/design.md §5 forbids.
# 16 MiB: each new SST's index enters the cache as the file is written, so under a growing
# backlog the cache fills to its bound (none is pinned: _table_options), and that bound is RSS's
# growth from a shallow queue to a deep one (issue #22: within x1.2 from 1 M to 100 M). Reads
# are sequential scans of the queue heads, which need the index blocks of the few SSTs they
# read, not a large cache (the drain rate at 100 M was within 4 % of 32 MiB's).
BLOCK_CACHE_BYTES = 16 << 20
# 16 KiB blocks: reads are mostly sequential scans of 1 KiB-ish records, and bigger blocks mean a
# 4x smaller index than the 4 KiB default.
BLOCK_SIZE_BYTES = 16 << 10
# Point deletes leave tombstones a head seek must skip; mark SSTs dense in tombstones for compaction.
DELETION_WINDOW_KEYS = 32_768
DELETION_TRIGGER_KEYS = 16_384
DELETION_RATIO = 0.5
# Range tombstones only free disk when compaction carries them over the data they cover; on an idle
# node that can take RocksDB's default 30-day TTL. A day bounds how long acked bytes linger.
COMPACTION_TTL_S = 24 * 3600
BACKGROUND_JOBS_MAX = 4
LOG_FILES_KEPT = 5
LOG_FILE_BYTES_MAX = 16 << 20
OPEN_FILES_MAX = 4096
SMOOTH_SYNC_BYTES = 1 << 20  # bytes_per_sync: write back SSTs in 1 MiB steps, no giant fsync stalls
VERIFY_PROBLEMS_MAX = 100


def _table_options(cache: Cache) -> BlockBasedOptions:
    table = BlockBasedOptions()
    table.set_block_size(BLOCK_SIZE_BYTES)
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    # Not pinned, not even for level-0 files: a pin is taken when a file's table reader opens,
    # which for a new file is at level 0, and it lasts as long as the reader (max_open_files
    # keeps it open), also after the file is moved down unchanged, as the appended keys of a
    # backlog are. Pinned, the index blocks of a growing backlog stayed in memory past the
    # cache's bound (28 MiB in a 16 MiB cache at 100 M 128 B messages, issue #22).
    table.set_pin_l0_filter_and_index_blocks_in_cache(False)
    return table


def _db_options(cache: Cache, *, create: bool) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(create)
    options.create_missing_column_families(create)
    # Both column families reach disk at the same point even without a WAL (see module docstring).
    options.set_atomic_flush(True)
    # Message bodies are often already compressed or encrypted, and most live briefly: compression
    # would cost CPU on the hot path of a Python process for little disk (measured without it).
    options.set_compression_type(DBCompressionType.none())
    # Leveled compaction with dynamic level sizes keeps space amplification near 1.1x, which matters
    # when 90 % of a deep queue is acked at once; appended keys are mostly in order, so compaction
    # often moves files instead of rewriting them. Universal would trade up to 2x disk for fewer
    # rewrites; FIFO drops the oldest files whatever queue they belong to, which loses messages.
    options.set_compaction_style(DBCompactionStyle.level())
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(WRITE_BUFFERS_MAX)
    options.set_max_total_wal_size(WAL_TOTAL_BYTES_MAX)
    options.set_max_background_jobs(max(2, min(BACKGROUND_JOBS_MAX, os.cpu_count() or 2)))
    options.set_bytes_per_sync(SMOOTH_SYNC_BYTES)
    options.set_max_open_files(OPEN_FILES_MAX)
    options.set_keep_log_file_num(LOG_FILES_KEPT)
    options.set_max_log_file_size(LOG_FILE_BYTES_MAX)
    options.add_compact_on_deletion_collector_factory(DELETION_WINDOW_KEYS, DELETION_TRIGGER_KEYS, DELETION_RATIO)
    options.set_block_based_table_factory(_table_options(cache))
    return options


def _meta_options(cache: Cache) -> Options:
    options = Options(raw_mode=True)
    options.set_compression_type(DBCompressionType.none())
    options.set_write_buffer_size(META_WRITE_BUFFER_BYTES)
    options.set_block_based_table_factory(_table_options(cache))
    return options


# What RocksDB (and rocksdict) write while creating a database, before CURRENT names its first
# MANIFEST: a folder holding only these and no CURRENT is a creation that was interrupted (a disk
# that failed, a kill). Nothing was ever written through it (a write needs an open database, which
# needs CURRENT), so it is started over. Only the first MANIFEST: a later one, an OPTIONS file,
# a table (.sst) or a write-ahead log (.log) is written by an open that succeeded, so a folder
# with one of those and no CURRENT lost its CURRENT and is refused as damaged.
_CREATION_LEFTOVER = re.compile(r"LOCK|LOG|LOG\.old\.\d+|IDENTITY|rocksdict-config\.json|MANIFEST-000001|\d+\.dbtmp")


def interrupted_creation(path: str | os.PathLike[str]) -> bool:
    """True when `path` holds only what an interrupted creation leaves (and no CURRENT): no store
    yet, and no damage; opening it for writing creates the store again."""
    try:
        return _creation_leftovers(os.listdir(path))
    except OSError:
        return False


def _creation_leftovers(entries: list[str]) -> bool:
    return bool(entries) and all(_CREATION_LEFTOVER.fullmatch(name) for name in entries)


def _check_folder(path: str, *, clean: bool = True) -> bool:
    """True if a new store may be created at `path`; raises StoreCorruption if it holds something
    else. With `clean`, what an interrupted creation left is removed first (else only judged)."""
    if not os.path.lexists(path):
        return True
    if not os.path.isdir(path):
        raise StoreCorruption(path, "not a folder")
    entries = sorted(os.listdir(path))
    if not entries:
        return True
    if _creation_leftovers(entries):
        if clean:
            log.warning(
                "store %s: a creation that did not finish (%s, no CURRENT); creating it again", path, ", ".join(entries)
            )
            try:
                for name in entries:
                    os.unlink(os.path.join(path, name))
            except OSError as exc:  # the disk that interrupted the creation may still fail
                raise StorageError(f"cannot create store {path}: removing {name}: {exc.strerror or exc}") from None
        return True
    if "CURRENT" not in entries:
        raise StoreCorruption(
            path,
            f"not a RocksDB folder: no CURRENT file among its {len(entries)} "
            f"entries (e.g. {', '.join(entries[:3])}); refusing to create a store there",
        )
    return False


# An open that fails for these reasons says nothing about damage: the disk is full or failing.
_DISK_TROUBLE = ("No space left on device", "Input/output error", "Disk quota exceeded")


def _open_error(path: str, exc: Exception, *, fresh: bool) -> StorageError:
    message = str(exc)
    if message.startswith("IO error") and "lock" in message.lower():
        return StoreLocked(path, f"RocksDB: {message}")
    if fresh or any(trouble in message for trouble in _DISK_TROUBLE):
        return StorageError(f"cannot {'create' if fresh else 'open'} store {path}: RocksDB: {message}")
    return StoreCorruption(path, f"RocksDB cannot open it: {message}")


def _open_rdict(path: str, cache: Cache, *, fresh: bool, read_only: bool) -> tuple[Rdict, Rdict]:
    access = AccessType.read_only(False) if read_only else AccessType.read_write()
    try:
        db = Rdict(
            path,
            _db_options(cache, create=not read_only),
            column_families={META_CF: _meta_options(cache)},
            access_type=access,
        )
    except Exception as exc:  # rocksdict raises plain Exception for RocksDB statuses
        raise _open_error(path, exc, fresh=fresh) from exc
    try:
        return db, db.get_column_family(META_CF)
    except Exception as exc:
        db.close()
        raise StoreCorruption(path, f"no {META_CF!r} column family: {exc}") from exc


def _format_problem(meta: Rdict) -> str | None:
    """None if the format marker is present and supported, else what is wrong with it."""
    stored = meta.get(_FORMAT_KEY)
    if stored is None:
        return "a RocksDB database without MaxQ's format marker (not a MaxQ store)"
    version = decode_value(_FORMAT_KEY, stored)
    if version is None:
        return f"format marker: {describe_damage(_FORMAT_KEY, stored)}"
    if version != FORMAT_VERSION:
        return f"store format {version!r}, this build reads format {FORMAT_VERSION!r}"
    return None


def _is_empty(db: Rdict) -> bool:
    it = db.iter()
    it.seek_to_first()
    valid = it.valid()
    if not valid:
        it.status()
    return not valid


class RocksSegmentStore:
    """SegmentStore on a RocksDB folder; see the module docstring for the durability modes."""

    def __init__(
        self, path: str | os.PathLike[str], *, sync_writes: bool = False, wal: bool = True, read_only: bool = False
    ) -> None:
        if sync_writes and not wal:
            raise ValueError("sync_writes=True needs wal=True: without a WAL there is nothing to sync per write")
        self.path = os.fspath(path)
        self.read_only = read_only
        self.sync_writes = sync_writes
        self.wal = wal
        self.iterator_moves = 0  # seeks + steps made by this object's own iterators
        self._write_options = WriteOptions()
        self._write_options.sync = sync_writes
        # disable_wal is a property, though rocksdict's stub declares a method (hence the ignores)
        self._write_options.disable_wal = not wal  # type: ignore[method-assign, assignment]
        self._no_wal_options = WriteOptions()
        self._no_wal_options.disable_wal = True  # type: ignore[method-assign, assignment]
        self._cache = Cache(BLOCK_CACHE_BYTES)
        fresh = _check_folder(self.path, clean=not read_only)
        self._db: Rdict | None = None
        self._meta: Rdict | None = None
        self._meta_cf_handle: ColumnFamily | None = None  # made on first use (_meta_handle)
        self._db, self._meta = _open_rdict(self.path, self._cache, fresh=fresh, read_only=read_only)
        try:
            if read_only:
                # For offline checks (`maxq-server --check`): look, never write, take no LOCK.
                problem = _format_problem(self._meta)
                if problem is not None:
                    raise StoreCorruption(self.path, problem)
                return
            self._adopt_or_check_format(fresh)
            self._db.set_options({"ttl": str(COMPACTION_TTL_S)})
        except BaseException:
            self._release()
            raise

    def _adopt_or_check_format(self, fresh: bool) -> None:
        assert self._db is not None and self._meta is not None
        try:
            problem = _format_problem(self._meta)
            if problem is None:
                return
            # A brand-new store, or one created but killed before its marker reached disk.
            if self._meta.get(_FORMAT_KEY) is None and (fresh or (_is_empty(self._db) and _is_empty(self._meta))):
                self._meta.put(_FORMAT_KEY, encode_value(_FORMAT_KEY, FORMAT_VERSION), self._write_options)
                self.flush()
                return
        except StorageError:
            raise
        except Exception as exc:
            raise self._rocks_error(exc) from exc
        raise StoreCorruption(self.path, problem)

    # -- messages --------------------------------------------------------------------------

    def put_batch(self, items: Iterable[tuple[int, int, bytes]]) -> None:
        db = self._open()
        batch = WriteBatch(raw_mode=True)
        put = batch.put
        for queue_id, seq, record in items:
            key = pack_key(queue_id, seq)
            put(key, encode_value(key, record))
        if batch.is_empty():
            return
        try:
            db.write(batch, self._write_options)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def get(self, queue_id: int, seq: int) -> bytes | None:
        db = self._open()
        key = pack_key(queue_id, seq)
        try:
            value = db.get(key)
        except Exception as exc:
            raise self._rocks_error(exc) from exc
        if value is None:
            return None
        record = decode_value(key, value)
        if record is None:
            raise self._corrupt(key, value)
        return record

    def scan(self, queue_id: int, seq_from: int, limit: int) -> list[tuple[int, bytes]]:
        db = self._open()
        start = pack_key(queue_id, seq_from)
        if not isinstance(limit, int) or limit < 0:
            raise ValueError(f"scan limit {limit!r} must be a non-negative integer")
        out: list[tuple[int, bytes]] = []
        if limit == 0:
            return out
        read_options = ReadOptions()
        read_options.set_iterate_upper_bound(queue_end_key(queue_id))  # never step into the next queue
        moves = 1
        try:
            # The raw iterator, not Rdict.items(): items() ends silently when RocksDB hits a damaged
            # block, which would look like the end of the queue; status() raises instead.
            it = db.iter(read_options)
            it.seek(start)
            while it.valid():
                key = it.key()
                value = it.value()
                record = decode_value(key, value)
                if record is None or len(key) != KEY_SIZE_BYTES:
                    raise self._corrupt(key, value)
                out.append((int.from_bytes(key[_PREFIX_SIZE_BYTES:], "big"), record))
                if len(out) >= limit:
                    break
                moves += 1
                it.next()
            else:
                it.status()
        except StorageError:
            raise
        except Exception as exc:
            raise self._rocks_error(exc) from exc
        finally:
            self.iterator_moves += moves
        return out

    def delete(self, queue_id: int, seqs: Iterable[int]) -> None:
        db = self._open()
        keys = [pack_key(queue_id, seq) for seq in seqs]  # validate all before writing any
        if not keys:
            return
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.delete(key)
        try:
            db.write(batch, self._write_options)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def delete_range(self, queue_id: int, seq_from: int, seq_to_exclusive: int) -> None:
        db = self._open()
        start = pack_key(queue_id, seq_from)
        check_u64("seq_to_exclusive", seq_to_exclusive, inclusive_max=U64_MAX + 1)
        if seq_from > seq_to_exclusive:
            raise ValueError(f"delete_range: seq_from {seq_from} > seq_to_exclusive {seq_to_exclusive}")
        if seq_from == seq_to_exclusive:
            return
        try:
            db.delete_range(start, range_end_key(queue_id, seq_to_exclusive), self._write_options)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def bounds(self, queue_id: int) -> tuple[int, int] | None:
        db = self._open()
        start = pack_key(queue_id, 0)
        read_options = ReadOptions()
        read_options.set_iterate_upper_bound(queue_end_key(queue_id))
        try:
            it = db.iter(read_options)
            self.iterator_moves += 1
            it.seek(start)
            if not it.valid():
                it.status()
                return None
            first_key = it.key()
            self.iterator_moves += 1
            it.seek_for_prev(pack_key(queue_id, U64_MAX))
            if not it.valid():
                it.status()
                raise StoreCorruption(self.path, f"queue {queue_id}: first key found, last key not found")
            last_key = it.key()
        except StorageError:
            raise
        except Exception as exc:
            raise self._rocks_error(exc) from exc
        for key in (first_key, last_key):
            if len(key) != KEY_SIZE_BYTES:
                raise self._bad_key(key)
        first_seq = int.from_bytes(first_key[_PREFIX_SIZE_BYTES:], "big")
        last_seq = int.from_bytes(last_key[_PREFIX_SIZE_BYTES:], "big")
        return first_seq, last_seq

    def drop_queue(self, queue_id: int) -> None:
        db = self._open()
        start = pack_key(queue_id, 0)
        try:
            db.delete_range(start, queue_end_key(queue_id), self._write_options)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def queue_ids(self) -> list[int]:
        db = self._open()
        ids: list[int] = []
        try:
            it = db.iter()
            self.iterator_moves += 1
            it.seek_to_first()
            # Each pass jumps past a whole queue, and ids strictly increase: at most one pass per queue.
            while it.valid():
                key = it.key()
                if len(key) != KEY_SIZE_BYTES:
                    raise self._bad_key(key)
                queue_id = int.from_bytes(key[:_PREFIX_SIZE_BYTES], "big")
                assert not ids or queue_id > ids[-1], (ids[-1], queue_id)
                ids.append(queue_id)
                if queue_id == U64_MAX:
                    break
                self.iterator_moves += 1
                it.seek(queue_prefix(queue_id + 1))
            else:
                it.status()
        except StorageError:
            raise
        except Exception as exc:
            raise self._rocks_error(exc) from exc
        return ids

    # -- one atomic batch across messages and meta ------------------------------------------

    def write(
        self,
        puts: Iterable[tuple[int, int, bytes]],
        deletes: Iterable[tuple[int, int]],
        meta: dict[str, bytes | None] | None,
        *,
        wal: bool = True,
    ) -> None:
        """Puts, deletes and meta changes (None deletes a meta key) in ONE atomic write.

        `wal=False` skips the WAL for this write only: for data that need not survive a crash
        (a queue's spilled transient messages). A queue's durable records and its counters go in
        one batch, so after a crash they always agree.
        """
        db = self._open()
        assert self._meta is not None
        batch = WriteBatch(raw_mode=True)
        for queue_id, seq, record in puts:
            key = pack_key(queue_id, seq)
            batch.put(key, encode_value(key, record))
        for queue_id, seq in deletes:
            batch.delete(pack_key(queue_id, seq))
        if meta:
            meta_cf = self._meta_handle()
            for meta_key, value in meta.items():
                key_bytes = _meta_key_bytes(meta_key)
                if value is None:
                    batch.delete(key_bytes, meta_cf)
                else:
                    batch.put(key_bytes, encode_value(key_bytes, value), meta_cf)
        if batch.is_empty():
            return
        options = self._write_options
        if not wal and self.wal:
            options = self._no_wal_options
        try:
            db.write(batch, options)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def _meta_handle(self) -> ColumnFamily:
        handle = self._meta_cf_handle
        if handle is None:
            handle = self._meta_cf_handle = self._open().get_column_family_handle(META_CF)
        return handle

    def sync_wal(self) -> None:
        """fsync the WAL: every write (with WAL) that returned before this call is now durable.

        Safe from one other thread while the owner writes (group commit); rocksdict releases
        the GIL during the fsync.
        """
        db = self._open()
        if not self.wal:
            self.flush()
            return
        try:
            db.flush_wal(True)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    # -- meta ------------------------------------------------------------------------------

    def put_meta(self, key: str, value: bytes) -> None:
        self._open()
        assert self._meta is not None
        key_bytes = _meta_key_bytes(key)
        stored = encode_value(key_bytes, value)
        try:
            self._meta.put(key_bytes, stored, self._write_options)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def get_meta(self, key: str) -> bytes | None:
        self._open()
        assert self._meta is not None
        key_bytes = _meta_key_bytes(key)
        try:
            stored = self._meta.get(key_bytes)
        except Exception as exc:
            raise self._rocks_error(exc) from exc
        if stored is None:
            return None
        value = decode_value(key_bytes, stored)
        if value is None:
            raise CorruptRecord(self.path, describe_damage(key_bytes, stored), meta_key=key)
        return value

    # -- lifecycle -------------------------------------------------------------------------

    def usage(self) -> dict[str, int]:
        """RocksDB's own figures (bytes): SST files on disk, memtables, block cache. Bounded by
        the settings above; reading them takes no lock of ours (RocksDB's properties are
        thread-safe), so the metrics endpoint may ask while the syncer writes."""
        db = self._db
        if db is None:
            return {}
        return {
            "sst_bytes": db.property_int_value("rocksdb.total-sst-files-size") or 0,
            "memtable_bytes": db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0,
            "block_cache_bytes": self._cache.get_usage(),
        }

    def flush(self) -> None:
        """Make every write so far durable: fsync the WAL, or without a WAL flush the memtables
        (messages first, then meta, so meta is never newer on disk than the messages)."""
        db = self._open()
        assert self._meta is not None
        try:
            if self.wal:
                db.flush_wal(True)
            else:
                db.flush(True)
                self._meta.flush(True)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def compact(self, queue_id: int | None = None) -> None:
        """Compact one queue's key range (or everything) now, so space freed by deletes returns
        to the file system; RocksDB otherwise does this in the background, in its own time."""
        db = self._open()
        begin, end = (None, None) if queue_id is None else (pack_key(queue_id, 0), queue_end_key(queue_id))
        try:
            db.compact_range(begin, end)
        except Exception as exc:
            raise self._rocks_error(exc) from exc

    def close(self) -> None:
        if self._db is None:
            return
        try:
            if not self.read_only:
                self.flush()
        finally:
            self._release()

    def _release(self) -> None:
        # The column family handle first: while it lives, rocksdict keeps the database (and LOCK) open.
        # A handle whose writes failed fails its close too ("Writer has previous error"): the
        # database is still released once the last reference goes, so both are dropped anyway,
        # and the first error is reported (as a StorageError) only after both are.
        meta, db = self._meta, self._db
        self._meta = self._db = None
        self._meta_cf_handle = None  # a live handle also keeps the database open
        error: str | None = None
        for handle in (meta, db):
            if handle is None:
                continue
            try:
                handle.close()
            except Exception as exc:  # rocksdict raises plain Exception for RocksDB statuses
                error = error or str(exc)
        del meta, db, handle
        if error is not None:
            raise StorageError(f"store {self.path}: closing: RocksDB: {error}")

    def __repr__(self) -> str:
        state = "closed" if self._db is None else "open"
        return f"RocksSegmentStore({self.path!r}, wal={self.wal}, sync_writes={self.sync_writes}, {state})"

    def __enter__(self) -> RocksSegmentStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------------

    def _open(self) -> Rdict:
        db = self._db
        if db is None:
            raise StoreClosed(f"store {self.path} is closed")
        return db

    def _rocks_error(self, exc: Exception) -> StorageError:
        message = str(exc)
        if message.startswith("Corruption"):
            return StoreCorruption(self.path, f"RocksDB: {message}")
        return StorageError(f"store {self.path}: RocksDB: {message}")

    def _corrupt(self, key: bytes, value: bytes) -> StorageError:
        if len(key) != KEY_SIZE_BYTES:
            return self._bad_key(key)
        queue_id, seq = int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big")
        return CorruptRecord(self.path, describe_damage(key, value), queue_id=queue_id, seq=seq)

    def _bad_key(self, key: bytes) -> StoreCorruption:
        return StoreCorruption(
            self.path, f"key {key[:32].hex()} is {len(key)} bytes, message keys are {KEY_SIZE_BYTES}"
        )


def _meta_key_bytes(key: str) -> bytes:
    if not isinstance(key, str):
        raise ValueError(f"meta key {key!r} must be a str")
    return key.encode("utf-8")


class _Problems:
    """A bounded list of problems: the first `problems_max`, then a count of the rest."""

    def __init__(self, problems_max: int) -> None:
        self.items: list[str] = []
        self.problems_max = problems_max
        self.dropped = 0

    def add(self, problem: str) -> None:
        if len(self.items) < self.problems_max:
            self.items.append(problem)
        else:
            self.dropped += 1

    def result(self) -> list[str]:
        if self.dropped:
            return [*self.items, f"... and {self.dropped} more problems"]
        return list(self.items)


def verify(path: str | os.PathLike[str], *, problems_max: int = VERIFY_PROBLEMS_MAX) -> list[str]:
    """Open the store read-only and check every record's checksum and key shape; [] means healthy.

    Each problem is one line naming the store and, for a record, its queue and seq (or meta key);
    at most `problems_max` are listed, then a count of the rest. Safe while a server runs on the
    folder (read-only opens take no LOCK), though it then sees a point-in-time view."""
    path = os.fspath(path)
    try:
        fresh = _check_folder(path, clean=False)
    except StoreCorruption as exc:
        return [str(exc)]
    if fresh and interrupted_creation(path):
        return [f"store {path}: no store here (a creation that did not finish; a start creates it again)"]
    if fresh:
        return [f"store {path}: no store here (missing or empty folder)"]
    try:
        db, meta = _open_rdict(path, Cache(BLOCK_CACHE_BYTES), fresh=False, read_only=True)
    except StorageError as exc:
        return [str(exc)]
    problems = _Problems(problems_max)
    try:
        problem = _format_problem(meta)
        if problem is not None:
            problems.add(f"store {path}: {problem}")
        _verify_messages(path, db, problems)
        _verify_meta(path, meta, problems)
    finally:
        meta.close()
        db.close()
    return problems.result()


def _verify_messages(path: str, db: Rdict, problems: _Problems) -> None:
    try:
        it = db.iter()  # not Rdict.items(): it would end silently at a damaged block
        it.seek_to_first()
        while it.valid():
            key, value = it.key(), it.value()
            if len(key) != KEY_SIZE_BYTES:
                problems.add(
                    f"store {path}: key {key[:32].hex()} is {len(key)} bytes, message keys are {KEY_SIZE_BYTES}"
                )
            elif decode_value(key, value) is None:
                queue_id, seq = int.from_bytes(key[:8], "big"), int.from_bytes(key[8:], "big")
                problems.add(str(CorruptRecord(path, describe_damage(key, value), queue_id=queue_id, seq=seq)))
            it.next()
        it.status()
    except Exception as exc:  # RocksDB stops at a damaged block: report it, go on to meta
        problems.add(f"store {path}: reading messages stopped: RocksDB: {exc}")


def _verify_meta(path: str, meta: Rdict, problems: _Problems) -> None:
    try:
        it = meta.iter()
        it.seek_to_first()
        while it.valid():
            key, value = it.key(), it.value()
            it.next()
            if key == _FORMAT_KEY:
                continue  # checked by _format_problem
            try:
                label = key.decode("utf-8")
            except UnicodeDecodeError:
                problems.add(f"store {path}: meta key {key[:32].hex()} is not UTF-8")
                continue
            if decode_value(key, value) is None:
                problems.add(str(CorruptRecord(path, describe_damage(key, value), meta_key=label)))
        it.status()
    except Exception as exc:
        problems.add(f"store {path}: reading meta stopped: RocksDB: {exc}")
