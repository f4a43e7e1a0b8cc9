"""Property test: random operation sequences give the same answers from a plain dict model,
MemorySegmentStore and RocksSegmentStore (WAL and no-WAL, with reopens), checked after every step.

Queue ids include the extremes (0 and 2**64-1) and neighbours (1, 2) so that key-range edges
are exercised; seqs are few so that deletes, overwrites and re-puts collide often."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from maxq_raft.storage import U64_MAX, MemorySegmentStore, RocksSegmentStore

QUEUE_IDS = [0, 1, 2, U64_MAX]
queue_ids = st.sampled_from(QUEUE_IDS)
seqs = st.one_of(st.integers(0, 40), st.just(U64_MAX))
records = st.binary(max_size=12)
meta_keys = st.sampled_from(["snapshot", "a", "é"])


class StoresAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, dict[int, bytes]] = {}
        self.meta: dict[str, bytes] = {}
        self.folder = tempfile.mkdtemp(prefix="maxq-store-model-")
        self.memory = MemorySegmentStore("model")
        self.rocks = RocksSegmentStore(f"{self.folder}/wal")
        self.rocks_nowal = RocksSegmentStore(f"{self.folder}/nowal", wal=False)

    @property
    def stores(self):
        return (self.memory, self.rocks, self.rocks_nowal)

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    @initialize()
    def start(self) -> None:
        pass

    # -- writes ------------------------------------------------------------------------------

    @rule(items=st.lists(st.tuples(queue_ids, seqs, records), max_size=8))
    def put_batch(self, items):
        for store in self.stores:
            store.put_batch(items)
        for queue_id, seq, record in items:
            self.model.setdefault(queue_id, {})[seq] = record

    @rule(queue_id=queue_ids, to_delete=st.lists(seqs, max_size=6))
    def delete(self, queue_id, to_delete):
        for store in self.stores:
            store.delete(queue_id, to_delete)
        for seq in to_delete:
            self.model.get(queue_id, {}).pop(seq, None)

    @rule(queue_id=queue_ids, a=st.one_of(seqs, st.just(U64_MAX + 1)), b=st.one_of(seqs, st.just(U64_MAX + 1)))
    def delete_range(self, queue_id, a, b):
        seq_from, seq_to = min(a, b), max(a, b)
        if seq_from > U64_MAX:
            return
        for store in self.stores:
            store.delete_range(queue_id, seq_from, seq_to)
        queue = self.model.get(queue_id, {})
        for seq in [s for s in queue if seq_from <= s < seq_to]:
            del queue[seq]

    @rule(queue_id=queue_ids)
    def drop_queue(self, queue_id):
        for store in self.stores:
            store.drop_queue(queue_id)
        self.model.pop(queue_id, None)

    @rule(key=meta_keys, value=records)
    def put_meta(self, key, value):
        for store in self.stores:
            store.put_meta(key, value)
        self.meta[key] = value

    @rule()
    def flush(self):
        for store in self.stores:
            store.flush()

    @rule()
    def reopen_rocks(self):
        self.rocks.close()
        self.rocks_nowal.close()
        self.rocks = RocksSegmentStore(f"{self.folder}/wal")
        self.rocks_nowal = RocksSegmentStore(f"{self.folder}/nowal", wal=False)

    # -- reads -------------------------------------------------------------------------------

    @rule(queue_id=queue_ids, seq_from=seqs, limit=st.integers(0, 5))
    def scan(self, queue_id, seq_from, limit):
        queue = self.model.get(queue_id, {})
        expected = sorted((s, r) for s, r in queue.items() if s >= seq_from)[:limit]
        for store in self.stores:
            assert store.scan(queue_id, seq_from, limit) == expected, store

    @rule(queue_id=queue_ids, seq=seqs)
    def get(self, queue_id, seq):
        for store in self.stores:
            assert store.get(queue_id, seq) == self.model.get(queue_id, {}).get(seq), store

    @invariant()
    def same_state_everywhere(self):
        live = {q: records for q, records in self.model.items() if records}
        for store in self.stores:
            assert store.queue_ids() == sorted(live), store
            for queue_id in QUEUE_IDS:
                records_of = live.get(queue_id, {})
                expected_bounds = (min(records_of), max(records_of)) if records_of else None
                assert store.bounds(queue_id) == expected_bounds, (store, queue_id)
                assert store.scan(queue_id, 0, 100) == sorted(records_of.items()), (store, queue_id)
            for key in ["snapshot", "a", "é"]:
                assert store.get_meta(key) == self.meta.get(key), (store, key)
        self.memory.check_invariants()


StoresAgainstModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_stores_against_model = StoresAgainstModel.TestCase
