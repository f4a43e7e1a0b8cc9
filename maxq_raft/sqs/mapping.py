"""SQS <-> AMQP: message attributes as AMQP headers, queue attributes as queue arguments.

Message attributes (docs/sqs.md has the table). A message sent over SQS is an AMQP message with
its attributes as headers, so AMQP consumers read them as they read any header:

    String, String.<custom>   a string header (longstr)
    Number                    a signed 64-bit integer header when the value is an integer that
                              fits, else a string header with the number's text
    Number.<custom>           a string header with the number's text
    Binary, Binary.<custom>   a byte-array header (AMQP's 'x')

The exact data type of every attribute whose header does not say it by itself (a custom type, a
Number kept as text) is kept in the header `x-sqs-data-types`, a table of name -> type, so a
message comes back over SQS with the types it was sent with. The other way, an AMQP message's
headers are read as attributes: a string is a String, an integer, float or decimal a Number, a
boolean the String "true" or "false", bytes that are not UTF-8 or a byte array a Binary; tables,
arrays, timestamps and void are left out, and so are headers whose names SQS does not allow
(and the `x-sqs-` ones, which are ours).

Queue attributes are queue arguments, so that a queue made over SQS is a plain durable AMQP
queue and the attributes survive as its record does: `x-sqs-visibility-timeout`,
`x-sqs-delay-seconds`, `x-sqs-maximum-message-size`, `x-sqs-receive-message-wait-time-seconds`
(seconds, or bytes), and MessageRetentionPeriod as AMQP's own `x-message-ttl` (milliseconds): a
message older than that leaves the queue as an expired AMQP message does. `x-sqs-created-timestamp`
and `x-sqs-last-modified-timestamp` hold the times (seconds) of the declare and of the last
SetQueueAttributes, drawn by the node that proposes them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any

from .digests import AttributeValue
from .errors import SqsError

TYPES_HEADER = "x-sqs-data-types"
TRACE_HEADER = "x-sqs-aws-trace-header"  # the AWSTraceHeader system attribute
OUR_PREFIX = "x-sqs-"
# An AMQP body that is not UTF-8 is received over SQS as base64, with this attribute "base64".
BODY_ENCODING_ATTRIBUTE = "MaxQ.BodyEncoding"
# A message's priority on a queue with x-max-priority (issue #18's priorities): this attribute,
# a Number 0-255, is also the AMQP `priority` property; without it a message has priority 0.
PRIORITY_ATTRIBUTE = "MaxQ.Priority"
PRIORITY_MAX = 255
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_I64 = (-(2**63), 2**63 - 1)

# --- message attributes ----------------------------------------------------------------------


def headers_from_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """AMQP headers for checked SQS message attributes (protocol.py has checked them)."""
    headers: dict[str, Any] = {}
    types: dict[str, Any] = {}
    for name, value in attributes.items():
        data_type = value["DataType"]
        base = data_type.split(".", 1)[0]
        if base == "Binary":
            headers[name] = bytearray(value["BinaryValue"])
            inferred = "Binary"
        elif base == "Number":
            text = value["StringValue"]
            number = _integer(text) if data_type == "Number" else None
            headers[name] = text if number is None else number
            inferred = "String" if number is None else "Number"
        else:
            headers[name] = value["StringValue"]
            inferred = "String"
        if data_type != inferred:
            types[name] = data_type
    if types:
        headers[TYPES_HEADER] = types
    return headers


def priority_of(attributes: Mapping[str, Mapping[str, Any]]) -> int:
    """The message's priority from its MaxQ.Priority attribute (0 without one)."""
    value = attributes.get(PRIORITY_ATTRIBUTE)
    if value is None:
        return 0
    number = _integer(value.get("StringValue", "")) if value.get("DataType") == "Number" else None
    if number is None or not 0 <= number <= PRIORITY_MAX:
        raise SqsError(
            "InvalidParameterValue", f"The message attribute {PRIORITY_ATTRIBUTE} must be a Number from 0 to 255."
        )
    return number


