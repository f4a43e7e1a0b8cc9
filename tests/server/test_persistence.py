"""The durable-topology log: an index is taken only for an entry that was encoded and written."""

from __future__ import annotations

import pytest

from maxq_raft.machines import metadata as md
from maxq_raft.server import persistence
from maxq_raft.storage import MemorySegmentStore
from maxq_raft.storage.guarded import GuardedStore


def test_an_entry_that_cannot_be_encoded_changes_nothing():
    store = GuardedStore(lambda read_only: MemorySegmentStore())
    log = persistence.MetadataLog(store)
    log.append(md.SetPolicy("/", "ok", ".*", {"max-length": 1}, 0, "all"))
    with pytest.raises(OverflowError):
        log.append(md.SetPolicy("/", "huge", ".*", {"max-length": 1}, 10**30, "all"))
    log.append(md.SetPolicy("/", "next", ".*", {"max-length": 2}, 0, "all"))
    assert log.next == 2
    assert [command.name for command, _ in persistence.MetadataLog(store).entries()] == ["ok", "next"]


@pytest.mark.parametrize(
    "command",
    [
        md.SetPolicy("/", "p", ".*", {"max-length": 1}, 10**30, "all"),
        md.SetPolicy("/", "p", "\ud800", {"max-length": 1}, 0, "all"),
        md.DeclareQueue("/", "q", False, True, False, False, {"x-max-length": 10**30}, ""),
    ],
)
def test_unstorable_commands_are_refused_before_they_are_applied(command):
    refusal = persistence.unstorable(command)
    assert refusal is not None and refusal.reply_code == 406 and "cannot be stored" in refusal.reply_text


def test_storable_commands_pass():
    assert persistence.unstorable(md.SetPolicy("/", "p", ".*", {"max-length": 1}, 5, "all")) is None
    assert persistence.unstorable(md.OwnerDown("connection-1")) is None
