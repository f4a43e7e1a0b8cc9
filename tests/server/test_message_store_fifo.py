"""A FIFO message's group id and sequence number in the store's record (server/message_store.py,
FLAG_FIFO): a spilled message, or one read back after a restart, keeps its group, so the queue
machine still holds the group while a message of it is in flight (machines/fifo.py)."""

from __future__ import annotations

import pytest

from maxq_raft.machines.delayed import DELAYED_BASE
from maxq_raft.machines.message import Message
from maxq_raft.server.message_store import FLAG_FIFO, decode_record, encode_record


def _message(seq: int, group: str | None, number: int | None, expires_at_ms: int | None = None) -> Message:
    message = Message("", "q.fifo", b"\x80\x00", b"body", True)
    message.seq = seq
    message.group_id, message.sequence_number = group, number
    message.expires_at_ms = expires_at_ms
    return message


@pytest.mark.parametrize("expires_at_ms", [None, 12_345])
@pytest.mark.parametrize("group", ["g", "x" * 128, "!~{}"])
def test_group_and_sequence_number_round_trip(group: str, expires_at_ms: int | None) -> None:
    record = encode_record(_message(7, group, 2**63 + 5, expires_at_ms), True, 3)
    message, flags, epoch = decode_record(7, record)
    assert flags & FLAG_FIFO and epoch == 3
    assert (message.group_id, message.sequence_number) == (group, 2**63 + 5)
    assert (message.body, message.props_raw, message.expires_at_ms) == (b"body", b"\x80\x00", expires_at_ms)


def test_a_delayed_fifo_message_keeps_them_too() -> None:
    original = _message(DELAYED_BASE + 1, "g", 9)
    original.due_ms, original.ttl_ms = 5_000, None
    message, _flags, _epoch = decode_record(original.seq, encode_record(original, True, 1))
    assert (message.group_id, message.sequence_number, message.due_ms) == ("g", 9, 5_000)


def test_other_messages_are_stored_as_before() -> None:
    record = encode_record(_message(1, None, None), True, 1)
    message, flags, _epoch = decode_record(1, record)
    assert not flags & FLAG_FIFO and message.group_id is None and message.sequence_number is None
