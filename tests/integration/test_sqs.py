"""The SQS endpoint with boto3 itself against a real node (issue #18; docs/sqs.md): every action,
visibility expiry and redelivery, long polls, batches with partial failures, stale receipt
handles, SigV4 refusals, and messages crossing between SQS and AMQP (pika).

Also run against a 3-node cluster (scripts/test, MAXQ_TEST_CLUSTER=3): the shared broker is then
the first member, and every action goes through the replicated path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import boto3
import pika
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.helpers import api, wait_until
from tests.integration.test_prometheus import one, scrape

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")
# No retries: a refusal must be seen as it is, and a test must not pass on a second try.
NO_RETRIES = Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=40, connect_timeout=10)


def client(broker, key_id: str, secret: str, vhost_path: str = ""):
    return boto3.client(
        "sqs",
        endpoint_url=f"http://127.0.0.1:{broker.sqs_port}{vhost_path}",
        region_name="us-east-1",
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=NO_RETRIES,
    )


def new_key(broker, user: str) -> tuple[str, str]:
    status, key, _ = api(broker, "POST", f"/api/users/{user}/access-keys")
    assert status == 201, key
    return key["access_key_id"], key["secret_access_key"]


@pytest.fixture(scope="module")
def sqs_user(broker):
    """A user of its own with every permission on "/", its key, deleted (with the key) afterwards."""
    name = f"sqs-{uuid.uuid4().hex[:8]}"
    assert api(broker, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})[0] == 201
    assert api(broker, "PUT", f"/api/permissions/%2F/{name}", {"configure": ".*", "write": ".*", "read": ".*"})[0] in (
        201,
        204,
    )
    key_id, secret = new_key(broker, name)
    yield name, key_id, secret
    api(broker, "DELETE", f"/api/users/{name}")


@pytest.fixture
def sqs(broker, sqs_user):
    return client(broker, sqs_user[1], sqs_user[2])


@pytest.fixture
def queue(sqs):
    """A fresh queue's URL, deleted after the test."""
    url = sqs.create_queue(QueueName=f"t-{uuid.uuid4().hex[:10]}")["QueueUrl"]
    yield url
    try:
        sqs.delete_queue(QueueUrl=url)
    except ClientError:
        pass


def code(error: ClientError) -> str:
    return error.response["Error"]["Code"]


# ------------------------------------------------------------------------- access keys


def test_maxqctl_adds_lists_and_deletes_access_keys(broker, sqs_user):
    node = f"127.0.0.1:{broker.http_port}"
    done = subprocess.run(
        [MAXQCTL, "--node", node, "add-access-key", sqs_user[0]], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.strip().splitlines())
    key_id, secret = lines["access key id"], lines["secret access key"]
    assert key_id.startswith("MQ") and len(key_id) == 20 and len(secret) == 40
    # the key signs requests as its user at once
    assert client(broker, key_id, secret).list_queues()["ResponseMetadata"]["HTTPStatusCode"] == 200
    listed = subprocess.run([MAXQCTL, "--node", node, "list-access-keys"], capture_output=True, text=True, timeout=30)
    assert key_id in listed.stdout and secret not in listed.stdout  # the secret is shown once only
    # a user may have two keys: the fixture's and this one; a third is refused
    refused = subprocess.run(
        [MAXQCTL, "--node", node, "add-access-key", sqs_user[0]], capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 4 and "most a user may have" in refused.stderr
    gone = subprocess.run(
        [MAXQCTL, "--node", node, "delete-access-key", key_id], capture_output=True, text=True, timeout=30
    )
    assert gone.returncode == 0, gone.stderr
    with pytest.raises(ClientError) as refused_key:
        client(broker, key_id, secret).list_queues()
    assert code(refused_key.value) == "InvalidClientTokenId"
    unknown = subprocess.run(
        [MAXQCTL, "--node", node, "add-access-key", "no-such-user"], capture_output=True, text=True, timeout=30
    )
    assert unknown.returncode == 4 and "no user 'no-such-user'" in unknown.stderr


def test_access_keys_need_an_administrator(broker, sqs_user):
    status, body, _ = api(broker, "POST", f"/api/users/{sqs_user[0]}/access-keys", auth=(sqs_user[0], "pw"))
    assert status == 401, body  # the user has no management tag at all


# ------------------------------------------------------------------------- signatures


def test_a_wrong_secret_or_an_unknown_key_is_refused(broker, sqs_user):
    with pytest.raises(ClientError) as wrong:
        client(broker, sqs_user[1], "x" * 40).list_queues()
    assert code(wrong.value) == "SignatureDoesNotMatch"
    assert wrong.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError) as unknown:
        client(broker, "MQ" + "Z" * 18, sqs_user[2]).list_queues()
    assert code(unknown.value) == "InvalidClientTokenId"
    assert unknown.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_a_user_without_permission_is_denied(broker, sqs, queue):
    name = f"sqs-ro-{uuid.uuid4().hex[:8]}"
    assert api(broker, "PUT", f"/api/users/{name}", {"password": "pw", "tags": ""})[0] == 201
    try:
        # may read queues named t-..., nothing else
        api(broker, "PUT", f"/api/permissions/%2F/{name}", {"configure": "", "write": "", "read": "^t-"})
        reader = client(broker, *new_key(broker, name))
        sqs.send_message(QueueUrl=queue, MessageBody="for the reader")
        for call in (
            lambda: reader.send_message(QueueUrl=queue, MessageBody="no"),
            lambda: reader.delete_queue(QueueUrl=queue),
            lambda: reader.create_queue(QueueName=f"t-{uuid.uuid4().hex[:8]}"),
            lambda: reader.set_queue_attributes(QueueUrl=queue, Attributes={"DelaySeconds": "1"}),
        ):
            with pytest.raises(ClientError) as denied:
                call()
            assert code(denied.value) == "AccessDenied"
            assert denied.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        got = reader.receive_message(QueueUrl=queue, WaitTimeSeconds=5)["Messages"]
        assert [m["Body"] for m in got] == ["for the reader"]
        reader.delete_message(QueueUrl=queue, ReceiptHandle=got[0]["ReceiptHandle"])
        # a user with no permission in the vhost at all
        api(broker, "DELETE", f"/api/permissions/%2F/{name}")
        wait_until(lambda: _denied(reader, queue), timeout_s=10)
    finally:
        api(broker, "DELETE", f"/api/users/{name}")


