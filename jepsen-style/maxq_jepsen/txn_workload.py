"""The txn workload: transactional (half) publishes with commit, rollback and check-back (issue #21).

Theory of operation (docs/queue-features.md, "Transactional (half) messages" and "Deduplication"):
the work queue is declared with `x-message-deduplication: true`; a second durable queue (the
checks queue, WorkloadConfig.checks_queue) receives the broker's check-backs. A `TxnPublisher`
runs one transaction at a time: 1-3 halves (seeded), each a persistent, mandatory, confirmed
publish to the work queue with `x-transaction-id` (unique per transaction: "<process>-t<n>"),
`x-transaction-timeout` (seeded in txn_timeout_ms), `x-transaction-checks`,
`x-deduplication-header` = its message id, and `reply_to` = the checks queue. Each transaction has
a seeded intention: `commit`, `rollback`, or `check` (left to the check-back, then its `answer`,
commit or rollback, seeded). The intention goes into a `TxnBook` shared by every worker of the
harness process (the check responder reads it), and into the history as an f="txn" invoke record
{txn, value: {intention, answer, size}} written before the first half leaves.

Halves: recorded like the queue workload's publishes (invoke/ok/fail/info, id, crc) plus `txn`
and `attempt`. A half whose confirm was lost (info: the connection died, or the confirm took too
long) is published again on the next session, same id, same transaction, `attempt` + 1, at most
txn_retries_max attempts, before the decision: the deduplication window must drop the copy if
the first one was stored. Every attempt's body is different (the attempt number is in it), so a
delivery says which copy it is: two copies of one id delivered is a duplicate the window should
have prevented (checker: txn_duplicates), whatever the redelivered flags say.

Decision: once every half is settled (ok, fail, or info with no attempts left), the publisher of
a `commit`/`rollback` transaction publishes to `amq.maxq.transaction` with routing key the
transaction id and `x-transaction-action`, confirmed: f="decide" invoke, then ok (basic.ack),
fail (basic.nack, or the channel closed by the broker with 404 no such transaction or 406 a
contrary decision stands: `error` starts with the reply code), info (connection lost: sent again
on the next session, at most txn_retries_max times). Halves and decisions are never in flight
together on one channel, so a channel error names the operation in flight. A `check`
transaction is left alone once its halves are settled.

`CheckResponder`: consumes the checks queue (manual ack, prefetch 1: one answer in flight, so a
channel error is that answer's), records each check (f="check": txn, attempt, redelivered) and
answers with the book's decision for it (f="decide" with by="responder"), acking the check once
the answer is confirmed. A transaction whose answer was refused (404/406) is settled: later
checks for it are acked unanswered. Checks never go through the checker's delivery rules (the
drain does not touch the checks queue: a check carries the first half's message_id).
"""

from __future__ import annotations

import threading
import time
import zlib

import pika
from pika.exceptions import AMQPError, ChannelClosedByBroker

from .history import FAIL, INFO, INVOKE, OK
from .workload import Worker, _Session, _text, message_body

TXN_EXCHANGE = "amq.maxq.transaction"
INTENTIONS = ("commit", "rollback", "check")
CHECK_TYPE = "maxq.transaction.check"


