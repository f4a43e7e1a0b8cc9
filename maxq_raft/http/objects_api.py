"""The management API's queue routes: list per vhost, show, declare, delete and purge, as
RabbitMQ 3.10 answers them (codes, bodies and reasons read side by side from its plugin).

Theory of operation: a handler checks, in RabbitMQ's order, that the vhost exists (404), that
the caller may use it and the queue (the same permissions as over AMQP, `Authorization`: a
declare or delete needs configure, a purge read; 401 "Access refused." otherwise, as RabbitMQ),
and then does what a channel would: a declare is committed like `queue.declare` (its record,
with the queue's machine made in its shard), a delete goes through `Broker.delete_queue`, a purge
is the queue's own `Purge` command. Each waits, bounded, for its reply (requests.wait_for_reply).
Bodies are RabbitMQ's: `{"durable", "auto_delete", "arguments"}`, checked as an imported queue
is (definitions.py), so a bad argument is a 400 that names it and nothing is proposed.
"""

from __future__ import annotations

from typing import Any

from ..machines import commands as qc
from ..server.authorization import Authorization
from ..server.errors import ChannelError
from . import auth, definitions
from .metrics import QUEUE_TYPE
from .requests import HttpError, Reply, Request, commit, json_safe, wait_for_reply

NOT_FOUND = HttpError("404 Not Found", "Object Not Found", reason="Not Found")
ACCESS_REFUSED = "Access refused."


def queue_view(broker: Any, vhost: str, name: str, queue: Any) -> dict:
    record = broker.meta.queue(vhost, name)
    return {
        "vhost": vhost,
        "name": name,
        "durable": bool(record and record.durable),
        "exclusive": bool(record and record.exclusive_owner),
        "auto_delete": bool(record and record.auto_delete),
        "arguments": json_safe(record.arguments if record else {}),
        "type": QUEUE_TYPE,
        "state": "running",
        "node": broker.node_id,
        "messages": queue.ready_count + queue.unacked_count,
        "messages_ready": queue.ready_count,
        "messages_unacknowledged": queue.unacked_count,
        "consumers": queue.active_consumer_count,
    }


def _vhost(broker: Any, request: Request, missing: HttpError = NOT_FOUND) -> str:
    vhost = request.params["vhost"]
    if vhost not in broker.meta.vhosts:
        raise missing
    return vhost


def _may(broker: Any, request: Request, vhost: str, kind: str, name: str) -> None:
    """The caller's AMQP permission `kind` on queue `name` (auth.Forbidden as RabbitMQ's 401)."""
    caller = request.caller
    if caller is None:
        raise auth.Forbidden("Not management user")
    if broker.meta.permission(vhost, caller.name) is None:
        raise auth.Forbidden("User not authorised to access virtual host")
    if name.startswith("amq."):
        raise auth.Forbidden(ACCESS_REFUSED)
    try:
        Authorization(broker, caller.name, vhost).check(kind, "queue", name)
    except ChannelError:
        raise auth.Forbidden(ACCESS_REFUSED) from None


def list_in_vhost(broker: Any, request: Request) -> list:
    vhost = _vhost(broker, request)
    if request.caller is not None and vhost not in request.caller.vhosts(broker.meta):
        raise auth.Forbidden("User not authorised to access virtual host")
    return [queue_view(broker, v, name, queue) for (v, name), queue in broker.queues.items() if v == vhost]


def get_queue(broker: Any, request: Request) -> dict:
    vhost, name = _vhost(broker, request), request.params["name"]
    if request.caller is not None and vhost not in request.caller.vhosts(broker.meta):
        raise auth.Forbidden("User not authorised to access virtual host")
    queue = broker.queues.get((vhost, name))
    if queue is None or broker.meta.queue(vhost, name) is None:
        raise NOT_FOUND
    return queue_view(broker, vhost, name, queue)


async def put_queue(broker: Any, request: Request) -> Reply:
    vhost = _vhost(broker, request, HttpError("404 Not Found", "not_found", reason="vhost_not_found"))
    name = request.params["name"]
    _may(broker, request, vhost, "configure", name)
    try:
        command = definitions.queue_declaration(vhost, name, request.json())
    except definitions.DefinitionsError as exc:
        raise HttpError("400 Bad Request", "bad_request", reason=str(exc)) from None
    existed = broker.meta.queue(vhost, name) is not None
    try:
        await commit(broker, command)
    except HttpError as exc:
        if exc.status.startswith("400"):
            raise HttpError(exc.status, "bad_request", reason=str(exc)) from None
        raise
    return Reply("204 No Content" if existed else "201 Created")


def _existing(broker: Any, request: Request, kind: str) -> tuple[str, str]:
    vhost, name = _vhost(broker, request), request.params["name"]
    _may(broker, request, vhost, kind, name)
    if broker.meta.queue(vhost, name) is None:
        raise NOT_FOUND
    return vhost, name


async def delete_queue(broker: Any, request: Request) -> Reply:
    vhost, name = _existing(broker, request, "configure")
    queue = broker.queues.get((vhost, name))
    query = request.query
    if queue is not None and query.get("if-unused") == ["true"] and queue.active_consumer_count:
        raise HttpError("400 Bad Request", "bad_request", reason=f"queue '{name}' in vhost '{vhost}' in use")
    if queue is not None and query.get("if-empty") == ["true"] and queue.ready_count:
        raise HttpError("400 Bad Request", "bad_request", reason=f"queue '{name}' in vhost '{vhost}' not empty")
    await wait_for_reply(lambda then: broker.delete_queue((vhost, name), then))
    return Reply("204 No Content")


async def purge_queue(broker: Any, request: Request) -> Reply:
    vhost, name = _existing(broker, request, "read")
    await wait_for_reply(lambda then: broker.queue_call((vhost, name), qc.Purge(), then))
    return Reply("204 No Content")
