"""Durable topology: the metadata commands that touch durable entities, as a log plus a snapshot.

Theory of operation: the metadata machine is already a function of its commands, so durability
is a log of them. After a command succeeds, `MetadataLog.record` keeps it if it concerns something
that must survive a restart (a durable exchange, a durable non-exclusive queue, a binding between
two durable ends, or a delete) and fsyncs it before the client gets its `-ok`. At start the
snapshot and the log are replayed through a fresh machine, which redoes the cascades (auto-delete,
bindings of deleted queues) exactly as they happened; what is not durable is then dropped, as
RabbitMQ drops transient queues and exchanges on restart. A new snapshot (the declares and binds
that recreate the durable state) then replaces the log, and so does one every
`LOG_ENTRIES_MAX` commands, so start-up reads a bounded amount.

An index is taken only once its entry is encoded and handed to the store (which keeps it for
redo if it cannot write it now: storage/guarded.py), so a value that cannot be encoded changes
nothing; `unstorable` refuses such a command before it is applied or proposed at all.

Queue ids (the store's key prefix) are chosen by the broker and logged with the queue's declare.
Command arguments (AMQP field tables) are stored in AMQP's own table encoding, so every value type
(decimals, timestamps, nested tables) round-trips exactly.
"""

from __future__ import annotations

import logging
from typing import Any

import msgpack

from ..amqp.values import decode_table, encode_table
from ..machines import metadata as md
from ..machines.queue_types import Rejected

log = logging.getLogger("maxq.persistence")

LOG_ENTRIES_MAX = 1000
SNAPSHOT_KEY = "metadata/snapshot"
LOG_FIRST_KEY = "metadata/log-first"
LOG_NEXT_KEY = "metadata/log-next"
NEXT_QUEUE_ID_KEY = "metadata/next-queue-id"
EPOCH_KEY = "node/epoch"

COMMAND_TYPES = {
    cls.__name__: cls
    for cls in (
        md.DeclareExchange,
        md.DeleteExchange,
        md.DeclareQueue,
        md.DeleteQueueRecord,
        md.SetQueueArguments,
        md.Bind,
        md.Unbind,
        md.SetPolicy,
        md.SetOperatorPolicy,
        md.ClearOperatorPolicy,
        md.ClearPolicy,
        *md.ACCESS_COMMANDS,
    )
}


class MetadataCorruption(Exception):
    pass


def encode_entry(command, queue_id: int | None) -> bytes:
    fields = [{"t": encode_table(v)} if isinstance(v, dict) else v for v in command]
    return msgpack.packb([type(command).__name__, fields, queue_id], use_bin_type=True)


def unstorable(command) -> Rejected | None:
    """A refusal (406, as RabbitMQ's validation errors) for a metadata command that holds a value
    no log can encode (an integer beyond 64 bits, a lone surrogate in a string, ...), else None.
    Checked before a command is applied or proposed: once applied, it would have to be logged."""
    if type(command).__name__ not in COMMAND_TYPES:
        return None  # not a command any log keeps (OwnerDown carries only a connection id)
    try:
        encode_entry(command, None)
    except Exception as exc:  # msgpack's OverflowError/TypeError, UnicodeEncodeError, AMQP table errors
        return Rejected(406, f"Validation failed\n\na value of {type(command).__name__} cannot be stored: {exc}"[:250])
    return None


def decode_entry(raw: bytes):
    try:
        name, fields, queue_id = msgpack.unpackb(raw, raw=False)
        values: list[Any] = [decode_table(f["t"], 0)[0] if isinstance(f, dict) else f for f in fields]
        return COMMAND_TYPES[name](*values), queue_id
    except Exception as exc:
        raise MetadataCorruption(f"undecodable metadata entry: {exc!r}") from None


def _int(raw: bytes | None, default: int) -> int:
    return default if raw is None else int.from_bytes(raw, "big")


class MetadataLog:
    def __init__(self, store) -> None:
        self.store = store
        self.first = _int(store.get_meta(LOG_FIRST_KEY), 0)
        self.next = _int(store.get_meta(LOG_NEXT_KEY), 0)

    def entries(self) -> list[tuple]:
        """The snapshot's entries, then the log's, in order."""
        out: list[tuple] = []
        snapshot = self.store.get_meta(SNAPSHOT_KEY)
        if snapshot is not None:
            try:
                raw_entries = msgpack.unpackb(snapshot, raw=False)
            except Exception as exc:
                raise MetadataCorruption(f"undecodable metadata snapshot in {self.store.path}: {exc!r}") from None
            out.extend(decode_entry(raw) for raw in raw_entries)
        for index in range(self.first, self.next):
            raw = self.store.get_meta(f"metadata/log/{index:020d}")
            if raw is None:
                raise MetadataCorruption(f"metadata log entry {index} missing in {self.store.path}")
            out.append(decode_entry(raw))
        return out

    def append(self, command, queue_id: int | None = None) -> None:
        """Log one command, fsynced; StoreFailed if the store cannot write now (the entry is
        kept for redo, so the index stays taken: no hole either way)."""
        entry = encode_entry(command, queue_id)  # before anything changes: may raise
        index = self.next
        self.store.write(
            (), (), {f"metadata/log/{index:020d}": entry, LOG_NEXT_KEY: (index + 1).to_bytes(8, "big")}, wal=True
        )
        self.next = index + 1
        if self.next - self.first > LOG_ENTRIES_MAX:
            self.needs_snapshot = True
        self.store.sync_wal()

    needs_snapshot = False

    def write_snapshot(self, entries: list[bytes]) -> None:
        """Replace snapshot and log by `entries` in one atomic batch."""
        meta = {
            SNAPSHOT_KEY: msgpack.packb(entries, use_bin_type=True),
            LOG_FIRST_KEY: self.next.to_bytes(8, "big"),
            LOG_NEXT_KEY: self.next.to_bytes(8, "big"),
        }
        for index in range(self.first, self.next):
            meta[f"metadata/log/{index:020d}"] = None
        self.store.write((), (), meta, wal=True)
        self.first = self.next
        self.needs_snapshot = False
        self.store.sync_wal()