def _denied(reader, queue: str) -> bool:
    try:
        reader.receive_message(QueueUrl=queue)
    except ClientError as error:
        return code(error) == "AccessDenied"
    return False


# ------------------------------------------------------------------------- queues


def test_create_queue_is_idempotent_and_refuses_other_attributes(sqs):
    name = f"t-{uuid.uuid4().hex[:10]}"
    attributes = {"VisibilityTimeout": "7", "DelaySeconds": "0", "MaximumMessageSize": "2048"}
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    try:
        assert url.endswith(f"/%2F/{name}")
        assert sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"] == url
        with pytest.raises(ClientError) as exists:
            sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "8"})
        assert code(exists.value) == "QueueAlreadyExists"
        assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
        with pytest.raises(ClientError) as bad_name:
            sqs.create_queue(QueueName="no spaces")
        assert code(bad_name.value) == "InvalidParameterValue"
        with pytest.raises(ClientError) as kms:  # (FIFO queues: test_sqs_fifo.py)
            sqs.create_queue(QueueName=name + "-kms", Attributes={"KmsMasterKeyId": "alias/k"})
        assert code(kms.value) == "AWS.SimpleQueueService.UnsupportedOperation"
    finally:
        sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as missing:
        sqs.get_queue_url(QueueName=name)
    assert code(missing.value) == "AWS.SimpleQueueService.NonExistentQueue"
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_list_queues_by_prefix_and_in_pages(sqs):
    prefix = f"list-{uuid.uuid4().hex[:6]}-"
    urls = [sqs.create_queue(QueueName=f"{prefix}{i}")["QueueUrl"] for i in range(5)]
    try:
        assert sorted(sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]) == sorted(urls)
        seen, token, pages = [], None, 0
        while pages < 10:  # bounded
            kwargs = {"QueueNamePrefix": prefix, "MaxResults": 2}
            if token:
                kwargs["NextToken"] = token
            page = sqs.list_queues(**kwargs)
            seen += page.get("QueueUrls", [])
            pages += 1
            token = page.get("NextToken")
            if not token:
                break
        assert seen == sorted(urls) and pages == 3
        assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=prefix + "none")
    finally:
        for url in urls:
            sqs.delete_queue(QueueUrl=url)


def test_queue_attributes_get_and_set(sqs, queue):
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "30" and attributes["DelaySeconds"] == "0"
    assert attributes["ApproximateNumberOfMessages"] == "0" and "QueueArn" in attributes
    assert int(attributes["CreatedTimestamp"]) <= time.time() + 1
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"VisibilityTimeout": "45", "MessageRetentionPeriod": "600"})
    sqs.send_message(QueueUrl=queue, MessageBody="one")
    sqs.send_message(QueueUrl=queue, MessageBody="two")
    sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, WaitTimeSeconds=5)
    got = sqs.get_queue_attributes(
        QueueUrl=queue,
        AttributeNames=[
            "VisibilityTimeout",
            "MessageRetentionPeriod",
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
        ],
    )["Attributes"]
    assert got == {
        "VisibilityTimeout": "45",
        "MessageRetentionPeriod": "600",
        "ApproximateNumberOfMessages": "1",
        "ApproximateNumberOfMessagesNotVisible": "1",
    }
    with pytest.raises(ClientError) as bad:
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"VisibilityTimeout": "100000"})
    assert code(bad.value) == "InvalidAttributeValue"
    sqs.purge_queue(QueueUrl=queue)  # the message in flight goes too
    counts = sqs.get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def test_a_bad_queue_url_is_invalid_address(sqs):
    with pytest.raises(ClientError) as bad:
        sqs.send_message(QueueUrl="http://127.0.0.1:1/only-one-segment", MessageBody="x")
    assert code(bad.value) == "InvalidAddress"


