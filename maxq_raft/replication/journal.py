"""The durable record of a Raft log: append-only segment files, group-committed by one writer thread.

Theory of operation
-------------------
`append` (the log owner's thread, e.g. the Raft tick thread) checks that the index is the next
one, puts the entry in an in-memory tail and in the writer's queue, and returns: the entry is
readable at once and durable later. One writer thread takes *everything* queued, `os.write`s it
to the active segment and calls `os.fdatasync` once for the batch (group commit: while one
fdatasync runs, new appends queue up and go in the next batch; docs/design.md §3, §7: one fdatasync
costs 160-190 us here, so never one per entry). Only then does `durable_index` advance and
`on_durable(durable_index)` run, in the writer thread; the caller bridges threads itself. A
confirm to a publisher means "fsynced" (docs/design.md §4), so nothing claims durability earlier.
An owner that sets `wake_writer = False` calls `write_pending` after its appends instead: it
writes a small batch itself, in its own thread, with the same write, fdatasync and publication
of durable_index (two thread hand-offs fewer per batch), and wakes the writer for a large one.

On disk (folder):
  <first index, 20 digits>.seg  segments; one record after another, big-endian:
                                u32 payload length | u32 crc32 | u64 index | u64 term | payload
                                (`length` counts the payload bytes only; the crc covers index,
                                term and payload, i.e. the record's bytes 8..end). A segment
                                rolls over before a record would take it past
                                `segment_max_bytes`; a bigger record gets a segment of its own.
  journal.meta                  first_index, the log's floor (entries below it are compacted
                                away), written temp + fsync + rename + fsync(dir), 20 bytes:
                                magic "MQJM" | u32 version | u64 first_index | u32 crc32.
  LOCK                          flock'ed while a Journal is open: one owner per folder.

Recovery (`Journal.open`) reads journal.meta and scans every segment, checking every crc, that
each segment starts where its name says, and that indexes run without gap or repeat across
segments. The last record of the last segment may be torn (incomplete, or its crc bad, with no
valid record after it): that is what a crash before fdatasync leaves, so it is cut off with a
warning. Anything else is `JournalCorruption` naming the file, the byte offset and the problem;
`verify(folder)` reports the same problems without changing anything (for `--check`). Segments
wholly below first_index are leftovers of an interrupted compaction and are deleted. Open also
fdatasyncs the last segment: what a killed process had written may still be only in the page
cache, and it is about to be reported durable.

Memory is bounded: the writer's queue holds at most `queue_bytes_max` (append blocks, at most
`append_wait_s_max`, when the writer is that far behind), the tail cache keeps at most
`tail_cache_bytes_max` of written entries, and older entries are read back from disk through a
sparse offset index (one checkpoint per 64 KiB of segment) in bounded chunks.

Threads: `append`, `truncate_after`, `compact_before` and `close` belong to one thread (the log's
owner); `read`, the properties and `wait_durable` may be called from any thread. `append` takes
no lock on its fast path (a tight appender holding a lock would starve the writer under the GIL);
the writer takes a batch only while holding the io lock that truncate/compact also take, so a
batch is either dropped before it is written or cut from the files after. An iterator from
`read` raises RuntimeError if the log is truncated or compacted while it is consumed.
Standard library only: this module imports neither trio nor pysyncobj.
"""

from __future__ import annotations

import bisect
import collections
import errno
import fcntl
import logging
import mmap
import os
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

__all__ = [
    "Journal",
    "JournalError",
    "JournalCorruption",
    "JournalClosed",
    "JournalStalled",
    "verify",
    "segment_name",
    "RECORD_HEADER",
]

log = logging.getLogger(__name__)

MiB = 1024 * 1024

# u32 payload length | u32 crc32 | u64 index | u64 term; the crc covers bytes 8.. of the record.
RECORD_HEADER = struct.Struct(">IIQQ")
_LENGTH_CRC = struct.Struct(">II")
_INDEX_TERM = struct.Struct(">QQ")
_INDEX = struct.Struct(">Q")
HEADER_BYTES = RECORD_HEADER.size  # 24

META_NAME = "journal.meta"
META_TMP_NAME = "journal.meta.tmp"
LOCK_NAME = "LOCK"
_META = struct.Struct(">4sIQI")  # magic, version, first_index, crc32 of the first 16 bytes
_META_MAGIC = b"MQJM"
_META_VERSION = 1
_SEGMENT_RE = re.compile(r"^(\d{20})\.seg$")

SEGMENT_MAX_BYTES_DEFAULT = 64 * MiB
QUEUE_BYTES_MAX_DEFAULT = 64 * MiB
TAIL_CACHE_BYTES_MAX_DEFAULT = 8 * MiB
PAYLOAD_BYTES_MAX = 64 * MiB  # an append above this is refused; a header claiming more is bad
APPEND_WAIT_S_MAX_DEFAULT = 60.0  # append blocks at most this long on a full queue
IO_WAIT_S_MAX = 60.0  # truncate/compact wait at most this long for the writer's batch
CLOSE_JOIN_S_MAX = 30.0
WRITER_IDLE_WAIT_S = 1.0  # the writer re-checks its state at least this often
CHECKPOINT_STRIDE_BYTES = 64 * 1024  # sparse offset index: one (index, offset) per stride
READ_CHUNK_BYTES = 256 * 1024
WRITE_CHUNK_BYTES = 4 * MiB  # the writer hands os.write at most about this much at once
READ_MEM_CHUNK_ENTRIES = 1024
TORN_SEARCH_CANDIDATES_MAX = 100_000


class JournalError(Exception):
    """The journal cannot do what was asked (I/O failure, in use, writer failed)."""


class JournalClosed(JournalError):
    """The journal was closed."""


class JournalStalled(JournalError, TimeoutError):
    """A bounded wait on the writer ran out (the disk is not keeping up or hangs)."""


