"""The management API's object routes (queues, exchanges, bindings): list per vhost, show,
declare, delete, purge, bind and unbind, as RabbitMQ 3.10 answers them (codes, bodies and
reasons read side by side from its plugin).

Theory of operation: a handler checks, in RabbitMQ's order, that the vhost exists (404), that
the caller may use it and the object (the same permissions as over AMQP, `Authorization`: a
declare or delete needs configure, a purge read, a binding write on its destination and read on
its source; 401 "Access refused." otherwise, as RabbitMQ),
and then does what a channel would: a declare is committed like `queue.declare` (its record,
with the queue's machine made in its shard), a delete goes through `Broker.delete_queue`, a purge
is the queue's own `Purge` command. Each waits, bounded, for its reply (requests.wait_for_reply).
Bodies are RabbitMQ's: `{"durable", "auto_delete", "arguments"}`, checked as an imported queue
is (definitions.py), so a bad argument is a 400 that names it and nothing is proposed.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import quote

import trio

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.partitions import parent_of
from ..server.authorization import Authorization
from ..server.errors import ChannelError
from ..server.message_rates import exchange_counts, queue_counts
from ..server.partitioned import held_elsewhere, partition_keys, ready_count
from ..server.queue_stats import QueueStats
from . import auth, definitions, fresh_stats
from .metrics import QUEUE_TYPE
from .requests import HttpError, NotFoundHere, Reply, Request, commit, json_safe, wait_for_reply


# A new exception each time: raising one kept instance again would chain each raise's traceback
# (and the frames, requests and bodies it holds) onto the last one's, growing without bound.
def not_found() -> HttpError:
    return NotFoundHere("404 Not Found", "Object Not Found", reason="Not Found")


def vhost_not_found() -> HttpError:
    return NotFoundHere("404 Not Found", "not_found", reason="vhost_not_found")


ACCESS_REFUSED = "Access refused."


def queue_view(broker: Any, vhost: str, name: str, queue: Any) -> dict:
    """A queue as RabbitMQ's management API shows it; `queue` its machine here, or the counts its
    group's leader sent (server/queue_stats.py: a group held elsewhere)."""
    record = broker.meta.queue(vhost, name)
    keys = partition_keys(broker, vhost, name)
    stats = queue if type(queue) is QueueStats else QueueStats.of(broker.node_id, queue)
    ready, unacked = stats.ready_count, stats.unacked_count
    if len(keys) > 1:  # a partitioned queue (machines/partitions.py) counts every partition's
        machines = [broker.shown_queue(key) for key in keys]
        ready = sum(m.ready_count for m in machines if m is not None)
        unacked = sum(m.unacked_count for m in machines if m is not None)
    partition = parent_of(name)
    group = broker.log.group_of((vhost, name))
    leader = broker.log.group_leader(group)
    return {
        "vhost": vhost,
        "name": name,
        "durable": bool(record and record.durable),
        "exclusive": bool(record and record.exclusive_owner),
        "auto_delete": bool(record and record.auto_delete),
        "arguments": json_safe(record.arguments if record else {}),
        "type": QUEUE_TYPE,
        "state": "running",
        # RabbitMQ's quorum queue: `node` and `leader` name its leader (clients such as Spring's
        # LocalizedQueueConnectionFactory connect there), `members` its replicas. Here they are
        # its group's: a client on the leader is served without a forward.
        "node": leader or stats.node or broker.node_id,
        "leader": leader,
        "members": broker.log.group_members(group),
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "group": group,  # its shard group (machines/placement.py)
        "partitions": len(keys),  # x-partitions: 1 unless partitioned (then 1.. are amq.partition-<i>.<name>)
        "partition_of": None if partition is None else partition[0],
        "consumers": stats.active_consumer_count,
        # consumer pauses (issue #20): how many attached consumers are paused, and by which rules
        "paused_consumers": stats.paused_consumer_count,
        "consumer_pauses": [{"scope": scope, "key": key} for scope, key in stats.pause_rules],
        # transactional half messages (issue #21): stored, not yet in `messages` (none is deliverable)
        "messages_half": stats.txn_messages,
        "transactions_open": stats.txns_open,
        "trace": stats.trace,  # x-trace (server/tracer.py), by argument or policy
        # (rates since this node made the queue's machine or had its counts: message_rates.KeyedRates)
        "message_stats": broker.queue_rates.message_stats(trio.current_time(), (vhost, name), queue_counts(stats)),
    }


