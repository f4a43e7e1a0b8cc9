"""`maxqctl` against a real node: status and the lists show what a pika client created, as tables
and as JSON; bad command lines and unreachable nodes fail with a clear message."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest

from ..conftest import free_port
from ..helpers import GUEST_AUTH

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


# These check the single node's answers; MAXQ_TEST_CLUSTER=1 runs the shared broker as a cluster member.
single_node_only = pytest.mark.skipif(
    bool(os.environ.get("MAXQ_TEST_CLUSTER")), reason="checks a single node's answers"
)


def maxqctl(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([MAXQCTL, *args], capture_output=True, text=True, timeout=30, env=env)


@pytest.fixture
def topology(broker):
    """A pika client's exchange, queue, binding, consumer and 3 ready messages."""
    suffix = uuid.uuid4().hex[:8]
    names = {
        "exchange": f"ctl-x-{suffix}",
        "queue": f"ctl-q-{suffix}",
        "idle": f"ctl-idle-{suffix}",
        "key": f"k.{suffix}",
        "tag": f"ctl-tag-{suffix}",
    }
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            port=broker.amqp_port, socket_timeout=5, client_properties={"product": "ctl-test-client"}
        )
    )
    channel = connection.channel()
    channel.exchange_declare(names["exchange"], "topic", durable=True)
    channel.queue_declare(names["queue"], durable=True)
    channel.queue_declare(names["idle"], auto_delete=False)
    channel.queue_bind(names["queue"], names["exchange"], names["key"])
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(names["queue"], lambda *a: None, consumer_tag=names["tag"])
    for _ in range(3):
        channel.basic_publish("", names["idle"], b"x")
    channel.queue_declare(names["idle"], passive=True)  # a round trip: the publishes are in
    try:
        yield names
    finally:
        channel.queue_delete(names["idle"])
        channel.queue_delete(names["queue"])
        channel.exchange_delete(names["exchange"])
        connection.close()


def node(broker) -> str:
    return f"127.0.0.1:{broker.http_port}"


def table_rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


@single_node_only
def test_status(broker):
    result = maxqctl("--node", node(broker), "status")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("node maxq1")
    assert ["maxq1", "up", "leader"] in table_rows(result.stdout)
    status = json.loads(maxqctl("--node", node(broker), "status", "--json").stdout)
    assert status["node"] == "maxq1" and status["members"] == [{"node": "maxq1", "state": "up", "role": "leader"}]
    assert all(g["leader"] == "maxq1" for g in status["groups"])


def test_lists_show_what_a_client_created(broker, topology):
    t = topology
    queues = maxqctl("--node", node(broker), "list", "queues")
    assert queues.returncode == 0, queues.stderr
    assert table_rows(queues.stdout)[0] == [
        "vhost",
        "name",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
        "durable",
    ]
    assert ["/", t["queue"], "0", "0", "1", "True"] in table_rows(queues.stdout)
    assert ["/", t["idle"], "3", "0", "0", "False"] in table_rows(queues.stdout)

    exchanges = maxqctl("--node", node(broker), "list", "exchanges").stdout
    assert ["/", t["exchange"], "topic", "True", "False", "False"] in table_rows(exchanges)
    assert ["/", "amq.topic", "topic", "True", "False", "False"] in table_rows(exchanges)

    bindings = maxqctl("--node", node(broker), "list", "bindings").stdout
    assert ["/", t["exchange"], "queue", t["queue"], t["key"]] in table_rows(bindings)

    connections = maxqctl("--node", node(broker), "list", "connections").stdout
    assert any(
        row[-1] == "ctl-test-client" and row[1:4] == ["127.0.0.1", "guest", "/"] for row in table_rows(connections)
    )

    consumers = maxqctl("--node", node(broker), "list", "consumers").stdout
    assert any(row[:3] == ["/", t["queue"], t["tag"]] and row[-1] == "True" for row in table_rows(consumers))

    channels = maxqctl("--node", node(broker), "list", "channels")
    assert channels.returncode == 0 and channels.stdout.split()[:3] == ["name", "user", "vhost"], channels
    as_json = json.loads(maxqctl("--node", node(broker), "--json", "list", "channels").stdout)
    assert any(c["user"] == "guest" and c["consumer_count"] == 1 and c["prefetch_count"] == 1 for c in as_json)

    nodes = table_rows(maxqctl("--node", node(broker), "list", "nodes").stdout)
    assert nodes[0] == ["name", "running", "mem_used", "disk_free", "fd_used", "uptime"]
    # every member (one on a single node) with its own figures, as each gives them of itself
    assert nodes[1:] and all(len(row) == 6 and row[1] == "True" and int(row[2]) > 0 for row in nodes[1:]), nodes


