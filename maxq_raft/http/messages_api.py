"""The management API's message routes: publish to an exchange and get from a queue
(`POST /api/exchanges/{vhost}/{name}/publish`, `POST /api/queues/{vhost}/{name}/get`), in
RabbitMQ 3.10's bodies and answers, for people and scripts that look at or inject a few
messages (rabbitmqadmin publish / get, the web UI's message browser).

Theory of operation: a publish is checked as a channel's is (write permission on the exchange,
topic permission on a topic exchange, an exchange that exists and is not internal), routed
through the same metadata (`MetadataMachine.route`), and each queue it reaches gets an Enqueue
through the node's log, like a publish over AMQP. The answer waits until every Enqueue is
durable, as a publisher confirm does, so `{"routed": true}` means stored; a store that cannot
write answers 503 and a queue that refuses (reject-publish overflow) does not count as routed.
A get takes up to `count` messages with `basic.get`'s command, held by a consumer id and owner of
this request alone ("NODE@http-N/1"), then settles them as `ackmode` says: acked
(`ack_requeue_false`), dead-lettered or dropped (`reject_requeue_false`), or handed back
(`ack_requeue_true`, `reject_requeue_true`) by the owner's Down, which also releases whatever a
failed request was holding.
"""

from __future__ import annotations

import base64
import binascii
import itertools
from typing import Any

from ..amqp.properties import BasicProperties, delivery_mode_of, encode_properties
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.message import Message
from ..machines.queue_types import Overflowed
from ..server.authorization import Authorization
from ..server.errors import ChannelError
from ..server.partitioned import partition_keys
from ..server.publish_extras import publish_extras, stored_properties
from ..server.session import PROCESS_TOKEN
from . import auth
from .objects_api import DEFAULT_EXCHANGE, not_found, readable_vhost
from .requests import HttpError, Reply, Request, commit, json_safe, metadata_caught_up, wait_for_reply

ACKMODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
GET_COUNT_MAX = 1000  # one request holds at most this many messages at once
_requests = itertools.count(1)
STRING_PROPERTIES = (
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "type",
    "user_id",
    "app_id",
    "cluster_id",
)


def _bad(reason: Any) -> HttpError:
    return HttpError("400 Bad Request", "bad_request", reason=reason)


def properties_from_json(given: Any) -> BasicProperties:
    """RabbitMQ's `properties` object (its keys; headers a JSON object) as AMQP properties."""
    if given == []:  # RabbitMQ writes an empty proplist as []
        given = {}
    if not isinstance(given, dict):
        raise _bad("properties must be a JSON object")
    props = BasicProperties()
    for key, value in given.items():
        if key in STRING_PROPERTIES:
            if not isinstance(value, str):
                raise _bad(f"property '{key}' must be a string")
            setattr(props, key, value)
        elif key in ("delivery_mode", "priority", "timestamp"):
            if type(value) is not int or not 0 <= value < (1 << 64 if key == "timestamp" else 256):
                raise _bad(f"property '{key}' must be a small non-negative integer")
            setattr(props, key, value)
        elif key == "headers":
            if not isinstance(value, dict):
                raise _bad("property 'headers' must be a JSON object")
            props.headers = value
        else:
            raise _bad(f"unknown property '{key}'")
    return props


def _payload(body: dict) -> bytes:
    payload, encoding = body.get("payload"), body.get("payload_encoding")
    if not isinstance(payload, str):
        raise _bad("'payload' must be a string")
    if encoding == "string":
        return payload.encode("utf-8", "surrogatepass")
    if encoding == "base64":
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise _bad("'payload' is not base64") from None
    raise _bad(["unsupported_encoding", str(encoding)])


