"""The AMQP half of scripts/fuzz: valid client byte streams, seeded mutations of them, and one
connection that sends a case and reads the server's answer until it closes.

Theory of operation: `build_case(seed, index)` makes connection number `index` of a run from its
own Random (seeded with both numbers), so any case can be rebuilt alone (`scripts/fuzz --replay
INDEX`). A case is a valid stream first, made with the repo's own encoder (amqp/frames.py,
amqp/spec.py, amqp/properties.py): the protocol header, a PLAIN guest login, tune-ok, open, a few
channels (one in tx mode, one in confirm mode), then 10-60 operations a client does (declares,
binds, publishes with header and body frames, consume, get, ack, tx, heartbeats...), then
channel.close and connection.close. Then 0-3 mutations are applied to its list of frames (bit
flips, inserted or deleted bytes, truncation, a lying size field, a wrong type or end byte,
swapped method ids, corrupted field tables, huge length prefixes, splices from another stream,
repeats, out-of-range channels, content frames out of order, heartbeats on a channel...). A frame
a mutation made or changed is a `Mutated` (a bytes subclass), so what was sent is counted exactly:
every frame written to the socket counts as sent, and a Mutated one also as mutated. A changed
protocol header is not a frame: its cases count their frames sent as any other.

The queues and exchanges a case names come from small pools (`fz-q0`..., `fz-x0`...) with fixed
arguments (queues hold at most 100 messages), so that valid cases agree with each other and the
broker's state stays bounded; mutated names make strays, which scripts/fuzz deletes as it goes.

`run_case` sends the stream in pieces of 1-16 frames, a few cut at random byte offsets (so frames
also arrive split across reads), reading whatever the server answered between pieces and stopping
once it hangs up or sends connection.close (so frames sent are, give or take a piece, frames the
server read); then it shuts its write side and reads until the server closes, within HANG_TIMEOUT_S. The
outcome names how the server ended it: the first connection.close code, else the channel.close
codes, else a bare close ("eof"); a reply that is not well-formed AMQP, an internal error (541),
or no close in time is a failure.
"""

from __future__ import annotations

import bisect
import random
import select
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from maxq_raft.amqp import spec
from maxq_raft.amqp.errors import DecodeError, FrameError
from maxq_raft.amqp.frames import HEARTBEAT_FRAME, PROTOCOL_HEADER, FrameReader, encode_frame, encode_method_frame
from maxq_raft.amqp.properties import BasicProperties, encode_content_header, encode_properties
from maxq_raft.amqp.values import encode_table

HANG_TIMEOUT_S = 10.0  # after our FIN, the server must close within this
CONNECT_TIMEOUT_S = 5.0
QUEUES = [f"fz-q{i}" for i in range(8)]
QUEUE_ARGS = {"x-max-length": 100}  # every pool queue is declared with these: valid redeclares agree
EXCHANGES = {f"fz-x{i}": kind for i, kind in enumerate(["direct", "topic", "fanout", "headers"])}
STANDARD_EXCHANGES = ["", "amq.direct", "amq.topic", "amq.fanout", "amq.headers"]
_FRAME_HEADER = struct.Struct(">BHI")
CONNECTION_CLOSE = struct.pack(">HH", 10, 50)  # a method payload's start; seen in a reply, we stop sending


@dataclass
class Case:
    """One connection's bytes: the protocol header and the frames after it."""

    index: int
    header: bytes
    frames: list[bytes]
    mutations: list[str] = field(default_factory=list)

    def data(self) -> bytes:
        return self.header + b"".join(self.frames)


# ------------------------------------------------------------------------------ valid streams


def _props(rng: random.Random) -> bytes:
    headers: dict[str, object] = {"k": "v", "n": rng.randint(-5, 5)}
    if rng.random() < 0.3:
        headers.update({"nested": {"a": [1, 2.5, None, b"x"]}, "x-match": "any", "flag": True})
    return encode_properties(
        BasicProperties(
            content_type=rng.choice([None, "text/plain", "application/json"]),
            headers=headers if rng.random() < 0.7 else None,
            delivery_mode=rng.choice([None, 1, 2]),
            priority=rng.choice([None, 0, 5, 9]),
            expiration=rng.choice([None, None, "60000", "0"]),
            message_id=rng.choice([None, "m-1"]),
            timestamp=rng.choice([None, 1_700_000_000]),
            correlation_id=rng.choice([None, "c"]),
        )
    )


