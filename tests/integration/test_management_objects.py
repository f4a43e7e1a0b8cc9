"""The management API's queue routes against a node, over HTTP and with the real rabbitmqadmin:
status codes, bodies and reasons as RabbitMQ 3.10.8 answered the same requests side by side."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from ..helpers import api

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")
# RabbitMQ 3.10.8's, kept unmodified in tests/tools/ with its MPL 2.0 licence (tests/tools/README.md)
RABBITMQADMIN = [sys.executable, str(Path(__file__).resolve().parents[1] / "tools" / "rabbitmqadmin")]
PASSWORD = "pw-123456"


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def publish(broker, queue: str, count: int) -> None:
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(count):
            channel.basic_publish("", queue, b"m%d" % i)
    finally:
        connection.close()


def test_declare_show_purge_and_delete_answer_as_rabbitmq(broker):
    name = fresh("mq")
    path = f"/api/queues/%2F/{name}"
    assert api(broker, "PUT", path, {"durable": True, "auto_delete": False, "arguments": {}})[0] == 201
    assert api(broker, "PUT", path, {"durable": True})[0] == 204  # the same again
    status, body, _ = api(broker, "PUT", path, {"durable": False})
    assert status == 400 and body["error"] == "bad_request", body
    assert f"inequivalent arg 'durable' for queue '{name}' in vhost '/'" in body["reason"]

    publish(broker, name, 3)
    status, shown, _ = api(broker, "GET", path)
    assert status == 200
    assert (shown["name"], shown["vhost"], shown["durable"], shown["messages"]) == (name, "/", True, 3)
    # as a quorum queue's: its leader and replicas (a single node is both; in scripts/test's
    # cluster passes, the group's replicas: every member, or MAXQ_TEST_FACTOR of them)
    members = len(getattr(broker, "members", [broker]))
    replicas = min(members, int(os.environ.get("MAXQ_TEST_FACTOR") or members))
    assert shown["leader"] == shown["node"] and shown["node"] in shown["members"]
    assert len(shown["members"]) == replicas, shown["members"]
    assert name in [q["name"] for q in api(broker, "GET", "/api/queues/%2F")[1]]

    status, body, _ = api(broker, "DELETE", path + "?if-empty=true")
    assert status == 400 and "not empty" in body["reason"], body
    assert api(broker, "DELETE", path + "/contents")[0] == 204
    assert api(broker, "GET", path)[1]["messages"] == 0
    assert api(broker, "DELETE", path)[0] == 204
    for method, where in (("GET", path), ("DELETE", path), ("DELETE", path + "/contents")):
        status, body, _ = api(broker, method, where)
        assert (status, body) == (404, {"error": "Object Not Found", "reason": "Not Found"}), (method, where)


def test_refusals_change_nothing(broker):
    status, body, _ = api(broker, "PUT", "/api/queues/no-such-vhost/q", {})
    assert (status, body) == (404, {"error": "not_found", "reason": "vhost_not_found"})
    assert api(broker, "GET", "/api/queues/no-such-vhost")[0] == 404
    status, body, _ = api(broker, "PUT", "/api/queues/%2F/amq.mine", {})
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Access refused."})
    name = fresh("bad")
    status, body, _ = api(broker, "PUT", f"/api/queues/%2F/{name}", {"arguments": {"x-max-length": "abc"}})
    assert status == 400 and "x-max-length" in body["reason"], body
    status, body, _ = api(broker, "PUT", f"/api/queues/%2F/{name}", {"durable": "yes"})
    assert status == 400 and "'durable' must be true or false" in body["reason"], body
    assert api(broker, "GET", f"/api/queues/%2F/{name}")[0] == 404  # nothing was declared


def test_a_management_user_needs_the_amqp_permission(broker):
    node = f"127.0.0.1:{broker.http_port}"
    user = fresh("u")

    def ctl(*args: str) -> None:
        subprocess.run([MAXQCTL, "--node", node, *args], check=True, capture_output=True, timeout=30)

    ctl("add-user", user, PASSWORD, "--tags", "management")
    try:
        path = f"/api/queues/%2F/{fresh('perm')}"
        status, body, _ = api(broker, "PUT", path, {}, auth=(user, PASSWORD))
        assert (status, body["reason"]) == (401, "User not authorised to access virtual host"), body
        ctl("set-permissions", user, "^$", ".*", ".*")
        status, body, _ = api(broker, "PUT", path, {}, auth=(user, PASSWORD))
        assert (status, body) == (401, {"error": "not_authorised", "reason": "Access refused."})
        ctl("set-permissions", user, ".*", ".*", ".*")
        assert api(broker, "PUT", path, {}, auth=(user, PASSWORD))[0] == 201
        assert api(broker, "DELETE", path, auth=(user, PASSWORD))[0] == 204
    finally:
        subprocess.run([MAXQCTL, "--node", node, "delete-user", user], capture_output=True, timeout=30)


def test_rabbitmqadmin_declares_purges_and_deletes_a_queue(broker):
    name = fresh("ra")

    def rabbitmqadmin(*args: str) -> subprocess.CompletedProcess:
        command = [*RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port), "-u", "guest", "-p", "guest"]
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)

    declared = rabbitmqadmin("declare", "queue", f"name={name}", "durable=false")
    assert declared.returncode == 0 and "queue declared" in declared.stdout, declared
    publish(broker, name, 2)
    assert api(broker, "GET", f"/api/queues/%2F/{name}")[1]["messages"] == 2
    purged = rabbitmqadmin("purge", "queue", f"name={name}")
    assert purged.returncode == 0 and "queue purged" in purged.stdout, purged
    assert api(broker, "GET", f"/api/queues/%2F/{name}")[1]["messages"] == 0
    deleted = rabbitmqadmin("delete", "queue", f"name={name}")
    assert deleted.returncode == 0 and "queue deleted" in deleted.stdout, deleted
    assert api(broker, "GET", f"/api/queues/%2F/{name}")[0] == 404
    missing = rabbitmqadmin("delete", "queue", f"name={name}")
    assert missing.returncode != 0 and "Not found" in missing.stdout + missing.stderr, missing


def test_exchanges_and_bindings_answer_as_rabbitmq(broker):
    exchange, queue = fresh("mx"), fresh("mbq")
    path = f"/api/exchanges/%2F/{exchange}"
    assert api(broker, "PUT", path, {"type": "topic", "durable": True})[0] == 201
    assert api(broker, "PUT", path, {"type": "topic", "durable": True})[0] == 204
    status, body, _ = api(broker, "PUT", path, {"type": "direct"})
    assert status == 400 and body["error"] == "bad_request", body
    assert f"inequivalent arg 'type' for exchange '{exchange}' in vhost '/'" in body["reason"]
    status, body, _ = api(broker, "PUT", f"/api/exchanges/%2F/{fresh('bad')}", {"type": "nope"})
    assert (status, body) == (400, {"error": "bad_request", "reason": "unknown exchange type 'nope'"})
    status, body, _ = api(broker, "PUT", "/api/exchanges/%2F/amq.zz", {"type": "direct"})
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Access refused."})
    assert api(broker, "GET", path)[1]["type"] == "topic"
    assert api(broker, "GET", "/api/exchanges/%2F/amq.default")[1]["name"] == ""

    assert api(broker, "PUT", f"/api/queues/%2F/{queue}", {})[0] == 201
    between = f"/api/bindings/%2F/e/{exchange}/q/{queue}"
    assert api(broker, "POST", between, {"routing_key": "a/b", "arguments": {}})[0] == 201
    assert api(broker, "POST", between, {"routing_key": "a/b"})[0] == 201  # again: no change
    status, body, _ = api(broker, "POST", f"/api/bindings/%2F/e/{exchange}/q/nope", {"routing_key": "k"})
    assert (status, body) == (404, {"error": "not_found", "reason": "no queue 'nope' in vhost '/'"})
    listed = api(broker, "GET", between)[1]
    assert [(b["routing_key"], b["properties_key"]) for b in listed] == [("a/b", "a%2Fb")]
    assert api(broker, "GET", f"{between}/a%252Fb")[1]["routing_key"] == "a/b"
    assert [b["source"] for b in api(broker, "GET", f"/api/queues/%2F/{queue}/bindings")[1]] == ["", exchange]
    assert len(api(broker, "GET", f"{path}/bindings/source")[1]) == 1

    publish_to = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = publish_to.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, "a/b", b"routed")
    finally:
        publish_to.close()
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 1

    assert api(broker, "DELETE", f"{between}/a%252Fb")[0] == 204
    assert api(broker, "DELETE", f"{between}/a%252Fb")[0] == 404
    assert api(broker, "GET", between)[1] == []
    assert api(broker, "DELETE", path)[0] == 204
    assert api(broker, "DELETE", path)[1] == {"error": "Object Not Found", "reason": "Not Found"}
    assert api(broker, "DELETE", f"/api/queues/%2F/{queue}")[0] == 204


def test_rabbitmqadmin_declares_and_deletes_exchanges_and_bindings(broker):
    exchange, queue = fresh("rx"), fresh("rq")

    def rabbitmqadmin(*args: str) -> subprocess.CompletedProcess:
        command = [*RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port), "-u", "guest", "-p", "guest"]
        result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result
        return result

    rabbitmqadmin("declare", "exchange", f"name={exchange}", "type=fanout", "durable=false")
    rabbitmqadmin("declare", "queue", f"name={queue}")
    rabbitmqadmin("declare", "binding", f"source={exchange}", f"destination={queue}", "routing_key=")
    listed = rabbitmqadmin("list", "bindings", "source", "destination", "properties_key")
    assert exchange in listed.stdout and queue in listed.stdout, listed.stdout
    rabbitmqadmin(
        "delete", "binding", f"source={exchange}", f"destination={queue}", "destination_type=queue", "properties_key=~"
    )
    assert api(broker, "GET", f"/api/bindings/%2F/e/{exchange}/q/{queue}")[1] == []
    rabbitmqadmin("delete", "exchange", f"name={exchange}")
    rabbitmqadmin("delete", "queue", f"name={queue}")
    assert api(broker, "GET", f"/api/exchanges/%2F/{exchange}")[0] == 404


def test_a_connection_is_shown_and_closed_with_the_reason_given(broker):
    client = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, client_properties={"product": "close-me"})
    )
    try:
        name = next(c["name"] for c in api(broker, "GET", "/api/connections")[1] if c["client"] == "close-me")
        path = "/api/connections/" + quote(name, safe="")
        status, shown, _ = api(broker, "GET", path)
        assert status == 200 and shown["name"] == name and shown["client_properties"]["product"] == "close-me"
        status, _, _ = api(broker, "DELETE", path, headers={"X-Reason": "maintenance now"})
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(50):  # bounded: the close arrives within a few event rounds
                client.process_data_events(time_limit=0.1)
        assert (closed.value.reply_code, closed.value.reply_text) == (320, "CONNECTION_FORCED - maintenance now")
        assert api(broker, "GET", path)[0] == 404
        assert api(broker, "DELETE", path)[0] == 404
    finally:
        if client.is_open:
            client.close()


def test_a_restarted_node_names_its_connections_anew(start_broker):
    """A connection's name is its session id, which its channels' and consumers' ids start
    with: a restarted node must not give its first connection the name its earlier process gave
    its own (a late delivery to that process's consumer would reach a new one with the same id)."""

    def first_connection_name(server) -> str:
        client = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", server.amqp_port))
        try:
            names = [c["name"] for c in api(server, "GET", "/api/connections")[1]]
            assert len(names) == 1, names
            return names[0]
        finally:
            client.close()

    server = start_broker()
    before = first_connection_name(server)
    server.stop()
    server = start_broker(data_dir=server.data_dir)
    after = first_connection_name(server)
    assert before != after
    # "node@process.n": the same node, each process's first connection, two processes' tokens
    (node_before, process_before, n_before), (node_after, process_after, n_after) = (
        (name.partition("@")[0], *name.partition("@")[2].split(".")) for name in (before, after)
    )
    assert node_before == node_after and n_before == n_after == "1"
    assert process_before != process_after


def test_rabbitmqadmin_closes_a_connection(broker):
    client = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, client_properties={"product": "ra-close"})
    )
    try:
        name = next(c["name"] for c in api(broker, "GET", "/api/connections")[1] if c["client"] == "ra-close")
        command = [*RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port), "-u", "guest", "-p", "guest"]
        closed_by = subprocess.run([*command, "close", "connection", f"name={name}"], capture_output=True, text=True)
        assert closed_by.returncode == 0 and "connection closed" in closed_by.stdout, closed_by
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(50):
                client.process_data_events(time_limit=0.1)
        assert closed.value.reply_text == "CONNECTION_FORCED - Closed via management plugin"
    finally:
        if client.is_open:
            client.close()


