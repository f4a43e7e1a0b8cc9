"""The AWS JSON 1.0 protocol as boto3 speaks it to SQS: requests in, responses and errors out.

A request is `POST /` with `Content-Type: application/x-amz-json-1.0`, `X-Amz-Target:
AmazonSQS.<Action>` and the action's input as a JSON object (blobs base64, integers as numbers).
`parse_request` checks the JSON types against the action's input shape (as botocore's sqs model
has it) and then SQS's limits, and returns the action and its parameters with defaults filled
and blobs decoded. Limits that apply per entry of a batch do not fail the batch: SQS reports them
in the entry's `Failed` element, so they come back in `SqsRequest.entry_errors` and the entry is
left out of the parameters.

A response is the output shape as JSON with status 200; an error is `{"__type", "message"}` with
the error's status and the `x-amzn-query-error: CODE;Sender` header (errors.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from .digests import AttributeValue, md5_of_attributes, md5_of_body
from .errors import SqsError

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."


@dataclass(frozen=True)
class Limits:
    """SQS's limits; a server may differ where issue #18 says so (delays up to 7 days)."""

    max_message_bytes: int = 1_048_576  # SQS since August 2025 (256 KiB before): body + attributes
    max_delay_s: int = 900
    max_visibility_timeout_s: int = 43_200
    max_wait_time_s: int = 20
    max_messages_per_receive: int = 10
    max_batch_entries: int = 10
    max_message_attributes: int = 10
    max_request_bytes: int = 3 * 1_048_576  # a full batch, base64 binary attributes and JSON overhead


SQS_LIMITS = Limits()


@dataclass
class SqsRequest:
    action: str
    params: dict[str, Any]
    entry_errors: dict[str, SqsError] = field(default_factory=dict)  # batch entry Id -> its failure


# --- input shapes (botocore's sqs model; tests compare) -----------------------------------------

STRING, INTEGER, BOOLEAN, BLOB = "string", "integer", "boolean", "blob"


@dataclass(frozen=True)
class ListOf:
    member: Shape


@dataclass(frozen=True)
class MapOf:
    value: Shape


@dataclass(frozen=True)
class Struct:
    members: dict[str, Shape]
    required: frozenset[str] = frozenset()


Shape = str | ListOf | MapOf | Struct

ATTRIBUTE_VALUE = Struct(
    {
        "StringValue": STRING,
        "BinaryValue": BLOB,
        "StringListValues": ListOf(STRING),
        "BinaryListValues": ListOf(BLOB),
        "DataType": STRING,
    },
    frozenset({"DataType"}),
)
_SEND_FIELDS: dict[str, Shape] = {
    "MessageBody": STRING,
    "DelaySeconds": INTEGER,
    "MessageAttributes": MapOf(ATTRIBUTE_VALUE),
    "MessageSystemAttributes": MapOf(ATTRIBUTE_VALUE),
    "MessageDeduplicationId": STRING,
    "MessageGroupId": STRING,
}
_HANDLE: dict[str, Shape] = {"ReceiptHandle": STRING}
_QUEUE = {"QueueUrl": STRING}


def _struct(required: Iterable[str], **members: Shape) -> Struct:
    return Struct(members, frozenset(required))


def _batch(entry: Struct) -> Struct:
    return _struct(["QueueUrl", "Entries"], QueueUrl=STRING, Entries=ListOf(entry))


