"""`guest` may log in only from a loopback address (RabbitMQ's loopback_users, rabbit_net:is_loopback)."""

from __future__ import annotations

import pytest

from maxq_raft.server.session import is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", "::1%lo"])
def test_loopback_addresses(host):
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host",
    ["10.0.0.1", "::1:2:3", "::10", "::ffff:10.0.0.1", "1270.0.0.1", "127.example.com", "localhost", "", "fe80::1"],
)
def test_other_addresses_are_not(host):
    # "::1:2:3" and "::10" started with "::1", which the prefix test took for loopback
    assert not is_loopback(host)
