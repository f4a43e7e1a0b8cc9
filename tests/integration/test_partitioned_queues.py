"""Partitioned queues through pika (x-partitions, issue #19; machines/partitions.py).

One name, N queues: a publish goes to the partition its x-partition-key header (else its
routing key) hashes to, so each key keeps its order; a consumer of the name receives from every
partition, basic.get takes from them in turn, and declare-ok, purge-ok and delete-ok count all.
"""

from __future__ import annotations

import collections
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from maxq_raft.machines.partitions import partition_name

from ..helpers import STATS_SHOWN_S, api, pump, wait_until

pytestmark = pytest.mark.timeout(60)

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")
PARTITIONS = 4
KEYS = 12
PER_KEY = 25


def declare(channel, name: str, count: int = PARTITIONS, **arguments):
    return channel.queue_declare(name, durable=True, arguments={"x-partitions": count, **arguments})


def publish_keyed(channel, exchange: str, name: str) -> list[tuple[str, int]]:
    """PER_KEY messages for each of KEYS keys, interleaved; bodies are b"key:n"."""
    sent = []
    for n in range(PER_KEY):
        for k in range(KEYS):
            key = f"key-{k}"
            body = f"{key}:{n}".encode()
            if exchange:
                channel.basic_publish(exchange, key, body)
            else:
                props = pika.BasicProperties(headers={"x-partition-key": key})
                channel.basic_publish("", name, body, props)
            sent.append((key, n))
    return sent


def filled(env) -> tuple:
    """A channel with confirms, a new queue of PARTITIONS partitions, and its keyed messages."""
    channel = env.channel()
    channel.confirm_delivery()
    name = env.queue_name()
    declare(channel, name)
    return channel, name, publish_keyed(channel, "", name)


def partition_depths(channel, name: str) -> list[int]:
    """Each partition's messages (the name's own declare-ok counts them all: partition 0's is the rest)."""
    total = channel.queue_declare(name, passive=True).method.message_count
    others = [
        channel.queue_declare(partition_name(name, i), passive=True).method.message_count for i in range(1, PARTITIONS)
    ]
    return [total - sum(others), *others]


@pytest.mark.parametrize("through", ["exchange", "header"])
def test_keys_spread_over_partitions_and_counts_are_the_sum(env, through):
    channel = env.channel()
    channel.confirm_delivery()
    name = env.queue_name()
    ok = declare(channel, name)
    assert ok.method.queue == name and ok.method.message_count == 0
    exchange = ""
    if through == "exchange":
        exchange = env.exchange_name()
        channel.exchange_declare(exchange, "topic")
        channel.queue_bind(name, exchange, "#")
    sent = publish_keyed(channel, exchange, name)
    depths = partition_depths(channel, name)
    assert sum(depths) == len(sent) and min(depths) >= 0
    assert sum(1 for depth in depths if depth) >= 2, depths  # 12 keys: never all in one of 4
    assert all(depth % PER_KEY == 0 for depth in depths), depths  # each key in one partition
    # a redeclare with the same count is the same queue; another count is refused
    assert declare(channel, name).method.message_count == len(sent)
    with pytest.raises(ChannelClosedByBroker) as refused:
        declare(channel, name, 3)
    assert refused.value.reply_code == 406 and "x-partitions" in refused.value.reply_text
    channel = env.channel()
    assert channel.queue_purge(name).method.message_count == len(sent)
    assert channel.queue_declare(name, passive=True).method.message_count == 0


def test_a_consumer_gets_every_message_once_with_each_keys_order(env):
    channel, name, sent = filled(env)
    consumer = env.channel()
    consumer.basic_qos(prefetch_count=20)
    got: list[tuple[str, int]] = []

    def on_message(ch, method, _props, body):
        key, n = body.decode().split(":")
        got.append((key, int(n)))
        ch.basic_ack(method.delivery_tag)

    consumer.basic_consume(name, on_message)
    assert wait_until(lambda: len(got) >= len(sent), 20, connections=[consumer.connection]), len(got)
    pump([consumer.connection], 0.3)  # nothing more comes
    assert sorted(got) == sorted(sent)
    by_key = collections.defaultdict(list)
    for key, n in got:
        by_key[key].append(n)
    assert all(ns == list(range(PER_KEY)) for ns in by_key.values()), by_key
    assert wait_until(lambda: channel.queue_declare(name, passive=True).method.message_count == 0, 5)


def test_basic_get_takes_from_the_partitions_in_turn(env):
    channel, name, sent = filled(env)
    got = []
    remaining = []
    for _ in range(len(sent) + 1):
        method, _props, body = channel.basic_get(name, auto_ack=True)
        if method is None:
            break
        got.append(tuple(body.decode().split(":")))
        remaining.append(method.message_count)
    assert sorted((key, int(n)) for key, n in got) == sorted(sent)
    assert remaining[0] == len(sent) - 1 and remaining[-1] == 0
    # in turn: the first few gets come from different partitions (different keys' hashes)
    assert len({key for key, _n in got[:PARTITIONS]}) > 1


