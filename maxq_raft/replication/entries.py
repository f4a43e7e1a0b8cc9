"""Log entries: the machines' commands as bytes, for a replicated log.

Theory of operation: an entry is a msgpack list `[version, time_ms, [[target, command], ...]]`:
one proposer stamps the time once for the whole batch (the machines take time only from the
entry), and one entry carries many commands (the publishes of every connection of a node for
one shard, say), so Raft sees one entry where AMQP saw hundreds of frames. `target` is "" for
the metadata machine or [vhost, queue] for a queue machine.

Each command is `[type name, *fields]`. Messages (in Enqueue) are
`[exchange, routing_key, props_raw, body, persistent]`; AMQP field tables (arguments) are kept
in AMQP's own table encoding so every value type round-trips exactly. Decoding never trusts
its input: anything malformed raises EntryError, which the applier turns into a skipped entry
instead of a stalled group.
"""

from __future__ import annotations

from typing import Any

import msgpack

from ..amqp.values import decode_table, encode_table
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.queue import Message

ENTRY_VERSION = 1

QUEUE_COMMANDS = {cls.__name__: cls for cls in (qc.Enqueue, qc.Checkout, qc.Cancel, qc.Settle, qc.Requeue, qc.Discard,
                                                qc.Credit, qc.Get, qc.Purge, qc.Down, qc.DeleteQueue)}
METADATA_COMMANDS = {cls.__name__: cls for cls in (md.DeclareExchange, md.DeleteExchange, md.DeclareQueue,
                                                   md.DeleteQueueRecord, md.Bind, md.Unbind, md.OwnerDown)}
_TABLE_TAG = "\x00t"  # a one-key dict marks an encoded field table ("\x00" never starts a field name)


class EntryError(Exception):
    pass


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
        return ["Enqueue", [[m.exchange, m.routing_key, m.props_raw, m.body, m.persistent] for m in command.messages]]
    return [type(command).__name__, *(_field(v) for v in command)]


def decode_command(raw: list, metadata: bool):
    name, *fields = raw
    if name == "Enqueue" and not metadata:
        return qc.Enqueue([Message(e, rk, props, body, persistent) for e, rk, props, body, persistent in fields[0]])
    cls = (METADATA_COMMANDS if metadata else QUEUE_COMMANDS).get(name)
    if cls is None:
        raise EntryError(f"unknown {'metadata' if metadata else 'queue'} command {name!r}")
    return cls(*(_unfield(v) for v in fields))


def encode_entry(time_ms: int, items: list[tuple[tuple[str, str] | None, Any]]) -> bytes:
    """`items`: (queue key, or None for the metadata machine, command) in apply order."""
    body = [["" if target is None else list(target), encode_command(command)] for target, command in items]
    return msgpack.packb([ENTRY_VERSION, time_ms, body], use_bin_type=True)


def decode_entry(payload: bytes) -> tuple[int, list[tuple[tuple[str, str] | None, Any]]]:
    try:
        version, time_ms, body = msgpack.unpackb(payload, raw=False, use_list=True)
        if version != ENTRY_VERSION:
            raise EntryError(f"entry version {version} is not {ENTRY_VERSION}")
        items = []
        for target, command in body:
            metadata = target == ""
            items.append((None if metadata else (target[0], target[1]), decode_command(command, metadata)))
        return time_ms, items
    except EntryError:
        raise
    except Exception as exc:  # msgpack, shape or field errors: all the same to the applier
        raise EntryError(f"malformed log entry: {exc!r}") from None
