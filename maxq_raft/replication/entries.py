"""Log entries: the machines' commands as bytes, for a replicated log.

Theory of operation: an entry is a msgpack list
`[version, time_ms, [[target, command, request], ...], origin, seq]`: one proposer stamps the time
once for the whole batch (the machines take time only from the entry), and one entry carries
many commands (the publishes of every connection of a node for one shard, say), so Raft sees one
entry where AMQP saw hundreds of frames. `target` is "" for the metadata machine, [vhost, queue]
for a queue machine, or "*" for every queue of the shard (a node's consumers going down).
`origin` names the proposing node and `request` (0 for none) one of its waiting callers: every
replica applies the command, only the origin hands the machine's reply to the caller. `seq`
numbers the origin's entries in one group (1, 2, ...), so that replicas apply them in that order
exactly once even when a proposal is repeated after a leader change (server/cluster.py).

Each command is `[type name, *fields]`. Messages (in Enqueue) are
`[exchange, routing_key, props_raw, body, persistent, ttl_ms, priority, delay_ms]`, followed,
when some publishes carry an x-deduplication-header, by `[position, key, TTL ms or None]` for
each of those (with `exchange, cache size, cache TTL ms or None` after them when published to an
x-message-deduplication exchange: dedup.py) or None, then, when some are half messages, by `[position, transaction
id, timeout ms, checks max]` for each (transactions.py); EnqueueFifo
has them and then `[group id, deduplication id or None, message id]` per message; UpdateSettings
carries its `QueueSettings` as a list of its fields; SQS receipt handles (DeleteReceived,
ChangeVisibility) are lists of ints, tuples again once decoded; AMQP field tables (arguments) are kept
in AMQP's own table encoding so every value type round-trips exactly. Decoding never trusts
its input: anything malformed raises EntryError, which the applier turns into a skipped entry
instead of a stalled group; an entry of a newer version (a later entry version, a command kind this
code does not know) raises NewerEntry, which stops the member (server/cluster.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from ..amqp.values import decode_table, encode_table
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.features import EnableFeatures
from ..machines.maintenance import SetMaintenance
from ..machines.message import Message
from ..machines.placement import FirstGroups, PlaceQueue, SetGroups
from ..machines.queue_args import QueueSettings
from ..machines.shard import ALL_QUEUES
from ..machines.txn_decisions import DecideTxn

ENTRY_VERSION = 1

QUEUE_COMMANDS = {
    cls.__name__: cls
    for cls in (
        qc.Enqueue,
        qc.EnqueueFifo,
        qc.Checkout,
        qc.Cancel,
        qc.Settle,
        qc.Requeue,
        qc.Discard,
        qc.Credit,
        qc.Get,
        qc.Purge,
        qc.Down,
        qc.DeleteQueue,
        qc.Create,
        qc.Sync,
        qc.Reply,
        qc.Tick,
        qc.Touch,
        qc.DeadLettered,
        qc.UpdateSettings,
        qc.Receive,
        qc.DeleteReceived,
        qc.ChangeVisibility,
        qc.PauseConsumers,
        qc.ResolveTxn,
        qc.TxnHolders,
    )
}
METADATA_COMMANDS = {
    cls.__name__: cls
    for cls in (
        md.DeclareExchange,
        md.DeleteExchange,
        md.DeclareQueue,
        md.DeleteQueueRecord,
        md.SetQueueArguments,
        md.Bind,
        md.Unbind,
        md.OwnerDown,
        md.SetPolicy,
        md.ClearPolicy,
        md.SetOperatorPolicy,
        md.ClearOperatorPolicy,
        *md.ACCESS_COMMANDS,
        DecideTxn,
        EnableFeatures,
        SetMaintenance,
        SetGroups,
        FirstGroups,
        PlaceQueue,
    )
}
_TABLE_TAG = "\x00t"  # a one-key dict marks an encoded field table ("\x00" never starts a field name)


class EntryError(Exception):
    pass


class NewerEntry(EntryError):
    """An entry this code cannot read because a newer version wrote it: a later entry version,
    or a command kind it does not know. Skipping it (as a malformed entry is skipped, alike on
    every member) would leave this member's machines different from those of the members that
    applied it: the member must stop instead, until it runs the newer code."""


def _field(value: Any) -> Any:
    if isinstance(value, dict):
        return {_TABLE_TAG: encode_table(value)}
    return value


def _unfield(value: Any) -> Any:
    if isinstance(value, dict):
        return decode_table(value[_TABLE_TAG], 0)[0]
    return value


def encode_command(command) -> list:
    if type(command) is qc.Enqueue:
        encoded: list[Any] = [
            "Enqueue",
            [
                [m.exchange, m.routing_key, m.props_raw, m.body, m.persistent, m.ttl_ms, m.priority, m.delay_ms]
                for m in command.messages
            ],
        ]
        if command.dedup is not None or command.txn is not None or command.trace is not None:
            # (without any, as before: a node of an earlier version decodes it)
            encoded.append(None if command.dedup is None else [list(item) for item in command.dedup])
        if command.txn is not None or command.trace is not None:  # half messages (machines/transactions.py)
            encoded.append(None if command.txn is None else [list(item) for item in command.txn])
        if command.trace is not None:
            user, connection, address, publishes = command.trace
            # (each publish [position, channel, confirm mode, routed queues], or a run of them
            # with its first trace number and count appended: commands.py, Enqueue.trace)
            encoded.append([user, connection, address, [[p[0], p[1], p[2], list(p[3]), *p[4:6]] for p in publishes]])
        return encoded
    if type(command) is qc.EnqueueFifo:
        return [
            "EnqueueFifo",
            [
                [m.exchange, m.routing_key, m.props_raw, m.body, m.persistent, m.ttl_ms, m.priority, m.delay_ms]
                for m in command.messages
            ],
            [list(extra) for extra in command.fifo],
        ]
    if type(command) is qc.UpdateSettings:
        return ["UpdateSettings", list(command.settings)]
    if type(command) is qc.Checkout and not command.rate_limit:
        return ["Checkout", *command[:-1]]  # as before rate limits: a node of an earlier version decodes it
    if type(command) is md.DeclareQueue and command.group is None:
        # as before placement (no group): a node of an earlier version decodes it
        return ["DeclareQueue", *(_field(v) for v in command[:-1])]
    if type(command) is qc.Purge and command.in_flight is False:
        return ["Purge"]  # as before SQS's PurgeQueue: a node of an earlier version decodes it
    return [type(command).__name__, *(_field(v) for v in command)]


def decode_command(raw: list, metadata: bool):
    name, *fields = raw
    if name == "Enqueue" and not metadata:
        return qc.Enqueue(
            [
                Message(e, rk, props, body, persistent, ttl_ms, priority, delay_ms)
                for e, rk, props, body, persistent, ttl_ms, priority, delay_ms in fields[0]
            ],
            # (x-deduplication-header ids: tuples again, so a command decodes as it was made)
            [tuple(item) for item in fields[1]]  # (3 fields, or 6 with an exchange window: dedup.py)
            if len(fields) > 1 and fields[1] is not None
            else None,
            [(position, txn_id, timeout_ms, checks) for position, txn_id, timeout_ms, checks in fields[2]]
            if len(fields) > 2 and fields[2] is not None
            else None,
            _decode_trace(fields[3]) if len(fields) > 3 else None,
        )
    if name == "EnqueueFifo" and not metadata:
        return qc.EnqueueFifo(
            [
                Message(e, rk, props, body, persistent, ttl_ms, priority, delay_ms)
                for e, rk, props, body, persistent, ttl_ms, priority, delay_ms in fields[0]
            ],
            [(group_id, dedup_id, message_id) for group_id, dedup_id, message_id in fields[1]],
        )
    if name == "UpdateSettings" and not metadata:
        return qc.UpdateSettings(QueueSettings(*fields[0]))
    # msgpack gives lists: SQS handles are tuples again, so a command decodes as it was made
    if name == "DeleteReceived" and not metadata:
        return qc.DeleteReceived([(seq, receive_id) for seq, receive_id in fields[0]])
    if name == "ChangeVisibility" and not metadata:
        return qc.ChangeVisibility([(seq, receive_id, ms) for seq, receive_id, ms in fields[0]])
    cls = (METADATA_COMMANDS if metadata else QUEUE_COMMANDS).get(name)
    if cls is None:
        if type(name) is str and name.isidentifier():  # a name, not garbage: a newer version's command
            raise NewerEntry(f"unknown {'metadata' if metadata else 'queue'} command {name!r}")
        raise EntryError(f"unknown {'metadata' if metadata else 'queue'} command {name!r}")
    return cls(*(_unfield(v) for v in fields))


def _decode_trace(raw: list) -> tuple[str, str, str, list[tuple]]:
    """An Enqueue's publisher context (x-trace), tuples again, so it decodes as it was made."""
    user, connection, address, publishes = raw
    return (user, connection, address, [(p[0], p[1], p[2], list(p[3]), *p[4:6]) for p in publishes])