def test_a_consumers_prefetch_is_shared_by_the_partitions(env):
    _channel, name, _sent = filled(env)
    consumer = env.channel()
    consumer.basic_qos(prefetch_count=8)
    got = []
    consumer.basic_consume(name, lambda ch, method, props, body: got.append(method.delivery_tag))
    wait_until(lambda: len(got) >= 8, 5, connections=[consumer.connection])
    pump([consumer.connection], 0.5)
    assert 1 <= len(got) <= 8, len(got)  # 2 for each of 4 partitions, never 8 each


def test_single_active_consumers_share_the_partitions_and_keep_each_keys_order(env):
    channel = env.channel()
    channel.confirm_delivery()
    name = env.queue_name()
    declare(channel, name, **{"x-single-active-consumer": True})
    got = collections.defaultdict(list)
    consumers = []
    for label in ("a", "b"):
        ch = env.channel()
        ch.basic_qos(prefetch_count=10)

        def on_message(ch, method, _props, body, label=label):
            key, n = body.decode().split(":")
            got[key].append((label, int(n)))
            ch.basic_ack(method.delivery_tag)

        ch.basic_consume(name, on_message)
        consumers.append(ch)
    sent = publish_keyed(channel, "", name)
    assert wait_until(
        lambda: sum(len(v) for v in got.values()) >= len(sent), 20, connections=[ch.connection for ch in consumers]
    )
    for key, deliveries in got.items():
        assert [n for _label, n in deliveries] == list(range(PER_KEY)), key
        assert len({label for label, _n in deliveries}) == 1, key  # one active consumer per partition
    # the two share the partitions (0 and 2 the first, 1 and 3 the second): both got keys
    assert {deliveries[0][0] for deliveries in got.values()} == {"a", "b"}


def test_refusals(env):
    channel = env.channel()
    name = env.queue_name()
    for bad in (0, 65, "4"):
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(name, arguments={"x-partitions": bad})
        assert refused.value.reply_code == 406 and "x-partitions" in refused.value.reply_text
        channel = env.channel()
    for kwargs in ({"exclusive": True}, {"auto_delete": True}, {"arguments": {"x-partitions": 2, "x-expires": 1000}}):
        arguments = kwargs.pop("arguments", {"x-partitions": 2})
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(name, arguments=arguments, **kwargs)
        assert refused.value.reply_code == 406, kwargs
        channel = env.channel()
    declare(channel, name, 2)
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_declare(partition_name(name, 1))  # a client may not make one itself
    assert refused.value.reply_code == 403
    channel = env.channel()
    with pytest.raises(ChannelClosedByBroker) as refused:
        channel.queue_delete(partition_name(name, 1))  # nor delete one alone
    assert refused.value.reply_code == 403
    channel = env.channel()
    assert channel.queue_declare(partition_name(name, 1), passive=True).method.message_count == 0
    assert channel.queue_delete(name).method.message_count == 0
    with pytest.raises(ChannelClosedByBroker) as gone:
        channel.queue_declare(partition_name(name, 1), passive=True)
    assert gone.value.reply_code == 404


def test_when_a_single_active_consumer_goes_the_other_takes_its_partitions_in_order(env):
    channel = env.channel()
    channel.confirm_delivery()
    name = env.queue_name()
    declare(channel, name, **{"x-single-active-consumer": True})
    sent = publish_keyed(channel, "", name)
    seen: list[tuple[str, str, int]] = []  # (consumer, key, n) in the order processed
    channels = {}
    for label in ("a", "b"):
        ch = env.channel()
        ch.basic_qos(prefetch_count=5)

        def on_message(ch, method, _props, body, label=label):
            key, n = body.decode().split(":")
            seen.append((label, key, int(n)))
            ch.basic_ack(method.delivery_tag)

        ch.basic_consume(name, on_message)
        channels[label] = ch
    connections = [ch.connection for ch in channels.values()]
    assert wait_until(lambda: sum(1 for c, _k, _n in seen if c == "a") >= 40, 20, connections=connections)
    channels["a"].connection.close()  # a goes part way: b takes its partitions
    assert wait_until(
        lambda: len({(k, n) for _c, k, n in seen}) >= len(sent), 20, connections=[channels["b"].connection]
    )
    firsts: dict[str, list[int]] = collections.defaultdict(list)
    done = set()
    for _consumer, key, n in seen:
        if (key, n) not in done:  # (one a had not acked yet comes again to b)
            done.add((key, n))
            firsts[key].append(n)
    assert done == set(sent)
    assert all(ns == list(range(PER_KEY)) for ns in firsts.values()), firsts
    assert {c for c, _k, _n in seen[-10:]} == {"b"}


