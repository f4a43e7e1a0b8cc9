"""Queue arguments (x-message-ttl, x-max-length, ...): validated at queue.declare, parsed once.

Theory of operation: `parse_queue_arguments(vhost, name, arguments)` checks the optional
arguments of a queue.declare as rabbit_amqqueue:declare_args/0 does and returns a
`QueueSettings`, or raises `QueueArgumentError` with RabbitMQ's 406 text ("invalid arg
'x-max-length' for queue 'q' in vhost '/': {value_negative,-1}"). The queue machine takes the
parsed settings, never the raw table, so it has one place to look and nothing to re-validate;
the same table is in the replicated metadata record, so every replica parses the same settings.

Field tables lose the integer width on decoding, so every int passes as one of RabbitMQ's
integer types (byte, short, signedint, long); the other types are named as rabbit_binary
names them in `{unacceptable_type,...}`.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any, NamedTuple, TypeAlias

from . import partitions, placement

# A queue's (or binding's) x-arguments as the client sent them: a field table, so the values can
# be anything; the validators below check each before the settings rely on it.
Arguments: TypeAlias = dict[str, Any]

# rabbit_misc:check_expiry: TTLs and expiries are bounded by Erlang's timer (2^32 - 1 ms).
EXPIRY_MS_MAX = 4294967295
OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
MAX_SUPPORTED_PRIORITY = 255  # rabbit_amqqueue: ?MAX_SUPPORTED_PRIORITY
SUPPORTED_QUEUE_TYPES = ("classic", "quorum")  # x-queue-type values declared here (no streams)
# x-cache-size: ids a deduplication window holds (dedup.py). The plugin requires the argument on
# its exchanges; here it has a default, and a ceiling, so a queue's window has a known memory
# cost (docs/queue-features.md measures it) and a single node reads it back whole at a restart.
DEDUP_CACHE_SIZE_DEFAULT = 100_000
DEDUP_CACHE_SIZE_MAX = 1_000_000


class QueueSettings(NamedTuple):
    """What a queue's arguments ask of its machine; None means "not set"."""

    message_ttl_ms: int | None = None  # x-message-ttl
    expires_ms: int | None = None  # x-expires: deleted after this long unused
    max_length: int | None = None  # x-max-length: ready messages
    max_length_bytes: int | None = None  # x-max-length-bytes: body bytes of ready messages
    overflow: str = "drop-head"  # x-overflow
    dead_letter_exchange: str | None = None  # x-dead-letter-exchange ("" is the default exchange)
    dead_letter_routing_key: str | None = None  # x-dead-letter-routing-key
    max_priority: int | None = None  # x-max-priority: a priority queue with levels 0..max_priority
    delivery_limit: int | None = None  # x-delivery-limit: returns allowed before dead lettering
    retry_backoff_ms: int | None = None  # x-retry-backoff-ms: a returned message waits this long...
    retry_backoff_multiplier: float = 2  # x-retry-backoff-multiplier: ... times this per earlier return
    retry_backoff_max_ms: int = 3_600_000  # x-retry-backoff-max-ms: ... at most this long
    single_active_consumer: bool = False  # x-single-active-consumer
    fifo: bool = False  # x-sqs-fifo: an SQS FIFO queue (fifo.py): groups and deduplication
    # x-message-deduplication (rabbitmq-message-deduplication's queue argument): drop a publish
    # whose x-deduplication-header was seen in the window (dedup.py), which holds the ids of the
    # last x-cache-size recorded publishes (DEDUP_CACHE_SIZE_DEFAULT when absent), each for
    # x-cache-ttl ms (None: until evicted by count).
    deduplication: bool = False
    dedup_cache_size: int | None = None  # x-cache-size
    dedup_cache_ttl_ms: int | None = None  # x-cache-ttl
    consume_rate_limit: int | None = None  # x-consume-rate-limit: deliveries per second (consume_rate.py)
    publish_rate_limit: int | None = None  # x-publish-rate-limit: publishes per second (the shell's)
    # x-trace: record every step of each message's life (the shell's: server/tracer.py); with
    # x-trace-bodies its body too; kept x-trace-retention ms and at most x-trace-retention-bytes
    # per queue (None: TRACE_RETENTION_MS_DEFAULT, TRACE_RETENTION_BYTES_DEFAULT).
    trace: bool = False
    trace_bodies: bool = False
    trace_retention_ms: int | None = None
    trace_retention_bytes: int | None = None

    def retry_delay_ms(self, returns: int) -> int:
        """The back-off of a message returned for the `returns`-th time (1 = the first); asked
        only of a queue with x-retry-backoff-ms set."""
        delay: float = self.retry_backoff_ms or 0
        cap = self.retry_backoff_max_ms
        for _ in range(returns - 1):
            if delay >= cap:
                break
            delay = delay * self.retry_backoff_multiplier
        return min(int(delay), cap)

    @property
    def limited(self) -> bool:
        return self.max_length is not None or self.max_length_bytes is not None


DEFAULT_SETTINGS = QueueSettings()


