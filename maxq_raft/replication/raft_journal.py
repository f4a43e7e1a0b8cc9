"""pysyncobj's Raft log, kept in our durable Journal (one per group).

Theory of operation
-------------------
pysyncobj 0.3.17 never fsyncs (docs/design.md §3). Its only hook for the log is the module function
`pysyncobj.syncobj.createJournal(journalFile)`; `install_journal_hook` replaces it once with a
function that hands out a `RaftLog` registered under a token passed as `journalFile`, and
falls back to pysyncobj's own journals for anything else. pysyncobj itself is not modified.

`RaftLog` implements pysyncobj's Journal interface over `journal.Journal`:

* `add` appends to the Journal (non-blocking; the Journal's writer thread group-commits with
  fdatasync) and to a RAM tail. Durability is reported by `durable_index`; the transport holds
  every message that claims an entry until it is durable (group_transport.py).
* The log is NOT held wholly in RAM: terms are kept run-length encoded (one pair per term), the
  payloads of the newest entries (`tail_bytes_max`, `tail_entries_max`) in a list, older ones
  are read back from the Journal. pysyncobj slices the log (`log[diff:]`, often to the end);
  a slice inside the tail is a plain list, otherwise a `LogView` that reads lazily.
* `deleteEntriesFrom` (a Raft term conflict) is `Journal.truncate_after`, fsynced on return.
* Term and vote are written to `raft_term` (temp file, fsync, rename, fsync of the folder)
  before `setCurrentTerm` returns: pysyncobj sends a vote or a vote request only after it.
* The commit index is saved once a second to `raft_commit` (temp, fsync, rename). It only
  ever names committed entries, so after a restart pysyncobj starts from it and the entries up
  to it are replayed at once (a stale value is safe: the leader re-sends the rest).
* Compaction is ours, not pysyncobj's (its `clear` and `deleteEntriesTo` raise: its own
  compaction pickles the state and stays disabled). `compact(first)` drops entries below
  `first` once a snapshot covers them (Journal.compact_before: whole segments go), and
  `install_base(prev, last)` empties the log for a snapshot received from the leader and starts
  it with the snapshot's last two entries, so that pysyncobj's `log[0]` is always a real entry
  (the one before its first live one, as after pysyncobj's own compaction).

Threads: everything except `durable_index` and the Journal's on_durable callback runs in the
engine's hub thread.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path

import pysyncobj.journal as ps_journal
import pysyncobj.syncobj as ps_syncobj

from .journal import Journal, JournalCorruption

__all__ = [
    "RaftLog",
    "LogView",
    "install_journal_hook",
    "register_log",
    "unregister_log",
    "TOKEN_PREFIX",
    "write_atomic",
]

log = logging.getLogger(__name__)

TOKEN_PREFIX = "maxq-raft-log:"
TERM_FILE = "raft_term"
COMMIT_FILE = "raft_commit"
_TERM_REC = struct.Struct(">4sQH")  # magic, term, voted-for length; then voted-for, then crc32
_TERM_MAGIC = b"MQRT"
_COMMIT_REC = struct.Struct(">4sQI")  # magic, commit index, crc32 of the first 12 bytes
_COMMIT_MAGIC = b"MQRC"
TAIL_BYTES_MAX_DEFAULT = 32 * 1024 * 1024
TAIL_ENTRIES_MAX_DEFAULT = 65536
ENTRY_OVERHEAD_BYTES = 100  # what one tail entry costs besides its payload (tuple, ints, list slot)
VIEW_CACHE_BYTES_MAX = 4 * 1024 * 1024  # per LogView (a batch is at most 2 MiB + one entry)
MEMBERSHIP_KIND = b"\x02"  # pysyncobj _COMMAND_TYPE.MEMBERSHIP (wire.CMD_MEMBERSHIP)

_registry: dict[str, RaftLog] = {}
_registry_lock = threading.Lock()
_hook_lock = threading.Lock()
_token_counter = itertools.count(1)


def _create_journal(journalFile=None):  # noqa: N803 - pysyncobj's name
    if isinstance(journalFile, str) and journalFile.startswith(TOKEN_PREFIX):
        with _registry_lock:
            raft_log = _registry.pop(journalFile, None)
        if raft_log is None:
            raise RuntimeError(f"no RaftLog registered under {journalFile!r}")
        return raft_log
    return _original_create_journal(journalFile)


_original_create_journal = ps_journal.createJournal


def install_journal_hook() -> None:
    """Make pysyncobj.syncobj.createJournal hand out registered RaftLogs (idempotent)."""
    with _hook_lock:
        if ps_syncobj.createJournal is not _create_journal:
            ps_syncobj.createJournal = _create_journal


def register_log(raft_log: RaftLog) -> str:
    """A token to pass as SyncObjConf(journalFile=...): the next SyncObj built with it gets raft_log."""
    token = f"{TOKEN_PREFIX}{next(_token_counter)}"
    with _registry_lock:
        _registry[token] = raft_log
    return token


def unregister_log(token: str) -> None:
    with _registry_lock:
        _registry.pop(token, None)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(folder: Path, name: str, data: bytes, fsync: bool) -> None:
    """`data` as `folder/name`, whole or not at all: a temp file, its fsync, a rename over the
    old one, the folder's fsync (without `fsync`, the rename alone)."""
    tmp = folder / (name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, folder / name)
    if fsync:
        _fsync_dir(folder)


