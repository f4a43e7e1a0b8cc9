"""MemorySegmentStore internals: its lazily trimmed seq lists stay consistent and bounded over a
long seeded workload shaped like a queue (appends, prefix acks, scattered acks, refills)."""

from __future__ import annotations

import random

import pytest

from maxq_raft.storage import MemorySegmentStore


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_queue_workload_matches_a_dict(seed):
    rng = random.Random(seed)
    store = MemorySegmentStore()
    model: dict[int, dict[int, bytes]] = {}
    next_seq = {q: 0 for q in range(3)}
    for step in range(4000):
        q = rng.randrange(3)
        queue = model.setdefault(q, {})
        op = rng.random()
        if op < 0.45:  # publish a batch
            batch = [(q, next_seq[q] + i, b"%d" % (next_seq[q] + i)) for i in range(rng.randrange(1, 30))]
            next_seq[q] += len(batch)
            store.put_batch(batch)
            queue.update({seq: record for _, seq, record in batch})
        elif op < 0.65 and queue:  # ack a prefix
            first = min(queue)
            upto = first + rng.randrange(1, 40)
            store.delete_range(q, 0, upto)
            for seq in [s for s in queue if s < upto]:
                del queue[seq]
        elif op < 0.85 and queue:  # scattered acks
            victims = rng.sample(sorted(queue), min(len(queue), rng.randrange(1, 10)))
            store.delete(q, victims)
            for seq in victims:
                del queue[seq]
        elif op < 0.9 and queue:  # a requeue below the head, out of order
            seq = max(0, min(queue) - rng.randrange(1, 5))
            store.put_batch([(q, seq, b"back")])
            queue[seq] = b"back"
        elif op < 0.95:  # a hole in the middle
            a = rng.randrange(next_seq[q] + 1)
            b = a + rng.randrange(0, 20)
            store.delete_range(q, a, b)
            for seq in [s for s in queue if a <= s < b]:
                del queue[seq]
        else:
            expected = sorted(queue.items())
            assert store.scan(q, 0, len(expected) + 1) == expected
        if step % 50 == 0:
            store.check_invariants()
        live = {k: v for k, v in model.items() if v}
        assert store.queue_ids() == sorted(live)
        for k, v in live.items():
            assert store.bounds(k) == (min(v), max(v))
            internal = store._queues[k]
            # stale entries stay within the tidy bound (2x live + slack)
            assert len(internal.seqs) - internal.head <= 2 * len(internal.records) + 64
    store.check_invariants()
