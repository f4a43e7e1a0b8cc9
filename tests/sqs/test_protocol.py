"""maxq_raft.sqs.protocol, digests, queue_url and receipt, checked against boto3 itself: requests
as boto3 sends them (captured before they leave the client), responses as boto3 parses them."""

from __future__ import annotations

import base64
import json
import time

import boto3
import botocore.config
import botocore.parsers
import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError
from botocore.serialize import create_serializer
from hypothesis import given, settings
from hypothesis import strategies as st

from maxq_raft.sqs import protocol
from maxq_raft.sqs.digests import md5_of_attributes, md5_of_body
from maxq_raft.sqs.errors import CATALOGUE, SqsError
from maxq_raft.sqs.protocol import Limits, error_response, parse_request, received_message, send_result
from maxq_raft.sqs.queue_url import parse_queue_url, queue_url
from maxq_raft.sqs.receipt import Receipt, decode_receipt, encode_receipt
from maxq_raft.sqs.sigv4 import SignatureError, verify_request

MODEL = botocore.session.get_session().get_service_model("sqs")
ENDPOINT = "http://localhost:9324"
KEY_ID, SECRET = "AKIDPROTOCOL", "protocol-secret"
HEADERS = {"Content-Type": protocol.CONTENT_TYPE}


def serialized(action, params):
    """The request body and headers botocore's json serializer makes for these parameters."""
    request = create_serializer("json").serialize_to_request(params, MODEL.operation_model(action))
    return {k.lower(): v for k, v in request["headers"].items()}, request["body"]


def parse(action, params, limits=protocol.SQS_LIMITS):
    headers, body = serialized(action, params)
    return parse_request(headers, body, limits)


def parse_raw(action, document):
    headers = {"content-type": protocol.CONTENT_TYPE, "x-amz-target": "AmazonSQS." + action}
    return parse_request(headers, json.dumps(document).encode())


def refused(code, action, params):
    with pytest.raises(SqsError) as caught:
        parse(action, params)
    assert caught.value.code == code, caught.value
    return caught.value


# --- the input shapes are botocore's ---------------------------------------------------------


def _model_shape(shape):
    if shape.type_name == "structure":
        return protocol.Struct(
            {name: _model_shape(member) for name, member in shape.members.items()},
            frozenset(shape.required_members),
        )
    if shape.type_name == "list":
        return protocol.ListOf(_model_shape(shape.member))
    if shape.type_name == "map":
        return protocol.MapOf(_model_shape(shape.value))
    return shape.type_name


@pytest.mark.parametrize("action", sorted(protocol.ACTIONS))
def test_input_shapes_match_botocores_model(action):
    assert protocol.INPUTS[action] == _model_shape(MODEL.operation_model(action).input_shape)


def test_modelled_errors_are_named_as_the_model_names_them():
    for shape in MODEL.error_shapes:
        if shape.name in CATALOGUE:
            assert CATALOGUE[shape.name].json_type == "com.amazonaws.sqs#" + shape.name


# --- requests as botocore serializes them ----------------------------------------------------


