"""The jepsen-style checker on synthetic histories: each fatal kind is caught, each benign kind is
reported and passes, and (hypothesis) histories of a correct queue model never fail while one
injected loss, unexpected delivery, nacked delivery or reordering always does; an injected
duplicate is always counted (duplicates are reported, not fatal: docs/reliability.md).

Also the pure pieces around it: the history file round trip, the seeded schedule, nemesis names,
the summary line and the timeline. No broker here (test_run_smoke.py runs real ones).
"""

from __future__ import annotations

import re
import sys
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

JEPSEN_DIR = Path(__file__).resolve().parents[2] / "jepsen-style"
if str(JEPSEN_DIR) not in sys.path:
    sys.path.insert(0, str(JEPSEN_DIR))  # jepsen-style/ only; the repo root stays off sys.path

from maxq_jepsen.checker import FAILED, PASS, STORE_RECOVERY_S, UNKNOWN, check  # noqa: E402
from maxq_jepsen.history import HistoryWriter, read_history, write_history  # noqa: E402
from maxq_jepsen.nemesis import NemesisError, make_schedule, parse_nemeses, unsupported  # noqa: E402

SUMMARY_RE = re.compile(r"^runs=\d+ confirmed=\d+ lost=\d+ unexpected=\d+ duplicates=\d+ verdict=(PASS|FAIL|UNKNOWN)$")


class H:
    """A synthetic history builder: one clock tick per record, records in call order."""

    def __init__(self) -> None:
        self.records: list[dict] = [{"time": 0.0, "process": "runner", "type": "meta", "f": "meta", "value": {}}]
        self.t = 0.0

    def add(self, type: str, f: str, process: str, **fields) -> dict:
        self.t += 0.01
        record = {"time": round(self.t, 6), "process": process, "type": type, "f": f}
        record.update((k, v) for k, v in fields.items() if v is not None)
        self.records.append(record)
        return record

    def publish(
        self,
        mid: str,
        outcome: str | None = "ok",
        process: str = "pub0",
        session: int = 1,
        node: str = "n1",
        crc: int = 7,
        error: str | None = None,
        key: str | None = None,
    ) -> None:
        seq = int(mid.rsplit("-", 1)[1])
        self.add("invoke", "publish", process, id=mid, seq=seq, session=session, node=node, crc=crc, key=key)
        if outcome is not None:
            if outcome == "fail" and error is None:
                error = "nack"
            self.add(outcome, "publish", process, id=mid, seq=seq, session=session, node=node, error=error)

    def deliver(
        self,
        mid: str,
        redelivered: bool = False,
        process: str = "con0",
        session: int = 1,
        crc: int = 7,
        queue: str | None = None,
        x_death: list | None = None,
    ) -> None:
        self.add(
            "ok",
            "deliver",
            process,
            id=mid,
            redelivered=redelivered,
            session=session,
            crc=crc,
            node="n1",
            queue=queue,
            x_death=x_death,
        )
        self.add("ok", "ack", process, id=mid, session=session)

    def phase(self, name: str, **value) -> None:
        self.add("ok", "phase", "runner", value={"phase": name, **value})

    def drain_done(self, remaining: int = 0) -> None:
        self.add("ok" if remaining == 0 else "info", "drain", "drain", value={"remaining": remaining})


def clean(n: int = 5) -> H:
    h = H()
    for i in range(1, n + 1):
        h.publish(f"pub0-{i}")
    for i in range(1, n + 1):
        h.deliver(f"pub0-{i}")
    h.drain_done()
    return h


# -- the clean case ---------------------------------------------------------------------------


def test_clean_history_passes_with_exact_counts():
    result = check(clean(5).records)
    assert result.verdict == PASS and result.fatal == {}
    c = result.counts
    assert (c["published"], c["confirmed"], c["delivered"], c["deliveries"], c["acks"]) == (5, 5, 5, 5, 5)
    assert c["lost"] == c["unexpected"] == c["duplicates"] == c["fifo_violations"] == 0
    assert result.drain_complete is True


# -- each fatal kind --------------------------------------------------------------------------


def test_confirmed_but_never_delivered_is_lost():
    h = H()
    h.publish("pub0-1")
    h.publish("pub0-2")
    h.deliver("pub0-1")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"lost": 1}
    assert result.examples["lost"] == ["pub0-2"]


def test_delivered_but_never_published_is_unexpected():
    h = clean(2)
    h.deliver("ghost-1")
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"unexpected": 1}
    assert result.examples["unexpected"] == ["ghost-1"]


def test_delivered_before_its_publish_began_is_unexpected():
    h = H()
    h.deliver("pub0-1")  # a delivery of an id whose publish had not even been invoked yet
    h.publish("pub0-1")
    h.drain_done()
    result = check(h.records)
    assert result.fatal == {"unexpected": 1, "lost": 1}  # that delivery was not of the message published later


@pytest.mark.parametrize("error", ["nack", "returned"])
def test_nacked_or_returned_but_delivered_is_fatal(error):
    h = H()
    h.publish("pub0-1", outcome="fail", error=error)
    h.deliver("pub0-1")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"nacked_delivered": 1}
    assert result.counts["returned"] == (1 if error == "returned" else 0)