def read_term_file(folder: Path) -> tuple[int, str | None]:
    path = folder / TERM_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0, None
    if len(data) < _TERM_REC.size + 4:
        raise JournalCorruption(path, 0, f"term file has {len(data)} bytes")
    magic, term, n = _TERM_REC.unpack_from(data)
    end = _TERM_REC.size + n
    if magic != _TERM_MAGIC or len(data) != end + 4 or zlib.crc32(data[:end]) != struct.unpack(">I", data[end:])[0]:
        raise JournalCorruption(path, 0, "bad term file (magic, size or crc)")
    voted = data[_TERM_REC.size : end].decode() if n else None
    return term, voted


def encode_term_file(term: int, voted: str | None) -> bytes:
    v = voted.encode() if voted is not None else b""
    body = _TERM_REC.pack(_TERM_MAGIC, term, len(v)) + v
    return body + struct.pack(">I", zlib.crc32(body))


def read_commit_file(folder: Path) -> int:
    """The saved commit index, 1 if none or unreadable (a stale or missing value is safe)."""
    try:
        data = (folder / COMMIT_FILE).read_bytes()
        magic, index, crc = _COMMIT_REC.unpack(data)
        if magic == _COMMIT_MAGIC and zlib.crc32(data[:12]) == crc:
            return max(1, index)
    except (OSError, struct.error):
        pass
    return 1


class LogView:
    """Entries lo..hi (absolute indexes, inclusive) of a RaftLog, read lazily; what pysyncobj gets
    for a slice reaching below the RAM tail. Valid only until the log changes (pysyncobj uses a
    slice within one call; the transport copies the entries of a message it keeps)."""

    __slots__ = ("_log", "_lo", "_hi", "_cache", "_cache_bytes")

    def __init__(self, raft_log: RaftLog, lo: int, hi: int) -> None:
        self._log, self._lo, self._hi = raft_log, lo, hi
        # The first entries read by iteration, kept (bounded) because pysyncobj iterates a slice
        # to measure a batch and then slices it again: the second pass costs no disk read.
        self._cache: list | None = None
        self._cache_bytes = 0

    def __len__(self) -> int:
        return max(0, self._hi - self._lo + 1)

    def __iter__(self) -> Iterator[tuple]:
        cache = self._cache if self._cache is not None else []
        self._cache = cache
        yield from list(cache)
        nxt = self._lo + len(cache)
        for entry in self._log.entries(nxt, self._hi):
            if self._cache_bytes < VIEW_CACHE_BYTES_MAX and nxt == self._lo + len(cache):
                cache.append(entry)
                self._cache_bytes += len(entry[0])
            nxt += 1
            yield entry

    def __reversed__(self) -> Iterator[tuple]:
        return reversed(list(self))

    def __getitem__(self, item):
        n = len(self)
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step != 1:
                return list(self)[item]
            if stop <= start:
                return []
            if self._cache is not None and stop <= len(self._cache):
                return self._cache[start:stop]
            return self._log.slice_abs(self._lo + start, self._lo + stop - 1)
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError("LogView index out of range")
        if self._cache is not None and item < len(self._cache):
            return self._cache[item]
        return self._log.entry(self._lo + item)


