"""Partitioned queues (`x-partitions: N`, issue #19 item 4): one queue name, N queues in N groups.

Why: a queue is one machine in one shard group, applied in order on one core of its leader; a
queue that must go faster than one core needs its messages spread over several machines, and
messages that must stay in order need to land in the same one.

What: a queue declared with `x-partitions: N` (N > 1) is N queues. Partition 0 is the queue of
that name itself; partition i (1 <= i < N) is the queue `amq.partition-<i>.<name>`, a name no
client may declare itself (the `amq.` prefix is refused), declared with the same arguments minus
`x-partitions`. A publish routed to the name goes to one partition: the hash of its
`x-partition-key` header if it has one, else of its routing key (`MetadataMachine.route`), so
messages with the same key keep their order. Whatever reaches the name by another path goes to
partition 0, never lost. A partition's shard group is its parent's hash group moved on by its
index (`placement.hash_group`), so the N partitions are in N groups while there are that many.

Everything here is pure: names, the partition of a key, the group offset.
"""

from __future__ import annotations

import zlib

ARGUMENT = "x-partitions"
KEY_HEADER = "x-partition-key"
PARTITIONS_MAX = 64
PREFIX = "amq.partition-"
FEATURE = "partitions"
NAME_BYTES_MAX = 255  # AMQP's short string: a partition's name must still be one
# Arguments a partitioned queue refuses: each would make its partitions act apart (each expiring,
# deleting itself or belonging to one connection on its own).
REFUSED_WITH = ("x-expires",)


def partition_name(parent: str, index: int) -> str:
    """The queue that holds partition `index` of `parent` (partition 0 is `parent` itself)."""
    return parent if index == 0 else f"{PREFIX}{index}.{parent}"


def partition_names(parent: str, count: int) -> list[str]:
    return [partition_name(parent, i) for i in range(count)]


def parent_of(name: str) -> tuple[str, int] | None:
    """(parent name, index) for a partition queue's name `amq.partition-<i>.<parent>` (i >= 1),
    else None."""
    if not name.startswith(PREFIX):
        return None
    digits, dot, parent = name[len(PREFIX) :].partition(".")
    if not dot or not parent or not digits.isdigit() or digits[0] == "0" or len(digits) > 2:
        return None
    index = int(digits)
    return (parent, index) if index < PARTITIONS_MAX else None


def partition_count(arguments: object) -> int:
    """How many partitions a queue with these (validated) arguments has: 1 if not partitioned."""
    if not isinstance(arguments, dict):
        return 1
    value = arguments.get(ARGUMENT)
    return value if type(value) is int and value > 1 else 1


def partition_of_key(key: bytes, count: int) -> int:
    """The partition a message with this key goes to (crc32, as every member computes it)."""
    return zlib.crc32(key) % count


def check_count(value: object) -> str | None:
    """RabbitMQ-style reason why an `x-partitions` value is refused (None: accepted)."""
    if type(value) is not int:
        return f"{{unacceptable_type,{type(value).__name__}}}"
    if not 1 <= value <= PARTITIONS_MAX:
        return f"{{value_out_of_range,{value},1,{PARTITIONS_MAX}}}"
    return None


def declare_refusal(
    name: str, count: int, exclusive: bool, auto_delete: bool, arguments: dict[str, object]
) -> str | None:
    """Why a queue cannot be declared with `count` partitions (None: it can)."""
    if count <= 1:
        return None
    if exclusive or auto_delete:
        return "a partitioned queue cannot be exclusive or auto-delete: its partitions would go one by one"
    for key in REFUSED_WITH:
        if key in arguments:
            return f"a partitioned queue cannot have {key}: its partitions would expire one by one"
    if len(partition_name(name, count - 1).encode()) > NAME_BYTES_MAX:
        return f"the name is too long for {count} partitions (their names add {len(PREFIX) + 3} bytes)"
    return None
