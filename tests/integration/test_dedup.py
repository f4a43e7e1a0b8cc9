"""x-message-deduplication through pika (machines/dedup.py, docs/queue-features.md).

References: the community plugin rabbitmq-message-deduplication's README (queue argument
`x-message-deduplication`, message header `x-deduplication-header`, `x-cache-size` and
`x-cache-ttl`, also as a message header) and its policy validator (x-cache-size and x-cache-ttl
integers greater than 0). A duplicate in the window is confirmed to a confirm-mode publisher
and never delivered; one outside it (evicted by count, or expired) is queued as any publish.

The tests on the shared broker also run against a 3-node cluster (scripts/test); the restart
tests start single nodes of their own (a cluster's leader kill is tests/cluster/test_dedup_cluster.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, NackError

from ..helpers import drain, message_count

pytestmark = pytest.mark.timeout(90)

DEDUP = {"x-message-deduplication": True}
MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def maxqctl(broker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{broker.http_port}", *args], capture_output=True, text=True, timeout=30
    )


def with_id(dedup_id, persistent: bool = False, **headers) -> pika.BasicProperties:
    return pika.BasicProperties(
        delivery_mode=2 if persistent else None, headers={"x-deduplication-header": dedup_id, **headers}
    )


def publish(channel, queue: str, body: bytes, dedup_id=None, persistent: bool = False, **headers) -> None:
    """One publish; with confirms on, it returns only once the broker acked it (a nack raises)."""
    props = with_id(dedup_id, persistent, **headers) if dedup_id is not None else None
    channel.basic_publish("", queue, body, props)


def test_a_duplicate_in_the_window_is_confirmed_and_dropped(env):
    channel = env.channel()
    name = env.queue_name("dedup")
    channel.queue_declare(name, arguments=DEDUP)
    channel.confirm_delivery()
    publish(channel, name, b"first a", "a")
    publish(channel, name, b"first b", "b")
    publish(channel, name, b"again a", "a")  # confirmed (no NackError), not queued
    publish(channel, name, b"no id")
    publish(channel, name, b"no id")  # without the header: never deduplicated
    publish(channel, name, b"int 1", 1)
    publish(channel, name, b"str 1", "1")  # the integer 1 and the string "1" are different ids
    publish(channel, name, b"again 1", 1)
    assert drain(channel, name) == [b"first a", b"first b", b"no id", b"no id", b"int 1", b"str 1"]
    publish(channel, name, b"after consumption", "a")  # consumed, still in the window
    assert message_count(channel, name) == 0


def test_a_duplicate_is_never_delivered_to_a_waiting_consumer(env):
    channel = env.channel()
    name = env.queue_name("dedup")
    channel.queue_declare(name, arguments=DEDUP)
    channel.confirm_delivery()
    publisher = env.channel()
    publisher.confirm_delivery()
    for i in range(5):
        publish(publisher, name, b"%d" % i, "same")
    publish(publisher, name, b"other", "other")
    got = []
    for method, _props, body in channel.consume(name, auto_ack=True, inactivity_timeout=1.0):
        if method is None:
            break
        got.append(body)
    channel.cancel()
    assert got == [b"0", b"other"]


def test_one_publish_to_two_queues_is_dropped_only_where_it_is_a_duplicate(env):
    channel = env.channel()
    exchange = env.exchange_name()
    dedup, plain = env.queue_name("dedup"), env.queue_name("plain")
    channel.exchange_declare(exchange, "fanout")
    channel.queue_declare(dedup, arguments=DEDUP)
    channel.queue_declare(plain)
    channel.queue_bind(dedup, exchange)
    channel.queue_bind(plain, exchange)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish(exchange, "", b"m", with_id("x"))
    assert message_count(channel, dedup) == 1
    assert message_count(channel, plain) == 3


def test_an_id_evicted_by_count_is_kept(env):
    channel = env.channel()
    name = env.queue_name("dedup")
    channel.queue_declare(name, arguments={**DEDUP, "x-cache-size": 2})
    channel.confirm_delivery()
    for dedup_id in ("a", "b", "c"):  # "a" leaves the window
        publish(channel, name, dedup_id.encode(), dedup_id)
    publish(channel, name, b"c again", "c")  # still in it: dropped
    publish(channel, name, b"a again", "a")  # outside it: kept (and "b" leaves)
    publish(channel, name, b"b again", "b")
    assert drain(channel, name) == [b"a", b"b", b"c", b"a again", b"b again"]


def test_an_id_expires_by_x_cache_ttl_and_by_a_publishs_own_header(env):
    channel = env.channel()
    name = env.queue_name("dedup")
    channel.queue_declare(name, arguments={**DEDUP, "x-cache-ttl": 1500})
    channel.confirm_delivery()
    publish(channel, name, b"a", "a")
    publish(channel, name, b"short", "s", **{"x-cache-ttl": 100})  # its own TTL wins
    publish(channel, name, b"a again", "a")
    time.sleep(0.3)
    publish(channel, name, b"a 3", "a")  # within 1,500 ms (with a wide margin for a busy box): dropped
    publish(channel, name, b"short again", "s")  # over 100 ms: kept
    time.sleep(1.5)
    publish(channel, name, b"a 4", "a")  # over 1,500 ms: kept
    assert drain(channel, name) == [b"a", b"short", b"short again", b"a 4"]


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({"x-message-deduplication": "yes"}, "invalid arg 'x-message-deduplication' for queue"),
        ({**DEDUP, "x-cache-size": 0}, "invalid arg 'x-cache-size' for queue"),
        ({**DEDUP, "x-cache-size": "100"}, "{unacceptable_type,longstr}"),
        ({**DEDUP, "x-cache-size": 2_000_000}, "{value_too_large,2000000,1000000}"),
        ({**DEDUP, "x-cache-ttl": -5}, "invalid arg 'x-cache-ttl' for queue"),
    ],
)
def test_bad_arguments_are_refused_with_406(env, arguments, text):
    channel = env.channel()
    name = env.queue_name("dedup")
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(name, arguments=arguments)
    assert refused.value.reply_code == 406
    assert "PRECONDITION_FAILED" in refused.value.reply_text and text in refused.value.reply_text


def test_a_full_reject_publish_queue_nacks_and_does_not_record_the_id(env):
    channel = env.channel()
    name = env.queue_name("dedup")
    channel.queue_declare(name, arguments={**DEDUP, "x-max-length": 1, "x-overflow": "reject-publish"})
    channel.confirm_delivery()
    publish(channel, name, b"1", "one")
    with pytest.raises(NackError):
        publish(channel, name, b"2", "two")
    publish(channel, name, b"1 again", "one")  # a duplicate: confirmed, though the queue is full
    assert drain(channel, name) == [b"1"]
    publish(channel, name, b"2 again", "two")  # refused before, so not recorded: queued now
    assert drain(channel, name) == [b"2 again"]


def test_a_policy_turns_deduplication_on_and_off(env, broker):
    channel = env.channel()
    tag = env.queue_name("pol")
    name = env.queue_name(f"{tag}-q")
    channel.queue_declare(name)
    channel.confirm_delivery()
    policy = f"dedup-{tag}"
    try:
        result = maxqctl(broker, "set-policy", policy, f"^{tag}-q", '{"message-deduplication": true, "cache-size": 10}')
        assert result.returncode == 0, result.stderr
        publish(channel, name, b"1", "k")
        publish(channel, name, b"2", "k")
        assert message_count(channel, name) == 1
    finally:
        assert maxqctl(broker, "clear-policy", policy).returncode == 0
    publish(channel, name, b"3", "k")
    assert drain(channel, name) == [b"1", b"3"]


def test_a_policy_with_the_plugins_own_keys_and_a_bad_value(env, broker):
    tag = env.queue_name("pol")
    refused = maxqctl(broker, "set-policy", f"bad-{tag}", f"^{tag}", '{"x-cache-size": 0}')
    assert refused.returncode != 0 and "x-cache-size" in refused.stdout + refused.stderr
    channel = env.channel()
    name = env.queue_name(f"{tag}-q")
    channel.queue_declare(name)
    channel.confirm_delivery()
    policy = f"plugin-{tag}"
    try:
        result = maxqctl(broker, "set-policy", policy, f"^{tag}-q", '{"x-message-deduplication": true}')
        assert result.returncode == 0, result.stderr
        publish(channel, name, b"1", "k")
        publish(channel, name, b"2", "k")
        assert drain(channel, name) == [b"1"]
    finally:
        maxqctl(broker, "clear-policy", policy)


# ------------------------------------------------------------------ restarts (single nodes)


def restart(start_broker, server, how: str):
    """Stop `server` (cleanly or by SIGKILL) and start a new process on its data folder
    (as test_durability.py does)."""
    if how == "sigkill":
        server.kill()
        assert server.proc.returncode == -9
    else:
        assert server.stop() == 0, server.log_text()
    return start_broker(data_dir=server.data_dir)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_the_window_of_a_durable_queue_survives_a_restart(start_broker, how):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("dq", durable=True, arguments={**DEDUP, "x-cache-size": 3})
    channel.queue_declare("kept", durable=True, arguments=DEDUP)
    channel.confirm_delivery()
    for dedup_id in ("a", "b", "c", "d"):  # "a" is evicted
        publish(channel, "dq", dedup_id.encode(), dedup_id, persistent=True)
    publish(channel, "kept", b"queued", "q", persistent=True)
    assert drain(channel, "dq") == [b"a", b"b", b"c", b"d"]  # consumed: the ids stay
    connection.close()  # (every publish was confirmed: on disk before the kill)

    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    for dedup_id in ("b", "c", "d", "a"):
        publish(channel, "dq", b"again " + dedup_id.encode(), dedup_id, persistent=True)
    assert drain(channel, "dq") == [b"again a"]  # b, c, d were still in the window
    publish(channel, "kept", b"queued again", "q", persistent=True)
    assert drain(channel, "kept") == [b"queued"]
    connection.close()


def test_the_window_of_a_queue_deduplicating_by_policy_survives_a_restart(start_broker):
    """The policy comes after the queue in the metadata log: at the restart's replay the window
    starts with the policy, before the store's records are read back into it."""
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("by-policy", durable=True)
    result = maxqctl(server, "set-policy", "dedup", "^by-policy$", '{"message-deduplication": true}')
    assert result.returncode == 0, result.stderr
    channel.confirm_delivery()
    for dedup_id in ("a", "b"):
        publish(channel, "by-policy", dedup_id.encode(), dedup_id, persistent=True)
    assert drain(channel, "by-policy") == [b"a", b"b"]
    connection.close()

    server = restart(start_broker, server, "sigterm")
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    for dedup_id in ("a", "b", "c"):
        publish(channel, "by-policy", b"again " + dedup_id.encode(), dedup_id, persistent=True)
    assert drain(channel, "by-policy") == [b"again c"]
    connection.close()