INPUTS: dict[str, Struct] = {
    "CreateQueue": _struct(["QueueName"], QueueName=STRING, Attributes=MapOf(STRING), tags=MapOf(STRING)),
    "GetQueueUrl": _struct(["QueueName"], QueueName=STRING, QueueOwnerAWSAccountId=STRING),
    "ListQueues": _struct([], QueueNamePrefix=STRING, NextToken=STRING, MaxResults=INTEGER),
    "DeleteQueue": _struct(["QueueUrl"], **_QUEUE),
    "PurgeQueue": _struct(["QueueUrl"], **_QUEUE),
    "GetQueueAttributes": _struct(["QueueUrl"], **_QUEUE, AttributeNames=ListOf(STRING)),
    "SetQueueAttributes": _struct(["QueueUrl", "Attributes"], **_QUEUE, Attributes=MapOf(STRING)),
    "SendMessage": _struct(["QueueUrl", "MessageBody"], **_QUEUE, **_SEND_FIELDS),
    "SendMessageBatch": _batch(_struct(["Id", "MessageBody"], Id=STRING, **_SEND_FIELDS)),
    "ReceiveMessage": _struct(
        ["QueueUrl"],
        **_QUEUE,
        AttributeNames=ListOf(STRING),
        MessageSystemAttributeNames=ListOf(STRING),
        MessageAttributeNames=ListOf(STRING),
        MaxNumberOfMessages=INTEGER,
        VisibilityTimeout=INTEGER,
        WaitTimeSeconds=INTEGER,
        ReceiveRequestAttemptId=STRING,
    ),
    "DeleteMessage": _struct(["QueueUrl", "ReceiptHandle"], **_QUEUE, **_HANDLE),
    "DeleteMessageBatch": _batch(_struct(["Id", "ReceiptHandle"], Id=STRING, **_HANDLE)),
    "ChangeMessageVisibility": _struct(
        ["QueueUrl", "ReceiptHandle", "VisibilityTimeout"], **_QUEUE, **_HANDLE, VisibilityTimeout=INTEGER
    ),
    "ChangeMessageVisibilityBatch": _batch(
        _struct(["Id", "ReceiptHandle"], Id=STRING, **_HANDLE, VisibilityTimeout=INTEGER)
    ),
    "ListDeadLetterSourceQueues": _struct(["QueueUrl"], **_QUEUE, NextToken=STRING, MaxResults=INTEGER),
    "TagQueue": _struct(["QueueUrl", "Tags"], **_QUEUE, Tags=MapOf(STRING)),
    "UntagQueue": _struct(["QueueUrl", "TagKeys"], **_QUEUE, TagKeys=ListOf(STRING)),
    "ListQueueTags": _struct(["QueueUrl"], **_QUEUE),
}
ACTIONS = frozenset(INPUTS)

# --- names SQS knows -------------------------------------------------------------------------

QUEUE_ATTRIBUTE_NAMES = frozenset(
    [
        "All",
        "Policy",
        "VisibilityTimeout",
        "MaximumMessageSize",
        "MessageRetentionPeriod",
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "CreatedTimestamp",
        "LastModifiedTimestamp",
        "QueueArn",
        "ApproximateNumberOfMessagesDelayed",
        "DelaySeconds",
        "ReceiveMessageWaitTimeSeconds",
        "RedrivePolicy",
        "FifoQueue",
        "ContentBasedDeduplication",
        "KmsMasterKeyId",
        "KmsDataKeyReusePeriodSeconds",
        "DeduplicationScope",
        "FifoThroughputLimit",
        "RedriveAllowPolicy",
        "SqsManagedSseEnabled",
    ]
)
MESSAGE_SYSTEM_ATTRIBUTE_NAMES = frozenset(
    [
        "All",
        "SenderId",
        "SentTimestamp",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
        "SequenceNumber",
        "MessageDeduplicationId",
        "MessageGroupId",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
    ]
)
_BOOL_TEXT = frozenset({"true", "false"})
# settable queue attributes: name -> check of the value (text, as SQS takes them)
_INT_RANGE: dict[str, tuple[int, int]] = {
    "DelaySeconds": (0, 0),  # upper bound from Limits
    "MaximumMessageSize": (1024, 0),  # upper bound from Limits
    "MessageRetentionPeriod": (60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": (0, 0),  # upper bound from Limits
    "VisibilityTimeout": (0, 0),  # upper bound from Limits
    "KmsDataKeyReusePeriodSeconds": (60, 86_400),
}
_FREE_TEXT = frozenset({"Policy", "KmsMasterKeyId"})
_CHOICES = {
    "FifoQueue": _BOOL_TEXT,
    "ContentBasedDeduplication": _BOOL_TEXT,
    "SqsManagedSseEnabled": _BOOL_TEXT,
    "DeduplicationScope": frozenset({"messageGroup", "queue"}),
    "FifoThroughputLimit": frozenset({"perQueue", "perMessageGroupId"}),
}
SETTABLE_QUEUE_ATTRIBUTES = frozenset({*_INT_RANGE, *_FREE_TEXT, *_CHOICES, "RedrivePolicy", "RedriveAllowPolicy"})
REDRIVE_PERMISSIONS = frozenset({"allowAll", "denyAll", "byQueue"})
SOURCE_QUEUE_ARNS_MAX = 10

_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\..+)?")
_GROUP_ID = re.compile(r"[\x21-\x7e]{1,128}")  # alphanumerics and punctuation
_MESSAGE_TEXT = re.compile("[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")
_INT32 = (-(2**31), 2**31 - 1)