def test_a_partitions_policy_partitions_queues_made_after_it(env, broker):
    tag = uuid.uuid4().hex[:8]
    policy = f"parts-{tag}"
    set_policy = subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{broker.http_port}", "set-policy", policy, f"^pp-{tag}", '{"partitions": 3}'],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert set_policy.returncode == 0, set_policy.stderr
    try:
        channel = env.channel()
        name = env.queue_name(f"pp-{tag}")
        channel.queue_declare(name, durable=True)  # no argument: the policy's count
        assert channel.queue_declare(partition_name(name, 2), passive=True)
        channel.queue_declare(name, durable=True)  # a redeclare need not repeat it
        with pytest.raises(ChannelClosedByBroker) as refused:
            channel.queue_declare(name, durable=True, arguments={"x-partitions": 2})
        assert refused.value.reply_code == 406
        channel = env.channel()
        exclusive = channel.queue_declare(f"pp-{tag}-own", exclusive=True)  # cannot be: the policy passes it by
        assert exclusive.method.queue == f"pp-{tag}-own"
        with pytest.raises(ChannelClosedByBroker):
            channel.queue_declare(partition_name(f"pp-{tag}-own", 1), passive=True)
    finally:
        subprocess.run(
            [MAXQCTL, "--node", f"127.0.0.1:{broker.http_port}", "clear-policy", policy],
            capture_output=True,
            timeout=30,
        )


def test_the_admin_api_acts_on_every_partition(env, broker):
    channel, name, sent = filled(env)
    path = f"/api/queues/%2F/{name}"
    # (a member holding no replica of a partition's group shows what its leader last reported,
    # every 5 s: server/queue_stats.py; the suite runs against such a member too, scripts/test)
    view = wait_until(lambda: (v := api(broker, "GET", path)[1]) and v["messages"] == len(sent) and v, STATS_SHOWN_S)
    assert view and view["partitions"] == PARTITIONS, view
    status, part, _ = api(broker, "GET", f"/api/queues/%2F/{partition_name(name, 1)}")
    assert status == 200 and part["partition_of"] == name  # (a single node has one shard group)
    status, got, _ = api(
        broker, "POST", path + "/get", {"count": 20, "ackmode": "ack_requeue_false", "encoding": "auto"}
    )
    assert status == 200 and len(got) == 20
    assert channel.queue_declare(name, passive=True).method.message_count == len(sent) - 20
    status, body, _ = api(broker, "DELETE", f"/api/queues/%2F/{partition_name(name, 2)}")
    assert status == 401, body  # a partition alone: no (its amq. name, as RabbitMQ)
    status, _, _ = api(broker, "DELETE", path + "/contents")
    assert status == 204
    assert channel.queue_declare(name, passive=True).method.message_count == 0
    status, _, _ = api(broker, "DELETE", path)
    assert status == 204
    for i in range(PARTITIONS):
        assert api(broker, "GET", f"/api/queues/%2F/{partition_name(name, i)}")[0] == 404


def test_definitions_keep_a_partitioned_queue_as_one_and_make_its_partitions_again(env, broker):
    channel = env.channel()
    name = env.queue_name()
    declare(channel, name, 3)
    status, exported, _ = api(broker, "GET", "/api/definitions")
    assert status == 200
    mine = [q for q in exported["queues"] if name in q["name"]]
    assert [q["name"] for q in mine] == [name] and mine[0]["arguments"]["x-partitions"] == 3
    channel.queue_delete(name)
    status, body, _ = api(broker, "POST", "/api/definitions", {"queues": mine})
    assert status in (200, 201, 204), body
    assert channel.queue_declare(partition_name(name, 2), passive=True)


def test_a_policys_expiry_does_not_reach_a_partitioned_queue(env, broker):
    tag = uuid.uuid4().hex[:8]
    status, body, _ = api(
        broker,
        "PUT",
        f"/api/policies/%2F/expiry-{tag}",
        {"pattern": f"^px-{tag}", "definition": {"expires": 1000}, "apply-to": "queues"},
    )
    assert status in (201, 204), body
    try:
        channel = env.channel()
        name = env.queue_name(f"px-{tag}")
        declare(channel, name, 2)
        plain = env.queue_name(f"px-{tag}")
        channel.queue_declare(plain)
        assert wait_until(lambda: api(broker, "GET", f"/api/queues/%2F/{plain}")[0] == 404, 10)  # it expires
        assert channel.queue_declare(name, passive=True)  # it does not, nor its partition
        assert channel.queue_declare(partition_name(name, 1), passive=True)
    finally:
        api(broker, "DELETE", f"/api/policies/%2F/expiry-{tag}")
