"""maxq_raft.sqs.sigv4 against botocore's own signer: what botocore signs verifies, and any change
to what was signed (or a wrong key, or a stale time) is refused with the code AWS answers with."""

from __future__ import annotations

import datetime as dt
import hashlib
from urllib.parse import quote, urlsplit

import botocore.auth
import pytest
from botocore.auth import SigV4Auth, SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxq_raft.sqs import sigv4
from maxq_raft.sqs.sigv4 import SignatureError, verify_request

KEY_ID = "AKIDMAXQEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REGION = "us-east-1"
HOST = "sqs.example.test:9324"
ENDPOINT = f"http://{HOST}"
SIGNED_AT = dt.datetime(2024, 5, 6, 7, 8, 9)  # naive UTC, as botocore's clock gives it
SIGNED_AT_S = SIGNED_AT.replace(tzinfo=dt.UTC).timestamp()
SECRETS = {KEY_ID: SECRET, "AKIDOTHER": "another secret"}


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch):
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: SIGNED_AT)


def sign(
    *,
    method="POST",
    url=ENDPOINT + "/",
    params=None,
    headers=None,
    body=b"",
    secret=SECRET,
    query_auth=False,
    expires=3600,
    token=None,
):
    """Sign with botocore; return the request as an HTTP server would receive it."""
    request = AWSRequest(method=method, url=url, params=params or {}, headers=headers or {}, data=body)
    credentials = Credentials(KEY_ID, secret, token)
    if query_auth:
        SigV4QueryAuth(credentials, "sqs", REGION, expires=expires).add_auth(request)
    else:
        SigV4Auth(credentials, "sqs", REGION).add_auth(request)
    prepared = request.prepare()
    parts = urlsplit(prepared.url)
    received = [("Host", HOST), *prepared.headers.items()]
    return {
        "method": prepared.method,
        "path": parts.path,
        "query": parts.query,
        "headers": received,
        "body": prepared.body or b"",
    }


def verify(request, *, now_s=SIGNED_AT_S, secrets=SECRETS, **kwargs):
    return verify_request(**request, now_s=now_s, secret_for=secrets.get, **kwargs)


def refused(request, code, **kwargs):
    with pytest.raises(SignatureError) as caught:
        verify(request, **kwargs)
    assert caught.value.code == code, caught.value
    return caught.value


def json_request(**kwargs):
    body = kwargs.pop("body", b'{"QueueName": "orders"}')
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AmazonSQS.CreateQueue",
        **kwargs.pop("headers", {}),
    }
    return sign(headers=headers, body=body, **kwargs)


def with_header(request, name, value):
    headers = [(n, v) for n, v in request["headers"] if n.lower() != name.lower()]
    return {**request, "headers": [*headers, (name, value)]}


# --- what botocore signs verifies ---------------------------------------------------------------


def test_a_json_protocol_request_verifies():
    assert verify(json_request()) == KEY_ID
    assert verify(json_request(), region=REGION) == KEY_ID


def test_header_names_are_case_insensitive():
    request = json_request()
    shouted = {**request, "headers": [(name.upper(), value) for name, value in request["headers"]]}
    assert verify(shouted) == KEY_ID


def test_a_presigned_url_verifies():
    request = sign(method="GET", params={"Action": "ListQueues", "QueueNamePrefix": "a b+c/d"}, query_auth=True)
    assert "X-Amz-Signature=" in request["query"]
    assert verify(request) == KEY_ID
    assert verify(request, now_s=SIGNED_AT_S + 3599) == KEY_ID


def test_a_presigned_url_with_a_body_verifies():
    request = sign(method="POST", url=ENDPOINT + "/q?x=1", body=b"", query_auth=True, expires=60)
    assert verify(request) == KEY_ID


def test_the_date_header_may_stand_for_x_amz_date():
    request = json_request(headers={"Date": "Mon, 01 Jan 2001 00:00:00 GMT"})
    assert not any(name.lower() == "x-amz-date" for name, _ in request["headers"])
    assert verify(request) == KEY_ID