class JournalCorruption(JournalError):
    """The files are not a log this module could have written, even allowing for a crash.

    `str(exc)` reads "<what> at offset <offset> in <path>[; <detail>]".
    """

    def __init__(self, path: Path | str, offset: int, what: str, detail: str = "") -> None:
        self.path = Path(path)
        self.offset = offset
        self.what = what
        super().__init__(f"{what} at offset {offset} in {path}" + (f"; {detail}" if detail else ""))


def segment_name(first_index: int) -> str:
    return f"{first_index:020d}.seg"


class _Segment:
    """What is known of one segment file. Mutated only under the journal's state lock."""

    __slots__ = ("start", "path", "size", "last", "last_term", "cp_index", "cp_offset")

    def __init__(self, start: int, path: Path) -> None:
        self.start = start
        self.path = path
        self.size = 0  # bytes of valid records
        self.last = start - 1  # last index held; start - 1 when empty
        self.last_term = 0
        self.cp_index: list[int] = []  # sparse offset index, ascending
        self.cp_offset: list[int] = []

    def add_checkpoint(self, index: int, offset: int) -> None:
        if not self.cp_offset or offset - self.cp_offset[-1] >= CHECKPOINT_STRIDE_BYTES:
            self.cp_index.append(index)
            self.cp_offset.append(offset)

    def checkpoint_for(self, index: int) -> tuple[int, int]:
        k = bisect.bisect_right(self.cp_index, index) - 1
        assert k >= 0, (self.path, index)
        return self.cp_index[k], self.cp_offset[k]

    def cut_checkpoints(self, offset: int) -> None:
        k = bisect.bisect_left(self.cp_offset, offset)
        del self.cp_index[k:]
        del self.cp_offset[k:]


# --------------------------------------------------------------------------------- file helpers


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    parts = []
    got = 0
    while got < n:  # bounded: every turn reads > 0 bytes or stops
        chunk = os.pread(fd, n - got, offset + got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:  # bounded: every turn writes > 0 bytes (os.write raises otherwise)
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "os.write wrote nothing")
        view = view[n:]


def _encode_meta(first_index: int) -> bytes:
    head = _META.pack(_META_MAGIC, _META_VERSION, first_index, 0)[:16]
    return head + struct.pack(">I", zlib.crc32(head))