@pytest.mark.parametrize("position", ["before", "after"])
def test_lists_as_json(broker, topology, position):
    t = topology

    def listing(what: str) -> list:
        args = ["--json", "list", what] if position == "before" else ["list", what, "--json"]
        result = maxqctl("--node", node(broker), *args)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    [queue] = [q for q in listing("queues") if q["name"] == t["queue"]]
    assert queue["durable"] is True and queue["consumers"] == 1 and queue["vhost"] == "/"
    [idle] = [q for q in listing("queues") if q["name"] == t["idle"]]
    assert idle["messages_ready"] == 3
    assert {"vhost": "/", "name": t["exchange"], "type": "topic"}.items() <= [
        e for e in listing("exchanges") if e["name"] == t["exchange"]
    ][0].items()
    assert any(
        b["source"] == t["exchange"] and b["destination"] == t["queue"] and b["routing_key"] == t["key"]
        for b in listing("bindings")
    )
    assert any(c["client"] == "ctl-test-client" and c["channels"] == 1 for c in listing("connections"))
    [consumer] = [c for c in listing("consumers") if c["consumer_tag"] == t["tag"]]
    assert consumer["queue"] == {"name": t["queue"], "vhost": "/"} and consumer["ack_required"] is True
    assert consumer["channel_details"]["number"] == 1 and consumer["exclusive"] is False


def test_a_proxy_in_the_environment_is_not_used(broker):
    env = dict(os.environ, http_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", no_proxy="", NO_PROXY="")
    result = maxqctl("--node", node(broker), "list", "exchanges", env=env)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["frob"], 2, "invalid choice: 'frob'"),
        (["list", "widgets"], 2, "invalid choice: 'widgets'"),
        ([], 2, "the following arguments are required: COMMAND"),
        (["--node", "nope", "status"], 2, "--node must be HOST:PORT with a port 1-65535, got 'nope'"),
        (
            ["--node", "127.0.0.1:99999", "status"],
            2,
            "--node must be HOST:PORT with a port 1-65535, got '127.0.0.1:99999'",
        ),
        (["--node", "127.0.0.1:", "status"], 2, "--node must be HOST:PORT"),
        (["--timeout", "0", "status"], 2, "--timeout must be a positive number"),
    ],
)
def test_bad_command_lines(args, code, message):
    result = maxqctl(*args)
    assert result.returncode == code, result
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_node():
    port = free_port()
    result = maxqctl("--node", f"127.0.0.1:{port}", "--timeout", "2", "list", "queues")
    assert result.returncode == 3, result
    assert f"maxqctl: cannot reach node 127.0.0.1:{port}:" in result.stderr and "refused" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_node_that_is_not_the_admin_api(broker):
    # The AMQP port answers a GET with the AMQP protocol header: not HTTP at all.
    result = maxqctl("--node", f"127.0.0.1:{broker.amqp_port}", "status")
    assert result.returncode == 3, result
    assert "did not answer as a MaxQ-Raft admin API" in result.stderr
    assert "Traceback" not in result.stderr