async def publish(broker: Any, request: Request) -> dict:
    vhost = readable_vhost(broker, request)
    exchange = "" if request.params["name"] == DEFAULT_EXCHANGE else request.params["name"]
    body = request.json()
    missing = [key for key in ("properties", "routing_key", "payload", "payload_encoding") if key not in body]
    if missing:
        raise _bad("missing: " + ", ".join(missing))
    routing_key = body["routing_key"]
    if not isinstance(routing_key, str) or len(routing_key.encode("utf-8", "surrogatepass")) > 255:
        raise _bad("'routing_key' must be a string of at most 255 bytes")
    props = properties_from_json(body["properties"])
    try:
        props_raw = encode_properties(props)
    except (ValueError, TypeError, OverflowError) as exc:  # a header value AMQP cannot carry
        raise _bad(f"properties cannot be encoded: {exc}") from None
    payload = _payload(body)
    caller = request.caller
    checks = Authorization(broker, caller.name, vhost)
    if broker.meta.exchange(vhost, exchange) is None:
        await metadata_caught_up(broker)  # (made through another member a moment ago: metadata_sync.py)
    try:
        checks.check("write", "exchange", exchange)
        record = broker.meta.exchange(vhost, exchange)
        if record is None:
            raise _bad(f"404 NOT_FOUND - no exchange '{exchange}' in vhost '{vhost}'")
        if record.internal:
            raise _bad(f"403 ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in vhost '{vhost}'")
        if record.routing_type == "topic":
            checks.check_topic("write", exchange, routing_key)
    except ChannelError:
        raise auth.Forbidden("Access refused.") from None
    if props.user_id is not None and props.user_id != caller.name:
        raise _bad(f"user_id property set to '{props.user_id}' but authenticated user was '{caller.name}'")
    alarms = broker.alarms
    if alarms is not None and alarms.active:
        raise HttpError("503 Service Unavailable", "resource alarm in effect: publishing is blocked")
    queues = broker.meta.route(vhost, exchange, routing_key, lambda: props.headers)
    if not queues:
        await metadata_caught_up(broker)
        queues = broker.meta.route(vhost, exchange, routing_key, lambda: props.headers)
    broker.messages_received_http += 1  # a publish, in the overview's and /metrics's counts
    accepted = await _enqueue(broker, vhost, queues, exchange, routing_key, props_raw, payload)
    broker.messages_routed_http += accepted > 0
    broker.add_exchange_counts(vhost, {exchange: (1, int(accepted > 0))})
    return {"routed": accepted > 0}


async def _enqueue(
    broker: Any, vhost: str, queues: list[str], exchange: str, routing_key: str, props_raw: bytes, payload: bytes
) -> int:
    """Enqueue one message into each of `queues` and wait until all are durable; how many took it."""
    ttl_ms, priority, delay_ms = publish_extras(props_raw)
    persistent = delivery_mode_of(props_raw) == 2
    pendings: list = []
    accepted = 0
    for name in queues:
        message = Message(exchange, routing_key, props_raw, payload, persistent, ttl_ms, priority, delay_ms)

        def enqueue(then: Any, key: tuple[str, str] = (vhost, name), message: Message = message) -> None:
            pendings.append(broker.log.submit(key, qc.Enqueue([message]), then))

        try:
            reply = await wait_for_reply(enqueue)
        except HttpError as exc:
            if not exc.status.startswith("404"):
                raise
            continue  # the queue went meanwhile: not routed there
        accepted += not (type(reply) is Overflowed and reply.rejected)
    stored = await wait_for_reply(lambda then: broker.log.confirms.when_done(pendings, then))
    if not stored:
        raise HttpError("503 Service Unavailable", "the message store could not make the message durable")
    return accepted


def _integer(value: Any) -> int | None:
    """An integer, or its decimal digits as rabbitmqadmin sends them ("5"); None otherwise."""
    if type(value) is int:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        return int(value)
    return None


def _get_body(body: dict) -> tuple[int, str, str, int | None]:
    missing = [key for key in ("count", "ackmode", "encoding") if key not in body]
    if missing:
        raise _bad("missing: " + ", ".join(missing))
    count, ackmode, encoding = _integer(body["count"]), body["ackmode"], body["encoding"]
    truncate = None if body.get("truncate") is None else _integer(body["truncate"])
    if count is None or not 1 <= count <= GET_COUNT_MAX:
        raise _bad(f"'count' must be an integer from 1 to {GET_COUNT_MAX}")
    if ackmode not in ACKMODES:
        raise _bad(f"'ackmode' must be one of {', '.join(ACKMODES)}")
    if encoding not in ("auto", "base64"):
        raise _bad("'encoding' must be auto or base64")
    if truncate is not None and truncate < 0 or body.get("truncate") is not None and truncate is None:
        raise _bad("'truncate' must be a non-negative integer")
    return count, ackmode, encoding, truncate