class Entry(NamedTuple):
    time_ms: int
    origin: str
    items: list  # of (target, command, request): target None (metadata), (vhost, name) or ALL_QUEUES
    seq: int = 0  # the origin's sequence number of this entry in its group (0: none)


def encode_entry(time_ms: int, items: list, origin: str = "", seq: int = 0) -> bytes:
    """`items`: (target, command) or (target, command, request) in apply order; target None is
    the metadata machine."""
    body = []
    for item in items:
        target = item[0]
        body.append(
            [
                "" if target is None else target if target == ALL_QUEUES else list(target),
                encode_command(item[1]),
                item[2] if len(item) > 2 else 0,
            ]
        )
    return msgpack.packb([ENTRY_VERSION, time_ms, body, origin, seq], use_bin_type=True)


def decode_entry(payload: bytes) -> Entry:
    try:
        version, time_ms, body, origin, seq = msgpack.unpackb(payload, raw=False, use_list=True)
        if version != ENTRY_VERSION:
            if type(version) is int and version > ENTRY_VERSION:
                raise NewerEntry(f"entry version {version}, this code reads version {ENTRY_VERSION}")
            raise EntryError(f"entry version {version} is not {ENTRY_VERSION}")
        if type(time_ms) is not int or type(origin) is not str or type(seq) is not int:
            raise EntryError("malformed log entry header")
        items = []
        for target, command, request in body:
            metadata = target == ""
            if type(request) is not int:
                raise EntryError("malformed request id")
            if metadata:
                key = None
            elif target == ALL_QUEUES:
                key = ALL_QUEUES
            else:
                key = (target[0], target[1])
                if type(key[0]) is not str or type(key[1]) is not str:
                    raise EntryError("malformed queue target")
            items.append((key, decode_command(command, metadata), request))
        return Entry(time_ms, origin, items, seq)
    except EntryError:
        raise
    except Exception as exc:  # msgpack, shape or field errors: all the same to the applier
        raise EntryError(f"malformed log entry: {exc!r}") from None
