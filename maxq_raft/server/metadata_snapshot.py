"""Snapshot and restore of the whole metadata machine (the cluster's meta group) as plain records.

Theory of operation: `persistence.snapshot_entries` recreates the *durable* topology of a single
node, which is right for a restart (RabbitMQ drops transient entities) but not for a Raft group,
where every entity is replicated: exclusive queues with their owners, transient and auto-delete
queues and exchanges, bindings with a transient end, policies. `dump_metadata(machine)` yields
all of it as records of plain data (msgpack-able; AMQP field tables kept in AMQP's own table
encoding, as persistence.py and replication/entries.py do, so decimals, timestamps and nested
tables round-trip exactly); `load_metadata(records)` builds the machine state directly, not by
replaying declares, so that the order of every dict and binding list (route results follow
binding order, auto-delete cascades follow the reverse index) is the original's.

Records: `["metadata", {"version", "users", "users_seeded", "access_version", "access_keys",
"txn_decisions", "features_enabled", "draining", "shard_groups", "queue_places"}]`
(users as `[name, password_hash, hashing_algorithm, tags, limits]`, access keys as `[key_id,
user, secret]`, shard groups as `[[group, [member, ...]], ...]`, placements of queues not declared
yet as `[[vhost, queue, group], ...]`; a header without "access_keys", "features_enabled",
"draining", "shard_groups" or "queue_places", written before they existed, has none); per vhost `["vhost", name]`, then
`["exchange", vhost, name, type, durable, auto_delete, internal, arguments, builtin, routing_type]`
in the vhost's order, `["bindings", vhost, source, [[destination, key, arguments], ...]]` in
each router's order (chunks of at most CHUNK_BINDINGS_MAX), `["queue", vhost, name, durable,
exclusive_owner, auto_delete, arguments, group]` (group None when not placed; a record written
before placement has no group field), `["bindings_to", vhost, destination, [[source, key,
arguments], ...]]` (the reverse index, in its order), `["policy", vhost, name, pattern,
definition, priority, apply_to]` (an operator policy's alike, `["operator_policy", ...]`), `["access", vhost, [[user, configure, write, read], ...],
[[user, exchange, write, read], ...], limits]`; last `["end", counts]`, checked by the loader.
Version 1 (before users had hashes and permissions) is read too: its plain passwords are hashed
as a fresh machine hashes guest's, and guest gets every permission on "/" as it had.

Not here: the node-local queue ids (the store's key prefix, given by each member as it creates the machine).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from ..amqp.values import decode_table, encode_table
from ..machines import access
from ..machines import metadata as md
from ..machines.placement import groups_refusal
from ..machines.policy_pattern import PatternError, compile_pattern
from ..machines.routing import make_router
from ..machines.snapshot import SnapshotError

log = logging.getLogger("maxq.metadata")

# Version 3 added `txn_decisions` to the header (machines/txn_decisions.py); older ones have none.
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
CHUNK_BINDINGS_MAX = 1024


def _table(value: dict) -> bytes:
    return encode_table(value)


def _untable(raw: bytes) -> dict:
    return decode_table(raw, 0)[0]


def dump_metadata(machine: md.MetadataMachine) -> Iterator[list]:
    """Every vhost, exchange, binding, queue and policy of `machine`, in its own order."""
    users = [
        [u.name, u.password_hash, u.hashing_algorithm, list(u.tags), dict(u.limits)] for u in machine.users.values()
    ]
    header = {
        "version": FORMAT_VERSION,
        "users": users,
        "users_seeded": machine.users_seeded,
        "access_version": machine.access_version,
        "access_keys": [[k.key_id, k.user, k.secret] for k in machine.access_keys.values()],
        "txn_decisions": machine.txn_decisions.dump(),
        "features_enabled": list(machine.features_enabled),
        "draining": list(machine.draining),
        "shard_groups": [[group, list(members)] for group, members in machine.shard_groups.items()],
        "queue_places": [[vhost, name, group] for (vhost, name), group in machine.queue_places.items()],
    }
    yield ["metadata", header]
    counts: dict[str, int] = {}

    def count(kind: str, n: int = 1) -> None:
        counts[kind] = counts.get(kind, 0) + n

    for vhost_name, vhost in machine.vhosts.items():
        yield ["vhost", vhost_name]
        count("vhost")
        for ex in vhost.exchanges.values():
            yield [
                "exchange",
                vhost_name,
                ex.name,
                ex.type,
                ex.durable,
                ex.auto_delete,
                ex.internal,
                _table(ex.arguments),
                ex.builtin,
                ex.routing_type,
            ]
            count("exchange")
            bindings = ex.router.bindings()
            for start in range(0, len(bindings), CHUNK_BINDINGS_MAX):
                chunk = [[dest, key, _table(args)] for dest, key, args in bindings[start : start + CHUNK_BINDINGS_MAX]]
                yield ["bindings", vhost_name, ex.name, chunk]
                count("bindings", len(chunk))
        for q in vhost.queues.values():
            yield [
                "queue",
                vhost_name,
                q.name,
                q.durable,
                q.exclusive_owner,
                q.auto_delete,
                _table(q.arguments),
                q.group,
            ]
            count("queue")
        for dest, entries in vhost.bindings_to.items():
            for start in range(0, len(entries), CHUNK_BINDINGS_MAX):
                chunk = [
                    [source, key, _table(args)] for source, key, args in entries[start : start + CHUNK_BINDINGS_MAX]
                ]
                yield ["bindings_to", vhost_name, dest, chunk]
                count("bindings_to", len(chunk))
        for p in vhost.policies.values():
            yield ["policy", vhost_name, p.name, p.pattern, _table(p.definition), p.priority, p.apply_to]
            count("policy")
        for p in vhost.operator_policies.values():
            yield ["operator_policy", vhost_name, p.name, p.pattern, _table(p.definition), p.priority, p.apply_to]
            count("operator_policy")
        permissions = [[user, p.configure, p.write, p.read] for user, p in vhost.permissions.items()]
        topics = [
            [user, exchange, t.write, t.read]
            for user, by_exchange in vhost.topic_permissions.items()
            for exchange, t in by_exchange.items()
        ]
        yield ["access", vhost_name, permissions, topics, dict(vhost.limits)]
        count("access")
    yield ["end", counts]


def load_metadata(records: Iterable) -> md.MetadataMachine:
    """A metadata machine rebuilt from `dump_metadata`'s records (SnapshotError if it cannot be)."""
    it = iter(records)
    first = next(it, None)
    if type(first) is not list or len(first) != 2 or first[0] != "metadata" or type(first[1]) is not dict:
        raise SnapshotError(f"metadata snapshot: the first record is not a header: {str(first)[:80]}")
    version = first[1].get("version")
    if version not in READABLE_VERSIONS:
        raise SnapshotError(
            f"metadata snapshot: unknown format version {version!r} (this code reads version {FORMAT_VERSION})"
        )
    machine = md.MetadataMachine()
    machine.vhosts = {}  # rebuilt from the records, builtin exchanges included, in their order
    header = first[1]
    if version == 1:  # {name: plain password}
        machine.users = {
            name: access.UserRecord(name, access.hash_password(password, salt=bytes(access.SALT_BYTES)))
            for name, password in header["users"].items()
        }
        if md.GUEST in machine.users:
            machine.users[md.GUEST].tags = ["administrator"]
    else:
        machine.users = {
            name: access.UserRecord(name, password_hash, algorithm, list(tags), dict(limits))
            for name, password_hash, algorithm, tags, limits in header["users"]
        }
        machine.users_seeded = bool(header["users_seeded"])
        machine.access_version = int(header["access_version"])
        machine.access_keys = {
            key_id: access.AccessKeyRecord(key_id, user, secret)
            for key_id, user, secret in header.get("access_keys", [])
        }
        features = header.get("features_enabled", [])
        if type(features) is not list or not all(type(name) is str for name in features):
            raise SnapshotError(f"metadata snapshot: malformed enabled features: {features!r}"[:200])
        machine.features_enabled = list(features)
        draining = header.get("draining", [])
        if type(draining) is not list or not all(type(name) is str for name in draining):
            raise SnapshotError(f"metadata snapshot: malformed members under maintenance: {draining!r}"[:200])
        machine.draining = list(draining)
        shard_groups = header.get("shard_groups", [])
        if groups_refusal(shard_groups, {}) is not None and shard_groups != []:
            raise SnapshotError(f"metadata snapshot: malformed shard groups: {shard_groups!r}"[:200])
        machine.shard_groups = {group: list(members) for group, members in shard_groups}
        places = header.get("queue_places", [])
        if type(places) is not list or not all(
            type(place) is list and len(place) == 3 and all(type(field) is str for field in place) for place in places
        ):
            raise SnapshotError(f"metadata snapshot: malformed queue placements: {places!r}"[:200])
        machine.queue_places = {(vhost, name): group for vhost, name, group in places}
        if "txn_decisions" in header:
            try:
                machine.txn_decisions.load(header["txn_decisions"])
            except (KeyError, TypeError, ValueError) as exc:
                raise SnapshotError(f"metadata snapshot: malformed transaction decisions: {exc!r}") from None
    counts: dict[str, int] = {}
    ended = None
    for record in it:  # bounded by the records given
        if ended is not None:
            raise SnapshotError("metadata snapshot: records after the end record")
        try:
            kind = record[0]
            if kind == "end":
                ended = record[1]
                continue
            counts[kind] = counts.get(kind, 0) + (len(record[3]) if kind in ("bindings", "bindings_to") else 1)
            _load_record(machine, kind, record)
        except SnapshotError:
            raise
        except (IndexError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"metadata snapshot: malformed record {str(record)[:80]}: {exc!r}") from None
    if ended is None:
        raise SnapshotError("metadata snapshot: truncated: no end record")
    if ended != counts:
        raise SnapshotError(f"metadata snapshot: counts differ from the end record: {counts} != {ended}")
    if version == 1 and md.GUEST in machine.users and md.DEFAULT_VHOST in machine.vhosts:
        machine.vhosts[md.DEFAULT_VHOST].permissions[md.GUEST] = access.Permission(*md.FULL_PERMISSION)
    return machine


