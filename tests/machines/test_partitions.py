"""Partitioned queues' pure parts (machines/partitions.py) and the metadata machine's routing of
a publish to one partition."""

from __future__ import annotations

import zlib

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.machines import metadata as md
from maxq_raft.machines import partitions
from maxq_raft.machines.placement import hash_group
from maxq_raft.machines.queue_types import Meta, Rejected
from maxq_raft.server.cluster import shard_groups, shard_of

V = "/"
names = st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s)


@given(parent=names, index=st.integers(1, partitions.PARTITIONS_MAX - 1))
def test_a_partitions_name_gives_back_its_parent_and_index(parent: str, index: int) -> None:
    assert partitions.parent_of(partitions.partition_name(parent, index)) == (parent, index)


@given(name=names)
def test_a_name_not_made_by_partition_name_is_no_partition(name: str) -> None:
    parsed = partitions.parent_of(name)
    if parsed is not None:
        assert partitions.partition_name(*parsed) == name  # only the canonical spelling parses
    assert partitions.parent_of(partitions.partition_name(name, 0)) == partitions.parent_of(name)


def test_odd_spellings_are_not_partitions() -> None:
    for name in (
        "amq.partition-0.q",
        "amq.partition-01.q",
        "amq.partition-1.",
        "amq.partition-x.q",
        "amq.partition-64.q",
    ):
        assert partitions.parent_of(name) is None, name


@given(vhost=st.text(max_size=8), parent=names, count=st.integers(2, 16), groups=st.integers(1, 32))
def test_partitions_take_consecutive_groups_after_their_parents(
    vhost: str, parent: str, count: int, groups: int
) -> None:
    listed = shard_groups(groups)
    placed = [hash_group(vhost, partitions.partition_name(parent, i), listed) for i in range(count)]
    assert len(set(placed)) == min(count, groups)  # as many groups as there are, up to count
    for i, group in enumerate(placed):
        # the shard a member without a recorded group computes is the same
        assert shard_of((vhost, partitions.partition_name(parent, i)), groups) == group


def test_counts_and_refusals() -> None:
    assert partitions.partition_count({}) == 1
    assert partitions.partition_count({"x-partitions": 1}) == 1
    assert partitions.partition_count({"x-partitions": 4}) == 4
    assert partitions.check_count(4) is None
    assert partitions.check_count(0) and partitions.check_count(65) and partitions.check_count("4")
    assert partitions.declare_refusal("q", 1, True, True, {"x-expires": 1}) is None  # not partitioned
    assert "exclusive" in (partitions.declare_refusal("q", 2, True, False, {}) or "")
    assert "auto-delete" in (partitions.declare_refusal("q", 2, False, True, {}) or "")
    assert "x-expires" in (partitions.declare_refusal("q", 2, False, False, {"x-expires": 1}) or "")
    assert "too long" in (partitions.declare_refusal("q" * 250, 2, False, False, {}) or "")


def _machine_with(count: int, made: int | None = None) -> md.MetadataMachine:
    """A metadata machine with queue "p" of `count` partitions, the first `made` of them declared."""
    machine = md.MetadataMachine()
    for i in range(count if made is None else made):
        arguments = {"x-partitions": count} if i == 0 else {}
        reply, _ = machine.apply(
            Meta(1, 0),
            md.DeclareQueue(V, partitions.partition_name("p", i), False, True, False, False, arguments, "c"),
        )
        assert type(reply) is md.QueueRecord, reply
    machine.apply(Meta(1, 0), md.DeclareExchange(V, "x", "fanout", False, True, False, False, {}))
    machine.apply(Meta(1, 0), md.Bind(V, "x", "p", False, "", {}, "c"))
    return machine


@given(key=st.text(max_size=20), header=st.one_of(st.none(), st.text(max_size=20), st.binary(max_size=20)))
def test_a_publish_goes_to_the_partition_of_its_key(key: str, header: str | bytes | None) -> None:
    machine = _machine_with(4)
    headers = None if header is None else {"x-partition-key": header}
    chosen = header if header is not None else key
    raw = chosen if isinstance(chosen, bytes) else chosen.encode()
    expected = partitions.partition_name("p", zlib.crc32(raw) % 4)
    assert machine.route(V, "x", key, headers) == [expected]
    assert machine.route(V, "x", key, lambda: headers) == [expected]  # headers decoded on demand
    if header is not None:
        assert machine.route(V, "", "p", headers) == [expected]  # the default exchange: by the header


def test_a_partition_whose_declare_did_not_finish_routes_to_the_first() -> None:
    machine = _machine_with(4, made=1)
    assert {machine.route(V, "x", f"k{i}", None)[0] for i in range(50)} == {"p"}


def test_a_client_name_under_amq_is_still_refused_but_a_partitions_is_not() -> None:
    machine = md.MetadataMachine()
    reply, _ = machine.apply(Meta(1, 0), md.DeclareQueue(V, "amq.other", False, True, False, False, {}, "c"))
    assert type(reply) is Rejected and reply.reply_code == 403
    reply, _ = machine.apply(Meta(1, 0), md.DeclareQueue(V, "amq.partition-1.p", False, True, False, False, {}, "c"))
    assert type(reply) is md.QueueRecord


def test_a_redeclare_with_another_count_is_refused() -> None:
    machine = _machine_with(2)
    reply, _ = machine.apply(Meta(1, 0), md.DeclareQueue(V, "p", False, True, False, False, {"x-partitions": 3}, "c"))
    assert type(reply) is Rejected and reply.reply_code == 406 and "x-partitions" in reply.reply_text


def test_a_partition_follows_its_parents_policy() -> None:
    machine = _machine_with(2)
    machine.apply(Meta(1, 0), md.SetPolicy(V, "limit", "^p$", {"max-length": 5}, 0, "queues"))
    assert machine.effective_arguments(V, "amq.partition-1.p")["x-max-length"] == 5


def test_a_policy_may_give_a_count_and_a_redeclare_need_not_repeat_it() -> None:
    ok = md.policy_record(md.SetPolicy(V, "p", "^p$", {"partitions": 3}, 0, "queues"))
    assert type(ok) is md.PolicyRecord and ok.arguments() == {"x-partitions": 3}
    bad = md.policy_record(md.SetPolicy(V, "p", "^p$", {"partitions": 0}, 0, "queues"))
    assert type(bad) is Rejected and "x-partitions" in bad.reply_text
    machine = _machine_with(2)
    reply, _ = machine.apply(Meta(1, 0), md.DeclareQueue(V, "p", False, True, False, False, {}, "c"))
    assert type(reply) is md.QueueRecord and reply.arguments == {"x-partitions": 2}
