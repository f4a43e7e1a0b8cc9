"""RabbitMQ's definitions document: the metadata machine exported to it, and a document checked
and turned into the metadata commands that import it. Pure: no I/O, no broker.

The shape is RabbitMQ 3.10's management export (rabbit_mgmt_wm_definitions): `rabbit_version`,
`rabbitmq_version`, `product_name`, `product_version`, then lists of `users` (name,
password_hash, hashing_algorithm, tags as a list, limits), `vhosts` (name), `permissions`,
`topic_permissions`, `parameters` (vhost, component, name, value), `global_parameters`,
`policies`, `queues` (name, vhost, durable, auto_delete, arguments), `exchanges` (name, vhost,
type, durable, auto_delete, internal, arguments) and `bindings` (source, vhost, destination,
destination_type, routing_key, arguments). As RabbitMQ:

- every queue but exclusive ones is exported (transient ones too), every exchange but the
  default one and the `amq.*` ones; a binding when its source is not the default exchange and
  its destination is an exported queue or any exchange but the default one;
- a vhost's limits are a runtime parameter, component `vhost-limits`, name `limits`;
- the per-vhost export has no users, vhosts or permissions, and its queues, exchanges and
  bindings carry no `vhost` (the vhost is the one in the path).

Import reads the same, tolerating keys it does not know (RabbitMQ ignores them too), tags as a
list or as RabbitMQ 3.8's comma-separated string, a clear `password` instead of a hash, and
newer exports' queue `type`. Queues and exchanges named `amq.*`, and the default exchange, are
skipped (RabbitMQ logs a warning and goes on); so are bindings to a skipped queue (RabbitMQ
would fail on them, which makes its own export of such a queue unimportable). Global parameters
(`cluster_name`, ...) mean nothing here and are ignored; a runtime parameter of any component
but `vhost-limits` (a shovel, a federation upstream) is refused, as RabbitMQ refuses one whose
plugin is not enabled.

`import_commands` checks the whole document before it answers: every item's types, then every
command with the checks the admin API runs (`metadata.access_refusal`, `metadata.policy_record`,
queue arguments, `persistence.unstorable`), then a dry run of all of them, in order, on a
replica of the current state. So a document with a bad item, or one that contradicts what is
already there (a queue redeclared with other arguments: RabbitMQ's import fails on it with the
same 406 text, after applying what came before), is refused whole, naming the first bad item,
and nothing is proposed. Redeclaring what is there as it is changes nothing; users, permissions,
policies and limits are replaced, as RabbitMQ's import replaces them.

The order is RabbitMQ's: users, vhosts, permissions, topic permissions, then vhost limits
(RabbitMQ applies parameters before queues, so `max-queues` holds for imported queues),
exchanges, policies, queues, bindings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from ..machines import access, partitions
from ..machines import metadata as md
from ..machines.queue_args import SUPPORTED_QUEUE_TYPES, QueueArgumentError, validate_queue_arguments
from ..machines.queue_types import Rejected
from ..server.persistence import unstorable

# The RabbitMQ release whose format this follows. RabbitMQ reads `rabbit_version` only to pick the
# hashing of a user that names none (MD5 before 3.6.0); every user exported here names one.
RABBITMQ_FORMAT_VERSION = "3.10.0"
PRODUCT_NAME = "MaxQ-Raft"
VHOST_LIMITS_COMPONENT = "vhost-limits"
VHOST_LIMITS_NAME = "limits"
NAME_BYTES_MAX = 255  # queue and exchange names are AMQP short strings
SHA256_SINCE = (3, 6, 0)  # rabbit_password:hashing_mod/1: MD5 for older definitions


class DefinitionsError(ValueError):
    """Why a document is refused: the first bad item, named as `queues[3] (queue 'q' in vhost
    '/')`, and what is wrong with it."""


class Step(NamedTuple):
    """A command of the import and the item it comes from (for messages)."""

    where: str
    command: Any


# -------------------------------------------------------------------------------- export


def json_value(value: Any) -> Any:
    """An argument's value as JSON: AMQP long strings may be bytes; decimals and timestamps
    have no JSON type (RabbitMQ writes them as numbers and strings too)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    try:
        return float(value)  # Decimal
    except (TypeError, ValueError):
        return str(value)