# ------------------------------------------------------------------------- messages


def test_send_receive_delete_with_attributes(sqs, queue):
    attributes = {
        "text": {"DataType": "String", "StringValue": "héllo"},
        "n": {"DataType": "Number", "StringValue": "42"},
        "f": {"DataType": "Number.float", "StringValue": "1.5"},
        "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff"},
    }
    sent = sqs.send_message(QueueUrl=queue, MessageBody="body ✓", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] and sent["MD5OfMessageAttributes"]
    got = sqs.receive_message(
        QueueUrl=queue,
        MaxNumberOfMessages=10,
        WaitTimeSeconds=5,
        MessageSystemAttributeNames=["ApproximateReceiveCount", "SentTimestamp"],
        MessageAttributeNames=["All"],
    )["Messages"]
    assert len(got) == 1
    message = got[0]
    assert message["Body"] == "body ✓" and message["MessageId"] == sent["MessageId"]
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert message["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(message["Attributes"]["SentTimestamp"]) - time.time() * 1000) < 120_000
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)


def test_a_delayed_message_waits(sqs, queue):
    sqs.send_message(QueueUrl=queue, MessageBody="later", DelaySeconds=2)
    sent_at = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=queue)
    got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=15)["Messages"]
    assert [m["Body"] for m in got] == ["later"]
    assert time.monotonic() - sent_at >= 1.5


def test_visibility_expiry_redelivers_with_receive_count(sqs, queue):
    sqs.send_message(QueueUrl=queue, MessageBody="again")
    first = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=1, AttributeNames=["All"])["Messages"][0]
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    # invisible until its timeout runs out; then a long poll gets it (woken by the expiry)
    second = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=15, AttributeNames=["All"])["Messages"][0]
    assert second["Body"] == "again" and second["MessageId"] == first["MessageId"]
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert (
        second["Attributes"]["ApproximateFirstReceiveTimestamp"]
        == first["Attributes"]["ApproximateFirstReceiveTimestamp"]
    )
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=second["ReceiptHandle"])


def test_a_stale_receipt_handle_does_not_delete_a_message_received_again(sqs, queue):
    sqs.send_message(QueueUrl=queue, MessageBody="kept")
    old = sqs.receive_message(QueueUrl=queue, VisibilityTimeout=1)["Messages"][0]["ReceiptHandle"]
    new = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=15, VisibilityTimeout=30)["Messages"][0]
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=old)  # succeeds, as in SQS, but deletes nothing
    with pytest.raises(ClientError) as stale:
        sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=old, VisibilityTimeout=0)
    assert code(stale.value) == "AWS.SimpleQueueService.MessageNotInflight"
    # still in flight under the new receive: making it visible brings it back
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=new["ReceiptHandle"], VisibilityTimeout=0)
    third = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"])
    assert third["Messages"][0]["Body"] == "kept"
    assert third["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "3"
    sqs.delete_message(QueueUrl=queue, ReceiptHandle=third["Messages"][0]["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)
    with pytest.raises(ClientError) as forged:
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=new["ReceiptHandle"][:-4] + "AAAA")
    assert code(forged.value) == "ReceiptHandleIsInvalid"


def test_a_long_poll_is_answered_as_soon_as_a_message_is_sent(broker, sqs_user, sqs, queue):
    poller = client(broker, sqs_user[1], sqs_user[2])
    result: dict = {}

    def poll() -> None:
        result["reply"] = poller.receive_message(QueueUrl=queue, WaitTimeSeconds=20)
        result["done"] = time.monotonic()

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(1.0)  # the poll is waiting (nothing to receive yet)
    assert "done" not in result
    sqs.send_message(QueueUrl=queue, MessageBody="wake up")
    sent = time.monotonic()
    thread.join(30)
    assert not thread.is_alive()
    assert [m["Body"] for m in result["reply"]["Messages"]] == ["wake up"]
    # woken by the send, not by the 20 s timeout (generous: the machine is shared)
    assert result["done"] - sent < 5.0


def test_a_long_poll_is_woken_when_an_amqp_consumer_hands_its_message_back(broker, sqs_user, sqs, queue):
    """A message goes back to ready when the AMQP channel holding it closes: a Down for every
    queue of the shard, not a command to this queue. The waiting poll must wake for it too."""
    name = queue.rsplit("/", 1)[1]
    sqs.send_message(QueueUrl=queue, MessageBody="held")
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        method, _props, body = connection.channel().basic_get(name, auto_ack=False)
        assert body == b"held"
        poller = client(broker, sqs_user[1], sqs_user[2])
        result: dict = {}

        def poll() -> None:
            result["reply"] = poller.receive_message(QueueUrl=queue, WaitTimeSeconds=20)
            result["done"] = time.monotonic()

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        time.sleep(1.0)  # the poll is waiting: the only message is held by the AMQP channel
        assert "done" not in result
    finally:
        connection.close()
    closed = time.monotonic()
    thread.join(30)
    assert not thread.is_alive()
    assert [m["Body"] for m in result["reply"]["Messages"]] == ["held"]
    assert result["done"] - closed < 5.0  # woken by the hand-back, not by the 20 s timeout


def test_a_long_poll_on_an_empty_queue_waits_its_time(sqs, queue):
    started = time.monotonic()
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)
    assert 0.9 <= time.monotonic() - started < 10


def test_batches_report_each_entry(sqs, queue):
    sent = sqs.send_message_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "a", "MessageBody": "first"},
            {"Id": "b", "MessageBody": ""},  # refused alone: an empty body
            {"Id": "c", "MessageBody": "third", "DelaySeconds": 0},
        ],
    )
    assert sorted(entry["Id"] for entry in sent["Successful"]) == ["a", "c"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in sent["Failed"]] == [("b", "InvalidParameterValue", True)]
    got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
    bodies = {m["Body"] for m in got}
    if len(got) < 2:  # (a receive may return fewer than are there, as SQS's)
        got += sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5)["Messages"]
        bodies = {m["Body"] for m in got}
    assert bodies == {"first", "third"}
    changed = sqs.change_message_visibility_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 60},
            {"Id": "y", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 60},
        ],
    )
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert [(f["Id"], f["Code"]) for f in changed["Failed"]] == [("y", "ReceiptHandleIsInvalid")]
    deleted = sqs.delete_message_batch(
        QueueUrl=queue,
        Entries=[
            {"Id": "m1", "ReceiptHandle": got[0]["ReceiptHandle"]},
            {"Id": "m2", "ReceiptHandle": got[1]["ReceiptHandle"]},
            {"Id": "bad", "ReceiptHandle": "garbage"},
        ],
    )
    assert sorted(e["Id"] for e in deleted["Successful"]) == ["m1", "m2"]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    with pytest.raises(ClientError) as empty:
        sqs.delete_message_batch(QueueUrl=queue, Entries=[])
    assert code(empty.value) == "AWS.SimpleQueueService.EmptyBatchRequest"
    with pytest.raises(ClientError) as same:
        sqs.send_message_batch(
            QueueUrl=queue, Entries=[{"Id": "d", "MessageBody": "1"}, {"Id": "d", "MessageBody": "2"}]
        )
    assert code(same.value) == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, VisibilityTimeout=0)