# --- requests -------------------------------------------------------------------------------


def parse_request(headers: Mapping[str, str], body: bytes, limits: Limits = SQS_LIMITS) -> SqsRequest:
    """The action and its checked parameters; SqsError for anything SQS would refuse.

    `headers` must look names up case-insensitively or be keyed in lower case."""
    target = _header(headers, "x-amz-target")
    content_type = _header(headers, "content-type")
    if content_type is None or content_type.split(";")[0].strip().lower() != CONTENT_TYPE:
        raise SqsError("SerializationException", f"Content-Type must be {CONTENT_TYPE}.")
    if target is None or not target.startswith(TARGET_PREFIX) or target[len(TARGET_PREFIX) :] not in ACTIONS:
        raise SqsError("InvalidAction", f"The action {(target or '')[:128]} is not valid for this endpoint.")
    action = target[len(TARGET_PREFIX) :]
    if len(body) > limits.max_request_bytes:
        raise SqsError("RequestEntityTooLarge", "The request is too large.")
    try:
        document = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        raise SqsError("SerializationException", "The request body is not valid JSON.") from None
    if not isinstance(document, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    params = _typed(document, INPUTS[action], "")
    request = SqsRequest(action, params)
    _CHECKS[action](request, limits)
    return request


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


def _typed(value: object, shape: Shape, path: str) -> Any:
    """The value if it is of the shape (blobs decoded, unknown members dropped)."""
    if isinstance(shape, Struct):
        if not isinstance(value, dict):
            raise _serialization(path, "an object")
        missing = sorted(name for name in shape.required if value.get(name) is None)
        if missing:
            raise SqsError("MissingParameter", f"The request must contain the parameter {path + missing[0]}.")
        return {
            name: _typed(member, shape.members[name], f"{path}{name}.")
            for name, member in value.items()
            if name in shape.members and member is not None
        }
    if isinstance(shape, ListOf):
        if not isinstance(value, list):
            raise _serialization(path, "a list")
        return [_typed(item, shape.member, path) for item in value]
    if isinstance(shape, MapOf):
        if not isinstance(value, dict):
            raise _serialization(path, "a map")
        return {key: _typed(item, shape.value, f"{path}{key}.") for key, item in value.items()}
    if shape == STRING:
        if not isinstance(value, str):
            raise _serialization(path, "a string")
        return value
    if shape == INTEGER:
        if isinstance(value, bool) or not isinstance(value, int) or not _INT32[0] <= value <= _INT32[1]:
            raise _serialization(path, "an integer")
        return value
    if shape == BOOLEAN:
        if not isinstance(value, bool):
            raise _serialization(path, "a boolean")
        return value
    if not isinstance(value, str):
        raise _serialization(path, "base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _serialization(path, "base64 text") from None


def _serialization(path: str, what: str) -> SqsError:
    return SqsError("SerializationException", f"{path.rstrip('.') or 'The request'} must be {what}.")


def _invalid(name: str, value: object, reason: str) -> SqsError:
    return SqsError("InvalidParameterValue", f"Value {value} for parameter {name} is invalid. Reason: {reason}")


def _in_range(params: dict[str, Any], name: str, low: int, high: int, default: int | None = None) -> None:
    value = params.get(name, default)
    if value is None:
        return
    if not low <= value <= high:
        raise _invalid(name, value, f"Must be between {low} and {high}, if provided.")
    params[name] = value


# --- per-action checks --------------------------------------------------------------------


def _check_queue_name(name: str, *, create: bool) -> None:
    if create:
        stem = name[: -len(".fifo")] if name.endswith(".fifo") else name
        if not (_QUEUE_NAME.fullmatch(stem) and len(name) <= 80):
            raise SqsError(
                "InvalidParameterValue",
                "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
            )
    elif not 0 < len(name.encode("utf-8")) <= 255:
        # AMQP-made queues may have other characters: any name AMQP allows can be looked up
        raise SqsError("InvalidParameterValue", "A queue name is 1 to 255 bytes of UTF-8.")


def _check_queue_attributes(attributes: dict[str, str], limits: Limits, *, create: bool) -> None:
    upper = {
        "DelaySeconds": limits.max_delay_s,
        "MaximumMessageSize": limits.max_message_bytes,
        "ReceiveMessageWaitTimeSeconds": limits.max_wait_time_s,
        "VisibilityTimeout": limits.max_visibility_timeout_s,
    }
    for name, value in attributes.items():
        if name not in SETTABLE_QUEUE_ATTRIBUTES or (name == "FifoQueue" and not create):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:256]}.")
        if name in _INT_RANGE:
            low, high = _INT_RANGE[name][0], upper.get(name, _INT_RANGE[name][1])
            if not (value.isascii() and value.isdigit() and len(value) <= 10 and low <= int(value) <= high):
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        elif name in _CHOICES and value not in _CHOICES[name]:
            raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")
        elif name == "RedrivePolicy" and value != "":  # (empty: none; SetQueueAttributes removes one)
            _check_redrive_policy(value)
        elif name == "RedriveAllowPolicy" and value != "":  # (likewise)
            _check_redrive_allow_policy(value)