def _header(version: str) -> dict[str, Any]:
    return {
        "rabbit_version": RABBITMQ_FORMAT_VERSION,
        "rabbitmq_version": RABBITMQ_FORMAT_VERSION,
        "product_name": PRODUCT_NAME,
        "product_version": version,
    }


def _vhost_parts(meta: md.MetadataMachine, name: str) -> dict[str, list[dict[str, Any]]]:
    v = meta.vhosts[name]
    parameters = []
    if v.limits:
        parameters.append(
            {"vhost": name, "component": VHOST_LIMITS_COMPONENT, "name": VHOST_LIMITS_NAME, "value": dict(v.limits)}
        )
    policies = [
        {
            "vhost": name,
            "name": p.name,
            "pattern": p.pattern,
            "apply-to": p.apply_to,
            "definition": json_value(p.definition),
            "priority": p.priority,
        }
        for p in v.policies.values()
    ]
    queues = [
        {
            "name": q.name,
            "vhost": name,
            "durable": q.durable,
            "auto_delete": q.auto_delete,
            "arguments": json_value(q.arguments),
        }
        for q in v.queues.values()
        # an exclusive queue dies with its connection: nothing to restore; a partition is its
        # queue's (machines/partitions.py): declaring that makes it again
        if q.exclusive_owner is None and partitions.parent_of(q.name) is None
    ]
    exchanges = [
        {
            "name": x.name,
            "vhost": name,
            "type": x.type,
            "durable": x.durable,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": json_value(x.arguments),
        }
        for x in v.exchanges.values()
        if not x.builtin and x.name and not x.name.startswith("amq.")
    ]
    exported_queues = {q["name"] for q in queues}
    bindings = [
        {
            "source": source,
            "vhost": name,
            "destination": dest,
            "destination_type": kind,
            "routing_key": key,
            "arguments": json_value(args),
        }
        for source, kind, dest, key, args in meta.bindings(name)
        if source and (dest in exported_queues if kind == "queue" else dest != "")
    ]
    return {
        "parameters": parameters,
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


def export_definitions(meta: md.MetadataMachine, version: str) -> dict[str, Any]:
    """Every vhost's definitions, with users and permissions (GET /api/definitions)."""
    doc: dict[str, Any] = _header(version)
    doc["users"] = [
        {
            "name": u.name,
            "password_hash": u.password_hash,
            "hashing_algorithm": u.hashing_algorithm,
            "tags": list(u.tags),
            "limits": dict(u.limits),
        }
        for u in meta.users.values()
    ]
    doc["vhosts"] = [{"name": name} for name in meta.vhosts]
    doc["permissions"] = [
        {"user": user, "vhost": name, "configure": p.configure, "write": p.write, "read": p.read}
        for name, v in meta.vhosts.items()
        for user, p in v.permissions.items()
    ]
    doc["topic_permissions"] = [
        {"user": user, "vhost": name, "exchange": exchange, "write": t.write, "read": t.read}
        for name, v in meta.vhosts.items()
        for user, by_exchange in v.topic_permissions.items()
        for exchange, t in by_exchange.items()
    ]
    parts = [_vhost_parts(meta, name) for name in meta.vhosts]
    doc["parameters"] = [item for p in parts for item in p["parameters"]]
    doc["global_parameters"] = []
    for key in ("policies", "queues", "exchanges", "bindings"):
        doc[key] = [item for p in parts for item in p[key]]
    return doc


def export_vhost_definitions(meta: md.MetadataMachine, vhost: str, version: str) -> dict[str, Any]:
    """One vhost's definitions (GET /api/definitions/{vhost}); KeyError for no such vhost.
    As RabbitMQ 3.10: queues, exchanges and bindings lose their `vhost`; parameters and
    policies keep it."""
    parts = _vhost_parts(meta, vhost)
    doc: dict[str, Any] = _header(version)
    doc["parameters"] = parts["parameters"]
    doc["policies"] = parts["policies"]
    for key in ("queues", "exchanges", "bindings"):
        doc[key] = [{k: v for k, v in item.items() if k != "vhost"} for item in parts[key]]
    return doc


# -------------------------------------------------------------------------------- import

_MISSING = object()


class _Item:
    """One item of a category, read with its position in every message."""

    def __init__(self, where: str, value: Any) -> None:
        if not isinstance(value, dict):
            raise DefinitionsError(f"{where}: an item must be a JSON object, got {type(value).__name__}")
        self.where = where
        self.value = value

    def fail(self, why: str) -> DefinitionsError:
        return DefinitionsError(f"{self.where}: {why}")

    def text(self, key: str, default: Any = _MISSING) -> str:
        value = self.value.get(key, default)
        if value is _MISSING:
            raise self.fail(f"'{key}' is missing")
        if type(value) is not str:
            raise self.fail(f"'{key}' must be a string, got {json_type(value)}")
        return value

    def name(self, key: str = "name") -> str:
        value = self.text(key)
        if len(value.encode("utf-8", "surrogatepass")) > NAME_BYTES_MAX:
            raise self.fail(f"'{key}' is longer than {NAME_BYTES_MAX} bytes")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.value.get(key)
        if value is None:
            return default
        if type(value) is not bool:
            raise self.fail(f"'{key}' must be true or false, got {json_type(value)}")
        return value

    def table(self, key: str = "arguments") -> dict[str, Any]:
        value = self.value.get(key)
        if value is None or value == []:  # RabbitMQ writes an empty proplist as []
            return {}
        if not isinstance(value, dict):
            raise self.fail(f"'{key}' must be a JSON object, got {json_type(value)}")
        return dict(value)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _items(document: dict[str, Any], key: str) -> Iterable[_Item]:
    value = document.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise DefinitionsError(f"'{key}' must be an array, got {json_type(value)}")
    return [_Item(f"{key}[{i}]", item) for i, item in enumerate(value)]


def _version(document: dict[str, Any]) -> tuple[int, ...] | None:
    text = document.get("rabbitmq_version", document.get("rabbit_version"))
    if not isinstance(text, str):
        return None
    numbers = []
    for part in text.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())  # "3.10.0-rc.1", "3.6.1"
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers) or None