def test_repeated_headers_are_joined_with_commas():
    request = AWSRequest(method="POST", url=ENDPOINT + "/", data=b"")
    request.headers["X-Custom"] = "a"
    request.headers["X-Custom"] = "  b   c "  # HTTPHeaders appends: the header is sent twice
    SigV4Auth(Credentials(KEY_ID, SECRET), "sqs", REGION).add_auth(request)
    # (the prepared request keeps one value per name; the signer saw both, as a server would)
    received = [("Host", HOST), *request.headers.items()]
    assert [v for n, v in received if n == "X-Custom"] == ["a", "  b   c "]
    signed = {"method": "POST", "path": "/", "query": "", "headers": received, "body": b""}
    assert verify(signed) == KEY_ID
    one_only = [(n, v) for n, v in received if (n, v) != ("X-Custom", "a")]
    refused({**signed, "headers": one_only}, "SignatureDoesNotMatch")


def test_unsigned_payload_only_where_allowed():
    request = json_request(headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    assert verify(request, allow_unsigned_payload=True) == KEY_ID
    refused(request, "IncompleteSignature")
    # the body is not covered, so a changed body still verifies over TLS (that is the point)
    assert verify({**request, "body": b"{}"}, allow_unsigned_payload=True) == KEY_ID


def test_a_declared_body_hash_must_be_the_bodys():
    body = b'{"QueueName": "x"}'
    request = json_request(body=body, headers={"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()})
    assert verify(request) == KEY_ID
    error = refused({**request, "body": b'{"QueueName": "y"}'}, "SignatureDoesNotMatch")
    assert "x-amz-content-sha256" in error.message


# --- hypothesis: many shapes of request -------------------------------------------------------

_segment = st.one_of(
    st.text(min_size=1, max_size=12).map(lambda s: quote(s, safe="")),
    st.text(alphabet="abcXYZ019-._~!$&'()*+,;=:@", min_size=1, max_size=8),
    st.sampled_from([".", "..", ""]),
)
_paths = st.lists(_segment, max_size=6).map(lambda segments: "/" + "/".join(segments))
_param_names = st.text(min_size=1, max_size=10).filter(lambda s: not s.startswith("X-Amz-"))
_params = st.lists(st.tuples(_param_names, st.text(max_size=12)), max_size=6)
_header_names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda s: "x-t-" + s)
_header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E) | st.just("\t"), max_size=30)
_headers = st.dictionaries(_header_names, _header_values, max_size=6)
_methods = st.sampled_from(["GET", "POST", "PUT", "DELETE"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(method=_methods, path=_paths, params=_params, headers=_headers, body=st.binary(max_size=200))
def test_botocore_signed_requests_verify(method, path, params, headers, body):
    request = sign(method=method, url=ENDPOINT + path, params=params, headers=headers, body=body)
    assert verify(request) == KEY_ID


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_paths, params=_params)
def test_botocore_presigned_urls_verify(path, params):
    request = sign(method="GET", url=ENDPOINT + path, params=dict(params), query_auth=True)
    assert verify(request) == KEY_ID


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers=_headers, body=st.binary(min_size=1, max_size=100), flip=st.integers(min_value=0))
def test_a_changed_body_is_refused(headers, body, flip):
    request = sign(headers=headers, body=body)
    index = flip % len(body)
    changed = body[:index] + bytes([body[index] ^ 1]) + body[index + 1 :]
    refused({**request, "body": changed}, "SignatureDoesNotMatch")


# --- anything changed is refused --------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda r: {**r, "method": "PUT"},
        lambda r: {**r, "path": "/other"},
        lambda r: {**r, "query": "a=1"},
        lambda r: {**r, "body": b'{"QueueName": "orderz"}'},
        lambda r: with_header(r, "X-Amz-Target", "AmazonSQS.DeleteQueue"),
        lambda r: with_header(r, "Host", "elsewhere.test"),
        lambda r: with_header(r, "X-Amz-Date", "20240506T070810Z"),
    ],
    ids=["method", "path", "query", "body", "signed header", "host", "date"],
)
def test_a_tampered_request_is_refused(change):
    error = refused(change(json_request()), "SignatureDoesNotMatch")
    assert error.kind.http_status == 403
    assert error.kind.json_type == "com.amazon.coral.service#InvalidSignatureException"