def _check_redrive_policy(text: str) -> None:
    try:
        policy = json.loads(text)
    except (ValueError, RecursionError):
        policy = None
    count = policy.get("maxReceiveCount") if isinstance(policy, dict) else None
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if not (
        isinstance(policy, dict)
        and isinstance(policy.get("deadLetterTargetArn"), str)
        and isinstance(count, int)
        and not isinstance(count, bool)
        and 1 <= count <= 1000
    ):
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: Redrive policy is not a valid JSON map "
            "with deadLetterTargetArn and maxReceiveCount (1 to 1000).",
        )


def _check_redrive_allow_policy(text: str) -> None:
    """SQS's rules: redrivePermission allowAll, denyAll or byQueue; sourceQueueArns (1 to 10
    ARNs) with byQueue and only with it."""
    try:
        policy = json.loads(text)
    except (ValueError, RecursionError):
        policy = None
    reason = None
    if not isinstance(policy, dict) or set(policy) - {"redrivePermission", "sourceQueueArns"}:
        reason = "it is not a JSON map of redrivePermission and sourceQueueArns"
    elif policy.get("redrivePermission") not in REDRIVE_PERMISSIONS:
        reason = "redrivePermission must be allowAll, denyAll or byQueue"
    elif (policy["redrivePermission"] == "byQueue") != ("sourceQueueArns" in policy):
        reason = "sourceQueueArns goes with redrivePermission byQueue, and only with it"
    elif "sourceQueueArns" in policy and not (
        isinstance(policy["sourceQueueArns"], list)
        and 1 <= len(policy["sourceQueueArns"]) <= SOURCE_QUEUE_ARNS_MAX
        and all(isinstance(arn, str) for arn in policy["sourceQueueArns"])
    ):
        reason = f"sourceQueueArns must be a list of 1 to {SOURCE_QUEUE_ARNS_MAX} queue ARNs"
    if reason is not None:
        raise SqsError("InvalidAttributeValue", f"Value for parameter RedriveAllowPolicy is invalid. Reason: {reason}.")


def _check_create_queue(request: SqsRequest, limits: Limits) -> None:
    params = request.params
    _check_queue_name(params["QueueName"], create=True)
    attributes = params.setdefault("Attributes", {})
    _check_queue_attributes(attributes, limits, create=True)
    check_tags(params.get("tags", {}))
    if params["QueueName"].endswith(".fifo") != (attributes.get("FifoQueue") == "true"):
        raise SqsError(
            "InvalidParameterValue",
            "The name of a FIFO queue must end with the .fifo suffix, and only a FIFO queue's may.",
        )


def _check_get_queue_url(request: SqsRequest, limits: Limits) -> None:
    _check_queue_name(request.params["QueueName"], create=False)


def _check_list_queues(request: SqsRequest, limits: Limits) -> None:
    _in_range(request.params, "MaxResults", 1, 1000)


def _check_nothing(request: SqsRequest, limits: Limits) -> None:
    pass


def _check_get_queue_attributes(request: SqsRequest, limits: Limits) -> None:
    for name in request.params.get("AttributeNames", []):
        if name not in QUEUE_ATTRIBUTE_NAMES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:256]}.")


def _check_set_queue_attributes(request: SqsRequest, limits: Limits) -> None:
    _check_queue_attributes(request.params["Attributes"], limits, create=False)