def test_send_message_with_attributes():
    request = parse(
        "SendMessage",
        {
            "QueueUrl": ENDPOINT + "/%2F/orders",
            "MessageBody": "héllo",
            "DelaySeconds": 5,
            "MessageAttributes": {
                "kind": {"DataType": "String", "StringValue": "order"},
                "blob": {"DataType": "Binary.gz", "BinaryValue": b"\x00\xff"},
                "n": {"DataType": "Number", "StringValue": "-1.5e3"},
            },
            "MessageSystemAttributes": {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1-a"}},
        },
    )
    assert request.action == "SendMessage" and not request.entry_errors
    assert request.params["MessageAttributes"]["blob"] == {"DataType": "Binary.gz", "BinaryValue": b"\x00\xff"}
    assert request.params["DelaySeconds"] == 5 and request.params["MessageBody"] == "héllo"


def test_receive_message_defaults_and_bounds():
    request = parse("ReceiveMessage", {"QueueUrl": "u"})
    assert request.params == {"QueueUrl": "u", "MaxNumberOfMessages": 1}
    request = parse(
        "ReceiveMessage",
        {
            "QueueUrl": "u",
            "MaxNumberOfMessages": 10,
            "WaitTimeSeconds": 20,
            "VisibilityTimeout": 43200,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount", "SentTimestamp"],
            "MessageAttributeNames": ["All", "foo.*", "bar"],
        },
    )
    assert request.params["MaxNumberOfMessages"] == 10
    for name, bad in [("MaxNumberOfMessages", 0), ("MaxNumberOfMessages", 11), ("WaitTimeSeconds", 21)]:
        error = refused("InvalidParameterValue", "ReceiveMessage", {"QueueUrl": "u", name: bad})
        assert error.message.startswith(f"Value {bad} for parameter {name} is invalid.")
    refused("InvalidParameterValue", "ReceiveMessage", {"QueueUrl": "u", "VisibilityTimeout": 43201})
    refused("InvalidAttributeName", "ReceiveMessage", {"QueueUrl": "u", "MessageSystemAttributeNames": ["Nope"]})


@pytest.mark.parametrize(
    "params, code",
    [
        ({"MessageBody": ""}, "InvalidParameterValue"),
        ({"MessageBody": "a\x00b"}, "InvalidMessageContents"),
        ({"MessageBody": "x", "DelaySeconds": 901}, "InvalidParameterValue"),
        ({"MessageBody": "x" * (1_048_576 + 1)}, "InvalidParameterValue"),
        (
            {"MessageBody": "x", "MessageAttributes": {"AWS.x": {"DataType": "String", "StringValue": "v"}}},
            "InvalidParameterValue",
        ),
        (
            {"MessageBody": "x", "MessageAttributes": {"a..b": {"DataType": "String", "StringValue": "v"}}},
            "InvalidParameterValue",
        ),
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Text", "StringValue": "v"}}},
            "InvalidParameterValue",
        ),
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Number", "StringValue": "1x"}}},
            "InvalidParameterValue",
        ),
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "Binary", "StringValue": "v"}}},
            "InvalidParameterValue",
        ),
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "String", "StringValue": ""}}},
            "InvalidParameterValue",
        ),
        (
            {"MessageBody": "x", "MessageAttributes": {"a": {"DataType": "String", "StringListValues": ["v"]}}},
            "InvalidParameterValue",
        ),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
            },
            "InvalidParameterValue",
        ),
        ({"MessageBody": "x", "MessageGroupId": "a" * 129}, "InvalidParameterValue"),
    ],
)
def test_send_message_limits(params, code):
    refused(code, "SendMessage", {"QueueUrl": "u", **params})


def test_the_message_size_limit_counts_attributes_and_is_the_servers():
    attributes = {"a": {"DataType": "String", "StringValue": "v" * 10}}
    params = {"QueueUrl": "u", "MessageBody": "x" * 1000, "MessageAttributes": attributes}
    assert protocol.message_bytes(parse("SendMessage", params).params) == 1000 + 1 + 6 + 10
    with pytest.raises(SqsError):
        parse("SendMessage", params, Limits(max_message_bytes=1016))
    parse("SendMessage", params, Limits(max_message_bytes=1017))
    assert parse("SendMessage", {**params, "DelaySeconds": 604800}, Limits(max_delay_s=604800))


def test_batches():
    entries = [{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)]
    request = parse("SendMessageBatch", {"QueueUrl": "u", "Entries": entries})
    assert [e["Id"] for e in request.params["Entries"]] == [f"m{i}" for i in range(10)]
    refused("EmptyBatchRequest", "SendMessageBatch", {"QueueUrl": "u", "Entries": []})
    refused(
        "TooManyEntriesInBatchRequest",
        "SendMessageBatch",
        {"QueueUrl": "u", "Entries": [*entries, {"Id": "x", "MessageBody": "b"}]},
    )
    refused(
        "BatchEntryIdsNotDistinct",
        "DeleteMessageBatch",
        {"QueueUrl": "u", "Entries": [{"Id": "a", "ReceiptHandle": "h"}] * 2},
    )
    refused(
        "InvalidBatchEntryId", "DeleteMessageBatch", {"QueueUrl": "u", "Entries": [{"Id": "a b", "ReceiptHandle": "h"}]}
    )
    big = [{"Id": f"m{i}", "MessageBody": "x" * 200_000} for i in range(6)]
    refused("BatchRequestTooLong", "SendMessageBatch", {"QueueUrl": "u", "Entries": big})