def durable_queue(machine: md.MetadataMachine, vhost: str, name: str) -> bool:
    record = machine.queue(vhost, name)
    return record is not None and record.durable and record.exclusive_owner is None


def durable_exchange(machine: md.MetadataMachine, vhost: str, name: str) -> bool:
    record = machine.exchange(vhost, name)
    return record is not None and record.durable


def concerns_durable(machine: md.MetadataMachine, command, before: bool) -> bool:
    """Whether `command` (just applied, or about to be when `before`) touches durable state."""
    kind = type(command)
    if kind is md.DeclareExchange:
        return not command.passive and command.durable and not before
    if kind is md.DeclareQueue:
        return not command.passive and command.durable and not command.exclusive and not before
    if kind is md.DeleteExchange:
        return before and durable_exchange(machine, command.vhost, command.name)
    if kind is md.DeleteQueueRecord:
        return before and durable_queue(machine, command.vhost, command.name)
    if kind is md.SetQueueArguments:
        return durable_queue(machine, command.vhost, command.name)
    if kind is md.Bind or kind is md.Unbind:
        source_durable = durable_exchange(machine, command.vhost, command.source)
        dest_durable = (
            durable_exchange(machine, command.vhost, command.destination)
            if command.to_exchange
            else durable_queue(machine, command.vhost, command.destination)
        )
        return source_durable and dest_durable
    # policies (RabbitMQ's runtime parameters), users, vhosts and permissions are always durable
    return (
        kind in (md.SetPolicy, md.ClearPolicy, md.SetOperatorPolicy, md.ClearOperatorPolicy)
        or kind in md.ACCESS_COMMANDS
    )


def snapshot_entries(machine: md.MetadataMachine, queue_ids: dict) -> list[bytes]:
    """Declares and binds that recreate the durable part of `machine`."""
    entries = [encode_entry(command, None) for command in access_commands(machine)]
    for vhost_name, vhost in machine.vhosts.items():
        for ex in vhost.exchanges.values():
            if ex.durable and not ex.builtin:
                entries.append(
                    encode_entry(
                        md.DeclareExchange(
                            vhost_name, ex.name, ex.type, False, True, ex.auto_delete, ex.internal, ex.arguments
                        ),
                        None,
                    )
                )
        for q in vhost.queues.values():
            if q.durable and q.exclusive_owner is None:
                entries.append(
                    encode_entry(
                        md.DeclareQueue(vhost_name, q.name, False, True, False, q.auto_delete, q.arguments, ""),
                        queue_ids[(vhost_name, q.name)],
                    )
                )
        for source, kind, dest, key, args in machine.bindings(vhost_name):
            to_exchange = kind == "exchange"
            bind = md.Bind(vhost_name, source, dest, to_exchange, key, args, "")
            if concerns_durable(machine, bind, before=False):
                entries.append(encode_entry(bind, None))
        for policy in vhost.policies.values():
            entries.append(
                encode_entry(
                    md.SetPolicy(
                        vhost_name, policy.name, policy.pattern, policy.definition, policy.priority, policy.apply_to
                    ),
                    None,
                )
            )
        for policy in vhost.operator_policies.values():
            entries.append(
                encode_entry(
                    md.SetOperatorPolicy(
                        vhost_name, policy.name, policy.pattern, policy.definition, policy.priority, policy.apply_to
                    ),
                    None,
                )
            )
    entries.extend(encode_entry(command, None) for command in vhost_limit_commands(machine))
    return entries