def _message_attribute_bytes(name: str, value: AttributeValue) -> int:
    size = len(name.encode("utf-8")) + len(value["DataType"].encode("utf-8"))
    if "BinaryValue" in value:
        return size + len(value["BinaryValue"])
    return size + len(value.get("StringValue", "").encode("utf-8"))


def _check_message_attribute(name: str, value: dict[str, Any], kind: str) -> None:
    lowered = name.lower()
    if (
        not _ATTRIBUTE_NAME.fullmatch(name)
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
        or lowered.startswith(("aws.", "amazon."))
    ):
        raise SqsError("InvalidParameterValue", f"Message ({kind}) attribute name '{name[:256]}' is invalid.")
    if "StringListValues" in value or "BinaryListValues" in value:
        raise SqsError(
            "InvalidParameterValue", "Message attribute list values in SendMessage operation are not supported."
        )
    data_type = value["DataType"]
    match = _DATA_TYPE.fullmatch(data_type) if len(data_type) <= 256 else None
    if match is None:
        raise SqsError(
            "InvalidParameterValue", f"The type of message ({kind}) attribute '{name}' is invalid. {data_type[:256]!r}"
        )
    base = match.group(1)
    wanted = "BinaryValue" if base == "Binary" else "StringValue"
    other = "StringValue" if base == "Binary" else "BinaryValue"
    if not value.get(wanted) or other in value:
        raise SqsError(
            "InvalidParameterValue",
            f"Message ({kind}) attribute '{name}' must contain a non-empty value of type '{base}'.",
        )
    if base == "Number":
        try:
            number = Decimal(value["StringValue"])
        except InvalidOperation:
            number = Decimal("NaN")
        if not number.is_finite() or len(number.as_tuple().digits) > 38:
            raise SqsError(
                "InvalidParameterValue", f"Can't cast the value of message ({kind}) attribute '{name}' to a number."
            )
    elif base == "String" and not _MESSAGE_TEXT.fullmatch(value["StringValue"]):
        raise SqsError(
            "InvalidParameterValue", f"Message ({kind}) attribute '{name}' has characters SQS does not allow."
        )


def _check_message(entry: dict[str, Any], limits: Limits) -> None:
    """One message of SendMessage or of a SendMessageBatch entry."""
    body = entry["MessageBody"]
    if not body:
        raise SqsError("InvalidParameterValue", "The request must contain a non-empty message body.")
    if not _MESSAGE_TEXT.fullmatch(body):
        raise SqsError(
            "InvalidMessageContents",
            "Invalid characters found. The set of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | "
            "#xE000 to #xFFFD | #x10000 to #x10FFFF",
        )
    _in_range(entry, "DelaySeconds", 0, limits.max_delay_s)
    attributes = entry.get("MessageAttributes", {})
    if len(attributes) > limits.max_message_attributes:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum [{limits.max_message_attributes}].",
        )
    for name, value in attributes.items():
        _check_message_attribute(name, value, "user")
    for name, value in entry.get("MessageSystemAttributes", {}).items():
        if name != "AWSTraceHeader" or value.get("DataType") != "String":
            raise SqsError("InvalidParameterValue", f"Message system attribute name '{name[:256]}' is invalid.")
        _check_message_attribute(name, value, "system")
    for name in ("MessageGroupId", "MessageDeduplicationId"):
        if name in entry and not _GROUP_ID.fullmatch(entry[name]):
            raise _invalid(name, entry[name][:128], "Must be 1 to 128 alphanumeric or punctuation characters.")
    if message_bytes(entry) > limits.max_message_bytes:
        raise SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: Message must be shorter than {limits.max_message_bytes} bytes.",
        )


def message_bytes(entry: Mapping[str, Any]) -> int:
    """A message's size as SQS counts it against MaximumMessageSize: body and user attributes."""
    attributes = entry.get("MessageAttributes", {})
    return len(entry["MessageBody"].encode("utf-8")) + sum(
        _message_attribute_bytes(name, value) for name, value in attributes.items()
    )


def _check_send_message(request: SqsRequest, limits: Limits) -> None:
    _check_message(request.params, limits)