def test_a_tampered_presigned_query_is_refused():
    request = sign(method="GET", params={"Action": "ListQueues"}, query_auth=True)
    refused({**request, "query": request["query"].replace("ListQueues", "PurgeQueue")}, "SignatureDoesNotMatch")
    refused(
        {**request, "query": request["query"].replace("X-Amz-Expires=3600", "X-Amz-Expires=7200")},
        "SignatureDoesNotMatch",
    )
    refused({**request, "query": request["query"] + "&extra=1"}, "SignatureDoesNotMatch")


def test_an_unsigned_header_may_change():
    request = json_request(headers={"User-Agent": "Boto3/1.0"})  # botocore never signs User-Agent
    assert verify(with_header(request, "User-Agent", "something else")) == KEY_ID


def test_a_wrong_secret_is_refused():
    refused(json_request(secret="not the secret"), "SignatureDoesNotMatch")


def test_an_unknown_key_is_refused():
    error = refused(json_request(), "InvalidClientTokenId", secrets={})
    assert error.message == "The security token included in the request is invalid."
    assert error.kind.query_code == "InvalidClientTokenId" and error.kind.http_status == 403


def test_a_session_token_is_refused():
    refused(json_request(token="a-session-token"), "InvalidClientTokenId")


def test_no_signature_at_all():
    request = json_request()
    bare = {**request, "headers": [(n, v) for n, v in request["headers"] if n.lower() != "authorization"]}
    error = refused(bare, "MissingAuthenticationToken")
    assert error.kind.http_status == 403


# --- time -------------------------------------------------------------------------------------


def test_fifteen_minutes_of_skew_either_way():
    request = json_request()
    assert verify(request, now_s=SIGNED_AT_S + 15 * 60) == KEY_ID
    assert verify(request, now_s=SIGNED_AT_S - 15 * 60) == KEY_ID
    late = refused(request, "SignatureDoesNotMatch", now_s=SIGNED_AT_S + 15 * 60 + 1)
    assert late.message == (
        "Signature expired: 20240506T070809Z is now earlier than 20240506T070810Z (20240506T072310Z - 15 min.)"
    )
    early = refused(request, "SignatureDoesNotMatch", now_s=SIGNED_AT_S - 15 * 60 - 1)
    assert early.message.startswith("Signature not yet current: 20240506T070809Z is still later than")


def test_a_presigned_url_expires():
    request = sign(method="GET", params={"Action": "ListQueues"}, query_auth=True, expires=60)
    assert verify(request, now_s=SIGNED_AT_S + 60) == KEY_ID
    error = refused(request, "SignatureDoesNotMatch", now_s=SIGNED_AT_S + 61)
    assert error.message.startswith("Signature expired")
    refused(request, "SignatureDoesNotMatch", now_s=SIGNED_AT_S - 15 * 60 - 1)


def test_presign_expiry_is_at_most_a_week():
    request = sign(method="GET", params={"Action": "ListQueues"}, query_auth=True, expires=7 * 24 * 3600 + 1)
    refused(request, "IncompleteSignature")


# --- malformed authorization ------------------------------------------------------------------


def _authorization(request):
    return next(v for n, v in request["headers"] if n.lower() == "authorization")


@pytest.mark.parametrize(
    "edit, code",
    [
        (lambda a: a.replace("AWS4-HMAC-SHA256", "AWS4-ECDSA-P256-SHA256"), "IncompleteSignature"),
        (lambda a: "Basic Z3Vlc3Q6Z3Vlc3Q=", "IncompleteSignature"),
        (lambda a: a.split(", Signature=")[0], "IncompleteSignature"),
        (lambda a: a.replace("/sqs/", "/sns/"), "SignatureDoesNotMatch"),
        (lambda a: a.replace("aws4_request", "aws5_request"), "SignatureDoesNotMatch"),
        (lambda a: a.replace("/20240506/", "/20240507/"), "SignatureDoesNotMatch"),
        (lambda a: a.replace(f"{KEY_ID}/", f"{KEY_ID}/extra/"), "IncompleteSignature"),
        (lambda a: a.replace("SignedHeaders=", "SignedHeaders=Host;"), "IncompleteSignature"),
        (lambda a: a.replace("host;", ""), "IncompleteSignature"),
        (lambda a: a[:-1] + "g", "SignatureDoesNotMatch"),
        (lambda a: a + "0", "SignatureDoesNotMatch"),
        (lambda a: a[:-1] + "\u00e9", "SignatureDoesNotMatch"),
    ],
    ids=[
        "algorithm",
        "basic",
        "no signature",
        "service",
        "terminator",
        "scope date",
        "credential parts",
        "upper-case signed header",
        "host unsigned",
        "not hex",
        "too long",
        "not ascii",
    ],
)
def test_a_malformed_authorization_is_refused(edit, code):
    request = json_request()
    refused(with_header(request, "Authorization", edit(_authorization(request))), code)


