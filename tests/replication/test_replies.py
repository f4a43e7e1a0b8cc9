"""Machine replies across the wire (replication/replies.py): every kind a queue machine gives
comes back equal after msgpack, and anything malformed is refused with ReplyError."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines.commands import (
    ChangeVisibility,
    Checkout,
    DeleteReceived,
    Enqueue,
    EnqueueFifo,
    Get,
    Purge,
    Receive,
)
from maxq_raft.machines.message import Message
from maxq_raft.machines.queue import QueueMachine
from maxq_raft.machines.queue_args import QueueSettings
from maxq_raft.machines.queue_types import HandleResult, Meta, Overflowed, QueueCounts, Received, Rejected
from maxq_raft.machines.snapshot import message_record
from maxq_raft.replication.replies import ReplyError, decode_reply, encode_reply


def wire(reply):
    """The reply as the member that asked gets it."""
    return decode_reply(msgpack.unpackb(msgpack.packb(encode_reply(reply), use_bin_type=True), raw=False))


def comparable(reply):
    """Messages by every field they carry; the rest as it is."""
    if type(reply) is tuple and reply and type(reply[0]) is Message:
        return ("get", message_record(reply[0]), *reply[1:])
    if type(reply) is list:
        return [("received", message_record(r.message), *r[1:]) if type(r) is Received else r for r in reply]
    return reply


def same_after_wire(reply) -> None:
    back = wire(reply)
    assert type(back) is type(reply)
    assert comparable(back) == comparable(reply)
    if type(reply) is list:
        assert [type(item) for item in back] == [type(item) for item in reply]


messages = st.builds(
    Message,
    st.text(max_size=8),
    st.text(max_size=8),
    st.binary(max_size=16),
    st.binary(max_size=64),
    st.booleans(),
    st.none() | st.integers(0, 10**9),
    st.integers(0, 255),
    st.none() | st.integers(0, 10**9),
)


@st.composite
def full_messages(draw) -> Message:
    message = draw(messages)
    message.seq = draw(st.integers(0, 2**40))
    message.delivery_count = draw(st.integers(0, 100))
    message.redelivered = draw(st.booleans())
    message.death = draw(st.none() | st.tuples(st.sampled_from(["expired", "rejected"]), st.integers(0, 2**40)))
    message.group_id = draw(st.none() | st.text(max_size=8))
    message.sequence_number = draw(st.none() | st.integers(0, 2**40))
    message.sent_ms = draw(st.none() | st.integers(0, 2**40))
    return message


replies = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.text(max_size=20),
    st.builds(Rejected, st.integers(200, 600), st.text(max_size=40)),
    st.builds(Overflowed, st.integers(0, 100), st.lists(st.integers(0, 100), max_size=5)),
    st.builds(QueueCounts, st.integers(0, 2**40), st.integers(0, 1000), st.booleans()),
    st.tuples(full_messages(), st.booleans(), st.integers(0, 10**6)),
    st.lists(
        st.builds(
            Received,
            full_messages(),
            st.integers(0, 2**40),
            st.integers(0, 2**40),
            st.integers(0, 100),
            st.integers(0, 2**40),
            st.none() | st.integers(0, 2**40),
        ),
        min_size=1,
        max_size=3,
    ),
    st.lists(st.sampled_from(list(HandleResult)), min_size=1, max_size=4),
    st.lists(st.none() | st.tuples(st.text(max_size=8), st.integers(0, 2**40)), min_size=1, max_size=4),
    st.lists(st.text(max_size=8), min_size=1, max_size=4),  # a TxnHolders' queue names
    st.just([]),
)


@given(replies)
def test_every_kind_of_reply_comes_back_equal(reply) -> None:
    same_after_wire(reply)


def test_the_replies_of_a_real_queue_machine_come_back_equal() -> None:
    machine = QueueMachine("/", "q", settings=QueueSettings(max_length=2, overflow="reject-publish"))
    index = iter(range(1, 1000))

    def apply(command):
        reply, _ = machine.apply(Meta(next(index), 1000), command)
        same_after_wire(reply)
        return reply

    assert type(apply(Enqueue([Message("", "q", b"p", b"%d" % i, persistent=True) for i in range(3)]))) is Overflowed
    got = apply(Get("n2@1/1/get", "n2@1/1", False))
    assert type(got) is tuple and got[0].body == b"0"
    received = apply(Receive(1, 30_000))
    assert [r.message.body for r in received] == [b"1"]
    handle = [(r.seq, r.receive_id) for r in received]
    assert apply(ChangeVisibility([(seq, receive, 0) for seq, receive in handle])) == [HandleResult.DONE]
    assert apply(Checkout("n2@1/1/c", "n2@1/1", 1, False, 0, False, 1)) is True
    assert apply(DeleteReceived(handle)) == [HandleResult.NOT_IN_FLIGHT]  # (visible again, and taken)
    assert apply(Purge()) == 0
    apply(Get("n2@1/1/get", "n2@1/1", True))  # an empty queue's None
    fifo = QueueMachine("/", "q.fifo", settings=QueueSettings(fifo=True))
    reply, _ = fifo.apply(Meta(1, 1000), EnqueueFifo([Message("", "q.fifo", b"", b"x")], [("g", "d", "id-1")]))
    assert reply == [("id-1", 1)]
    same_after_wire(reply)


def test_a_reply_that_cannot_cross_is_refused_when_encoded() -> None:
    for reply in (object(), {"a": 1}, [object()], (1, 2)):
        with pytest.raises(ReplyError):
            encode_reply(reply)


@pytest.mark.parametrize(
    "value",
    [
        [],
        ["R", "404", "no"],
        ["O", 1, ["x"]],
        ["G", "not a record", True, 0],
        ["G", [1, 2], True, 0],
        ["V", [[1, 2, 3]]],
        ["H", ["nonsense"]],
        ["F", [[1, 2]]],
        ["C", 1, 2, "yes"],
        ["N", ["a", 1]],
        ["N", "a"],
        ["Z"],
        {"R": 1},
        3.5,
    ],
)
def test_a_malformed_reply_is_refused_when_decoded(value) -> None:
    with pytest.raises(ReplyError):
        decode_reply(value)