def test_receive_limits_are_checked(sqs, queue):
    for kwargs in ({"MaxNumberOfMessages": 11}, {"WaitTimeSeconds": 21}, {"VisibilityTimeout": 43_201}):
        with pytest.raises(ClientError) as bad:
            sqs.receive_message(QueueUrl=queue, **kwargs)
        assert code(bad.value) == "InvalidParameterValue"


# ------------------------------------------------------------------------- AMQP <-> SQS


def test_amqp_to_sqs(broker, sqs, queue):
    name = queue.rsplit("/", 1)[1]
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(headers={"text": "v", "count": 7, "flag": True}, delivery_mode=2)
        channel.basic_publish("", name, b"from amqp", properties)
        channel.basic_publish("", name, b"\xff\xfe binary", pika.BasicProperties())
    finally:
        connection.close()
    got = []
    for _ in range(5):  # bounded
        got += sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, MessageAttributeNames=["All"]).get(
            "Messages", []
        )
        if len(got) >= 2:
            break
    by_body = {m["Body"]: m for m in got}
    text = by_body["from amqp"]
    assert text["MessageAttributes"] == {
        "text": {"DataType": "String", "StringValue": "v"},
        "count": {"DataType": "Number", "StringValue": "7"},
        "flag": {"DataType": "String", "StringValue": "true"},
    }
    binary = by_body["//4gYmluYXJ5"]  # base64 of the bytes
    assert binary["MessageAttributes"]["MaxQ.BodyEncoding"]["StringValue"] == "base64"


def test_sqs_to_amqp_and_a_shared_queue(broker, sqs, queue):
    name = queue.rsplit("/", 1)[1]
    sent = sqs.send_message(
        QueueUrl=queue,
        MessageBody="from sqs",
        MessageAttributes={
            "n": {"DataType": "Number", "StringValue": "12"},
            "s": {"DataType": "String.custom", "StringValue": "x"},
        },
    )
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        method, properties, body = channel.basic_get(name, auto_ack=False)
        assert method is not None and body == b"from sqs"
        assert properties.message_id == sent["MessageId"] and properties.delivery_mode == 2
        assert properties.headers["n"] == 12 and properties.headers["s"] in (b"x", "x")
        # handed back over AMQP, it is received over SQS with its attributes as they were sent
        channel.basic_nack(method.delivery_tag, requeue=True)
        got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=5, MessageAttributeNames=["All"])["Messages"][0]
        assert got["MessageId"] == sent["MessageId"]
        assert got["MessageAttributes"]["s"] == {"DataType": "String.custom", "StringValue": "x"}
        assert got["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
        # in flight to SQS, it is not delivered over AMQP
        assert channel.basic_get(name, auto_ack=True) == (None, None, None)
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=got["ReceiptHandle"])
    finally:
        connection.close()