def _vhost(
    broker: Any, request: Request, missing: Callable[[], HttpError] = not_found, vhost_param: str = "vhost"
) -> str:
    vhost = request.params[vhost_param]
    if vhost not in broker.meta.vhosts:
        raise missing()
    return vhost


def _may(broker: Any, request: Request, vhost: str, kind: str, resource_type: str, name: str) -> None:
    """The caller's AMQP permission `kind` on the queue or exchange `name` (auth.Forbidden, as
    RabbitMQ's 401); names of the server's own (amq.*, the default exchange) are refused alike."""
    caller = request.caller
    if caller is None:
        raise auth.Forbidden("Not management user")
    if broker.meta.permission(vhost, caller.name) is None:
        raise auth.Forbidden("User not authorised to access virtual host")
    if name.startswith("amq.") or (resource_type == "exchange" and name == ""):
        raise auth.Forbidden(ACCESS_REFUSED)
    try:
        Authorization(broker, caller.name, vhost).check(kind, resource_type, name)
    except ChannelError:
        raise auth.Forbidden(ACCESS_REFUSED) from None


def readable_vhost(broker: Any, request: Request, vhost_param: str = "vhost") -> str:
    """The vhost in the path, if it exists (404) and the caller may see it (401)."""
    vhost = _vhost(broker, request, vhost_param=vhost_param)
    if request.caller is not None and vhost not in request.caller.vhosts(broker.meta):
        raise auth.Forbidden("User not authorised to access virtual host")
    return vhost


async def list_queues(broker: Any, vhost: str | None = None) -> list:
    """Every queue (of `vhost`) as `queue_view` shows it, those of groups held elsewhere with
    their leaders' counts of now (http/fresh_stats.py)."""
    await fresh_stats.refresh(broker, [key for key, _ in broker.shown_queues(vhost)])
    return [queue_view(broker, v, name, queue) for (v, name), queue in broker.shown_queues(vhost)]


async def list_in_vhost(broker: Any, request: Request) -> list:
    return await list_queues(broker, readable_vhost(broker, request))


async def get_queue(broker: Any, request: Request) -> dict:
    vhost, name = readable_vhost(broker, request), request.params["name"]
    if broker.meta.queue(vhost, name) is not None:
        await fresh_stats.refresh(broker, partition_keys(broker, vhost, name))
    queue = broker.shown_queue((vhost, name))
    if queue is None or broker.meta.queue(vhost, name) is None:
        raise not_found()
    return queue_view(broker, vhost, name, queue)


async def _declare(
    broker: Any,
    request: Request,
    resource_type: str,
    name: str,
    declaration: Callable[[str, str, dict], Any],
    lookup: Callable[[str, str], Any],
) -> Reply:
    """PUT of a queue or exchange: 201 when new, 204 when it existed alike, 400 otherwise."""
    vhost = _vhost(broker, request, vhost_not_found)
    _may(broker, request, vhost, "configure", resource_type, name)
    try:
        command = declaration(vhost, name, request.json())
    except definitions.DefinitionsError as exc:
        raise HttpError("400 Bad Request", "bad_request", reason=str(exc)) from None
    existed = lookup(vhost, name) is not None
    await _bad_request_as_rabbitmq(commit(broker, command))
    return Reply("204 No Content" if existed else "201 Created")


async def _bad_request_as_rabbitmq(change: Any) -> Any:
    """Await a commit; its 400 answered with RabbitMQ's body (error bad_request, the reason)."""
    try:
        return await change
    except HttpError as exc:
        if exc.status.startswith("400"):
            raise HttpError(exc.status, "bad_request", reason=str(exc)) from None
        raise


async def put_queue(broker: Any, request: Request) -> Reply:
    name = request.params["name"]
    return await _declare(broker, request, "queue", name, definitions.queue_declaration, broker.meta.queue)


