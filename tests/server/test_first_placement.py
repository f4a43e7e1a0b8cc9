"""The first placement a member works out from its settings (server/main.py, `_first_placement`)."""

from __future__ import annotations

import pytest

from maxq_raft.config import Settings
from maxq_raft.server.hosts import machine_of
from maxq_raft.server.main import StartupError, _first_placement

SHARDS = [f"shard-{i}" for i in range(6)]
PEERS = "n2@127.0.0.1:7102,n3@127.0.0.2:7103,n4@127.0.0.2:7104,n5@127.0.0.3:7105,n6@127.0.0.3:7106"


def test_every_member_proposes_the_same_placement_over_machines() -> None:
    # (the metadata group records the first proposal committed: server/first_placement.py; that
    # they are alike for alike settings keeps the choice independent of who came first)
    addresses = {"n1": "127.0.0.1:7101", **{p.split("@")[0]: p.split("@")[1] for p in PEERS.split(",")}}
    host_of = {name: address.split(":")[0] for name, address in addresses.items()}
    seen = {}
    for name, address in addresses.items():
        others = ",".join(f"{n}@{a}" for n, a in addresses.items() if n != name)
        held, proposal = _first_placement(
            Settings(node_id=name, raft_addr=address, peer=others, replication_factor=3), SHARDS
        )
        assert held == ["meta"] and proposal is not None  # the shard groups come from the record
        seen[name] = proposal
    assert all(layout == seen["n1"] for layout in seen.values())  # one placement, whoever works it out
    assert [group for group, _members in seen["n1"]] == SHARDS
    for group, members in seen["n1"]:
        assert sorted(host_of[m] for m in members) == ["127.0.0.1", "127.0.0.2", "127.0.0.3"], group


def test_a_joining_member_holds_the_metadata_group_and_proposes_nothing() -> None:
    settings = Settings(node_id="n7", raft_addr="127.0.0.4:7107", peer=PEERS, replication_factor=3, join="on")
    assert _first_placement(settings, SHARDS) == (["meta"], None)


def test_a_wildcard_raft_address_is_refused_with_a_factor() -> None:
    settings = Settings(node_id="n1", raft_addr="0.0.0.0:7101", peer=PEERS, replication_factor=3)
    with pytest.raises(StartupError, match="--raft-addr"):
        _first_placement(settings, SHARDS)
    # with factor 0 every member holds every group: nothing is placed, nothing refused
    every = Settings(node_id="n1", raft_addr="0.0.0.0:7101", peer=PEERS, replication_factor=0)
    assert _first_placement(every, SHARDS) == (None, None)
    # nor where the factor is not below the members: each holds every group, wherever it is
    three = Settings(node_id="n1", raft_addr="0.0.0.0:7101", peer="n2@127.0.0.1:7102,n3@127.0.0.1:7103")
    held, proposal = _first_placement(three, SHARDS)
    assert held == ["meta"] and proposal is not None
    assert [[group, sorted(members)] for group, members in proposal] == [[g, ["n1", "n2", "n3"]] for g in SHARDS]


def test_the_default_factor_places_every_group_on_each_of_three_members() -> None:
    """The default, 3 (issue #19): a cluster of 3 is placed too (a 4th member then holds nothing
    until a rebalance, and each group stays on 3), one of 5 holds each group on 3."""
    three = Settings(node_id="n1", raft_addr="127.0.0.1:7101", peer="n2@127.0.0.1:7102,n3@127.0.0.1:7103")
    assert three.replication_factor == 3
    held, proposal = _first_placement(three, SHARDS)
    assert held == ["meta"] and proposal is not None
    assert [[group, sorted(members)] for group, members in proposal] == [[g, ["n1", "n2", "n3"]] for g in SHARDS]
    held, proposal = _first_placement(Settings(node_id="n1", raft_addr="127.0.0.1:7101", peer=PEERS), SHARDS)
    assert held == ["meta"] and proposal is not None and all(len(members) == 3 for _group, members in proposal)
    alone = Settings(node_id="n1", raft_addr="127.0.0.1:7101")  # (a one-member cluster: it holds them all)
    assert _first_placement(alone, SHARDS)[1] == [[group, ["n1"]] for group in SHARDS]


def test_a_name_and_its_address_are_one_machine() -> None:
    assert machine_of("localhost") in {"127.0.0.1", "::1"}
    assert machine_of("0:0:0:0:0:0:0:1") == "::1"  # an address in its canonical form