def test_a_bad_batch_entry_fails_alone():
    entries = [
        {"Id": "good", "MessageBody": "fine"},
        {"Id": "bad", "MessageBody": "x", "DelaySeconds": 10_000},
        {"Id": "worse", "MessageBody": "\x01"},
    ]
    request = parse("SendMessageBatch", {"QueueUrl": "u", "Entries": entries})
    assert [e["Id"] for e in request.params["Entries"]] == ["good"]
    assert {k: v.code for k, v in request.entry_errors.items()} == {
        "bad": "InvalidParameterValue",
        "worse": "InvalidMessageContents",
    }
    request = parse(
        "ChangeMessageVisibilityBatch",
        {"QueueUrl": "u", "Entries": [{"Id": "a", "ReceiptHandle": "h", "VisibilityTimeout": 50_000}]},
    )
    assert request.params["Entries"] == [] and request.entry_errors["a"].code == "InvalidParameterValue"


def test_queue_names_and_attributes():
    assert parse("CreateQueue", {"QueueName": "jobs-1_a"}).params["Attributes"] == {}
    parse("CreateQueue", {"QueueName": "jobs.fifo", "Attributes": {"FifoQueue": "true"}})
    refused("InvalidParameterValue", "CreateQueue", {"QueueName": "jobs.fifo"})
    refused("InvalidParameterValue", "CreateQueue", {"QueueName": "a" * 81})
    refused("InvalidParameterValue", "CreateQueue", {"QueueName": "has space"})
    assert parse("GetQueueUrl", {"QueueName": "amq.gen-from AMQP"}).params["QueueName"] == "amq.gen-from AMQP"
    refused("InvalidAttributeName", "CreateQueue", {"QueueName": "q", "Attributes": {"Colour": "red"}})
    refused("InvalidAttributeValue", "CreateQueue", {"QueueName": "q", "Attributes": {"VisibilityTimeout": "43201"}})
    refused("InvalidAttributeValue", "SetQueueAttributes", {"QueueUrl": "u", "Attributes": {"DelaySeconds": "-1"}})
    refused("InvalidAttributeName", "SetQueueAttributes", {"QueueUrl": "u", "Attributes": {"FifoQueue": "true"}})
    policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:us-east-1:0:dlq", "maxReceiveCount": "5"})
    parse("SetQueueAttributes", {"QueueUrl": "u", "Attributes": {"RedrivePolicy": policy}})
    refused("InvalidAttributeValue", "SetQueueAttributes", {"QueueUrl": "u", "Attributes": {"RedrivePolicy": "{}"}})
    refused("InvalidAttributeName", "GetQueueAttributes", {"QueueUrl": "u", "AttributeNames": ["Nope"]})
    refused("InvalidParameterValue", "ListQueues", {"MaxResults": 1001})


