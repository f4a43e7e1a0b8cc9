"""The metadata machine: vhosts, exchanges, queues and bindings, applied from a log.

Theory of operation: like the queue machine, `MetadataMachine.apply(meta, command)` is the only
way the topology changes, returns `(reply, effects)` and never raises; replies that refuse a
command are `Rejected(code, text)` with RabbitMQ's reply codes and texts. Routing
(`route`) reads this state and is a pure function of it, so every node routes a publish alike.

Bindings live in one router per exchange (`routing/`, one module per exchange type); a
destination is "q:<queue>" or "e:<exchange>". A reverse index by destination lets deleting a
queue or an exchange drop its bindings without scanning every exchange.

Server-generated names (amq.gen-…) are chosen by the proposer and carried in the command, so
the machine stays deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeAlias

from . import access, partitions
from .access import AccessError, AccessKeyRecord, Permission, TopicPermission, UserRecord
from .dedup import dedup_exchange_error
from .features import EnableFeatures
from .maintenance import SetMaintenance
from .placement import LOCATOR_ARGUMENT, FirstGroups, PlaceQueue, SetGroups, groups_refusal, hash_group
from .policy_pattern import PatternError, compile_pattern
from .queue_args import Arguments, QueueArgumentError, validate_queue_arguments
from .queue_types import Meta, Rejected
from .routing import EXCHANGE_TYPES, Router, make_router, validate_binding_arguments
from .txn_decisions import DecideTxn, TxnDecisions

DEFAULT_VHOST = "/"
SERVER_NAMED_PREFIX = "amq.gen-"  # queue.declare with no name: the broker names it (channel.py)
META_GROUP = "meta"  # the Raft group this machine is applied in (every member holds it)

# RabbitMQ checks these queue arguments for equivalence on redeclare (rabbit_amqqueue).
QUEUE_EQUIVALENCE_ARGS = (
    "x-expires",
    "x-message-ttl",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-priority",
    "x-overflow",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-queue-type",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-delivery-limit",
    "x-sqs-fifo",
    "x-consume-rate-limit",
    "x-publish-rate-limit",
    partitions.ARGUMENT,
)
EXCHANGE_EQUIVALENCE_ARGS = ("alternate-exchange", "x-delayed-type")
DELAYED_EXCHANGE_TYPE = "x-delayed-message"
# rabbitmq-message-deduplication's exchange type: routes as fanout; the publish's queues drop an
# id the exchange's window has seen (machines/dedup.py keeps that window in each queue).
DEDUP_EXCHANGE_TYPE = "x-message-deduplication"

BUILTIN_EXCHANGES = (
    ("", "direct"),
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)


@dataclass
class ExchangeRecord:
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Arguments
    router: Router
    builtin: bool = False
    routing_type: str = ""  # how it routes: its type, or the x-delayed-type of an x-delayed-message

    def __post_init__(self) -> None:
        if not self.routing_type:
            self.routing_type = self.type


@dataclass
class QueueRecord:
    name: str
    durable: bool
    exclusive_owner: str | None
    auto_delete: bool
    arguments: Arguments
    group: str | None = None  # the shard group it lives in, once placement is recorded (placement.py)


# Policy keys (RabbitMQ's names) and the queue arguments they stand for. x-max-priority and
# x-single-active-consumer are queue arguments only (as in RabbitMQ): they fix the queue's kind.
POLICY_KEYS = {
    "message-ttl": "x-message-ttl",
    "expires": "x-expires",
    "max-length": "x-max-length",
    "max-length-bytes": "x-max-length-bytes",
    "overflow": "x-overflow",
    "dead-letter-exchange": "x-dead-letter-exchange",
    "dead-letter-routing-key": "x-dead-letter-routing-key",
    "delivery-limit": "x-delivery-limit",
    "retry-backoff-ms": "x-retry-backoff-ms",
    "retry-backoff-multiplier": "x-retry-backoff-multiplier",
    "retry-backoff-max-ms": "x-retry-backoff-max-ms",
    "consume-rate-limit": "x-consume-rate-limit",  # MaxQ-Raft's (issue #20)
    # x-partitions (partitions.py): the count a queue is made with; an existing queue keeps its own
    "partitions": partitions.ARGUMENT,
    "publish-rate-limit": "x-publish-rate-limit",
    "queue-leader-locator": LOCATOR_ARGUMENT,  # where a new queue goes (placement.py)
    # rabbitmq-message-deduplication (machines/dedup.py): our names, and the plugin's own policy
    # keys (it registers them with their x- prefix), so its policies apply unchanged.
    "message-deduplication": "x-message-deduplication",
    "cache-size": "x-cache-size",
    "cache-ttl": "x-cache-ttl",
    "x-message-deduplication": "x-message-deduplication",
    "x-cache-size": "x-cache-size",
    "x-cache-ttl": "x-cache-ttl",
    # Message trace (server/tracer.py, docs/queue-features.md), with or without the x- prefix.
    "trace": "x-trace",
    "trace-bodies": "x-trace-bodies",
    "trace-retention": "x-trace-retention",
    "trace-retention-bytes": "x-trace-retention-bytes",
    "x-trace": "x-trace",
    "x-trace-bodies": "x-trace-bodies",
    "x-trace-retention": "x-trace-retention",
    "x-trace-retention-bytes": "x-trace-retention-bytes",
}
POLICY_APPLY_TO = ("queues", "all", "exchanges")
# What an operator policy may set (RabbitMQ 3.10's operator_policy_validators that we have):
# limits whose stricter value wins over the queue's own argument and its user policy.
OPERATOR_POLICY_KEYS = ("expires", "message-ttl", "max-length", "max-length-bytes", "delivery-limit")


@dataclass
class PolicyRecord:
    name: str
    pattern: str
    definition: dict[str, Any]  # policy keys -> values
    priority: int
    apply_to: str
    regex: Any = None  # `pattern` compiled (policy_pattern.PolicyPattern)

    def arguments(self) -> Arguments:
        return {POLICY_KEYS[key]: value for key, value in self.definition.items()}


@dataclass
class VHost:
    name: str
    policies: dict[str, PolicyRecord] = field(default_factory=dict)
    exchanges: dict[str, ExchangeRecord] = field(default_factory=dict)
    queues: dict[str, QueueRecord] = field(default_factory=dict)
    # destination ("q:x"/"e:x") -> list of (source exchange, routing key, arguments)
    bindings_to: dict[str, list[tuple[str, str, Arguments]]] = field(default_factory=dict)
    permissions: dict[str, Permission] = field(default_factory=dict)  # user -> patterns
    topic_permissions: dict[str, dict[str, TopicPermission]] = field(default_factory=dict)  # user -> exchange -> ...
    limits: dict[str, int] = field(default_factory=dict)  # access.VHOST_LIMITS
    operator_policies: dict[str, PolicyRecord] = field(default_factory=dict)  # see OPERATOR_POLICY_KEYS


# ------------------------------------------------------------------ commands


class DeclareExchange(NamedTuple):
    vhost: str
    name: str
    type: str
    passive: bool
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Arguments


class DeleteExchange(NamedTuple):
    vhost: str
    name: str
    if_unused: bool


class DeclareQueue(NamedTuple):
    vhost: str
    name: str
    passive: bool
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: Arguments
    owner: str  # connection id, for exclusive queues
    # The shard group the declaring member made the queue's machine in, after its PlaceQueue
    # (placement.py); None: the placement recorded for it, else the hash. Encoded only when set,
    # which it is only once every member reads it (feature queue_locator: replication/entries.py).
    group: str | None = None


class SetQueueArguments(NamedTuple):
    """SQS SetQueueAttributes and TagQueue: replace some of a queue's own arguments (only the
    `x-sqs-` ones and those SQS attributes stand for: x-message-ttl, the dead-letter target and
    the delivery limit; sqs/mapping.py), or remove one named with the value None (proposed only
    once the feature QUEUE_ARGUMENTS_REMOVED is enabled); the queue's settings follow as after a
    policy change. AMQP itself never changes a queue's arguments."""

    vhost: str
    name: str
    arguments: dict[str, Any]