def http_request(broker, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=10)
    if headers is None:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        headers.update(GUEST_AUTH)
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@single_node_only
def test_the_admin_api_takes_bounded_json_bodies(broker):
    # Bodies are read and checked before anything else: a malformed one is 400 on any node.
    status, answer = http_request(broker, "POST", "/api/cluster/members", b"{not json")
    assert status == 400 and answer["error"].startswith("malformed JSON body"), answer
    status, answer = http_request(broker, "POST", "/api/cluster/members", b"[1, 2]")
    assert status == 400 and answer["error"] == "the JSON body must be an object"
    status, answer = http_request(
        broker, "POST", "/api/cluster/members", json.dumps({"node": "n2", "raft_addr": "x"}).encode()
    )
    assert status == 400 and "raft_addr must be HOST:PORT" in answer["error"]
    status, answer = http_request(
        broker, "POST", "/api/cluster/members", json.dumps({"node": "n 2", "raft_addr": "h:1"}).encode()
    )
    assert status == 400 and "node must be 1-64 of letters" in answer["error"]
    status, answer = http_request(broker, "POST", "/api/cluster/members", b"x" * 20000)
    assert status == 413 and "16384" in answer["error"]
    # Found by scripts/fuzz: nesting deeper than json.loads recurses was a RecursionError, a 500.
    for deep in (b"[" * 5000 + b"]" * 5000, b'{"a":' * 2000 + b"1" + b"}" * 2000):
        status, answer = http_request(broker, "PUT", "/api/policies/%2F/deep", deep)
        assert status == 400 and answer["error"] == "malformed JSON body: nested too deeply", answer
    # A host that does not resolve: 400 at once, rather than "unreachable" once the handshake
    # gave up (found by scripts/fuzz on a cluster member).
    status, answer = http_request(
        broker,
        "POST",
        "/api/cluster/members",
        json.dumps({"node": "n2", "raft_addr": "no-such-host.invalid:1"}).encode(),
    )
    assert status == 400 and answer["error"].startswith("raft_addr host 'no-such-host.invalid' does not resolve here")
    # A well-formed change on a single node: not a cluster member.
    status, answer = http_request(
        broker, "POST", "/api/cluster/members", json.dumps({"node": "n2", "raft_addr": "127.0.0.1:1"}).encode()
    )
    assert status == 409 and answer["error"] == "this node is not a cluster member (started without --raft-addr/--peer)"
    status, answer = http_request(broker, "DELETE", "/api/cluster/members/n2?force=1")
    assert status == 409 and answer["reason"] == "not clustered"


@single_node_only
def test_the_admin_api_answers_404_and_405(broker):
    status, answer = http_request(broker, "GET", "/api/nothing")
    assert status == 404 and "POST /api/cluster/members" in answer["endpoints"]
    status, answer = http_request(broker, "DELETE", "/api/queues")
    assert status == 405 and answer["allowed"] == ["GET"]
    status, answer = http_request(broker, "GET", "/api/cluster/members")
    assert status == 405 and answer["allowed"] == ["POST"]
    status, answer = http_request(broker, "PUT", "/api/queues", b"{}")
    assert status == 405
    status, answer = http_request(broker, "GET", "/api/cluster/status")
    assert status == 200 and answer["clustered"] is False


def test_the_admin_api_answers_only_under_this_nodes_names(broker):
    # DNS rebinding: a page under a name of its own that resolves to 127.0.0.1 sends that name.
    for host in ("evil.example", "evil.example:15672", "127.0.0.1.evil.example"):
        status, answer = http_request(broker, "GET", "/api/overview", headers={"Host": host})
        assert status == 403 and "is not this node's" in answer["error"], (host, status, answer)
    for host in (f"127.0.0.1:{broker.http_port}", "localhost", f"LOCALHOST:{broker.http_port}", "[::1]:15672"):
        status, _ = http_request(broker, "GET", "/api/overview", headers={"Host": host, **GUEST_AUTH})
        assert status == 200, host
    with socket.create_connection(("127.0.0.1", broker.http_port), timeout=5) as sock:
        sock.sendall(b"GET /api/overview HTTP/1.1\r\n\r\n")  # no Host at all
        assert sock.recv(65536).startswith(b"HTTP/1.1 400 ")  # (h11 sends no reason phrase)


