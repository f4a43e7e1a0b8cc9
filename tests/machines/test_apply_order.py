"""The per-origin apply order and its loop (machines/apply_order.py), as transcripts.

Each test feeds committed entries, in log order, to `apply_committed` and checks what was
applied; the seeded simulation (tests/sim/) does the same at scale, under faults.
"""

from __future__ import annotations

from maxq_raft.machines.apply_order import ApplyOrder, apply_committed


def run(order: ApplyOrder, log: list[tuple[str, int, str]]) -> list[str]:
    """Apply (origin, seq, name) entries in log order; returns the names applied, in order."""
    applied: list[str] = []
    for origin, seq, name in log:
        apply_committed(order, origin, seq, name, name, applied.append, lambda item: item)
    return applied


def test_each_origin_in_its_order_each_once():
    order = ApplyOrder()
    applied = run(
        order,
        [
            ("a", 1, "a1"),
            ("a", 3, "a3"),
            ("b", 1, "b1"),
            ("a", 1, "a1 again"),
            ("a", 2, "a2"),
            ("a", 3, "a3 again"),
            ("a", 4, "a4"),
        ],
    )
    assert applied == ["a1", "b1", "a2", "a3", "a4"]
    assert order.duplicates == 2 and order.held_count == 1 and not order.held


def test_unsequenced_entries_apply_as_they_come():
    assert run(ApplyOrder(), [("a", 0, "x"), ("a", 0, "x")]) == ["x", "x"]


def test_a_held_entry_is_not_replaced_by_a_later_copy_of_its_seq():
    """Simulation seed 342 (there seqs 5 and 6): seq 2 committed (held: seq 1 was late), then its
    proposer gave up on it and a tombstone took seq 2 too. The first committed copy counts, as it does once applied;
    before the fix the tombstone replaced the held entry and its publish was lost."""
    order = ApplyOrder()
    applied = run(order, [("n2@a", 2, "enqueue m4"), ("n2@a", 2, "tombstone"), ("n2@a", 1, "enqueue m3")])
    assert applied == ["enqueue m3", "enqueue m4"]
    assert order.duplicates == 1


def test_a_held_tombstone_wins_over_the_original_that_commits_after_it():
    order = ApplyOrder()
    assert run(order, [("a", 2, "tombstone"), ("a", 2, "original"), ("a", 1, "one")]) == ["one", "tombstone"]


def test_lives_down_drops_what_they_held_and_spares_the_life_that_said_so():
    order = ApplyOrder()
    assert run(order, [("n1@old", 1, "old1"), ("n1@old", 3, "old3"), ("n1@new", 1, "new1")]) == ["old1", "new1"]
    assert order.lives_down("n1@", keep="n1@new") == ("n1@old",)
    assert order.held == {}  # (old3, held for old2, is dropped)
    assert run(order, [("n1@old", 2, "old2"), ("n1@new", 2, "new2")]) == ["new2"]
    assert order.is_dead("n1@old") and not order.is_dead("n1@new")
    assert order.lives_down("n1@", keep="n1@newer") == ("n1@new",)  # (n1@old: dead before)


def test_dump_and_load_keep_the_held_entries():
    order = ApplyOrder()
    run(order, [("a", 1, "a1"), ("a", 3, "a3"), ("b", 2, "b2")])
    loaded = ApplyOrder.load(*order.dump())
    assert loaded.digest() == order.digest()
    assert run(loaded, [("a", 2, "a2"), ("b", 1, "b1")]) == ["a2", "a3", "b1", "b2"]