class QueueArgumentError(Exception):
    """A queue argument RabbitMQ would refuse: 406 PRECONDITION_FAILED with `reply_text`."""

    def __init__(self, reply_text: str) -> None:
        super().__init__(reply_text)
        self.reply_text = reply_text


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        # The width is lost in decoding; clients (pika) send 32-bit values as 'I' (signedint).
        return "signedint" if -(1 << 31) <= value < (1 << 31) else "long"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, Decimal):
        return "decimal"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    if value is None:
        return "void"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else value


def _check_int(value: Any) -> str | None:
    return None if _is_int(value) else f"{{unacceptable_type,{_type_name(value)}}}"


def _check_non_neg_int(value: Any) -> str | None:
    error = _check_int(value)
    if error is None and value < 0:
        return f"{{value_negative,{value}}}"
    return error


def _check_expiry(value: int) -> str | None:
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > EXPIRY_MS_MAX:
        return f"{{value_too_large,{value},{EXPIRY_MS_MAX}}}"
    return None


def _check_message_ttl(value: Any, arguments: Arguments) -> str | None:
    return _check_int(value) or _check_expiry(value)


def _check_expires(value: Any, arguments: Arguments) -> str | None:
    error = _check_int(value)
    if error is None and value == 0:
        return f"{{value_zero,{value}}}"
    return error or _check_expiry(value)


def _check_dlx(value: Any, arguments: Arguments) -> str | None:
    return None if isinstance(value, (str, bytes)) else f"{{unacceptable_type,{_type_name(value)}}}"


def _check_dlrk(value: Any, arguments: Arguments) -> str | None:
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{_type_name(value)}}}"
    if "x-dead-letter-exchange" not in arguments:
        return "routing_key_but_no_dlx_defined"
    return None


def _check_max_priority(value: Any, arguments: Arguments) -> str | None:
    error = _check_non_neg_int(value)
    if error is None and value > MAX_SUPPORTED_PRIORITY:
        return f"{{max_value_exceeded,{value}}}"
    return error


def _check_multiplier(value: Any, arguments: Arguments) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return f"{{unacceptable_type,{_type_name(value)}}}"
    if not 1 <= value <= 1000:
        return f"{{value_out_of_range,{value},1,1000}}"
    return None


def _check_backoff(value: Any, arguments: Arguments) -> str | None:
    return _check_non_neg_int(value) or _check_expiry(value)


def _check_bool(value: Any, arguments: Arguments) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{_type_name(value)}}}"


def _check_fifo(value: Any, arguments: Arguments) -> str | None:
    # A priority queue serves by lane, not in the order FIFO groups need; AMQP consumers are
    # refused on a FIFO queue, so single active consumer would mean nothing.
    error = _check_bool(value, arguments)
    if error is None and value and "x-max-priority" in arguments:
        return "fifo_with_max_priority"
    return error


def _check_cache_size(value: Any, arguments: Arguments) -> str | None:
    # (the plugin's own check: an integer greater than 0; the ceiling is ours)
    error = _check_int(value)
    if error is None and value <= 0:
        return f"{{value_zero,{value}}}" if value == 0 else f"{{value_negative,{value}}}"
    if error is None and value > DEDUP_CACHE_SIZE_MAX:
        return f"{{value_too_large,{value},{DEDUP_CACHE_SIZE_MAX}}}"
    return error


def _check_cache_ttl(value: Any, arguments: Arguments) -> str | None:
    # (the plugin: an integer greater than 0, in ms; bounded as every other TTL here)
    error = _check_int(value)
    if error is None and value == 0:
        return f"{{value_zero,{value}}}"
    return error or _check_expiry(value)


RATE_LIMIT_MAX = 1_000_000  # per second: x-consume-rate-limit, x-publish-rate-limit
# x-trace-retention is bounded by a year, x-trace-retention-bytes by 1 TiB: past that, a typo.
TRACE_RETENTION_MS_MAX = 366 * 86_400_000
TRACE_RETENTION_BYTES_MAX = 1 << 40


def _check_positive(value: Any, maximum: int) -> str | None:
    error = _check_int(value)
    if error is None and not 1 <= value <= maximum:
        return f"{{value_out_of_range,{value},1,{maximum}}}"
    return error


def _check_rate(value: Any, arguments: Arguments) -> str | None:
    error = _check_int(value)
    if error is None and not 1 <= value <= RATE_LIMIT_MAX:
        return f"{{value_out_of_range,{value},1,{RATE_LIMIT_MAX}}}"
    return error


def _check_overflow(value: Any, arguments: Arguments) -> str | None:
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{_type_name(value)}}}"
    return None if _text(value) in OVERFLOW_MODES else "invalid_overflow"


def _check_locator(value: Any, arguments: Arguments) -> str | None:
    # (rabbit_amqqueue:check_queue_leader_locator_arg)
    if not isinstance(value, (str, bytes)):
        return f"{{unacceptable_type,{_type_name(value)}}}"
    return None if _text(value) in placement.LOCATORS else "invalid_queue_locator_arg"


