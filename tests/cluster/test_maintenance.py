"""Maintenance mode on a real 3-node cluster (machines/maintenance.py): `maxqctl drain` under
confirmed load moves every leadership and every client (AMQP and SQS) off the member and loses nothing;
`--dry-run` changes nothing; `revive` lets it serve again; refusals exit non-zero and say why."""

from __future__ import annotations

import re

import pika
import pika.exceptions
import pytest
from botocore.exceptions import ClientError

from maxq_raft.amqp import spec
from maxq_raft.machines.maintenance import DRAINING_TEXT, FEATURE

from ..helpers import api, wait_for
from ..integration.test_sqs import client as sqs_client
from ..raw_client import RawClient
from .conftest import ConfirmingPublisher, drain
from .test_maxqctl_cluster import leaders, maxqctl, settled, status_of

NAMES = ["n1", "n2", "n3"]
GROUPS = ["meta", "shard-0", "shard-1"]  # the cluster conftest starts members with --shards 2
CONFIRMS_PER_STEP = 30
STEP_S = 60.0
FORCED_TEXT = f"CONNECTION_FORCED - {DRAINING_TEXT}"  # (RabbitMQ's reply text: the constant's name first)


def feature_enabled(member) -> bool:
    return any(f["name"] == FEATURE and f["state"] == "enabled" for f in member.admin("/api/feature-flags"))


def being_drained(member) -> dict[str, bool]:
    return {node["name"]: node["being_drained"] for node in member.admin("/api/nodes")}


def lead_everything(cluster, target: str) -> None:
    """Every group's leadership to `target` (each member hands over what it leads). The leaders'
    balancing spreads the shards again, one every few seconds, so `target` may never be seen
    leading all three at once; the metadata group it keeps (the balancing moves shards only), so
    that is what is waited for: `target` then leads at least one group until it is drained."""
    for name in NAMES:
        if name != target:
            api(cluster[name], "POST", "/api/cluster/transfer-leadership", {"group": "all", "node": target})
    wait_for(lambda: leaders(status_of(cluster["n1"]))["meta"] == target, STEP_S, f"{target} leading the metadata")


def sqs_of(member, key: dict):
    """A boto3 SQS client of the member's endpoint, no retries (a refusal is seen as it is)."""
    return sqs_client(member, key["access_key_id"], key["secret_access_key"])


def refusal_of_a_new_connection(member) -> spec.ConnectionClose:
    """What the member answers a new client right after connection.open-ok (a bare socket:
    pika reports a close that follows open-ok only as a closed connection)."""
    client = RawClient(member.amqp_port)
    try:
        client.open()
        return client.expect(spec.ConnectionClose)
    finally:
        client.close()