def parse_tags(value: Any) -> list[str] | None:
    """RabbitMQ's tags: a list of strings (3.9+) or "a,b" (earlier); None if neither."""
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(type(t) is str for t in value):
        return [t.strip() for t in value if t.strip()]
    return None


def _limits(item: _Item, key: str, known: tuple[str, ...], kind: str) -> dict[str, int]:
    value = item.value.get(key)
    if value is None or value == []:
        return {}
    if isinstance(value, list):
        # RabbitMQ 3.10's export_definitions writes vhosts[].limits as [[name, value], ...]
        if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in value):
            raise item.fail(f"{kind} limits must be a JSON object or a list of [name, value] pairs")
        value = dict((pair[0], pair[1]) for pair in value)
    try:
        return access.check_limits(value, known, kind)  # negative values: no limit, left out
    except access.AccessError as exc:
        raise item.fail(str(exc)) from None


def _user_steps(item: _Item, version: tuple[int, ...] | None, hash_password: Callable[[str], str]) -> list[Step]:
    name = item.text("name")
    where = f"{item.where} (user '{name}')"
    tags = parse_tags(item.value.get("tags"))
    if tags is None:
        raise DefinitionsError(f"{where}: 'tags' must be a comma-separated string or a list of strings")
    if "password_hash" in item.value:
        password_hash = item.text("password_hash")
        default = access.MD5 if version is not None and version < SHA256_SINCE else access.SHA256
        algorithm = item.text("hashing_algorithm", default)
    elif "password" in item.value:
        password = item.text("password")
        try:
            password.encode("utf-8")
        except UnicodeEncodeError:
            raise DefinitionsError(f"{where}: the password is not valid Unicode") from None
        password_hash, algorithm = hash_password(password), access.SHA256
    else:
        raise DefinitionsError(f"{where}: a user needs 'password_hash' (or 'password')")
    steps = [Step(where, md.PutUser(name, password_hash, algorithm, tags))]
    limits = _limits(item, "limits", access.USER_LIMITS, "user")
    if limits:
        steps.append(Step(where, md.SetLimits("user", name, limits)))
    return steps