SETTABLE_QUEUE_ARGUMENT_PREFIX = "x-sqs-"
# MessageRetentionPeriod and RedrivePolicy (sqs/mapping.py)
SETTABLE_QUEUE_ARGUMENTS = ("x-message-ttl", "x-delivery-limit", "x-dead-letter-exchange", "x-dead-letter-routing-key")
FIXED_QUEUE_ARGUMENTS = ("x-sqs-fifo",)  # a queue is FIFO or not for its whole life (SQS's FifoQueue)


class DeleteQueueRecord(NamedTuple):
    vhost: str
    name: str


class Bind(NamedTuple):
    vhost: str
    source: str
    destination: str  # queue or exchange name
    to_exchange: bool
    routing_key: str
    arguments: Arguments
    owner: str  # connection id: exclusive queues of other connections are locked


class Unbind(NamedTuple):
    vhost: str
    source: str
    destination: str
    to_exchange: bool
    routing_key: str
    arguments: Arguments
    owner: str


class OwnerDown(NamedTuple):
    """A connection closed: its exclusive queues are deleted."""

    owner: str


class SetPolicy(NamedTuple):
    """A policy (rabbitmqctl set_policy): queues whose name matches `pattern` get `definition`'s
    arguments unless they were declared with their own; of several matching, the highest priority."""

    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int
    apply_to: str


class ClearPolicy(NamedTuple):
    vhost: str
    name: str


class SetOperatorPolicy(NamedTuple):
    """An operator policy (rabbitmqctl set_operator_policy): limits an administrator puts on
    queues whose name matches `pattern`, over what their users chose: for each key of
    `definition` (OPERATOR_POLICY_KEYS) the lower of its value and the queue's own or its
    policy's wins. Of several matching, the highest priority, as for policies."""

    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int
    apply_to: str


class ClearOperatorPolicy(NamedTuple):
    vhost: str
    name: str


# Users, vhosts and permissions (machines/access.py). A password arrives hashed, its salt drawn by
# the proposer, so applying a command is deterministic.


class PutUser(NamedTuple):
    """Create a user or replace its password hash and tags (RabbitMQ's PUT /api/users/NAME)."""

    name: str
    password_hash: str  # "": no password login
    hashing_algorithm: str
    tags: list[str]


class DeleteUser(NamedTuple):
    name: str


class SeedDefaultUser(NamedTuple):
    """--default-user on a node whose users were never changed: the user replaces guest, as an
    administrator with every permission on "/". Ignored once any user command has applied, so
    the first of several members proposing it wins and restarts change nothing."""

    name: str
    password_hash: str


class PutVhost(NamedTuple):
    name: str


class DeleteVhost(NamedTuple):
    name: str


class SetPermissions(NamedTuple):
    vhost: str
    user: str
    configure: str
    write: str
    read: str


class ClearPermissions(NamedTuple):
    vhost: str
    user: str


class SetTopicPermissions(NamedTuple):
    vhost: str
    user: str
    exchange: str
    write: str
    read: str


class ClearTopicPermissions(NamedTuple):
    vhost: str
    user: str
    exchange: str  # "": all of the user's topic permissions in the vhost


class SetLimits(NamedTuple):
    """A vhost's or a user's limits, replaced whole ({} clears them)."""

    kind: str  # "vhost" or "user"
    name: str
    limits: dict[str, int]


class PutAccessKey(NamedTuple):
    """A new access key of `user` (the SQS endpoint's SigV4 credential), drawn by the proposer."""

    key_id: str
    user: str
    secret: str


class DeleteAccessKey(NamedTuple):
    key_id: str


ACCESS_COMMANDS = (
    PutUser,
    DeleteUser,
    SeedDefaultUser,
    PutVhost,
    DeleteVhost,
    SetPermissions,
    ClearPermissions,
    SetTopicPermissions,
    ClearTopicPermissions,
    SetLimits,
    PutAccessKey,
    DeleteAccessKey,
)
GUEST = "guest"
# guest's hash in a fresh machine: a fixed salt, so every member starts alike.
GUEST_PASSWORD_HASH = access.hash_password("guest", salt=bytes(access.SALT_BYTES))
FULL_PERMISSION = (".*", ".*", ".*")


# ------------------------------------------------------------------- effects


class QueueCreated(NamedTuple):
    vhost: str
    name: str


class QueueDeleted(NamedTuple):
    vhost: str
    name: str


class PolicyChanged(NamedTuple):
    """The policies of a vhost changed: its queues' effective arguments may have."""

    vhost: str


class VhostDeleted(NamedTuple):
    """Its connections are closed (RabbitMQ: 320 CONNECTION_FORCED)."""

    name: str


MetaEffect: TypeAlias = QueueCreated | QueueDeleted | PolicyChanged | VhostDeleted
# What a command answers: True/False (done, or nothing to do), the record declared, the number
# of queues an OwnerDown deleted, or a refusal.
MetaReply: TypeAlias = (
    bool | int | str | ExchangeRecord | QueueRecord | Rejected | None
)  # str: DecideTxn's, PlaceQueue's
MetaResult: TypeAlias = tuple[MetaReply, list[MetaEffect]]


def _bool_text(value: bool) -> str:
    return "true" if value else "false"