def _read_meta(path: Path) -> int:
    """first_index from journal.meta, or JournalCorruption."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise JournalCorruption(path, 0, f"unreadable meta file ({exc.strerror})") from exc
    if len(data) != _META.size:
        raise JournalCorruption(path, min(len(data), _META.size), f"meta file has {len(data)} bytes, not {_META.size}")
    magic, version, first_index, crc = _META.unpack(data)
    if magic != _META_MAGIC:
        raise JournalCorruption(path, 0, f"bad meta magic {magic!r}")
    if zlib.crc32(data[:16]) != crc:
        raise JournalCorruption(path, 16, "meta crc mismatch")
    if version != _META_VERSION:
        raise JournalCorruption(path, 4, f"unknown meta version {version}")
    if first_index < 1:
        raise JournalCorruption(path, 8, f"meta first_index {first_index} < 1")
    return first_index


def _write_meta(folder: Path, first_index: int) -> None:
    tmp = folder / META_TMP_NAME
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, _encode_meta(first_index))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, folder / META_NAME)
    _fsync_dir(folder)


class _SegmentReader:
    """Records of one segment from `offset` up to `end`, read in bounded chunks (pread)."""

    def __init__(self, fd: int, path: Path, offset: int, end: int) -> None:
        self.fd, self.path, self.end = fd, path, end
        self.buf = b""
        self.pos = 0  # position in buf of the next unread byte
        self.file_pos = offset  # file offset just after buf
        self.offset = offset  # file offset of the next record

    def _take(self, n: int) -> bytes:
        avail = len(self.buf) - self.pos
        if avail < n:
            want = min(max(n - avail, READ_CHUNK_BYTES), self.end - self.file_pos)
            more = _pread_exact(self.fd, want, self.file_pos) if want > 0 else b""
            self.buf = self.buf[self.pos :] + more
            self.pos = 0
            self.file_pos += len(more)
            if len(self.buf) < n:
                raise JournalCorruption(self.path, self.offset, "record runs past the end of the segment")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def next(self, check_crc: bool) -> tuple[int, int, int, bytes]:
        """(offset, index, term, payload) of the next record."""
        offset = self.offset
        length, crc, index, term = RECORD_HEADER.unpack(self._take(HEADER_BYTES))
        if length > PAYLOAD_BYTES_MAX:
            raise JournalCorruption(self.path, offset, f"implausible record length {length}")
        payload = self._take(length)
        if check_crc and zlib.crc32(payload, zlib.crc32(_INDEX_TERM.pack(index, term))) != crc:
            raise JournalCorruption(self.path, offset, "crc mismatch")
        self.offset = offset + HEADER_BYTES + length
        return offset, index, term, payload


# ------------------------------------------------------------------------------------- recovery


class _Torn(NamedTuple):
    path: Path
    offset: int
    file_size: int
    what: str


class _Scan(NamedTuple):
    first_index: int  # the floor from journal.meta (1 for a fresh folder)
    meta_present: bool
    segments: list[_Segment]  # kept, ascending, contiguous
    leftovers: list[Path]  # wholly below first_index: an interrupted compaction's remains
    torn: _Torn | None
    problems: list[JournalCorruption]


def _valid_record_after(mm: mmap.mmap, mv: memoryview, bad_offset: int, expected: int, size: int) -> int | None:
    """Offset of a valid record (index `expected` or `expected + 1`) after a bad one, else None.

    A torn tail has nothing valid after it; a flipped byte in the middle has. The index field is
    searched for at C speed (mmap.find); a bounded number of candidates is examined, and if the
    bound is hit the bad record is treated as corruption (never silently cut a log).
    """
    candidates = 0
    for index in (expected, expected + 1):
        pattern = _INDEX.pack(index)
        pos = mm.find(pattern, bad_offset + 9)  # the index field sits at record offset + 8
        while pos != -1:
            candidates += 1
            if candidates > TORN_SEARCH_CANDIDATES_MAX:
                return pos - 8
            rec = pos - 8
            if rec + HEADER_BYTES <= size:
                length, crc, _, _ = RECORD_HEADER.unpack_from(mm, rec)
                end = rec + HEADER_BYTES + length
                if length <= PAYLOAD_BYTES_MAX and end <= size and zlib.crc32(mv[rec + 8 : end]) == crc:
                    return rec
            pos = mm.find(pattern, pos + 1)
    return None


def _scan_segment(seg: _Segment, is_last: bool) -> tuple[_Torn | None, JournalCorruption | None]:
    """Fill seg (size, last, last_term, checkpoints) from its file; stop at the first bad record."""
    path = seg.path
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        return None, JournalCorruption(path, 0, f"unreadable segment ({exc.strerror})")
    if size == 0:
        if not is_last:
            return None, JournalCorruption(path, 0, "empty segment in the middle of the log")
        return None, None
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        mv = memoryview(mm)
        try:
            off = 0
            expected = seg.start
            last_term = 0
            while off < size:  # bounded: off grows by >= HEADER_BYTES per turn
                what = None
                if size - off < HEADER_BYTES:
                    what = f"incomplete record header ({size - off} of {HEADER_BYTES} bytes)"
                else:
                    length, crc, index, term = RECORD_HEADER.unpack_from(mm, off)
                    end = off + HEADER_BYTES + length
                    if length > PAYLOAD_BYTES_MAX:
                        what = f"implausible record length {length}"
                    elif end > size:
                        what = f"incomplete record ({length} byte payload, {size - off - HEADER_BYTES} bytes left)"
                    elif zlib.crc32(mv[off + 8 : end]) != crc:
                        what = "crc mismatch"
                    elif index != expected:
                        kind = "gap" if index > expected else "repeat"
                        where = " (segment name)" if off == 0 else ""
                        return None, JournalCorruption(
                            path, off, f"{kind} in indexes: index {index} where {expected} expected{where}"
                        )
                    elif term < last_term:
                        return None, JournalCorruption(
                            path, off, f"term goes backwards: {term} after {last_term} at index {index}"
                        )
                if what is not None:
                    if not is_last:
                        return None, JournalCorruption(
                            path, off, what, "only the last segment may end in a torn record"
                        )
                    after = _valid_record_after(mm, mv, off, expected, size)
                    if after is None:
                        return _Torn(path, off, size, what), None
                    return None, JournalCorruption(
                        path, off, what, f"a valid record follows at offset {after}, so this is no torn tail"
                    )
                seg.add_checkpoint(index, off)
                seg.size = end
                seg.last = index
                seg.last_term = last_term = term
                expected += 1
                off = end
        finally:
            mv.release()
    return None, None


def _list_segments(folder: Path, problems: list[JournalCorruption]) -> list[_Segment]:
    segments = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".seg"):
            continue
        m = _SEGMENT_RE.match(name)
        if m is None or int(m.group(1)) < 1:
            problems.append(JournalCorruption(folder / name, 0, "unexpected segment file name"))
            continue
        segments.append(_Segment(int(m.group(1)), folder / name))
    segments.sort(key=lambda s: s.start)
    return segments


def _scan_folder(folder: Path, *, stop_at_first: bool) -> _Scan:
    """Everything recovery and verify need to know; changes nothing on disk."""
    problems: list[JournalCorruption] = []

    def problem(p: JournalCorruption) -> None:
        problems.append(p)
        if stop_at_first:
            raise p

    segments = _list_segments(folder, problems)
    if problems and stop_at_first:
        raise problems[0]
    meta_path = folder / META_NAME
    meta_present = meta_path.exists()
    first_index = 1
    if meta_present:
        try:
            first_index = _read_meta(meta_path)
        except JournalCorruption as exc:
            problem(exc)
            first_index = segments[0].start if segments else 1
    elif segments:
        problem(JournalCorruption(meta_path, 0, "meta file missing although segments exist"))
        first_index = segments[0].start

    leftovers = []
    while len(segments) >= 2 and segments[1].start <= first_index:  # segments[0] holds only < first_index
        leftovers.append(segments.pop(0).path)
    if segments and segments[0].start > first_index:
        problem(
            JournalCorruption(
                segments[0].path,
                0,
                f"missing segment: the log begins at index {first_index} ({META_NAME}) but the first segment starts at {segments[0].start}",
            )
        )

    torn = None
    prev: _Segment | None = None
    for k, seg in enumerate(segments):
        is_last = k == len(segments) - 1
        if prev is not None and seg.start != prev.last + 1:
            kind = "gap" if seg.start > prev.last + 1 else "repeat"
            problem(
                JournalCorruption(
                    seg.path,
                    0,
                    f"{kind} in indexes: the previous segment ends at index {prev.last}, this one starts at {seg.start}"
                    + (" (missing segment?)" if kind == "gap" else ""),
                )
            )
        seg_torn, bad = _scan_segment(seg, is_last)
        if bad is not None:
            problem(bad)
            prev = None  # unknown where it ends: do not cascade
            continue
        if seg_torn is not None:
            torn = seg_torn
        prev = seg

    # The only segment left ends below first_index - 1: a compaction past the end of the log
    # (compact_before beyond last_index + 1) was interrupted before deleting it.
    if len(segments) == 1 and segments[0].start < first_index and segments[0].last < first_index - 1 and not problems:
        leftovers.append(segments.pop(0).path)
        if torn is not None and torn.path == leftovers[-1]:
            torn = None
    return _Scan(first_index, meta_present, segments, leftovers, torn, problems)


def verify(folder: Path | str) -> list[str]:
    """Problems found in a journal folder (empty if it would open cleanly); changes nothing.

    A torn tail is not a problem (open cuts it off) and neither are leftover segments below
    first_index (open deletes them); both are logged at INFO. A journal open in another process
    is reported rather than read, as its files change underneath.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder}: not a directory"]
    lock_path = folder / LOCK_NAME
    lock_fd = None
    if lock_path.exists():
        lock_fd = os.open(lock_path, os.O_RDONLY)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            return [f"{folder}: journal is open in another process ({LOCK_NAME} is held); stop it before checking"]
    try:
        scan = _scan_folder(folder, stop_at_first=False)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)
    if scan.torn is not None:
        log.info(
            "torn tail (%s) at offset %d in %s: open would cut %d bytes",
            scan.torn.what,
            scan.torn.offset,
            scan.torn.path,
            scan.torn.file_size - scan.torn.offset,
        )
    for path in scan.leftovers:
        log.info("leftover segment below first_index %d: open would delete %s", scan.first_index, path)
    return [str(p) for p in scan.problems]