def test_malformed_requests():
    with pytest.raises(SqsError) as caught:
        parse_request({"content-type": protocol.CONTENT_TYPE, "x-amz-target": "AmazonSQS.StartMessageMoveTask"}, b"{}")
    assert caught.value.code == "InvalidAction"
    with pytest.raises(SqsError) as caught:
        parse_request({"Content-Type": "text/xml", "X-Amz-Target": "AmazonSQS.ListQueues"}, b"{}")
    assert caught.value.code == "SerializationException"
    for body in [b"[", b"[]", b"[" * 100_000, b'{"MaxResults": "10"}', b'{"MaxResults": 1.0}', b'{"MaxResults": true}']:
        with pytest.raises(SqsError) as caught:
            parse_request({"Content-Type": protocol.CONTENT_TYPE, "X-Amz-Target": "AmazonSQS.ListQueues"}, body)
        assert caught.value.code == "SerializationException", body
    with pytest.raises(SqsError) as caught:
        parse_raw("SendMessage", {"QueueUrl": "u"})
    assert caught.value.code == "MissingParameter" and "MessageBody" in caught.value.message
    with pytest.raises(SqsError) as caught:
        parse_raw(
            "SendMessage",
            {
                "QueueUrl": "u",
                "MessageBody": "x",
                "MessageAttributes": {"a": {"DataType": "Binary", "BinaryValue": "!!"}},
            },
        )
    assert caught.value.code == "SerializationException"
    with pytest.raises(SqsError) as caught:
        parse_request(
            {"Content-Type": protocol.CONTENT_TYPE, "X-Amz-Target": "AmazonSQS.ListQueues"}, b" " * (3 * 1_048_576 + 1)
        )
    assert caught.value.code == "RequestEntityTooLarge"
    # unknown members are ignored, as AWS's JSON services do
    assert parse_raw("ListQueues", {"Future": 1}).params == {}


# --- MD5s, against values AWS published and SDKs test with -------------------------------------


def test_md5_of_body():
    assert md5_of_body("This is a test message") == "fafb00f5732ab283681e124bf8747ed1"


@pytest.mark.parametrize(
    "attributes, digest",
    [
        ({"timestamp": ("Number", "1493147359900")}, "235c5c510d26fb653d073faed50ae77c"),
        ({"timestamp": ("Number", "1493147359901")}, "994258b45346a2cc3f9cbb611aa7af30"),
        ({"SellerName": ("String", "Example Store")}, "cd28f3b68aeee4b2eac9c66f2f694b58"),
        (
            {
                "City": ("String", "Any City"),
                "PostalCode": ("String", "99065"),
                "Region": ("String", "WA"),
                "SellerName": ("String", "Example Store"),
            },
            "66d793da93becb551e41562575418975",
        ),
        ({"ordinal": ("Number", "1"), "category": ("String", "test")}, "d21ae90c49061e927f57df5f5d72be1f"),
    ],
)
def test_md5_of_attributes(attributes, digest):
    values = {name: {"DataType": kind, "StringValue": value} for name, (kind, value) in attributes.items()}
    assert md5_of_attributes(values) == digest


def test_md5_of_binary_attributes_uses_transport_two():
    import hashlib

    expected = hashlib.md5(b"\x00\x00\x00\x01b\x00\x00\x00\x06Binary\x02\x00\x00\x00\x02\x00\xff").hexdigest()
    assert md5_of_attributes({"b": {"DataType": "Binary", "BinaryValue": b"\x00\xff"}}) == expected
    assert md5_of_attributes({}) is None


# --- queue URLs --------------------------------------------------------------------------------


def test_queue_urls():
    assert queue_url(ENDPOINT + "/", "/", "orders") == ENDPOINT + "/%2F/orders"
    assert parse_queue_url(ENDPOINT + "/%2F/orders") == ("/", "orders")
    assert parse_queue_url("/prod/jobs.fifo") == ("prod", "jobs.fifo")
    for bad in [
        "",
        ENDPOINT,
        ENDPOINT + "/orders",
        ENDPOINT + "/a/b/c",
        ENDPOINT + "/a/b?x=1",
        "ftp://h/a/b",
        "/%FF/q",
        "/a/",
    ]:
        with pytest.raises(SqsError) as caught:
            parse_queue_url(bad)
        assert caught.value.code == "InvalidAddress", bad


_names = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode("utf-8")) <= 255)


@settings(max_examples=200, deadline=None)
@given(vhost=_names, queue=_names)
def test_queue_urls_round_trip(vhost, queue):
    url = queue_url("https://node-1.example:9324", vhost, queue)
    assert url.count("/") == 4
    assert parse_queue_url(url) == (vhost, queue)