def _load_record(machine: md.MetadataMachine, kind: str, record: list) -> None:
    if kind == "vhost":
        machine.vhosts[record[1]] = md.VHost(record[1])
        return
    vhost = machine.vhosts[record[1]]
    if kind == "exchange":
        _, _, name, type_, durable, auto_delete, internal, arguments, builtin, routing_type = record
        vhost.exchanges[name] = md.ExchangeRecord(
            name,
            type_,
            durable,
            auto_delete,
            internal,
            _untable(arguments),
            make_router(routing_type),
            builtin,
            routing_type,
        )
    elif kind == "bindings":
        router = vhost.exchanges[record[2]].router
        for dest, key, arguments in record[3]:
            if not router.add(dest, key, _untable(arguments)):
                raise ValueError(f"binding {dest!r} {key!r} twice")
    elif kind == "queue":
        _, _, name, durable, exclusive_owner, auto_delete, arguments, *placed = record
        group = placed[0] if placed else None
        if len(placed) > 1 or (group is not None and type(group) is not str):
            raise ValueError(f"queue {name!r}: malformed group {placed!r}")
        vhost.queues[name] = md.QueueRecord(name, durable, exclusive_owner, auto_delete, _untable(arguments), group)
    elif kind == "bindings_to":
        entries = vhost.bindings_to.setdefault(record[2], [])
        entries.extend((source, key, _untable(arguments)) for source, key, arguments in record[3])
    elif kind == "policy" or kind == "operator_policy":
        _, _, name, pattern, definition, priority, apply_to = record
        try:
            regex = compile_pattern(pattern)
        except PatternError as exc:
            # Written by a version that accepted it (a backtracking engine); replaying its
            # SetPolicy refuses it now, so skipping it here keeps every member alike.
            log.warning("metadata snapshot: policy %r in vhost %r skipped: %s", name, vhost.name, exc)
            return
        policies = vhost.policies if kind == "policy" else vhost.operator_policies
        policies[name] = md.PolicyRecord(name, pattern, _untable(definition), priority, apply_to, regex)
    elif kind == "access":
        _, _, permissions, topics, limits = record
        for user, configure, write, read in permissions:
            vhost.permissions[user] = access.Permission(configure, write, read)
        for user, exchange, write, read in topics:
            vhost.topic_permissions.setdefault(user, {})[exchange] = access.TopicPermission(write, read)
        vhost.limits = dict(limits)
    else:
        raise SnapshotError(f"metadata snapshot: unknown record {str(kind)[:40]!r}")