def _message_json(message: Any, redelivered: bool, remaining: int, encoding: str, truncate: int | None) -> dict:
    body = message.body if truncate is None else message.body[:truncate]
    text = None
    if encoding == "auto":
        try:
            text = bytes(body).decode("utf-8")
        except UnicodeDecodeError:
            text = None
    props = stored_properties(message)
    shown = {name: getattr(props, name) for name in props.__slots__ if getattr(props, name) is not None}
    return {
        "payload_bytes": len(message.body),
        "redelivered": redelivered,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "message_count": remaining,
        "properties": json_safe(shown),
        "payload": text if text is not None else base64.b64encode(bytes(body)).decode("ascii"),
        "payload_encoding": "string" if text is not None else "base64",
    }


async def get(broker: Any, request: Request) -> list:
    vhost = readable_vhost(broker, request)
    name = request.params["name"]
    try:
        Authorization(broker, request.caller.name, vhost).check("read", "queue", name)
    except ChannelError:
        raise auth.Forbidden("Access refused.") from None
    if broker.meta.queue(vhost, name) is None:
        await metadata_caught_up(broker)
        if broker.meta.queue(vhost, name) is None:
            raise not_found()
    count, ackmode, encoding, truncate = _get_body(request.json())
    got: list = []
    for key in partition_keys(broker, vhost, name):  # (a partitioned queue's: each in turn)
        if len(got) == count:
            break
        got += await _take(
            broker, key, count - len(got), ackmode, lambda m, r, n: _message_json(m, r, n, encoding, truncate)
        )
    return got


async def _take(broker: Any, key: tuple[str, str], count: int, ackmode: str, show: Any) -> list:
    """Up to `count` messages of queue `key` as `show(message, redelivered, remaining)` makes
    them, settled as `ackmode` says (see the module's docstring)."""
    # this request's, as a channel's; with the process's token, as a session's id (server/session.py)
    owner = f"{broker.node_id}@http-{PROCESS_TOKEN}.{next(_requests)}/1"
    consumer_id = f"get:{owner}"
    got: list = []
    seqs: list[int] = []
    try:
        for _ in range(count):
            reply = await wait_for_reply(lambda then: broker.queue_call(key, qc.Get(consumer_id, owner, False), then))
            if reply is None:
                if not seqs:
                    broker.messages_get_empty += 1
                break
            broker.messages_got_manual_ack += 1  # a basic.get that waits for its ack, as RabbitMQ's is
            message, redelivered, remaining = reply
            seqs.append(message.seq)
            got.append(show(message, redelivered, remaining))
        if seqs and ackmode == "ack_requeue_false":
            await wait_for_reply(lambda then: broker.queue_call(key, qc.Settle(consumer_id, seqs), then))
            broker.messages_acknowledged += len(seqs)
        elif seqs and ackmode == "reject_requeue_false":
            await wait_for_reply(lambda then: broker.queue_call(key, qc.Discard(consumer_id, seqs), then))
    finally:
        # What is still held goes back (requeue modes, or a request that failed half-way).
        broker.queue_call(key, qc.Down(owner), lambda _reply: None)
    return got


ALIVENESS_QUEUE = "aliveness-test"  # RabbitMQ's names
ALIVENESS_BODY = b"test_message"


async def aliveness_test(broker: Any, request: Request) -> Any:
    """RabbitMQ's GET /api/aliveness-test/{vhost}: declare the queue aliveness-test, publish a
    message to it through the default exchange, get it back; {"status": "ok"} if it came."""
    vhost = readable_vhost(broker, request, vhost_param="name")
    try:
        checks = Authorization(broker, request.caller.name, vhost)
        for kind in ("configure", "write", "read"):
            checks.check(kind, "queue", ALIVENESS_QUEUE)
        checks.check("write", "exchange", "")
    except ChannelError:
        raise auth.Forbidden("Access refused.") from None
    await commit(broker, md.DeclareQueue(vhost, ALIVENESS_QUEUE, False, False, False, False, {}, ""))
    props_raw = encode_properties(BasicProperties())
    if not await _enqueue(broker, vhost, [ALIVENESS_QUEUE], "", ALIVENESS_QUEUE, props_raw, ALIVENESS_BODY):
        return Reply("503 Service Unavailable", {"status": "failed", "reason": "the test message was not queued"})
    bodies = await _take(broker, (vhost, ALIVENESS_QUEUE), 1, "ack_requeue_false", lambda m, r, n: bytes(m.body))
    if bodies != [ALIVENESS_BODY]:
        return Reply("503 Service Unavailable", {"status": "failed", "reason": "the test message did not come back"})
    return {"status": "ok"}
