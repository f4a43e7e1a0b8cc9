"""A publisher's reads are sized for about READ_TURN_MESSAGES of its messages (session.py), so
one connection's read never holds the node for long, within the sizes the proposer counts on."""

from hypothesis import given
from hypothesis import strategies as st

from maxq_raft.server.session import (
    CLUSTER_READ_SIZE_BYTES,
    READ_SIZE_BYTES,
    READ_SIZE_MIN_BYTES,
    READ_TURN_MESSAGES,
    next_read_bytes,
)


@given(st.sampled_from([READ_SIZE_BYTES, CLUSTER_READ_SIZE_BYTES]), st.data())
def test_the_next_read_stays_within_the_bounds(read_bytes_max, data):
    read_bytes = data.draw(st.integers(1, read_bytes_max))
    published = data.draw(st.integers(1, read_bytes))
    size = next_read_bytes(read_bytes, published, read_bytes_max)
    assert READ_SIZE_MIN_BYTES <= size <= read_bytes_max


def test_small_publishes_get_short_reads_and_large_ones_full_reads():
    # 16-byte bodies: about 60 bytes each on the wire, 1,092 in a 64 KiB read
    assert next_read_bytes(65520, 1092) == READ_SIZE_MIN_BYTES
    # 128-byte bodies (about 180 on the wire): READ_TURN_MESSAGES of them
    assert next_read_bytes(65520, 364) == 65520 * READ_TURN_MESSAGES // 364 < READ_SIZE_BYTES
    # 1 KiB bodies: a full read holds fewer than READ_TURN_MESSAGES
    assert next_read_bytes(65536, 60) == READ_SIZE_BYTES
    assert next_read_bytes(65536, 60, CLUSTER_READ_SIZE_BYTES) == CLUSTER_READ_SIZE_BYTES < READ_SIZE_BYTES
