"""The checker: a history in, verdicts out. Pure: no I/O, no clock, no randomness.

Theory of operation: Jepsen's total-queue check plus what AMQP adds (docs/reliability.md,
"Verdict"). One pass over the records builds, per message id, its publish (invoke time, outcome,
node, publisher session, CRC) and its deliveries (consumer session, redelivered flag, CRC), plus
the fault windows the nemesis and runner recorded. Then every message falls in one class:

    fatal (the broker broke a promise)
      lost               confirmed (publish ok) but never delivered, not even in the final drain
      unexpected         delivered but not published, not even invoked, at the time of delivery
                         (one clock under one lock: a delivery is always recorded after the invoke
                         of its publish; if it is published later anyway and never delivered
                         again, it is lost as well)
      nacked_delivered   nacked or returned (publish fail: "not enqueued") yet delivered, except
                         a nack from a node whose store failed (below)
      corrupt            delivered with a body whose CRC differs from the published one
      fifo_violations    within one consumer session, first deliveries (redelivered=false, the
                         first time the id is seen at all) of one publisher session arrive out
                         of publish order; AMQP orders a channel's messages and a queue delivers
                         in order, and a requeued message always comes back redelivered=true
      key_order_violations
                         (the partitioned workload) first deliveries, across every consumer, of
                         confirmed publishes of one publisher with one partition key, out of
                         publish order: a key's messages are in one partition, served by one
                         single active consumer at a time, which hands over only once it holds
                         none of them unsettled or is gone (its unsettled ones come back first).
                         In the FIFO rule above such publishes count per key: a consumer of a
                         partitioned queue takes from every partition
      minority_confirmed a publish invoked and confirmed while its node was cut off in a
                         minority (nemesis records say which nodes, from when to the next heal)
      received_after_delete
                         (the sqs workload) a message received by a ReceiveMessage invoked after a
                         DeleteMessage of it was answered 200 with a handle that was certainly
                         the latest: its receive was invoked less than half the visibility
                         timeout before the delete's answer, so no other receive could have
                         taken it since (SQS: a stale handle's delete answers 200 and deletes
                         nothing, so only such deletes prove anything)
      dead_letter_without_x_death
                         (the dlx workload) a delivery from the dead-letter queue whose most
                         recent x-death entry does not name the work queue with reason
                         `expired`: nothing else may put a message there (no rejects, no length
                         limit, no delivery limit in this workload)
      rolled_back_delivered
                         (the txn workload) a delivery of a half of a transaction whose intended
                         decision is rollback (intention "rollback", or "check" answered
                         "rollback"), whatever its publish outcome: no one in the run ever
                         publishes a commit for it, and an expired one is dropped
      committed_lost     (the txn workload) a half confirmed on some attempt, whose transaction
                         has a confirmed commit (by the publisher or the check responder), never
                         delivered, not even by the drain: a confirmed commit means the first
                         decision was commit and every queue holding halves applied it. Hole: a
                         single node forgets decisions at a restart (docs/queue-features.md), so a
                         transaction that expired before a restart and then got a retried half
                         could be committed without its older halves; the workload's retries
                         come before its decision and are bounded, and no run has met it
      txn_duplicates     (the txn workload) two different copies of one id delivered, told apart
                         by the body (each publish attempt of a half has its own, so its CRC
                         names the attempt): two copies were stored, so a retry after a lost
                         confirm was not deduplicated. Deliberately not "a delivery beyond the
                         first that is not flagged redelivered": on a cluster the same copy comes
                         back unflagged when the leader that delivered it died before the
                         delivery was replicated, and a second copy may come flagged when a
                         consumer died holding it; one copy delivered again is `duplicates`
    reported (benign, or a matter of degree)
      nacked_delivered_store_failed
                         nacked by a node while its disk was full (a disk-full nemesis record
                         names it in `full_disk`, from the fault's invoke until STORE_RECOVERY_S
                         after the next heal) and delivered all the same: a single node applies a
                         publish (and may deliver it) before the fsync that failed, and stores it
                         after its recovery; its nack means "not confirmed", as RabbitMQ's
                         (docs/storage.md). Any other nack still means "not enqueued"
      recovered          indeterminate (info, or no completion at all) but delivered: fine
      unknown            indeterminate and never delivered: fine (it may never have arrived)
      duplicates         deliveries beyond the first of an id, split by the redelivered flag:
                         `duplicates_unflagged` counts repeats that came with redelivered=false
                         (legal, AMQP calls the flag a hint, but worth a look)
      availability       the share of time with confirms, and confirmed / attempted publishes,
                         overall and per phase (quiet/fault/heal/recover)
      recovery_s         after each heal: seconds to the first confirm; after the final heal:
                         seconds until the runner's probe got a confirm from every node
      routes             (the dlx workload) ids delivered from the work queue, from the
                         dead-letter queue, and by both routes (legal: a message held unacked past
                         its deadline by a consumer that died is requeued and dead-lettered at
                         once; a duplicate, counted as such); x-death counts above 1 and work-queue
                         deliveries carrying an x-death are counted too (neither should happen)

With a dead-letter queue a confirmed message must arrive by one of the two routes: `lost` counts
deliveries from either queue. The FIFO rule looks at work-queue deliveries only: the dead-letter
queue receives messages in the order they die, and a requeued message past its deadline dies
after later ones that expired in the queue. The queue names come from the meta record
(spec.workload.queue and .dead_letter_queue); a delivery without a `queue` field (histories from
before the field) counts as one from the work queue.

The txn workload (txn_workload.py): records of f="txn" (invoke: the transaction's intention),
f="decide" (invoke/ok/fail/info with txn, action, by) and f="check"; a half's publish records
carry `txn` and `attempt`. A retried half is one id: a publish invoke of a known id with the same
txn and attempt > 1 is its retry (not a reused id); any attempt's ok confirms it, else any info
leaves it indeterminate (a later attempt's fail does not undo an earlier stored copy); its
delivered CRC must be one of its attempts' (else corrupt). `lost` and the FIFO rule do not apply
to halves: a confirmed half of a rolled-back transaction is never delivered, rightly
(committed_lost is their rule), and halves become ready at their commit, not in publish order.

The verdict is FAIL when any fatal count is non-zero, UNKNOWN when the run cannot vouch for its
counts (no message was ever confirmed, or the final drain did not empty the queue), else PASS.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from .history import FAIL, INFO, INVOKE, META, OK

FATAL_KINDS = (
    "lost",
    "unexpected",
    "nacked_delivered",
    "corrupt",
    "fifo_violations",
    "key_order_violations",
    "minority_confirmed",
    "dead_letter_without_x_death",
    "received_after_delete",
    "rolled_back_delivered",
    "committed_lost",
    "txn_duplicates",
)
TXN_ACTIONS = ("commit", "rollback")
# A delete answered within this share of the visibility timeout after its receive was invoked
# used the latest receipt handle (the sqs workload; see received_after_delete).
CERTAIN_DELETE_SHARE = 0.5
EXPIRED = "expired"  # the x-death reason of a message whose TTL ran out
PASS, FAILED, UNKNOWN = "PASS", "FAIL", "UNKNOWN"
EXAMPLES_MAX = 50  # ids listed per kind in the result (counts are always exact)
HEAL_VERBS = ("heal",)  # the nemesis verb that ends every fault window (see nemesis.py)
# A single node's store retries its recovery with a back-off of at most 30 s (docs/storage.md):
# its nacks for what failed come at the latest this long after the disk was emptied.
STORE_RECOVERY_S = 35.0


@dataclass
class _Publish:
    process: str
    session: int | None
    seq: int | None
    node: str | None
    invoke_time: float
    crc: int | None
    outcome: str | None = None  # ok | fail | info | None (no completion)
    outcome_time: float | None = None
    error: str | None = None
    txn: str | None = None  # the txn workload: the transaction this half belongs to
    key: str | None = None  # the partitioned workload: the publish's partition key
    crcs: dict = field(default_factory=dict)  # the txn workload: attempt -> CRC of that attempt's body
    attempts: int = 1
    # the txn workload: attempt -> (node, invoke time) of that attempt; a retried half is judged
    # by the attempt whose ok confirmed it (its node and time: minority_confirmed)
    starts: dict = field(default_factory=dict)


@dataclass
class _Delivery:
    time: float
    process: str
    session: int | None
    redelivered: bool
    crc: int | None
    node: str | None
    queue: str | None = None
    x_death: list | None = None
    receive_invoke: float | None = None  # the sqs workload: when the ReceiveMessage was invoked


@dataclass
class CheckResult:
    counts: dict = field(default_factory=dict)
    examples: dict = field(default_factory=dict)
    availability: dict = field(default_factory=dict)
    recovery_s: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    drain_complete: bool | None = None

    @property
    def fatal(self) -> dict:
        return {kind: self.counts.get(kind, 0) for kind in FATAL_KINDS if self.counts.get(kind, 0)}

    @property
    def verdict(self) -> str:
        if self.fatal:
            return FAILED
        if self.counts.get("confirmed", 0) == 0 or self.drain_complete is False:
            return UNKNOWN
        return PASS

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "fatal": self.fatal,
            "counts": self.counts,
            "examples": self.examples,
            "availability": self.availability,
            "recovery_s": self.recovery_s,
            "notes": self.notes,
            "drain_complete": self.drain_complete,
        }


def check(records: Iterable[dict]) -> CheckResult:
    publishes: dict[str, _Publish] = {}
    deliveries: dict[str, list[_Delivery]] = {}
    unexpected: list[str] = []
    corrupt: list[str] = []
    fifo: list[dict] = []
    acks = {"ok": 0, "fail": 0, "info": 0}
    phases: list[tuple[float, str]] = []
    heals: list[float] = []
    probes: list[dict] = []
    minority_windows: list[list] = []  # [start, end or None, frozenset(nodes)]
    full_disk_windows: list[list] = []  # [start (the fault's invoke), end or None, frozenset(nodes)]
    nemesis_invoked: dict[str, float] = {}  # f -> the time of its latest invoke
    confirm_times: list[float] = []
    drain_complete: bool | None = None
    notes: list[str] = []
    reused_ids: list[str] = []
    # FIFO: per consumer session, per publisher session, the last seq among first deliveries.
    fifo_last: dict[tuple, dict[tuple, tuple[int, str]]] = {}
    work_queue: str | None = None  # from the meta record
    dead_letter_queue: str | None = None
    dead_letter_bad: dict[str, dict] = {}  # id -> the first unexplained dead-letter delivery
    x_death_count_above_one = 0
    work_with_x_death: list[str] = []
    visibility_s: float | None = None  # the sqs workload's visibility timeout (meta)
    deletes_ok: list[tuple[str, float, float | None]] = []  # (id, answer time, its receive's invoke time)
    deletes_indeterminate = 0
    # The txn workload: intentions, decisions, checks, the copies of each half delivered.
    txn_intent: dict[str, dict] = {}  # txn -> the f="txn" invoke's value (intention, answer, size)
    txn_ok: dict[str, set] = {}  # txn -> {(action, by)} of confirmed decisions
    decide_counts = {"ok": 0, "fail": 0, "info": 0, "refused_404": 0, "refused_406": 0}
    checks_seen = 0
    half_retries = 0
    copies: dict[str, set] = {}  # id -> the attempts whose copy was delivered (by body CRC)

    for r in records:
        kind, f, t = r.get("type"), r.get("f"), float(r.get("time", 0.0))
        if kind == META:
            if work_queue is None:
                workload = ((r.get("value") or {}).get("spec") or {}).get("workload") or {}
                work_queue, dead_letter_queue = workload.get("queue"), workload.get("dead_letter_queue")
                visibility_s = workload.get("visibility_timeout_s")
            continue
        if f == "publish":
            mid = r.get("id")
            if mid is None:
                notes.append(f"publish record without id at t={t}")
                continue
            attempt = r.get("attempt")
            if kind == INVOKE:
                if mid in publishes:
                    p = publishes[mid]
                    if p.txn is not None and r.get("txn") == p.txn and isinstance(attempt, int) and attempt > 1:
                        # The txn workload's retry of a half after a lost confirm (same id, same transaction).
                        p.attempts += 1
                        p.crcs[attempt] = r.get("crc")
                        p.starts[attempt] = (r.get("node"), t)
                        half_retries += 1
                        continue
                    reused_ids.append(mid)
                    continue
                publishes[mid] = _Publish(
                    r.get("process", "?"),
                    r.get("session"),
                    r.get("seq"),
                    r.get("node"),
                    t,
                    r.get("crc"),
                    txn=r.get("txn"),
                    key=r.get("key"),
                )
                if r.get("txn") is not None:
                    publishes[mid].crcs[attempt if isinstance(attempt, int) else 1] = r.get("crc")
                    publishes[mid].starts[attempt if isinstance(attempt, int) else 1] = (r.get("node"), t)
            else:
                p = publishes.get(mid)
                if p is None:
                    notes.append(f"completion of {mid} without an invoke")
                    continue
                if p.outcome is not None:
                    # The first completion wins (a late ack after info is not news), except across
                    # a retried half's attempts: any ok confirms the id, else any info leaves it open.
                    if p.attempts > 1 and ((kind == OK and p.outcome != OK) or (kind == INFO and p.outcome == FAIL)):
                        p.outcome, p.outcome_time, p.error = kind, t, r.get("error")
                        if kind == OK:
                            confirm_times.append(t)
                            p.node, p.invoke_time = p.starts.get(attempt, (p.node, p.invoke_time))
                    continue
                p.outcome, p.outcome_time, p.error = kind, t, r.get("error")
                if kind == OK:
                    confirm_times.append(t)
        elif f == "deliver" and kind == OK:
            mid = r.get("id")
            d = _Delivery(
                t,
                r.get("process", "?"),
                r.get("session"),
                bool(r.get("redelivered", False)),
                r.get("crc"),
                r.get("node"),
                r.get("queue"),
                r.get("x_death"),
                (r.get("value") or {}).get("receive_invoke"),
            )
            dead_lettered = dead_letter_queue is not None and d.queue == dead_letter_queue
            if dead_lettered:
                deaths = d.x_death if isinstance(d.x_death, list) else []
                last_death = deaths[0] if deaths and isinstance(deaths[0], dict) else {}
                if last_death.get("queue") != work_queue or last_death.get("reason") != EXPIRED:
                    dead_letter_bad.setdefault(
                        str(mid), {"id": mid, "time": t, "process": d.process, "x_death": d.x_death}
                    )
                elif isinstance(last_death.get("count"), int) and last_death["count"] > 1:
                    x_death_count_above_one += 1
            elif d.x_death:
                work_with_x_death.append(str(mid))
            p = publishes.get(mid) if mid is not None else None
            if p is None:
                unexpected.append(str(mid))
                continue
            first = mid not in deliveries
            deliveries.setdefault(mid, []).append(d)
            if p.crcs:  # a half: its body names the attempt that published this copy
                copy = next((a for a, crc in p.crcs.items() if crc == d.crc), None)
                if copy is None and d.crc is not None:
                    corrupt.append(mid)
                elif copy is not None:
                    copies.setdefault(mid, set()).add(copy)
            elif p.crc is not None and d.crc is not None and p.crc != d.crc:
                corrupt.append(mid)
            # (halves become ready at their commit, not in publish order: no FIFO rule for them)
            if first and not d.redelivered and p.seq is not None and not dead_lettered and p.txn is None:
                per_consumer = fifo_last.setdefault((d.process, d.session), {})
                publisher = (p.process, p.session, p.key)
                last = per_consumer.get(publisher)
                if last is not None and p.seq < last[0]:
                    fifo.append(
                        {
                            "consumer": d.process,
                            "consumer_session": d.session,
                            "publisher": p.process,
                            "publisher_session": p.session,
                            "id": mid,
                            "after": last[1],
                            "time": t,
                        }
                    )
                else:
                    per_consumer[publisher] = (p.seq, mid)
        elif f == "txn" and kind == INVOKE and r.get("txn") is not None:
            txn_intent.setdefault(str(r["txn"]), dict(r.get("value") or {}))
        elif f == "decide" and r.get("txn") is not None:
            if kind == OK:
                decide_counts["ok"] += 1
                txn_ok.setdefault(str(r["txn"]), set()).add((r.get("action"), r.get("by")))
            elif kind == FAIL:
                decide_counts["fail"] += 1
                code = str(r.get("error") or "")[:3]
                if code in ("404", "406"):
                    decide_counts[f"refused_{code}"] += 1
            elif kind == INFO:
                decide_counts["info"] += 1
        elif f == "check" and kind == OK:
            checks_seen += 1
        elif f == "ack":
            if kind in acks:
                acks[kind] += 1
        elif f == "delete" and r.get("id") is not None:
            if kind == OK:
                deletes_ok.append((str(r["id"]), t, (r.get("value") or {}).get("receive_invoke")))
            elif kind in (INFO, FAIL):
                deletes_indeterminate += 1
        elif f == "phase" and kind == OK:
            name = (r.get("value") or {}).get("phase", "?")
            phases.append((t, name))
            if name == "heal":
                heals.append(t)
        elif f == "recover" and r.get("process") == "probe" and kind in (OK, INFO):
            # After the final heal the runner probes every node; its record says how long that took.
            seconds = (r.get("value") or {}).get("seconds")
            probes.append(
                {
                    "heal_time": round(t - (seconds or 0.0), 6),
                    "recovery_s": seconds if kind == OK else None,
                    "via": "probe",
                }
            )
        elif f == "drain" and kind in (OK, INFO, FAIL):
            remaining = (r.get("value") or {}).get("remaining")
            complete = kind == OK and remaining == 0
            drain_complete = complete if drain_complete is None else (drain_complete and complete)
        elif r.get("process") == "nemesis":
            if kind == INVOKE:
                nemesis_invoked[f] = t
            if kind == INVOKE and f in HEAL_VERBS:
                for window in minority_windows:
                    if window[1] is None:
                        window[1] = t
                for window in full_disk_windows:
                    if window[1] is None:
                        window[1] = t + STORE_RECOVERY_S
            elif kind == OK:
                minority = (r.get("value") or {}).get("minority") or []
                if minority:
                    minority_windows.append([t, None, frozenset(minority)])
                full = (r.get("value") or {}).get("full_disk") or []
                if full:  # (the disk may fill while the nemesis still writes its ballast)
                    full_disk_windows.append([nemesis_invoked.get(f, t), None, frozenset(full)])

    lost, nacked_delivered, recovered, unknown, minority_confirmed = [], [], [], [], []
    nacked_delivered_store_failed: list[str] = []
    outcomes = {"ok": 0, "fail": 0, "info": 0, "pending": 0}
    returned = 0
    committed_lost: list[str] = []
    rolled_back_delivered: list[str] = []

    def intended(txn: str) -> str | None:
        value = txn_intent.get(txn) or {}
        decision = value.get("answer") if value.get("intention") == "check" else value.get("intention")
        return decision if decision in TXN_ACTIONS else None

    committed_txns = {txn for txn, oks in txn_ok.items() if any(action == "commit" for action, _ in oks)}
    for mid, p in publishes.items():
        delivered = mid in deliveries
        outcomes[p.outcome or "pending"] += 1
        if p.txn is not None:
            # A half: delivered only if its transaction was committed (see txn rules above).
            if delivered and intended(p.txn) == "rollback":
                rolled_back_delivered.append(mid)
            if p.outcome == OK and not delivered and p.txn in committed_txns:
                committed_lost.append(mid)
        if p.outcome == OK:
            if not delivered and p.txn is None:
                lost.append(mid)
            for start, end, nodes in minority_windows:
                if p.node in nodes and p.invoke_time >= start and (end is None or p.outcome_time <= end):
                    minority_confirmed.append(mid)
                    break
        elif p.outcome == FAIL:
            if p.error == "returned":
                returned += 1
            if delivered and p.error != "returned" and _in_window(full_disk_windows, p.node, p.outcome_time):
                nacked_delivered_store_failed.append(mid)
            elif delivered:
                nacked_delivered.append(mid)
        elif delivered:
            recovered.append(mid)
        else:
            unknown.append(mid)

    key_order = key_order_violations(publishes, deliveries)
    after_delete, deletes_certain = received_after_delete(deletes_ok, deliveries, visibility_s)
    deliveries_total = sum(len(ds) for ds in deliveries.values())
    duplicates = deliveries_total - len(deliveries)
    dup_flagged = sum(1 for ds in deliveries.values() for d in ds[1:] if d.redelivered)
    dup_ids = [mid for mid, ds in deliveries.items() if len(ds) > 1]
    dup_unflagged_ids = [mid for mid, ds in deliveries.items() if any(not d.redelivered for d in ds[1:])]
    txn_duplicates = sorted((mid for mid, attempts in copies.items() if len(attempts) > 1), key=_id_key)
    unknown_txns = sorted({p.txn for p in publishes.values() if p.txn is not None and intended(p.txn) is None})
    if unknown_txns:
        notes.append(f"{len(unknown_txns)} transactions without an intention record: {unknown_txns[:5]}")
    if reused_ids:
        notes.append(f"{len(reused_ids)} message ids published twice (a harness bug): {reused_ids[:5]}")
    if unexpected:
        unexpected = list(dict.fromkeys(unexpected))

    counts = {
        "published": len(publishes),
        "confirmed": outcomes["ok"],
        "failed": outcomes["fail"],
        "returned": returned,
        "indeterminate": outcomes["info"] + outcomes["pending"],
        "delivered": len(deliveries),
        "deliveries": deliveries_total,
        "acks": acks["ok"],
        "acks_failed": acks["fail"] + acks["info"],
        "lost": len(lost),
        "unexpected": len(unexpected),
        "nacked_delivered": len(nacked_delivered),
        "nacked_delivered_store_failed": len(nacked_delivered_store_failed),
        "corrupt": len(corrupt),
        "fifo_violations": len(fifo),
        "key_order_violations": len(key_order),
        "minority_confirmed": len(minority_confirmed),
        "recovered": len(recovered),
        "unknown": len(unknown),
        "duplicates": duplicates,
        "duplicates_flagged": dup_flagged,
        "duplicates_unflagged": duplicates - dup_flagged,
        "duplicate_ids": len(dup_ids),
        "dead_letter_without_x_death": len(dead_letter_bad),
        "received_after_delete": len(after_delete),
    }
    if deletes_ok or deletes_indeterminate:
        counts.update(
            {
                "deletes_ok": len(deletes_ok),
                "deletes_certain": deletes_certain,
                "deletes_indeterminate": deletes_indeterminate,
            }
        )
    if txn_intent:
        intentions = [v.get("intention") for v in txn_intent.values()]
        counts.update(
            {
                "txns": len(txn_intent),
                "txns_intended_commit": intentions.count("commit"),
                "txns_intended_rollback": intentions.count("rollback"),
                "txns_left_to_check": intentions.count("check"),
                "txns_committed": len(committed_txns),
                "txns_rolled_back": sum(1 for oks in txn_ok.values() if any(action == "rollback" for action, _ in oks)),
                "txns_checked_back": sum(
                    1
                    for txn, oks in txn_ok.items()
                    if (txn_intent.get(txn) or {}).get("intention") == "check"
                    and any(by == "responder" for _, by in oks)
                ),
                "decides_ok": decide_counts["ok"],
                "decides_failed": decide_counts["fail"],
                "decides_refused_404": decide_counts["refused_404"],
                "decides_refused_406": decide_counts["refused_406"],
                "decides_indeterminate": decide_counts["info"],
                "checks": checks_seen,
                "half_retries": half_retries,
                "retried_ids_delivered": sum(1 for mid, p in publishes.items() if p.attempts > 1 and mid in deliveries),
            }
        )
    counts.update(
        {
            "rolled_back_delivered": len(rolled_back_delivered),
            "committed_lost": len(committed_lost),
            "txn_duplicates": len(txn_duplicates),
        }
    )
    if dead_letter_queue is not None:

        def routes_of(ds: list[_Delivery]) -> tuple[bool, bool]:
            dl = [d.queue == dead_letter_queue for d in ds]
            return (not all(dl), any(dl))

        routes = [routes_of(ds) for ds in deliveries.values()]
        counts.update(
            {
                "by_work_queue_only": sum(1 for w, dl in routes if w and not dl),
                "by_dead_letter_only": sum(1 for w, dl in routes if dl and not w),
                "by_both_routes": sum(1 for w, dl in routes if w and dl),
                "dead_letter_deliveries": sum(
                    1 for ds in deliveries.values() for d in ds if d.queue == dead_letter_queue
                ),
                "x_death_count_above_one": x_death_count_above_one,
                "work_queue_with_x_death": len(work_with_x_death),
            }
        )
        if work_with_x_death:
            notes.append(
                f"{len(work_with_x_death)} work-queue deliveries carried an x-death header: {work_with_x_death[:5]}"
            )
    examples = {
        "lost": sorted(lost, key=_id_key)[:EXAMPLES_MAX],
        "unexpected": unexpected[:EXAMPLES_MAX],
        "nacked_delivered": nacked_delivered[:EXAMPLES_MAX],
        "nacked_delivered_store_failed": nacked_delivered_store_failed[:EXAMPLES_MAX],
        "corrupt": corrupt[:EXAMPLES_MAX],
        "fifo_violations": fifo[:EXAMPLES_MAX],
        "key_order_violations": key_order[:EXAMPLES_MAX],
        "minority_confirmed": minority_confirmed[:EXAMPLES_MAX],
        "recovered": recovered[:EXAMPLES_MAX],
        "duplicates_unflagged": dup_unflagged_ids[:EXAMPLES_MAX],
        "dead_letter_without_x_death": list(dead_letter_bad.values())[:EXAMPLES_MAX],
        "received_after_delete": after_delete[:EXAMPLES_MAX],
        "rolled_back_delivered": sorted(rolled_back_delivered, key=_id_key)[:EXAMPLES_MAX],
        "committed_lost": sorted(committed_lost, key=_id_key)[:EXAMPLES_MAX],
        "txn_duplicates": txn_duplicates[:EXAMPLES_MAX],
    }
    return CheckResult(
        counts=counts,
        examples={k: v for k, v in examples.items() if v},
        availability=_availability(publishes, phases, confirm_times),
        recovery_s=_recovery(heals, phases, confirm_times) + probes,
        notes=notes,
        drain_complete=drain_complete,
    )


def key_order_violations(publishes: dict[str, _Publish], deliveries: dict[str, list[_Delivery]]) -> list[dict]:
    """The partitioned workload's rule (see the module docstring): per publisher and key, the
    first deliveries of confirmed publishes, in the order they were recorded (one clock), must
    come in publish order. Unconfirmed ones are left out: one in doubt may be committed after
    later ones (its node's proposer retries it once the node is back)."""
    firsts: dict[tuple[str, str], list[tuple[float, int, str]]] = {}
    for mid, ds in deliveries.items():
        p = publishes.get(mid)
        if p is None or p.key is None or p.outcome != OK or p.seq is None:
            continue
        firsts.setdefault((p.process, p.key), []).append((ds[0].time, p.seq, mid))
    violations = []
    for (process, key), seen in sorted(firsts.items()):
        seen.sort()
        last_seq, last_id = -1, ""
        for t, seq, mid in seen:
            if seq < last_seq:
                violations.append({"publisher": process, "key": key, "id": mid, "after": last_id, "time": t})
            else:
                last_seq, last_id = seq, mid
    return violations


def _in_window(windows: list[list], node: str | None, t: float | None) -> bool:
    return t is not None and any(
        node in nodes and start <= t and (end is None or t <= end) for start, end, nodes in windows
    )


def received_after_delete(
    deletes_ok: list[tuple[str, float, float | None]],
    deliveries: dict[str, list[_Delivery]],
    visibility_s: float | None,
) -> tuple[list[dict], int]:
    """Deliveries of a message whose receive was invoked after a certain delete of it was answered;
    and how many deletes were certain. A delete is certain when its receive was invoked less than
    CERTAIN_DELETE_SHARE of the visibility timeout before the delete's answer: the message was
    still in flight to that receive, so its handle was the latest and the 200 means deleted."""
    if not visibility_s:
        return [], 0
    window_s = float(visibility_s) * CERTAIN_DELETE_SHARE
    deleted_at: dict[str, float] = {}
    certain = 0
    for mid, answered, receive_invoke in deletes_ok:
        if receive_invoke is None or answered - float(receive_invoke) >= window_s:
            continue
        certain += 1
        if mid not in deleted_at or answered < deleted_at[mid]:
            deleted_at[mid] = answered
    found = []
    for mid, answered in deleted_at.items():
        for d in deliveries.get(mid, []):
            if d.receive_invoke is not None and d.receive_invoke > answered:
                found.append(
                    {"id": mid, "deleted_at": answered, "receive_invoke": d.receive_invoke, "process": d.process}
                )
                break
    found.sort(key=lambda e: e["deleted_at"])
    return found, certain


def _id_key(mid: str) -> tuple:
    head, _, tail = mid.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (mid, 0)


def _phase_at(phases: list[tuple[float, str]], times: list[float], t: float) -> str:
    i = bisect.bisect_right(times, t) - 1
    return phases[i][1] if i >= 0 else "start"


def _availability(publishes: dict[str, _Publish], phases: list[tuple[float, str]], confirm_times: list[float]) -> dict:
    """Per phase kind and for the whole workload (first phase up to the drain):
    `ratio`  the share of the time with a confirm in every second (a client that cannot even
             connect attempts nothing, so counting attempts alone would hide an outage), and
    `confirm_ratio`  confirmed / attempted publishes, by the phase the publish began in."""
    times = [t for t, _ in phases]
    confirm_times = sorted(confirm_times)
    tally: dict[str, dict] = {}

    def bucket(key: str) -> dict:
        return tally.setdefault(key, {"confirmed": 0, "attempted": 0, "seconds": 0.0, "seconds_available": 0.0})

    for p in publishes.values():
        for key in ("all", _phase_at(phases, times, p.invoke_time)):
            entry = bucket(key)
            entry["confirmed"] += p.outcome == OK
            entry["attempted"] += 1
    for i, (start, name) in enumerate(phases):
        if name in ("recover", "drain", "end"):
            break  # the workload's time ends at the final heal; what follows is the harness's
        end = phases[i + 1][0] if i + 1 < len(phases) else (confirm_times[-1] if confirm_times else start)
        t = start
        while t < end:
            slice_end = min(end, t + 1.0)
            j = bisect.bisect_left(confirm_times, t)
            up = j < len(confirm_times) and confirm_times[j] < slice_end
            for key in ("all", name):
                entry = bucket(key)
                entry["seconds"] += slice_end - t
                entry["seconds_available"] += (slice_end - t) if up else 0.0
            t = slice_end
    out = {}
    for key, e in sorted(tally.items()):
        out[key] = {
            "confirmed": e["confirmed"],
            "attempted": e["attempted"],
            "confirm_ratio": round(e["confirmed"] / e["attempted"], 4) if e["attempted"] else None,
            "seconds": round(e["seconds"], 3),
            "ratio": round(e["seconds_available"] / e["seconds"], 4) if e["seconds"] else None,
        }
    return out


def _recovery(heals: list[float], phases: list[tuple[float, str]], confirm_times: list[float]) -> list:
    """Seconds from each heal to the first confirm after it (None: none before the next phase change
    that is not a quiet one, i.e. the next fault or the drain)."""
    confirm_times = sorted(confirm_times)
    out = []
    for heal_time in heals:
        limit = min(
            (t for t, name in phases if t > heal_time and name not in ("quiet", "heal", "recover")), default=None
        )
        i = bisect.bisect_right(confirm_times, heal_time)
        first = confirm_times[i] if i < len(confirm_times) else None
        if first is not None and (limit is None or first <= limit):
            out.append({"heal_time": heal_time, "recovery_s": round(first - heal_time, 3)})
        else:
            out.append({"heal_time": heal_time, "recovery_s": None})
    return out