def test_publish_and_get_answer_as_rabbitmq(broker):
    queue = fresh("pg")
    assert api(broker, "PUT", f"/api/queues/%2F/{queue}", {})[0] == 201
    publish_path = "/api/exchanges/%2F/amq.default/publish"
    sent = {
        "properties": {"delivery_mode": 2, "headers": {"h": 1}},
        "routing_key": queue,
        "payload": "hello",
        "payload_encoding": "string",
    }
    assert api(broker, "POST", publish_path, sent) == (200, {"routed": True}, None)
    binary = {"properties": {}, "routing_key": queue, "payload": "AAEC/w==", "payload_encoding": "base64"}
    assert api(broker, "POST", publish_path, binary)[1] == {"routed": True}
    nowhere = {**sent, "routing_key": fresh("nowhere")}
    assert api(broker, "POST", publish_path, nowhere)[1] == {"routed": False}
    status, body, _ = api(broker, "POST", publish_path, {**sent, "payload_encoding": "nope"})
    assert (status, body) == (400, {"error": "bad_request", "reason": ["unsupported_encoding", "nope"]})
    status, body, _ = api(broker, "POST", "/api/exchanges/%2F/nope/publish", sent)
    assert status == 400 and body["reason"] == "404 NOT_FOUND - no exchange 'nope' in vhost '/'"
    status, body, _ = api(broker, "POST", publish_path, {"routing_key": queue})
    assert status == 400 and "missing" in body["reason"], body

    get_path = f"/api/queues/%2F/{queue}/get"
    status, got, _ = api(broker, "POST", get_path, {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto"})
    assert status == 200 and len(got) == 2
    first, second = got
    assert (first["payload"], first["payload_encoding"], first["redelivered"]) == ("hello", "string", False)
    assert first["properties"] == {"delivery_mode": 2, "headers": {"h": 1}} and first["message_count"] == 1
    assert (second["payload"], second["payload_encoding"], second["payload_bytes"]) == ("AAEC/w==", "base64", 4)
    # ack_requeue_true gave them back, redelivered
    again = api(broker, "POST", get_path, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"})[1]
    assert (again[0]["payload"], again[0]["redelivered"]) == ("aGVsbG8=", True)
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 1  # one acked, gone
    status, body, _ = api(broker, "POST", get_path, {"count": 1, "ackmode": "nope", "encoding": "auto"})
    assert status == 400 and "ackmode" in body["reason"]
    assert api(broker, "POST", get_path, {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"})[0] == 200
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 0
    assert api(broker, "POST", get_path, {"count": 3, "ackmode": "ack_requeue_false", "encoding": "auto"})[1] == []
    assert api(broker, "DELETE", f"/api/queues/%2F/{queue}")[0] == 204


def test_http_publishes_and_gets_count_in_the_overview(broker):
    """RabbitMQ's management publish and get go through a channel of their own, so its overview
    counts them: publish, get (with an ack to wait for), ack, get_empty."""
    queue = fresh("counted")
    assert api(broker, "PUT", f"/api/queues/%2F/{queue}", {})[0] == 201
    names = ("publish", "get", "ack", "get_empty")

    def counts() -> dict:
        stats = api(broker, "GET", "/api/overview")[1]["message_stats"]
        return {name: stats[name] for name in names}

    before = counts()
    sent = {"properties": {}, "routing_key": queue, "payload": "x", "payload_encoding": "string"}
    assert api(broker, "POST", "/api/exchanges/%2F/amq.default/publish", sent)[1] == {"routed": True}
    get_path = f"/api/queues/%2F/{queue}/get"
    assert len(api(broker, "POST", get_path, {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"})[1]) == 1
    assert api(broker, "POST", get_path, {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})[1] == []
    after = counts()
    assert {name: after[name] - before[name] for name in names} == {"publish": 1, "get": 1, "ack": 1, "get_empty": 1}
    assert api(broker, "DELETE", f"/api/queues/%2F/{queue}")[0] == 204


def test_rabbitmqadmin_publishes_and_gets(broker):
    queue = fresh("rpg")
    command = [*RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port), "-u", "guest", "-p", "guest"]

    def rabbitmqadmin(*args: str) -> str:
        result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result
        return result.stdout

    rabbitmqadmin("declare", "queue", f"name={queue}")
    assert "Message published" in rabbitmqadmin("publish", "routing_key=" + queue, "payload=from rabbitmqadmin")
    table = rabbitmqadmin("get", f"queue={queue}", "ackmode=ack_requeue_false")
    assert "from rabbitmqadmin" in table, table
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 0
    rabbitmqadmin("delete", "queue", f"name={queue}")


def test_a_queue_shows_its_message_stats_as_rabbitmq(broker):
    """A queue's message_stats: publish, deliver, get, deliver_get, redeliver and ack, each with
    its rate, counted by the queue as pika publishes, consumes, gets, rejects and acks."""
    queue = fresh("stats")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        channel.queue_declare(queue)
        channel.confirm_delivery()
        for i in range(5):
            channel.basic_publish("", queue, b"%d" % i)
        method, _props, _body = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=True)  # back, to be redelivered
        got = []
        for method, _props, _body in channel.consume(queue, inactivity_timeout=5):
            if method is None:
                break
            got.append(method.delivery_tag)
            channel.basic_ack(method.delivery_tag)
            if len(got) == 5:
                break
        channel.cancel()
        assert len(got) == 5
        stats = api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["message_stats"]
        counts = {name: stats[name] for name in ("publish", "deliver", "get", "deliver_get", "redeliver", "ack")}
        assert counts == {"publish": 5, "deliver": 5, "get": 1, "deliver_get": 6, "redeliver": 1, "ack": 5}
        assert all(stats[name + "_details"]["rate"] >= 0 for name in counts)
        listed = [q for q in api(broker, "GET", "/api/queues/%2F")[1] if q["name"] == queue]
        assert listed[0]["message_stats"]["ack"] == 5
    finally:
        connection.close()
    assert api(broker, "DELETE", f"/api/queues/%2F/{queue}")[0] == 204


def test_exchanges_and_connections_show_their_rates_as_rabbitmq(broker):
    """An exchange's message_stats: publish_in (published to it) and publish_out (of those,
    routed to a queue), from open and closed connections and HTTP publishes alike; none for an
    exchange nothing was published to. A connection's recv_oct and send_oct with their rates."""
    exchange, quiet, queue = fresh("x-stats"), fresh("x-quiet"), fresh("x-bound")
    first = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    channel = first.channel()
    channel.exchange_declare(exchange, "direct")
    channel.exchange_declare(quiet, "direct")
    channel.queue_declare(queue)
    channel.queue_bind(queue, exchange, "in")
    channel.confirm_delivery()
    for key in ("in", "in", "nowhere"):
        channel.basic_publish(exchange, key, b"m")
    first.close()  # its counts stay with the node
    second = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", broker.amqp_port, client_properties={"connection_name": "rates"})
    )
    try:
        channel = second.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, "in", b"m")
        sent = {"properties": {}, "routing_key": "nowhere", "payload": "x", "payload_encoding": "string"}
        assert api(broker, "POST", f"/api/exchanges/%2F/{exchange}/publish", sent)[1] == {"routed": False}
        stats = api(broker, "GET", f"/api/exchanges/%2F/{exchange}")[1]["message_stats"]
        assert (stats["publish_in"], stats["publish_out"]) == (5, 3)
        assert stats["publish_in_details"]["rate"] >= 0 and stats["publish_out_details"]["rate"] >= 0
        listed = {x["name"]: x for x in api(broker, "GET", "/api/exchanges/%2F")[1]}
        assert listed[exchange]["message_stats"]["publish_in"] == 5
        assert "message_stats" not in listed[quiet]
        mine = [
            c
            for c in api(broker, "GET", "/api/connections")[1]
            if c["client_properties"].get("connection_name") == "rates"
        ]
        assert len(mine) == 1
        shown = mine[0]
        assert shown["recv_oct"] > 0 and shown["send_oct"] > 0 and shown["recv_cnt"] > 0 and shown["send_cnt"] > 0
        assert shown["recv_oct_details"]["rate"] >= 0 and shown["send_oct_details"]["rate"] >= 0
    finally:
        second.close()
    assert api(broker, "DELETE", f"/api/queues/%2F/{queue}")[0] == 204
    for name in (exchange, quiet):
        assert api(broker, "DELETE", f"/api/exchanges/%2F/{name}")[0] == 204