def content_frames(rng: random.Random, channel: int, method: spec.Method, frame_max: int) -> list[bytes]:
    """A method, its content header and its body frames, each frame separate."""
    body = rng.randbytes(rng.choice([0, 1, 16, 300, 5000, 20000]))
    chunk = frame_max - 8
    frames = [
        encode_method_frame(channel, method),
        encode_frame(spec.FRAME_HEADER, channel, encode_content_header(method.CLASS_ID, len(body), _props(rng))),
    ]
    frames += [encode_frame(spec.FRAME_BODY, channel, body[i : i + chunk]) for i in range(0, len(body), chunk)]
    return frames


def _operation(rng: random.Random, channel: int, tag_prefix: str, frame_max: int) -> list[bytes]:
    """The frames of one thing a client does on `channel`."""
    queue = rng.choice(QUEUES)
    exchange = rng.choice(list(EXCHANGES))
    roll = rng.random()
    methods: list[spec.Method]
    if roll < 0.30:
        target = rng.choice([exchange, "", "", "amq.topic", "amq.fanout"])
        key = queue if target == "" else rng.choice([queue, "a.b", "k", ""])
        method = spec.BasicPublish(exchange=target, routing_key=key, mandatory=rng.random() < 0.2)
        return content_frames(rng, channel, method, frame_max)
    if roll < 0.40:
        methods = [spec.QueueDeclare(queue=queue, arguments=QUEUE_ARGS)]
    elif roll < 0.45:
        methods = [spec.ExchangeDeclare(exchange=exchange, type=EXCHANGES[exchange])]
    elif roll < 0.52:
        source = rng.choice([exchange, "amq.direct", "amq.topic", "amq.headers"])
        args = {"x-match": "any", "k": "v"} if rng.random() < 0.5 else {}
        bind = spec.QueueBind(
            queue=queue, exchange=source, routing_key=rng.choice([queue, "a.#", "*.b"]), arguments=args
        )
        methods = [bind] if rng.random() < 0.7 else [spec.QueueUnbind(queue=queue, exchange=source, routing_key=queue)]
    elif roll < 0.55:
        pair = {"destination": exchange, "source": rng.choice(["amq.topic", "amq.direct"]), "routing_key": "#"}
        methods = [spec.ExchangeBind(**pair) if rng.random() < 0.6 else spec.ExchangeUnbind(**pair)]
    elif roll < 0.63:
        tag = f"{tag_prefix}-{rng.randint(0, 3)}"
        consume = spec.BasicConsume(queue=queue, consumer_tag=tag, no_ack=rng.random() < 0.5)
        methods = [consume] if rng.random() < 0.7 else [consume, spec.BasicCancel(consumer_tag=tag)]
    elif roll < 0.71:
        methods = [spec.BasicGet(queue=queue, no_ack=rng.random() < 0.5)]
    elif roll < 0.77:
        methods = [
            rng.choice(
                [
                    spec.BasicAck(delivery_tag=0, multiple=True),
                    spec.BasicNack(delivery_tag=0, multiple=True, requeue=rng.random() < 0.5),
                    spec.BasicRecover(requeue=True),
                    spec.BasicReject(delivery_tag=rng.randint(1, 3), requeue=False),
                ]
            )
        ]
    elif roll < 0.82:
        methods = [spec.BasicQos(prefetch_count=rng.randint(0, 50), global_=rng.random() < 0.2)]
    elif roll < 0.85:
        methods = [spec.QueuePurge(queue=queue)]
    elif roll < 0.87:
        methods = [spec.QueueDelete(queue=queue, if_unused=rng.random() < 0.5)]
    elif roll < 0.89:
        methods = [spec.QueueDeclare(queue="", exclusive=True, auto_delete=True)]
    elif roll < 0.91:
        methods = [spec.ChannelFlow(active=True)]
    elif roll < 0.94:
        return [HEARTBEAT_FRAME]
    else:
        methods = [spec.QueueDeclare(queue=queue, passive=True)]
    return [encode_method_frame(channel, m) for m in methods]