def _integer(text: str) -> int | None:
    stripped = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,19}", stripped):
        return None
    number = int(stripped)
    return number if _I64[0] <= number <= _I64[1] else None


def attributes_from_headers(headers: Mapping[str, Any] | None) -> dict[str, AttributeValue]:
    """The SQS message attributes an AMQP message's headers stand for (see the module docstring)."""
    if not headers:
        return {}
    declared = headers.get(TYPES_HEADER)
    types: Mapping[str, Any] = declared if isinstance(declared, dict) else {}
    out: dict[str, AttributeValue] = {}
    for name, value in headers.items():
        if name.startswith(OUR_PREFIX) or not _valid_name(name):
            continue
        attribute = _attribute(value)
        if attribute is None:
            continue
        data_type = types.get(name)
        if isinstance(data_type, str) and data_type.split(".", 1)[0] == attribute["DataType"].split(".", 1)[0]:
            attribute["DataType"] = data_type
        elif isinstance(data_type, str) and data_type.startswith("Number") and "StringValue" in attribute:
            attribute["DataType"] = data_type  # a Number kept as text
        out[name] = attribute
    return out


def _valid_name(name: str) -> bool:
    lowered = name.lower()
    return (
        _NAME.fullmatch(name) is not None
        and not name.startswith(".")
        and not name.endswith(".")
        and ".." not in name
        and not lowered.startswith(("aws.", "amazon."))
    )


def _attribute(value: Any) -> AttributeValue | None:
    if isinstance(value, bool):
        return {"DataType": "String", "StringValue": "true" if value else "false"}
    if isinstance(value, int | float | Decimal):
        return {"DataType": "Number", "StringValue": str(value)}
    if isinstance(value, str):
        return {"DataType": "String", "StringValue": value} if value else None
    if isinstance(value, bytearray | bytes):
        if isinstance(value, bytes):  # a longstr that is not UTF-8 (the decoder gives str otherwise)
            return {"DataType": "Binary", "BinaryValue": value} if value else None
        return {"DataType": "Binary", "BinaryValue": bytes(value)} if value else None
    return None  # tables, arrays, timestamps, void: SQS has nothing for them


def select_attributes(attributes: dict[str, AttributeValue], names: Iterable[str]) -> dict[str, AttributeValue]:
    """The attributes ReceiveMessage's MessageAttributeNames ask for: All or .* for all, a
    `prefix.*` for those that start with the prefix, or a name."""
    wanted = list(names)
    if not wanted or not attributes:
        return {}
    if "All" in wanted or ".*" in wanted:
        return attributes
    exact = {name for name in wanted if not name.endswith(".*")}
    prefixes = [name[:-1] for name in wanted if name.endswith(".*")]
    return {
        name: value
        for name, value in attributes.items()
        if name in exact or any(name.startswith(prefix) for prefix in prefixes)
    }


# --- queue attributes ------------------------------------------------------------------------