def test_nacked_and_not_delivered_is_fine():
    h = clean(1)
    h.publish("pub0-2", outcome="fail")
    result = check(h.records)
    assert result.verdict == PASS and result.counts["failed"] == 1


def test_body_changed_on_the_way_is_corrupt():
    h = H()
    h.publish("pub0-1", crc=111)
    h.deliver("pub0-1", crc=222)
    h.drain_done()
    assert check(h.records).fatal == {"corrupt": 1}


def test_first_deliveries_out_of_publish_order_in_one_consumer_session_violate_fifo():
    h = H()
    for i in (1, 2, 3):
        h.publish(f"pub0-{i}")
    h.deliver("pub0-1")
    h.deliver("pub0-3")
    h.deliver("pub0-2")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"fifo_violations": 1}
    violation = result.examples["fifo_violations"][0]
    assert (violation["id"], violation["after"], violation["consumer"]) == ("pub0-2", "pub0-3", "con0")


@pytest.mark.parametrize("case", ["redelivered", "other-consumer-session", "other-publisher-session", "other-consumer"])
def test_what_is_not_a_fifo_violation(case):
    h = H()
    h.publish("pub0-1", session=1)
    h.publish("pub0-2", session=2 if case == "other-publisher-session" else 1)
    h.deliver("pub0-2")
    if case == "redelivered":
        h.deliver("pub0-1", redelivered=True)
    elif case == "other-consumer-session":
        h.deliver("pub0-1", session=2)
    elif case == "other-consumer":
        h.deliver("pub0-1", process="con1")
    else:
        h.deliver("pub0-1")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS, result.to_dict()


def test_a_partitioned_queues_keys_are_ordered_apart_and_each_across_consumers():
    # the partitioned workload: a consumer takes from every partition, so only one key's
    # messages must come in publish order; they must across consumers too (single active ones)
    h = H()
    for i in range(1, 7):
        h.publish(f"pub0-{i}", key=f"k{i % 2}")
    for mid in ("pub0-2", "pub0-1", "pub0-4", "pub0-3"):  # keys interleaved: no FIFO violation
        h.deliver(mid)
    h.deliver("pub0-6", process="con1")
    h.deliver("pub0-5", process="con1")
    h.drain_done()
    assert check(h.records).verdict == PASS
    late = H()
    for i in range(1, 5):
        late.publish(f"pub0-{i}", key="k0")
    late.deliver("pub0-1")
    late.deliver("pub0-3", process="con1")  # a second consumer got the key's next one first
    late.deliver("pub0-2")
    late.deliver("pub0-4", process="con1")
    late.drain_done()
    result = check(late.records)
    assert result.verdict == FAILED and result.fatal == {"key_order_violations": 1}
    violation = result.examples["key_order_violations"][0]
    assert (violation["id"], violation["after"], violation["key"]) == ("pub0-2", "pub0-3", "k0")


def test_an_unconfirmed_publish_is_held_to_no_key_order():
    h = H()
    h.publish("pub0-1", outcome="info", key="k0")  # in doubt: its node may commit it later
    h.publish("pub0-2", key="k0")
    h.deliver("pub0-2", process="con1")
    h.deliver("pub0-1")
    h.drain_done()
    assert check(h.records).verdict == PASS


def partition_history(confirm_node: str, invoke_inside: bool, ok_inside: bool) -> H:
    """n3 is cut off in a minority between the nemesis ok and the heal."""
    h = H()
    if not invoke_inside:
        h.add("invoke", "publish", "pub0", id="pub0-1", seq=1, session=1, node=confirm_node, crc=7)
    h.add("invoke", "partition", "nemesis")
    h.add("ok", "partition", "nemesis", value={"minority": ["n3"], "groups": [["n1", "n2"], ["n3"]]})
    h.phase("fault", nemesis="partition-one")
    if invoke_inside:
        h.add("invoke", "publish", "pub0", id="pub0-1", seq=1, session=1, node=confirm_node, crc=7)
    if ok_inside:
        h.add("ok", "publish", "pub0", id="pub0-1", seq=1, session=1, node=confirm_node)
    h.add("invoke", "heal", "nemesis")
    h.add("ok", "heal", "nemesis", value={})
    h.phase("heal")
    if not ok_inside:
        h.add("ok", "publish", "pub0", id="pub0-1", seq=1, session=1, node=confirm_node)
    h.deliver("pub0-1")
    h.drain_done()
    return h


def test_a_minority_node_confirming_is_fatal():
    result = check(partition_history("n3", invoke_inside=True, ok_inside=True).records)
    assert result.verdict == FAILED and result.fatal == {"minority_confirmed": 1}


@pytest.mark.parametrize(
    "node, invoke_inside, ok_inside",
    [
        ("n1", True, True),  # the majority side may confirm
        ("n3", False, True),  # invoked before the cut: it may have been committed before
        ("n3", True, False),  # confirmed after the heal
    ],
)
def test_confirms_that_are_not_minority_confirms(node, invoke_inside, ok_inside):
    result = check(partition_history(node, invoke_inside, ok_inside).records)
    assert result.verdict == PASS, result.to_dict()


