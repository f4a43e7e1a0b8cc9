"""A cluster consumer's credit is sized by its deliveries' bytes (session.credit_target) and
topped back up to that after each flush (session.credit_refill); channel.py says why."""

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.server.channel import CLUSTER_FLOW_CREDIT, CREDIT_BYTES, FLOW_CREDIT
from maxq_raft.server.session import credit_refill, credit_target


def test_small_deliveries_get_the_most_credit_and_large_ones_the_usual():
    assert credit_target(110 * 1000, 1000, CLUSTER_FLOW_CREDIT) == CLUSTER_FLOW_CREDIT  # 16 B bodies
    assert credit_target(220 * 1000, 1000, CLUSTER_FLOW_CREDIT) == CREDIT_BYTES // 220  # 128 B
    assert credit_target(1100 * 1000, 1000, CLUSTER_FLOW_CREDIT) == FLOW_CREDIT  # 1 KiB
    assert credit_target(0, 0, CLUSTER_FLOW_CREDIT) == FLOW_CREDIT  # nothing sent yet
    assert credit_target(10, 1000, FLOW_CREDIT) == FLOW_CREDIT  # a single node's maximum


@given(st.integers(0, 10**9), st.integers(0, 10**6), st.sampled_from([FLOW_CREDIT, CLUSTER_FLOW_CREDIT]))
def test_the_target_stays_within_the_bounds(sent_bytes, deliveries, credit_max):
    assert FLOW_CREDIT <= credit_target(sent_bytes, deliveries, credit_max) <= credit_max


@given(st.integers(0, 20000), st.integers(0, 20000), st.integers(FLOW_CREDIT, CLUSTER_FLOW_CREDIT))
def test_a_refill_brings_the_credit_back_to_the_target_and_never_takes_any_back(level, written, target):
    refill, after = credit_refill(level, written, target)
    assert refill >= 0
    assert after == max(0, level - written) + refill  # what was left plus what is given
    assert after == max(target, max(0, level - written))