def _check_receive_message(request: SqsRequest, limits: Limits) -> None:
    params = request.params
    _in_range(params, "MaxNumberOfMessages", 1, limits.max_messages_per_receive, default=1)
    _in_range(params, "WaitTimeSeconds", 0, limits.max_wait_time_s)
    _in_range(params, "VisibilityTimeout", 0, limits.max_visibility_timeout_s)
    for name in params.get("AttributeNames", []) + params.get("MessageSystemAttributeNames", []):
        if name not in MESSAGE_SYSTEM_ATTRIBUTE_NAMES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:256]}.")
    for name in params.get("MessageAttributeNames", []):
        stem = name[:-2] if name.endswith(".*") else name
        if name not in ("All", ".*") and not _ATTRIBUTE_NAME.fullmatch(stem):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:256]}.")
    if "ReceiveRequestAttemptId" in params and not _GROUP_ID.fullmatch(params["ReceiveRequestAttemptId"]):
        raise _invalid(
            "ReceiveRequestAttemptId", params["ReceiveRequestAttemptId"][:128], "Must be 1 to 128 characters."
        )


def _check_receipt_handle(params: dict[str, Any]) -> None:
    if not params["ReceiptHandle"]:
        raise SqsError("ReceiptHandleIsInvalid", 'The input receipt handle "" is not a valid receipt handle.')


def _check_delete_message(request: SqsRequest, limits: Limits) -> None:
    _check_receipt_handle(request.params)


def _check_change_visibility(request: SqsRequest, limits: Limits) -> None:
    _check_receipt_handle(request.params)
    _in_range(request.params, "VisibilityTimeout", 0, limits.max_visibility_timeout_s)


def _batch_checker(check_entry: Callable[[dict[str, Any], Limits], None]) -> Callable[[SqsRequest, Limits], None]:
    def check(request: SqsRequest, limits: Limits) -> None:
        entries = request.params["Entries"]
        if not entries:
            raise SqsError(
                "EmptyBatchRequest", "There should be at least one SendMessageBatchRequestEntry in the request."
            )
        if len(entries) > limits.max_batch_entries:
            raise SqsError(
                "TooManyEntriesInBatchRequest",
                f"Maximum number of entries per request are {limits.max_batch_entries}. You have sent {len(entries)}.",
            )
        ids = [entry["Id"] for entry in entries]
        for entry_id in ids:
            if not _BATCH_ID.fullmatch(entry_id):
                raise SqsError(
                    "InvalidBatchEntryId",
                    "A batch entry id can only contain alphanumeric characters, hyphens and underscores. "
                    "It can be at most 80 letters long.",
                )
        if len(set(ids)) != len(ids):
            raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id.")
        kept = []
        for entry in entries:
            try:
                check_entry(entry, limits)
            except SqsError as error:
                request.entry_errors[entry["Id"]] = error
            else:
                kept.append(entry)
        request.params["Entries"] = kept

    return check


def _check_send_entry(entry: dict[str, Any], limits: Limits) -> None:
    _check_message(entry, limits)


def _check_handle_entry(entry: dict[str, Any], limits: Limits) -> None:
    _check_receipt_handle(entry)
    _in_range(entry, "VisibilityTimeout", 0, limits.max_visibility_timeout_s)


def _check_send_batch(request: SqsRequest, limits: Limits) -> None:
    total = sum(
        message_bytes(entry) for entry in request.params["Entries"] if isinstance(entry.get("MessageBody"), str)
    )
    if total > limits.max_message_bytes:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {limits.max_message_bytes} bytes. You have sent {total} bytes.",
        )
    _batch_checker(_check_send_entry)(request, limits)


MAX_TAGS = 50  # per queue (SQS's limit)
_TAG_KEY = re.compile(r"[\w\s.:/=+@-]{1,128}")  # letters, digits, spaces and _ . : / = + - @
_TAG_VALUE = re.compile(r"[\w\s.:/=+@-]{0,256}")


def check_tags(tags: Mapping[str, str]) -> None:
    """SQS's limits on queue tags: at most 50, keys 1-128 and values 0-256 of letters, digits,
    spaces and `_ . : / = + - @`, no key starting with "aws:"."""
    if len(tags) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"Too many tags: a queue has at most {MAX_TAGS}.")
    for key, value in tags.items():
        if not _TAG_KEY.fullmatch(key) or key.lower().startswith("aws:"):
            raise SqsError("InvalidParameterValue", f"Tag key '{key[:128]}' is not valid.")
        if not _TAG_VALUE.fullmatch(value):
            raise SqsError("InvalidParameterValue", f"The value of tag '{key[:128]}' is not valid.")