def _in(item: _Item, vhost: str | None) -> str:
    """The item's vhost: the one in the path of a per-vhost import, else its own."""
    return vhost if vhost is not None else item.text("vhost")


def _parameter_step(item: _Item, vhost: str | None) -> Step:
    component = item.text("component")
    v = _in(item, vhost)
    where = f"{item.where} (parameter '{component}' in vhost '{v}')"
    if component != VHOST_LIMITS_COMPONENT:
        raise DefinitionsError(
            f"{where}: runtime parameters of component '{component}' are not supported here "
            f"(only '{VHOST_LIMITS_COMPONENT}')"
        )
    item.text("name", VHOST_LIMITS_NAME)
    limits = _limits(_Item(where, {"value": item.value.get("value")}), "value", access.VHOST_LIMITS, "vhost")
    return Step(where, md.SetLimits("vhost", v, limits))


def _policy_step(item: _Item, vhost: str | None) -> Step:
    name, v = item.text("name"), _in(item, vhost)
    priority = item.value.get("priority")
    definition: Any = item.value.get("definition")  # checked with the command (metadata.policy_record)
    command = md.SetPolicy(
        v,
        name,
        item.text("pattern"),
        definition,
        0 if priority is None else priority,
        item.text("apply-to", "all"),
    )
    return Step(f"{item.where} (policy '{name}' in vhost '{v}')", command)


def _queue_step(item: _Item, vhost: str | None) -> Step | None:
    name, v = item.name(), _in(item, vhost)
    where = f"{item.where} (queue '{name}' in vhost '{v}')"
    if name == "":
        raise DefinitionsError(f"{where}: a queue needs a name")
    if name.startswith("amq."):
        return None  # RabbitMQ skips these (server-named, or reserved)
    arguments = item.table()
    kind = item.value.get("type")  # newer exports: "classic", "quorum", "stream"
    if isinstance(kind, str) and kind != "classic" and "x-queue-type" not in arguments:
        arguments["x-queue-type"] = kind
    queue_type = arguments.get("x-queue-type")
    if queue_type is not None and queue_type not in SUPPORTED_QUEUE_TYPES:
        raise DefinitionsError(
            f"{where}: invalid arg 'x-queue-type' for queue '{name}' in vhost '{v}': "
            f"'{queue_type}' is not supported (use classic or quorum)"
        )
    try:
        validate_queue_arguments(v, name, arguments)
    except QueueArgumentError as exc:
        raise DefinitionsError(f"{where}: {exc.reply_text}") from None
    durable, auto_delete = item.flag("durable", True), item.flag("auto_delete", False)
    refusal = partitions.declare_refusal(name, partitions.partition_count(arguments), False, auto_delete, arguments)
    if refusal is not None:
        raise DefinitionsError(f"{where}: invalid arg 'x-partitions' for queue '{name}' in vhost '{v}': {refusal}")
    return Step(where, md.DeclareQueue(v, name, False, durable, False, auto_delete, arguments, ""))


def queue_declaration(vhost: str, name: str, body: dict[str, Any]) -> md.DeclareQueue:
    """`PUT /api/queues/{vhost}/{name}`'s body (durable, auto_delete, arguments; RabbitMQ's) as
    the command that declares it, checked as an imported queue is; DefinitionsError if bad."""
    body = _booleans({**body, "name": name, "vhost": vhost}, "durable", "auto_delete")
    step = _queue_step(_Item("request body", body), None)
    if step is None:
        raise DefinitionsError(f"queue name '{name}' contains reserved prefix 'amq.*'")
    command: md.DeclareQueue = step.command
    return command


def _booleans(body: dict[str, Any], *flags: str) -> dict[str, Any]:
    body = dict(body)
    for flag in flags:  # rabbitmqadmin sends them as "true" / "false"
        if body.get(flag) in ("true", "false"):
            body[flag] = body[flag] == "true"
    return body