def test_a_drained_member_leads_nothing_serves_no_one_and_nothing_confirmed_is_lost(cluster):
    first = cluster["n1"]
    wait_for(lambda: settled(first, NAMES), STEP_S, "every group led")
    wait_for(lambda: all(feature_enabled(cluster[n]) for n in NAMES), STEP_S, f"the {FEATURE} flag on every member")
    with first.connect() as connection:
        connection.channel().queue_declare("drain-q", durable=True)
    status, key, _ = api(first, "POST", "/api/users/guest/access-keys")
    assert status == 201, key
    lead_everything(cluster, "n3")
    idle = cluster["n3"].connect(socket_timeout=10)  # a client of n3's: closed by the drain
    publisher = ConfirmingPublisher([cluster[n] for n in NAMES], "drain-q", pause_s=0.002)
    publisher.start()
    try:
        wait_for(lambda: len(publisher.confirmed) >= CONFIRMS_PER_STEP, STEP_S, "confirms before the drain")

        planned = maxqctl(first, "drain", "n3", "--dry-run")
        assert planned.returncode == 0, planned.stderr
        # (the leaders' balancing has moved some of n3's three by now, never its last one)
        named = re.search(r"it leads ([^;]+);", planned.stdout)
        assert "dry run, nothing changed" in planned.stdout and named, planned.stdout
        assert set(named.group(1).split(", ")) <= set(GROUPS)
        assert being_drained(first) == dict.fromkeys(NAMES, False)
        assert "n3" in leaders(status_of(first)).values()

        done = maxqctl(first, "drain", "n3")
        assert done.returncode == 0, done.stderr + done.stdout
        assert "n3 drained" in done.stdout
        status = status_of(first)
        assert "n3" not in leaders(status).values() and None not in leaders(status).values()
        assert being_drained(first) == {"n1": False, "n2": False, "n3": True}
        assert being_drained(cluster["n3"])["n3"] is True
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            idle.process_data_events(time_limit=5)
        assert closed.value.reply_code == 320 and closed.value.reply_text == FORCED_TEXT
        refused = refusal_of_a_new_connection(cluster["n3"])
        assert (refused.reply_code, refused.reply_text) == (320, FORCED_TEXT)
        with pytest.raises(ClientError) as unavailable:  # the SQS endpoint sends its clients on too
            sqs_of(cluster["n3"], key).list_queues()
        error = unavailable.value.response
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 503 and error["Error"]["Message"] == DRAINING_TEXT
        assert sqs_of(cluster["n1"], key).list_queues()["ResponseMetadata"]["HTTPStatusCode"] == 200  # n1 serves
        before = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) >= before + CONFIRMS_PER_STEP, STEP_S, "confirms while drained")
        assert "n3" not in leaders(status_of(first)).values()  # the others' balancing gives it none

        revived = maxqctl(first, "revive", "n3")
        assert revived.returncode == 0 and "n3 revived" in revived.stdout, revived.stderr + revived.stdout
        wait_for(lambda: not being_drained(cluster["n3"])["n3"], STEP_S, "n3 revived, seen by itself")
        with cluster["n3"].connect() as connection:
            connection.channel().queue_declare("drain-q", durable=True, passive=True)
        before = len(publisher.confirmed)
        wait_for(lambda: len(publisher.confirmed) >= before + CONFIRMS_PER_STEP, STEP_S, "confirms after the revive")
    finally:
        publisher.stop_flag.set()
        publisher.join(30)
        if idle.is_open:
            idle.close()
    confirmed = publisher.confirmed_numbers()
    got = {int(body) for body, _ in drain(first, "drain-q")}
    assert not confirmed - got, f"lost {len(confirmed - got)} of {len(confirmed)} confirmed"
    assert len(confirmed) >= 3 * CONFIRMS_PER_STEP


def test_drain_refusals_say_why_and_change_nothing(cluster):
    first = cluster["n1"]
    wait_for(lambda: settled(first, NAMES), STEP_S, "every group led")
    wait_for(lambda: feature_enabled(first), STEP_S, f"the {FEATURE} flag")
    unknown = maxqctl(first, "drain", "n9")
    assert unknown.returncode != 0 and "404" in unknown.stderr and "n9 is not a member" in unknown.stderr
    for body in ({"node": "n2", "dry_run": "yes"}, {"node": ""}, {"node": 7}, {}):
        status, answer, _ = api(first, "POST", "/api/cluster/drain", body)
        assert status == 400, (body, status, answer)
    assert being_drained(first) == dict.fromkeys(NAMES, False)
    assert maxqctl(first, "drain", "n1").returncode == 0
    assert maxqctl(first, "drain", "n2").returncode == 0
    last = maxqctl(cluster["n3"], "drain", "n3")
    assert last.returncode != 0 and "409" in last.stderr and "would leave no member" in last.stderr
    assert being_drained(cluster["n3"]) == {"n1": True, "n2": True, "n3": False}
    assert "n1" not in leaders(status_of(cluster["n3"])).values()
    for name in ("n1", "n2"):
        assert maxqctl(cluster["n3"], "revive", name).returncode == 0
    again = maxqctl(cluster["n3"], "revive", "n1")
    assert again.returncode == 0 and "was not under maintenance" in again.stdout
    wait_for(lambda: being_drained(first) == dict.fromkeys(NAMES, False), STEP_S, "every member revived")
