"""The proposer never builds a log entry past the engine's payload cap: a command that would take
the open entry past it sends that entry first (two large messages arriving in one pass of the
node used to share an entry, which the engine refused as "too large": both nacked)."""

from __future__ import annotations

import trio

from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.replication.entries import decode_entry
from maxq_raft.replication.group import PAYLOAD_BYTES_MAX
from maxq_raft.server.confirms import Confirms
from maxq_raft.server.proposer import ENTRY_BYTES_MAX, Proposer, message_bytes_max


class CappedNode:
    """The engine's `propose` as far as the proposer sees it: refuses a payload over the cap."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.payloads: list[bytes] = []

    def propose(self, group, payload, callback) -> None:
        if len(payload) > PAYLOAD_BYTES_MAX:
            raise ValueError(f"payload of {len(payload)} bytes exceeds PAYLOAD_BYTES_MAX")
        self.sizes.append(len(payload))
        self.payloads.append(payload)


def enqueue(size: int, props_bytes: int = 0) -> qc.Enqueue:
    return qc.Enqueue([Message("", "q", b"\x00" * props_bytes, b"b" * size, True, None, 0, None)])


def test_large_commands_in_one_pass_go_in_entries_under_the_cap() -> None:
    node = CappedNode()

    async def run() -> list:
        proposer = Proposer("n1", node, Confirms(), lambda: 0)
        # Under the 256 KiB target, the first waits for more; the second would take it past the cap.
        entries = [proposer.submit("shard-0", ("/", "q"), enqueue(size * 1024), None) for size in (250, 800)]
        entries.append(proposer.submit("shard-0", ("/", "q"), qc.Settle("c1", [1]), None))
        entries.append(proposer.submit("shard-0", ("/", "q"), enqueue(100), None))
        proposer.flush()
        return entries

    entries = trio.run(run)
    assert len(node.sizes) == 3 and all(size <= PAYLOAD_BYTES_MAX for size in node.sizes), node.sizes
    assert len({id(entry) for entry in entries}) == 3 and entries[2] is entries[3]
    assert all(entry.error is None for entry in entries)


def test_the_largest_accepted_message_fits_an_entry_with_a_full_read_beside_it() -> None:
    node = CappedNode()
    frame_max, read = 131072, 65536
    largest = message_bytes_max(frame_max, read)
    assert largest == ENTRY_BYTES_MAX - frame_max - read > 800 * 1024

    async def run() -> None:
        proposer = Proposer("n1", node, Confirms(), lambda: 0)
        small = [Message("", "q", b"", b"s" * 100, True, None, 0, None) for _ in range(read // 150)]
        command = qc.Enqueue([*small, Message("", "q", b"p" * (frame_max - 8), b"b" * largest, True, None, 0, None)])
        proposer.submit("shard-0", ("/", "q"), command, None)
        proposer.flush()

    trio.run(run)
    assert len(node.sizes) == 1 and node.sizes[0] <= PAYLOAD_BYTES_MAX


def test_an_entry_that_cannot_be_encoded_is_refused_and_the_node_goes_on() -> None:
    """A command no log can hold (here a routed queue name that is not a string: a bug of ours)
    used to raise out of the proposer's end-of-pass callback, which ended the whole node with
    TrioInternalError. Now its entry's callers are refused, its seq is filled with an empty entry,
    a clean-up command beside it is proposed again, and later entries go on."""
    node = CappedNode()
    replies: list = []

    async def run() -> None:
        proposer = Proposer("n1", node, Confirms(), lambda: 0)
        bad = qc.Enqueue([Message("", "q", b"", b"x", False)], trace=("u", "n1@1", "a", [(0, 1, False, [object()])]))
        proposer.submit("shard-0", ("/", "q"), bad, replies.append)
        proposer.submit("shard-0", ("/", "q"), qc.Down("n1@1/1"), None)
        proposer.flush()
        proposer.submit("shard-0", ("/", "q"), enqueue(10), None)
        proposer.flush()
        await trio.sleep(0)

    trio.run(run)
    assert [type(reply).__name__ for reply in replies] == ["Unavailable"]
    # The filler of the refused seq (no commands), then the Down again with the later enqueue.
    filler, after = (decode_entry(payload) for payload in node.payloads)
    assert filler.items == [] and [type(item[1]).__name__ for item in after.items] == ["Down", "Enqueue"]