def _value_text(value: Any) -> str:
    """rabbit_misc:val of a {Type, Value} pair, or of undefined ("none")."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        # The decoder keeps no width; clients (pika, our encoder) send 32-bit values as 'I'.
        kind = "signedint" if -(1 << 31) <= value < (1 << 31) else "long"
    else:
        kind = {float: "double", str: "longstr", bytes: "longstr"}.get(type(value), type(value).__name__)
    return f"the value '{_erlang_text(value)}' of type '{kind}'"


class MetadataMachine:
    def __init__(self) -> None:
        self.vhosts: dict[str, VHost] = {}
        self.users: dict[str, UserRecord] = {GUEST: UserRecord(GUEST, GUEST_PASSWORD_HASH, tags=["administrator"])}
        self.users_seeded = False  # a user command applied: SeedDefaultUser does nothing
        self.access_keys: dict[str, AccessKeyRecord] = {}  # key id -> its user and secret, in creation order
        # Bumped by every change of users, permissions or limits: sessions cache what they checked.
        self.access_version = 0
        self.txn_decisions = TxnDecisions()  # transactions' decisions (txn_decisions.py)
        self.features_enabled: list[str] = []  # feature flags, in the order enabled (features.py)
        self.draining: list[str] = []  # members under maintenance, in the order drained (maintenance.py)
        self.shard_groups: dict[str, list[str]] = {}  # group -> its replicas, in order (placement.py)
        # (vhost, queue) -> group: placements of queues not declared yet (PlaceQueue)
        self.queue_places: dict[tuple[str, str], str] = {}
        self._add_vhost(DEFAULT_VHOST)
        self.vhosts[DEFAULT_VHOST].permissions[GUEST] = Permission(*FULL_PERMISSION)
        self._handlers: dict[type, Callable[[Any], MetaResult]] = {
            DeclareExchange: self._declare_exchange,
            DeleteExchange: self._delete_exchange,
            DeclareQueue: self._declare_queue,
            DeleteQueueRecord: self._delete_queue,
            SetQueueArguments: self._set_queue_arguments,
            Bind: self._bind,
            Unbind: self._unbind,
            OwnerDown: self._owner_down,
            SetPolicy: self._set_policy,
            ClearPolicy: self._clear_policy,
            PutUser: self._put_user,
            DeleteUser: self._delete_user,
            SeedDefaultUser: self._seed_default_user,
            PutVhost: self._put_vhost,
            DeleteVhost: self._delete_vhost,
            SetPermissions: self._set_permissions,
            ClearPermissions: self._clear_permissions,
            SetTopicPermissions: self._set_topic_permissions,
            ClearTopicPermissions: self._clear_topic_permissions,
            SetLimits: self._set_limits,
            SetOperatorPolicy: self._set_operator_policy,
            ClearOperatorPolicy: self._clear_operator_policy,
            PutAccessKey: self._put_access_key,
            DeleteAccessKey: self._delete_access_key,
            EnableFeatures: self._enable_features,
            SetMaintenance: self._set_maintenance,
            SetGroups: self._set_groups,
            FirstGroups: self._first_groups,
            PlaceQueue: self._place_queue,
        }

    def _add_vhost(self, name: str) -> None:
        vhost = self.vhosts[name] = VHost(name)
        for ex_name, ex_type in BUILTIN_EXCHANGES:
            vhost.exchanges[ex_name] = ExchangeRecord(
                ex_name, ex_type, True, False, False, {}, make_router(ex_type), builtin=True
            )

    def apply(self, meta: Meta, command: object) -> MetaResult:
        handler = self._handlers.get(type(command))
        if handler is None:
            if type(command) is DecideTxn:  # (the one command that reads the entry's time)
                return self.txn_decisions.apply(meta, command)

            return Rejected(541, f"unknown metadata command {type(command).__name__}"), []
        try:
            if type(command) in ACCESS_COMMANDS:
                refused = access_refusal(command)  # as the admin API checked before proposing
                if refused:
                    return refused, []
            return handler(command)
        except Exception as exc:  # never let one bad command stall the log
            return Rejected(541, f"internal error applying {type(command).__name__}: {exc!r}"), []

    # ------------------------------------------------------------- lookups

    def exchange(self, vhost: str, name: str) -> ExchangeRecord | None:
        v = self.vhosts.get(vhost)
        return v.exchanges.get(name) if v else None

    def queue(self, vhost: str, name: str) -> QueueRecord | None:
        v = self.vhosts.get(vhost)
        return v.queues.get(name) if v else None

    def route(self, vhost: str, exchange: str, routing_key: str, headers: Any) -> list[str]:
        """Queue names a publish reaches: exchange-to-exchange bindings and alternate exchanges followed.

        As rabbit_exchange:route: each exchange that matched no destination hands the message to
        its alternate exchange; each exchange is visited once, so cycles end.

        `headers` is the message's header table, None, or a function returning it: the shell
        passes a function so that the properties are decoded only when a headers exchange is
        on the route, and only once.
        """
        v = self.vhosts[vhost]
        if exchange == "":
            target = v.queues.get(routing_key)
            if target is None:
                return []
            if partitions.ARGUMENT in target.arguments:
                return [_partition_for(v.queues, target, routing_key, headers)]
            return [routing_key]
        queues: list[str] = []
        seen_queues: dict[str, None] = {}
        visited: dict[str, None] = {}
        work = [exchange]
        while work:
            name = work.pop()
            if name in visited:
                continue
            visited[name] = None
            record = v.exchanges.get(name)
            if record is None:
                continue
            if record.routing_type == "headers" and callable(headers):
                headers = headers()  # decoded once, for the first headers exchange on the route
            destinations = record.router.route(routing_key, None if callable(headers) else headers)
            if not destinations:
                ae = record.arguments.get("alternate-exchange")
                if isinstance(ae, (str, bytes)):
                    work.append(ae.decode() if isinstance(ae, bytes) else ae)
                continue
            for dest in reversed(destinations):
                if dest[0] == "q":
                    qname = dest[2:]
                    if qname not in seen_queues:
                        seen_queues[qname] = None
                else:
                    work.append(dest[2:])
        queues.extend(seen_queues)
        records = v.queues
        for i, qname in enumerate(queues):
            target = records.get(qname)
            if target is not None and partitions.ARGUMENT in target.arguments:
                if callable(headers):
                    headers = headers()  # (decoded once for every partitioned queue on the route)
                queues[i] = _partition_for(records, target, routing_key, headers)
        return queues

    # ------------------------------------------------------------ exchanges

    def _declare_exchange(self, cmd: DeclareExchange) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        existing = v.exchanges.get(cmd.name)
        if cmd.passive:
            if existing is None:
                return Rejected(404, f"no exchange '{cmd.name}' in vhost '{cmd.vhost}'"), []
            return existing, []
        # rabbit_exchange:check_type runs before the lookup, so it also answers a redeclare.
        # Since rabbitmq-server#11214 (3.12.x, 3.13.x, 4.x) it is a channel error, 406
        # PRECONDITION_FAILED, no longer 503 COMMAND_INVALID on the whole connection.
        routing_type = cmd.type
        if cmd.type == DELAYED_EXCHANGE_TYPE:
            # As rabbitmq-delayed-message-exchange: it routes as its x-delayed-type; the delay itself
            # (the x-delay header) is the queues' business here, so the exchange is an ordinary one.
            delayed_type = (cmd.arguments or {}).get("x-delayed-type")
            if isinstance(delayed_type, bytes):
                delayed_type = delayed_type.decode("utf-8", "replace")
            if delayed_type not in EXCHANGE_TYPES:
                return Rejected(406, "Invalid argument, 'x-delayed-type' must be an existing exchange type"), []
            routing_type = delayed_type
        elif cmd.type == DEDUP_EXCHANGE_TYPE:
            error = dedup_exchange_error(cmd.arguments or {})
            if error is not None:
                return Rejected(406, error), []
            routing_type = "fanout"
        elif cmd.type not in EXCHANGE_TYPES:
            return Rejected(406, f"unknown exchange type '{cmd.type}'"), []
        if existing is None:
            if cmd.name.startswith("amq."):
                return Rejected(403, f"exchange name '{cmd.name}' contains reserved prefix 'amq.*'"), []
            router = make_router(routing_type)
            record = ExchangeRecord(
                cmd.name,
                cmd.type,
                cmd.durable,
                cmd.auto_delete,
                cmd.internal,
                dict(cmd.arguments or {}),
                router,
                routing_type=routing_type,
            )
            v.exchanges[cmd.name] = record
            return record, []
        where = f"for exchange '{cmd.name}' in vhost '{cmd.vhost}'"
        if existing.type != cmd.type:
            return Rejected(
                406, f"inequivalent arg 'type' {where}: received '{cmd.type}' but current is '{existing.type}'"
            ), []
        for arg, got, have in (
            ("durable", cmd.durable, existing.durable),
            ("auto_delete", cmd.auto_delete, existing.auto_delete),
            ("internal", cmd.internal, existing.internal),
        ):
            if got != have:
                return Rejected(
                    406,
                    f"inequivalent arg '{arg}' {where}: received '{_bool_text(got)}' but current is '{_bool_text(have)}'",
                ), []
        rejected = _check_args(cmd.arguments or {}, existing.arguments, EXCHANGE_EQUIVALENCE_ARGS, where)
        if rejected:
            return rejected, []
        return existing, []

    def _delete_exchange(self, cmd: DeleteExchange) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        record = v.exchanges.get(cmd.name) if v else None
        # rabbit_channel: check_not_default_exchange, then check_exchange_deletion, which refuses
        # every "amq."-prefixed name, whether or not such an exchange exists.
        if cmd.name == "":
            return Rejected(403, "operation not permitted on the default exchange"), []
        if cmd.name.startswith("amq."):
            return Rejected(403, f"deletion of system exchange '{cmd.name}' in vhost '{cmd.vhost}' not allowed"), []
        if v is None or record is None:
            return True, []  # idempotent, as RabbitMQ 3.x
        if cmd.if_unused and len(record.router):
            return Rejected(406, f"exchange '{cmd.name}' in vhost '{cmd.vhost}' in use"), []
        self._remove_exchange(v, record)
        return True, []

    def _remove_exchange(self, v: VHost, record: ExchangeRecord) -> None:
        del v.exchanges[record.name]
        for dest, key, args in record.router.bindings():
            self._unindex(v, dest, record.name, key, args)
        # Bindings where this exchange is the destination go too.
        self._drop_bindings_to(v, "e:" + record.name)

    # --------------------------------------------------------------- queues

    def _declare_queue(self, cmd: DeclareQueue) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        existing = v.queues.get(cmd.name)
        if cmd.passive:
            if existing is None:
                return Rejected(404, f"no queue '{cmd.name}' in vhost '{cmd.vhost}'"), []
            # check_exclusive_access(Q, ConnPid, lax): only another connection's exclusive queue is locked.
            if existing.exclusive_owner is not None and existing.exclusive_owner != cmd.owner:
                return _locked(cmd.vhost, cmd.name), []
            return existing, []
        # rabbit_channel: an exclusive queue is never durable (Durable = durable andalso not exclusive).
        durable = cmd.durable and not cmd.exclusive
        if existing is None:
            placed = self.queue_places.pop((cmd.vhost, cmd.name), None)  # (made or refused: it is used)
            if (
                cmd.name.startswith("amq.")
                and not cmd.name.startswith(SERVER_NAMED_PREFIX)
                and partitions.parent_of(cmd.name) is None  # (proposed once FEATURE is enabled: channel.py)
            ):
                return Rejected(403, f"queue name '{cmd.name}' contains reserved prefix 'amq.*'"), []
            limit = v.limits.get("max-queues")
            if limit is not None and len(v.queues) >= limit:
                # rabbit_vhost_limit: checked where the queue is created, so racing declares agree
                return Rejected(
                    406, f"cannot declare queue '{cmd.name}': queue limit in vhost '{cmd.vhost}' ({limit}) is reached"
                ), []
            record = QueueRecord(
                cmd.name,
                durable,
                cmd.owner if cmd.exclusive else None,
                cmd.auto_delete,
                dict(cmd.arguments or {}),
                self._group_for(cmd.vhost, cmd.name, cmd.group, placed),
            )
            v.queues[cmd.name] = record
            return record, [QueueCreated(cmd.vhost, cmd.name)]
        # rabbit_amqqueue:assert_equivalence checks exclusive access first, strictly: the owner
        # must match exactly, so a different `exclusive` flag is 405 RESOURCE_LOCKED, not 406.
        if existing.exclusive_owner != (cmd.owner if cmd.exclusive else None):
            return _locked(cmd.vhost, cmd.name), []
        where = f"for queue '{cmd.name}' in vhost '{cmd.vhost}'"
        for arg, got, have in (
            ("durable", durable, existing.durable),
            ("auto_delete", cmd.auto_delete, existing.auto_delete),
        ):
            if got != have:
                return Rejected(
                    406,
                    f"inequivalent arg '{arg}' {where}: received '{_bool_text(got)}' but current is '{_bool_text(have)}'",
                ), []
        rejected = _check_args(cmd.arguments or {}, existing.arguments, QUEUE_EQUIVALENCE_ARGS, where)
        if rejected:
            return rejected, []
        return existing, []

    def _group_for(self, vhost: str, name: str, *chosen: str | None) -> str | None:
        """A new queue's group: the first of `chosen` that is a recorded group (the one its
        declare names, where it was placed), else the hash over the recorded groups; None
        before placement is recorded."""
        if not self.shard_groups:
            return None
        for group in chosen:
            if group is not None and group in self.shard_groups:
                return group
        return hash_group(vhost, name, list(self.shard_groups))

    def _place_queue(self, cmd: PlaceQueue) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        existing = v.queues.get(cmd.name)
        if existing is not None:
            return existing.group, []
        key = (cmd.vhost, cmd.name)
        placed = self.queue_places.get(key)
        if placed is not None:  # another member's placement came first: it stands
            return placed, []
        if (
            type(cmd.group) is not str
            or cmd.group not in self.shard_groups
            or partitions.parent_of(cmd.name) is not None  # (partitions spread by their index)
        ):
            return self._group_for(cmd.vhost, cmd.name), []
        self.queue_places[key] = cmd.group
        return cmd.group, []

    def _drop_places(self, unused: Callable[[tuple[str, str], str], bool]) -> None:
        if self.queue_places:
            self.queue_places = {key: place for key, place in self.queue_places.items() if not unused(key, place)}

    def _set_queue_arguments(self, cmd: SetQueueArguments) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        record = v.queues.get(cmd.name) if v is not None else None
        if record is None:
            return Rejected(404, f"no queue '{cmd.name}' in vhost '{cmd.vhost}'"), []
        if type(cmd.arguments) is not dict:
            return Rejected(406, "queue arguments must be a table"), []
        for key in cmd.arguments:
            if key in FIXED_QUEUE_ARGUMENTS or not (
                key.startswith(SETTABLE_QUEUE_ARGUMENT_PREFIX) or key in SETTABLE_QUEUE_ARGUMENTS
            ):
                return Rejected(406, f"the queue argument '{key}' cannot be changed"), []
        arguments = {**record.arguments, **cmd.arguments}
        for key, value in cmd.arguments.items():
            if value is None:
                del arguments[key]
        try:
            validate_queue_arguments(cmd.vhost, cmd.name, arguments)
        except QueueArgumentError as exc:
            return Rejected(406, exc.reply_text), []
        record.arguments = arguments
        return True, [PolicyChanged(cmd.vhost)]  # the queue's settings are recomputed

    def _delete_queue(self, cmd: DeleteQueueRecord) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None or cmd.name not in v.queues:
            return False, []
        del v.queues[cmd.name]
        self._drop_bindings_to(v, "q:" + cmd.name)
        return True, [QueueDeleted(cmd.vhost, cmd.name)]

    def _owner_down(self, cmd: OwnerDown) -> MetaResult:
        owner = cmd.owner
        whole_node = owner.endswith("@")  # every connection of a node: "n1@" matches "n1@3/17"
        effects: list[MetaEffect] = []
        for v in self.vhosts.values():
            for name in [
                q.name
                for q in v.queues.values()
                if q.exclusive_owner == owner or whole_node and (q.exclusive_owner or "").startswith(owner)
            ]:
                _, deleted = self._delete_queue(DeleteQueueRecord(v.name, name))
                effects.extend(deleted)
        return len(effects), effects

    # ------------------------------------------------------------- policies

    def _set_policy(self, cmd: SetPolicy) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        record = policy_record(cmd)
        if isinstance(record, Rejected):
            return record, []
        v.policies[cmd.name] = record
        return True, [PolicyChanged(cmd.vhost)]

    def _clear_policy(self, cmd: ClearPolicy) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None or cmd.name not in v.policies:
            return Rejected(404, f"no policy '{cmd.name}' in vhost '{cmd.vhost}'"), []
        del v.policies[cmd.name]
        return True, [PolicyChanged(cmd.vhost)]

    def _set_operator_policy(self, cmd: SetOperatorPolicy) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        record = operator_policy_record(cmd)
        if isinstance(record, Rejected):
            return record, []
        v.operator_policies[cmd.name] = record
        return True, [PolicyChanged(cmd.vhost)]

    def _clear_operator_policy(self, cmd: ClearOperatorPolicy) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None or cmd.name not in v.operator_policies:
            return Rejected(404, f"no operator policy '{cmd.name}' in vhost '{cmd.vhost}'"), []
        del v.operator_policies[cmd.name]
        return True, [PolicyChanged(cmd.vhost)]

    # --------------------------------------------------- users, vhosts, permissions

    def _access_changed(self) -> None:
        self.users_seeded = True
        self.access_version += 1

    def _put_user(self, cmd: PutUser) -> MetaResult:
        old = self.users.get(cmd.name)
        limits = old.limits if old else {}
        self.users[cmd.name] = UserRecord(cmd.name, cmd.password_hash, cmd.hashing_algorithm, list(cmd.tags), limits)
        self._access_changed()
        return old is None, []

    def _delete_user(self, cmd: DeleteUser) -> MetaResult:
        if cmd.name not in self.users:
            return Rejected(404, f"no user '{cmd.name}'"), []
        del self.users[cmd.name]
        for key_id in [k for k, record in self.access_keys.items() if record.user == cmd.name]:
            del self.access_keys[key_id]  # a deleted user's keys sign nothing any more
        for v in self.vhosts.values():
            v.permissions.pop(cmd.name, None)
            v.topic_permissions.pop(cmd.name, None)
        self._access_changed()
        return True, []

    def _seed_default_user(self, cmd: SeedDefaultUser) -> MetaResult:
        if self.users_seeded:
            return False, []
        self._delete_user(DeleteUser(GUEST))
        self.users[cmd.name] = UserRecord(cmd.name, cmd.password_hash, access.SHA256, ["administrator"])
        if DEFAULT_VHOST in self.vhosts:
            self.vhosts[DEFAULT_VHOST].permissions[cmd.name] = Permission(*FULL_PERMISSION)
        self._access_changed()
        return True, []

    def _put_vhost(self, cmd: PutVhost) -> MetaResult:
        if cmd.name in self.vhosts:
            return False, []
        self._add_vhost(cmd.name)
        self.access_version += 1
        return True, []

    def _delete_vhost(self, cmd: DeleteVhost) -> MetaResult:
        v = self.vhosts.get(cmd.name)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.name}'"), []
        effects: list[MetaEffect] = []
        for name in list(v.queues):
            effects.extend(self._delete_queue(DeleteQueueRecord(cmd.name, name))[1])
        del self.vhosts[cmd.name]
        self._drop_places(lambda key, _place: key[0] == cmd.name)
        self._access_changed()  # its permissions went with it: the users count as set up
        effects.append(VhostDeleted(cmd.name))
        return True, effects

    def _vhost_and_user(self, vhost: str, user: str) -> VHost | Rejected:
        v = self.vhosts.get(vhost)
        if v is None:
            return Rejected(404, f"no vhost '{vhost}'")
        if user not in self.users:
            return Rejected(404, f"no user '{user}'")
        return v

    def _set_permissions(self, cmd: SetPermissions) -> MetaResult:
        v = self._vhost_and_user(cmd.vhost, cmd.user)
        if isinstance(v, Rejected):
            return v, []
        v.permissions[cmd.user] = Permission(cmd.configure, cmd.write, cmd.read)
        self._access_changed()
        return True, []

    def _clear_permissions(self, cmd: ClearPermissions) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None or v.permissions.pop(cmd.user, None) is None:
            return Rejected(404, f"no permissions for user '{cmd.user}' in vhost '{cmd.vhost}'"), []
        v.topic_permissions.pop(cmd.user, None)
        self._access_changed()
        return True, []

    def _set_topic_permissions(self, cmd: SetTopicPermissions) -> MetaResult:
        v = self._vhost_and_user(cmd.vhost, cmd.user)
        if isinstance(v, Rejected):
            return v, []
        v.topic_permissions.setdefault(cmd.user, {})[cmd.exchange] = TopicPermission(cmd.write, cmd.read)
        self._access_changed()
        return True, []

    def _clear_topic_permissions(self, cmd: ClearTopicPermissions) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        mine = v.topic_permissions.get(cmd.user) if v else None
        if v is None or not mine or (cmd.exchange and cmd.exchange not in mine):
            return Rejected(404, f"no topic permissions for user '{cmd.user}' in vhost '{cmd.vhost}'"), []
        if cmd.exchange:
            del mine[cmd.exchange]
        if not cmd.exchange or not mine:
            del v.topic_permissions[cmd.user]
        self._access_changed()
        return True, []

    def _set_limits(self, cmd: SetLimits) -> MetaResult:
        if cmd.kind == "vhost":
            if cmd.name not in self.vhosts:
                return Rejected(404, f"no vhost '{cmd.name}'"), []
            self.vhosts[cmd.name].limits = dict(cmd.limits)
        else:
            if cmd.name not in self.users:
                return Rejected(404, f"no user '{cmd.name}'"), []
            self.users[cmd.name].limits = dict(cmd.limits)
        self._access_changed()
        return True, []

    def _put_access_key(self, cmd: PutAccessKey) -> MetaResult:
        if cmd.user not in self.users:
            return Rejected(404, f"no user '{cmd.user}'"), []
        if cmd.key_id in self.access_keys:
            return Rejected(400, f"access key '{cmd.key_id}' exists"), []
        held = sum(1 for record in self.access_keys.values() if record.user == cmd.user)
        if held >= access.ACCESS_KEYS_PER_USER_MAX:
            return Rejected(
                400, f"user '{cmd.user}' has {held} access keys, the most a user may have: delete one first"
            ), []
        self.access_keys[cmd.key_id] = AccessKeyRecord(cmd.key_id, cmd.user, cmd.secret)
        self._access_changed()
        return True, []

    def _delete_access_key(self, cmd: DeleteAccessKey) -> MetaResult:
        if self.access_keys.pop(cmd.key_id, None) is None:
            return Rejected(404, f"no access key '{cmd.key_id}'"), []
        self._access_changed()
        return True, []

    def _enable_features(self, cmd: EnableFeatures) -> MetaResult:
        names = cmd.names
        if type(names) is not list or not all(type(name) is str and name for name in names):
            return Rejected(406, f"feature names must be a list of names, not {names!r}"[:200]), []
        # (a name this code does not know is kept too: every member applies the same list; a
        # member that lacks the feature meets its commands and stops, as it would without flags)
        added = [name for name in dict.fromkeys(names) if name not in self.features_enabled]
        self.features_enabled.extend(added)
        return bool(added), []

    def _set_maintenance(self, cmd: SetMaintenance) -> MetaResult:
        if type(cmd.node) is not str or not cmd.node or type(cmd.draining) is not bool:
            return Rejected(406, f"maintenance needs a node name and true/false, not {cmd!r}"[:200]), []
        if cmd.draining == (cmd.node in self.draining):
            return False, []  # (already so)
        if cmd.draining:
            self.draining.append(cmd.node)
        else:
            self.draining.remove(cmd.node)
        return True, []

    def _set_groups(self, cmd: SetGroups) -> MetaResult:
        holding = self.queues_per_group()
        refused = groups_refusal(cmd.groups, holding)
        if refused:
            return Rejected(406, refused), []
        groups = {name: list(members) for name, members in cmd.groups}
        if groups == self.shard_groups and list(groups) == list(self.shard_groups):
            return False, []  # (already so)
        first = not self.shard_groups
        self.shard_groups = groups
        self._drop_places(lambda _key, group: group not in groups)
        if first:  # every queue that exists now takes the group its name hashed to before
            names = list(groups)
            for vhost in self.vhosts.values():
                for record in vhost.queues.values():
                    if record.group is None:
                        record.group = hash_group(vhost.name, record.name, names)
        return True, []

    def _first_groups(self, cmd: FirstGroups) -> MetaResult:
        if self.shard_groups:
            return False, []  # (another member's choice came first: it stands)
        return self._set_groups(SetGroups(cmd.groups))

    def queues_per_group(self) -> dict[str, int]:
        """Group -> how many queue records it holds (queues without a recorded group: none)."""
        counts: dict[str, int] = {}
        for vhost in self.vhosts.values():
            for record in vhost.queues.values():
                if record.group is not None:
                    counts[record.group] = counts.get(record.group, 0) + 1
        return counts

    def feature_enabled(self, name: str) -> bool:
        """Every member of the cluster applies the feature's commands (features.py)."""
        return name in self.features_enabled

    def access_key_secret(self, key_id: str) -> str | None:
        record = self.access_keys.get(key_id)
        return record.secret if record is not None and record.user in self.users else None

    def permission(self, vhost: str, user: str) -> Permission | None:
        v = self.vhosts.get(vhost)
        return v.permissions.get(user) if v else None

    def policy_for(self, vhost: str, queue: str) -> PolicyRecord | None:
        """The policy that applies to a queue: of those whose pattern matches its name (anywhere,
        as RabbitMQ's re:run), the highest priority; ties go to the first name in order."""
        v = self.vhosts.get(vhost)
        if v is None or not v.policies:
            return None
        partition = partitions.parent_of(queue)
        if partition is not None:  # a partition is its parent's: the parent's name is matched
            queue = partition[0]
        best = None
        for name in sorted(v.policies):
            policy = v.policies[name]
            if policy.apply_to == "exchanges" or not policy.regex.matches(queue):
                continue
            if best is None or policy.priority > best.priority:
                best = policy
        return best

    def effective_arguments(self, vhost: str, queue: str) -> Arguments:
        """A queue's arguments as its policies leave them (`arguments_under_policies`)."""
        record = self.queue(vhost, queue)
        return self.arguments_under_policies(vhost, queue, record.arguments if record is not None else {})

    def arguments_under_policies(self, vhost: str, queue: str, own: Arguments) -> Arguments:
        """`own`, a queue's declared arguments, with its policy's beneath them (its own win),
        then its operator policy's limits over both: the lower value wins (rabbit_policy's
        merge). Also for a queue being declared, before its record exists."""
        arguments = dict(own)
        policy = self.policy_for(vhost, queue)
        if policy is not None:
            merged = policy.arguments()
            merged.update(arguments)
            arguments = merged
        operator = self._operator_policy_for(vhost, queue)
        if operator is not None:
            for name, limit in operator.arguments().items():
                current = arguments.get(name)
                arguments[name] = limit if type(current) is not int else min(current, limit)
        if "x-expires" in arguments and (partitions.partition_count(own) > 1 or partitions.parent_of(queue)):
            # A partitioned queue never expires (partitions.py: each partition would, one by one).
            del arguments["x-expires"]
        return arguments

    def _operator_policy_for(self, vhost: str, queue: str) -> PolicyRecord | None:
        v = self.vhosts.get(vhost)
        if v is None or not v.operator_policies:
            return None
        best = None
        for name in sorted(v.operator_policies):
            policy = v.operator_policies[name]
            if policy.regex.matches(queue) and (best is None or policy.priority > best.priority):
                best = policy
        return best

    # ------------------------------------------------------------- bindings

    def _check_binding(self, v: VHost, cmd: Bind | Unbind) -> Rejected | ExchangeRecord:
        if cmd.source == "" or (cmd.to_exchange and cmd.destination == ""):
            return Rejected(403, "operation not permitted on the default exchange")
        source = v.exchanges.get(cmd.source)
        if cmd.to_exchange:
            if cmd.destination not in v.exchanges:
                return Rejected(404, f"no exchange '{cmd.destination}' in vhost '{v.name}'")
        else:
            queue = v.queues.get(cmd.destination)
            if queue is None:
                return Rejected(404, f"no queue '{cmd.destination}' in vhost '{v.name}'")
            if queue.exclusive_owner is not None and queue.exclusive_owner != cmd.owner:
                return _locked(v.name, cmd.destination)
        if source is None:
            return Rejected(404, f"no exchange '{cmd.source}' in vhost '{v.name}'")
        return source

    def _bind(self, cmd: Bind) -> MetaResult:
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        source = self._check_binding(v, cmd)
        if isinstance(source, Rejected):
            return source, []
        error = validate_binding_arguments(source.routing_type, cmd.arguments or {})
        if error:
            return Rejected(406, error), []
        dest = ("e:" if cmd.to_exchange else "q:") + cmd.destination
        args = dict(cmd.arguments or {})
        if source.router.add(dest, cmd.routing_key, args):
            v.bindings_to.setdefault(dest, []).append((cmd.source, cmd.routing_key, args))
        return True, []

    def _unbind(self, cmd: Unbind) -> MetaResult:
        """Idempotent, as RabbitMQ's (rabbit_binding:remove ignores a missing source or
        destination): unbinding what is not bound, from or to what does not exist, succeeds.
        Clients rely on it (aio-pika's RPC unbinds a reply queue its cancel may have removed)."""
        v = self.vhosts.get(cmd.vhost)
        if v is None:
            return Rejected(404, f"no vhost '{cmd.vhost}'"), []
        if cmd.source == "" or (cmd.to_exchange and cmd.destination == ""):
            return Rejected(403, "operation not permitted on the default exchange"), []
        missing = cmd.destination not in (v.exchanges if cmd.to_exchange else v.queues)
        if missing or cmd.source not in v.exchanges:
            return True, []
        source = self._check_binding(v, cmd)
        if isinstance(source, Rejected):  # (an exclusive queue of another connection)
            return source, []
        dest = ("e:" if cmd.to_exchange else "q:") + cmd.destination
        args = dict(cmd.arguments or {})
        if source.router.remove(dest, cmd.routing_key, args):
            self._unindex(v, dest, cmd.source, cmd.routing_key, args)
            self._auto_delete_exchange(v, source)
        return True, []

    def _unindex(self, v: VHost, dest: str, source: str, key: str, args: Arguments) -> None:
        entries = v.bindings_to.get(dest)
        if not entries:
            return
        for i, entry in enumerate(entries):
            if entry[0] == source and entry[1] == key and entry[2] == args:
                del entries[i]
                break
        if not entries:
            del v.bindings_to[dest]

    def _drop_bindings_to(self, v: VHost, dest: str) -> None:
        entries = v.bindings_to.pop(dest, [])
        touched: dict[str, None] = {}
        for source, key, args in entries:
            record = v.exchanges.get(source)
            if record is not None:
                record.router.remove(dest, key, args)
                touched[source] = None
        for source in touched:
            record = v.exchanges.get(source)
            if record is not None:
                self._auto_delete_exchange(v, record)

    def _auto_delete_exchange(self, v: VHost, record: ExchangeRecord) -> None:
        # RabbitMQ: an auto-delete exchange goes when its last binding (as source) is removed.
        if record.auto_delete and not record.builtin and not len(record.router) and record.name in v.exchanges:
            self._remove_exchange(v, record)

    # --------------------------------------------------------------- listing

    def bindings(self, vhost: str) -> list[tuple[str, str, str, str, Arguments]]:
        """(source, destination kind, destination, routing key, arguments) for every binding."""
        out: list[tuple[str, str, str, str, Arguments]] = []
        v = self.vhosts[vhost]
        for record in v.exchanges.values():
            for dest, key, args in record.router.bindings():
                out.append((record.name, "exchange" if dest[0] == "e" else "queue", dest[2:], key, args))
        return out