def exchange_declaration(vhost: str, name: str, body: dict[str, Any]) -> md.DeclareExchange:
    """`PUT /api/exchanges/{vhost}/{name}`'s body (type, default direct as RabbitMQ's; durable,
    auto_delete, internal, arguments) as the command that declares it; DefinitionsError if bad."""
    body = _booleans({"type": "direct", **body, "name": name, "vhost": vhost}, "durable", "auto_delete", "internal")
    step = _exchange_step(_Item("request body", body), None)
    if step is None:
        raise DefinitionsError(f"exchange name '{name}' is reserved")
    command: md.DeclareExchange = step.command
    return command


def binding_declaration(vhost: str, source: str, destination: str, to_exchange: bool, body: dict[str, Any]) -> md.Bind:
    """`POST /api/bindings/{vhost}/e/{source}/{q|e}/{destination}`'s body (routing_key,
    arguments) as the command that binds; DefinitionsError if bad."""
    item = _Item("request body", body)
    return md.Bind(vhost, source, destination, to_exchange, item.text("routing_key", ""), item.table(), "")


def _exchange_step(item: _Item, vhost: str | None) -> Step | None:
    name, v = item.name(), _in(item, vhost)
    if name == "" or name.startswith("amq."):
        return None  # RabbitMQ skips the default exchange and the amq.* ones
    command = md.DeclareExchange(
        v,
        name,
        item.text("type"),
        False,
        item.flag("durable", True),
        item.flag("auto_delete", False),
        item.flag("internal", False),
        item.table(),
    )
    return Step(f"{item.where} (exchange '{name}' in vhost '{v}')", command)


def _binding_step(item: _Item, vhost: str | None) -> Step | None:
    source, destination, v = item.text("source"), item.text("destination"), _in(item, vhost)
    kind = item.text("destination_type")
    if kind not in ("queue", "exchange"):
        raise item.fail(f"'destination_type' must be 'queue' or 'exchange', got '{kind}'")
    if source == "" or (kind == "queue" and destination.startswith("amq.")):
        return None  # the default exchange's bindings are implicit; amq.* queues are not imported
    where = f"{item.where} (binding of {kind} '{destination}' to exchange '{source}' in vhost '{v}')"
    command = md.Bind(v, source, destination, kind == "exchange", item.text("routing_key", ""), item.table(), "")
    return Step(where, command)


def _refusal(command: Any) -> str | None:
    """The admin API's own checks, before anything is proposed."""
    refused = md.access_refusal(command)
    if refused is None and type(command) is md.SetPolicy:
        record = md.policy_record(command)
        refused = record if isinstance(record, Rejected) else None
    refused = refused or unstorable(command)
    return refused.reply_text if refused else None


def import_steps(
    document: Any,
    current: md.MetadataMachine | None = None,
    vhost: str | None = None,
    hash_password: Callable[[str], str] = access.hash_password,
) -> list[Step]:
    """The steps that import `document` onto `current` (a fresh machine if None), in order; or
    DefinitionsError naming the first bad item. With `vhost` (POST /api/definitions/{vhost}),
    only the vhost's parameters, policies, queues, exchanges and bindings are read, all into it.
    `current` is only read."""
    if not isinstance(document, dict):
        raise DefinitionsError(f"a definitions document is a JSON object, got {json_type(document)}")
    steps: list[Step] = []
    if vhost is None:
        version = _version(document)
        for item in _items(document, "users"):
            steps.extend(_user_steps(item, version, hash_password))
        for item in _items(document, "vhosts"):
            name = item.text("name")
            steps.append(Step(f"{item.where} (vhost '{name}')", md.PutVhost(name)))
            limits = _limits(item, "limits", access.VHOST_LIMITS, "vhost")  # newer exports carry them here too
            if limits:
                steps.append(Step(f"{item.where} (vhost '{name}')", md.SetLimits("vhost", name, limits)))
        for item in _items(document, "permissions"):
            user, v = item.text("user"), item.text("vhost")
            permissions = md.SetPermissions(v, user, item.text("configure"), item.text("write"), item.text("read"))
            steps.append(Step(f"{item.where} (permissions of user '{user}' in vhost '{v}')", permissions))
        for item in _items(document, "topic_permissions"):
            user, v = item.text("user"), item.text("vhost")
            exchange = item.text("exchange")
            topic = md.SetTopicPermissions(v, user, exchange, item.text("write"), item.text("read"))
            steps.append(Step(f"{item.where} (topic permissions of user '{user}' in vhost '{v}')", topic))
        for item in _items(document, "global_parameters"):
            item.text("name")  # cluster_name and the like: nothing here to set
    for item in _items(document, "parameters"):
        steps.append(_parameter_step(item, vhost))
    readers: tuple[tuple[str, Callable[[_Item, str | None], Step | None]], ...] = (
        ("exchanges", _exchange_step),
        ("policies", _policy_step),
        ("queues", _queue_step),
        ("bindings", _binding_step),
    )
    for category, read in readers:
        for item in _items(document, category):
            step = read(item, vhost)
            if step is not None:
                steps.append(step)
    for step in steps:
        why = _refusal(step.command)
        if why:
            raise DefinitionsError(f"{step.where}: {why}")
    dry_run(steps, current)
    return steps