class RaftLog(ps_journal.Journal):
    """pysyncobj's Journal interface over our Journal; entries are (command, index, term)."""

    def __init__(
        self,
        folder: Path | str,
        *,
        fsync: bool = True,
        on_durable: Callable[[int], None] | None = None,
        tail_bytes_max: int = TAIL_BYTES_MAX_DEFAULT,
        tail_entries_max: int = TAIL_ENTRIES_MAX_DEFAULT,
        journal_factory: Callable[..., Journal] | None = None,
    ) -> None:
        self.folder = Path(folder)
        self._fsync = fsync
        self._tail_bytes_max = tail_bytes_max
        self._tail_entries_max = max(1, tail_entries_max)
        self.on_truncate: Callable[[int, int], None] | None = None  # (first index removed, count)
        factory = journal_factory or Journal.open
        self.folder.mkdir(parents=True, exist_ok=True)
        self.journal = factory(
            self.folder, fsync=fsync, on_durable=on_durable, tail_cache_bytes_max=1024 * 1024, append_wait_s_max=10.0
        )
        try:
            self._term, self._voted = read_term_file(self.folder)
            self._commit = self._commit_saved = read_commit_file(self.folder)
            self._load()
        except BaseException:
            self.journal.close()
            raise
        self.stats = {"appended": 0, "truncations": 0, "truncated_entries": 0, "term_writes": 0}

    # ------------------------------------------------------------------------------ loading

    def _load(self) -> None:
        j = self.journal
        self._first = j.first_index  # > 1 after a compaction: a snapshot holds what came before
        self._last = j.last_index
        self._run_starts: list[int] = []  # first index of each run of equal terms
        self._run_terms: list[int] = []
        self._tail: list[tuple] = []  # (command, index, term) for tail_first..last
        self._tail_head = 0  # tail[tail_head:] is live
        self._tail_bytes = 0
        self._first_entry: tuple | None = None
        self._undurable: deque[tuple[int, int]] = deque()  # (index, bytes) appended and not yet seen durable
        self._undurable_bytes = 0
        self.membership_indexes: list[int] = []  # indexes of membership-change entries (rare)
        if self._last >= self._first:
            for index, term, payload in j.read(self._first):  # bounded by the log; reads in chunks
                self._note_term(index, term)
                self._push_tail((payload, index, term))
                if payload[:1] == MEMBERSHIP_KIND:
                    self.membership_indexes.append(index)
            self._first_entry = self._entry_at_tail(self._first) or self.entry(self._first)

    # ------------------------------------------------------------------- term bookkeeping

    def _note_term(self, index: int, term: int) -> None:
        if not self._run_terms or self._run_terms[-1] != term:
            self._run_starts.append(index)
            self._run_terms.append(term)

    def term_at(self, index: int) -> int | None:
        """Term of the entry at index, None if the log does not hold it."""
        if not self._first <= index <= self._last:
            return None
        return self._run_terms[bisect.bisect_right(self._run_starts, index) - 1]

    def run_start(self, index: int) -> int:
        """First index of the run of entries with the same term as index (which must exist)."""
        return self._run_starts[bisect.bisect_right(self._run_starts, index) - 1]

    @property
    def first_index(self) -> int:
        return self._first

    @property
    def last_index(self) -> int:
        return self._last

    @property
    def last_term(self) -> int:
        return self._run_terms[-1] if self._run_terms else 0

    @property
    def durable_index(self) -> int:
        return self.journal.durable_index

    @property
    def undurable_bytes(self) -> int:
        """Bytes appended but not yet durable (the writer's backlog)."""
        d = self.journal.durable_index
        q = self._undurable
        while q and q[0][0] <= d:
            self._undurable_bytes -= q.popleft()[1]
        return self._undurable_bytes

    # ------------------------------------------------------------------------------- tail

    def _push_tail(self, entry: tuple) -> None:
        self._tail.append(entry)
        self._tail_bytes += len(entry[0]) + ENTRY_OVERHEAD_BYTES
        tail, head = self._tail, self._tail_head
        while len(tail) - head > 1 and (
            self._tail_bytes > self._tail_bytes_max or len(tail) - head > self._tail_entries_max
        ):
            self._tail_bytes -= len(tail[head][0]) + ENTRY_OVERHEAD_BYTES
            tail[head] = None  # type: ignore[call-overload]
            head += 1
        if head > 4096 and head * 2 > len(tail):
            del tail[:head]
            head = 0
        self._tail_head = head

    def _tail_first(self) -> int:
        return self._last - (len(self._tail) - self._tail_head) + 1

    def _entry_at_tail(self, index: int) -> tuple | None:
        tf = self._tail_first()
        if tf <= index <= self._last:
            return self._tail[self._tail_head + index - tf]
        return None

    def entry(self, index: int) -> tuple:
        """(command, index, term) at index (from the tail, else from disk)."""
        e = self._entry_at_tail(index)
        if e is not None:
            return e
        if index == self._first and self._first_entry is not None:
            return self._first_entry
        if not self._first <= index <= self._last:
            raise IndexError(f"log index {index} outside {self._first}..{self._last}")
        for i, term, payload in self.journal.read(index, index):
            return (payload, i, term)
        raise IndexError(f"log index {index} not readable")

    def entries(self, lo: int, hi: int) -> Iterator[tuple]:
        """(command, index, term) for lo..hi (clamped to the log), in order."""
        lo = max(lo, self._first)
        hi = min(hi, self._last)
        if lo > hi:
            return
        tf = self._tail_first()
        if lo < tf:
            for i, term, payload in self.journal.read(lo, min(hi, tf - 1)):
                yield (payload, i, term)
            lo = tf
        if lo <= hi:
            base = self._tail_head - tf
            yield from self._tail[base + lo : base + hi + 1]

    def slice_abs(self, lo: int, hi: int):
        """Entries lo..hi as a list when they are in the tail, else a LogView."""
        if hi < lo:
            return []
        tf = self._tail_first()
        if lo >= tf:
            base = self._tail_head - tf
            return self._tail[base + lo : base + hi + 1]
        return LogView(self, lo, hi)

    # ------------------------------------------------------------------- pysyncobj Journal

    def add(self, command, idx, term):  # noqa: N802 - pysyncobj's interface
        if type(command) is not bytes:
            command = bytes(command)
        self.journal.append(idx, term, command)  # checks idx == last + 1 and term >= last term
        entry = (command, idx, term)
        self._last = idx
        self._note_term(idx, term)
        self._push_tail(entry)
        if self._first_entry is None:
            self._first_entry = entry
        if command[:1] == MEMBERSHIP_KIND:
            self.membership_indexes.append(idx)
        n = len(command) + 24
        self._undurable.append((idx, n))
        self._undurable_bytes += n
        self.stats["appended"] += 1

    def compact(self, first: int) -> None:
        """Entries below `first` are covered by a durable snapshot: let them go."""
        if first <= self._first:
            return
        if first > self._last:
            raise ValueError(f"compact({first}) beyond the log's last entry {self._last}")
        self.journal.compact_before(first)
        self._first = first
        tf = self._tail_first()
        if first > tf:
            tail, head = self._tail, self._tail_head
            for _ in range(first - tf):
                self._tail_bytes -= len(tail[head][0]) + ENTRY_OVERHEAD_BYTES
                tail[head] = None  # type: ignore[call-overload]
                head += 1
            self._tail_head = head
        k = bisect.bisect_right(self._run_starts, first) - 1  # the run holding `first` stays
        if k > 0:
            del self._run_starts[:k]
            del self._run_terms[:k]
        self._run_starts[0] = first
        self.membership_indexes = [i for i in self.membership_indexes if i >= first]
        self._first_entry = self._entry_at_tail(first) or self.entry_from_disk(first)
        self.stats["compactions"] = self.stats.get("compactions", 0) + 1

    def install_base(self, prev: tuple, last: tuple) -> None:
        """Replace the whole log by a snapshot's last two entries (prev = index - 1, last = index):
        what the log held is either in the snapshot or was never committed."""
        first = prev[1]
        j = self.journal
        if j.last_index >= first:
            if first < j.first_index:
                raise ValueError(f"snapshot base {first} is below this log's first entry {j.first_index}")
            j.truncate_after(first - 1)  # a divergent tail of an old term, or entries the snapshot covers
        j.compact_before(first)  # the log is empty now and its next entry is `first`
        self._first = first
        self._last = first - 1
        self._run_starts, self._run_terms = [], []
        self._tail, self._tail_head, self._tail_bytes = [], 0, 0
        self._first_entry = None
        self._undurable.clear()
        self._undurable_bytes = 0
        self.membership_indexes = []
        if self._commit > self._last:
            self._commit = self._last
        self.add(prev[0], prev[1], prev[2])
        self.add(last[0], last[1], last[2])
        self.stats["installs"] = self.stats.get("installs", 0) + 1

    def clear(self):
        raise RuntimeError("RaftLog.clear: snapshots are not supported (pysyncobj snapshot path reached)")

    def deleteEntriesFrom(self, entryFrom):  # noqa: N802
        index = self._first + entryFrom
        if index > self._last:
            return
        if index <= self._first:
            raise RuntimeError(f"refusing to truncate the whole log (from index {index})")
        n = self._last - index + 1
        self.stats["truncations"] += 1
        self.stats["truncated_entries"] += n
        if self.on_truncate is not None:
            self.on_truncate(index, n)
        self.journal.truncate_after(index - 1)  # on disk, fsynced, when it returns
        self._last = index - 1
        while self._run_starts and self._run_starts[-1] > self._last:
            self._run_starts.pop()
            self._run_terms.pop()
        live = len(self._tail) - self._tail_head
        drop = min(n, live)
        for _ in range(drop):
            self._tail_bytes -= len(self._tail.pop()[0]) + ENTRY_OVERHEAD_BYTES
        if len(self._tail) == self._tail_head and self._last >= self._first:
            self._tail, self._tail_head, self._tail_bytes = [], 0, 0
            self._push_tail(self.entry_from_disk(self._last))
        while self.membership_indexes and self.membership_indexes[-1] > self._last:
            self.membership_indexes.pop()
        q = self._undurable
        while q and q[-1][0] > self._last:
            self._undurable_bytes -= q.pop()[1]
        if self._commit > self._last:
            self._commit = self._last

    def entry_from_disk(self, index: int) -> tuple:
        for i, term, payload in self.journal.read(index, index):
            return (payload, i, term)
        raise IndexError(index)

    def deleteEntriesTo(self, entryTo):  # noqa: N802
        raise RuntimeError("RaftLog.deleteEntriesTo: log compaction is not supported (it is disabled in SyncObjConf)")

    def __getitem__(self, item):
        if isinstance(item, slice):
            n = self._last - self._first + 1
            start, stop, step = item.indices(n)
            if step != 1:
                raise ValueError("RaftLog slices with a step are not supported")
            return self.slice_abs(self._first + start, self._first + stop - 1)
        if item < 0:
            item += self._last - self._first + 1
            if item < 0:
                raise IndexError("RaftLog index out of range")
        if item == 0 and self._first_entry is not None:
            return self._first_entry
        return self.entry(self._first + item)

    def __len__(self):
        return self._last - self._first + 1

    def _destroy(self):
        self.close()

    def close(self) -> None:
        if self.journal.closed:
            return
        try:
            self._save_commit()
        except OSError as exc:  # a hint only (see the module docstring): the log is what counts
            log.warning("could not save the commit index of %s: %s", self.folder, exc)
        self.journal.close()

    def setRaftCommitIndex(self, raftCommitIndex):  # noqa: N802,N803
        self._commit = raftCommitIndex

    def getRaftCommitIndex(self):  # noqa: N802
        return max(1, min(self._commit, self._last))

    def setCurrentTerm(self, term, votedForNodeId):  # noqa: N802,N803
        if term == self._term and votedForNodeId == self._voted:
            return
        # Raft: currentTerm and votedFor are durable before any message that reflects them.
        write_atomic(self.folder, TERM_FILE, encode_term_file(term, votedForNodeId), self._fsync)
        self._term, self._voted = term, votedForNodeId
        self.stats["term_writes"] += 1

    def getCurrentTerm(self):  # noqa: N802
        return self._term

    def getVotedForNodeId(self):  # noqa: N802
        return self._voted

    def onOneSecondTimer(self):  # noqa: N802
        if self._commit != self._commit_saved:
            try:
                self._save_commit()
            except OSError as exc:
                log.warning("could not save the commit index of %s: %s", self.folder, exc)

    def _save_commit(self) -> None:
        value = self._commit
        head = _COMMIT_REC.pack(_COMMIT_MAGIC, value, 0)[:12]
        write_atomic(self.folder, COMMIT_FILE, head + struct.pack(">I", zlib.crc32(head)), self._fsync)
        self._commit_saved = value