def _partition_for(records: dict[str, QueueRecord], record: QueueRecord, routing_key: str, headers: Any) -> str:
    """The partition of a partitioned queue that a publish goes to: by its x-partition-key
    header if it has one, else by its routing key (partitions.py). A partition whose record is
    missing (its declare did not finish) is the parent's: the message is kept there."""
    count = partitions.partition_count(record.arguments)
    if count == 1:
        return record.name
    if callable(headers):
        headers = headers()
    key = headers.get(partitions.KEY_HEADER) if isinstance(headers, dict) else None
    if isinstance(key, bytes):
        key_bytes = key
    elif key is not None:
        key_bytes = str(key).encode()
    else:
        key_bytes = routing_key.encode()
    name = partitions.partition_name(record.name, partitions.partition_of_key(key_bytes, count))
    return name if name in records else record.name


def _locked(vhost: str, name: str) -> Rejected:
    return Rejected(
        405,
        f"cannot obtain exclusive access to locked queue '{name}' in vhost '{vhost}'. "
        "It could be originally declared on another connection or the exclusive property value "
        "does not match that of the original declaration.",
    )


def _type_class(value: Any) -> str:
    # rabbit_misc:type_class: every integer width is one class, floats another; the decoded
    # value has lost its width, so only these classes can be told apart here.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, (str, bytes)):
        return "longstr"
    return type(value).__name__