# In rabbit_amqqueue:declare_args/0 order: the first failing argument is the one reported.
_VALIDATORS: tuple[tuple[str, Callable[[Any, Arguments], str | None]], ...] = (
    ("x-expires", _check_expires),
    ("x-message-ttl", _check_message_ttl),
    ("x-dead-letter-exchange", _check_dlx),
    ("x-dead-letter-routing-key", _check_dlrk),
    ("x-max-length", lambda v, a: _check_non_neg_int(v)),
    ("x-max-length-bytes", lambda v, a: _check_non_neg_int(v)),
    ("x-max-priority", _check_max_priority),
    ("x-delivery-limit", lambda v, a: _check_non_neg_int(v)),
    ("x-retry-backoff-ms", _check_backoff),
    ("x-retry-backoff-multiplier", _check_multiplier),
    ("x-retry-backoff-max-ms", _check_backoff),
    ("x-overflow", _check_overflow),
    ("x-single-active-consumer", _check_bool),
    (placement.LOCATOR_ARGUMENT, _check_locator),
    ("x-sqs-fifo", _check_fifo),
    ("x-message-deduplication", _check_bool),
    ("x-cache-size", _check_cache_size),
    ("x-cache-ttl", _check_cache_ttl),
    ("x-consume-rate-limit", _check_rate),
    ("x-publish-rate-limit", _check_rate),
    ("x-trace", _check_bool),
    ("x-trace-bodies", _check_bool),
    ("x-trace-retention", lambda v, a: _check_positive(v, TRACE_RETENTION_MS_MAX)),
    ("x-trace-retention-bytes", lambda v, a: _check_positive(v, TRACE_RETENTION_BYTES_MAX)),
    (partitions.ARGUMENT, lambda v, a: partitions.check_count(v)),
)


def validate_queue_arguments(vhost: str, name: str, arguments: Arguments) -> None:
    """Raise QueueArgumentError for the first argument RabbitMQ would refuse."""
    for key, check in _VALIDATORS:
        if key in arguments:
            error = check(arguments[key], arguments)
            if error is not None:
                raise QueueArgumentError(f"invalid arg '{key}' for queue '{name}' in vhost '{vhost}': {error}")


def parse_queue_arguments(vhost: str, name: str, arguments: Arguments | None) -> QueueSettings:
    """The settings of a queue declared with `arguments` (validated first)."""
    if not arguments:
        return DEFAULT_SETTINGS
    validate_queue_arguments(vhost, name, arguments)
    dlx = arguments.get("x-dead-letter-exchange")
    dlrk = arguments.get("x-dead-letter-routing-key")
    return QueueSettings(
        message_ttl_ms=arguments.get("x-message-ttl"),
        expires_ms=arguments.get("x-expires"),
        max_length=arguments.get("x-max-length"),
        max_length_bytes=arguments.get("x-max-length-bytes"),
        overflow=_text(arguments.get("x-overflow", "drop-head")),
        dead_letter_exchange=None if dlx is None else _text(dlx),
        dead_letter_routing_key=None if dlrk is None else _text(dlrk),
        max_priority=arguments.get("x-max-priority"),
        delivery_limit=arguments.get("x-delivery-limit"),
        retry_backoff_ms=arguments.get("x-retry-backoff-ms") or None,
        retry_backoff_multiplier=float(arguments.get("x-retry-backoff-multiplier", 2)),
        retry_backoff_max_ms=arguments.get("x-retry-backoff-max-ms", 3_600_000),
        single_active_consumer=arguments.get("x-single-active-consumer") is True,
        fifo=arguments.get("x-sqs-fifo") is True,
        deduplication=arguments.get("x-message-deduplication") is True,
        dedup_cache_size=arguments.get("x-cache-size"),
        dedup_cache_ttl_ms=arguments.get("x-cache-ttl"),
        consume_rate_limit=arguments.get("x-consume-rate-limit"),
        publish_rate_limit=arguments.get("x-publish-rate-limit"),
        trace=arguments.get("x-trace") is True,
        trace_bodies=arguments.get("x-trace-bodies") is True,
        trace_retention_ms=arguments.get("x-trace-retention"),
        trace_retention_bytes=arguments.get("x-trace-retention-bytes"),
    )


def settings_or_default(vhost: str, name: str, arguments: Arguments | None) -> QueueSettings:
    """For queues recovered from the log (declared before validation existed): never raises."""
    try:
        return parse_queue_arguments(vhost, name, arguments)
    except QueueArgumentError:
        return DEFAULT_SETTINGS


def parse_expiration(expiration: str) -> int:
    """A message's `expiration` property as a TTL in ms (rabbit_basic:parse_expiration).

    Raises ValueError with RabbitMQ's reason (`no_integer`, `{value_negative,-1}`,
    `{leftover_string,"x"}`) for a value the channel must refuse with 406."""
    text = expiration
    digits = 0
    if text[:1] in ("+", "-"):
        digits = 1
    while digits < len(text) and text[digits].isdigit():
        digits += 1
    if digits == 0 or not text[:digits].lstrip("+-"):
        raise ValueError("no_integer")
    value = int(text[:digits])
    if digits < len(text):
        raise ValueError(f'{{leftover_string,"{text[digits:]}"}}')
    error = _check_expiry(value)
    if error is not None:
        raise ValueError(error)
    return value