def valid_frames(rng: random.Random, index: int) -> list[bytes]:
    """A whole well-behaved client session, as frames (the protocol header not included)."""
    frame_max = rng.choice([4096, 4096, 16384, 131072])
    start_ok = spec.ConnectionStartOk(
        client_properties={
            "product": f"fuzz-{index}",
            "capabilities": {"authentication_failure_close": True, "publisher_confirms": True},
        },
        mechanism="PLAIN",
        response=b"\x00guest\x00guest",
        locale="en_US",
    )
    frames = [
        encode_method_frame(0, start_ok),
        encode_method_frame(0, spec.ConnectionTuneOk(channel_max=2047, frame_max=frame_max, heartbeat=0)),
        encode_method_frame(0, spec.ConnectionOpen(virtual_host="/")),
    ]
    channels = list(range(1, rng.randint(1, 4) + 1))
    frames += [encode_method_frame(c, spec.ChannelOpen()) for c in channels]
    if len(channels) > 1:
        frames.append(encode_method_frame(channels[1], spec.TxSelect()))
    if len(channels) > 2:
        frames.append(encode_method_frame(channels[2], spec.ConfirmSelect()))
    for _ in range(rng.randint(10, 60)):
        channel = rng.choice(channels)
        frames += _operation(rng, channel, f"c{index}", frame_max)
        if channel == 2 and rng.random() < 0.3:
            frames.append(encode_method_frame(2, rng.choice([spec.TxCommit(), spec.TxRollback()])))
    frames += [encode_method_frame(c, spec.ChannelClose(reply_code=200, reply_text="bye")) for c in channels]
    frames.append(encode_method_frame(0, spec.ConnectionClose(reply_code=200, reply_text="bye")))
    return frames


# ------------------------------------------------------------------------------ mutations


def _random_value(rng: random.Random, kind: str) -> object:
    if kind == "bit":
        return rng.random() < 0.5
    if kind == "octet":
        return rng.choice([0, 1, 255, rng.randrange(256)])
    if kind == "short":
        return rng.choice([0, 1, 404, 65535, rng.randrange(65536)])
    if kind == "long":
        return rng.choice([0, 1, 2**31, 2**32 - 1, rng.randrange(2**32)])
    if kind == "longlong":
        return rng.choice([0, 1, 2**63, 2**64 - 1, rng.randrange(2**64)])
    if kind == "shortstr":
        return rng.choice(["", *QUEUES[:2], "fz-x1", "amq.direct", "amq.rabbitmq.reply-to", "amq.gen-x", "é" * 50])
    if kind == "longstr":
        return rng.randbytes(rng.randint(0, 20))
    return rng.choice(
        [
            {},
            {"x-max-length": rng.randint(-5, 5)},
            {"x-queue-type": rng.choice(["quorum", "stream", "bogus", 7])},
            {"x-message-ttl": rng.choice([-1, 0, 10, "x"])},
            {"x-dead-letter-exchange": "fz-x0"},
            {"x-priority": rng.choice([1, "a", None, 2**40])},
            {"x-expires": rng.choice([0, 1, 1000])},
            {"x-max-priority": rng.randint(0, 300)},
            {"x-single-active-consumer": True},
            {"x-delivery-limit": rng.choice([-1, 0, 1])},
        ]
    )


_ANY_METHODS = list(spec.METHODS_BY_INDEX.values())


def random_method_frame(rng: random.Random) -> bytes:
    """A well-formed frame of any method (mostly client ones), with random field values."""
    while True:
        cls = rng.choice(_ANY_METHODS)
        try:
            payload = cls(**{name: _random_value(rng, kind) for name, kind in cls.FIELDS}).encode()
        except (ValueError, OverflowError, TypeError):
            continue  # a value the encoder refuses (a shortstr over 255 bytes)
        channel = 0 if cls.CLASS_ID == 10 else rng.choice([1, 1, 1, 2, 0, 7])
        return encode_frame(spec.FRAME_METHOD, channel, payload)


def _deep_table(depth: int) -> bytes:
    inner = b""
    for _ in range(depth):
        inner = b"\x01aF" + struct.pack(">I", len(inner)) + inner
    return struct.pack(">I", len(inner)) + inner