def _check_args(received: Arguments, current: Arguments, keys: tuple[str, ...], where: str) -> Rejected | None:
    """rabbit_misc:assert_args_equivalence over `keys`: the first differing key is a 406."""
    for key in keys:
        got, have = received.get(key), current.get(key)
        if isinstance(got, bytes):
            got = got.decode("utf-8", "replace")
        if isinstance(have, bytes):
            have = have.decode("utf-8", "replace")
        if key == "x-queue-type" and {got, have} <= {None, "classic"}:
            # rabbit_misc:assert_field_equivalence special-cases a classic queue declared with
            # or without x-queue-type (rabbitmq-common#341).
            continue
        if got is None and have is None:
            continue
        if key == partitions.ARGUMENT and got is None:
            continue  # (a partitions policy may have given the count: a redeclare need not repeat it)
        if got is not None and have is not None:
            if _type_class(got) == _type_class(have) and got == have:
                continue
            # Both present: the bare values are shown, as val(Value) formats them.
            return Rejected(
                406,
                f"inequivalent arg '{key}' {where}: received '{_erlang_text(got)}' "
                f"but current is '{_erlang_text(have)}'",
            )
        return Rejected(
            406, f"inequivalent arg '{key}' {where}: received {_value_text(got)} but current is {_value_text(have)}"
        )
    return None