def disk_full_history(nack_node: str, nack_when: str) -> H:
    """n1's disk is full from the disk-full invoke until the store's recovery after the heal; a
    publish nacked by `nack_node` at `nack_when` (during, after_heal, long_after) is delivered."""
    h = clean(1)  # (a run with no confirm at all is UNKNOWN)
    h.records.pop()  # its drain record: the drain is at the end
    h.add("invoke", "disk-full", "nemesis")
    h.add("invoke", "publish", "pub0", id="pub0-2", seq=2, session=1, node=nack_node, crc=7)
    h.add("ok", "disk-full", "nemesis", value={"targets": ["n1"], "full_disk": ["n1"]})
    if nack_when == "during":
        h.add("fail", "publish", "pub0", id="pub0-2", seq=2, session=1, node=nack_node, error="nack")
    h.add("invoke", "heal", "nemesis")
    h.add("ok", "heal", "nemesis", value={"disk-full": {"emptied": ["n1"]}})
    if nack_when == "long_after":
        h.t += STORE_RECOVERY_S + 1
    if nack_when in ("after_heal", "long_after"):
        h.add("fail", "publish", "pub0", id="pub0-2", seq=2, session=1, node=nack_node, error="nack")
    h.deliver("pub0-2")
    h.drain_done()
    return h


@pytest.mark.parametrize("nack_when", ["during", "after_heal"])
def test_a_nack_from_a_node_whose_disk_was_full_may_be_delivered(nack_when):
    # A single node applies a publish before the fsync that failed and stores it on recovery:
    # its nack means "not confirmed" (docs/storage.md), reported, not fatal.
    result = check(disk_full_history("n1", nack_when).records)
    assert result.verdict == PASS, result.to_dict()
    assert result.counts["nacked_delivered_store_failed"] == 1 and result.counts["nacked_delivered"] == 0


@pytest.mark.parametrize("node, nack_when", [("n2", "during"), ("n1", "long_after")])
def test_any_other_nack_delivered_is_still_fatal(node, nack_when):
    result = check(disk_full_history(node, nack_when).records)
    assert result.verdict == FAILED and result.fatal == {"nacked_delivered": 1}, result.to_dict()


# -- benign kinds: reported, not fatal ---------------------------------------------------------


def test_indeterminate_then_delivered_is_recovered():
    h = clean(1)
    h.publish("pub0-2", outcome="info", error="connection lost")
    h.publish("pub0-3", outcome=None)  # no completion at all (the client died with it in flight)
    h.deliver("pub0-2")
    h.deliver("pub0-3")
    result = check(h.records)
    assert result.verdict == PASS
    assert result.counts["recovered"] == 2 and result.counts["indeterminate"] == 2 and result.counts["unknown"] == 0


def test_indeterminate_and_never_delivered_is_unknown_and_fine():
    h = clean(1)
    h.publish("pub0-2", outcome="info")
    result = check(h.records)
    assert result.verdict == PASS and result.counts["unknown"] == 1


def test_duplicates_are_counted_and_split_by_the_redelivered_flag():
    h = clean(3)
    h.deliver("pub0-1", redelivered=True)
    h.deliver("pub0-2", redelivered=False)
    h.deliver("pub0-2", redelivered=True)
    result = check(h.records)
    assert result.verdict == PASS
    c = result.counts
    assert (c["duplicates"], c["duplicates_flagged"], c["duplicates_unflagged"], c["duplicate_ids"]) == (3, 2, 1, 2)
    assert result.examples["duplicates_unflagged"] == ["pub0-2"]


def test_a_late_completion_after_info_does_not_change_the_outcome():
    h = clean(1)
    h.publish("pub0-2", outcome="info")
    h.add("ok", "publish", "pub0", id="pub0-2", seq=2)
    result = check(h.records)
    assert result.counts["confirmed"] == 1 and result.counts["unknown"] == 1 and result.verdict == PASS


def test_availability_and_recovery_times():
    h = H()
    h.phase("quiet")
    h.publish("pub0-1")
    h.t = 2.0
    h.phase("fault", nemesis="kill")
    h.publish("pub0-2", outcome="info")
    h.t = 4.0
    h.phase("heal", nemesis="kill")
    h.t = 4.5
    h.publish("pub0-3")
    h.t = 6.0
    h.phase("recover")
    h.add("ok", "recover", "probe", value={"seconds": 0.25})
    h.phase("drain")
    for i in (1, 3):
        h.deliver(f"pub0-{i}")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS
    a = result.availability
    assert a["fault"]["ratio"] == 0.0 and a["fault"]["confirm_ratio"] == 0.0
    assert a["quiet"]["ratio"] > 0 and a["all"]["attempted"] == 3 and a["all"]["confirmed"] == 2
    recoveries = [r["recovery_s"] for r in result.recovery_s]
    assert recoveries[0] == pytest.approx(0.51, abs=0.02)  # heal at 4.0, first confirm just after 4.5
    assert result.recovery_s[-1]["via"] == "probe" and recoveries[-1] == 0.25


def test_no_confirm_at_all_or_an_unfinished_drain_is_unknown_not_pass():
    h = H()
    h.publish("pub0-1", outcome="info")
    h.drain_done()
    assert check(h.records).verdict == UNKNOWN
    h2 = clean(2)
    h2.drain_done(remaining=4)
    assert check(h2.records).verdict == UNKNOWN and check(h2.records).drain_complete is False