QUEUE_ARGUMENTS = {
    "VisibilityTimeout": "x-sqs-visibility-timeout",
    "DelaySeconds": "x-sqs-delay-seconds",
    "MaximumMessageSize": "x-sqs-maximum-message-size",
    "ReceiveMessageWaitTimeSeconds": "x-sqs-receive-message-wait-time-seconds",
}
RETENTION_ARGUMENT = "x-message-ttl"
CREATED_ARGUMENT = "x-sqs-created-timestamp"
MODIFIED_ARGUMENT = "x-sqs-last-modified-timestamp"
# FIFO queues (machines/fifo.py): FifoQueue "true" is x-sqs-fifo true, for the queue's whole
# life; ContentBasedDeduplication is x-sqs-content-based-deduplication (a bool, settable).
FIFO_ARGUMENT = "x-sqs-fifo"
CONTENT_DEDUP_ARGUMENT = "x-sqs-content-based-deduplication"
# High-throughput FIFO (settable, FIFO queues only): DeduplicationScope "queue" (the default) or
# "messageGroup" (a deduplication id counts within its message group: `dedup_key`), and
# FifoThroughputLimit "perQueue" (the default) or "perMessageGroupId", kept and shown: SQS's
# throughput quotas, which it chooses between, are not enforced here at all.
DEDUP_SCOPE_ARGUMENT = "x-sqs-deduplication-scope"
THROUGHPUT_LIMIT_ARGUMENT = "x-sqs-fifo-throughput-limit"
FIFO_CHOICES = {
    "DeduplicationScope": (DEDUP_SCOPE_ARGUMENT, "queue"),
    "FifoThroughputLimit": (THROUGHPUT_LIMIT_ARGUMENT, "perQueue"),
}
FIFO_ATTRIBUTES = frozenset({"FifoQueue", "ContentBasedDeduplication", *FIFO_CHOICES})
FIFO_ONLY_ATTRIBUTES = FIFO_ATTRIBUTES - {"FifoQueue"}
# Headers of a message sent to a FIFO queue, for its receivers and for AMQP (a dead-lettered copy)
DEDUP_HEADER = "x-sqs-message-deduplication-id"
GROUP_HEADER = "x-sqs-message-group-id"
SUPPORTED_QUEUE_ATTRIBUTES = frozenset(
    {*QUEUE_ARGUMENTS, "MessageRetentionPeriod", "RedrivePolicy", "RedriveAllowPolicy", *FIFO_ATTRIBUTES}
)
REDRIVE_ARGUMENT = "x-sqs-redrive-policy"  # the policy's JSON as set
REDRIVE_ALLOW_ARGUMENT = "x-sqs-redrive-allow-policy"  # a dead-letter queue's RedriveAllowPolicy, canonical JSON
TAGS_ARGUMENT = "x-sqs-tags"  # a table of tag -> value
# SQS's defaults; a queue without x-message-ttl keeps its messages until they are consumed, and
# says so as the longest retention SQS has (14 days)
DEFAULT_VISIBILITY_TIMEOUT_S = 30
RETENTION_UNBOUNDED_S = 1_209_600


def arguments_from_attributes(attributes: Mapping[str, str]) -> dict[str, int | bool | str]:
    """Queue arguments for checked, supported queue attributes."""
    arguments: dict[str, int | bool | str] = {}
    for name, text in attributes.items():
        if name == "RedrivePolicy" or name == "RedriveAllowPolicy":
            continue  # they name other queues: see redrive_arguments, redrive_allow_argument
        if name == "FifoQueue":
            if text == "true":  # (a standard queue has no argument for it)
                arguments[FIFO_ARGUMENT] = True
        elif name == "ContentBasedDeduplication":
            arguments[CONTENT_DEDUP_ARGUMENT] = text == "true"
        elif name in FIFO_CHOICES:
            arguments[FIFO_CHOICES[name][0]] = text
        elif name == "MessageRetentionPeriod":
            arguments[RETENTION_ARGUMENT] = int(text) * 1000
        else:
            arguments[QUEUE_ARGUMENTS[name]] = int(text)
    return arguments


def queue_attributes(arguments: Mapping[str, Any], max_message_bytes: int) -> dict[str, int]:
    """The five settable attributes of a queue with these arguments, defaults filled."""
    defaults = {
        "VisibilityTimeout": DEFAULT_VISIBILITY_TIMEOUT_S,
        "DelaySeconds": 0,
        "MaximumMessageSize": max_message_bytes,
        "ReceiveMessageWaitTimeSeconds": 0,
    }
    out: dict[str, int] = {}
    for name, argument in QUEUE_ARGUMENTS.items():
        value = arguments.get(argument)
        out[name] = value if type(value) is int else defaults[name]
    ttl = arguments.get(RETENTION_ARGUMENT)
    out["MessageRetentionPeriod"] = ttl // 1000 if type(ttl) is int else RETENTION_UNBOUNDED_S
    return out


def is_fifo(arguments: Mapping[str, Any]) -> bool:
    return arguments.get(FIFO_ARGUMENT) is True


