"""The real rabbitmqadmin (RabbitMQ 3.10.8's, as Debian's rabbitmq-server package ships it, kept
unmodified in tests/tools/ with its MPL 2.0 licence so the test runs everywhere) against a node:
every object kind it lists, and `show overview`. Nothing of RabbitMQ is started."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pika

from ..helpers import api

RABBITMQADMIN = Path(__file__).resolve().parents[1] / "tools" / "rabbitmqadmin"

KINDS = [
    "connections",
    "channels",
    "consumers",
    "exchanges",
    "queues",
    "bindings",
    "users",
    "vhosts",
    "permissions",
    "nodes",
    "parameters",
    "policies",
    "operator_policies",
    "vhost_limits",
]


def rabbitmqadmin(broker, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(RABBITMQADMIN),
            "-H",
            "127.0.0.1",
            "-P",
            str(broker.http_port),
            "-u",
            "guest",
            "-p",
            "guest",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def listed(broker, kind: str) -> list[dict]:
    result = rabbitmqadmin(broker, "-f", "raw_json", "list", kind)
    assert result.returncode == 0 and "Not found" not in result.stdout, (kind, result)
    return json.loads(result.stdout)


def test_every_kind_lists_and_shows_what_a_client_made(broker):
    queue = "rmqadmin-q"
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue)
        channel.basic_publish("", queue, b"one")
        channel.basic_publish("", queue, b"two")
        for kind in KINDS:
            listed(broker, kind)
        queues = {q["name"]: q for q in listed(broker, "queues")}
        assert queues[queue]["messages"] == 2 and queues[queue]["messages_ready"] == 2
        channels = listed(broker, "channels")
        assert any(c["user"] == "guest" and c["number"] == channel.channel_number for c in channels), channels
        connections = listed(broker, "connections")
        names = [c["name"] for c in connections]
        assert any(c["connection_details"]["name"] in names for c in channels)
        nodes = listed(broker, "nodes")
        assert nodes[0]["running"] is True and nodes[0]["mem_used"] > 0 and nodes[0]["type"] == "disc"
        table = rabbitmqadmin(broker, "list", "queues")
        assert table.returncode == 0 and queue in table.stdout, table
        overview = rabbitmqadmin(broker, "-f", "raw_json", "show", "overview")
        assert overview.returncode == 0, overview
        shown = json.loads(overview.stdout)[0]
        assert shown["object_totals"]["queues"] >= 1 and shown["queue_totals"]["messages"] >= 2
        assert shown["object_totals"]["connections"] >= 1 and shown["object_totals"]["channels"] >= 1
        assert shown["message_stats"]["publish"] >= 2 and "rate" in shown["message_stats"]["publish_details"]
    finally:
        connection.close()


def test_definitions_export_and_import_round_trip(broker, tmp_path):
    queue, exchange = "rmqadmin-defs-q", "rmqadmin-defs-x"
    exported = tmp_path / "defs.json"
    assert rabbitmqadmin(broker, "declare", "exchange", f"name={exchange}", "type=topic").returncode == 0
    assert rabbitmqadmin(broker, "declare", "queue", f"name={queue}", "durable=true").returncode == 0
    bound = rabbitmqadmin(broker, "declare", "binding", f"source={exchange}", f"destination={queue}", "routing_key=k.#")
    assert bound.returncode == 0, bound
    result = rabbitmqadmin(broker, "export", str(exported))
    assert result.returncode == 0 and "Exported definitions" in result.stdout, result
    document = json.loads(exported.read_text())
    assert {"name": queue, "vhost": "/"}.items() <= next(q for q in document["queues"] if q["name"] == queue).items()
    for kind, name in (("queue", queue), ("exchange", exchange)):
        assert rabbitmqadmin(broker, "delete", kind, f"name={name}").returncode == 0
    result = rabbitmqadmin(broker, "import", str(exported))
    assert result.returncode == 0 and "Uploaded definitions" in result.stdout, result
    bindings = listed(broker, "bindings")
    assert any(b["source"] == exchange and b["destination"] == queue and b["routing_key"] == "k.#" for b in bindings)
    for kind, name in (("queue", queue), ("exchange", exchange)):
        assert rabbitmqadmin(broker, "delete", kind, f"name={name}").returncode == 0


def test_sort_columns_and_pages_reach_the_node(broker):
    names = ["rmqadmin-sort-b", "rmqadmin-sort-a", "rmqadmin-sort-c"]
    for name in names:
        assert rabbitmqadmin(broker, "declare", "queue", f"name={name}").returncode == 0
    try:
        result = rabbitmqadmin(broker, "-f", "raw_json", "--sort", "name", "--sort-reverse", "list", "queues", "name")
        assert result.returncode == 0, result
        listed_names = [q["name"] for q in json.loads(result.stdout) if q["name"].startswith("rmqadmin-sort-")]
        assert listed_names == sorted(names, reverse=True)
        assert all(set(q) == {"name"} for q in json.loads(result.stdout))  # the columns asked for
        status, page, _ = api(broker, "GET", "/api/queues?page=1&page_size=2&name=rmqadmin-sort&sort=name")
        assert status == 200 and [q["name"] for q in page["items"]] == sorted(names)[:2]
        assert (page["filtered_count"], page["page_count"]) == (3, 2)
        status, one, _ = api(broker, "GET", f"/api/queues/%2F/{names[0]}?columns=name,messages,nope")
        assert status == 200 and one == {"name": names[0], "messages": 0}  # one object: columns too
    finally:
        for name in names:
            rabbitmqadmin(broker, "delete", "queue", f"name={name}")