def test_another_region_when_one_is_required():
    error = refused(json_request(), "SignatureDoesNotMatch", region="eu-west-1")
    assert error.message == "Credential should be scoped to a valid region, not 'us-east-1'."


def test_a_malformed_date_is_refused():
    refused(with_header(json_request(), "X-Amz-Date", "2024-05-06T07:08:09Z"), "IncompleteSignature")
    request = json_request()
    no_date = {**request, "headers": [(n, v) for n, v in request["headers"] if n.lower() != "x-amz-date"]}
    refused(no_date, "IncompleteSignature")


def test_both_mechanisms_at_once_are_refused():
    request = json_request()
    refused({**request, "query": "X-Amz-Algorithm=AWS4-HMAC-SHA256"}, "IncompleteSignature")


# --- bounds -----------------------------------------------------------------------------------


def test_too_many_signed_headers():
    names = ";".join(["host", *(f"x-h{i}" for i in range(sigv4.MAX_SIGNED_HEADERS))])
    request = json_request()
    auth = _authorization(request)
    head, _, tail = auth.partition("SignedHeaders=")
    _, _, signature = tail.partition(",")
    refused(with_header(request, "Authorization", f"{head}SignedHeaders={names},{signature}"), "IncompleteSignature")


def test_oversized_inputs_are_refused_before_any_work():
    calls = []
    lookup = {KEY_ID: SECRET}

    def secret_for(key_id):
        calls.append(key_id)
        return lookup.get(key_id)

    request = json_request()
    cases = [
        {**request, "query": "a=1&" * (sigv4.MAX_QUERY_PARAMS + 1)},
        {**request, "query": "a" * (sigv4.MAX_QUERY_CHARS + 1)},
        {**request, "headers": [*request["headers"], *((f"x-{i}", "v") for i in range(sigv4.MAX_HEADERS))]},
        with_header(request, "Authorization", _authorization(request) + " " * sigv4.MAX_AUTHORIZATION_CHARS),
    ]
    for case in cases:
        with pytest.raises(SignatureError) as caught:
            verify_request(**case, now_s=SIGNED_AT_S, secret_for=secret_for)
        assert caught.value.code == "IncompleteSignature"
    assert calls == []


def test_an_oversized_signed_header_is_refused():
    request = sign(headers={"X-Big": "v" * (sigv4.MAX_SIGNED_HEADER_CHARS + 1)})
    refused(request, "IncompleteSignature")


def test_an_overlong_path_is_refused():
    request = sign(url=ENDPOINT + "/" + "a" * (sigv4.MAX_PATH_CHARS + 1))
    refused(request, "IncompleteSignature")


# --- the canonical pieces, as the AWS documentation states them --------------------------------


def test_canonical_uri_encodes_each_segment_again():
    assert sigv4.canonical_uri("") == "/"
    assert sigv4.canonical_uri("/a/./b/../c//d/") == "/a/c/d/"
    assert sigv4.canonical_uri("/%2F%20x") == "/%252F%2520x"
    assert sigv4.canonical_uri("/a~b") == "/a~b"


def test_canonical_query_sorts_by_encoded_name_then_value():
    params = [(b"b", b"2"), (b"a", b"z"), (b"a", b"y"), (b"c d", b"*~"), (b"E", b"")]
    assert sigv4.canonical_query(params) == "E=&a=y&a=z&b=2&c%20d=%2A~"
