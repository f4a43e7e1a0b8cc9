"""SQS's errors as the JSON 1.0 protocol carries them, and the exception the sqs modules raise.

SQS moved from the query protocol (XML) to JSON with the `awsQueryCompatible` trait: an error's
JSON body names a `__type`, and the `x-amzn-query-error: CODE;Sender` header keeps the code the
query protocol had. Clients read both: botocore takes the header's code as `Error.Code` (what
users match on, e.g. `AWS.SimpleQueueService.NonExistentQueue`) and the `__type`'s short name to
pick the modelled exception class (`client.exceptions.QueueDoesNotExist`). So every error here has
both, with the HTTP status SQS answers it with.

Modelled errors (shapes in botocore's sqs model) are `com.amazonaws.sqs#<Shape>`. The
authentication errors come from AWS's common front end, whose JSON names differ from the query
codes (`UnrecognizedClientException` is `InvalidClientTokenId`). For the unmodelled validation
errors (InvalidParameterValue, MissingParameter) AWS documents only the query code; our `__type`
for them is `com.amazonaws.sqs#<code>` — clients see the code from the header either way.
"""

from __future__ import annotations

from dataclasses import dataclass

SQS_NAMESPACE = "com.amazonaws.sqs#"
CORAL_NAMESPACE = "com.amazon.coral.service#"


@dataclass(frozen=True)
class ErrorKind:
    json_type: str  # the body's "__type"
    query_code: str  # the x-amzn-query-error header's code: boto3's Error.Code
    http_status: int
    sender_fault: bool = True  # "Sender" or "Receiver" in the header


def _modelled(shape: str, query_code: str, http_status: int) -> ErrorKind:
    return ErrorKind(SQS_NAMESPACE + shape, query_code, http_status)


# Keyed by the name this code base raises with: the shape name for modelled errors, otherwise
# the query code. Statuses as in the SQS API reference.
CATALOGUE: dict[str, ErrorKind] = {
    # modelled in the sqs service model
    "BatchEntryIdsNotDistinct": _modelled(
        "BatchEntryIdsNotDistinct", "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400
    ),
    "BatchRequestTooLong": _modelled("BatchRequestTooLong", "AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "EmptyBatchRequest": _modelled("EmptyBatchRequest", "AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "InvalidAddress": _modelled("InvalidAddress", "InvalidAddress", 404),
    "InvalidAttributeName": _modelled("InvalidAttributeName", "InvalidAttributeName", 400),
    "InvalidAttributeValue": _modelled("InvalidAttributeValue", "InvalidAttributeValue", 400),
    "InvalidBatchEntryId": _modelled("InvalidBatchEntryId", "AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "InvalidIdFormat": _modelled("InvalidIdFormat", "InvalidIdFormat", 400),
    "InvalidMessageContents": _modelled("InvalidMessageContents", "InvalidMessageContents", 400),
    "InvalidSecurity": _modelled("InvalidSecurity", "InvalidSecurity", 403),
    "MessageNotInflight": _modelled("MessageNotInflight", "AWS.SimpleQueueService.MessageNotInflight", 400),
    "OverLimit": _modelled("OverLimit", "OverLimit", 403),
    "PurgeQueueInProgress": _modelled("PurgeQueueInProgress", "AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "QueueDeletedRecently": _modelled("QueueDeletedRecently", "AWS.SimpleQueueService.QueueDeletedRecently", 400),
    "QueueDoesNotExist": _modelled("QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": _modelled("QueueNameExists", "QueueAlreadyExists", 400),
    "ReceiptHandleIsInvalid": _modelled("ReceiptHandleIsInvalid", "ReceiptHandleIsInvalid", 404),
    "RequestThrottled": _modelled("RequestThrottled", "RequestThrottled", 403),
    "TooManyEntriesInBatchRequest": _modelled(
        "TooManyEntriesInBatchRequest", "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400
    ),
    "UnsupportedOperation": _modelled("UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation", 400),
    # SQS's common, unmodelled errors
    "InvalidParameterValue": _modelled("InvalidParameterValue", "InvalidParameterValue", 400),
    "MissingParameter": _modelled("MissingParameter", "MissingParameter", 400),
    # the AWS front end's
    "InvalidAction": ErrorKind(CORAL_NAMESPACE + "UnknownOperationException", "InvalidAction", 400),
    "SerializationException": ErrorKind(CORAL_NAMESPACE + "SerializationException", "SerializationException", 400),
    "AccessDenied": ErrorKind(CORAL_NAMESPACE + "AccessDeniedException", "AccessDenied", 403),
    "RequestEntityTooLarge": ErrorKind(
        CORAL_NAMESPACE + "RequestEntityTooLargeException", "RequestEntityTooLarge", 413
    ),
    # a cluster that cannot commit now, or no answer in time: clients retry a 503
    "ServiceUnavailable": ErrorKind(
        CORAL_NAMESPACE + "ServiceUnavailableException", "ServiceUnavailable", 503, sender_fault=False
    ),
    "InternalError": ErrorKind(CORAL_NAMESPACE + "InternalFailure", "InternalError", 500, sender_fault=False),
    "MissingAuthenticationToken": ErrorKind(
        CORAL_NAMESPACE + "MissingAuthenticationTokenException", "MissingAuthenticationToken", 403
    ),
    "IncompleteSignature": ErrorKind(CORAL_NAMESPACE + "IncompleteSignatureException", "IncompleteSignature", 400),
    "InvalidClientTokenId": ErrorKind(CORAL_NAMESPACE + "UnrecognizedClientException", "InvalidClientTokenId", 403),
    "SignatureDoesNotMatch": ErrorKind(CORAL_NAMESPACE + "InvalidSignatureException", "SignatureDoesNotMatch", 403),
}


class SqsError(Exception):
    """An error to answer a request with: `code` is a CATALOGUE key, `message` SQS's text."""

    def __init__(self, code: str, message: str) -> None:
        if code not in CATALOGUE:
            raise KeyError(f"not an SQS error code: {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def kind(self) -> ErrorKind:
        return CATALOGUE[self.code]