def _erlang_text(value: Any) -> str:
    # ~ts / ~tp of the Erlang value: booleans are the atoms true/false.
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def policy_record(cmd: SetPolicy | SetOperatorPolicy) -> PolicyRecord | Rejected:
    """The policy `cmd` sets, or why it is refused (406, RabbitMQ's "Validation failed" texts).
    Pure: the admin API runs it before proposing, so nothing it refuses reaches the log; the
    machine runs it again on apply (and on replay), where it decides."""
    if type(cmd.name) is not str or not cmd.name or type(cmd.pattern) is not str:
        return Rejected(406, "Validation failed\n\na policy needs a name and a pattern")
    if type(cmd.priority) is not int or isinstance(cmd.priority, bool):
        return Rejected(406, f"Validation failed\n\npriority {cmd.priority!r} is not an integer")
    if cmd.apply_to not in POLICY_APPLY_TO:
        return Rejected(406, f"Validation failed\n\n'{cmd.apply_to}' is not a valid apply-to value")
    try:
        regex = compile_pattern(cmd.pattern)  # linear-time matching (policy_pattern.py)
    except PatternError as exc:
        return Rejected(406, f"Validation failed\n\n{exc}")
    definition = cmd.definition
    if not isinstance(definition, dict) or not definition:
        return Rejected(406, "Validation failed\n\na policy needs a non-empty definition")
    unknown = sorted(key for key in definition if key not in POLICY_KEYS)
    if unknown:
        return Rejected(406, f"Validation failed\n\n{unknown} are not recognised policy settings")
    record = PolicyRecord(cmd.name, cmd.pattern, dict(definition), cmd.priority, cmd.apply_to, regex)
    try:
        validate_queue_arguments(cmd.vhost, cmd.name, record.arguments())
    except QueueArgumentError as exc:
        return Rejected(406, f"Validation failed\n\n{exc.reply_text}")
    return record