# --- receipt handles ---------------------------------------------------------------------------

KEY, OLD_KEY = b"k" * 32, b"o" * 32


@settings(max_examples=100, deadline=None)
@given(vhost=_names, queue=_names, seq=st.integers(0, 2**64 - 1), receive=st.integers(0, 2**64 - 1))
def test_receipts_round_trip(vhost, queue, seq, receive):
    receipt = Receipt(vhost, queue, seq, receive)
    handle = encode_receipt(receipt, KEY)
    assert len(handle) <= 1024
    assert decode_receipt(handle, [KEY], vhost=vhost, queue=queue) == receipt


@settings(max_examples=100, deadline=None)
@given(position=st.integers(min_value=0), replacement=st.sampled_from("AQgw-_"))
def test_a_changed_receipt_is_refused(position, replacement):
    handle = encode_receipt(Receipt("/", "orders", 7, 3), KEY)
    index = position % len(handle)
    changed = handle[:index] + replacement + handle[index + 1 :]
    if changed != handle:
        with pytest.raises(SqsError) as caught:
            decode_receipt(changed, [KEY], vhost="/", queue="orders")
        assert caught.value.code == "ReceiptHandleIsInvalid"


def test_receipts_are_bound_to_key_and_queue():
    handle = encode_receipt(Receipt("/", "orders", 7, 3), OLD_KEY)
    assert decode_receipt(handle, [KEY, OLD_KEY], vhost="/", queue="orders").receive_id == 3
    for keys, vhost, queue in [([KEY], "/", "orders"), ([OLD_KEY], "/", "other"), ([OLD_KEY], "v", "orders")]:
        with pytest.raises(SqsError):
            decode_receipt(handle, keys, vhost=vhost, queue=queue)
    for forged in ["", "x" * 1025, "not base64!", "é", base64.urlsafe_b64encode(b"\x01" * 40).decode()]:
        with pytest.raises(SqsError) as caught:
            decode_receipt(forged, [KEY], vhost="/", queue="orders")
        assert caught.value.kind.http_status == 404


# --- responses, read by botocore's parser ------------------------------------------------------


def botocore_parse(action, response):
    status, headers, body = response
    parser = botocore.parsers.create_parser("json")
    return parser.parse(
        {"status_code": status, "headers": {k.lower(): v for k, v in headers}, "body": body},
        MODEL.operation_model(action).output_shape,
    )


def test_errors_read_by_botocore():
    status, headers, body = error_response(SqsError("QueueDoesNotExist", "The specified queue does not exist."), "r-1")
    assert status == 400 and ("x-amzn-query-error", "AWS.SimpleQueueService.NonExistentQueue;Sender") in headers
    assert json.loads(body) == {
        "__type": "com.amazonaws.sqs#QueueDoesNotExist",
        "message": "The specified queue does not exist.",
    }
    parsed = botocore_parse("GetQueueUrl", (status, headers, body))
    assert parsed["Error"] == {
        "Code": "AWS.SimpleQueueService.NonExistentQueue",
        "QueryErrorCode": "QueueDoesNotExist",
        "Type": "Sender",
        "Message": "The specified queue does not exist.",
    }
    assert parsed["ResponseMetadata"]["RequestId"] == "r-1"


# --- boto3 itself, its requests captured before they leave it ---------------------------------


class _Raw:
    def __init__(self, body):
        self._body = body

    def stream(self, **kwargs):
        yield self._body


class FakeEndpoint:
    """Stands where the server will: verifies, parses, answers with the protocol module."""

    def __init__(self, answer):
        self.answer = answer
        self.seen = []

    def __call__(self, request, **kwargs):
        parts = request.url.split("?", 1)
        path = parts[0][len(ENDPOINT) :] or "/"
        headers = [("Host", "localhost:9324"), *request.headers.items()]
        body = request.body or b""
        headers = [(n, v.decode() if isinstance(v, bytes) else v) for n, v in headers]
        try:
            verify_request(
                method=request.method,
                path=path,
                query=parts[1] if len(parts) > 1 else "",
                headers=headers,
                body=body,
                now_s=time.time(),
                secret_for={KEY_ID: SECRET}.get,
            )
            parsed = parse_request(dict(headers), body)
            self.seen.append(parsed)
            response = self.answer(parsed)
        except SqsError as error:
            response = error_response(error, "req-1")
        status, response_headers, response_body = response
        return AWSResponse(request.url, status, dict(response_headers), _Raw(response_body))


