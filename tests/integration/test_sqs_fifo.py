"""SQS FIFO queues with boto3 against a real node (issue #18, item 3; docs/sqs.md, machines/fifo.py):
order within a group, a group held by one receiver while a message of it is in flight,
deduplication by id and by content within the window, SequenceNumber, and the window kept
across a member's restart.

Also run against a 3-node cluster (scripts/test, MAXQ_TEST_CLUSTER=3), as test_sqs.py is.
"""

from __future__ import annotations

import os
import time
import uuid

import pika
import pytest
from botocore.exceptions import ClientError

from tests.integration.test_sqs import client, code, new_key, sqs, sqs_user  # noqa: F401 - fixtures

CLUSTER = bool(os.environ.get("MAXQ_TEST_CLUSTER"))


@pytest.fixture
def fifo(sqs):  # noqa: F811 - the fixture imported above
    """A fresh FIFO queue's URL (deduplication ids required), deleted after the test."""
    url = sqs.create_queue(QueueName=f"f-{uuid.uuid4().hex[:10]}.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    yield url
    try:
        sqs.delete_queue(QueueUrl=url)
    except ClientError:
        pass


def _send(sqs, url: str, body: str, group: str, dedup: str | None = None) -> dict:  # noqa: F811
    return sqs.send_message(
        QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=dedup or uuid.uuid4().hex
    )


def _receive(sqs, url: str, count: int = 10, visibility: int = 30) -> list[dict]:  # noqa: F811
    return sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=count, VisibilityTimeout=visibility, AttributeNames=["All"]
    ).get("Messages", [])


def test_create_a_fifo_queue_and_its_attributes(sqs):  # noqa: F811
    name = f"f-{uuid.uuid4().hex[:10]}.fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})[
        "QueueUrl"
    ]
    try:
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert attributes["FifoQueue"] == "true" and attributes["ContentBasedDeduplication"] == "true"
        # the same attributes again: the same queue; another ContentBasedDeduplication: refused
        assert (
            sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"})[
                "QueueUrl"
            ]
            == url
        )
        with pytest.raises(ClientError) as other:
            sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "false"})
        assert code(other.value) == "QueueAlreadyExists"
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"ContentBasedDeduplication": "false"})
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ContentBasedDeduplication"])
        assert attributes["Attributes"] == {"ContentBasedDeduplication": "false"}
        with pytest.raises(ClientError) as fixed:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "false"})
        assert code(fixed.value) == "InvalidAttributeName"
    finally:
        sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as suffix:
        sqs.create_queue(QueueName=f"f-{uuid.uuid4().hex[:10]}", Attributes={"FifoQueue": "true"})
    assert code(suffix.value) == "InvalidParameterValue"


