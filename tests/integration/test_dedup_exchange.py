"""The x-message-deduplication exchange through pika (machines/dedup.py, "Exchange windows";
docs/queue-features.md).

Reference: the community plugin rabbitmq-message-deduplication's README, "Exchange level
deduplication": an exchange of type `x-message-deduplication` (x-cache-size required,
x-cache-ttl optional, also as a message header) does not route a message whose
`x-deduplication-header` it has seen in its window; otherwise it routes as fanout. A duplicate
is confirmed to a confirm-mode publisher and delivered nowhere.

The tests on the shared broker also run against a 3-node cluster (scripts/test); the restart
tests start single nodes of their own (a cluster's leader kill is in
tests/cluster/test_dedup_cluster.py).
"""

from __future__ import annotations

import time

import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import api, drain
from .test_dedup import DEDUP, maxqctl, restart, with_id

pytestmark = pytest.mark.timeout(90)

EXCHANGE_TYPE = "x-message-deduplication"


def declare_dedup_exchange(env, channel, *queues: str, **arguments) -> str:
    exchange = env.exchange_name()
    channel.exchange_declare(exchange, EXCHANGE_TYPE, arguments={"x-cache-size": 100, **arguments})
    for queue in queues:
        channel.queue_declare(queue)
        channel.queue_bind(queue, exchange, "ignored")  # (routes as fanout: the key does not matter)
    return exchange


def test_a_duplicate_is_confirmed_and_routed_nowhere(env):
    channel = env.channel()
    first, second = env.queue_name("first"), env.queue_name("second")
    exchange = declare_dedup_exchange(env, channel, first, second)
    channel.confirm_delivery()
    channel.basic_publish(exchange, "any key", b"a", with_id("a"))
    channel.basic_publish(exchange, "", b"b", with_id("b"))
    channel.basic_publish(exchange, "", b"a again", with_id("a"))  # confirmed (no NackError), dropped
    channel.basic_publish(exchange, "", b"no id")
    channel.basic_publish(exchange, "", b"no id")  # without the header: never deduplicated
    channel.basic_publish("", first, b"a direct", with_id("a"))  # not through the exchange: its window does not apply
    assert drain(channel, first) == [b"a", b"b", b"no id", b"no id", b"a direct"]
    assert drain(channel, second) == [b"a", b"b", b"no id", b"no id"]


def test_two_exchanges_have_two_windows_and_a_queues_own_window_applies_too(env):
    channel = env.channel()
    queue, own = env.queue_name("plain"), env.queue_name("own")
    one = declare_dedup_exchange(env, channel, queue)
    other = declare_dedup_exchange(env, channel, queue)
    channel.queue_declare(own, arguments=DEDUP)
    channel.queue_bind(own, one)
    channel.confirm_delivery()
    channel.basic_publish("", own, b"direct", with_id("k"))  # in own's window
    channel.basic_publish(one, "", b"one", with_id("k"))  # new to one's window; own's drops it
    channel.basic_publish(other, "", b"other", with_id("k"))  # new to other's window
    channel.basic_publish(one, "", b"one again", with_id("k"))
    assert drain(channel, queue) == [b"one", b"other"]
    assert drain(channel, own) == [b"direct"]


def test_the_window_by_count_and_by_time(env):
    channel = env.channel()
    by_count, by_time = env.queue_name("count"), env.queue_name("time")
    small = declare_dedup_exchange(env, channel, by_count, **{"x-cache-size": 2})
    timed = declare_dedup_exchange(env, channel, by_time, **{"x-cache-ttl": 1500})
    channel.confirm_delivery()
    for dedup_id in ("a", "b", "c", "c", "a"):  # "a" left the window when "c" came
        channel.basic_publish(small, "", dedup_id.encode(), with_id(dedup_id))
    assert drain(channel, by_count) == [b"a", b"b", b"c", b"a"]
    channel.basic_publish(timed, "", b"t", with_id("t"))
    channel.basic_publish(timed, "", b"short", with_id("s", **{"x-cache-ttl": 100}))  # its own TTL wins
    time.sleep(0.3)
    channel.basic_publish(timed, "", b"t again", with_id("t"))  # within 1,500 ms: dropped
    channel.basic_publish(timed, "", b"short again", with_id("s"))  # over 100 ms: kept
    time.sleep(1.5)
    channel.basic_publish(timed, "", b"t 3", with_id("t"))
    assert drain(channel, by_time) == [b"t", b"short", b"short again", b"t 3"]


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"),
        ({"x-cache-size": 0}, "'x-cache-size' must be an integer greater than 0"),
        ({"x-cache-size": "100"}, "'x-cache-size' must be an integer greater than 0"),
        ({"x-cache-size": 10, "x-cache-ttl": -1}, "'x-cache-ttl' must be an integer greater than 0"),
        ({"x-cache-size": 10, "x-cache-persistence": "tape"}, "must be either 'disk' or 'memory'"),
    ],
)
def test_bad_arguments_are_refused_with_406(env, arguments, text):
    channel = env.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.exchange_declare(env.exchange_name(), EXCHANGE_TYPE, arguments=arguments)
    assert refused.value.reply_code == 406
    assert "PRECONDITION_FAILED" in refused.value.reply_text and text in refused.value.reply_text