def test_fatal_wins_over_unknown():
    h = H()
    h.publish("pub0-1")
    h.drain_done(remaining=3)
    assert check(h.records).verdict == FAILED


# -- a correct queue model, and injected bugs (hypothesis) -------------------------------------

PUBLISHERS, CONSUMERS = ("pub0", "pub1"), ("con0", "con1")
OUTCOMES = ("ok", "ok", "ok", "fail", "info_in", "info_out", "pending_in", "pending_out")

# Weighted towards publishes and deliveries, so that consumers often hold several messages when
# one of them crashes: that is what brings redeliveries after later messages (the case a FIFO
# rule that forgot the redelivered flag would flag). one_of would weigh the op kinds equally.
OP_WEIGHTS = (
    ("publish", 30),
    ("deliver", 35),
    ("ack", 15),
    ("crash_consumer", 12),
    ("reconnect_publisher", 4),
    ("crash_broker", 4),
)


def _op(draw: tuple[int, int, int]) -> tuple:
    roll, who, outcome = draw
    for kind, weight in OP_WEIGHTS:  # noqa: B007 - kind is what the loop finds, read after its break
        if roll < weight:
            break
        roll -= weight
    if kind == "publish":
        return (kind, PUBLISHERS[who], OUTCOMES[outcome])
    if kind in ("deliver", "ack", "crash_consumer"):
        return (kind, CONSUMERS[who])
    if kind == "reconnect_publisher":
        return (kind, PUBLISHERS[who])
    return (kind,)


op_strategy = st.tuples(
    st.integers(0, sum(w for _, w in OP_WEIGHTS) - 1), st.integers(0, 1), st.integers(0, len(OUTCOMES) - 1)
).map(_op)


def model_history(ops: list[tuple]) -> list[dict]:
    """What a correct broker lets clients see: one queue in enqueue order; a delivery takes the
    first message not held by a consumer; a consumer crash (or a broker crash, for all) returns
    its unacked messages to their places flagged redelivered; confirmed messages survive; nacked
    ones were never enqueued; indeterminate ones may or may not have been. Then a drain."""
    h = H()
    queue: list[dict] = []  # {"id", "held_by", "redelivered"} in enqueue order
    pub_seq = {p: 0 for p in PUBLISHERS}
    pub_session = {p: 1 for p in PUBLISHERS}
    con_session = {c: 1 for c in CONSUMERS}

    def requeue(consumer: str | None) -> None:
        for m in queue:
            if m["held_by"] is not None and (consumer is None or m["held_by"] == consumer):
                m["held_by"], m["redelivered"] = None, True

    for op in ops:
        kind = op[0]
        if kind == "publish":
            _, p, outcome = op
            pub_seq[p] += 1
            mid = f"{p}-{pub_seq[p]}"
            enqueued = outcome in ("ok", "info_in", "pending_in")
            completion = {"ok": "ok", "fail": "fail", "info_in": "info", "info_out": "info"}.get(outcome)
            h.add("invoke", "publish", p, id=mid, seq=pub_seq[p], session=pub_session[p], crc=7)
            if enqueued:
                queue.append({"id": mid, "held_by": None, "redelivered": False})
            if completion is not None:
                h.add(
                    completion,
                    "publish",
                    p,
                    id=mid,
                    seq=pub_seq[p],
                    session=pub_session[p],
                    error="nack" if completion == "fail" else None,
                )
        elif kind == "deliver":
            c = op[1]
            ready = next((m for m in queue if m["held_by"] is None), None)
            if ready is not None:
                ready["held_by"] = c
                h.add(
                    "ok", "deliver", c, id=ready["id"], redelivered=ready["redelivered"], session=con_session[c], crc=7
                )
        elif kind == "ack":
            c = op[1]
            held = next((m for m in queue if m["held_by"] == c), None)
            if held is not None:
                queue.remove(held)
                h.add("ok", "ack", c, id=held["id"], session=con_session[c])
        elif kind == "crash_consumer":
            requeue(op[1])
            con_session[op[1]] += 1
        elif kind == "reconnect_publisher":
            pub_session[op[1]] += 1
        elif kind == "crash_broker":
            requeue(None)
            for c in CONSUMERS:
                con_session[c] += 1
            for p in PUBLISHERS:
                pub_session[p] += 1
    requeue(None)
    h.phase("drain")
    for m in list(queue):
        h.add("ok", "deliver", "drain", id=m["id"], redelivered=m["redelivered"], session=1, crc=7)
        h.add("ok", "ack", "drain", id=m["id"], session=1)
    h.drain_done()
    return h.records


# Hypothesis keeps plain lists short; crashes only matter after a few deliveries, so draw the length.
ops_strategy = st.integers(1, 120).flatmap(lambda n: st.lists(op_strategy, min_size=n, max_size=n))
# For the injections: a prefix that guarantees something to inject into (two confirmed messages of
# one publisher session delivered first to one consumer session), so that nothing is filtered out.
PREFIX = [("publish", "pub0", "ok"), ("publish", "pub0", "ok"), ("deliver", "con0"), ("deliver", "con0")]
ops_with_prefix = ops_strategy.map(lambda ops: PREFIX + ops)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _confirmed_delivered(records: list[dict]) -> list[str]:
    confirmed = {r["id"] for r in records if r["f"] == "publish" and r["type"] == "ok"}
    return sorted({r["id"] for r in records if r["f"] == "deliver" and r["id"] in confirmed})


