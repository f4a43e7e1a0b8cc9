"""Message trace (x-trace, issue #20 item 1) against a real node with pika: the records of a
message's life read back through GET /api/trace/{vhost} and `maxqctl trace`; the policy route;
the broker-assigned id header; bodies; expiry and overflow drops; retention; bad queries."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlencode

import pika
import pytest

from maxq_raft.amqp import spec as amqp_spec
from maxq_raft.amqp.frames import encode_content

from ..helpers import api, wait_until
from ..raw_client import RawClient

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def trace(broker, **query: str) -> list[dict]:
    status, body, _ = api(broker, "GET", "/api/trace/%2F?" + urlencode(query))
    assert status == 200, body
    return body


def events(records: list[dict], queue: str | None = None) -> list[str]:
    return [r["event"] for r in records if queue is None or r["queue"] == queue]


def maxqctl(broker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{broker.http_port}", *args], capture_output=True, text=True, timeout=30
    )


@pytest.fixture
def channel(env):
    return env.channel()


def test_a_message_routed_to_two_queues_one_acked_one_dead_lettered(env, broker, channel):
    exchange, dlx = env.exchange_name("trace-fan"), env.exchange_name("trace-dlx")
    acked, rejected, dead = env.queue_name("trace-a"), env.queue_name("trace-b"), env.queue_name("trace-d")
    channel.exchange_declare(exchange, "fanout")
    channel.exchange_declare(dlx, "fanout")
    channel.queue_declare(acked, arguments={"x-trace": True})
    channel.queue_declare(rejected, arguments={"x-trace": True, "x-dead-letter-exchange": dlx})
    channel.queue_declare(dead, arguments={"x-trace": True})
    for queue, source in ((acked, exchange), (rejected, exchange), (dead, dlx)):
        channel.queue_bind(queue, source)
    message_id, correlation_id = fresh("m"), fresh("c")
    channel.confirm_delivery()
    channel.basic_publish(
        exchange, "rk", b"hello", pika.BasicProperties(message_id=message_id, correlation_id=correlation_id)
    )
    method, _, _ = channel.basic_get(acked)
    channel.basic_ack(method.delivery_tag)
    method, _, _ = channel.basic_get(rejected)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_until(lambda: channel.basic_get(dead, auto_ack=True)[0] is not None, 5)

    records = wait_until(
        lambda: (r := trace(broker, message_id=message_id)) and "delivered" in events(r, dead) and r, 5
    )
    assert records, trace(broker, message_id=message_id)
    assert events(records, acked) == ["published", "enqueued", "delivered", "acked"]
    assert events(records, rejected) == ["published", "enqueued", "delivered", "rejected", "dead-lettered"]
    assert events(records, dead) == ["enqueued", "delivered"]  # (got with auto-ack)
    published = next(r for r in records if r["event"] == "published" and r["queue"] == acked)
    assert published["user"] == "guest" and published["exchange"] == exchange and published["routing_key"] == "rk"
    assert sorted(published["routed_queues"]) == sorted([acked, rejected]) and published["confirmed"] is True
    assert published["client_address"] == "127.0.0.1" and published["connection"]
    assert published["correlation_id"] == correlation_id and "body_base64" not in published
    delivered = next(r for r in records if r["event"] == "delivered" and r["queue"] == acked)
    assert delivered["via"] == "basic.get" and delivered["delivery_count"] == 1 and delivered["redelivered"] is False
    dead_lettered = next(r for r in records if r["event"] == "dead-lettered")
    assert dead_lettered["reason"] == "rejected" and dead_lettered["exchange"] == dlx
    times = [r["time_ms"] for r in records]
    assert times == sorted(times) and abs(times[0] / 1000 - time.time()) < 60

    # The same records by correlation id; a queue's by time range.
    assert trace(broker, correlation_id=correlation_id) == records
    assert events(trace(broker, queue=acked, since="10m")) == ["published", "enqueued", "delivered", "acked"]
    assert trace(broker, queue=acked, since="0", until=str(times[0] - 1)) == []

    shown = maxqctl(broker, "trace", message_id)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["time", "queue", "event", "message_id", "details"] and len(lines) == 1 + len(records)
    assert "dead-lettered" in shown.stdout and "reason=rejected" in shown.stdout
    as_json = maxqctl(broker, "trace", "--queue", rejected, "--since", "10m", "--json")
    assert as_json.returncode == 0 and events(json.loads(as_json.stdout)) == events(records, rejected)


def test_a_policy_turns_trace_on_and_a_message_without_id_gets_one(env, broker, channel):
    prefix = fresh("trace-pol")
    traced, plain = env.queue_name(prefix), env.queue_name("untraced")
    status, body, _ = api(
        broker, "PUT", f"/api/policies/%2F/{prefix}", {"pattern": f"^{prefix}", "definition": {"trace": True}}
    )
    assert status in (201, 204), body
    try:
        channel.queue_declare(traced)
        channel.queue_declare(plain)
        wait_until(lambda: trace_on(broker, traced), 5)
        channel.basic_publish("", traced, b"one")
        channel.basic_publish("", plain, b"two")
        _, props, _ = wait_until(lambda: (got := channel.basic_get(traced, auto_ack=True))[0] and got, 5)
        trace_id = props.headers["x-maxq-trace-id"]
        assert props.message_id is None and "@" in trace_id
        _, plain_props, _ = wait_until(lambda: (got := channel.basic_get(plain, auto_ack=True))[0] and got, 5)
        assert not (plain_props.headers or {}).get("x-maxq-trace-id")
        records = wait_until(lambda: (r := trace(broker, message_id=trace_id)) and "delivered" in events(r) and r, 5)
        assert events(records) == ["published", "enqueued", "delivered"] and records[-1]["no_ack"] is True
        assert trace(broker, queue=plain) == []
    finally:
        api(broker, "DELETE", f"/api/policies/%2F/{prefix}")


def test_a_burst_of_publishes_is_traced_message_by_message(env, broker, channel):
    """Publishes in a burst (so that one read carries many) are recorded as runs (server/session.py,
    tracer.py); every message, the one whose properties broke its run too, reads back with all its
    steps under the id in its header."""
    prefix = fresh("trace-burst")
    queue = env.queue_name(prefix)
    channel.queue_declare(queue, arguments={"x-trace": True})
    count = 300
    for i in range(count):
        props = pika.BasicProperties(headers={"odd": 1}) if i == 150 else pika.BasicProperties()
        channel.basic_publish("", queue, b"m%d" % i, props)  # (no confirms: the frames go out together)
    ids = []
    for _ in range(count):
        method, props, body = wait_until(lambda: (got := channel.basic_get(queue))[0] and got, 5)
        ids.append((body, props.headers["x-maxq-trace-id"]))
        channel.basic_ack(method.delivery_tag)
    assert [body for body, _ in ids] == [b"m%d" % i for i in range(count)]
    assert len({trace_id for _, trace_id in ids}) == count
    for i in (0, 1, 149, 150, 151, count - 1):
        records = wait_until(lambda: (r := trace(broker, message_id=ids[i][1])) and "acked" in events(r) and r, 5)
        assert events(records) == ["published", "enqueued", "delivered", "acked"], records
        assert len({r["seq"] for r in records}) == 1 and all(r["message_id"] == ids[i][1] for r in records)
    everything = trace(broker, queue=queue, limit="10000")
    assert len(everything) == 4 * count and all(r["message_id"] for r in everything)


def test_one_write_of_alike_publishes_gives_each_its_own_numbered_id(env, broker, channel):
    """A client's one write of alike publishes is routed as a run (server/publish_plan.py): each
    message still gets its own id, in a row, and each reads back with its steps in each traced
    queue it reached; an untraced queue beside them gets the messages with the same ids."""
    prefix = fresh("trace-run")
    traced_a, traced_b, plain = (env.queue_name(prefix) for _ in range(3))
    exchange = fresh("trace-run-fanout")
    channel.exchange_declare(exchange, "fanout")
    for queue, arguments in ((traced_a, {"x-trace": True}), (traced_b, {"x-trace": True}), (plain, {})):
        channel.queue_declare(queue, arguments=arguments)
        channel.queue_bind(queue, exchange)
    count = 120
    client = RawClient(broker.amqp_port)
    try:
        client.open()
        client.open_channel(1)
        client.call(1, amqp_spec.ConfirmSelect(), amqp_spec.ConfirmSelectOk)
        client.send(
            b"".join(
                encode_content(1, amqp_spec.BasicPublish(exchange=exchange), b"\x00\x00", b"m%d" % i, 131072)
                for i in range(count)
            )
        )
        acked = 0
        while acked < count:
            frame = client.next_frame()
            assert frame is not None and isinstance(frame[2], amqp_spec.BasicAck), frame
            acked = frame[2].delivery_tag
    finally:
        client.close()
    got: dict[str, list] = {}
    for queue in (traced_a, traced_b, plain):
        got[queue] = []
        for _ in range(count):
            method, props, body = channel.basic_get(queue, auto_ack=True)
            assert method is not None, (queue, len(got[queue]))
            got[queue].append((body, props.headers["x-maxq-trace-id"]))
    assert got[traced_a] == got[traced_b] == got[plain]
    assert [body for body, _ in got[plain]] == [b"m%d" % i for i in range(count)]
    numbers = [int(trace_id.rsplit("-", 1)[1]) for _, trace_id in got[plain]]
    assert numbers == list(range(numbers[0], numbers[0] + count))
    for i in (0, 1, count // 2, count - 1):
        trace_id = got[plain][i][1]
        records = wait_until(
            lambda: (r := trace(broker, message_id=trace_id)) and events(r).count("delivered") == 2 and r, 5
        )
        for queue in (traced_a, traced_b):
            assert events(records, queue) == ["published", "enqueued", "delivered"], records  # (a get, no ack)
        assert not events(records, plain)
        assert all(r["message_id"] == trace_id for r in records)
        published = [r for r in records if r["event"] == "published"]
        assert [(r["channel"], r["confirmed"]) for r in published] == [(1, True), (1, True)], published


def trace_on(broker, queue: str) -> bool:
    status, body, _ = api(broker, "GET", f"/api/queues/%2F/{quote(queue, safe='')}")
    return status == 200 and body["trace"] is True


def test_bodies_expiry_and_overflow(env, broker, channel):
    bodies, expiring, capped = env.queue_name("trace-bod"), env.queue_name("trace-ttl"), env.queue_name("trace-cap")
    channel.queue_declare(bodies, arguments={"x-trace": True, "x-trace-bodies": True})
    channel.queue_declare(expiring, arguments={"x-trace": True, "x-message-ttl": 50})
    channel.queue_declare(capped, arguments={"x-trace": True, "x-max-length": 1})
    channel.confirm_delivery()
    channel.basic_publish("", bodies, b"\x00payload", pika.BasicProperties(message_id="bod-1"))
    channel.basic_publish("", expiring, b"x", pika.BasicProperties(message_id="ttl-1"))
    channel.basic_publish("", capped, b"1", pika.BasicProperties(message_id="cap-1"))
    channel.basic_publish("", capped, b"2", pika.BasicProperties(message_id="cap-2"))
    published = trace(broker, message_id="bod-1")[0]
    assert base64.b64decode(published["body_base64"]) == b"\x00payload"
    expired = wait_until(lambda: events(trace(broker, message_id="ttl-1"))[-1:] == ["expired"], 5)
    assert expired, trace(broker, message_id="ttl-1")
    dropped = trace(broker, message_id="cap-1")[-1]
    assert dropped["event"] == "dropped" and dropped["reason"] == "maxlen"
    assert events(trace(broker, message_id="cap-2")) == ["published", "enqueued"]


def test_retention_drops_old_records(env, broker, channel):
    queue = env.queue_name("trace-ret")
    channel.queue_declare(queue, arguments={"x-trace": True, "x-trace-retention": 1000})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"old", pika.BasicProperties(message_id="ret-1"))
    assert events(trace(broker, message_id="ret-1")) == ["published", "enqueued"]
    # Compaction runs every 2 s (tracer.COMPACT_INTERVAL_S): the records go within a few seconds.
    assert wait_until(lambda: trace(broker, message_id="ret-1") == [] and trace(broker, queue=queue) == [], 15)


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("", "exactly one of"),
        ("message_id=a&queue=b", "exactly one of"),
        ("queue=q&since=yesterday", "since must be"),
        ("queue=q&until=5", "until is before since"),
        ("queue=q&limit=0", "limit must be"),
        ("queue=q&limit=abc", "limit must be"),
        ("queue=q&colour=red", "unknown parameter"),
        ("message_id=", "exactly one of"),
    ],
)
def test_bad_queries_are_400(broker, query, reason):
    status, body, _ = api(broker, "GET", "/api/trace/%2F?" + query + ("&since=10" if "until=5" in query else ""))
    assert status == 400 and reason in body["reason"], body


def test_unknown_vhost_is_404_and_maxqctl_refuses_bad_arguments(broker):
    status, _, _ = api(broker, "GET", "/api/trace/nowhere?queue=q")
    assert status == 404
    for args, message in (
        ((), "exactly one of"),
        (("m1", "--queue", "q"), "exactly one of"),
        (("--queue", "q", "--since", "ten minutes"), "--since"),
        (("--queue", "q", "--limit", "0"), "--limit"),
    ):
        result = maxqctl(broker, "trace", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
    none = maxqctl(broker, "trace", "no-such-id")
    assert none.returncode == 0 and "no trace records" in none.stdout


def test_a_message_received_and_deleted_through_the_sqs_api(env, broker, channel):
    import boto3
    from botocore.config import Config

    queue = env.queue_name("trace-sqs")
    channel.queue_declare(queue, arguments={"x-trace": True})
    channel.confirm_delivery()
    channel.basic_publish("", queue, b"over sqs", pika.BasicProperties(message_id="sqs-1"))
    status, key, _ = api(broker, "POST", "/api/users/guest/access-keys")
    assert status == 201, key
    try:
        sqs = boto3.client(
            "sqs",
            endpoint_url=f"http://127.0.0.1:{broker.sqs_port}",
            region_name="us-east-1",
            aws_access_key_id=key["access_key_id"],
            aws_secret_access_key=key["secret_access_key"],
            config=Config(retries={"max_attempts": 1, "mode": "standard"}),
        )
        url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        (received,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, WaitTimeSeconds=2)["Messages"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=received["ReceiptHandle"])
    finally:
        api(broker, "DELETE", f"/api/access-keys/{key['access_key_id']}")
    records = trace(broker, message_id="sqs-1")
    assert events(records) == ["published", "enqueued", "received", "deleted"]
    assert records[2]["via"] == "sqs" and records[2]["receive_count"] == 1
