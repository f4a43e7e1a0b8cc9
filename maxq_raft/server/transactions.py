"""Transactional (half) messages, the shell's side (issue #21; the machines: machines/transactions.py,
machines/txn_decisions.py; names and semantics: docs/queue-features.md).

Theory of operation:
- a publish with an `x-transaction-id` header is a half message: `half_fields` reads and checks
  its transaction fields (406 on bad ones, or on an id already decided), and the session puts
  them in the Enqueue beside the message (`Enqueue.txn`); its confirm means the queues hold it;
- a publish to the reserved exchange `amq.maxq.transaction` (no exchange object: the session
  hands it here before routing, and `amq.` names cannot be declared) with the transaction id as
  routing key and `x-transaction-action: commit|rollback` decides it (`decide_publish`; an id
  this member does not know is looked up again after a Sync through every shard group, since
  the member may not have applied the halves yet): the
  decision is recorded in the metadata group first (`DecideTxn`, the first one stands), then
  `resolve` submits a `ResolveTxn` to every queue this node sees holding halves of it; the
  publisher's confirm waits for both. A member holding no replica of some shard groups sees
  none of their queues: it asks each such group which of its queues hold halves (`TxnHolders`,
  once every member knows it: feature flag txn_holders), and those count for the 404 and are
  resolved too. Unknown id: 404; a decision contrary to the one that
  stands: 406; the same decision again: confirmed (answering a check-back twice is harmless);
- `perform_effect` takes the queue machines' `TxnCheck` (publish a check message to the first
  half's reply_to queue) and `TxnTimedOut` (record "expire", then resolve), on the leader of the
  queue's shard only; of several queues holding one transaction, only the first (by name) sends
  checks, so a producer gets one check per attempt (a leader holding no replica of some groups
  asks them first, TxnHolders: their leaders see none of its queues, nor it theirs);
- `resolve_decided` runs in the ticker of each shard leader: a queue still holding halves of a
  decided transaction (its ResolveTxn was lost with a crashed node, or its shard applied the
  halves after the decision was made elsewhere) is resolved again. That is what makes a
  decision, once confirmed, reach every queue whatever fails in between.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from ..amqp import spec
from ..amqp.properties import BasicProperties, decode_properties, encode_properties
from ..machines import commands as qc
from ..machines.features import TXN_HOLDERS
from ..machines.message import Message
from ..machines.queue_types import Rejected
from ..machines.shard import ALL_QUEUES
from ..machines.transactions import (
    TXN_ACTION_HEADER,
    TXN_ATTEMPT_HEADER,
    TXN_CHECK_TYPE,
    TXN_CHECKS_DEFAULT,
    TXN_CHECKS_HEADER,
    TXN_EXCHANGE,
    TXN_ID_HEADER,
    TXN_QUEUE_HEADER,
    TXN_TIMEOUT_HEADER,
    TXN_TIMEOUT_MS_DEFAULT,
    TxnCheck,
    TxnTimedOut,
    txn_error,
)
from ..machines.txn_decisions import DecideTxn
from .errors import ChannelError

log = logging.getLogger("maxq.transactions")

__all__ = ["TXN_EXCHANGE", "decide_publish", "half_fields", "note_half", "perform_effect", "resolve_decided"]

HEADERS_FLAG = 1 << 13
TXN_ID_BYTES = TXN_ID_HEADER.encode()
RESOLVES_PER_TICK_MAX = 1024  # ResolveTxn commands the ticker submits per turn at most
SESSION_TXN_IDS_MAX = 10_000  # ids a connection remembers having published halves for
SYNC_TARGET = ("", "")  # a Sync names no queue: its group is given

_PAST = {"commit": "committed", "rollback": "rolled back", "expire": "rolled back (no answer to its checks)"}


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def half_fields(flags: int, props_raw: bytes, broker: Any, vhost: str) -> tuple[str, int, int] | None:
    """(transaction id, timeout ms, checks max) of a half publish, or None: not one. A byte
    search first, so other publishes decode nothing more. ChannelError 406 for bad fields."""
    if not flags & HEADERS_FLAG or TXN_ID_BYTES not in props_raw:
        return None
    headers = decode_properties(props_raw).headers
    if not isinstance(headers, dict) or TXN_ID_HEADER not in headers:
        return None
    txn_id = _text(headers[TXN_ID_HEADER])
    timeout_ms = headers.get(TXN_TIMEOUT_HEADER, TXN_TIMEOUT_MS_DEFAULT)
    checks = headers.get(TXN_CHECKS_HEADER, TXN_CHECKS_DEFAULT)
    why = txn_error(txn_id, timeout_ms, checks)
    if why is not None:
        raise ChannelError(spec.PRECONDITION_FAILED, f"PRECONDITION_FAILED - {why}")
    standing = broker.meta.txn_decisions.get(vhost, txn_id)
    if standing is not None:
        raise ChannelError(
            spec.PRECONDITION_FAILED, f"PRECONDITION_FAILED - transaction '{txn_id}' was already {_PAST[standing]}"
        )
    return txn_id, timeout_ms, checks  # type: ignore[return-value]  # (txn_error checked the types)


def note_half(session: Any, txn_id: str) -> None:
    """The connection published a half of `txn_id` (its decision may come before this node
    has applied it: the id is known all the same)."""
    seen = session.txn_ids
    if len(seen) >= SESSION_TXN_IDS_MAX:
        del seen[next(iter(seen))]
    seen[txn_id] = None


def holders(broker: Any, vhost: str, txn_id: str) -> list[tuple[str, str]]:
    """The queues of `vhost` this node sees holding halves of `txn_id`, by name."""
    return sorted(key for key, queue in list(broker.queues.items()) if key[0] == vhost and txn_id in queue.txns)


def decide_publish(session: Any, channel: Any, seq: int | None, method: Any, props_raw: bytes) -> None:
    """A publish to `amq.maxq.transaction`: record the decision, then resolve the queues; the
    confirm (if the channel is in confirm mode) once both are done."""
    txn_id = method.routing_key
    flags = (props_raw[0] << 8 | props_raw[1]) if len(props_raw) >= 2 else 0
    headers = decode_properties(props_raw).headers if flags & HEADERS_FLAG else None
    action = _text(headers.get(TXN_ACTION_HEADER)) if isinstance(headers, dict) else None
    if action not in ("commit", "rollback"):
        raise ChannelError(
            spec.PRECONDITION_FAILED,
            f"PRECONDITION_FAILED - a publish to amq.maxq.transaction needs a {TXN_ACTION_HEADER} "
            f"header of 'commit' or 'rollback', not {action!r}"[:250],
        )
    if not txn_id:
        raise ChannelError(spec.PRECONDITION_FAILED, "PRECONDITION_FAILED - the routing key must be the transaction id")
    # Halves published earlier in this read must reach their queues before the decision does.
    # (Only then: inside tx.commit a flush here would hide those queues from its own wait.)
    if session.pending_txn:
        session.flush_publishes()
    broker = session.broker
    vhost = session.vhost
    log_ = broker.log
    known = _known(session, broker, vhost, txn_id)
    # The groups this member holds no replica of are asked which of their queues hold halves
    # (TxnHolders): it sees none of those queues, and the confirm waits for them to be resolved.
    elsewhere = groups_held_elsewhere(broker)
    if known and not elsewhere:
        _record(session, channel, seq, broker, vhost, txn_id, action, [])
        return
    if log_.synchronous:  # a single node has applied everything: unknown it is
        raise ChannelError(spec.NOT_FOUND, f"NOT_FOUND - no transaction '{txn_id}' in vhost '{vhost}'")
    # A cluster member may be a few entries behind the halves' groups (they were confirmed by a
    # majority, perhaps not yet applied here): a Sync through every shard group it holds is
    # applied here after everything committed before it, so looking again then is looking at the
    # halves. (Only when it found none yet.)
    synced_here = [] if known else [group for group in log_.shards if group not in elsewhere]
    found: list[tuple[str, str]] = []
    left: dict[str, Any] = {"groups": len(synced_here) + len(elsewhere), "failure": None}

    def looked_again(_reply: Any) -> None:
        if not found and not _known(session, broker, vhost, txn_id):
            raise ChannelError(spec.NOT_FOUND, f"NOT_FOUND - no transaction '{txn_id}' in vhost '{vhost}'")
        _record(session, channel, seq, broker, vhost, txn_id, action, found)

    resume = channel._then(looked_again)

    def answered(reply: Any) -> None:
        if type(reply) is list:  # (a TxnHolders' names)
            found.extend((vhost, name) for name in reply if type(name) is str)
        elif type(reply) is not type(None) and left["failure"] is None:
            left["failure"] = reply  # (Unavailable: the continuation closes the connection)
        left["groups"] -= 1
        if left["groups"] == 0:
            resume(left["failure"])

    for group in synced_here:
        log_.submit(SYNC_TARGET, qc.Sync(), answered, group=group)
    for group in elsewhere:
        log_.submit(ALL_QUEUES, qc.TxnHolders(vhost, txn_id), answered, group=group)


def _known(session: Any, broker: Any, vhost: str, txn_id: str) -> bool:
    """Decided already, published halves of on this connection, or held by a queue here."""
    return (
        broker.meta.txn_decisions.get(vhost, txn_id) is not None
        or txn_id in session.txn_ids
        or bool(holders(broker, vhost, txn_id))
    )


def _record(
    session: Any,
    channel: Any,
    seq: int | None,
    broker: Any,
    vhost: str,
    txn_id: str,
    action: str,
    elsewhere: list[tuple[str, str]],
) -> None:
    """Record the decision in the metadata group, then resolve the queues (those seen here, and
    `elsewhere`: those of groups held elsewhere that said they hold halves); the confirm after both."""

    def decided(reply: Any) -> None:
        if type(reply) is Rejected:
            raise ChannelError(reply.reply_code, reply.reply_text)
        if reply != action and not (action == "rollback" and reply == "expire"):
            raise ChannelError(
                spec.PRECONDITION_FAILED, f"PRECONDITION_FAILED - transaction '{txn_id}' was already {_PAST[reply]}"
            )
        entries = resolve(broker, vhost, txn_id, reply, elsewhere)
        if seq is not None:
            session.pending_confirms.setdefault(channel, []).append(seq)
            session.pending_entries.extend(entries)  # (the confirm waits for the resolves too)

    broker.meta_call(DecideTxn(vhost, txn_id, action), channel._then(decided))


def resolve(broker: Any, vhost: str, txn_id: str, action: str, elsewhere: Iterable[tuple[str, str]] = ()) -> list:
    """Submit the decision to every queue this node sees holding halves of it, and to those of
    `elsewhere` (queues of groups held elsewhere that hold some); their entries."""
    keys = sorted(set(holders(broker, vhost, txn_id)).union(elsewhere))
    return [broker.log.submit(key, qc.ResolveTxn(txn_id, action), None) for key in keys]


def resolve_decided(broker: Any, led: Any, in_flight: dict, keys: Iterable[tuple[str, str]] | None = None) -> None:
    """The ticker of a shard leader: resolve again the queues of shards in `led` that still hold
    halves of a decided transaction (at most RESOLVES_PER_TICK_MAX per turn, one in flight per
    queue and transaction). `keys`: the queues to look at (the ticker's: those holding halves,
    queue_timers.py), every queue when None."""
    decisions = broker.meta.txn_decisions
    log_ = broker.log
    budget = RESOLVES_PER_TICK_MAX
    queues = broker.queues
    for key in list(queues) if keys is None else keys:
        queue = queues.get(key)
        if queue is None or not queue.txns or log_.group_of(key) not in led:
            continue
        for txn_id in list(queue.txns):
            action = decisions.get(key[0], txn_id)
            if action is None or (key, txn_id) in in_flight:
                continue
            in_flight[(key, txn_id)] = None
            log_.submit(key, qc.ResolveTxn(txn_id, action), lambda _r, k=(key, txn_id): in_flight.pop(k, None))
            budget -= 1
            if budget <= 0:
                return


def perform_effect(broker: Any, effect: Any) -> bool:
    """Perform a transaction effect of a queue machine; False if `effect` is not one."""
    kind = type(effect)
    if kind is TxnCheck:
        key = (effect.vhost, effect.queue)
        if broker.log.leads_queue(key):
            found = holders(broker, effect.vhost, effect.txn_id)
            if not found or found[0] == key:  # one check per attempt, from the first holder
                _check_if_first(broker, effect, key, groups_held_elsewhere(broker))
        return True
    if kind is TxnTimedOut:
        key = (effect.vhost, effect.queue)
        if broker.log.leads_queue(key):
            vhost, txn_id = effect.vhost, effect.txn_id

            def recorded(reply: Any) -> None:
                if type(reply) is str:
                    log.info("transaction '%s' in vhost '%s': no answer to its checks, %s", txn_id, vhost, reply)
                    resolve(broker, vhost, txn_id, reply)

            broker.meta_call(DecideTxn(vhost, txn_id, "expire"), recorded)
        return True
    return False


def groups_held_elsewhere(broker: Any) -> list[str]:
    """The shard groups this member holds no replica of, once every member can say which of
    their queues hold halves (TxnHolders); none on a single node or with every group here."""
    log_ = broker.log
    if log_.synchronous or not broker.meta.feature_enabled(TXN_HOLDERS):
        return []
    return [group for group in log_.shards if not log_.holds(group)]


def _check_if_first(broker: Any, effect: TxnCheck, key: tuple[str, str], elsewhere: list[str]) -> None:
    """Send the check if no queue of the groups `elsewhere` holding halves comes before `key`:
    their leaders may not see this member's queues either, and each would take its own for the
    first (two checks per attempt). A group that cannot answer does not hold the check back: a
    second check is harmless, none would expire the transaction unasked."""
    if not elsewhere:
        _send_check(broker, effect)
        return
    left = {"groups": len(elsewhere), "before": False}

    def answered(reply: Any) -> None:
        if type(reply) is list and any(type(n) is str and (effect.vhost, n) < key for n in reply):
            left["before"] = True
        left["groups"] -= 1
        if left["groups"] == 0 and not left["before"]:
            _send_check(broker, effect)

    for group in elsewhere:
        broker.log.submit(ALL_QUEUES, qc.TxnHolders(effect.vhost, effect.txn_id), answered, group=group)


def _send_check(broker: Any, effect: TxnCheck) -> None:
    """Publish check `effect.attempt` to the reply_to queue of the transaction's first half."""
    try:
        first = decode_properties(effect.props_raw)
    except Exception:  # (publishes are refused unless their properties decode; a backstop)
        first = BasicProperties()
    reply_to = first.reply_to
    if not reply_to or broker.meta.queue(effect.vhost, reply_to) is None:
        log.debug("transaction '%s': no reply_to queue for its check %d", effect.txn_id, effect.attempt)
        return
    props = BasicProperties(
        headers={TXN_ID_HEADER: effect.txn_id, TXN_ATTEMPT_HEADER: effect.attempt, TXN_QUEUE_HEADER: effect.queue},
        correlation_id=first.correlation_id,
        message_id=first.message_id,
        type=TXN_CHECK_TYPE,
        delivery_mode=2,
    )
    message = Message("", reply_to, encode_properties(props), effect.txn_id.encode(), True)
    broker.log.submit((effect.vhost, reply_to), qc.Enqueue([message]), None)