def _existing(broker: Any, request: Request, kind: str) -> tuple[str, str]:
    vhost, name = _vhost(broker, request), request.params["name"]
    _may(broker, request, vhost, kind, "queue", name)
    if broker.meta.queue(vhost, name) is None:
        raise not_found()
    return vhost, name


async def delete_queue(broker: Any, request: Request) -> Reply:
    vhost, name = _existing(broker, request, "configure")
    # A partitioned queue's delete, purge and pause act on every partition (machines/partitions.py);
    # a partition alone never comes here: its amq. name is refused first (401, as RabbitMQ's).
    keys = partition_keys(broker, vhost, name)
    query = request.query
    if query.get("if-unused") == ["true"] or query.get("if-empty") == ["true"]:
        # The checks read counts as of a commit: those of a group held elsewhere from a Sync
        # through it, not the leader's last report (up to 5 s old; a queue it showed empty was
        # deleted with the messages published since: the AMQP suite against 5 members at factor 3).
        for key in held_elsewhere(broker, keys):
            broker.note_counts(key, await wait_for_reply(partial(broker.queue_call, key, qc.Sync())))
    queue = broker.queue_view((vhost, name))
    if queue is not None and query.get("if-unused") == ["true"] and queue.active_consumer_count:
        raise HttpError("400 Bad Request", "bad_request", reason=f"queue '{name}' in vhost '{vhost}' in use")
    if query.get("if-empty") == ["true"] and ready_count(broker, keys):
        raise HttpError("400 Bad Request", "bad_request", reason=f"queue '{name}' in vhost '{vhost}' not empty")
    for key in reversed(keys):  # (partition 0, the queue of the name, last: server/partitioned.py)
        await wait_for_reply(partial(broker.delete_queue, key))
    return Reply("204 No Content")


async def purge_queue(broker: Any, request: Request) -> Reply:
    vhost, name = _existing(broker, request, "read")
    for key in partition_keys(broker, vhost, name):
        await wait_for_reply(partial(broker.queue_call, key, qc.Purge()))
    return Reply("204 No Content")


PAUSE_ACTIONS = {"pause_consumers": True, "resume_consumers": False}


async def queue_action(broker: Any, request: Request) -> Reply:
    """POST /api/queues/{vhost}/{name}/actions, RabbitMQ's path for queue actions, with MaxQ-Raft's
    `{"action": "pause_consumers" | "resume_consumers"}` and at most one of `"consumer_tag"` or
    `"connection"` (a connection's name, as /api/connections lists it); neither: every consumer
    of the queue. The pause is the queue's own replicated rule (machines/consumer_pauses.py):
    204 once committed. Needs configure on the queue, as a delete does."""
    vhost, name = _existing(broker, request, "configure")
    body = request.json()
    action = body.get("action")
    if action not in PAUSE_ACTIONS:
        raise HttpError("400 Bad Request", "bad_request", reason=f"Unknown action {str(action)[:60]!r}")
    unknown = sorted(set(body) - {"action", "consumer_tag", "connection"})
    if unknown:
        raise HttpError("400 Bad Request", "bad_request", reason=f"unknown field {unknown[0][:60]!r}")
    tag, connection = body.get("consumer_tag"), body.get("connection")
    if tag is not None and connection is not None:
        raise HttpError("400 Bad Request", "bad_request", reason="give consumer_tag or connection, not both")
    for field, value in (("consumer_tag", tag), ("connection", connection)):
        if value is not None and (type(value) is not str or not value or len(value.encode()) > 255):
            raise HttpError("400 Bad Request", "bad_request", reason=f"{field} must be a string of 1-255 bytes")
    if tag is not None:
        command = qc.PauseConsumers("tag", tag, PAUSE_ACTIONS[action])
    elif connection is not None:
        command = qc.PauseConsumers("connection", connection, PAUSE_ACTIONS[action])
    else:
        command = qc.PauseConsumers("queue", "", PAUSE_ACTIONS[action])
    for key in partition_keys(broker, vhost, name):
        await wait_for_reply(partial(broker.queue_call, key, command))
    return Reply("204 No Content")