def client_with(answer, secret=SECRET):
    client = boto3.client(
        "sqs",
        endpoint_url=ENDPOINT,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=secret,
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )
    endpoint = FakeEndpoint(answer)
    client.meta.events.register("before-send.sqs", endpoint)
    return client, endpoint


def test_boto3_send_and_receive():
    handle = encode_receipt(Receipt("/", "orders", 1, 1), KEY)
    attributes = {
        "kind": {"DataType": "String", "StringValue": "order"},
        "raw": {"DataType": "Binary", "BinaryValue": b"\x01\x02"},
    }

    def answer(request):
        if request.action == "SendMessage":
            return protocol.success_response(send_result(request.params, "id-1"), "req-1")
        message = received_message(
            message_id="id-1",
            receipt_handle=handle,
            body="hello",
            attributes={"ApproximateReceiveCount": "1"},
            message_attributes=attributes,
        )
        return protocol.success_response({"Messages": [message]}, "req-2")

    client, endpoint = client_with(answer)
    url = queue_url(ENDPOINT, "/", "orders")
    sent = client.send_message(QueueUrl=url, MessageBody="hello", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == md5_of_body("hello")
    assert sent["MD5OfMessageAttributes"] == md5_of_attributes(attributes)
    assert endpoint.seen[0].params["MessageAttributes"]["raw"]["BinaryValue"] == b"\x01\x02"
    assert parse_queue_url(endpoint.seen[0].params["QueueUrl"]) == ("/", "orders")
    received = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=20)
    (message,) = received["Messages"]
    assert message["Body"] == "hello" and message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == md5_of_attributes(message["MessageAttributes"])
    assert decode_receipt(message["ReceiptHandle"], [KEY], vhost="/", queue="orders").message_seq == 1
    assert endpoint.seen[1].params["WaitTimeSeconds"] == 20


def test_boto3_batch_partial_failure():
    def answer(request):
        successful = [send_result(entry, f"id-{entry['Id']}") for entry in request.params["Entries"]]
        failed = [protocol.batch_error_entry(i, e) for i, e in request.entry_errors.items()]
        return protocol.success_response({"Successful": successful, "Failed": failed}, "req-1")

    client, _ = client_with(answer)
    result = client.send_message_batch(
        QueueUrl=queue_url(ENDPOINT, "/", "q"),
        Entries=[{"Id": "ok", "MessageBody": "x"}, {"Id": "late", "MessageBody": "y", "DelaySeconds": 901}],
    )
    assert [e["Id"] for e in result["Successful"]] == ["ok"]
    assert result["Successful"][0]["MD5OfMessageBody"] == md5_of_body("x")
    assert result["Failed"] == [
        {"Id": "late", "SenderFault": True, "Code": "InvalidParameterValue", "Message": result["Failed"][0]["Message"]}
    ]


def test_boto3_sees_sqs_errors_as_their_exceptions():
    def answer(request):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")

    client, _ = client_with(answer)
    with pytest.raises(client.exceptions.QueueDoesNotExist) as caught:
        client.get_queue_url(QueueName="missing")
    assert caught.value.response["Error"]["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(ClientError) as caught:
        client.receive_message(QueueUrl=queue_url(ENDPOINT, "/", "q"), MaxNumberOfMessages=11)
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"


def test_boto3_with_a_wrong_secret():
    client, endpoint = client_with(lambda request: pytest.fail("must not be reached"), secret="wrong")
    with pytest.raises(ClientError) as caught:
        client.list_queues()
    assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert endpoint.seen == []
    assert issubclass(SignatureError, SqsError)
