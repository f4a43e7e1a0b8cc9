"""Machine replies as msgpack values, for the member that asked and holds no replica of the group.

Theory of operation: a member that holds a replica of a group hands each of its own requests
the machine's reply when it applies the entry (server/cluster.py). A member that does not hold
the group gets the replies from the group's leader instead (server/remote.py), so every reply a
queue machine or a shard gives must cross the wire: `encode_reply` turns one into a msgpack
value, `decode_reply` back. Plain values (None, bools, ints, strings) are themselves; the rest
is a list tagged by its first item:

  ["R", code, text]                         Rejected
  ["O", accepted, [position, ...]]          Overflowed (a reject-publish queue refused some)
  ["G", message, redelivered, left]         basic.get's (message, redelivered, messages left)
  ["V", [[message, seq, receive id, receive count, first received ms, sent ms], ...]]
                                            an SQS receive's list of Received
  ["H", [result, ...]]                      a DeleteReceived / ChangeVisibility (HandleResult)
  ["F", [[message id, sequence number] | None, ...]]
                                            an EnqueueFifo's per message results
  ["C", ready, consumers, ever had one]     a Sync's QueueCounts
  ["N", [name, ...]]                        a TxnHolders' queue names

Messages are machines/snapshot.py's records (every field a replica keeps). Decoding never
trusts its input: anything malformed raises ReplyError, which the receiver answers as a
refusal of that request rather than a crash.
"""

from __future__ import annotations

from typing import Any

from ..machines.message import Message
from ..machines.queue_types import HandleResult, Overflowed, QueueCounts, Received, Rejected
from ..machines.snapshot import message_from_record, message_record


class ReplyError(ValueError):
    """A reply this code cannot carry, or a malformed encoded one."""


_PLAIN = (type(None), bool, int, str)


def encode_reply(reply: Any) -> Any:
    kind = type(reply)
    if kind in _PLAIN:
        return reply
    if kind is Rejected:
        return ["R", reply.reply_code, reply.reply_text]
    if kind is Overflowed:
        return ["O", reply.accepted, list(reply.rejected)]
    if kind is QueueCounts:
        return ["C", reply.ready_count, reply.active_consumer_count, reply.ever_had_consumer]
    if kind is tuple and len(reply) == 3 and type(reply[0]) is Message:
        message, redelivered, left = reply
        return ["G", message_record(message), redelivered, left]
    if kind is list:
        if not reply:
            return ["L"]
        first = reply[0]
        if all(type(item) is Received for item in reply):
            return [
                "V",
                [
                    [message_record(r.message), r.seq, r.receive_id, r.receive_count, r.first_received_ms, r.sent_ms]
                    for r in reply
                ],
            ]
        if all(type(item) is HandleResult for item in reply):
            return ["H", [str(item) for item in reply]]
        if all(type(item) is str for item in reply):
            return ["N", list(reply)]
        if type(first) in (tuple, type(None)) and all(
            item is None or (type(item) is tuple and len(item) == 2) for item in reply
        ):
            return ["F", [None if item is None else list(item) for item in reply]]
    raise ReplyError(f"a reply of type {kind.__name__} cannot be carried to another member")


def decode_reply(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if type(value) is not list or not value or type(value[0]) is not str:
        raise ReplyError(f"malformed reply {value!r}"[:200])
    tag = value[0]
    try:
        if tag == "R" and len(value) == 3 and type(value[1]) is int and type(value[2]) is str:
            return Rejected(value[1], value[2])
        if tag == "O" and len(value) == 3 and type(value[1]) is int and _ints(value[2]):
            return Overflowed(value[1], list(value[2]))
        if tag == "G" and len(value) == 4 and type(value[2]) is bool and type(value[3]) is int:
            return (_message(value[1]), value[2], value[3])
        if tag == "C" and len(value) == 4 and _ints(value[1:3]) and type(value[3]) is bool:
            return QueueCounts(value[1], value[2], value[3])
        if tag == "L" and len(value) == 1:
            return []
        if tag == "V" and len(value) == 2 and type(value[1]) is list:
            received = []
            for item in value[1]:
                if type(item) is not list or len(item) != 6 or not _ints(item[1:5]):
                    raise ReplyError(f"malformed received message {item!r}"[:200])
                if item[5] is not None and type(item[5]) is not int:
                    raise ReplyError(f"malformed sent time {item[5]!r}")
                received.append(Received(_message(item[0]), *item[1:]))
            return received
        if tag == "H" and len(value) == 2 and type(value[1]) is list:
            return [HandleResult(item) for item in value[1]]
        if tag == "N" and len(value) == 2 and type(value[1]) is list:
            if not all(type(item) is str for item in value[1]):
                raise ReplyError(f"malformed names {value[1]!r}"[:200])
            return list(value[1])
        if tag == "F" and len(value) == 2 and type(value[1]) is list:
            results: list[tuple[str, int] | None] = []
            for item in value[1]:
                if item is None:
                    results.append(None)
                elif type(item) is list and len(item) == 2 and type(item[0]) is str and type(item[1]) is int:
                    results.append((item[0], item[1]))
                else:
                    raise ReplyError(f"malformed FIFO send result {item!r}"[:200])
            return results
    except ReplyError:
        raise
    except (TypeError, ValueError) as exc:
        raise ReplyError(f"malformed reply {tag!r}: {exc}") from None
    raise ReplyError(f"malformed reply {value!r}"[:200])


def _ints(values: Any) -> bool:
    return type(values) is list and all(type(v) is int for v in values)


def _message(record: Any) -> Message:
    if type(record) is not list:
        raise ReplyError(f"malformed message {record!r}"[:200])
    try:
        return message_from_record(record)
    except (TypeError, ValueError) as exc:
        raise ReplyError(f"malformed message: {exc}") from None