# -------------------------------------------------------------------------------- exchanges

DEFAULT_EXCHANGE = "amq.default"  # how RabbitMQ's API names the default exchange ("") in paths


def _exchange_name(request: Request) -> str:
    name = request.params["name"]
    return "" if name == DEFAULT_EXCHANGE else name


def exchange_view(broker: Any, vhost: str, record: Any, counts: dict[tuple[str, str], tuple[int, int]]) -> dict:
    """`counts`: message_rates.exchange_counts(broker), read once per request. As RabbitMQ, an
    exchange nothing was published to on this node has no message_stats."""
    view = {
        "vhost": vhost,
        "name": record.name,
        "type": record.type,
        "durable": record.durable,
        "auto_delete": record.auto_delete,
        "internal": record.internal,
        "arguments": json_safe(record.arguments),
    }
    counted = counts.get((vhost, record.name))
    if counted is not None:
        view["message_stats"] = broker.exchange_rates.message_stats(trio.current_time(), (vhost, record.name), counted)
    return view


def exchanges_in_vhost(broker: Any, request: Request) -> list:
    vhost = readable_vhost(broker, request)
    counts = exchange_counts(broker)
    return [exchange_view(broker, vhost, record, counts) for record in broker.meta.vhosts[vhost].exchanges.values()]


def get_exchange(broker: Any, request: Request) -> dict:
    vhost = readable_vhost(broker, request)
    record = broker.meta.exchange(vhost, _exchange_name(request))
    if record is None:
        raise not_found()
    return exchange_view(broker, vhost, record, exchange_counts(broker))


async def put_exchange(broker: Any, request: Request) -> Reply:
    name = _exchange_name(request)
    return await _declare(broker, request, "exchange", name, definitions.exchange_declaration, broker.meta.exchange)


async def delete_exchange(broker: Any, request: Request) -> Reply:
    vhost, name = _vhost(broker, request), _exchange_name(request)
    _may(broker, request, vhost, "configure", "exchange", name)
    if broker.meta.exchange(vhost, name) is None:
        raise not_found()
    if_unused = request.query.get("if-unused") == ["true"]
    await _bad_request_as_rabbitmq(commit(broker, md.DeleteExchange(vhost, name, if_unused)))
    return Reply("204 No Content")


# --------------------------------------------------------------------------------- bindings


def properties_key(routing_key: str, arguments: dict) -> str:
    """What names one binding among those between the same two ends in a path (RabbitMQ's
    `properties_key`): the routing key, percent-encoded, and when the binding has arguments a
    digest of them (ours: SHA-256 of their canonical JSON; RabbitMQ hashes its own term format,
    so keys with arguments differ between the two brokers, and clients read them from a list)."""
    key = quote(routing_key, safe="")
    if not arguments:
        return key or "~"  # an empty key: a path segment cannot be empty (RabbitMQ's "~" too)
    canonical = json.dumps(json_safe(arguments), sort_keys=True, separators=(",", ":")).encode()
    return key + "~" + base64.urlsafe_b64encode(hashlib.sha256(canonical).digest()[:16]).decode().rstrip("=")


def binding_view(vhost: str, source: str, kind: str, destination: str, key: str, arguments: Any) -> dict:
    return {
        "source": source,
        "vhost": vhost,
        "destination": destination,
        "destination_type": kind,
        "routing_key": key,
        "arguments": json_safe(arguments),
        "properties_key": properties_key(key, arguments or {}),
    }


def bindings_of(broker: Any, vhost: str) -> list[dict]:
    return [binding_view(vhost, *binding) for binding in broker.meta.bindings(vhost)]


def bindings_in_vhost(broker: Any, request: Request) -> list:
    vhost = readable_vhost(broker, request)
    return bindings_of(broker, vhost)