# -------------------------------------------------------------------------------------- journal


class Journal:
    """The durable record of one log. Build it with `Journal.open`."""

    @classmethod
    def open(
        cls,
        folder: Path | str,
        *,
        fsync: bool = True,
        segment_max_bytes: int = SEGMENT_MAX_BYTES_DEFAULT,
        on_durable: Callable[[int], None] | None = None,
        queue_bytes_max: int = QUEUE_BYTES_MAX_DEFAULT,
        tail_cache_bytes_max: int = TAIL_CACHE_BYTES_MAX_DEFAULT,
        append_wait_s_max: float = APPEND_WAIT_S_MAX_DEFAULT,
    ) -> Journal:
        """Recover whatever is in `folder` (created if missing) and start the writer thread.

        fsync=False skips fdatasync of segment data (per batch and at rollover) and the
        directory fsync after creating a segment: for benchmarks only, the caller logs it.
        truncate_after, compact_before, the meta file and close still fsync (rare, structural).
        Raises JournalCorruption, or JournalError if another Journal has the folder open.
        """
        if segment_max_bytes < 1 or queue_bytes_max < 1 or tail_cache_bytes_max < 0 or append_wait_s_max < 0:
            raise ValueError("segment_max_bytes and queue_bytes_max must be positive, the others >= 0")
        return cls(
            Path(folder), fsync, segment_max_bytes, on_durable, queue_bytes_max, tail_cache_bytes_max, append_wait_s_max
        )

    def __init__(
        self,
        folder: Path,
        fsync: bool,
        segment_max_bytes: int,
        on_durable: Callable[[int], None] | None,
        queue_bytes_max: int,
        tail_cache_bytes_max: int,
        append_wait_s_max: float,
    ) -> None:
        """Use Journal.open."""
        self.folder = folder
        self._fsync = fsync
        self._segment_max_bytes = segment_max_bytes
        self._on_durable = on_durable
        # Called once, in the writer thread, when the writer fails (a full disk, an I/O error):
        # nothing after durable_index will ever be durable in this journal's life.
        self.on_failed: Callable[[BaseException], None] | None = None
        self._queue_bytes_max = queue_bytes_max
        self._tail_cache_bytes_max = tail_cache_bytes_max
        self._append_wait_s_max = append_wait_s_max
        self._lock_fd: int | None = None
        self._active_fd: int | None = None  # fd of segments[-1]; io lock
        self._closed = True
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(folder.parent)
        self._lock_fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise JournalError(f"journal {folder} is already open ({LOCK_NAME} is held)") from None
        try:
            self._recover()
        except BaseException:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise

        self._lock = threading.Lock()  # state lock: everything below
        self._writer_wake = threading.Condition(self._lock)
        self._progress = threading.Condition(self._lock)  # durable advanced / queue drained
        self._io_lock = threading.Lock()  # files and _active_fd; taken before the state lock
        # append takes no lock (a tight appender would otherwise starve the writer of the state
        # lock under the GIL, and batches would wait for the queue to fill): it only appends to
        # the deque/list (atomic under the GIL) and bumps counters that it alone writes; the
        # "out" counters are written under the state lock. Bytes held = in - out.
        self._queue: collections.deque[tuple[int, int, bytes]] = collections.deque()  # not yet taken by the writer
        self._queue_bytes_in = 0  # owner only
        self._queue_bytes_out = 0  # written or dropped; state lock
        self._mem: list[tuple[int, int, bytes]] = []  # tail cache: _mem[_mem_head:] are contiguous, end at last_index
        self._mem_head = 0  # state lock
        self._mem_bytes_in = 0  # owner only
        self._mem_bytes_out = 0  # state lock
        self._appends = 0  # owner only
        self._written_index = self._last_index  # on disk (os.write done) and published
        self._durable_index = self._last_index
        self._generation = 0  # bumped by truncate/compact: invalidates read iterators
        self._writer_idle = False
        self._stopping = False
        self._error: BaseException | None = None
        self._stats = {"batches": 0, "fdatasyncs": 0, "bytes_written": 0, "batch_entries_max": 0}
        # Told the seconds each data fdatasync took (writer thread), e.g. SyncLatency.observe:
        # the owner's metrics; this module imports nothing of ours.
        self.on_fdatasync: Callable[[float], None] | None = None
        # False: append leaves the writer asleep; the owner calls write_pending after its appends
        # (it writes a small batch itself, a hand-off to the writer thread and back saved)
        self.wake_writer = True
        self._closed = False
        self._thread = threading.Thread(target=self._writer_main, name=f"journal-writer:{folder.name}", daemon=True)
        self._thread.start()

    def _recover(self) -> None:
        folder = self.folder
        tmp = folder / META_TMP_NAME
        if tmp.exists():
            tmp.unlink()  # a meta write that never reached its rename
        scan = _scan_folder(folder, stop_at_first=True)
        if not scan.meta_present:
            _write_meta(folder, scan.first_index)
        for path in scan.leftovers:
            log.info("deleting leftover segment below first_index %d: %s", scan.first_index, path)
            path.unlink()
        if scan.leftovers:
            _fsync_dir(folder)
        if scan.torn is not None:
            t = scan.torn
            log.warning(
                "torn tail (%s) at offset %d in %s: cutting %d bytes (a crash before fsync)",
                t.what,
                t.offset,
                t.path,
                t.file_size - t.offset,
            )
            fd = os.open(t.path, os.O_WRONLY)
            try:
                os.ftruncate(fd, t.offset)
                os.fsync(fd)
            finally:
                os.close(fd)
        self._segments: list[_Segment] = scan.segments
        self._first_index = scan.first_index
        if self._segments and self._segments[-1].last >= self._first_index - 1:
            self._last_index = self._segments[-1].last
            self._last_term = self._segments[-1].last_term
            # What a killed process wrote may be only in the page cache: make it durable before
            # reporting it so. Earlier segments were fdatasynced before the next was created.
            fd = os.open(self._segments[-1].path, os.O_RDONLY)
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)
        else:
            self._last_index = self._first_index - 1
            self._last_term = 0
        _fsync_dir(folder)

    # ------------------------------------------------------------------------------ properties

    @property
    def first_index(self) -> int:
        """The lowest index `read` serves; last_index + 1 when the log is empty."""
        return self._first_index

    @property
    def last_index(self) -> int:
        """The highest appended index (durable or not); first_index - 1 when empty."""
        return self._last_index

    @property
    def last_term(self) -> int:
        """Term of the last entry; 0 when the log is empty (added to the brief's API)."""
        return self._last_term

    @property
    def durable_index(self) -> int:
        """Every entry <= durable_index that the log holds is on disk (fdatasynced)."""
        return self._durable_index

    @property
    def closed(self) -> bool:
        return self._closed

    def stats(self) -> dict[str, int]:
        """Counters: appends, batches, fdatasyncs (per-batch and rollover), bytes_written,
        batch_entries_max, queue_bytes (now), tail_cache_bytes (now)."""
        with self._lock:
            return {
                **self._stats,
                "appends": self._appends,
                "queue_bytes": self._queue_bytes_in - self._queue_bytes_out,
                "tail_cache_bytes": self._mem_bytes_in - self._mem_bytes_out,
            }

    # ---------------------------------------------------------------------------------- append

    def append(self, index: int, term: int, payload: bytes) -> None:
        """Queue one entry; readable at once, durable once durable_index >= index.

        Raises ValueError if index != last_index + 1, the term is below last_term, or the
        payload exceeds PAYLOAD_BYTES_MAX. Blocks while the writer's queue holds
        queue_bytes_max, at most append_wait_s_max, then raises JournalStalled.
        """
        if self._closed or self._error is not None:
            self._check_usable()
        if index != self._last_index + 1:
            raise ValueError(f"append of index {index}, expected {self._last_index + 1} (last_index + 1)")
        if term < self._last_term:
            raise ValueError(f"append of term {term} below the last term {self._last_term}")
        if len(payload) > PAYLOAD_BYTES_MAX:
            raise ValueError(f"payload of {len(payload)} bytes exceeds {PAYLOAD_BYTES_MAX}")
        size = HEADER_BYTES + len(payload)
        held = self._queue_bytes_in - self._queue_bytes_out
        if held and held + size > self._queue_bytes_max:
            self._wait_queue_room(size)
        entry = (index, term, bytes(payload))
        # Order matters to lock-free readers: in the tail cache before last_index covers it, and
        # last_index before the writer can take it (it never claims more than last_index).
        self._mem.append(entry)
        self._mem_bytes_in += size
        self._last_index = index
        self._last_term = term
        self._queue_bytes_in += size
        self._queue.append(entry)
        self._appends += 1
        if self._writer_idle and self.wake_writer:  # set under the lock before the writer checks the queue and sleeps
            with self._lock:
                self._writer_idle = False
                self._writer_wake.notify()

    def write_pending(self, inline_bytes_max: int) -> int | None:
        """The owner's turn after its appends when `wake_writer` is False: what is queued is
        written and fdatasynced here, in the caller's thread, when it is at most
        `inline_bytes_max` bytes and the writer is asleep; else the writer is woken for it.
        Returns the new durable index when it wrote here (on_durable is not called then: the
        caller knows), else None. A write that fails fails the journal as the writer's would
        (JournalError; no entry after durable_index is durable)."""
        if not self._queue:
            return None
        held = self._queue_bytes_in - self._queue_bytes_out
        if held > inline_bytes_max or not self._writer_idle or not self._io_lock.acquire(blocking=False):
            with self._lock:
                if self._writer_idle:
                    self._writer_idle = False
                    self._writer_wake.notify()
            return None
        try:
            self._check_usable()
            with self._lock:
                queue = self._queue
                batch = [queue.popleft() for _ in range(len(queue))]
            if not batch:
                return None
            try:
                return self._write_batch(batch)
            except BaseException as exc:
                self._fail(exc, "a write by its owner")
                raise JournalError(f"journal write failed: {exc!r}") from exc
        finally:
            self._io_lock.release()

    def _wait_queue_room(self, size: int) -> None:
        """Wait (bounded by append_wait_s_max) until the writer has drained enough."""
        deadline = time.monotonic() + self._append_wait_s_max
        with self._lock:
            while True:  # bounded by the deadline
                held = self._queue_bytes_in - self._queue_bytes_out
                if not held or held + size <= self._queue_bytes_max:
                    return
                self._check_usable()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise JournalStalled(
                        f"journal writer is {held} bytes behind for more than {self._append_wait_s_max} s"
                    )
                if self._writer_idle:
                    self._writer_idle = False
                    self._writer_wake.notify()
                self._progress.wait(left)

    def wait_durable(self, index: int, timeout_s: float) -> bool:
        """True once durable_index >= index; False after timeout_s (or if the journal closed
        before that). Raises JournalError if the writer failed."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._durable_index < index:
                if self._error is not None:
                    raise JournalError(f"journal writer failed: {self._error!r}") from self._error
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._progress.wait(left)
            return True

    # ---------------------------------------------------------------------------------- writer

    def _writer_main(self) -> None:
        try:
            while True:  # until close: every wait below is bounded
                with self._lock:
                    while not self._stopping:
                        self._writer_idle = True  # before looking at the queue: see append
                        if self._queue:
                            break
                        self._writer_wake.wait(WRITER_IDLE_WAIT_S)
                    self._writer_idle = False
                    if not self._queue:
                        return  # stopping and drained
                # The batch is taken only while holding the io lock: a truncate_after then
                # either removes entries before we take them, or cuts them from the files after
                # we wrote them, never misses a batch that is between queue and file.
                with self._io_lock:
                    with self._lock:
                        # popleft of a count taken now: the owner may append concurrently
                        queue = self._queue
                        batch = [queue.popleft() for _ in range(len(queue))]
                    if not batch:
                        continue  # truncated or compacted away meanwhile
                    durable = self._write_batch(batch)
                if self._on_durable is not None:
                    try:
                        self._on_durable(durable)
                    except Exception:
                        log.exception("on_durable(%d) raised; the journal carries on", durable)
        except BaseException as exc:
            self._fail(exc, "its writer")
            if self.on_failed is not None:
                try:
                    self.on_failed(exc)
                except Exception:
                    log.exception("on_failed raised")

    def _fail(self, exc: BaseException, where: str) -> None:
        """A write or fdatasync failed: the journal is failed for good (appends and waits raise)."""
        log.critical(
            "journal %s: %s failed (%s); no entry after durable_index %d is durable",
            self.folder,
            where,
            exc,
            self._durable_index,
        )
        with self._lock:
            self._error = exc
            self._progress.notify_all()

    def _open_segment(self, start: int) -> tuple[_Segment, int]:
        seg = _Segment(start, self.folder / segment_name(start))
        fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        if self._fsync:
            _fsync_dir(self.folder)  # the new name must survive a crash before its data counts
        return seg, fd

    def _write_batch(self, batch: list[tuple[int, int, bytes]]) -> int:
        """Under the io lock: write, fdatasync, publish. Returns the new durable index."""
        with self._lock:
            seg = self._segments[-1] if self._segments else None
            expected = seg.last + 1 if seg is not None else self._written_index + 1
        if batch[0][0] != expected:  # the pair of append's contiguity check, before writing
            raise AssertionError(
                f"journal writer: batch starts at index {batch[0][0]}, the files end before {expected}"
            )
        if seg is not None and self._active_fd is None:
            self._active_fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
        fd = self._active_fd
        # Only the writer (holding the io lock, as truncate/compact do) changes segments, so
        # their fields can be read here without the state lock; changes are published below.
        seg_size = seg.size if seg is not None else 0
        last_cp = seg.cp_offset[-1] if seg is not None and seg.cp_offset else -CHECKPOINT_STRIDE_BYTES
        new_segments: list[_Segment] = []
        new_checkpoints: list[tuple[_Segment, int, int]] = []
        ends: list[tuple[_Segment, int, int, int]] = []  # (segment, size, last index, last term)
        buf = bytearray()
        batch_bytes = 0
        fdatasyncs = 0
        index = term = 0
        prev_term = seg.last_term if seg is not None else 0
        crc32, pack_it, pack_lc = zlib.crc32, _INDEX_TERM.pack, _LENGTH_CRC.pack
        for index, term, payload in batch:
            rec_bytes = HEADER_BYTES + len(payload)
            batch_bytes += rec_bytes
            if seg is None or (seg_size > 0 and seg_size + rec_bytes > self._segment_max_bytes):
                if seg is not None:  # rollover: the full segment is complete and synced first
                    _write_all(fd, buf)
                    buf.clear()
                    if self._fsync:
                        started_s = time.monotonic()
                        os.fdatasync(fd)
                        if self.on_fdatasync is not None:
                            self.on_fdatasync(time.monotonic() - started_s)
                        fdatasyncs += 1
                    os.close(fd)
                    self._active_fd = None
                    ends.append((seg, seg_size, index - 1, prev_term))
                seg, fd = self._open_segment(index)
                self._active_fd = fd
                new_segments.append(seg)
                seg_size = 0
                last_cp = -CHECKPOINT_STRIDE_BYTES
            it = pack_it(index, term)
            buf += pack_lc(len(payload), crc32(payload, crc32(it)))
            buf += it
            buf += payload
            if seg_size - last_cp >= CHECKPOINT_STRIDE_BYTES:
                new_checkpoints.append((seg, index, seg_size))
                last_cp = seg_size
            seg_size += rec_bytes
            prev_term = term
            if len(buf) >= WRITE_CHUNK_BYTES:
                _write_all(fd, buf)
                buf.clear()
        assert seg is not None and fd is not None
        ends.append((seg, seg_size, index, term))
        if buf:
            _write_all(fd, buf)
        if self._fsync:
            started_s = time.monotonic()
            os.fdatasync(fd)
            if self.on_fdatasync is not None:
                self.on_fdatasync(time.monotonic() - started_s)
            fdatasyncs += 1
        with self._lock:
            for seg_, index_, offset_ in new_checkpoints:
                seg_.cp_index.append(index_)
                seg_.cp_offset.append(offset_)
            for seg_, size_, last_, term_ in ends:
                seg_.size, seg_.last, seg_.last_term = size_, last_, term_
            self._segments.extend(new_segments)
            # A truncate_after may have dropped part of this batch meanwhile: never claim more
            # than the log still holds (it cuts the files itself, under the io lock, after us).
            self._written_index = max(self._written_index, min(index, self._last_index))
            self._durable_index = max(self._durable_index, min(index, self._last_index))
            self._queue_bytes_out += batch_bytes
            self._trim_mem()
            self._stats["batches"] += 1
            self._stats["fdatasyncs"] += fdatasyncs
            self._stats["bytes_written"] += batch_bytes
            self._stats["batch_entries_max"] = max(self._stats["batch_entries_max"], len(batch))
            self._progress.notify_all()
            return self._durable_index

    def _trim_mem(self) -> None:
        """Under the state lock: drop written entries from the tail cache beyond its budget."""
        mem = self._mem
        head = self._mem_head
        while (
            self._mem_bytes_in - self._mem_bytes_out > self._tail_cache_bytes_max
            and head < len(mem)
            and mem[head][0] <= self._written_index
        ):
            self._mem_bytes_out += HEADER_BYTES + len(mem[head][2])
            head += 1
        if head > 1024 and head * 2 > len(mem):
            del mem[:head]
            head = 0
        self._mem_head = head

    def _mem_first(self) -> int:
        return self._mem[self._mem_head][0] if self._mem_head < len(self._mem) else self._last_index + 1

    # ------------------------------------------------------------------------------------ read

    def read(self, index_from: int, index_to: int | None = None) -> Iterator[tuple[int, int, bytes]]:
        """(index, term, payload) for index_from..min(index_to, last_index), in order.

        Served from the tail cache or from disk in bounded chunks. ValueError if index_from is
        below first_index (compacted away); empty if it is beyond last_index. Every record read
        from disk has its crc checked (JournalCorruption otherwise).
        """
        with self._lock:
            if self._closed:
                raise JournalClosed(f"journal {self.folder} is closed")
            if index_from < self._first_index:
                raise ValueError(f"index {index_from} is below first_index {self._first_index} (compacted)")
            stop = self._last_index if index_to is None else min(index_to, self._last_index)
            generation = self._generation
        return self._read_iter(index_from, stop, generation)

    def _read_iter(self, i: int, stop: int, generation: int) -> Iterator[tuple[int, int, bytes]]:
        while i <= stop:  # bounded: each turn yields >= 1 entry or raises
            with self._lock:
                if self._generation != generation:
                    raise RuntimeError("journal truncated or compacted while being read")
                mem_first = self._mem_first()
                if i >= mem_first:
                    k = self._mem_head + (i - mem_first)
                    chunk = self._mem[k : k + min(stop - i + 1, READ_MEM_CHUNK_ENTRIES)]
                    disk = None
                else:
                    s = bisect.bisect_right(self._segments, i, key=lambda seg: seg.start) - 1
                    seg = self._segments[s]
                    assert seg.start <= i <= seg.last, (i, seg.path, seg.last)
                    j = min(stop, mem_first - 1, seg.last)
                    cp_index, cp_offset = seg.checkpoint_for(i)
                    disk = (seg.path, seg.size, cp_index, cp_offset, j)
            if disk is None:
                assert chunk and chunk[0][0] == i, (i, chunk[:1])
                for entry in chunk:
                    if self._generation != generation:
                        raise RuntimeError("journal truncated or compacted while being read")
                    yield entry
                i += len(chunk)
            else:
                path, size, cp_index, cp_offset, j = disk
                for entry in self._read_disk(path, size, cp_index, cp_offset, i, j, generation):
                    yield entry
                i = j + 1

    def _read_disk(
        self, path: Path, size: int, cp_index: int, cp_offset: int, i: int, j: int, generation: int
    ) -> Iterator[tuple[int, int, bytes]]:
        fd = os.open(path, os.O_RDONLY)
        try:
            reader = _SegmentReader(fd, path, cp_offset, size)
            expected = cp_index
            while expected <= j:  # bounded by j
                try:
                    offset, index, term, payload = reader.next(check_crc=expected >= i)
                    if index != expected:
                        raise JournalCorruption(path, offset, f"index {index} where {expected} expected")
                except JournalCorruption:
                    if self._generation != generation:
                        raise RuntimeError("journal truncated or compacted while being read") from None
                    raise
                expected += 1
                if index >= i:
                    if self._generation != generation:
                        raise RuntimeError("journal truncated or compacted while being read")
                    yield index, term, payload
        finally:
            os.close(fd)

    # ------------------------------------------------------------------------ truncate/compact

    def _acquire_io(self) -> None:
        if not self._io_lock.acquire(timeout=IO_WAIT_S_MAX):
            with self._lock:
                self._error = JournalStalled(f"journal writer held its batch for more than {IO_WAIT_S_MAX} s")
                self._progress.notify_all()
            raise self._error

    def truncate_after(self, index: int) -> None:
        """Drop every entry > index (a Raft term conflict); on disk (fsynced) when it returns.

        index may be first_index - 1 (drop everything); below that is ValueError, as compacted
        entries are committed. durable_index is clamped to index.
        """
        with self._lock:
            self._check_usable()
            if index >= self._last_index:
                return
            if index < self._first_index - 1:
                raise ValueError(f"truncate_after({index}) below first_index - 1 = {self._first_index - 1}")
            while self._queue and self._queue[-1][0] > index:
                self._queue_bytes_out += HEADER_BYTES + len(self._queue.pop()[2])
            while len(self._mem) > self._mem_head and self._mem[-1][0] > index:
                self._mem_bytes_out += HEADER_BYTES + len(self._mem.pop()[2])
            self._last_index = index
            self._generation += 1
            known_term = self._mem[-1][1] if len(self._mem) > self._mem_head else None
        self._acquire_io()
        try:
            with self._lock:
                segments = list(self._segments)
            term = known_term if known_term is not None else self._term_on_disk(segments, index)
            changed_dir = False
            # Delete later segments last-first, syncing the directory after each, so that a
            # crash leaves a contiguous (if longer) log, never a gap.
            while segments and segments[-1].start > index:
                seg = segments.pop()
                if self._active_fd is not None:
                    os.close(self._active_fd)
                    self._active_fd = None
                seg.path.unlink()
                _fsync_dir(self.folder)
                changed_dir = True
            cut: tuple[_Segment, int] | None = None
            if segments and segments[-1].last > index:
                seg = segments[-1]
                offset = self._offset_of(seg, index + 1)
                if self._active_fd is not None:
                    os.close(self._active_fd)
                    self._active_fd = None
                fd = os.open(seg.path, os.O_WRONLY)
                try:
                    os.ftruncate(fd, offset)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                cut = (seg, offset)
            with self._lock:
                self._segments = segments
                if cut is not None:
                    seg, offset = cut
                    seg.size, seg.last = offset, index
                    seg.cut_checkpoints(offset)
                    seg.last_term = term
                self._last_term = term
                self._written_index = min(self._written_index, index)
                self._durable_index = min(self._durable_index, index)
                self._progress.notify_all()
            log.info(
                "journal %s truncated after index %d%s",
                self.folder,
                index,
                " (segments deleted)" if changed_dir else "",
            )
        finally:
            self._io_lock.release()

    def _offset_of(self, seg: _Segment, index: int) -> int:
        """Byte offset of `index` inside seg (io lock held, so the file is not changing)."""
        cp_index, cp_offset = seg.checkpoint_for(index)
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            reader = _SegmentReader(fd, seg.path, cp_offset, seg.size)
            for expected in range(cp_index, index + 1):
                offset, got, _, _ = reader.next(check_crc=False)
                if got != expected:
                    raise JournalCorruption(seg.path, offset, f"index {got} where {expected} expected")
            return offset
        finally:
            os.close(fd)

    def _term_on_disk(self, segments: list[_Segment], index: int) -> int:
        for seg in reversed(segments):
            if seg.start <= index <= seg.last:
                offset = self._offset_of(seg, index)
                fd = os.open(seg.path, os.O_RDONLY)
                try:
                    return _SegmentReader(fd, seg.path, offset, seg.size).next(check_crc=True)[2]
                finally:
                    os.close(fd)
        return 0  # below every segment: the log is empty, the term is the caller's (snapshot)

    def compact_before(self, index: int) -> None:
        """Entries < index may go (they are in a snapshot). first_index becomes index.

        Persists first_index in journal.meta first (temp + fsync + rename + fsync dir), then
        deletes whole segment files holding only entries < index; a segment holding index
        stays (its lower entries are no longer served). index > last_index + 1 empties the log
        (a snapshot from the leader beyond our log): the next append must be `index`.
        """
        with self._lock:
            self._check_usable()
            if index <= self._first_index:
                return
            reset = index > self._last_index + 1
            if reset:
                self._queue_bytes_out += sum(HEADER_BYTES + len(e[2]) for e in self._queue)
                self._queue.clear()
                self._mem = []
                self._mem_head = 0
                self._mem_bytes_out = self._mem_bytes_in
                self._last_index = index - 1
                self._last_term = 0
            else:
                while self._mem_head < len(self._mem) and self._mem[self._mem_head][0] < index:
                    self._mem_bytes_out += HEADER_BYTES + len(self._mem[self._mem_head][2])
                    self._mem_head += 1
            self._first_index = index
            self._generation += 1
        self._acquire_io()
        try:
            _write_meta(self.folder, index)
            with self._lock:
                segments = list(self._segments)
            if reset:
                if self._active_fd is not None:
                    os.close(self._active_fd)
                    self._active_fd = None
                doomed, kept = segments, []
            else:  # the last (active) segment always holds last_index >= index - 1: it stays
                k = 0
                while k + 1 < len(segments) and segments[k + 1].start <= index:
                    k += 1
                doomed, kept = segments[:k], segments[k:]
            for seg in doomed:  # any order: first_index is already durable, recovery skips them
                seg.path.unlink()
            if doomed:
                _fsync_dir(self.folder)
            with self._lock:
                self._segments = kept
                if reset:
                    self._written_index = self._durable_index = index - 1
                    self._progress.notify_all()
            log.info(
                "journal %s compacted before index %d: %d segment(s) deleted%s",
                self.folder,
                index,
                len(doomed),
                " (log emptied)" if reset else "",
            )
        finally:
            self._io_lock.release()

    # ----------------------------------------------------------------------------------- close

    def _check_usable(self) -> None:
        if self._closed:
            raise JournalClosed(f"journal {self.folder} is closed")
        if self._error is not None:
            raise JournalError(f"journal writer failed: {self._error!r}") from self._error

    def close(self) -> None:
        """Write and fsync everything queued, stop the writer (join bounded by
        CLOSE_JOIN_S_MAX), release the folder. Idempotent. Must not be called from on_durable.
        Raises JournalError if the writer failed or would not stop (entries after
        durable_index may then be lost)."""
        if self._closed:
            return
        if threading.current_thread() is self._thread:
            raise JournalError("close() called from the journal's writer thread (on_durable)")
        with self._lock:
            self._stopping = True
            self._writer_wake.notify()
        self._thread.join(CLOSE_JOIN_S_MAX)
        if self._thread.is_alive():
            raise JournalError(f"journal writer for {self.folder} did not stop within {CLOSE_JOIN_S_MAX} s")
        with self._lock:
            self._closed = True
            self._progress.notify_all()
        error: BaseException | None = self._error
        try:
            if self._active_fd is not None:
                if error is None:
                    try:
                        os.fdatasync(self._active_fd)  # also with fsync=False: a clean stop is durable
                    except OSError as exc:  # what the writer wrote is not durable after all
                        error = exc
                os.close(self._active_fd)
                self._active_fd = None
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # releases the flock
                self._lock_fd = None
        if error is not None:
            raise JournalError(
                f"journal {self.folder} failed: {error!r}; entries after {self._durable_index} were not made durable"
            ) from error

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<Journal {self.folder} first={self._first_index} last={self._last_index} durable={self._durable_index}>"
        )