def fifo_attributes(arguments: Mapping[str, Any]) -> dict[str, str]:
    """FifoQueue, ContentBasedDeduplication, DeduplicationScope and FifoThroughputLimit, as SQS
    shows them: for a FIFO queue only, defaults filled."""
    if not is_fifo(arguments):
        return {}
    shown = {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true" if arguments.get(CONTENT_DEDUP_ARGUMENT) is True else "false",
    }
    for name, (argument, default) in FIFO_CHOICES.items():
        value = arguments.get(argument)
        shown[name] = value if isinstance(value, str) else default
    return shown


def dedup_key(arguments: Mapping[str, Any], group_id: str, dedup_id: str | None) -> str | None:
    """What the queue machine deduplicates a FIFO send by: its deduplication id, or with
    DeduplicationScope messageGroup a digest of its group and id (at most 128 characters, as the
    machine takes ids; group and deduplication ids have no space, so the pair is unambiguous)."""
    if dedup_id is None or arguments.get(DEDUP_SCOPE_ARGUMENT) != "messageGroup":
        return dedup_id
    return "group:" + hashlib.sha256(f"{group_id} {dedup_id}".encode()).hexdigest()


def sequence_number_text(sequence_number: int) -> str:
    """A FIFO message's SequenceNumber: SQS gives a long decimal string; ours is the queue's
    counter, 20 digits, so that the strings compare as the numbers do."""
    return f"{sequence_number:020d}"


# --- redrive ---------------------------------------------------------------------------------
#
# RedrivePolicy {"deadLetterTargetArn": ARN, "maxReceiveCount": N} is the queue machine's delivery
# limit (machines/receives.py): x-delivery-limit N - 1 with the dead-letter queue as the target
# through the default exchange (x-dead-letter-exchange "", x-dead-letter-routing-key its name),
# so a message is received N times and dead-lettered when the N-th visibility runs out. The
# dead-letter queue must be in the same vhost (the default exchange is the vhost's).


# What an empty RedrivePolicy (SQS's way to remove one) takes off a queue that has one.
REDRIVE_ARGUMENTS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-delivery-limit", REDRIVE_ARGUMENT)


def redrive_policy(text: str) -> tuple[str, int]:
    """(deadLetterTargetArn, maxReceiveCount) of a policy protocol.py has checked."""
    policy = json.loads(text)
    return policy["deadLetterTargetArn"], int(policy["maxReceiveCount"])


def redrive_arguments(dead_letter_queue: str, max_receive_count: int, arn: str) -> dict[str, Any]:
    canonical = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": max_receive_count}, separators=(",", ":"))
    return {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead_letter_queue,
        "x-delivery-limit": max_receive_count - 1,
        REDRIVE_ARGUMENT: canonical,
    }


def redrive_allow_argument(text: str) -> str:
    """The argument's value for a RedriveAllowPolicy protocol.py has checked: canonical JSON."""
    policy = json.loads(text)
    canonical: dict[str, Any] = {"redrivePermission": policy["redrivePermission"]}
    if "sourceQueueArns" in policy:
        canonical["sourceQueueArns"] = list(policy["sourceQueueArns"])
    return json.dumps(canonical, separators=(",", ":"))


def redrive_allowed(
    arguments: Mapping[str, Any], source: tuple[str, str], from_arn: Callable[[str], tuple[str, str] | None]
) -> bool:
    """Whether a dead-letter queue with these `arguments` takes `source` (vhost, queue) as a
    source: allowAll (the default, as in SQS), denyAll, or byQueue naming it. `from_arn` turns
    an ARN into (vhost, queue), or None for one that names no queue."""
    text = arguments.get(REDRIVE_ALLOW_ARGUMENT)
    if not isinstance(text, str):
        return True
    policy = json.loads(text)
    permission = policy.get("redrivePermission")
    if permission == "denyAll":
        return False
    if permission == "byQueue":
        return any(from_arn(arn) == source for arn in policy.get("sourceQueueArns", []))
    return True


def redrive_target(arguments: Mapping[str, Any]) -> str | None:
    """The queue a queue's messages are dead-lettered to through the default exchange, if any."""
    if _text(arguments.get("x-dead-letter-exchange")) != "":
        return None
    return _text(arguments.get("x-dead-letter-routing-key"))


def _text(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None