def _ends(broker: Any, request: Request) -> tuple[str, str, str, str]:
    """(vhost, source, destination kind, destination) of a bindings path; 404 for a missing end."""
    vhost = readable_vhost(broker, request)
    source = "" if request.params["source"] == DEFAULT_EXCHANGE else request.params["source"]
    kind = {"q": "queue", "e": "exchange"}.get(request.params["kind"])
    if kind is None:
        raise not_found()
    destination = request.params["destination"]
    if broker.meta.exchange(vhost, source) is None:
        raise NotFoundHere("404 Not Found", "not_found", reason=f"no exchange '{source}' in vhost '{vhost}'")
    found = broker.meta.queue(vhost, destination) if kind == "queue" else broker.meta.exchange(vhost, destination)
    if found is None:
        raise NotFoundHere("404 Not Found", "not_found", reason=f"no {kind} '{destination}' in vhost '{vhost}'")
    return vhost, source, kind, destination


def _between(broker: Any, vhost: str, source: str, kind: str, destination: str) -> list[dict]:
    return [
        b
        for b in bindings_of(broker, vhost)
        if (b["source"], b["destination_type"], b["destination"]) == (source, kind, destination)
    ]


def bindings_between(broker: Any, request: Request) -> list:
    return _between(broker, *_ends(broker, request))


def _may_bind(broker: Any, request: Request, vhost: str, source: str, kind: str, destination: str) -> None:
    """RabbitMQ's binding checks: write on the destination, read on the source."""
    caller = request.caller
    if caller is None:
        raise auth.Forbidden("Not management user")
    checks = Authorization(broker, caller.name, vhost)
    try:
        checks.check("write", kind, destination)
        checks.check("read", "exchange", source)
    except ChannelError:
        raise auth.Forbidden(ACCESS_REFUSED) from None


async def post_binding(broker: Any, request: Request) -> Reply:
    vhost, source, kind, destination = _ends(broker, request)
    _may_bind(broker, request, vhost, source, kind, destination)
    try:
        command = definitions.binding_declaration(vhost, source, destination, kind == "exchange", request.json())
    except definitions.DefinitionsError as exc:
        raise HttpError("400 Bad Request", "bad_request", reason=str(exc)) from None
    await _bad_request_as_rabbitmq(commit(broker, command))
    return Reply("201 Created")


def _one(broker: Any, request: Request) -> dict:
    ends = _ends(broker, request)
    for binding in _between(broker, *ends):
        if binding["properties_key"] == request.params["props"]:
            return binding
    raise not_found()


def get_binding(broker: Any, request: Request) -> dict:
    return _one(broker, request)


async def delete_binding(broker: Any, request: Request) -> Reply:
    binding = _one(broker, request)
    vhost, source, kind, destination = (
        binding["vhost"],
        binding["source"],
        binding["destination_type"],
        binding["destination"],
    )
    _may_bind(broker, request, vhost, source, kind, destination)
    arguments = next(
        args
        for s, k, d, key, args in broker.meta.bindings(vhost)
        if (s, k, d, key) == (source, kind, destination, binding["routing_key"])
        and properties_key(key, args or {}) == binding["properties_key"]
    )
    unbind = md.Unbind(vhost, source, destination, kind == "exchange", binding["routing_key"], arguments, "")
    await _bad_request_as_rabbitmq(commit(broker, unbind))
    return Reply("204 No Content")


def exchange_bindings(broker: Any, request: Request, as_source: bool) -> list:
    vhost = readable_vhost(broker, request)
    name = _exchange_name(request)
    if broker.meta.exchange(vhost, name) is None:
        raise not_found()
    if as_source:
        return [b for b in bindings_of(broker, vhost) if b["source"] == name]
    return [b for b in bindings_of(broker, vhost) if b["destination_type"] == "exchange" and b["destination"] == name]


def queue_bindings(broker: Any, request: Request) -> list:
    """A queue's bindings, the default exchange's implicit one first (as RabbitMQ lists it)."""
    vhost = readable_vhost(broker, request)
    name = request.params["name"]
    if broker.meta.queue(vhost, name) is None:
        raise not_found()
    implicit = binding_view(vhost, "", "queue", name, name, {})
    return [implicit] + [
        b for b in bindings_of(broker, vhost) if b["destination_type"] == "queue" and b["destination"] == name
    ]
