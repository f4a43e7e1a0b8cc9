"""What the admin API's handlers share: the request, its errors, and committing a metadata change."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from ..machines import metadata as md
from ..machines import partitions
from ..machines.queue_types import Rejected
from ..server.confirms import Unavailable
from ..server.errors import ChannelError
from ..server.partitioned import NOT_ENABLED, missing_partitions, unavailable, with_policy_partitions

COMMIT_TIMEOUT_S = 15.0


def json_safe(value: Any) -> Any:
    """A value as JSON can carry it: field tables may hold bytes (as UTF-8 text), decimals and
    timestamps (as their text)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value if isinstance(value, str | int | float | bool) or value is None else str(value)


class HttpError(Exception):
    """Answered as `status` with {"error": message, **extra}."""

    def __init__(self, status: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


class NotFoundHere(HttpError):
    """A 404 from a lookup in this member's metadata, raised before the request changed anything:
    on a cluster member the request runs again after a metadata barrier (admin_app.dispatch)."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes = b""
    authorization: str | None = None  # the Authorization header
    peer_host: str = ""
    caller: Any = None  # auth.Caller, once authenticated
    params: dict[str, str] = field(default_factory=dict)  # from the path (e.g. a member's name)
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names

    def json(self) -> dict:
        if not self.body:
            raise HttpError("400 Bad Request", "a JSON object body is required")
        try:
            value = json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError("400 Bad Request", f"malformed JSON body: {exc}") from None
        except RecursionError:
            # 16 KiB of "[" nests deeper than the decoder recurses (~1000 levels): bad input, not a 500
            raise HttpError("400 Bad Request", "malformed JSON body: nested too deeply") from None
        if not isinstance(value, dict):
            raise HttpError("400 Bad Request", "the JSON body must be an object")
        return value


@dataclass
class Reply:
    """A handler's answer other than 200 with a JSON body: e.g. 201 Created, 204 No Content."""

    status: str
    body: Any = None


NO_REPLY = object()  # what `raw_reply` returns when no reply came in time


async def raw_reply(start: Callable[[Callable[[Any], None]], None], timeout_s: float = COMMIT_TIMEOUT_S) -> Any:
    """`start(then)` hands a change to the node, which calls `then(reply)` once, from any thread;
    wait for that reply, bounded, and return it as it came (a single node's ChannelError as a
    Rejected), or NO_REPLY after `timeout_s`."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    box: list = []

    def then(reply: Any) -> None:
        box.append(reply)
        done.set()

    try:
        start(lambda reply: token.run_sync_soon(then, reply))
    except ChannelError as err:  # a single node refuses at once
        box.append(Rejected(err.reply_code, err.reply_text))
        done.set()
    with trio.move_on_after(timeout_s):
        await done.wait()
    return box[0] if box else NO_REPLY


async def metadata_caught_up(broker: Any) -> None:
    """On a cluster member, wait (bounded) until it has applied what the metadata group committed
    before now: for a lookup that found nothing (server/metadata_sync.py). No wait on a single node."""
    if broker.log.metadata_may_lag():
        await raw_reply(broker.log.after_metadata_barrier)


async def wait_for_reply(start: Callable[[Callable[[Any], None]], None]) -> Any:
    """`start(then)` hands a change to the node, which calls `then(reply)` once, from any thread;
    wait for that reply, bounded, and return it. HttpError for a refusal (404 or 400), no answer
    (504) or a cluster that cannot commit (503)."""
    reply = await raw_reply(start)
    if reply is NO_REPLY:
        raise HttpError(
            "504 Gateway Timeout", f"no answer within {COMMIT_TIMEOUT_S:.0f} s (the change may still happen)"
        )
    if type(reply) is Unavailable:
        raise HttpError("503 Service Unavailable", f"the cluster cannot commit now ({reply.reason})")
    if type(reply) is Rejected:
        raise HttpError("404 Not Found" if reply.reply_code == 404 else "400 Bad Request", reply.reply_text)
    return reply


async def commit(broker: Any, command: Any) -> Any:
    """Commit a metadata command (through the metadata group in a cluster), wait (bounded) and
    return the machine's reply (see `wait_for_reply`). A queue is declared as a channel declares
    it: its queue machine is made in its shard before its record is committed
    (Broker.declare_queue), and a partitioned queue's partitions after it (server/partitioned.py)."""
    if (
        type(command) is md.SetPolicy
        and isinstance(command.definition, dict)
        and "partitions" in command.definition
        and not broker.meta.feature_enabled(partitions.FEATURE)  # (an earlier release refuses the key)
    ):
        raise HttpError("400 Bad Request", f"the policy key 'partitions': {NOT_ENABLED}")
    if type(command) is not md.DeclareQueue:
        return await wait_for_reply(lambda then: broker.meta_call(command, then))
    command = with_policy_partitions(broker, command)
    refusal = unavailable(broker, command.arguments)
    if refusal is not None:
        raise HttpError("400 Bad Request", f"invalid arg 'x-partitions' for queue '{command.name}': {refusal}")
    reply = await wait_for_reply(lambda then: broker.declare_queue(command, then))
    if not command.passive:
        for partition in missing_partitions(broker, command.vhost, command.name, command.owner):
            await wait_for_reply(partial(broker.declare_queue, partition))
    return reply