def test_sqs_calls_count_in_the_overview_and_in_metrics_as_a_protocol_of_their_own(broker, sqs, queue):
    """A send is a confirmed publish, a received message a get waiting for its ack, a receive
    that finds none an empty get, a delete an ack: in /api/overview's message_stats (with
    AMQP's) and in /metrics under protocol="sqs"."""
    names = ("publish", "confirm", "get", "get_empty", "deliver_get", "ack")
    g = "rabbitmq_global_messages_"
    families = {
        "received_total": {"protocol": "sqs"},
        "confirmed_total": {"protocol": "sqs"},
        "delivered_get_manual_ack_total": {"protocol": "sqs", "queue_type": "maxq_queue"},
        "get_empty_total": {"protocol": "sqs", "queue_type": "maxq_queue"},
        "acknowledged_total": {"protocol": "sqs", "queue_type": "maxq_queue"},
    }

    def counts() -> dict:
        stats = api(broker, "GET", "/api/overview")[1]["message_stats"]
        samples = scrape(broker.prometheus_port)
        return {
            **{name: stats[name] for name in names},
            **{f: one(samples, g + f, **labels) for f, labels in families.items()},
        }

    before = counts()
    entries = [{"Id": str(i), "MessageBody": f"m{i}"} for i in range(3)]
    assert len(sqs.send_message_batch(QueueUrl=queue, Entries=entries)["Successful"]) == 3
    handles, empty = [], 0
    for _ in range(10):  # (bounded: a receive may return fewer than are there)
        got = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=5).get("Messages", [])
        empty += not got
        handles += [m["ReceiptHandle"] for m in got]
        if len(handles) == 3:
            break
    assert len(handles) == 3
    deleted = sqs.delete_message_batch(
        QueueUrl=queue, Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
    )
    assert len(deleted["Successful"]) == 3
    assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=0)
    after = counts()
    assert {name: after[name] - before[name] for name in after} == {
        "publish": 3,
        "confirm": 3,
        "get": 3,
        "get_empty": empty + 1,
        "deliver_get": 3,
        "ack": 3,
        "received_total": 3,
        "confirmed_total": 3,
        "delivered_get_manual_ack_total": 3,
        "get_empty_total": empty + 1,
        "acknowledged_total": 3,
    }


# ------------------------------------------------------------------------- redrive and tags


def test_redrive_to_a_dead_letter_queue_after_max_receive_count(sqs, queue):
    dead_letters = sqs.create_queue(QueueName=f"t-dlq-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    try:
        arn = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":2}}'
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"RedrivePolicy": policy})
        assert sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["RedrivePolicy"])["Attributes"] == {
            "RedrivePolicy": policy
        }
        assert sqs.list_dead_letter_source_queues(QueueUrl=dead_letters)["queueUrls"] == [queue]
        sqs.send_message(QueueUrl=queue, MessageBody="poison")
        for count in (1, 2):  # received maxReceiveCount times, never deleted
            got = sqs.receive_message(
                QueueUrl=queue, WaitTimeSeconds=15, VisibilityTimeout=1, AttributeNames=["ApproximateReceiveCount"]
            )["Messages"]
            assert got[0]["Body"] == "poison" and got[0]["Attributes"]["ApproximateReceiveCount"] == str(count)
        # the second visibility runs out: dead-lettered, not back in the queue
        moved = sqs.receive_message(QueueUrl=dead_letters, WaitTimeSeconds=15)["Messages"]
        assert [m["Body"] for m in moved] == ["poison"]
        assert "Messages" not in sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=2)
        with pytest.raises(ClientError) as bad:
            sqs.set_queue_attributes(
                QueueUrl=queue,
                Attributes={"RedrivePolicy": '{"deadLetterTargetArn":"arn:aws:sqs:x:%2F:nope","maxReceiveCount":1}'},
            )
        assert code(bad.value) == "InvalidParameterValue"
    finally:
        sqs.delete_queue(QueueUrl=dead_letters)