def access_commands(machine: md.MetadataMachine) -> list:
    """Commands that recreate the machine's users, vhosts, permissions and limits from a fresh
    machine (which has guest and "/"), in an order that applies: vhosts and users before the
    permissions that name them."""
    names = list(machine.vhosts)
    if names[:1] == [md.DEFAULT_VHOST]:  # as in a fresh machine: the others follow it
        commands: list = [md.PutVhost(name) for name in names[1:]]
    else:  # "/" was deleted (and maybe made again): the vhosts in their order
        commands = [md.DeleteVhost(md.DEFAULT_VHOST), *(md.PutVhost(name) for name in names)]
    if not machine.users_seeded:
        return commands  # users and permissions as in a fresh machine (every change of them seeds)
    if md.GUEST not in machine.users:
        commands.append(md.DeleteUser(md.GUEST))
    for user in machine.users.values():
        commands.append(md.PutUser(user.name, user.password_hash, user.hashing_algorithm, list(user.tags)))
        if user.limits:
            commands.append(md.SetLimits("user", user.name, dict(user.limits)))
    for key in machine.access_keys.values():
        commands.append(md.PutAccessKey(key.key_id, key.user, key.secret))
    guest_default = machine.vhosts.get(md.DEFAULT_VHOST) if names[:1] == [md.DEFAULT_VHOST] else None
    if md.GUEST in machine.users and guest_default and md.GUEST not in guest_default.permissions:
        # (a fresh machine gives guest every permission on "/"; a "/" made again gives none)
        commands.append(md.ClearPermissions(md.DEFAULT_VHOST, md.GUEST))
    for vhost_name, vhost in machine.vhosts.items():
        for user_name, p in vhost.permissions.items():
            commands.append(md.SetPermissions(vhost_name, user_name, p.configure, p.write, p.read))
        for user_name, by_exchange in vhost.topic_permissions.items():
            for exchange, t in by_exchange.items():
                commands.append(md.SetTopicPermissions(vhost_name, user_name, exchange, t.write, t.read))
    return commands


def vhost_limit_commands(machine: md.MetadataMachine) -> list:
    """The vhosts' limits, replayed after their queues: a limit set below the queues a vhost
    already had must not refuse them at the next start."""
    return [md.SetLimits("vhost", name, dict(v.limits)) for name, v in machine.vhosts.items() if v.limits]


class DurableTopology:
    """A single node's record of durable topology: which applied metadata commands go into the
    metadata log (see the module docstring), with the cascades a transient command causes to
    durable auto-delete exchanges. `Applier` calls `before` and `after` around each command."""

    def __init__(self, metadata_log: MetadataLog, queue_ids: dict) -> None:
        self.metadata_log = metadata_log
        self.queue_ids = queue_ids  # (vhost, name) -> store id: logged with a queue's declare
        self.durable_auto_delete: dict[tuple[str, str], None] = {}  # (vhost, name) of such exchanges

    def start(self, machine: md.MetadataMachine) -> None:
        """After a replay: which durable auto-delete exchanges exist."""
        self.durable_auto_delete = {
            (vhost_name, ex.name): None
            for vhost_name, vhost in machine.vhosts.items()
            for ex in vhost.exchanges.values()
            if ex.durable and ex.auto_delete
        }

    def before(self, machine: md.MetadataMachine, command) -> bool:
        """Whether the command is to be logged, as far as the state before it tells."""
        kind = type(command)
        if kind is md.DeclareExchange:
            # Only a new exchange is logged: clients redeclare on every start.
            return machine.exchange(command.vhost, command.name) is None and concerns_durable(
                machine, command, before=False
            )
        if kind is md.DeclareQueue:
            return False  # decided after: only a queue this command created
        return concerns_durable(machine, command, before=True)

    def after(self, machine: md.MetadataMachine, command, effects: list, log_it: bool) -> None:
        """Log the applied (not refused) command if it concerns durable state; StoreFailed if the
        store cannot write now (the entry is kept for redo)."""
        kind = type(command)
        queue_id = None
        if kind is md.DeclareQueue and effects and type(effects[0]) is md.QueueCreated:
            log_it = concerns_durable(machine, command, before=False)
            queue_id = self.queue_ids.get((command.vhost, command.name))
        elif kind is md.Bind or kind is md.Unbind:
            log_it = log_it or concerns_durable(machine, command, before=False)
        if log_it:
            self.metadata_log.append(command, queue_id)
        if kind is md.DeclareExchange:
            if command.durable and command.auto_delete and not command.passive:
                self.durable_auto_delete[(command.vhost, command.name)] = None
        elif self.durable_auto_delete and kind is not md.DeclareQueue and kind is not md.Bind:
            self._log_cascaded_exchange_deletes(machine)
        if self.metadata_log.needs_snapshot:
            self.metadata_log.write_snapshot(snapshot_entries(machine, self.queue_ids))

    def _log_cascaded_exchange_deletes(self, machine: md.MetadataMachine) -> None:
        """Log the durable auto-delete exchanges that a command deleted as a side effect.

        RabbitMQ deletes an auto-delete exchange when its last binding goes, also when that
        binding went because its (transient) queue went. Commands about transient things are not
        logged, so their cascades would not be replayed and the exchange would come back at the
        next start; a DeleteExchange is logged for each instead. Only durable auto-delete
        exchanges can be concerned, so only those (usually none) are looked at.
        """
        for key in list(self.durable_auto_delete):
            record = machine.exchange(*key)
            if record is None or not (record.durable and record.auto_delete):
                del self.durable_auto_delete[key]
                if record is None:
                    self.metadata_log.append(md.DeleteExchange(key[0], key[1], False))