@SETTINGS
@given(ops_strategy)
def test_a_correct_queue_model_never_gives_a_fatal_verdict(ops):
    result = check(model_history(ops))
    assert result.fatal == {}, result.to_dict()
    assert result.counts["lost"] == 0 and result.drain_complete is True


@SETTINGS
@given(ops_with_prefix, st.data())
def test_one_injected_loss_is_always_fatal(ops, data):
    records = model_history(ops)
    candidates = _confirmed_delivered(records)
    assume(candidates)
    victim = data.draw(st.sampled_from(candidates))
    records = [r for r in records if not (r["f"] in ("deliver", "ack") and r.get("id") == victim)]
    result = check(records)
    assert result.verdict == FAILED and result.counts["lost"] == 1 and result.examples["lost"] == [victim]


@SETTINGS
@given(ops_with_prefix, st.data())
def test_one_injected_unexpected_delivery_is_always_fatal(ops, data):
    records = model_history(ops)
    at = data.draw(st.integers(1, len(records)))
    ghost = {
        "time": records[at - 1]["time"],
        "process": "con0",
        "type": "ok",
        "f": "deliver",
        "id": "ghost-1",
        "redelivered": data.draw(st.booleans()),
        "session": 1,
        "crc": 7,
    }
    records.insert(at, ghost)
    result = check(records)
    assert result.verdict == FAILED and result.counts["unexpected"] == 1


@SETTINGS
@given(ops_with_prefix, st.data())
def test_one_injected_duplicate_is_always_counted_but_not_fatal(ops, data):
    records = model_history(ops)
    deliveries = [i for i, r in enumerate(records) if r["f"] == "deliver"]
    assume(deliveries)
    before = check(records).counts
    i = data.draw(st.sampled_from(deliveries))
    redelivered = data.draw(st.booleans())
    copy = {**records[i], "redelivered": redelivered, "time": records[-1]["time"], "session": 99}
    records.insert(len(records) - 1, copy)  # before the drain's completion record
    result = check(records)
    assert result.fatal == {}
    assert result.counts["duplicates"] == before["duplicates"] + 1
    assert result.counts["duplicates_unflagged"] == before["duplicates_unflagged"] + (not redelivered)


@SETTINGS
@given(ops_with_prefix, st.data())
def test_one_injected_nack_of_a_delivered_message_is_always_fatal(ops, data):
    records = model_history(ops)
    candidates = _confirmed_delivered(records)
    assume(candidates)
    victim = data.draw(st.sampled_from(candidates))
    records = [
        {**r, "type": "fail", "error": "nack"} if r["f"] == "publish" and r["type"] == "ok" and r["id"] == victim else r
        for r in records
    ]
    result = check(records)
    assert result.verdict == FAILED and result.counts["nacked_delivered"] == 1


@SETTINGS
@given(ops_with_prefix, st.data())
def test_one_injected_reordering_is_always_a_fifo_violation(ops, data):
    records = model_history(ops)
    # Two first, non-redelivered deliveries in one consumer session from one publisher session.
    publish = {r["id"]: r for r in records if r["f"] == "publish" and r["type"] == "invoke"}
    seen, firsts = set(), {}
    for i, r in enumerate(records):
        if r["f"] == "deliver" and r["id"] not in seen:
            seen.add(r["id"])
            if not r["redelivered"]:
                p = publish[r["id"]]
                firsts.setdefault((r["process"], r["session"], p["process"], p["session"]), []).append(i)
    invoked_at = {r["id"]: i for i, r in enumerate(records) if r["f"] == "publish" and r["type"] == "invoke"}
    # Both published before the first of the two deliveries (else the swap makes an unexpected one).
    pairs = [(a, b) for idx in firsts.values() for a in idx for b in idx if a < b and invoked_at[records[b]["id"]] < a]
    assert pairs  # the prefix made one
    a, b = data.draw(st.sampled_from(pairs))
    records[a], records[b] = {**records[a], "id": records[b]["id"]}, {**records[b], "id": records[a]["id"]}
    result = check(records)
    assert result.verdict == FAILED and result.counts["fifo_violations"] >= 1


# -- the pieces around the checker -------------------------------------------------------------


def test_history_file_round_trip_and_a_torn_tail(tmp_path):
    path = tmp_path / "history.jsonl"
    writer = HistoryWriter(path)
    writer.meta(seed=5)
    writer.write("invoke", "publish", "pub0", id="pub0-1", seq=1, session=1, node="n1", crc=None)
    writer.write("ok", "publish", "pub0", id="pub0-1", seq=1, session=1)
    writer.close()
    writer.write("ok", "deliver", "con0", id="pub0-1")  # after close: counted, not written
    assert writer.dropped_after_close == 1
    records = read_history(path)
    assert [r["type"] for r in records] == ["meta", "invoke", "ok"]
    assert "crc" not in records[1] and records[0]["value"] == {"seed": 5}
    assert all(a["time"] <= b["time"] for a, b in pairwise(records))
    with open(path, "a") as f:
        f.write('{"time": 9, "type": "ok", "f"')  # the harness died mid-line
    assert len(read_history(path)) == 3
    write_history(tmp_path / "copy.jsonl", records)
    assert read_history(tmp_path / "copy.jsonl") == records


