"""Definitions against real nodes: a topology declared with pika on one node, exported with
`maxqctl export-definitions` and imported with `maxqctl import-definitions` into a fresh node,
works there (users log in, messages route through e2e bindings, queues keep their arguments); a
bad document is refused with nothing applied; the import alone may send a large body."""

from __future__ import annotations

import http.client
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pika
import pytest

from ..helpers import GUEST_AUTH

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def maxqctl(node, *args: str, home: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAXQCTL_")}
    env["HOME"] = str(home)  # no ~/.maxqctl.toml of the machine's user: guest/guest from loopback
    return subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{node.http_port}", *args], capture_output=True, text=True, timeout=60, env=env
    )


def api(node, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=30)
    try:
        headers = {**GUEST_AUTH, "Content-Type": "application/json"}
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def declare_topology(node, home: Path) -> None:
    for args in (
        ("add-vhost", "shop"),
        ("add-user", "app", "app-pass", "--tags", "management"),
        ("set-permissions", "--vhost", "shop", "app", ".*", ".*", ".*"),
        ("set-vhost-limits", "--vhost", "shop", '{"max-queues": 50}'),
        ("set-policy", "--vhost", "shop", "--apply-to", "queues", "bounded", "^orders", '{"max-length": 1000}'),
    ):
        result = maxqctl(node, *args, home=home)
        assert result.returncode == 0, result.stderr
    credentials = pika.PlainCredentials("app", "app-pass")
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", node.amqp_port, "shop", credentials, socket_timeout=5)
    )
    try:
        channel = connection.channel()
        channel.exchange_declare("orders", "topic", durable=True)
        channel.exchange_declare("audit", "fanout", durable=True, internal=True)
        channel.queue_declare("orders.new", durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_declare("audit.all", durable=True, arguments={"x-max-length": 10, "x-message-ttl": 600000})
        channel.queue_bind("orders.new", "orders", "order.new")
        channel.exchange_bind("audit", "orders", "order.#")  # exchange to exchange
        channel.queue_bind("audit.all", "audit", "")
        channel.queue_declare("mine-only", exclusive=True)  # not exported
        channel.queue_bind("mine-only", "orders", "#")
    finally:
        connection.close()


def test_a_topology_exported_with_maxqctl_imports_into_a_fresh_node(start_broker, tmp_path) -> None:
    source, target = start_broker(), start_broker()
    declare_topology(source, tmp_path)
    path = tmp_path / "defs.json"

    exported = maxqctl(source, "export-definitions", str(path), home=tmp_path)
    assert exported.returncode == 0, exported.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # password hashes inside
    document = json.loads(path.read_text())
    assert {q["name"] for q in document["queues"]} == {"orders.new", "audit.all"}
    assert {"vhost": "shop", "component": "vhost-limits", "name": "limits", "value": {"max-queues": 50}} in document[
        "parameters"
    ]
    # The per-vhost form, as RabbitMQ shapes it
    status, body = api(source, "GET", "/api/definitions/shop")
    assert status == 200 and {x["name"] for x in json.loads(body)["exchanges"]} == {"orders", "audit"}
    assert api(source, "GET", "/api/definitions/nope")[0] == 400

    imported = maxqctl(target, "import-definitions", str(path), home=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert "definitions imported" in imported.stdout
    # Again: everything is already there as it is, so nothing changes and nothing fails.
    assert maxqctl(target, "import-definitions", str(path), home=tmp_path).returncode == 0

    credentials = pika.PlainCredentials("app", "app-pass")  # the user came with its hash
    connection = pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", target.amqp_port, "shop", credentials, socket_timeout=5)
    )
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        # the same arguments redeclare (406 otherwise): the queues came with theirs
        channel.queue_declare("orders.new", durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_declare("audit.all", durable=True, arguments={"x-max-length": 10, "x-message-ttl": 600000})
        channel.basic_publish("orders", "order.new", b"first")
        channel.basic_publish("orders", "order.paid", b"second")
        assert channel.basic_get("orders.new", auto_ack=True)[2] == b"first"
        assert channel.basic_get("orders.new", auto_ack=True)[0] is None
        assert [channel.basic_get("audit.all", auto_ack=True)[2] for _ in range(2)] == [b"first", b"second"]
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            channel.queue_declare("mine-only", passive=True)
        assert missing.value.reply_code == 404
    finally:
        if connection.is_open:
            connection.close()
    status, body = api(target, "GET", "/api/policies")
    assert [(p["vhost"], p["name"], p["definition"]) for p in json.loads(body)] == [
        ("shop", "bounded", {"max-length": 1000})
    ]


def test_a_bad_document_changes_nothing_and_only_an_import_may_be_large(start_broker, tmp_path) -> None:
    node = start_broker()
    before = {path: api(node, "GET", path)[1] for path in ("/api/vhosts", "/api/users", "/api/queues")}
    bad = {
        "users": [{"name": "eve", "password": "pw", "tags": []}],
        "vhosts": [{"name": "fresh"}],
        "queues": [
            {"name": "fine", "vhost": "fresh", "durable": True, "auto_delete": False, "arguments": {}},
            {
                "name": "broken",
                "vhost": "fresh",
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-max-length": -1},
            },
        ],
    }
    status, body = api(node, "POST", "/api/definitions", json.dumps(bad).encode())
    assert status == 400
    assert "queues[1] (queue 'broken' in vhost 'fresh'): invalid arg 'x-max-length'" in json.loads(body)["error"]
    assert {path: api(node, "GET", path)[1] for path in before} == before  # nothing applied

    bad_file = tmp_path / "bad.json"
    bad_file.write_text(json.dumps(bad))
    refused = maxqctl(node, "import-definitions", str(bad_file), home=tmp_path)
    assert refused.returncode == 4 and "queues[1]" in refused.stderr
    bad_file.write_text("{not json")
    assert maxqctl(node, "import-definitions", str(bad_file), home=tmp_path).returncode == 2

    # A document well over the 16 KiB other requests may carry: 400 queues (~40 KB).
    queues = [
        {"name": f"bulk-{i:04d}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {"x-max-length": i}}
        for i in range(400)
    ]
    large = json.dumps({"queues": queues}).encode()
    assert len(large) > 32 * 1024
    status, body = api(node, "POST", "/api/definitions", large)
    assert status == 204, body
    names = {q["name"] for q in json.loads(api(node, "GET", "/api/queues")[1])}
    assert {q["name"] for q in queues} <= names
    # ... while every other route keeps its limit
    status, _ = api(node, "PUT", "/api/users/big", json.dumps({"password": "x" * 40000, "tags": ""}).encode())
    assert status == 413