def _check_tag_queue(request: SqsRequest, limits: Limits) -> None:
    check_tags(request.params["Tags"])


def _check_untag_queue(request: SqsRequest, limits: Limits) -> None:
    keys = request.params["TagKeys"]
    if len(keys) > MAX_TAGS or not all(_TAG_KEY.fullmatch(key) for key in keys):
        raise SqsError("InvalidParameterValue", "TagKeys are at most 50 valid tag keys.")


_CHECKS: dict[str, Callable[[SqsRequest, Limits], None]] = {
    "CreateQueue": _check_create_queue,
    "GetQueueUrl": _check_get_queue_url,
    "ListQueues": _check_list_queues,
    "DeleteQueue": _check_nothing,
    "PurgeQueue": _check_nothing,
    "GetQueueAttributes": _check_get_queue_attributes,
    "SetQueueAttributes": _check_set_queue_attributes,
    "SendMessage": _check_send_message,
    "SendMessageBatch": _check_send_batch,
    "ReceiveMessage": _check_receive_message,
    "DeleteMessage": _check_delete_message,
    "DeleteMessageBatch": _batch_checker(_check_handle_entry),
    "ChangeMessageVisibility": _check_change_visibility,
    "ChangeMessageVisibilityBatch": _batch_checker(_check_handle_entry),
    "ListDeadLetterSourceQueues": _check_list_queues,
    "TagQueue": _check_tag_queue,
    "UntagQueue": _check_untag_queue,
    "ListQueueTags": _check_nothing,
}


# --- responses -----------------------------------------------------------------------------

Response = tuple[int, list[tuple[str, str]], bytes]


def success_response(result: Mapping[str, Any], request_id: str) -> Response:
    """200 with the action's output as JSON (bytes values become base64, as blobs are)."""
    body = json.dumps(_jsonable(result), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return 200, _headers(request_id, body), body


def error_response(error: SqsError, request_id: str) -> Response:
    kind = error.kind
    body = json.dumps({"__type": kind.json_type, "message": error.message}, ensure_ascii=False).encode("utf-8")
    fault = "Sender" if kind.sender_fault else "Receiver"
    headers = [*_headers(request_id, body), ("x-amzn-query-error", f"{kind.query_code};{fault}")]
    return kind.http_status, headers, body


def batch_error_entry(entry_id: str, error: SqsError) -> dict[str, Any]:
    """An element of a batch result's `Failed` list."""
    return {"Id": entry_id, "SenderFault": error.kind.sender_fault, "Code": error.code, "Message": error.message}


def send_result(message: Mapping[str, Any], message_id: str, sequence_number: str | None = None) -> dict[str, Any]:
    """SendMessage's result (or a SendMessageBatch Successful entry, with its Id) for a checked message."""
    result: dict[str, Any] = {"MessageId": message_id, "MD5OfMessageBody": md5_of_body(message["MessageBody"])}
    if "Id" in message:
        result["Id"] = message["Id"]
    attributes_md5 = md5_of_attributes(message.get("MessageAttributes", {}))
    if attributes_md5 is not None:
        result["MD5OfMessageAttributes"] = attributes_md5
    system_md5 = md5_of_attributes(message.get("MessageSystemAttributes", {}))
    if system_md5 is not None:
        result["MD5OfMessageSystemAttributes"] = system_md5
    if sequence_number is not None:
        result["SequenceNumber"] = sequence_number
    return result


def received_message(
    *,
    message_id: str,
    receipt_handle: str,
    body: str,
    attributes: Mapping[str, str] | None = None,
    message_attributes: Mapping[str, AttributeValue] | None = None,
) -> dict[str, Any]:
    """One element of ReceiveMessage's `Messages`: the MD5s computed over what is returned."""
    message: dict[str, Any] = {
        "MessageId": message_id,
        "ReceiptHandle": receipt_handle,
        "MD5OfBody": md5_of_body(body),
        "Body": body,
    }
    if attributes:
        message["Attributes"] = dict(attributes)
    if message_attributes:
        message["MessageAttributes"] = dict(message_attributes)
        message["MD5OfMessageAttributes"] = md5_of_attributes(message_attributes)
    return message


def _headers(request_id: str, body: bytes) -> list[tuple[str, str]]:
    return [
        ("Content-Type", CONTENT_TYPE),
        ("Content-Length", str(len(body))),
        ("x-amzn-RequestId", request_id),
    ]


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Mapping):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    return value