def test_schedule_is_a_function_of_the_seed():
    a = make_schedule(11, ["kill", "pause"], 30.0, (3.0, 5.0), (2.0, 4.0), 3.0)
    assert a == make_schedule(11, ["kill", "pause"], 30.0, (3.0, 5.0), (2.0, 4.0), 3.0)
    assert a != make_schedule(12, ["kill", "pause"], 30.0, (3.0, 5.0), (2.0, 4.0), 3.0)
    assert a and sum(c.quiet_s + c.fault_s for c in a) <= 27.0
    assert all(3.0 <= c.quiet_s <= 5.0 and 2.0 <= c.fault_s <= 4.0 and c.nemesis in ("kill", "pause") for c in a)
    assert make_schedule(11, [], 30.0, (3.0, 5.0), (2.0, 4.0), 3.0) == []


def test_nemesis_names():
    assert parse_nemeses("kill,pause,kill") == ["kill", "pause"]
    assert parse_nemeses("none") == []
    assert parse_nemeses("all") == [
        "kill",
        "kill-leader",
        "kill-majority",
        "pause",
        "pause-leader",
        "partition-one",
        "partition-leader",
        "partition-halves",
        "one-way",
        "bridge",
        "partition-majorities-ring",
        "loss",
        "delay",
        "disk-stall",
        "disk-full",
        "clock-skew",
        "membership",
        "maintenance",
        "move",
    ]
    assert parse_nemeses("kill,disk-stall") == ["kill", "disk-stall"]  # the whole menu is built
    with pytest.raises(NemesisError, match="unknown nemesis"):
        parse_nemeses("meteor")
    # What a lab of a given shape cannot run, with the reason (the CLI refuses or leaves them out).
    assert unsupported(["kill", "pause"], 1, "local") == {}
    assert set(unsupported(["kill-leader", "partition-one"], 1, "local")) == {"kill-leader", "partition-one"}
    assert set(unsupported(["kill-leader", "partition-one", "one-way"], 3, "local")) == {"partition-one", "one-way"}
    assert set(unsupported(["membership"], 1, "local")) == {"membership"}
    assert unsupported(["membership"], 3, "local") == {}
    assert set(unsupported(["maintenance"], 1, "local")) == {"maintenance"}
    assert unsupported(["maintenance"], 3, "local") == {}
    # On 3 members only the ring is refused for its shape (a tool missing on this machine is refused too, loudly).
    shape = {
        k: v for k, v in unsupported(list(parse_nemeses("all")), 3, "netns").items() if not v.startswith("MISSING")
    }
    assert set(shape) == {"partition-majorities-ring"}


def test_partition_nemeses_name_their_minority():
    """The checker's minority rule depends on these descriptions (no lab needed: a fake one)."""
    import random

    from maxq_jepsen.nemesis import make_nemeses

    class FakeNode:
        extra_args = ("--replication-factor", "0")  # (every group on every member: no placement to read)

        def __init__(self, name):
            self.name = name

    class FakeLab:
        def __init__(self, count):
            self.nodes = [FakeNode(f"n{i}") for i in range(1, count + 1)]
            self.cuts = None

        def partition(self, cuts):
            self.cuts = cuts

        def heal_network(self):
            self.cuts = []

    for count in (3, 5):
        lab = FakeLab(count)
        nemeses = make_nemeses(["partition-one", "partition-halves", "one-way"])
        one = nemeses["partition-one"].start(lab, random.Random(1))
        (isolated,) = one["minority"]
        assert len(lab.cuts) == 2 * (count - 1) and all(isolated in cut for cut in lab.cuts)
        halves = nemeses["partition-halves"].start(lab, random.Random(2))
        assert 1 <= len(halves["minority"]) <= (count - 1) // 2
        assert len(halves["minority"]) + len(halves["majority"]) == count
        one_way = nemeses["one-way"].start(lab, random.Random(3))
        assert one_way["minority"] == [] and all(a == one_way["silenced"] for a, _ in lab.cuts)
        assert nemeses["one-way"].heal(lab) == {"healed": True} and lab.cuts == []
        assert nemeses["one-way"].heal(lab) == {"healed": False}  # idempotent


def test_shard_of_matches_the_broker():
    """The harness keeps a copy of the broker's shard_of (it never imports the broker at run time)."""
    from maxq_jepsen.lab import shard_of
    from maxq_raft.server.cluster import shard_of as broker_shard_of

    for name in ("jepsen", "jepsen-probe", "q", "ü"):
        for count in (1, 2, 4, 7):
            assert shard_of(("/", name), count) == broker_shard_of(("/", name), count)


# -- the dead-letter variant (workload "dlx") ---------------------------------------------------

WORK, DLQ = "jepsen", "jepsen-dlq"
EXPIRED_DEATH = [{"queue": WORK, "reason": "expired", "count": 1}]


