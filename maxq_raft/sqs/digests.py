"""The MD5 digests SQS returns with a message (MD5OfMessageBody, MD5OfMessageAttributes), which
SDKs that check them (Java, Go, .NET; boto3 does not) compare with their own.

The body's is the MD5 of its UTF-8 bytes. The attributes' is AWS's documented encoding
(SQS developer guide, "Calculating the MD5 message digest for message attributes"): for each
attribute in ascending order of name, the name, the data type, a transport byte (1 for String
and Number values, 2 for Binary) and the value, each of name, type and value preceded by its
length as a 4-byte big-endian integer; the digest of the concatenation, in lower-case hex.
MD5OfMessageSystemAttributes (AWSTraceHeader) is the same encoding over the system attributes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import NotRequired, TypedDict

STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2


class AttributeValue(TypedDict):
    """A message attribute as the JSON protocol carries it (BinaryValue already decoded)."""

    DataType: str
    StringValue: NotRequired[str]
    BinaryValue: NotRequired[bytes]


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: Mapping[str, AttributeValue]) -> str | None:
    """None for no attributes: SQS leaves MD5OfMessageAttributes out then."""
    if not attributes:
        return None
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        value = attributes[name]
        _add(digest, name.encode("utf-8"))
        _add(digest, value["DataType"].encode("utf-8"))
        if "BinaryValue" in value:
            digest.update(bytes([BINARY_TRANSPORT]))
            _add(digest, value["BinaryValue"])
        else:
            digest.update(bytes([STRING_TRANSPORT]))
            _add(digest, value.get("StringValue", "").encode("utf-8"))
    return digest.hexdigest()


def _add(digest: hashlib._Hash, data: bytes) -> None:
    digest.update(len(data).to_bytes(4, "big"))
    digest.update(data)