def test_a_body_that_is_not_declared_json_is_refused_and_changes_nothing(broker):
    # A page's form post (text/plain or form-urlencoded) reaches the API without a preflight.
    body = json.dumps({"pattern": ".*", "definition": {"max-length": 0}}).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": content_type} if content_type else {"Content-Length": str(len(body))}
        status, answer = http_request(broker, "PUT", "/api/policies/%2F/from-a-page", body, headers=headers)
        assert status == 415 and "application/json" in answer["error"], (content_type, status, answer)
    status, policies = http_request(broker, "GET", "/api/policies")
    assert status == 200 and "from-a-page" not in [p["name"] for p in policies]


def test_await_startup_returns_once_the_node_serves(broker):
    result = maxqctl("--node", node(broker), "await-startup")
    assert result.returncode == 0, result
    assert result.stdout.strip() == f"node {node(broker)} is up"


def test_await_startup_waits_for_a_node_that_starts_later(start_broker, tmp_path):
    port = free_port()
    waiting = subprocess.Popen(
        [MAXQCTL, "--node", f"127.0.0.1:{port}", "--timeout", "30", "await-startup"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        assert waiting.poll() is None, waiting.communicate()  # nothing listens yet: still waiting
        start_broker(["--http-port", str(port)])
        out, err = waiting.communicate(timeout=30)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert waiting.returncode == 0, (out, err)
    assert out.strip() == f"node 127.0.0.1:{port} is up"


def test_await_startup_gives_up_after_its_timeout_and_on_refusal(broker):
    port = free_port()
    started = time.monotonic()
    result = maxqctl("--node", f"127.0.0.1:{port}", "--timeout", "1.5", "await-startup")
    assert result.returncode == 3, result
    assert f"node 127.0.0.1:{port} did not start within 1.5 s" in result.stderr
    assert 1.0 <= time.monotonic() - started < 10
    refused = maxqctl("--node", node(broker), "--user", "guest", "--password", "wrong", "await-startup")
    assert refused.returncode == 4 and "answered 401" in refused.stderr, refused


def test_object_verbs_declare_bind_purge_close_and_delete(broker):
    suffix = uuid.uuid4().hex[:8]
    queue, exchange = f"ctl-oq-{suffix}", f"ctl-ox-{suffix}"
    at = ("--node", node(broker))

    def ok(*args: str) -> str:
        result = maxqctl(*at, *args)
        assert result.returncode == 0, result
        return result.stdout.strip()

    assert ok("declare-queue", queue, "--arguments", '{"x-max-length": 10}') == f"queue '{queue}' declared in vhost '/'"
    assert ok("declare-exchange", exchange, "topic") == f"exchange '{exchange}' (topic) declared in vhost '/'"
    ok("bind", exchange, queue, "--routing-key", "a.#")
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(port=broker.amqp_port, client_properties={"product": f"ctl-close-{suffix}"})
    )
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish(exchange, "a.b", b"x")
    assert channel.queue_declare(queue, passive=True).method.message_count == 3
    assert ok("purge-queue", queue) == f"queue '{queue}' purged"
    assert channel.queue_declare(queue, passive=True).method.message_count == 0

    refused = maxqctl(*at, "unbind", exchange, queue, "--routing-key", "nope")
    assert refused.returncode == 4 and "no binding of" in refused.stderr, refused
    ok("unbind", exchange, queue, "--routing-key", "a.#")
    channel.basic_publish(exchange, "a.b", b"x")
    assert channel.queue_declare(queue, passive=True).method.message_count == 0  # unbound: not routed

    name = next(
        c["name"] for c in json.loads(ok("--json", "list", "connections")) if c["client"].startswith("ctl-close")
    )
    assert ok("close-connection", name, "--reason", "bye now") == f"connection '{name}' closed"
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        for _ in range(50):
            connection.process_data_events(time_limit=0.1)
    assert closed.value.reply_text == "CONNECTION_FORCED - bye now"

    ok("delete-exchange", exchange)
    ok("delete-queue", queue, "--if-empty")
    missing = maxqctl(*at, "delete-queue", queue)
    assert missing.returncode == 4 and "404" in missing.stderr, missing
    bad = maxqctl(*at, "declare-queue", "q", "--arguments", "[1]")
    assert bad.returncode == 2 and "expected a JSON object" in bad.stderr, bad
