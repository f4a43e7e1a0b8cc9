"""Queue URLs ↔ (vhost, queue).

SQS names a queue by URL: `https://sqs.REGION.amazonaws.com/ACCOUNT/NAME`. Here the account's
place holds the vhost: `http(s)://HOST:PORT/<vhost>/<queue>`, each percent-encoded as a whole
path segment (every byte of its UTF-8 but the unreserved A-Z a-z 0-9 - . _ ~ becomes %XX), so
the default vhost "/" is `%2F` (as in RabbitMQ's management API) and a URL always has exactly
two segments: `http://localhost:9324/%2F/orders`, `http://localhost:9324/prod/jobs.fifo`.
SQS queue names need no escaping; AMQP queue names with other characters get it.

The host part is not checked here (clients send the URL the server gave them, and a load
balancer may have rewritten the host): the server decides whether to care.
"""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit

from .errors import SqsError

MAX_URL_CHARS = 2048
MAX_NAME_BYTES = 255  # AMQP's short string: the longest vhost or queue name


def queue_url(base_url: str, vhost: str, queue: str) -> str:
    """`base_url` is the endpoint as clients reach it, e.g. http://localhost:9324."""
    return f"{base_url.rstrip('/')}/{quote(vhost, safe='')}/{quote(queue, safe='')}"


def parse_queue_url(url: str) -> tuple[str, str]:
    """(vhost, queue) named by a queue URL (or by its path alone); InvalidAddress if malformed."""
    if len(url) > MAX_URL_CHARS:
        raise _invalid(url)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https", "") or parts.query or parts.fragment:
        raise _invalid(url)
    if parts.scheme and not parts.netloc:
        raise _invalid(url)
    segments = parts.path.split("/")
    if len(segments) != 3 or segments[0] != "":
        raise _invalid(url)
    try:
        vhost, queue = (unquote(segment, errors="strict") for segment in segments[1:])
    except UnicodeDecodeError:
        raise _invalid(url) from None
    for name in (vhost, queue):
        if not name or len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise _invalid(url)
    return vhost, queue


def _invalid(url: str) -> SqsError:
    return SqsError("InvalidAddress", f"The address {url[:256]} is not valid for this endpoint.")