class TxnBook:
    """Every transaction's intended decision, shared by the publishers and the responders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decision: dict[str, str] = {}
        self._settled: set[str] = set()

    def intend(self, txn_id: str, decision: str) -> None:
        with self._lock:
            self._decision[txn_id] = decision

    def decision(self, txn_id: str) -> str | None:
        with self._lock:
            return self._decision.get(txn_id)

    def settle(self, txn_id: str) -> None:
        with self._lock:
            self._settled.add(txn_id)

    def settled(self, txn_id: str) -> bool:
        with self._lock:
            return txn_id in self._settled


def half_body(message_id: str, attempt: int, seed: int, size_bytes: int) -> bytes:
    """Each attempt of a half has its own body: a delivery tells which copy it is."""
    return message_body(f"{message_id} a{attempt}", seed, size_bytes)


def channel_error(reason) -> tuple[int, str] | None:
    """(reply code, text) of a channel closed by the broker, else None."""
    if isinstance(reason, ChannelClosedByBroker):
        return reason.reply_code, _text(reason.reply_text)
    return None


class _Txn:
    def __init__(self, txn_id: str, intention: str, answer: str, timeout_ms: int, ids: list[str]) -> None:
        self.id = txn_id
        self.intention = intention
        self.answer = answer
        self.timeout_ms = timeout_ms
        # id -> [attempts so far, outcome of the latest attempt: None (in flight / not sent), ok, fail, info]
        self.halves: dict[str, list] = {mid: [0, None] for mid in ids}
        self.decide_attempts = 0
        self.decided = False  # the decision is settled (ok, refused, or no attempts left)
        self.no_retry = False  # the transaction was decided under us: republishing halves is pointless

    @property
    def decision(self) -> str:
        return self.answer if self.intention == "check" else self.intention


class TxnPublisher(Worker):
    def __init__(self, *args, book: TxnBook, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.book = book
        self.seq = 0  # message ids, across sessions
        self.txn_seq = 0
        self.current: _Txn | None = None

    def make_session(self, node, host, port):
        return _TxnPublisherSession(self, node, host, port)

    def new_txn(self) -> _Txn:
        config = self.config
        self.txn_seq += 1
        txn_id = f"{self.process}-t{self.txn_seq}"
        size = self.rng.randint(*config.txn_size)
        intention = self.rng.choice(INTENTIONS)
        answer = self.rng.choice(("commit", "rollback"))
        timeout_ms = self.rng.randint(*config.txn_timeout_ms)
        ids = []
        for _ in range(size):
            self.seq += 1
            ids.append(f"{self.process}-{self.seq}")
        txn = _Txn(txn_id, intention, answer, timeout_ms, ids)
        self.book.intend(txn_id, txn.decision)
        self.history.write(
            INVOKE,
            "txn",
            self.process,
            txn=txn_id,
            value={"intention": intention, "answer": answer, "size": size, "ids": ids, "timeout_ms": timeout_ms},
        )
        return txn


class _TxnPublisherSession(_Session):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        # delivery tag -> ("half", id, attempt, sent at) | ("decide", txn id, attempt, sent at)
        self.inflight: dict[int, tuple[str, str, int, float]] = {}
        self.returned: set[str] = set()
        self.tag = 0
        self.next_txn = 0.0
        self.close_reason = None

    def on_channel(self, channel) -> None:
        channel.add_on_return_callback(self._on_return)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)

    def _on_channel_closed(self, channel, reason) -> None:
        self.close_reason = reason
        super()._on_channel_closed(channel, reason)

    def _on_select_ok(self, _frame) -> None:
        self.ready = True
        self.next_txn = time.monotonic()
        self.record(OK, "connect")

    def close_wait_s(self) -> float:
        return self.w.config.confirm_timeout_s

    def begin_close(self) -> None:
        pass  # on_tick closes once nothing is in flight

    def on_tick(self, now: float) -> None:
        w, config = self.w, self.w.config
        if self.inflight and not self.aborted:
            oldest = min(entry[3] for entry in self.inflight.values())
            if now - oldest > config.confirm_timeout_s:
                self._abort(f"no confirm for {config.confirm_timeout_s}s")
                return
        if not self.ready or self.inflight:
            return
        txn = w.current
        if txn is not None and not txn.decided:
            if not self._advance(txn, now):
                return
            if not txn.decided:
                return
        if self.closing:
            if not self.conn.is_closing:
                self._close()
            return
        if now < self.next_txn or w.txn_seq >= config.messages_per_publisher_max:
            return
        self.next_txn = max(now, self.next_txn + (1.0 / config.rate_per_publisher_hz) * w.rng.uniform(0.5, 1.5))
        w.current = w.new_txn()
        self._advance(w.current, now)

    def _advance(self, txn: _Txn, now: float) -> bool:
        """Send what the transaction needs next (halves, retries, or the decision). False: the
        session broke while sending."""
        config = self.w.config
        pending = [
            mid
            for mid, (attempts, outcome) in txn.halves.items()
            if attempts == 0 or (outcome == INFO and attempts < config.txn_retries_max and not txn.no_retry)
        ]
        if pending:
            return all(self._publish_half(txn, mid, now) for mid in pending)
        if txn.intention == "check":
            txn.decided = True
            return True
        if txn.decide_attempts >= config.txn_retries_max:
            txn.decided = True
            return True
        return self._publish_decide(txn, now)

    def _publish_half(self, txn: _Txn, mid: str, now: float) -> bool:
        w = self.w
        entry = txn.halves[mid]
        entry[0] += 1
        entry[1] = None
        attempt = entry[0]
        body = half_body(mid, attempt, w.seed, w.config.body_bytes)
        seq = int(mid.rsplit("-", 1)[1])
        self.record(INVOKE, "publish", id=mid, seq=seq, txn=txn.id, attempt=attempt, crc=zlib.crc32(body))
        headers = {
            "x-transaction-id": txn.id,
            "x-transaction-timeout": txn.timeout_ms,
            "x-transaction-checks": w.config.txn_checks,
            "x-deduplication-header": mid,
        }
        try:
            self.channel.basic_publish(
                "",
                w.config.queue,
                body,
                mandatory=True,
                properties=pika.BasicProperties(
                    delivery_mode=2, message_id=mid, reply_to=w.config.checks_queue, headers=headers
                ),
            )
        except AMQPError as exc:
            entry[1] = INFO
            self.record(INFO, "publish", id=mid, seq=seq, txn=txn.id, attempt=attempt, error=f"send: {_text(exc)}")
            self._abort("publish raised")
            return False
        self.tag += 1
        self.inflight[self.tag] = ("half", mid, attempt, now)
        return True

    def _publish_decide(self, txn: _Txn, now: float) -> bool:
        txn.decide_attempts += 1
        attempt = txn.decide_attempts
        action = txn.intention
        self.record(INVOKE, "decide", txn=txn.id, action=action, by="publisher", attempt=attempt)
        try:
            self.channel.basic_publish(
                TXN_EXCHANGE, txn.id, b"", properties=pika.BasicProperties(headers={"x-transaction-action": action})
            )
        except AMQPError as exc:
            self.record(INFO, "decide", txn=txn.id, action=action, by="publisher", error=f"send: {_text(exc)}")
            self._abort("publish raised")
            return False
        self.tag += 1
        self.inflight[self.tag] = ("decide", txn.id, attempt, now)
        return True

    def _on_return(self, _channel, _method, properties, _body) -> None:
        if properties.message_id:
            self.returned.add(properties.message_id)

    def _on_confirm(self, frame) -> None:
        method = frame.method
        ack = isinstance(method, pika.spec.Basic.Ack)
        tags = [t for t in self.inflight if t <= method.delivery_tag] if method.multiple else [method.delivery_tag]
        txn = self.w.current
        for tag in sorted(tags):
            entry = self.inflight.pop(tag, None)
            if entry is None or txn is None:
                continue
            what, key, attempt, _ = entry
            if what == "half":
                seq = int(key.rsplit("-", 1)[1])
                fields = {"id": key, "seq": seq, "txn": txn.id, "attempt": attempt}
                if not ack:
                    outcome, error = FAIL, "nack"
                elif key in self.returned:
                    self.returned.discard(key)
                    outcome, error = FAIL, "returned"
                else:
                    outcome, error = OK, None
                self.record(outcome, "publish", error=error, **fields)
                txn.halves[key][1] = outcome
            else:
                action = txn.intention
                if ack:
                    self.record(OK, "decide", txn=txn.id, action=action, by="publisher", attempt=attempt)
                    txn.decided = True
                else:
                    self.record(
                        FAIL, "decide", txn=txn.id, action=action, by="publisher", attempt=attempt, error="nack"
                    )

    def on_lost(self, why: str) -> None:
        txn = self.w.current
        refused = channel_error(self.close_reason)
        for tag in sorted(self.inflight):
            what, key, attempt, _ = self.inflight[tag]
            if txn is None:
                continue
            if what == "half":
                seq = int(key.rsplit("-", 1)[1])
                # A channel error while halves are in flight: 406, the transaction was decided
                # meanwhile (its check-back ran out or was answered). The halves before the
                # refused one may be stored: indeterminate; and retrying is pointless.
                if refused is not None:
                    txn.no_retry = True
                self.record(INFO, "publish", id=key, seq=seq, txn=txn.id, attempt=attempt, error=why)
                txn.halves[key][1] = INFO
            elif refused is not None:
                code, text = refused
                self.record(
                    FAIL, "decide", txn=txn.id, action=txn.intention, by="publisher", attempt=attempt,
                    error=f"{code} {text}",
                )  # fmt: skip
                txn.decided = True
            else:
                self.record(
                    INFO, "decide", txn=txn.id, action=txn.intention, by="publisher", attempt=attempt, error=why
                )
        self.inflight.clear()


class CheckResponder(Worker):
    """Answers the broker's check-backs with the book's decision (see the module docstring)."""

    def __init__(self, *args, book: TxnBook, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.book = book

    def make_session(self, node, host, port):
        return _ResponderSession(self, node, host, port)


class _ResponderSession(_Session):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.answer: tuple[int, str, str, int, float] | None = (
            None  # (check's delivery tag, txn, action, pub tag, sent)
        )
        self.tag = 0
        self.close_reason = None

    def on_channel(self, channel) -> None:
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_select_ok)

    def _on_select_ok(self, _frame) -> None:
        self.channel.basic_qos(prefetch_count=1, callback=self._on_qos)

    def _on_qos(self, _frame) -> None:
        self.channel.basic_consume(
            self.w.config.checks_queue, self._on_check, auto_ack=False, callback=self._on_consume_ok
        )

    def _on_consume_ok(self, _frame) -> None:
        self.ready = True
        self.record(OK, "connect", value={"queue": self.w.config.checks_queue})

    def _on_channel_closed(self, channel, reason) -> None:
        self.close_reason = reason
        super()._on_channel_closed(channel, reason)

    def on_tick(self, now: float) -> None:
        if self.answer is not None and not self.aborted and now - self.answer[4] > self.w.config.confirm_timeout_s:
            self._abort(f"no confirm for {self.w.config.confirm_timeout_s}s")

    def _on_check(self, _channel, method, properties, body) -> None:
        headers = properties.headers or {}
        txn_id = headers.get("x-transaction-id")
        txn_id = txn_id.decode() if isinstance(txn_id, bytes) else txn_id
        attempt = headers.get("x-transaction-check-attempt")
        action = self.w.book.decision(txn_id) if isinstance(txn_id, str) else None
        settled = isinstance(txn_id, str) and self.w.book.settled(txn_id)
        self.record(
            OK,
            "check",
            txn=txn_id,
            attempt=attempt,
            redelivered=bool(method.redelivered),
            value={"type": properties.type, "answer": None if settled else action},
        )
        if action is None or settled:
            self._ack(method.delivery_tag)
            return
        self.record(INVOKE, "decide", txn=txn_id, action=action, by="responder", check_attempt=attempt)
        try:
            self.channel.basic_publish(
                TXN_EXCHANGE, txn_id, b"", properties=pika.BasicProperties(headers={"x-transaction-action": action})
            )
        except AMQPError as exc:
            self.record(INFO, "decide", txn=txn_id, action=action, by="responder", error=f"send: {_text(exc)}")
            self._abort("publish raised")
            return
        self.tag += 1
        self.answer = (method.delivery_tag, txn_id, action, self.tag, time.monotonic())

    def _ack(self, delivery_tag: int) -> None:
        try:
            self.channel.basic_ack(delivery_tag)
        except AMQPError as exc:
            self.record(FAIL, "ack", error=_text(exc))

    def _on_confirm(self, frame) -> None:
        method = frame.method
        if self.answer is None or method.delivery_tag < self.answer[3]:
            return
        check_tag, txn_id, action, _, _ = self.answer
        self.answer = None
        if isinstance(method, pika.spec.Basic.Ack):
            self.record(OK, "decide", txn=txn_id, action=action, by="responder")
        else:
            self.record(FAIL, "decide", txn=txn_id, action=action, by="responder", error="nack")
        self._ack(check_tag)  # the broker checks again later if the answer did not take

    def on_lost(self, why: str) -> None:
        if self.answer is None:
            return
        _, txn_id, action, _, _ = self.answer
        self.answer = None
        refused = channel_error(self.close_reason)
        if refused is not None:
            self.record(FAIL, "decide", txn=txn_id, action=action, by="responder", error=f"{refused[0]} {refused[1]}")
            self.w.book.settle(txn_id)
        else:
            self.record(INFO, "decide", txn=txn_id, action=action, by="responder", error=why)