def test_the_management_api_lists_and_declares_the_type(env, broker):
    status, overview, _ = api(broker, "GET", "/api/overview")
    assert status == 200
    names = [t["name"] for t in overview["exchange_types"]]
    assert EXCHANGE_TYPE in names and "x-delayed-message" in names
    path = f"/api/exchanges/%2F/{env.exchange_name()}"
    status, body, _ = api(broker, "PUT", path, {"type": EXCHANGE_TYPE, "arguments": {}})
    assert status == 400 and "'x-cache-size' must be an integer greater than 0" in body["reason"]
    assert api(broker, "GET", path)[0] == 404  # refused: nothing made
    status, _, _ = api(broker, "PUT", path, {"type": EXCHANGE_TYPE, "arguments": {"x-cache-size": 5}})
    assert status == 201
    status, shown, _ = api(broker, "GET", path)
    assert status == 200 and shown["type"] == EXCHANGE_TYPE and shown["arguments"] == {"x-cache-size": 5}
    assert api(broker, "DELETE", path)[0] == 204
    name = env.exchange_name()
    result = maxqctl(broker, "declare-exchange", name, EXCHANGE_TYPE)  # without x-cache-size
    assert result.returncode != 0 and "'x-cache-size' must be an integer" in result.stderr
    result = maxqctl(broker, "declare-exchange", name, EXCHANGE_TYPE, "--arguments", '{"x-cache-size": 10}')
    assert result.returncode == 0, result.stderr
    assert maxqctl(broker, "delete-exchange", name).returncode == 0


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_the_windows_survive_a_restart(start_broker, how):
    """A durable queue with a window of its own and two exchanges' windows: each is stored in
    its own range of the queue's records and read back."""
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("dq", durable=True, arguments={**DEDUP, "x-cache-size": 2})
    for exchange, size in (("dx1", 3), ("dx2", 100)):
        channel.exchange_declare(exchange, EXCHANGE_TYPE, durable=True, arguments={"x-cache-size": size})
        channel.queue_bind("dq", exchange)
    channel.confirm_delivery()
    for dedup_id in ("a", "b", "c", "d"):  # dx1's window keeps b, c, d
        channel.basic_publish("dx1", "", dedup_id.encode(), with_id(dedup_id, persistent=True))
    channel.basic_publish("dx2", "", b"x", with_id("x", persistent=True))
    for dedup_id in ("e", "f"):  # straight to dq: its own window is now e, f
        channel.basic_publish("", "dq", dedup_id.encode(), with_id(dedup_id, persistent=True))
    assert drain(channel, "dq") == [b"a", b"b", b"c", b"d", b"x", b"e", b"f"]
    connection.close()  # (every publish was confirmed: on disk before the kill)

    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    for dedup_id in ("b", "c", "d", "a"):  # only dx1's window has b, c, d
        channel.basic_publish("dx1", "", b"again " + dedup_id.encode(), with_id(dedup_id, persistent=True))
    channel.basic_publish("dx2", "", b"x again", with_id("x", persistent=True))  # only dx2's window has "x"
    channel.basic_publish("", "dq", b"f again", with_id("f", persistent=True))  # only dq's has "f"
    channel.basic_publish("dx2", "", b"a via dx2", with_id("a", persistent=True))  # dq's window has "a" now
    assert drain(channel, "dq") == [b"again a"]
    connection.close()