def dlx_h() -> H:
    """A history whose meta names the work queue and its dead-letter queue (as the runner's does)."""
    h = H()
    h.records[0]["value"] = {"spec": {"workload_kind": "dlx", "workload": {"queue": WORK, "dead_letter_queue": DLQ}}}
    return h


def dead_letter(h: H, mid: str, x_death: list | None = EXPIRED_DEATH, **kwargs) -> None:
    h.deliver(mid, process=kwargs.pop("process", "con1"), queue=DLQ, x_death=x_death, **kwargs)


def test_dlx_both_routes_pass_and_are_counted():
    h = dlx_h()
    for i in range(1, 7):
        h.publish(f"pub0-{i}")
    h.deliver("pub0-1", queue=WORK)
    h.deliver("pub0-3", queue=WORK)
    dead_letter(h, "pub0-2")
    dead_letter(h, "pub0-4")
    # Held unacked past its deadline by a consumer that died: requeued, dead-lettered at once.
    h.add("ok", "deliver", "con0", id="pub0-5", redelivered=False, session=1, crc=7, queue=WORK)
    dead_letter(h, "pub0-5")
    h.deliver("pub0-6", process="drain", queue=WORK)
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS and result.fatal == {}, result.to_dict()
    c = result.counts
    assert (c["by_work_queue_only"], c["by_dead_letter_only"], c["by_both_routes"]) == (3, 2, 1)
    assert c["dead_letter_deliveries"] == 3 and c["duplicates"] == 1 and c["dead_letter_without_x_death"] == 0


def test_dlx_a_confirmed_message_delivered_by_neither_route_is_lost():
    h = dlx_h()
    h.publish("pub0-1")
    h.publish("pub0-2")
    dead_letter(h, "pub0-1")
    h.drain_done()
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"lost": 1} and result.examples["lost"] == ["pub0-2"]


@pytest.mark.parametrize(
    "x_death",
    [
        None,  # no header at all
        [],  # an empty one
        [{"queue": WORK, "reason": "rejected", "count": 1}],  # nobody rejects in this workload
        [{"queue": WORK, "reason": "maxlen", "count": 1}],  # and the queue has no length limit
        [{"queue": "elsewhere", "reason": "expired", "count": 1}],  # died in a queue that is not ours
        [{"queue": DLQ, "reason": "expired", "count": 1}, *EXPIRED_DEATH],  # the latest death is not the work queue's
        ["not a table"],
    ],
)
def test_dlx_a_dead_letter_without_a_matching_x_death_is_fatal(x_death):
    h = dlx_h()
    h.publish("pub0-1")
    h.publish("pub0-2")
    h.deliver("pub0-1", queue=WORK)
    dead_letter(h, "pub0-2", x_death=x_death)
    h.drain_done()
    result = check(h.records)
    assert result.verdict == FAILED and result.fatal == {"dead_letter_without_x_death": 1}, result.to_dict()
    assert result.examples["dead_letter_without_x_death"][0]["id"] == "pub0-2"


def test_dlx_the_other_fatal_kinds_hold_on_the_dead_letter_route():
    h = dlx_h()
    h.publish("pub0-1", outcome="fail")  # nacked: never enqueued, so it cannot expire either
    dead_letter(h, "pub0-1")
    dead_letter(h, "ghost-1")  # never published
    h.publish("pub0-2", crc=5)
    dead_letter(h, "pub0-2", crc=6)  # the body changed on the way through the dead-letter exchange
    h.drain_done()
    result = check(h.records)
    assert result.fatal == {"nacked_delivered": 1, "unexpected": 1, "corrupt": 1}


def test_dlx_the_dead_letter_queue_is_not_held_to_publish_order():
    """Messages die in their own order (a requeued one past its deadline after later ones that
    expired in the queue): the FIFO rule judges the work queue only, where it still holds."""
    h = dlx_h()
    for i in range(1, 5):
        h.publish(f"pub0-{i}")
    dead_letter(h, "pub0-2")
    dead_letter(h, "pub0-1")  # out of publish order in one dead-letter consumer session: fine
    h.deliver("pub0-4", queue=WORK)
    h.deliver("pub0-3", queue=WORK)  # out of order in the work queue: still a violation
    h.drain_done()
    result = check(h.records)
    assert result.fatal == {"fifo_violations": 1} and result.examples["fifo_violations"][0]["id"] == "pub0-3"


def test_dlx_reported_oddities_are_not_fatal():
    h = dlx_h()
    h.publish("pub0-1")
    h.publish("pub0-2")
    dead_letter(h, "pub0-1", x_death=[{"queue": WORK, "reason": "expired", "count": 2}])
    h.deliver("pub0-2", queue=WORK, x_death=EXPIRED_DEATH)  # a work-queue delivery with an x-death
    h.drain_done()
    result = check(h.records)
    assert result.verdict == PASS
    assert result.counts["x_death_count_above_one"] == 1 and result.counts["work_queue_with_x_death"] == 1
    assert any("x-death" in note for note in result.notes)


def test_without_a_dead_letter_queue_in_the_meta_nothing_changes():
    """Histories of the other workloads (and from before the `queue` field) are judged as before."""
    h = clean(3)
    h.deliver("pub0-1", queue="jepsen-dlq")  # no dead-letter queue configured: a plain duplicate
    result = check(h.records)
    assert result.verdict == PASS and "by_dead_letter_only" not in result.counts and result.counts["duplicates"] == 1


