"""What the proposer does with an entry it gives up (server/proposer.py `_proposed`): the
commands nobody waits for that must not be lost go again, in their order."""

from __future__ import annotations

import trio

from maxq_raft.machines import commands as qc
from maxq_raft.machines.message import Message
from maxq_raft.replication.entries import decode_entry
from maxq_raft.server.confirms import Confirms
from maxq_raft.server.proposer import Proposer
from tests.server.test_proposer_entry_cap import CappedNode, enqueue


def test_a_given_up_entrys_acks_and_clean_ups_go_again_in_their_order() -> None:
    """Acks, rejects, requeues and credit are cast: given up for time, they are proposed again
    (else the acked messages stay checked out to a consumer that lives on), among the clean-ups
    in the order they came (an ack before its channel's close settles rather than requeues).
    Refused outright (here: an entry no log can hold, a bug of ours) those that encode alone go
    again all the same."""
    node = CappedNode()
    consumer = "n1@1.1/1/t1"

    async def run() -> None:
        proposer = Proposer("n1", node, Confirms(), lambda: 0)
        for command in (
            qc.Settle(consumer, [5]),
            enqueue(10),
            qc.Credit(consumer, 3),
            qc.Requeue(consumer, [6]),
            qc.Discard(consumer, [7]),
            qc.Down("n1@1.1/1"),
        ):
            proposer.submit("shard-0", ("/", "q"), command, None)
        proposer.flush()
        (entry,) = proposer.in_flight.values()
        entry.first_proposed -= 60.0  # past OUTCOME_WAIT_S: this failure gives it up
        proposer._proposed(entry, "not leader")
        proposer.flush()
        bad = qc.Enqueue([Message("", "q", b"", b"x", False)], trace=("u", "n1@1", "a", [(0, 1, False, [object()])]))
        proposer.submit("shard-0", ("/", "q"), qc.Settle(consumer, [8]), None)
        proposer.submit("shard-0", ("/", "q"), bad, None)
        proposer.flush()

    trio.run(run)
    first, filler, again, unencodable_filler, settle = (decode_entry(payload) for payload in node.payloads)
    assert len(first.items) == 6 and filler.items == [] and unencodable_filler.items == []
    assert [type(item[1]).__name__ for item in again.items] == ["Settle", "Credit", "Requeue", "Discard", "Down"]
    assert [item[1] for item in settle.items] == [qc.Settle(consumer, [8])]
