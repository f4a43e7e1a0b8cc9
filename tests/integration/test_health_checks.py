"""RabbitMQ's health checks and cluster name on a single node, over HTTP as its clients ask.

The expected bodies are RabbitMQ 3.10.8's, read from its management plugin side by side
(docs/operations.md, "Health checks"): the same keys, reasons and status codes.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from maxq_raft.http.health_api import quorum_critical_groups
from maxq_raft.machines.features import SUPPORTED

from ..conftest import free_port
from ..helpers import api, wait_until

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def test_a_healthy_node_passes_every_check(broker):
    # (a member of scripts/test's cluster pass: the quorum checks pass as on any cluster node)
    ok = {"status": "ok"}
    single = {**ok, "reason": "single node cluster"} if len(getattr(broker, "members", [broker])) == 1 else ok
    for path, body in [
        ("/api/health/checks/alarms", {"status": "ok"}),
        ("/api/health/checks/local-alarms", {"status": "ok"}),
        ("/api/health/checks/virtual-hosts", {"status": "ok"}),
        ("/api/health/checks/node-is-quorum-critical", single),
        ("/api/health/checks/node-is-mirror-sync-critical", single),
        (f"/api/health/checks/port-listener/{broker.amqp_port}", {"status": "ok", "port": broker.amqp_port}),
        (f"/api/health/checks/port-listener/{broker.http_port}", {"status": "ok", "port": broker.http_port}),
        ("/api/health/checks/protocol-listener/amqp", {"status": "ok", "protocol": "amqp"}),
        ("/api/health/checks/protocol-listener/http", {"status": "ok", "protocol": "http"}),
        ("/api/cluster-name", {"name": "maxq"}),
    ]:
        status, answer, _ = api(broker, "GET", path)
        assert (status, answer) == (200, body), path


def test_a_listener_that_is_not_there_fails_with_what_is(broker):
    port = free_port()
    status, answer, _ = api(broker, "GET", f"/api/health/checks/port-listener/{port}")
    assert status == 503
    assert answer["status"] == "failed" and answer["reason"] == "No active listener" and answer["missing"] == port
    assert broker.amqp_port in answer["ports"] and broker.http_port in answer["ports"]
    assert answer["ports"] == sorted(answer["ports"])
    status, answer, _ = api(broker, "GET", "/api/health/checks/protocol-listener/mqtt")
    assert status == 503
    assert answer["missing"] == "mqtt" and {"amqp", "http"} <= set(answer["protocols"])
    status, answer, _ = api(broker, "GET", "/api/health/checks/port-listener/http")
    assert status == 400 and "invalid port" in answer["error"]


def test_an_alarm_fails_both_alarm_checks(start_broker):
    alarmed = start_broker(["--memory-high-watermark-mb", "1"])  # crossed at the first sample
    node = api(alarmed, "GET", "/api/overview")[1]["node"]

    def failed_answer():
        status, answer, _ = api(alarmed, "GET", "/api/health/checks/alarms")
        return answer if status == 503 else None

    assert wait_until(failed_answer, 5.0) == {  # the alarm samples once a second
        "status": "failed",
        "reason": "There are alarms in effect in the cluster",
        "alarms": [{"node": node, "resource": "memory"}],
    }
    status, answer, _ = api(alarmed, "GET", "/api/health/checks/local-alarms")
    assert status == 503 and answer["reason"] == "There are alarms in effect on the node"
    assert answer["alarms"] == [{"node": node, "resource": "memory"}]


def test_checks_need_a_management_user(broker):
    status, _, challenge = api(broker, "GET", "/api/health/checks/alarms", auth=None)
    assert status == 401 and challenge
    name = f"u-{uuid.uuid4().hex[:8]}"
    node = f"127.0.0.1:{broker.http_port}"
    subprocess.run([MAXQCTL, "--node", node, "add-user", name, "pw-123456"], check=True, capture_output=True)
    try:
        status, answer, _ = api(broker, "GET", "/api/health/checks/alarms", auth=(name, "pw-123456"))
        assert status == 401, answer  # no management tag: RabbitMQ answers 401 too
        subprocess.run([MAXQCTL, "--node", node, "set-user-tags", name, "management"], check=True, capture_output=True)
        status, answer, _ = api(broker, "GET", "/api/health/checks/alarms", auth=(name, "pw-123456"))
        assert (status, answer) == (200, {"status": "ok"})
    finally:
        subprocess.run([MAXQCTL, "--node", node, "delete-user", name], capture_output=True)


def member(connected: bool, self_: bool = False) -> dict:
    return {"connected": connected, "self": self_}


def test_quorum_critical_groups_counts_a_majority_of_the_whole_group():
    groups = {
        "meta": {"members": {"n1": member(True, True), "n2": member(True), "n3": member(True)}},
        "shard-0": {"members": {"n1": member(True, True), "n2": member(True), "n3": member(False)}},
        "shard-1": {"members": {"n2": member(True), "n3": member(True)}},  # n1 not a member
        # 4 members, one other down: 2 of 4 left is no majority (a removal's rule would say 2 of 3)
        "shard-2": {"members": {"n1": member(True, True), "n2": member(True), "n3": member(True), "n4": member(False)}},
        "shard-3": {"members": {"n1": member(True, True)}},  # alone: stopping it stops the group
    }
    assert quorum_critical_groups(groups, "n1") == ["shard-0", "shard-2", "shard-3"]
    assert quorum_critical_groups({}, "n1") == []


def test_aliveness_test_round_trips_a_message(broker):
    assert api(broker, "GET", "/api/aliveness-test/%2F") == (200, {"status": "ok"}, None)
    assert api(broker, "GET", "/api/aliveness-test/%2F")[1] == {"status": "ok"}  # again: the queue exists
    assert api(broker, "GET", "/api/queues/%2F/aliveness-test")[1]["messages"] == 0
    status, body, _ = api(broker, "GET", "/api/aliveness-test/no-such-vhost")
    assert (status, body) == (404, {"error": "Object Not Found", "reason": "Not Found"})


def test_feature_flags_are_enabled_on_a_node_that_every_member_supports_and_only_administrators_see_them(broker):
    # machines/features.py: a single node enables its own at start; a cluster's metadata leader
    # once every member announced them (MAXQ_TEST_CLUSTER=3 runs this against a cluster).
    def states():
        status, answer, _ = api(broker, "GET", "/api/feature-flags")
        assert status == 200
        return {flag["name"]: flag["state"] for flag in answer}

    assert wait_until(lambda: states() == dict.fromkeys(SUPPORTED, "enabled"), 10), states()
    flag = api(broker, "GET", "/api/feature-flags")[1][0]
    assert set(flag) == {"name", "desc", "doc_url", "state", "stability", "provided_by"}  # RabbitMQ's keys
    user = f"ff-{uuid.uuid4().hex[:6]}"
    assert api(broker, "PUT", f"/api/users/{user}", {"password": "pw", "tags": "monitoring"})[0] == 201
    try:
        assert api(broker, "GET", "/api/feature-flags", auth=(user, "pw"))[0] == 401  # administrators only
    finally:
        api(broker, "DELETE", f"/api/users/{user}")