def _bad_table(rng: random.Random) -> bytes:
    good = encode_table({"x-max-length": 5, "s": "v", "a": [1, "b"], "t": {"u": 1}})
    choices = [
        struct.pack(">I", rng.choice([len(good) + 1, len(good) + 100, 2**31, 2**32 - 1])) + good[4:],
        struct.pack(">I", max(0, len(good) - 4 - rng.randint(1, 10))) + good[4:],
        struct.pack(">I", 4) + b"\x01a" + bytes([rng.choice(b"ZQ!\x00\x7fzk")]) + b"\x00",
        struct.pack(">I", 3) + b"\xffab",
        struct.pack(">I", 7) + b"\x01aS\xff\xff\xff\xff",
        struct.pack(">I", 7) + b"\x01aA\xff\xff\xff\xf0",
        struct.pack(">I", 6) + b"\x01aI\x00\x01",
        struct.pack(">I", 8) + b"\x01aD\x05\x00\x00\x00",
        struct.pack(">I", 4) + b"\x00" + b"aF\x00",
        _deep_table(rng.randint(40, 300)),
        b"".join([encode_table({f"k{i}": i for i in range(rng.randint(200, 2000))})]),
    ]
    return rng.choice(choices)


def _table_frame(rng: random.Random) -> bytes:
    """A method frame or content header whose field table is corrupt."""
    table = _bad_table(rng)
    if rng.random() < 0.25:
        # a content header whose properties carry only the headers table
        return encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, 0, b"\x20\x00" + table))
    method = rng.choice(
        [
            spec.QueueDeclare(queue=QUEUES[0]),
            spec.ExchangeDeclare(exchange="fz-x0", type="direct"),
            spec.BasicConsume(queue=QUEUES[1]),
            spec.QueueBind(queue=QUEUES[0], exchange="amq.direct"),
            spec.ExchangeBind(destination="fz-x0", source="amq.direct"),
        ]
    )
    payload = method.encode()  # the empty arguments table is its last 4 bytes
    return encode_frame(spec.FRAME_METHOD, 1, payload[:-4] + table)


def _huge_length_frame(rng: random.Random) -> bytes:
    """A frame whose inner length prefix (longstr, body size, shortstr) is far past its end."""
    pick = rng.randrange(4)
    if pick == 0:  # start-ok with a longstr response claiming 4 GiB
        payload = spec.ConnectionStartOk(mechanism="PLAIN", response=b"x", locale="en_US").encode()
        head = payload[:4] + encode_table({})
        return encode_frame(spec.FRAME_METHOD, 0, head + b"\x05PLAIN" + struct.pack(">I", 2**32 - 1) + b"x")
    if pick == 1:  # a content header announcing an enormous body
        size = rng.choice([2**31, 2**40, 2**63, 2**64 - 1])
        return encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, size, encode_properties(BasicProperties())))
    if pick == 2:  # a shortstr length beyond the payload
        return encode_frame(spec.FRAME_METHOD, 1, struct.pack(">HHH", 50, 10, 0) + b"\xff" + b"q" * 10)
    # a headers property with a longstr that claims far more than is there
    props = b"\x20\x00" + struct.pack(">I", 10) + b"\x01aS" + struct.pack(">I", 2**31)
    return encode_frame(spec.FRAME_HEADER, 1, encode_content_header(60, 1, props))


def _set_header(
    frame: bytes, frame_type: int | None = None, channel: int | None = None, size: int | None = None
) -> bytes:
    if len(frame) < 7:
        return frame
    old_type, old_channel, old_size = _FRAME_HEADER.unpack_from(frame)
    head = _FRAME_HEADER.pack(
        old_type if frame_type is None else frame_type,
        old_channel if channel is None else channel,
        old_size if size is None else size,
    )
    return head + frame[7:]


def _frame_type(frame: bytes) -> int:
    return frame[0] if frame else -1


class Mutated(bytes):
    """A frame a mutation made or changed (or one a dropped frame left out of place): counted as
    mutated when it is sent."""


# Each mutation changes `case.frames` in place at or near index `i`, wrapping every frame it makes
# or changes in Mutated, and says whether it found something to act on (if not, another is tried).
Mutation = Callable[[random.Random, Case, int], bool]


