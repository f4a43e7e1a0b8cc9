"""Connections, channels and consumers of the whole cluster through any member's management API
(http/cluster_lists.py), as RabbitMQ lists them from any node: real members, pika clients on
each, the real rabbitmqadmin. Before, each member listed only its own clients, and a connection
of another member was 404 there."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from maxq_raft.machines.features import CLUSTER_LISTS

from ..helpers import api, wait_for
from ..integration.test_rabbitmqadmin import listed, rabbitmqadmin
from .conftest import Cluster
from .test_partitioned_cluster import flag_enabled

PASSWORD = "pw-lists-1"


def connect_as(member, user: str, product: str) -> pika.BlockingConnection:
    credentials = pika.PlainCredentials(user, PASSWORD) if user != "guest" else pika.PlainCredentials("guest", "guest")
    return member.connect(heartbeat=0, credentials=credentials, client_properties={"product": product})


def test_every_members_clients_are_listed_looked_at_and_closed_through_any_member(cluster: Cluster) -> None:
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    wait_for(lambda: flag_enabled(n1, CLUSTER_LISTS), 60, "the cluster_lists flag")
    for user, tags in (("ann", "management"), ("mon", "monitoring")):
        assert api(n1, "PUT", f"/api/users/{user}", {"password": PASSWORD, "tags": tags})[0] in (201, 204)
        assert api(n1, "PUT", f"/api/permissions/%2F/{user}", {"configure": ".*", "write": ".*", "read": ".*"})[0] in (
            201,
            204,
        )
    clients = {}
    for member, user in ((n1, "guest"), (n2, "guest"), (n3, "ann")):
        conn = connect_as(member, user, f"lists-{member.name}")
        channel = conn.channel()
        channel.queue_declare(f"lists-{member.name}")
        channel.basic_consume(f"lists-{member.name}", lambda *_a: None, consumer_tag=f"tag-{member.name}")
        clients[member.name] = conn
    try:
        status, connections, _ = api(n1, "GET", "/api/connections")
        assert status == 200
        ours = {c["client"]: c for c in connections if c["client"].startswith("lists-")}
        assert {name: c["node"] for name, c in ours.items()} == {f"lists-{m}": m for m in ("n1", "n2", "n3")}
        assert all(c["name"].startswith(c["node"] + "@") for c in ours.values())
        assert ours["lists-n3"]["user"] == "ann" and ours["lists-n3"]["channels"] == 1
        channels = api(n2, "GET", "/api/channels")[1]
        assert {
            c["node"] for c in channels if c["connection_details"]["name"] in {c["name"] for c in ours.values()}
        } == {
            "n1",
            "n2",
            "n3",
        }
        consumers = {c["consumer_tag"]: c for c in api(n3, "GET", "/api/consumers")[1]}
        assert {t: consumers[t]["node"] for t in ("tag-n1", "tag-n2", "tag-n3")} == {
            "tag-n1": "n1",
            "tag-n2": "n2",
            "tag-n3": "n3",
        }
        assert consumers["tag-n2"]["channel_details"]["connection_name"] == ours["lists-n2"]["name"]
        assert consumers["tag-n3"]["queue"] == {"name": "lists-n3", "vhost": "/"}
        assert consumers["tag-n3"]["channel_details"]["user"] == "ann"
        totals = api(n2, "GET", "/api/overview")[1]["object_totals"]
        assert (totals["connections"], totals["channels"], totals["consumers"]) == (
            len(connections),
            len(channels),
            len(consumers),
        ) and len(connections) >= 3
        # The real rabbitmqadmin, through one member, lists the cluster's connections, and a
        # vhost's consumers (GET /api/consumers/{vhost}).
        assert {c["name"] for c in ours.values()} <= {c["name"] for c in listed(n2, "connections")}
        in_vhost = rabbitmqadmin(n2, "-V", "/", "-f", "raw_json", "list", "consumers")
        assert in_vhost.returncode == 0 and "Not found" not in in_vhost.stdout, in_vhost
        assert {"tag-n1", "tag-n2", "tag-n3"} <= {c["consumer_tag"] for c in json.loads(in_vhost.stdout)}
        assert api(n1, "GET", "/api/consumers/no-such-vhost")[0] == 404
        # The vhost's connections and channels, a connection's channels, one channel: any member's.
        assert {c["node"] for c in api(n1, "GET", "/api/vhosts/%2F/connections")[1]} >= {"n1", "n2", "n3"}
        assert {c["node"] for c in api(n1, "GET", "/api/vhosts/%2F/channels")[1]} >= {"n1", "n2", "n3"}
        [of_n2] = api(n1, "GET", "/api/connections/" + quote(ours["lists-n2"]["name"], safe="") + "/channels")[1]
        assert of_n2["node"] == "n2" and of_n2["consumer_count"] == 1
        status, one, _ = api(n1, "GET", "/api/channels/" + quote(ours["lists-n3"]["name"] + " (1)", safe=""))
        assert status == 200 and one["node"] == "n3" and one["user"] == "ann"
        assert api(n1, "GET", "/api/channels/" + quote(ours["lists-n3"]["name"] + " (9)", safe=""))[0] == 404

        # A management user sees its own connections only, wherever they are.
        status, seen, _ = api(n1, "GET", "/api/connections", auth=("ann", PASSWORD))
        assert status == 200 and [c["client"] for c in seen if c["client"].startswith("lists-")] == ["lists-n3"]
        on_n2 = quote(ours["lists-n2"]["name"], safe="")
        on_n3 = quote(ours["lists-n3"]["name"], safe="")
        assert api(n1, "GET", f"/api/connections/{on_n2}", auth=("ann", PASSWORD))[0] == 404
        assert api(n1, "GET", f"/api/connections/{on_n3}", auth=("ann", PASSWORD))[1]["node"] == "n3"
        # Closing another user's: 404 for a management user (it cannot see it), 401 for
        # monitoring (it sees it, may not close it: RabbitMQ's answer); nothing is closed.
        assert api(n1, "DELETE", f"/api/connections/{on_n2}", auth=("ann", PASSWORD))[0] == 404
        assert api(n1, "DELETE", f"/api/connections/{on_n2}", auth=("mon", PASSWORD))[0] == 401
        clients["n2"].process_data_events(0.2)
        assert clients["n2"].is_open
        assert api(n1, "GET", "/api/connections/n2%40no-such.1")[0] == 404
        assert api(n1, "DELETE", "/api/connections/n9%40no-such.1")[0] == 404

        # An administrator closes n2's connection through n1, with RabbitMQ's reason header.
        status, _body, _ = api(n1, "DELETE", f"/api/connections/{on_n2}", headers={"X-Reason": "moved to n1"})
        assert status == 204
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            for _ in range(50):
                clients["n2"].process_data_events(0.1)
        assert closed.value.reply_code == 320 and "moved to n1" in closed.value.reply_text
        # Its owner closes its own through another member.
        assert api(n2, "DELETE", f"/api/connections/{on_n3}", auth=("ann", PASSWORD))[0] == 204
        wait_for(lambda: api(n1, "GET", f"/api/connections/{on_n3}")[0] == 404, 10, "ann's connection gone")

        # A member that is down is left out; the list still answers, with the others'.
        cluster["n3"].kill()
        started = time.monotonic()
        status, connections, _ = api(n2, "GET", "/api/connections")
        assert status == 200 and time.monotonic() - started < 8
        assert {c["client"] for c in connections if c["client"].startswith("lists-")} == {"lists-n1"}
    finally:
        for conn in clients.values():
            with contextlib.suppress(pika.exceptions.AMQPError):  # (closed by the broker above)
                conn.close()


def test_maxqctl_lists_every_members_connections_and_each_node_gives_its_own_figures(cluster: Cluster) -> None:
    """`maxqctl list connections` through one member prints every member's; GET /api/nodes
    there has each member's own figures (its process, memory, descriptors), not only its name."""
    n1 = cluster["n1"]
    wait_for(lambda: flag_enabled(n1, CLUSTER_LISTS), 60, "the cluster_lists flag")
    conns = [member.connect(client_properties={"product": f"ctl-{member.name}"}) for member in cluster.alive()]
    try:
        result = subprocess.run(
            [
                str(Path(sys.executable).parent / "maxqctl"),
                "--node",
                f"127.0.0.1:{n1.http_port}",
                "--json",
                "list",
                "connections",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result
        rows = json.loads(result.stdout)
        assert sorted(r["client"] for r in rows if r["client"].startswith("ctl-")) == ["ctl-n1", "ctl-n2", "ctl-n3"]
        nodes = api(n1, "GET", "/api/nodes")[1]
        assert {n["name"]: int(n["os_pid"]) for n in nodes} == {m.name: m.pid for m in cluster.alive()}
        assert all(n["running"] and n["mem_used"] > 0 and n["fd_used"] > 0 for n in nodes), nodes
        assert api(n1, "GET", "/api/nodes/n3")[1]["sockets_used"] == 1  # (its client above)
    finally:
        for conn in conns:
            conn.close()


def test_the_alarms_check_through_any_member_reports_another_members_alarm(tmp_path: Path) -> None:
    """n2 has a disk alarm (a free-space limit no disk meets): the cluster-wide check through n1
    fails naming it, as RabbitMQ's does; n1's local check passes. (It answered for n1 alone.)"""
    cluster = Cluster(tmp_path)
    cluster["n2"].extra_args += ["--disk-free-limit-mb", str(1 << 40)]
    try:
        cluster.start()
        n1 = cluster["n1"]
        wait_for(lambda: flag_enabled(n1, CLUSTER_LISTS), 60, "the cluster_lists flag")
        status, body, _ = api(n1, "GET", "/api/health/checks/alarms")
        assert status == 503 and body["reason"] == "There are alarms in effect in the cluster", body
        assert body["alarms"] == [{"node": "n2", "resource": "disk"}]
        assert api(n1, "GET", "/api/health/checks/local-alarms")[:2] == (200, {"status": "ok"})
        assert api(cluster["n2"], "GET", "/api/health/checks/local-alarms")[0] == 503
        cluster["n2"].kill()
        assert api(n1, "GET", "/api/health/checks/alarms")[:2] == (200, {"status": "ok"})  # (down: none to report)
    finally:
        cluster.stop()
