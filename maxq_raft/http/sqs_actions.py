"""The SQS actions over the node's queues (issue #18; docs/sqs.md): what each one proposes and answers.

Theory of operation: a request arrives checked (sqs/protocol.py: shapes, SQS's limits) and signed
by a user's access key (sqs_app.py); `run` does what a channel of that user would do, through the
same log and machines, and returns the action's result or raises SqsError:

- a queue is named by its URL (vhost and name, sqs/queue_url.py); CreateQueue, GetQueueUrl and
  ListQueues name the vhost by the endpoint's path (`/` is vhost "/", `/<vhost>` another);
- permissions are the user's AMQP permissions in the vhost, on the queue's name: configure to
  create, delete or set attributes, write to send, read to receive, delete, change visibility
  and purge; any of the three to look the queue up, list it or read its attributes;
- a queue is declared as `queue.declare` declares it (durable), its SQS attributes as queue
  arguments (sqs/mapping.py); SetQueueAttributes is the metadata machine's SetQueueArguments;
- a send is an Enqueue of AMQP messages straight into the queue (as the default exchange routes
  them), answered once the log has made it durable, as a publisher confirm is;
- a receive is the queue machine's Receive (machines/receives.py): the messages go in flight
  until their visibility deadline, in the log's time, under a receive id that the receipt handle
  carries with the message's place (sqs/receipt.py), so only the latest receive's handle deletes
  or changes it. A receive that finds nothing and may wait (WaitTimeSeconds) sleeps until the
  queue has a ready message (server/queue_wakeups.py) or its time is up, then tries again.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, unquote

import trio

from ..amqp.properties import BasicProperties, encode_properties
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.features import QUEUE_ARGUMENTS_REMOVED
from ..machines.message import Message
from ..machines.partitions import parent_of, partition_count
from ..machines.queue_types import HandleResult, Overflowed, Received, Rejected
from ..server.authorization import Authorization
from ..server.confirms import Unavailable
from ..server.errors import ChannelError
from ..server.publish_extras import stored_properties
from ..server.queue_stats import QueueStats
from ..sqs import mapping
from ..sqs.errors import SqsError
from ..sqs.protocol import (
    Limits,
    SqsRequest,
    batch_error_entry,
    check_tags,
    message_bytes,
    received_message,
    send_result,
)
from ..sqs.queue_url import parse_queue_url, queue_url
from ..sqs.receipt import Receipt, decode_receipt, encode_receipt
from . import fresh_stats
from .requests import NO_REPLY, metadata_caught_up, raw_reply

LIST_QUEUES_MAX = 1000  # SQS answers at most 1,000 URLs without MaxResults
# A long poll tries its Receive again each time the queue has a ready message: bounded, in case
# the queue keeps showing ready messages that others take first.
RECEIVE_TRIES_MAX = 1000
# A long poll on a member holding no replica of the queue's group is not woken by an apply here
# (nothing of that group is applied here: server/remote.py); it tries again this often.
ELSEWHERE_RECHECK_S = 0.5
ARN_REGION = "maxq"
KINDS = ("configure", "write", "read")
_MESSAGE_IDS = uuid.UUID("5b1d3c52-6f7e-4c1a-9a57-1b0f8f3c2e10")  # ids of AMQP messages without one


class Caller:
    """Who is asking (the access key's user) and through which endpoint."""

    def __init__(self, user: str, vhost: str, base_url: str) -> None:
        self.user = user
        self.vhost = vhost  # the endpoint path's vhost (CreateQueue, GetQueueUrl, ListQueues)
        self.base_url = base_url  # scheme://host:port as the client reached this node


def _unavailable(why: str) -> SqsError:
    return SqsError("ServiceUnavailable", why)


def _no_queue() -> SqsError:
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.")


class SqsActions:
    def __init__(self, broker: Any, receipt_keys: list[bytes], limits: Limits) -> None:
        self.broker = broker
        self.receipt_keys = receipt_keys  # the first signs new handles; all are accepted
        self.limits = limits

    async def run(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        handler: Callable[[SqsRequest, Caller], Any] = getattr(self, "_" + _snake(request.action))
        result: dict[str, Any] = await handler(request, caller)
        return result

    # ------------------------------------------------------------------ shared

    def _allowed(self, caller: Caller, vhost: str, kinds: tuple[str, ...], name: str, action: str) -> None:
        """AccessDenied unless the user may do one of `kinds` to the queue `name`."""
        checks = Authorization(self.broker, caller.user, vhost)
        for kind in kinds:
            try:
                checks.check(kind, "queue", name)
                return
            except ChannelError:
                continue
        raise SqsError(
            "AccessDenied",
            f"User: {caller.user} is not authorized to perform: sqs:{action} on resource: {self._arn(vhost, name)} "
            f"(it needs {' or '.join(kinds)} permission on the queue in vhost '{vhost}')",
        )

    def _vhost(self, caller: Caller, vhost: str) -> str:
        if vhost not in self.broker.meta.vhosts:
            raise SqsError("InvalidAddress", f"There is no vhost '{vhost[:255]}' on this endpoint.")
        return vhost

    async def _record(self, vhost: str, name: str) -> Any:
        """The queue's record; on a cluster member that has none, after a metadata barrier (a
        queue just created through another member is found: server/metadata_sync.py)."""
        record = self.broker.meta.queue(vhost, name)
        if record is None:
            await metadata_caught_up(self.broker)
            record = self.broker.meta.queue(vhost, name)
        return record

    async def _queue(self, request: SqsRequest, caller: Caller, kinds: tuple[str, ...]) -> tuple[str, str]:
        """The queue the request's QueueUrl names, if the user may do `kinds` to it and it exists."""
        vhost, name = parse_queue_url(request.params["QueueUrl"])
        self._vhost(caller, vhost)
        self._allowed(caller, vhost, kinds, name, request.action)
        record = await self._record(vhost, name)
        if record is None:
            raise _no_queue()
        if partition_count(record.arguments) > 1 or parent_of(name) is not None:
            # its messages are in several queues (machines/partitions.py): one queue's view of
            # them would miss the others', and its delete would leave them behind
            raise SqsError(
                "UnsupportedOperation",
                f"The queue '{name[:255]}' is partitioned (x-partitions): use it over AMQP (docs/queue-features.md).",
            )
        return vhost, name

    def _arn(self, vhost: str, name: str) -> str:
        return f"arn:aws:sqs:{ARN_REGION}:{quote(vhost, safe='')}:{name}"

    async def _call(self, key: tuple[str, str], command: Any) -> Any:
        """The queue machine's reply to `command` (a Rejected as it is, but a missing queue's)."""
        reply = await raw_reply(lambda then: self.broker.queue_call(key, command, then))
        return self._checked(reply)

    async def _meta(self, command: Any) -> Any:
        submit = self.broker.declare_queue if type(command) is md.DeclareQueue else self.broker.meta_call
        return self._checked(await raw_reply(lambda then: submit(command, then)))

    def _checked(self, reply: Any) -> Any:
        if reply is NO_REPLY:
            raise _unavailable("The node did not get an answer from its cluster in time (the change may still happen).")
        if type(reply) is Unavailable:
            raise _unavailable(f"The cluster cannot commit now ({reply.reason}).")
        if type(reply) is Rejected and reply.reply_code == 404:
            raise _no_queue()
        return reply

    # ------------------------------------------------------------ queues

    async def _create_queue(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        params = request.params
        name, attributes = params["QueueName"], params["Attributes"]
        _no_encryption(attributes)
        unsupported = sorted(set(attributes) - mapping.SUPPORTED_QUEUE_ATTRIBUTES)
        if unsupported:
            raise SqsError(
                "UnsupportedOperation", f"This endpoint does not support {', '.join(unsupported)} yet (docs/sqs.md)."
            )
        fifo_only = sorted(mapping.FIFO_ONLY_ATTRIBUTES & set(attributes))
        if fifo_only and attributes.get("FifoQueue") != "true":
            raise _fifo_only(fifo_only[0])
        vhost = self._vhost(caller, caller.vhost)
        self._allowed(caller, vhost, ("configure",), name, request.action)
        record = self.broker.meta.queue(vhost, name)
        if record is None:
            arguments = self._arguments(caller, vhost, name, attributes, request.action)
            arguments[mapping.CREATED_ARGUMENT] = int(time.time())
            if params.get("tags"):
                arguments[mapping.TAGS_ARGUMENT] = dict(params["tags"])
            reply = await self._meta(md.DeclareQueue(vhost, name, False, True, False, False, arguments, ""))
            if type(reply) is Rejected and self.broker.meta.queue(vhost, name) is not None:
                # made meanwhile (another request, an AMQP client) with other arguments
                raise SqsError("QueueNameExists", f"A queue named {name} exists with other attributes.")
            if type(reply) is Rejected:
                raise SqsError("InvalidParameterValue", reply.reply_text)
            record = reply
        # Same attributes: the queue's URL (idempotent); any other value: QueueAlreadyExists, as
        # SQS (the queue may also have been made just now by another request, or over AMQP).
        current = mapping.queue_attributes(record.arguments, self.limits.max_message_bytes)
        wanted = {
            name: int(text)
            for name, text in attributes.items()
            if name not in ("RedrivePolicy", "RedriveAllowPolicy") and name not in mapping.FIFO_ATTRIBUTES
        }
        fifo = mapping.fifo_attributes(record.arguments)
        same_fifo = all(
            fifo.get(attribute, "false") == text
            for attribute, text in attributes.items()
            if attribute in mapping.FIFO_ATTRIBUTES
        ) and (fifo.get("FifoQueue") == "true") == (attributes.get("FifoQueue") == "true")
        redrive = record.arguments.get(mapping.REDRIVE_ARGUMENT)
        if attributes.get("RedrivePolicy") == "":
            same_redrive = redrive is None
        elif "RedrivePolicy" in attributes:
            arn, count = mapping.redrive_policy(attributes["RedrivePolicy"])
            same_redrive = redrive == mapping.redrive_arguments("", count, arn)[mapping.REDRIVE_ARGUMENT]
        else:
            same_redrive = True
        if "RedriveAllowPolicy" in attributes:
            text = attributes["RedriveAllowPolicy"]
            allow = mapping.redrive_allow_argument(text) if text else None
            same_redrive = same_redrive and allow == record.arguments.get(mapping.REDRIVE_ALLOW_ARGUMENT)
        if not same_redrive or not same_fifo or any(value != current[attribute] for attribute, value in wanted.items()):
            raise SqsError(
                "QueueNameExists", "A queue already exists with the same name and a different value for an attribute."
            )
        return {"QueueUrl": queue_url(caller.base_url, vhost, name)}

    async def _get_queue_url(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        vhost, name = self._vhost(caller, caller.vhost), request.params["QueueName"]
        self._allowed(caller, vhost, KINDS, name, request.action)
        if await self._record(vhost, name) is None:
            raise _no_queue()
        return {"QueueUrl": queue_url(caller.base_url, vhost, name)}

    async def _list_queues(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        params = request.params
        vhost = self._vhost(caller, caller.vhost)
        prefix = params.get("QueueNamePrefix", "")
        limit = params.get("MaxResults")
        after = _token_name(params["NextToken"]) if "NextToken" in params else None
        checks = Authorization(self.broker, caller.user, vhost)
        names = []
        for name in sorted(self.broker.meta.vhosts[vhost].queues):  # bounded by the vhost's queues
            if not name.startswith(prefix) or (after is not None and name <= after):
                continue
            if any(_permits(checks, kind, name) for kind in KINDS):
                names.append(name)
                if len(names) > (limit or LIST_QUEUES_MAX):
                    break
        result: dict[str, Any] = {}
        page = names[: limit or LIST_QUEUES_MAX]
        if page:
            result["QueueUrls"] = [queue_url(caller.base_url, vhost, name) for name in page]
        if limit is not None and len(names) > limit:
            result["NextToken"] = base64.urlsafe_b64encode(page[-1].encode("utf-8")).decode("ascii")
        return result

    async def _delete_queue(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("configure",))
        self._checked(await raw_reply(lambda then: self.broker.delete_queue(key, then)))
        return {}

    async def _purge_queue(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("read",))
        await self._call(key, qc.Purge(in_flight=True))
        return {}

    async def _get_queue_attributes(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        vhost, name = await self._queue(request, caller, KINDS)
        wanted = set(request.params.get("AttributeNames", []))
        record = self.broker.meta.queue(vhost, name)
        if record is not None:  # its machine here, or (its group held elsewhere) its leader's counts of now
            await fresh_stats.refresh(self.broker, [(vhost, name)])
        queue = self.broker.shown_queue((vhost, name))
        if record is None or queue is None:
            raise _no_queue()
        stats = queue if type(queue) is QueueStats else QueueStats.of(self.broker.node_id, queue)
        values: dict[str, Any] = dict(mapping.queue_attributes(record.arguments, self.limits.max_message_bytes))
        values["ApproximateNumberOfMessages"] = stats.ready_count
        values["ApproximateNumberOfMessagesNotVisible"] = stats.unacked_count
        values["ApproximateNumberOfMessagesDelayed"] = stats.delayed_count
        values["QueueArn"] = self._arn(vhost, name)
        values["SqsManagedSseEnabled"] = "false"  # (messages are stored as they are: _no_encryption)
        values.update(mapping.fifo_attributes(record.arguments))
        created = record.arguments.get(mapping.CREATED_ARGUMENT)
        if type(created) is int:
            values["CreatedTimestamp"] = created
            values["LastModifiedTimestamp"] = record.arguments.get(mapping.MODIFIED_ARGUMENT, created)
        redrive = record.arguments.get(mapping.REDRIVE_ARGUMENT)
        if isinstance(redrive, str):
            values["RedrivePolicy"] = redrive
        allow = record.arguments.get(mapping.REDRIVE_ALLOW_ARGUMENT)
        if isinstance(allow, str):
            values["RedriveAllowPolicy"] = allow
        if "All" not in wanted:
            values = {key: value for key, value in values.items() if key in wanted}
        return {"Attributes": {key: str(value) for key, value in values.items()}} if values else {}

    async def _set_queue_attributes(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        attributes = request.params["Attributes"]
        _no_encryption(attributes)
        unsupported = sorted(set(attributes) - mapping.SUPPORTED_QUEUE_ATTRIBUTES)
        if unsupported:
            raise SqsError("UnsupportedOperation", f"This endpoint does not support {', '.join(unsupported)} yet.")
        vhost, name = await self._queue(request, caller, ("configure",))
        record = self.broker.meta.queue(vhost, name)
        fifo_only = sorted(mapping.FIFO_ONLY_ATTRIBUTES & set(attributes))
        if fifo_only and not mapping.is_fifo(record.arguments if record else {}):
            raise _fifo_only(fifo_only[0])
        if attributes:
            arguments = self._arguments(caller, vhost, name, attributes, request.action)
            # An empty RedrivePolicy or RedriveAllowPolicy removes the one the queue has.
            removed: list[str] = []
            held = record.arguments if record is not None else {}
            if attributes.get("RedrivePolicy") == "" and mapping.REDRIVE_ARGUMENT in held:
                removed += mapping.REDRIVE_ARGUMENTS
            if attributes.get("RedriveAllowPolicy") == "" and mapping.REDRIVE_ALLOW_ARGUMENT in held:
                removed.append(mapping.REDRIVE_ALLOW_ARGUMENT)
            if removed:
                if not self.broker.meta.feature_enabled(QUEUE_ARGUMENTS_REMOVED):
                    raise SqsError(
                        "UnsupportedOperation",
                        "Removing a redrive policy needs every member of the cluster to support it "
                        f"(feature flag '{QUEUE_ARGUMENTS_REMOVED}').",
                    )
                arguments.update(dict.fromkeys(removed))  # (None: removed)
            arguments[mapping.MODIFIED_ARGUMENT] = int(time.time())
            await self._set_arguments(vhost, name, arguments)
        return {}

    async def _set_arguments(self, vhost: str, name: str, arguments: dict[str, Any]) -> None:
        reply = await self._meta(md.SetQueueArguments(vhost, name, arguments))
        if type(reply) is Rejected:
            raise SqsError("InvalidAttributeValue", reply.reply_text)

    def _arguments(
        self, caller: Caller, vhost: str, name: str, attributes: dict[str, str], action: str
    ) -> dict[str, Any]:
        """Queue arguments for checked, supported attributes of the queue `name`; a RedrivePolicy's
        target must be a queue of the same vhost the user may write to, whose RedriveAllowPolicy
        takes this queue as a source."""
        arguments: dict[str, Any] = mapping.arguments_from_attributes(attributes)
        if attributes.get("RedriveAllowPolicy"):  # (empty: none, or the one there removed)
            arguments[mapping.REDRIVE_ALLOW_ARGUMENT] = mapping.redrive_allow_argument(attributes["RedriveAllowPolicy"])
        if attributes.get("RedrivePolicy"):  # (likewise)
            arn, count = mapping.redrive_policy(attributes["RedrivePolicy"])
            target_vhost, target = self._from_arn(arn)
            target_record = self.broker.meta.queue(vhost, target) if target_vhost == vhost else None
            if target_record is None:
                raise SqsError(
                    "InvalidParameterValue",
                    "Value for parameter RedrivePolicy is invalid. Reason: Dead-letter target does not exist "
                    "in this queue's vhost.",
                )
            if not mapping.redrive_allowed(target_record.arguments, (vhost, name), self._arn_or_none):
                raise SqsError(
                    "InvalidParameterValue",
                    "Value for parameter RedrivePolicy is invalid. Reason: the dead-letter target's "
                    "RedriveAllowPolicy does not allow this queue as a source.",
                )
            self._allowed(caller, vhost, ("write",), target, action)
            arguments.update(mapping.redrive_arguments(target, count, arn))
        return arguments

    def _arn_or_none(self, arn: str) -> tuple[str, str] | None:
        try:
            return self._from_arn(arn)
        except SqsError:
            return None

    def _from_arn(self, arn: str) -> tuple[str, str]:
        parts = arn.split(":", 5)
        if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
            raise SqsError("InvalidParameterValue", f"Value {arn[:256]} for deadLetterTargetArn is not a queue ARN.")
        try:
            return unquote(parts[4], errors="strict"), parts[5]
        except UnicodeDecodeError:
            raise SqsError("InvalidParameterValue", "The ARN's account part is not a vhost name.") from None

    async def _list_dead_letter_source_queues(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        vhost, name = await self._queue(request, caller, KINDS)
        params = request.params
        limit = params.get("MaxResults")
        after = _token_name(params["NextToken"]) if "NextToken" in params else None
        checks = Authorization(self.broker, caller.user, vhost)
        sources = []
        for source, record in sorted(self.broker.meta.vhosts[vhost].queues.items()):  # bounded by the vhost's
            if mapping.redrive_target(record.arguments) != name or (after is not None and source <= after):
                continue
            if any(_permits(checks, kind, source) for kind in KINDS):
                sources.append(source)
                if len(sources) > (limit or LIST_QUEUES_MAX):
                    break
        page = sources[: limit or LIST_QUEUES_MAX]
        result: dict[str, Any] = {"queueUrls": [queue_url(caller.base_url, vhost, source) for source in page]}
        if limit is not None and len(sources) > limit:
            result["NextToken"] = base64.urlsafe_b64encode(page[-1].encode("utf-8")).decode("ascii")
        return result

    # ------------------------------------------------------------ tags

    def _tags(self, vhost: str, name: str) -> dict[str, str]:
        record = self.broker.meta.queue(vhost, name)
        tags = record.arguments.get(mapping.TAGS_ARGUMENT) if record is not None else None
        if not isinstance(tags, dict):
            return {}
        return {
            key: bytes(v).decode("utf-8", "replace") if isinstance(v, bytes | bytearray) else str(v)
            for key, v in tags.items()
        }

    async def _tag_queue(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        vhost, name = await self._queue(request, caller, ("configure",))
        # (read, changed and written whole: of two TagQueue at once on one queue, the last wins)
        tags = {**self._tags(vhost, name), **request.params["Tags"]}
        check_tags(tags)
        await self._set_arguments(vhost, name, {mapping.TAGS_ARGUMENT: tags})
        return {}

    async def _untag_queue(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        vhost, name = await self._queue(request, caller, ("configure",))
        removed = set(request.params["TagKeys"])
        tags = {key: value for key, value in self._tags(vhost, name).items() if key not in removed}
        await self._set_arguments(vhost, name, {mapping.TAGS_ARGUMENT: tags})
        return {}

    async def _list_queue_tags(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        vhost, name = await self._queue(request, caller, KINDS)
        tags = self._tags(vhost, name)
        return {"Tags": tags} if tags else {}

    # ------------------------------------------------------------ sending

    async def _send_message(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("write",))
        sent, failed = await self._send(key, caller, [request.params])
        if failed:
            raise failed[0][1]
        return sent[0]

    async def _send_message_batch(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("write",))
        sent, failed = await self._send(key, caller, request.params["Entries"])
        failed += list(request.entry_errors.items())
        return {"Successful": sent, "Failed": [batch_error_entry(entry_id, error) for entry_id, error in failed]}

    async def _send(
        self, key: tuple[str, str], caller: Caller, entries: list[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[tuple[str, SqsError]]]:
        """Enqueue the checked `entries` in one command and wait until they are durable: the
        results of those sent, and (entry Id, error) for those refused."""
        broker = self.broker
        if broker.alarms is not None and broker.alarms.active:
            raise SqsError("RequestThrottled", "A resource alarm is in effect on this node: sends are blocked.")
        record = broker.meta.queue(*key)
        if record is None:
            raise _no_queue()
        settings = mapping.queue_attributes(record.arguments, self.limits.max_message_bytes)
        fifo = mapping.is_fifo(record.arguments)
        content_dedup = record.arguments.get(mapping.CONTENT_DEDUP_ARGUMENT) is True
        failed: list[tuple[str, SqsError]] = []
        messages: list[Message] = []
        kept: list[tuple[dict[str, Any], str]] = []
        fifo_fields: list[tuple[str, str | None, str]] = []
        now_s = int(time.time())
        for entry in entries:
            refusal = _fifo_entry_error(entry, fifo)
            if refusal is not None:
                failed.append((entry.get("Id", ""), refusal))
                continue
            dedup_id = entry.get("MessageDeduplicationId")
            if fifo and dedup_id is None:
                if not content_dedup:
                    failed.append(
                        (
                            entry.get("Id", ""),
                            SqsError(
                                "InvalidParameterValue",
                                "The queue should either have ContentBasedDeduplication enabled or "
                                "MessageDeduplicationId provided explicitly",
                            ),
                        )
                    )
                    continue
                # SQS: the SHA-256 of the body (not of the attributes)
                dedup_id = hashlib.sha256(entry["MessageBody"].encode("utf-8")).hexdigest()
            if message_bytes(entry) > settings["MaximumMessageSize"]:
                failed.append(
                    (
                        entry.get("Id", ""),
                        SqsError(
                            "InvalidParameterValue",
                            "One or more parameters are invalid. Reason: Message must be shorter than "
                            f"{settings['MaximumMessageSize']} bytes.",
                        ),
                    )
                )
                continue
            try:
                priority = mapping.priority_of(entry.get("MessageAttributes", {}))
            except SqsError as error:
                failed.append((entry.get("Id", ""), error))
                continue
            message_id = str(uuid.uuid4())
            headers = mapping.headers_from_attributes(entry.get("MessageAttributes", {}))
            trace = entry.get("MessageSystemAttributes", {}).get("AWSTraceHeader")
            if trace is not None:
                headers[mapping.TRACE_HEADER] = trace["StringValue"]
            if fifo:
                headers[mapping.GROUP_HEADER] = entry["MessageGroupId"]
                headers[mapping.DEDUP_HEADER] = dedup_id  # (as sent; the machine's key may be a digest)
            props = BasicProperties(
                delivery_mode=2,
                priority=priority or None,
                message_id=message_id,
                timestamp=now_s,
                user_id=caller.user,
                headers=headers or None,
            )
            delay_s = entry.get("DelaySeconds", settings["DelaySeconds"])
            body = entry["MessageBody"].encode("utf-8")
            messages.append(
                Message("", key[1], encode_properties(props), body, True, None, priority, delay_s * 1000 or None)
            )
            kept.append((entry, message_id))
            if fifo:
                key_id = mapping.dedup_key(record.arguments, entry["MessageGroupId"], dedup_id)
                fifo_fields.append((entry["MessageGroupId"], key_id, message_id))
        if not messages:
            return [], failed
        command = qc.EnqueueFifo(messages, fifo_fields) if fifo else qc.Enqueue(messages)
        pendings: list[Any] = []
        reply = self._checked(await raw_reply(lambda then: pendings.append(broker.log.submit(key, command, then))))
        if type(reply) is Rejected:
            if reply.reply_code == 403:  # the FIFO deduplication window is full (machines/fifo.py)
                raise SqsError("RequestThrottled", reply.reply_text)
            raise SqsError("InvalidParameterValue", reply.reply_text)
        # Per message: (MessageId, SequenceNumber) of a FIFO send (a duplicate's are the first
        # send's), None for one a full queue refused.
        results: list[tuple[str, int] | None]
        if fifo:
            results = list(reply)
        else:
            refused = set(reply.rejected) if type(reply) is Overflowed else set()
            results = [None if index in refused else (message_id, 0) for index, (_, message_id) in enumerate(kept)]
        stored = self._checked(await raw_reply(lambda then: broker.log.confirms.when_done(pendings, then)))
        if stored is not True:
            raise _unavailable("The node's message store could not make the message durable.")
        sent = []
        for (entry, _), result in zip(kept, results, strict=True):
            if result is None:  # x-overflow reject-publish on a full queue
                failed.append((entry.get("Id", ""), SqsError("OverLimit", "The queue is full (x-max-length).")))
            elif fifo:
                sent.append(send_result(entry, result[0], mapping.sequence_number_text(result[1])))
            else:
                sent.append(send_result(entry, result[0]))
        broker.sqs_sent += len(sent)  # (the overview's and /metrics's counts: message_rates.py)
        return sent, failed

    # ------------------------------------------------------------ receiving

    async def _receive_message(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        params = request.params
        key = await self._queue(request, caller, ("read",))
        record = self.broker.meta.queue(*key)
        settings = mapping.queue_attributes(record.arguments if record else {}, self.limits.max_message_bytes)
        visibility_ms = params.get("VisibilityTimeout", settings["VisibilityTimeout"]) * 1000
        wait_s = params.get("WaitTimeSeconds", settings["ReceiveMessageWaitTimeSeconds"])
        command = qc.Receive(params["MaxNumberOfMessages"], visibility_ms)
        received = await self._receive(key, command, trio.current_time() + wait_s)
        system = set(params.get("AttributeNames", [])) | set(params.get("MessageSystemAttributeNames", []))
        names = params.get("MessageAttributeNames", [])
        messages = [self._message(key, r, system, names) for r in received]
        if messages:
            self.broker.sqs_received += len(messages)
        else:
            self.broker.sqs_received_empty += 1
        return {"Messages": messages} if messages else {}

    async def _receive(self, key: tuple[str, str], command: qc.Receive, deadline: float) -> list[Received]:
        """Receive; while nothing is ready and the deadline has not come, wait for the queue."""
        wakeups = self.broker.queue_wakeups
        for _ in range(RECEIVE_TRIES_MAX):
            ready = trio.Event()
            token = wakeups.watch(key, ready.set)  # before the Receive: nothing enqueued after it is missed
            try:
                reply = await self._call(key, command)
                if type(reply) is Rejected:
                    if reply.reply_code == 403:
                        raise SqsError("OverLimit", f"Too many messages in flight on this queue ({reply.reply_text}).")
                    raise SqsError("InvalidParameterValue", reply.reply_text)
                now = trio.current_time()
                if reply or now >= deadline:
                    return list(reply)
                held_here = self.broker.log.holds_queue(key)
                with trio.move_on_at(deadline if held_here else min(deadline, now + ELSEWHERE_RECHECK_S)):
                    await ready.wait()
                if not ready.is_set() and (held_here or trio.current_time() >= deadline):
                    return []
            finally:
                wakeups.unwatch(key, token)
        return []

    def _message(self, key: tuple[str, str], r: Received, system: set[str], names: list[str]) -> dict[str, Any]:
        message = r.message
        props = stored_properties(message)
        body = bytes(message.body)
        attributes = mapping.attributes_from_headers(props.headers)
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            # SQS bodies are text: a binary AMQP body comes as base64, and says so
            text = base64.b64encode(body).decode("ascii")
            attributes[mapping.BODY_ENCODING_ATTRIBUTE] = {"DataType": "String", "StringValue": "base64"}
        message_id = props.message_id if props.message_id else str(uuid.uuid5(_MESSAGE_IDS, f"{key}/{r.seq}"))
        sent_ms = r.sent_ms
        if sent_ms is None:
            sent_ms = int(props.timestamp) * 1000 if isinstance(props.timestamp, int) else r.first_received_ms
        every = {
            "ApproximateReceiveCount": str(r.receive_count),
            "SentTimestamp": str(sent_ms),
            "ApproximateFirstReceiveTimestamp": str(r.first_received_ms),
        }
        if props.user_id:
            every["SenderId"] = props.user_id
        trace = props.headers.get(mapping.TRACE_HEADER) if props.headers else None
        if isinstance(trace, str):
            every["AWSTraceHeader"] = trace
        if message.sequence_number is not None:  # sent to a FIFO queue (machines/fifo.py)
            every["SequenceNumber"] = mapping.sequence_number_text(message.sequence_number)
        if message.group_id is not None:
            every["MessageGroupId"] = message.group_id
        dedup_id = props.headers.get(mapping.DEDUP_HEADER) if props.headers else None
        if isinstance(dedup_id, str) and message.group_id is not None:
            every["MessageDeduplicationId"] = dedup_id
        chosen = every if "All" in system else {name: value for name, value in every.items() if name in system}
        handle = encode_receipt(Receipt(key[0], key[1], r.seq, r.receive_id), self.receipt_keys[0])
        return received_message(
            message_id=message_id,
            receipt_handle=handle,
            body=text,
            attributes=chosen,
            message_attributes=mapping.select_attributes(attributes, names),
        )

    # ------------------------------------------------------------ handles

    def _receipt(self, key: tuple[str, str], handle: str) -> Receipt:
        return decode_receipt(handle, self.receipt_keys, vhost=key[0], queue=key[1])

    async def _delete_message(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("read",))
        receipt = self._receipt(key, request.params["ReceiptHandle"])
        results = await self._handles(key, qc.DeleteReceived([(receipt.message_seq, receipt.receive_id)]))
        self.broker.sqs_deleted += results.count(HandleResult.DONE)
        # SQS answers a delete with an old handle with success too; the machine deleted the
        # message only if the handle is its latest receive's (machines/receives.py)
        return {}

    async def _delete_message_batch(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("read",))
        good, failed = self._batch_receipts(key, request)
        if good:
            results = await self._handles(key, qc.DeleteReceived([(r.message_seq, r.receive_id) for _, r, _ in good]))
            self.broker.sqs_deleted += results.count(HandleResult.DONE)
        return {
            "Successful": [{"Id": entry_id} for entry_id, _, _ in good],
            "Failed": [batch_error_entry(entry_id, error) for entry_id, error in failed],
        }

    async def _change_message_visibility(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("read",))
        receipt = self._receipt(key, request.params["ReceiptHandle"])
        visibility_ms = request.params["VisibilityTimeout"] * 1000
        results = await self._handles(
            key, qc.ChangeVisibility([(receipt.message_seq, receipt.receive_id, visibility_ms)])
        )
        error = _visibility_error(results[0])
        if error is not None:
            raise error
        return {}

    async def _change_message_visibility_batch(self, request: SqsRequest, caller: Caller) -> dict[str, Any]:
        key = await self._queue(request, caller, ("read",))
        good, failed = self._batch_receipts(key, request)
        missing = [(entry_id, r, e) for entry_id, r, e in good if "VisibilityTimeout" not in e]
        for entry_id, _, _ in missing:
            failed.append((entry_id, SqsError("MissingParameter", "The request must contain VisibilityTimeout.")))
        good = [item for item in good if "VisibilityTimeout" in item[2]]
        successful = []
        if good:
            handles = [(r.message_seq, r.receive_id, e["VisibilityTimeout"] * 1000) for _, r, e in good]
            results = await self._handles(key, qc.ChangeVisibility(handles))
            for (entry_id, _, _), result in zip(good, results, strict=True):
                error = _visibility_error(result)
                if error is None:
                    successful.append({"Id": entry_id})
                else:
                    failed.append((entry_id, error))
        return {"Successful": successful, "Failed": [batch_error_entry(entry_id, error) for entry_id, error in failed]}

    def _batch_receipts(
        self, key: tuple[str, str], request: SqsRequest
    ) -> tuple[list[tuple[str, Receipt, dict[str, Any]]], list[tuple[str, SqsError]]]:
        good = []
        failed = list(request.entry_errors.items())
        for entry in request.params["Entries"]:
            try:
                good.append((entry["Id"], self._receipt(key, entry["ReceiptHandle"]), entry))
            except SqsError as error:
                failed.append((entry["Id"], error))
        return good, failed

    async def _handles(self, key: tuple[str, str], command: Any) -> list[HandleResult]:
        reply = await self._call(key, command)
        if type(reply) is Rejected:
            raise SqsError("InvalidParameterValue", reply.reply_text)
        return list(reply)


def _no_encryption(attributes: dict[str, str]) -> None:
    """SqsManagedSseEnabled: "false" is what every queue here is (taken out, nothing to keep);
    "true" is refused, as messages are stored unencrypted (disk encryption is the operator's)."""
    if attributes.pop("SqsManagedSseEnabled", "false") == "true":
        raise SqsError(
            "UnsupportedOperation",
            "Server-side encryption is not supported: messages are stored unencrypted "
            "(SqsManagedSseEnabled can only be false; docs/sqs.md).",
        )


def _fifo_only(attribute: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {attribute}: it is for FIFO queues only.")


def _fifo_entry_error(entry: dict[str, Any], fifo: bool) -> SqsError | None:
    """What SQS says of a send's FIFO parameters on this kind of queue (None: fine)."""
    if not fifo:
        if "MessageDeduplicationId" in entry:
            return SqsError(
                "InvalidParameterValue",
                "The request include parameter MessageDeduplicationId that is not valid for this queue type",
            )
        return None  # (a MessageGroupId on a standard queue is accepted and plays no part here)
    if "MessageGroupId" not in entry:
        return SqsError("MissingParameter", "The request must contain the parameter MessageGroupId.")
    if entry.get("DelaySeconds"):
        return SqsError(
            "InvalidParameterValue",
            f"Value {entry['DelaySeconds']} for parameter DelaySeconds is invalid. Reason: The request include "
            "parameter that is not valid for this queue type.",
        )
    return None


def _visibility_error(result: HandleResult) -> SqsError | None:
    if result is HandleResult.DONE:
        return None
    if result is HandleResult.TOO_LONG:
        return SqsError(
            "InvalidParameterValue",
            "Value for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout for the message "
            "is beyond the limit [43200 seconds]",
        )
    # an old handle (the message was received again since) or a message no longer in flight
    return SqsError("MessageNotInflight", "The message referred to is not in flight.")


def _permits(checks: Authorization, kind: str, name: str) -> bool:
    try:
        checks.check(kind, "queue", name)
    except ChannelError:
        return False
    return True


def _token_name(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode("ascii") + b"=" * (-len(token) % 4)).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeError):
        raise SqsError("InvalidParameterValue", "Invalid NextToken value.") from None


def _snake(action: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")