def m_bit_flip(rng: random.Random, case: Case, i: int) -> bool:
    frame = bytearray(case.frames[i])
    for _ in range(rng.randint(1, 4)):
        frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
    case.frames[i] = Mutated(frame)
    return True


def m_byte_insert(rng: random.Random, case: Case, i: int) -> bool:
    frame = case.frames[i]
    at = rng.randint(0, len(frame))
    case.frames[i] = Mutated(frame[:at] + rng.randbytes(rng.randint(1, 8)) + frame[at:])
    return True


def m_byte_delete(rng: random.Random, case: Case, i: int) -> bool:
    frame = case.frames[i]
    at = rng.randrange(len(frame))
    case.frames[i] = Mutated(frame[:at] + frame[at + rng.randint(1, 8) :])
    return True


def m_truncate(rng: random.Random, case: Case, i: int) -> bool:
    case.frames[i] = Mutated(case.frames[i][: rng.randrange(len(case.frames[i]))])
    del case.frames[i + 1 :]
    return True


def m_size_lie(rng: random.Random, case: Case, i: int) -> bool:
    frame = case.frames[i]
    actual = len(frame) - 8
    size = rng.choice([actual + rng.randint(1, 50), max(0, actual - rng.randint(1, 50)), 0, 2**31, 2**32 - 1])
    case.frames[i] = Mutated(_set_header(frame, size=size))
    return True


def m_type_byte(rng: random.Random, case: Case, i: int) -> bool:
    choices = [t for t in (0, 1, 2, 3, 4, 8, 9, 65, 206, 255) if t != _frame_type(case.frames[i])]
    case.frames[i] = Mutated(_set_header(case.frames[i], frame_type=rng.choice(choices)))
    return True


def m_bad_end(rng: random.Random, case: Case, i: int) -> bool:
    frame = case.frames[i]
    case.frames[i] = Mutated(frame[:-1] + bytes([rng.choice([0, 1, 0xCD, 0xCF, 0xFF, rng.randrange(206)])]))
    return True


def m_method_ids(rng: random.Random, case: Case, i: int) -> bool:
    frame = case.frames[i]
    if _frame_type(frame) != spec.FRAME_METHOD or len(frame) < 12:
        return False
    if rng.random() < 0.6:
        ids = struct.pack(">I", rng.choice(list(spec.METHODS_BY_INDEX)))
    else:
        ids = struct.pack(">HH", rng.choice([0, 10, 20, 30, 60, 85, 90, 65535]), rng.randrange(65536))
    case.frames[i] = Mutated(frame[:7] + ids + frame[11:])
    return True


def m_table(rng: random.Random, case: Case, i: int) -> bool:
    case.frames.insert(i, Mutated(_table_frame(rng)))
    return True


def m_huge_length(rng: random.Random, case: Case, i: int) -> bool:
    case.frames.insert(i, Mutated(_huge_length_frame(rng)))
    return True


def m_splice(rng: random.Random, case: Case, i: int) -> bool:
    other = valid_frames(random.Random(rng.random()), case.index)
    start = rng.randrange(len(other))
    piece = [Mutated(frame) for frame in other[start : start + rng.randint(1, 20)]]
    if rng.random() < 0.5:
        case.frames[i:i] = piece
    else:
        case.frames[i:] = piece  # the tail replaced by another session's middle
    return True


def m_repeat(rng: random.Random, case: Case, i: int) -> bool:
    case.frames[i:i] = [Mutated(case.frames[i])] * rng.choice([1, 2, 5, 20])
    return True


def m_channel(rng: random.Random, case: Case, i: int) -> bool:
    channel = rng.choice([0, 5, 2047, 2048, 32768, 65535, rng.randrange(65536)])
    case.frames[i] = Mutated(_set_header(case.frames[i], channel=channel))
    return True


def m_content_order(rng: random.Random, case: Case, i: int) -> bool:
    """A content header before its method, or a body without its header, or a header without
    a method."""
    frames = case.frames
    for j in range(i, len(frames) - 1):
        if _frame_type(frames[j]) == spec.FRAME_METHOD and _frame_type(frames[j + 1]) == spec.FRAME_HEADER:
            pick = rng.randrange(3)
            if pick == 0:
                frames[j], frames[j + 1] = Mutated(frames[j + 1]), Mutated(frames[j])
            else:
                del frames[j + pick - 1]  # the header (a body now follows the method) or the method
                frames[j] = Mutated(frames[j])
            return True
    return False