def operator_policy_record(cmd: SetOperatorPolicy) -> PolicyRecord | Rejected:
    """The operator policy `cmd` sets, or why it is refused: a policy's checks, then only
    OPERATOR_POLICY_KEYS, integers all, and only for queues. Pure, as policy_record."""
    if cmd.apply_to != "queues":
        return Rejected(406, f"Validation failed\n\n'{cmd.apply_to}' is not a valid apply-to value (queues)")
    definition = cmd.definition
    if isinstance(definition, dict):
        unknown = sorted(key for key in definition if key not in OPERATOR_POLICY_KEYS)
        if unknown:
            return Rejected(406, f"Validation failed\n\n{unknown} are not recognised operator policy settings")
        for key, value in definition.items():
            if type(value) is not int or value < 0:
                return Rejected(406, f"Validation failed\n\n{key} must be a non-negative integer, not {value!r}")
    return policy_record(cmd)


def access_refusal(cmd: Any) -> Rejected | None:
    """Why a user, vhost, permission or limits command is refused (400-class, before anything
    is proposed, and again on apply), or None. Pure."""
    try:
        kind = type(cmd)
        if kind is PutUser:
            access.check_name(cmd.name, "user")
            access.check_hash(cmd.password_hash, cmd.hashing_algorithm)
            access.check_tags(cmd.tags)
        elif kind is SeedDefaultUser:
            access.check_name(cmd.name, "user")
            access.check_hash(cmd.password_hash, access.SHA256)
        elif kind is PutVhost:
            access.check_name(cmd.name, "vhost")
        elif kind is PutAccessKey:
            access.check_name(cmd.user, "user")
            access.check_access_key(cmd.key_id, cmd.secret)
        elif kind is DeleteAccessKey:
            if type(cmd.key_id) is not str:
                raise AccessError("an access key id is a string")
        elif kind is SetPermissions:
            access.check_patterns(cmd.configure, cmd.write, cmd.read)
        elif kind is SetTopicPermissions:
            if type(cmd.exchange) is not str:
                raise AccessError("the exchange must be a string")
            access.check_patterns(cmd.write, cmd.read)
        elif kind is SetLimits:
            if cmd.kind not in ("vhost", "user"):
                raise AccessError(f"unknown kind of limits {cmd.kind!r}")
            known = access.VHOST_LIMITS if cmd.kind == "vhost" else access.USER_LIMITS
            if access.check_limits(cmd.limits, known, cmd.kind) != cmd.limits:
                raise AccessError("negative limits are cleared, not stored: leave them out")
    except AccessError as exc:
        return Rejected(400, str(exc))
    return None