def test_an_empty_redrive_policy_removes_the_one_there(sqs, queue):
    # (as SQS: terraform's aws_sqs_queue_redrive_policy is deleted so)
    dead_letters = sqs.create_queue(QueueName=f"t-dlq-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    try:
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"RedrivePolicy": ""})  # none there: nothing
        arn = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":1}}'
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"RedrivePolicy": policy, "VisibilityTimeout": "1"})
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"RedrivePolicy": ""})
        attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
        assert "RedrivePolicy" not in attributes and attributes["VisibilityTimeout"] == "1"
        assert sqs.list_dead_letter_source_queues(QueueUrl=dead_letters)["queueUrls"] == []
        sqs.send_message(QueueUrl=queue, MessageBody="kept")
        for count in (1, 2, 3):  # past the removed maxReceiveCount of 1: still here, never moved
            got = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=15, AttributeNames=["ApproximateReceiveCount"])
            assert got["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == str(count), got
        assert "Messages" not in sqs.receive_message(QueueUrl=dead_letters, WaitTimeSeconds=1)
        # CreateQueue: an empty RedrivePolicy is none, so the queue as it is now is the same queue
        name = queue.rsplit("/", 1)[1]
        assert sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": ""})["QueueUrl"] == queue
    finally:
        sqs.delete_queue(QueueUrl=dead_letters)


def test_a_redrive_allow_policy_decides_which_queues_may_use_a_dead_letter_queue(sqs, queue):
    name, deny = f"t-dlq-{uuid.uuid4().hex[:8]}", {"RedriveAllowPolicy": '{"redrivePermission":"denyAll"}'}
    dead_letters = sqs.create_queue(QueueName=name, Attributes=deny)["QueueUrl"]
    try:
        assert sqs.create_queue(QueueName=name, Attributes=deny)["QueueUrl"] == dead_letters  # the same: its URL
        with pytest.raises(ClientError) as exists:
            sqs.create_queue(QueueName=name, Attributes={"RedriveAllowPolicy": '{"redrivePermission":"allowAll"}'})
        assert code(exists.value) == "QueueAlreadyExists"
        arn = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        source_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        policy = f'{{"deadLetterTargetArn":"{arn}","maxReceiveCount":3}}'

        def use_it() -> str:
            try:
                sqs.set_queue_attributes(QueueUrl=queue, Attributes={"RedrivePolicy": policy})
            except ClientError as error:
                return code(error)
            return "ok"

        assert use_it() == "InvalidParameterValue"  # denyAll
        other = source_arn.rsplit(":", 1)[0] + ":someone-else"

        def by_queue(*arns: str, permission: str = "byQueue") -> str:
            return json.dumps({"redrivePermission": permission, "sourceQueueArns": list(arns)}, separators=(",", ":"))

        sqs.set_queue_attributes(QueueUrl=dead_letters, Attributes={"RedriveAllowPolicy": by_queue(other)})
        assert use_it() == "InvalidParameterValue"  # byQueue, another queue
        sqs.set_queue_attributes(QueueUrl=dead_letters, Attributes={"RedriveAllowPolicy": by_queue(source_arn)})
        shown = sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["RedriveAllowPolicy"])["Attributes"]
        assert shown == {"RedriveAllowPolicy": by_queue(source_arn)}
        assert use_it() == "ok"  # byQueue naming this queue
        sqs.set_queue_attributes(QueueUrl=queue, Attributes={"RedrivePolicy": ""})
        sqs.set_queue_attributes(
            QueueUrl=dead_letters, Attributes={"RedriveAllowPolicy": '{"redrivePermission":"denyAll"}'}
        )
        sqs.set_queue_attributes(QueueUrl=dead_letters, Attributes={"RedriveAllowPolicy": ""})  # removed: allowAll
        assert (
            "RedriveAllowPolicy"
            not in sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["All"])["Attributes"]
        )
        assert use_it() == "ok"
        for bad in (
            '{"redrivePermission":"byQueue"}',
            by_queue(source_arn, permission="allowAll"),
            '{"redrivePermission":"sometimes"}',
            by_queue(*[source_arn] * 11),
            "not json",
        ):
            with pytest.raises(ClientError) as refused:
                sqs.set_queue_attributes(QueueUrl=dead_letters, Attributes={"RedriveAllowPolicy": bad})
            assert code(refused.value) == "InvalidAttributeValue", bad
    finally:
        sqs.delete_queue(QueueUrl=dead_letters)


def test_server_side_encryption_is_said_to_be_off_and_cannot_be_turned_on(sqs, queue):
    # (SqsManagedSseEnabled: what Terraform and CloudFormation may send; messages are stored as they are)
    assert sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["SqsManagedSseEnabled"])["Attributes"] == {
        "SqsManagedSseEnabled": "false"
    }
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"SqsManagedSseEnabled": "false"})
    name = queue.rsplit("/", 1)[1]
    assert sqs.create_queue(QueueName=name, Attributes={"SqsManagedSseEnabled": "false"})["QueueUrl"] == queue
    for call in (
        lambda: sqs.set_queue_attributes(QueueUrl=queue, Attributes={"SqsManagedSseEnabled": "true"}),
        lambda: sqs.create_queue(QueueName=f"t-{uuid.uuid4().hex[:10]}", Attributes={"SqsManagedSseEnabled": "true"}),
    ):
        with pytest.raises(ClientError) as refused:
            call()
        assert code(refused.value) == "AWS.SimpleQueueService.UnsupportedOperation"