def m_heartbeat(rng: random.Random, case: Case, i: int) -> bool:
    if rng.random() < 0.7:
        frame = _FRAME_HEADER.pack(spec.FRAME_HEARTBEAT, rng.choice([1, 2, 3, 100, 65535]), 0) + b"\xce"
    else:
        frame = encode_frame(spec.FRAME_HEARTBEAT, 0, rng.randbytes(rng.randint(1, 10)))
    case.frames.insert(i, Mutated(frame))
    return True


def m_drop(rng: random.Random, case: Case, i: int) -> bool:
    del case.frames[i]
    if i < len(case.frames):
        case.frames[i] = Mutated(case.frames[i])  # it arrives where the dropped one was due
    return True


def m_random_method(rng: random.Random, case: Case, i: int) -> bool:
    case.frames[i:i] = [Mutated(random_method_frame(rng)) for _ in range(rng.randint(1, 5))]
    return True


def m_garbage(rng: random.Random, case: Case, i: int) -> bool:
    case.frames.insert(i, Mutated(rng.randbytes(rng.randint(1, 64))))
    return True


MUTATIONS: dict[str, Mutation] = {
    "bit_flip": m_bit_flip,
    "byte_insert": m_byte_insert,
    "byte_delete": m_byte_delete,
    "truncate": m_truncate,
    "size_lie": m_size_lie,
    "type_byte": m_type_byte,
    "bad_end": m_bad_end,
    "method_ids": m_method_ids,
    "table": m_table,
    "huge_length": m_huge_length,
    "splice": m_splice,
    "repeat": m_repeat,
    "channel": m_channel,
    "content_order": m_content_order,
    "heartbeat": m_heartbeat,
    "drop": m_drop,
    "random_method": m_random_method,
    "garbage": m_garbage,
}
HANDSHAKE_FRAMES = 3  # start-ok, tune-ok, open


def _bad_protocol_header(rng: random.Random) -> bytes:
    return rng.choice(
        [
            b"AMQP\x00\x00\x09\x00",
            b"AMQP\x01\x01\x00\x0a",
            b"AMQP\x00\x00\x08\x00",
            b"GET / HT",
            rng.randbytes(8),
            b"AMQ",
        ]
    )


def build_case(seed: int, index: int) -> Case:
    """Connection number `index` of the run with `seed`: a valid session, mostly mutated."""
    rng = random.Random(seed * 1_000_003 + index)
    case = Case(index, PROTOCOL_HEADER, valid_frames(rng, index))
    if rng.random() < 0.1:
        return case  # unmutated: the broker must serve it all
    if rng.random() < 0.02:
        case.header = _bad_protocol_header(rng)
        case.mutations.append("protocol_header")
        return case
    names = list(MUTATIONS)
    for _ in range(rng.choice([1, 1, 2, 3])):
        for _attempt in range(5):
            if not case.frames:
                break
            # Mostly past the handshake, where the broker does the most work.
            low = 0 if rng.random() < 0.15 else min(HANDSHAKE_FRAMES, len(case.frames) - 1)
            i = rng.randint(low, len(case.frames) - 1)
            name = rng.choice(names)
            if not case.frames[i]:
                continue  # a frame an earlier mutation cut to nothing
            if MUTATIONS[name](rng, case, i):
                case.mutations.append(name)
                break
    return case


# ------------------------------------------------------------------------------ sending


@dataclass
class Outcome:
    """What the server did with one case."""

    frames_sent: int  # whole frames written to the socket
    mutated_sent: int  # of those, the ones a mutation made or changed
    ending: str  # "connection.close 501", "channel.close 406", "eof", "header", "hang", "refused"
    failure: str | None = None  # why this case fails the run
    replies: list[str] = field(default_factory=list)  # method names, for --replay