def import_commands(document: Any, current: md.MetadataMachine | None = None, vhost: str | None = None) -> list[Any]:
    """The metadata commands that import `document`, in order (see `import_steps`)."""
    return [step.command for step in import_steps(document, current, vhost)]


# ------------------------------------------------------------------------------ dry run


def replica_commands(meta: md.MetadataMachine) -> list[Any]:
    """Commands that rebuild `meta`'s users, vhosts, permissions, limits, policies, exchanges,
    queues (exclusive ones with their owner) and bindings on a fresh machine."""
    out: list[Any] = []
    for u in meta.users.values():
        out.append(md.PutUser(u.name, u.password_hash, u.hashing_algorithm, list(u.tags)))
        if u.limits:
            out.append(md.SetLimits("user", u.name, dict(u.limits)))
    for name, v in meta.vhosts.items():
        out.append(md.PutVhost(name))
        for user, p in v.permissions.items():
            out.append(md.SetPermissions(name, user, p.configure, p.write, p.read))
        for user, by_exchange in v.topic_permissions.items():
            for exchange, t in by_exchange.items():
                out.append(md.SetTopicPermissions(name, user, exchange, t.write, t.read))
        for x in v.exchanges.values():
            if not x.builtin:
                out.append(
                    md.DeclareExchange(name, x.name, x.type, False, x.durable, x.auto_delete, x.internal, x.arguments)
                )
        for policy in v.policies.values():
            out.append(
                md.SetPolicy(name, policy.name, policy.pattern, policy.definition, policy.priority, policy.apply_to)
            )
        for q in v.queues.values():
            owner = q.exclusive_owner
            out.append(
                md.DeclareQueue(
                    name, q.name, False, q.durable, owner is not None, q.auto_delete, q.arguments, owner or ""
                )
            )
        for source, kind, dest, key, args in meta.bindings(name):
            owner = ""
            if kind == "queue":
                record = v.queues.get(dest)
                owner = (record.exclusive_owner if record else None) or ""
            out.append(md.Bind(name, source, dest, kind == "exchange", key, args, owner))
        if v.limits:  # last: max-queues does not refuse the queues already there
            out.append(md.SetLimits("vhost", name, dict(v.limits)))
    fresh = md.MetadataMachine()  # what the replica starts with and `meta` may no longer have
    for name, v in fresh.vhosts.items():
        if name in meta.vhosts:
            out.extend(md.ClearPermissions(name, u) for u in v.permissions if u not in meta.vhosts[name].permissions)
    out.extend(md.DeleteUser(name) for name in fresh.users if name not in meta.users)
    out.extend(md.DeleteVhost(name) for name in fresh.vhosts if name not in meta.vhosts)
    return out


def dry_run(steps: list[Step], current: md.MetadataMachine | None = None) -> None:
    """Apply the steps to a replica of `current` (or a fresh machine): DefinitionsError at the
    first the machine refuses, naming its item."""
    replica = md.MetadataMachine()
    if current is not None:
        for command in replica_commands(current):
            replica.apply(None, command)  # type: ignore[arg-type]  # (the metadata machine reads no Meta)
    for step in steps:
        reply, _effects = replica.apply(None, step.command)  # type: ignore[arg-type]
        if type(reply) is Rejected:
            raise DefinitionsError(f"{step.where}: {reply.reply_text}")