def dlx_model_history(ops: list[tuple]) -> list[dict]:
    """A correct TTL + dead-letter broker: a work queue whose ready messages expire (op "expire":
    the head moves to the dead-letter queue with an x-death entry), consumers on both queues, and
    consumer crashes whose held work-queue messages are past their deadline half of the time (then
    dead-lettered at once instead of requeued). Then a drain of both queues."""
    h = dlx_h()
    work: list[dict] = []
    dlq: list[dict] = []
    seq = 0
    session = {"con0": 1, "con1": 1}
    for op in ops:
        kind = op[0]
        if kind == "publish":
            seq += 1
            mid, outcome = f"pub0-{seq}", op[1]
            h.add("invoke", "publish", "pub0", id=mid, seq=seq, session=1, crc=7)
            if outcome in ("ok", "info"):
                work.append({"id": mid, "held": False, "redelivered": False})
            h.add(
                {"ok": "ok", "fail": "fail", "info": "info"}[outcome],
                "publish",
                "pub0",
                id=mid,
                seq=seq,
                session=1,
                error="nack" if outcome == "fail" else None,
            )
        elif kind == "expire":
            head = next((m for m in work if not m["held"]), None)
            if head is not None:
                work.remove(head)
                dlq.append({"id": head["id"], "held": False, "redelivered": False})
        elif kind in ("deliver", "ack", "crash"):
            consumer = op[1]
            queue, name = (work, WORK) if consumer == "con0" else (dlq, DLQ)
            if kind == "deliver":
                m = next((m for m in queue if not m["held"]), None)
                if m is not None:
                    m["held"] = True
                    h.add(
                        "ok",
                        "deliver",
                        consumer,
                        id=m["id"],
                        redelivered=m["redelivered"],
                        session=session[consumer],
                        crc=7,
                        queue=name,
                        x_death=EXPIRED_DEATH if queue is dlq else None,
                    )
            elif kind == "ack":
                m = next((m for m in queue if m["held"]), None)
                if m is not None:
                    queue.remove(m)
                    h.add("ok", "ack", consumer, id=m["id"], session=session[consumer])
            else:
                for m in [m for m in queue if m["held"]]:
                    if queue is work and op[2]:  # past its deadline: dead-lettered on requeue
                        work.remove(m)
                        dlq.append({"id": m["id"], "held": False, "redelivered": False})
                    else:
                        m["held"], m["redelivered"] = False, True
                session[consumer] += 1
    h.phase("drain")
    for queue, name in ((work, WORK), (dlq, DLQ)):
        for m in list(queue):
            h.add(
                "ok",
                "deliver",
                "drain",
                id=m["id"],
                redelivered=m["redelivered"] or m["held"],
                session=1,
                crc=7,
                queue=name,
                x_death=EXPIRED_DEATH if queue is dlq else None,
            )
    h.drain_done()
    return h.records


dlx_op = st.one_of(
    st.tuples(st.just("publish"), st.sampled_from(("ok", "ok", "ok", "fail", "info"))),
    st.tuples(st.just("expire")),
    st.tuples(st.sampled_from(("deliver", "ack")), st.sampled_from(("con0", "con1"))),
    st.tuples(st.just("crash"), st.sampled_from(("con0", "con1")), st.booleans()),
)
DLX_PREFIX = [("publish", "ok"), ("publish", "ok"), ("expire",)]
dlx_ops = st.lists(dlx_op, max_size=80).map(lambda ops: DLX_PREFIX + ops)


@SETTINGS
@given(dlx_ops)
def test_a_correct_dead_letter_model_never_gives_a_fatal_verdict(ops):
    result = check(dlx_model_history(ops))
    assert result.fatal == {}, result.to_dict()
    assert result.counts["by_dead_letter_only"] + result.counts["by_both_routes"] >= 1  # the prefix expired one


@SETTINGS
@given(dlx_ops, st.data())
def test_one_dead_letter_stripped_of_its_x_death_is_always_fatal(ops, data):
    records = dlx_model_history(ops)
    candidates = [i for i, r in enumerate(records) if r["f"] == "deliver" and r.get("queue") == DLQ]
    assert candidates  # the prefix made one
    i = data.draw(st.sampled_from(candidates))
    bad = data.draw(st.sampled_from([None, [{"queue": WORK, "reason": "rejected", "count": 1}]]))
    records[i] = {k: v for k, v in records[i].items() if k != "x_death"} | ({"x_death": bad} if bad else {})
    result = check(records)
    assert result.verdict == FAILED and result.fatal == {"dead_letter_without_x_death": 1}


@SETTINGS
@given(dlx_ops, st.data())
def test_one_confirmed_message_lost_on_either_route_is_always_fatal(ops, data):
    records = dlx_model_history(ops)
    candidates = _confirmed_delivered(records)
    assert candidates
    victim = data.draw(st.sampled_from(candidates))
    records = [r for r in records if not (r["f"] in ("deliver", "ack") and r.get("id") == victim)]
    result = check(records)
    assert result.verdict == FAILED and result.examples["lost"] == [victim]