def test_fifo_sends_need_a_group_and_a_deduplication_id_and_no_delay(sqs, fifo):  # noqa: F811
    with pytest.raises(ClientError) as no_group:
        sqs.send_message(QueueUrl=fifo, MessageBody="x", MessageDeduplicationId="d")
    assert code(no_group.value) == "MissingParameter"
    with pytest.raises(ClientError) as no_dedup:
        sqs.send_message(QueueUrl=fifo, MessageBody="x", MessageGroupId="g")
    assert code(no_dedup.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as delayed:
        sqs.send_message(QueueUrl=fifo, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d", DelaySeconds=5)
    assert code(delayed.value) == "InvalidParameterValue"
    assert "Messages" not in sqs.receive_message(QueueUrl=fifo)


def test_order_within_groups_with_two_receivers(broker, sqs_user, sqs, fifo):  # noqa: F811
    other = client(broker.members[1] if CLUSTER else broker, sqs_user[1], sqs_user[2])
    for i in range(4):
        for group in ("a", "b"):
            _send(sqs, fifo, f"{group}{i}", group)
    # the first receiver takes one message of a: a is held, the second receiver gets b's in order
    first = _receive(sqs, fifo, count=1)
    assert [m["Body"] for m in first] == ["a0"]
    assert first[0]["Attributes"]["MessageGroupId"] == "a"
    second = _receive(other, fifo)
    assert [m["Body"] for m in second] == ["b0", "b1", "b2", "b3"]
    assert _receive(other, fifo) == []  # a is in flight, b is in flight: nothing for anyone
    sqs.delete_message(QueueUrl=fifo, ReceiptHandle=first[0]["ReceiptHandle"])
    rest = _receive(other, fifo)
    assert [m["Body"] for m in rest] == ["a1", "a2", "a3"]
    numbers = [m["Attributes"]["SequenceNumber"] for m in first + rest]
    assert numbers == sorted(numbers) and len(set(numbers)) == 4


def test_a_message_whose_visibility_runs_out_comes_back_before_the_rest_of_its_group(sqs, fifo):  # noqa: F811
    for i in range(3):
        _send(sqs, fifo, f"m{i}", "g")
    first = _receive(sqs, fifo, count=1, visibility=1)
    assert [m["Body"] for m in first] == ["m0"]
    assert _receive(sqs, fifo) == []  # m1 and m2 wait for m0
    deadline = time.monotonic() + 10
    again: list[dict] = []
    while not again and time.monotonic() < deadline:
        again = sqs.receive_message(
            QueueUrl=fifo, MaxNumberOfMessages=10, WaitTimeSeconds=2, AttributeNames=["All"]
        ).get("Messages", [])
    assert [m["Body"] for m in again] == ["m0", "m1", "m2"]
    assert again[0]["Attributes"]["ApproximateReceiveCount"] == "2"


def test_deduplication_within_the_window(sqs, fifo):  # noqa: F811
    sent = _send(sqs, fifo, "once", "g", dedup="order-1")
    again = _send(sqs, fifo, "once, again", "g", dedup="order-1")
    assert again["MessageId"] == sent["MessageId"] and again["SequenceNumber"] == sent["SequenceNumber"]
    batch = sqs.send_message_batch(
        QueueUrl=fifo,
        Entries=[
            {"Id": "a", "MessageBody": "dup", "MessageGroupId": "g", "MessageDeduplicationId": "order-1"},
            {"Id": "b", "MessageBody": "new", "MessageGroupId": "g", "MessageDeduplicationId": "order-2"},
            {"Id": "c", "MessageBody": "new too", "MessageGroupId": "g", "MessageDeduplicationId": "order-2"},
        ],
    )
    results = {entry["Id"]: entry for entry in batch["Successful"]}
    assert not batch["Failed"] and results["a"]["MessageId"] == sent["MessageId"]
    assert results["b"]["MessageId"] == results["c"]["MessageId"]
    assert int(results["b"]["SequenceNumber"]) > int(sent["SequenceNumber"])
    got = _receive(sqs, fifo)
    assert [m["Body"] for m in got] == ["once", "new"]
    assert got[0]["MessageId"] == sent["MessageId"]
    assert got[0]["Attributes"]["MessageDeduplicationId"] == "order-1"
    assert got[0]["Attributes"]["SequenceNumber"] == sent["SequenceNumber"]
    # deleted: a send with the same id within the window is still a duplicate
    for message in got:
        sqs.delete_message(QueueUrl=fifo, ReceiptHandle=message["ReceiptHandle"])
    assert _send(sqs, fifo, "later", "g", dedup="order-1")["MessageId"] == sent["MessageId"]
    assert _receive(sqs, fifo) == []


def test_content_based_deduplication(sqs):  # noqa: F811
    url = sqs.create_queue(
        QueueName=f"c-{uuid.uuid4().hex[:10]}.fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    try:
        first = sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="g")
        second = sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="h")
        third = sqs.send_message(QueueUrl=url, MessageBody="other body", MessageGroupId="g")
        assert second["MessageId"] == first["MessageId"] and third["MessageId"] != first["MessageId"]
        # an explicit id wins over the body's hash
        fourth = sqs.send_message(QueueUrl=url, MessageBody="same body", MessageGroupId="g", MessageDeduplicationId="x")
        assert fourth["MessageId"] != first["MessageId"]
        assert int(first["SequenceNumber"]) < int(third["SequenceNumber"]) < int(fourth["SequenceNumber"])
        assert [m["Body"] for m in _receive(sqs, url)] == ["same body", "other body", "same body"]
    finally:
        sqs.delete_queue(QueueUrl=url)


def test_amqp_consumers_are_refused_on_a_fifo_queue(broker, sqs, fifo):  # noqa: F811
    _send(sqs, fifo, "for sqs", "g")
    name = fifo.rsplit("/", 1)[1]
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.basic_get(name)
        assert refused.value.reply_code == 405
    finally:
        connection.close()
    assert [m["Body"] for m in _receive(sqs, fifo)] == ["for sqs"]


def test_deduplication_groups_and_numbers_survive_a_single_nodes_restart(start_broker, tmp_path):
    node = start_broker(data_dir=tmp_path / "restarted")
    key_id, secret = new_key(node, "guest")
    sqs = client(node, key_id, secret)  # noqa: F811
    url = sqs.create_queue(QueueName="kept.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
    sent = [_send(sqs, url, f"m{i}", "g", dedup=f"d{i}") for i in range(3)]
    held = _receive(sqs, url, count=1)  # in flight: comes back ready after the restart
    assert [m["Body"] for m in held] == ["m0"]
    node.stop()
    node.start()
    sqs = client(node, key_id, secret)
    again = _send(sqs, url, "again", "g", dedup="d1")
    assert (again["MessageId"], again["SequenceNumber"]) == (sent[1]["MessageId"], sent[1]["SequenceNumber"])
    later = _send(sqs, url, "m3", "g", dedup="d3")
    assert int(later["SequenceNumber"]) > int(sent[2]["SequenceNumber"])
    got = _receive(sqs, url, count=1)
    assert [m["Body"] for m in got] == ["m0"] and got[0]["Attributes"]["MessageGroupId"] == "g"
    assert _receive(sqs, url) == []  # the group is held again
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
    rest = _receive(sqs, url)
    assert [m["Body"] for m in rest] == ["m1", "m2", "m3"]
    assert [m["Attributes"]["SequenceNumber"] for m in rest] == [
        sent[1]["SequenceNumber"],
        sent[2]["SequenceNumber"],
        later["SequenceNumber"],
    ]


@pytest.mark.skipif(not CLUSTER, reason="a cluster's members (MAXQ_TEST_CLUSTER=3)")
def test_deduplication_survives_a_failover_and_a_restart(broker, sqs_user, sqs, fifo):  # noqa: F811
    stopped = broker.members[2]
    first = client(broker.members[0], sqs_user[1], sqs_user[2])
    second = client(broker.members[1], sqs_user[1], sqs_user[2])
    sent = _send(first, fifo, "kept", "g", dedup="restart-1")
    stopped.stop()  # if it led the queue's group, another member takes over
    try:
        assert _send(second, fifo, "again", "g", dedup="restart-1")["MessageId"] == sent["MessageId"]
    finally:
        stopped.start()
    third = client(stopped, sqs_user[1], sqs_user[2])
    assert _send(third, fifo, "and again", "g", dedup="restart-1")["MessageId"] == sent["MessageId"]
    got = _receive(third, fifo)
    assert [m["Body"] for m in got] == ["kept"] and got[0]["MessageId"] == sent["MessageId"]


def test_high_throughput_fifo_deduplicates_within_a_message_group(sqs):  # noqa: F811
    name = f"f-{uuid.uuid4().hex[:10]}.fifo"
    high = {"FifoQueue": "true", "DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perMessageGroupId"}
    url = sqs.create_queue(QueueName=name, Attributes=high)["QueueUrl"]
    try:
        assert sqs.create_queue(QueueName=name, Attributes=high)["QueueUrl"] == url  # the same: its URL
        with pytest.raises(ClientError) as other:
            sqs.create_queue(QueueName=name, Attributes={**high, "DeduplicationScope": "queue"})
        assert code(other.value) == "QueueAlreadyExists"
        shown = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (shown["DeduplicationScope"], shown["FifoThroughputLimit"]) == ("messageGroup", "perMessageGroupId")
        a = _send(sqs, url, "in a", "a", dedup="same")
        b = _send(sqs, url, "in b", "b", dedup="same")  # another group: not a duplicate
        assert a["MessageId"] != b["MessageId"]
        assert _send(sqs, url, "in a again", "a", dedup="same")["MessageId"] == a["MessageId"]
        got = _receive(sqs, url)
        assert sorted(m["Body"] for m in got) == ["in a", "in b"]
        assert {m["Attributes"]["MessageDeduplicationId"] for m in got} == {"same"}  # as sent
        # back to the queue's scope: a new id counts across groups
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "queue"})
        first = _send(sqs, url, "x", "a", dedup="another")
        assert _send(sqs, url, "y", "b", dedup="another")["MessageId"] == first["MessageId"]
        with pytest.raises(ClientError) as refused:
            sqs.set_queue_attributes(QueueUrl=url, Attributes={"DeduplicationScope": "everywhere"})
        assert code(refused.value) == "InvalidAttributeValue"
    finally:
        sqs.delete_queue(QueueUrl=url)
    with pytest.raises(ClientError) as standard:  # FIFO queues only
        sqs.create_queue(QueueName=f"s-{uuid.uuid4().hex[:10]}", Attributes={"FifoThroughputLimit": "perQueue"})
    assert code(standard.value) == "InvalidAttributeName"
