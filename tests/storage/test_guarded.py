"""GuardedStore against a model: writes fail, fsyncs fail, reopens lose whatever was not fsynced,
and after recovery the store holds exactly what every write said, as if nothing had failed.

The store under the guard is `DiskLike`: a MemorySegmentStore that remembers its writes in
order and how many of them an fsync made durable. Its faults are switched by the test: a write
raises (and is not made), an fsync raises (and makes nothing durable). Reopening it gives a
store with only a prefix of the writes: at least the durable ones, at most all that were made,
chosen by hypothesis (what a crash of the page cache, or RocksDB replaying a torn WAL, can
leave). The model is a plain dict of every write the guard accepted. Checked after every step:
reads through the guard (scan, get_meta) agree with the model, failed or not; a sync that
returns means the writes it covered survive any later reopen.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from maxq_raft.storage import MemorySegmentStore, StorageError
from maxq_raft.storage.guarded import GuardedStore, StoreFailed

QUEUES = [1, 2]
queue_ids = st.sampled_from(QUEUES)
seqs = st.integers(0, 30)
records = st.binary(min_size=1, max_size=6)
meta_keys = st.sampled_from(["a", "b"])


class Disk:
    """What survives a reopen: the writes made so far and how many were fsynced."""

    def __init__(self) -> None:
        self.ops: list[tuple] = []
        self.durable = 0
        self.fail_writes = False
        self.fail_syncs = False


class DiskLike:
    """A store over a Disk; `prefix` writes of it are visible when opened."""

    def __init__(self, disk: Disk, prefix: int) -> None:
        self.disk = disk
        del disk.ops[prefix:]  # a reopen loses what it does not find
        disk.durable = min(disk.durable, prefix)
        self.memory = MemorySegmentStore("disk")
        for op in disk.ops:
            self._apply(op)
        self.path = "disk"

    def _apply(self, op: tuple) -> None:
        if op[0] == "w":
            self.memory.write(op[1], op[2], op[3])
        else:
            self.memory.delete_range(op[1], op[2], op[3])

    def _make(self, op: tuple) -> None:
        if self.disk.fail_writes:
            raise StorageError("No space left on device (injected)")
        self.disk.ops.append(op)
        self._apply(op)

    def write(self, puts, deletes, meta, *, wal=True) -> None:
        self._make(("w", list(puts), list(deletes), dict(meta) if meta else None))

    def delete_range(self, queue_id, seq_from, seq_to) -> None:
        self._make(("r", queue_id, seq_from, seq_to))

    def sync_wal(self) -> None:
        if self.disk.fail_syncs:
            raise StorageError("Input/output error (injected fsync failure)")
        self.disk.durable = len(self.disk.ops)

    def scan(self, queue_id, seq_from, limit):
        return self.memory.scan(queue_id, seq_from, limit)

    def get_meta(self, key):
        return self.memory.get_meta(key)

    def close(self) -> None:
        pass


class GuardAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.disk = Disk()
        self.reopen_prefix: int | None = None  # chosen by the `reopen_keeps` rule for the next reopen
        self.guard = GuardedStore(self._open)
        self.failures: list[str] = []
        self.guard.on_failure = self.failures.append
        self.model: dict[int, dict[int, bytes]] = {q: {} for q in QUEUES}
        self.meta: dict[str, bytes] = {}
        self.synced_model: tuple[dict, dict] | None = None  # the model as of the last good sync
        self.pending_mark = None

    def _open(self, read_only: bool) -> DiskLike:
        prefix = len(self.disk.ops)
        if self.reopen_prefix is not None:
            prefix = max(self.disk.durable, min(self.reopen_prefix, prefix))
        if read_only:  # a reader sees what a reopen could, changing nothing
            view = Disk()
            view.ops, view.durable = list(self.disk.ops), self.disk.durable
            return DiskLike(view, prefix)
        if self.disk.fail_writes:
            raise StorageError("No space left on device (injected, at reopen)")
        return DiskLike(self.disk, prefix)

    # -- writes ----------------------------------------------------------------------------

    @rule(
        queue_id=queue_ids,
        puts=st.lists(st.tuples(seqs, records), max_size=4),
        deletes=st.lists(seqs, max_size=3),
        meta=st.dictionaries(meta_keys, st.one_of(st.none(), records), max_size=2),
    )
    def write(self, queue_id, puts, deletes, meta):
        self.guard.write([(queue_id, s, r) for s, r in puts], [(queue_id, s) for s in deletes], meta or None)
        for seq, record in puts:
            self.model[queue_id][seq] = record
        for seq in deletes:
            self.model[queue_id].pop(seq, None)
        for key, value in meta.items():
            if value is None:
                self.meta.pop(key, None)
            else:
                self.meta[key] = value

    @rule(queue_id=queue_ids, lo=seqs, width=st.integers(0, 12))
    def delete_range(self, queue_id, lo, width):
        self.guard.delete_range(queue_id, lo, lo + width)
        for seq in [s for s in self.model[queue_id] if lo <= s < lo + width]:
            del self.model[queue_id][seq]

    @rule(queue_id=queue_ids)
    def drop_queue(self, queue_id):
        self.guard.drop_queue(queue_id)
        self.model[queue_id].clear()

    # -- durability and faults ---------------------------------------------------------------

    @rule()
    def sync(self):
        """An fsync; its outcome reaches the guard later (`report_sync`), as from the syncer
        thread, with writes in between that it does not cover."""
        try:
            mark = self.guard.sync_wal()
        except StoreFailed:
            assert self.guard.failure is not None
            return
        self.pending_mark = mark
        self.synced_model = ({q: dict(m) for q, m in self.model.items()}, dict(self.meta))

    @precondition(lambda self: self.pending_mark is not None)
    @rule()
    def report_sync(self):
        self.guard.synced(self.pending_mark)
        self.pending_mark = None

    @rule(on=st.booleans())
    def disk_full(self, on):
        self.disk.fail_writes = on

    @rule(on=st.booleans())
    def fsync_fails(self, on):
        self.disk.fail_syncs = on

    @rule(prefix=st.integers(0, 200))
    def reopen_keeps(self, prefix):
        self.reopen_prefix = prefix

    @precondition(lambda self: self.guard.failure is not None)
    @rule()
    def recover(self):
        recovered = self.guard.recover()
        assert recovered == (self.guard.failure is None)
        if recovered:
            self.disk.fail_syncs = False  # (a later failure is a new one)
            assert not self.guard.unsynced_writes

    # -- checks ------------------------------------------------------------------------------

    @invariant()
    def reads_agree_with_the_model(self):
        for queue_id in QUEUES:
            expected = sorted(self.model[queue_id].items())
            assert self.guard.scan(queue_id, 0, 1000) == expected
            assert self.guard.scan(queue_id, 5, 3) == [item for item in expected if item[0] >= 5][:3]
        for key in ("a", "b"):
            assert self.guard.get_meta(key) == self.meta.get(key)

    @invariant()
    def failure_is_reported_once_per_failure(self):
        assert len(self.failures) == self.guard.failures

    @invariant()
    def what_a_sync_covered_survives_a_reopen(self):
        if self.synced_model is None:
            return
        # The disk as a reopen would at least find it: only its fsynced writes.
        view = Disk()
        view.ops = list(self.disk.ops[: self.disk.durable])
        on_disk = DiskLike(view, len(view.ops))
        synced_queues, synced_meta = self.synced_model
        if self.guard.failure is None and not self.guard.unsynced_writes and self.pending_mark is None:
            for queue_id in QUEUES:
                assert on_disk.scan(queue_id, 0, 1000) == sorted(self.model[queue_id].items())
        # What was synced and not overwritten since is durable.
        for queue_id in QUEUES:
            durable = dict(on_disk.scan(queue_id, 0, 1000))
            for seq, record in synced_queues[queue_id].items():
                if self.model[queue_id].get(seq) == record and seq in durable:
                    assert durable[seq] == record


GuardAgainstModel.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
test_guard_against_model = GuardAgainstModel.TestCase


def test_a_failed_write_is_reported_once_and_recovered_by_a_reopen():
    disk = Disk()
    failures: list[str] = []
    guard = GuardedStore(lambda read_only: DiskLike(disk, len(disk.ops)), on_failure=failures.append)
    guard.write([(1, 0, b"a")], (), {"n": b"1"})
    guard.synced(guard.sync_wal())
    disk.fail_writes = True
    guard.write([(1, 1, b"b")], (), {"n": b"2"})
    guard.write([(1, 2, b"c")], [(1, 0)], None)
    assert failures == ["write failed: No space left on device (injected)"]
    assert guard.scan(1, 0, 10) == [(1, b"b"), (2, b"c")] and guard.get_meta("n") == b"2"
    try:
        guard.sync_wal()
    except StoreFailed as exc:
        assert "No space left" in str(exc)
    else:
        raise AssertionError("a failed store must refuse to sync")
    assert not guard.recover()  # still full: the reopen itself fails, reads go on
    assert guard.scan(1, 0, 10) == [(1, b"b"), (2, b"c")]
    disk.fail_writes = False
    assert guard.recover() and guard.failure is None
    assert disk.durable == len(disk.ops)  # redone and fsynced
    fresh = DiskLike(disk, disk.durable)
    assert fresh.scan(1, 0, 10) == [(1, b"b"), (2, b"c")] and fresh.get_meta("n") == b"2"
    assert len(failures) == 1


def test_without_a_redo_log_a_failure_is_only_reported():
    disk = Disk()
    failures: list[str] = []
    guard = GuardedStore(lambda read_only: DiskLike(disk, len(disk.ops)), redo=False, on_failure=failures.append)
    guard.write([(1, 0, b"a")], (), None)
    assert not guard.unsynced_writes
    disk.fail_syncs = True
    try:
        guard.sync_wal()
    except StoreFailed:
        pass
    assert failures and guard.failure.startswith("fsync failed")