def test_queue_tags(sqs, queue):
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=queue)
    sqs.tag_queue(QueueUrl=queue, Tags={"team": "a", "env": "test"})
    sqs.tag_queue(QueueUrl=queue, Tags={"team": "b"})
    assert sqs.list_queue_tags(QueueUrl=queue)["Tags"] == {"team": "b", "env": "test"}
    sqs.untag_queue(QueueUrl=queue, TagKeys=["env", "absent"])
    assert sqs.list_queue_tags(QueueUrl=queue)["Tags"] == {"team": "b"}
    with pytest.raises(ClientError) as bad:
        sqs.tag_queue(QueueUrl=queue, Tags={"aws:reserved": "x"})
    assert code(bad.value) == "InvalidParameterValue"
    tagged = sqs.create_queue(QueueName=f"t-{uuid.uuid4().hex[:10]}", tags={"made": "with tags"})["QueueUrl"]
    try:
        assert sqs.list_queue_tags(QueueUrl=tagged)["Tags"] == {"made": "with tags"}
    finally:
        sqs.delete_queue(QueueUrl=tagged)


# ------------------------------------------------------------------------- restarts and bad input


def test_keys_queues_attributes_and_messages_survive_a_restart(start_broker, tmp_path):
    data_dir = tmp_path / "restarted"
    node = start_broker(data_dir=data_dir)
    key_id, secret = new_key(node, "guest")
    sqs = client(node, key_id, secret)
    url = sqs.create_queue(QueueName="kept", Attributes={"VisibilityTimeout": "17", "DelaySeconds": "0"})["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": "4096"})
    sqs.tag_queue(QueueUrl=url, Tags={"a": "1"})
    sqs.send_message(
        QueueUrl=url, MessageBody="durable", MessageAttributes={"n": {"DataType": "Number", "StringValue": "3"}}
    )
    node.stop()
    node.start()  # same data folder, same ports
    sqs = client(node, key_id, secret)  # the key is still there
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["VisibilityTimeout"] == "17" and attributes["MaximumMessageSize"] == "4096"
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"a": "1"}
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, MessageAttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["durable"]
    assert got[0]["MessageAttributes"] == {"n": {"DataType": "Number", "StringValue": "3"}}
    sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])


def test_the_receive_count_survives_a_restart(start_broker, tmp_path):
    # Received twice before the restart, the second still in flight when the node stops: the
    # third receive after it says 3 (a cluster replays its log; a single node keeps the count
    # in the message's record).
    node = start_broker(data_dir=tmp_path / "counted")
    key_id, secret = new_key(node, "guest")
    sqs = client(node, key_id, secret)
    url = sqs.create_queue(QueueName="counted")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="m")
    for count in ("1", "2"):
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"])
        assert got["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == count
        if count == "1":
            sqs.change_message_visibility(
                QueueUrl=url, ReceiptHandle=got["Messages"][0]["ReceiptHandle"], VisibilityTimeout=0
            )
    node.stop()
    node.start()
    sqs = client(node, key_id, secret)
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5, AttributeNames=["ApproximateReceiveCount"])
    assert got["Messages"][0]["Attributes"]["ApproximateReceiveCount"] == "3"


def _signed(broker, key_id: str, secret: str, target: str | None, body: bytes, content_type: str):
    """A raw request signed by botocore's own SigV4 signer: (status, JSON body, query error header)."""
    import http.client
    import json

    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    url = f"http://127.0.0.1:{broker.sqs_port}/"
    headers = {"Content-Type": content_type}
    if target is not None:
        headers["X-Amz-Target"] = target
    request = AWSRequest("POST", url, data=body, headers=headers)
    SigV4Auth(Credentials(key_id, secret), "sqs", "us-east-1").add_auth(request)
    connection = http.client.HTTPConnection("127.0.0.1", broker.sqs_port, timeout=10)
    try:
        connection.request("POST", "/", body=body, headers=dict(request.headers.items()))
        response = connection.getresponse()
        raw = response.read()
        return response.status, json.loads(raw) if raw else None, response.getheader("x-amzn-query-error")
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("target", "body", "content_type", "status", "query_code"),
    [
        ("AmazonSQS.ListQueues", b"{not json", "application/x-amz-json-1.0", 400, "SerializationException"),
        ("AmazonSQS.ListQueues", b"[]", "application/x-amz-json-1.0", 400, "SerializationException"),
        ("AmazonSQS.ListQueues", b"{}", "text/plain", 400, "SerializationException"),
        ("AmazonSQS.NoSuchAction", b"{}", "application/x-amz-json-1.0", 400, "InvalidAction"),
        (None, b"{}", "application/x-amz-json-1.0", 400, "InvalidAction"),
        ("AmazonSQS.SendMessage", b'{"QueueUrl": "x"}', "application/x-amz-json-1.0", 400, "MissingParameter"),
        ("AmazonSQS.ReceiveMessage", b'{"QueueUrl": 5}', "application/x-amz-json-1.0", 400, "SerializationException"),
        (
            "AmazonSQS.DeleteMessage",
            b'{"QueueUrl": "http://h/%2F/none", "ReceiptHandle": "x"}',
            "application/x-amz-json-1.0",
            400,
            "AWS.SimpleQueueService.NonExistentQueue",
        ),
    ],
)
def test_bad_requests_get_sqs_errors(broker, sqs_user, target, body, content_type, status, query_code):
    got_status, answer, query_error = _signed(broker, sqs_user[1], sqs_user[2], target, body, content_type)
    assert (got_status, query_error) == (status, f"{query_code};Sender"), answer
    assert set(answer) == {"__type", "message"}