def _summarise(reply: bytes) -> tuple[str, str | None, list[str]]:
    """(ending, failure, method names) from everything the server sent."""
    if reply.startswith(b"AMQP"):
        ok = reply == PROTOCOL_HEADER
        return "header", None if ok else f"bad protocol header reply {reply[:16]!r}", []
    reader = FrameReader(0)
    reader.feed(reply)
    try:
        frames = reader.read_frames()
    except FrameError as exc:
        return "malformed", f"the server sent a malformed frame: {exc}", []
    if reader._buffered:  # noqa: SLF001 - a frame cut short by the server's close
        return "malformed", f"the server closed in the middle of a frame ({reader._buffered} bytes left)", []
    names: list[str] = []
    ending = "eof"
    channel_codes: list[int] = []
    for frame_type, _channel, payload in frames:
        if frame_type != spec.FRAME_METHOD:
            continue
        try:
            method = spec.decode_method(payload)
        except DecodeError as exc:
            return "malformed", f"the server sent an undecodable method: {exc}", names
        names.append(method.NAME)
        if isinstance(method, spec.ConnectionClose):
            if method.reply_code == spec.INTERNAL_ERROR:
                return "internal", f"internal error: {method.reply_text}", names
            if ending == "eof" or ending.startswith("channel"):
                ending = f"connection.close {method.reply_code}"
        elif isinstance(method, spec.ChannelClose):
            if method.reply_code == spec.INTERNAL_ERROR:
                return "internal", f"internal error: {method.reply_text}", names
            channel_codes.append(method.reply_code)
    if ending == "eof" and channel_codes:
        ending = "channel.close " + ",".join(str(c) for c in sorted(set(channel_codes)))
    return ending, None, names


def run_case(host: str, port: int, case: Case, rng: random.Random) -> Outcome:
    """Send one case on a new connection; read the server's answer until it closes (bounded)."""
    data = case.data()
    ends: list[int] = []  # the byte offset at which each frame ends
    offset = len(case.header)
    for frame in case.frames:
        offset += len(frame)
        ends.append(offset)
    # Pieces of 1-16 frames, some cut inside a frame: between pieces, what the server answered is
    # read, and once it has closed (or sent connection.close) nothing more is sent.
    cuts = {len(case.header)}
    k = 0
    while k < len(ends):
        k += rng.randint(1, 16)
        cuts.add(ends[min(k, len(ends)) - 1])
    cuts.update(rng.randrange(1, len(data)) for _ in range(rng.randint(0, 3)) if len(data) > 1)
    bounds = sorted(c for c in cuts if 0 < c < len(data))
    pieces = [data[a:b] for a, b in zip([0, *bounds], [*bounds, len(data)], strict=True)]
    reply = bytearray()
    written = 0
    closed = False
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
    except OSError as exc:
        return Outcome(0, 0, "refused", f"cannot connect: {exc}")
    try:
        for piece in pieces:
            try:
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.sendall(piece)
            except TimeoutError:
                break  # the server stopped reading (it answers a lot and we read only between pieces)
            except OSError:  # a reset, a broken pipe: it hung up
                closed = True
                break
            written += len(piece)
            closed = _drain(sock, reply)
            if closed or CONNECTION_CLOSE in reply:
                break
        if not closed:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            deadline = time.monotonic() + HANG_TIMEOUT_S
            while not closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                sock.settimeout(remaining)
                try:
                    chunk = sock.recv(262144)
                except TimeoutError:
                    break
                except OSError:  # a reset
                    chunk = b""
                if not chunk:
                    closed = True
                reply += chunk
    finally:
        sock.close()
    frames_sent = bisect.bisect_right(ends, written)
    mutated_sent = sum(1 for frame in case.frames[:frames_sent] if isinstance(frame, Mutated))
    if not closed:
        return Outcome(
            frames_sent, mutated_sent, "hang", f"the server did not close within {HANG_TIMEOUT_S:.0f} s of our FIN"
        )
    ending, failure, names = _summarise(bytes(reply))
    return Outcome(frames_sent, mutated_sent, ending, failure, names)


def _drain(sock: socket.socket, reply: bytearray) -> bool:
    """Read whatever the server has sent without waiting; True when it has closed."""
    while True:
        ready, _, _ = select.select([sock], [], [], 0)
        if not ready:
            return False
        try:
            chunk = sock.recv(262144)
        except OSError:  # a reset
            return True
        if not chunk:
            return True
        reply += chunk