def test_unsigned_requests_and_other_methods_are_refused(broker):
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", broker.sqs_port, timeout=10)
    try:
        connection.request(
            "POST",
            "/",
            body=b"{}",
            headers={"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"},
        )
        response = connection.getresponse()
        response.read()
        assert (response.status, response.getheader("x-amzn-query-error")) == (
            403,
            "MissingAuthenticationToken;Sender",
        )
    finally:
        connection.close()
    connection = http.client.HTTPConnection("127.0.0.1", broker.sqs_port, timeout=10)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        response.read()
        assert response.status == 405
    finally:
        connection.close()


CLUSTER_SIZE = int(os.environ.get("MAXQ_TEST_CLUSTER") or 0)


@pytest.mark.skipif(CLUSTER_SIZE < 3, reason="needs the shared broker to be a member of a 3-node cluster")
def test_any_member_serves_any_request_of_a_cluster(broker, sqs_user, queue):
    # the key is on every member; a handle from one member's receive deletes through another
    first, second, third = (client(member, sqs_user[1], sqs_user[2]) for member in broker.members[:3])
    result: dict = {}

    def poll() -> None:
        result["reply"] = first.receive_message(QueueUrl=queue, WaitTimeSeconds=20, VisibilityTimeout=30)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    time.sleep(1.0)
    second.send_message(QueueUrl=queue, MessageBody="across members")
    sent = time.monotonic()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - sent < 5.0
    message = result["reply"]["Messages"][0]
    assert message["Body"] == "across members"
    third.delete_message(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"])
    # deleted, not just hidden: made visible through the first member it would come back
    with pytest.raises(ClientError) as gone:
        first.change_message_visibility(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    assert code(gone.value) == "AWS.SimpleQueueService.MessageNotInflight"
    assert "Messages" not in second.receive_message(QueueUrl=queue, WaitTimeSeconds=1)


def test_delays_go_up_to_seven_days(sqs, queue):
    sqs.send_message(QueueUrl=queue, MessageBody="next week", DelaySeconds=7 * 24 * 3600)
    counts = sqs.get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    )["Attributes"]
    assert counts == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesDelayed": "1"}
    sqs.set_queue_attributes(QueueUrl=queue, Attributes={"DelaySeconds": str(7 * 24 * 3600)})
    with pytest.raises(ClientError) as too_long:
        sqs.send_message(QueueUrl=queue, MessageBody="too late", DelaySeconds=7 * 24 * 3600 + 1)
    assert code(too_long.value) == "InvalidParameterValue"


def test_priorities_as_a_message_attribute(broker, sqs):
    name = f"t-prio-{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        connection.channel().queue_declare(name, durable=True, arguments={"x-max-priority": 5})
    finally:
        connection.close()
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    try:

        def priority(n: str) -> dict:
            return {"MaxQ.Priority": {"DataType": "Number", "StringValue": n}}

        sent = sqs.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": "low", "MessageBody": "low", "MessageAttributes": priority("1")},
                {"Id": "none", "MessageBody": "none"},
                {"Id": "high", "MessageBody": "high", "MessageAttributes": priority("5")},
                {"Id": "bad", "MessageBody": "bad", "MessageAttributes": priority("256")},
            ],
        )
        assert [(f["Id"], f["Code"]) for f in sent["Failed"]] == [("bad", "InvalidParameterValue")]
        bodies = []
        for _ in range(6):  # bounded
            got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60).get("Messages", [])
            bodies += [m["Body"] for m in got]
            if len(bodies) >= 3:
                break
        assert bodies == ["high", "low", "none"]
    finally:
        sqs.delete_queue(QueueUrl=url)


def test_a_partitioned_queue_is_refused_over_sqs(broker, sqs):
    # its messages are in several queues (x-partitions): SQS would see and delete only one
    name = f"parts-{uuid.uuid4().hex[:10]}"
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.amqp_port))
    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-partitions": 2})
        url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
        for call in (
            lambda: sqs.send_message(QueueUrl=url, MessageBody="x"),
            lambda: sqs.receive_message(QueueUrl=url),
            lambda: sqs.delete_queue(QueueUrl=url),
        ):
            with pytest.raises(ClientError) as refused:
                call()
            assert code(refused.value) == "AWS.SimpleQueueService.UnsupportedOperation"
            assert "partitioned" in refused.value.response["Error"]["Message"]
        assert channel.queue_declare(f"amq.partition-1.{name}", passive=True)  # nothing deleted
        channel.queue_delete(name)
    finally:
        connection.close()
