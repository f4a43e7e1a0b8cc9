"""TLS against real server processes: AMQP over TLS with pika and aio-pika, client certificates
and the EXTERNAL mechanism, the minimum version, the handshake deadline, the admin API over
HTTPS with maxqctl, and a start with a bad certificate.

Certificates are made at test time with trustme: one CA signs the servers' certificates (for
127.0.0.1) and the clients' (CN = the user name EXTERNAL logs in as); a second CA, which the
servers do not trust, signs an impostor's.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pika
import pika.credentials
import pika.exceptions
import pytest
import trustme

from ..conftest import BrokerProcess, free_port
from ..helpers import GUEST_AUTH, api, wait_until

pytestmark = pytest.mark.timeout(120)

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")
HANDSHAKE_TIMEOUT_S = 1.0
# what pika raises when the server ends the TLS handshake (it passes some ssl errors through)
REFUSED = (pika.exceptions.AMQPConnectionError, ssl.SSLError, ConnectionError)


class Pki:
    """A CA, the servers' certificate files, and client certificates by CN."""

    def __init__(self, folder: Path) -> None:
        self.ca = trustme.CA()
        self.other_ca = trustme.CA()  # not trusted by the servers
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.ca_file = folder / "ca.pem"
        self.cert_file = folder / "server-cert.pem"
        self.key_file = folder / "server-key.pem"
        self.combined_file = folder / "server-both.pem"  # certificate chain and key in one file
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.cert_file.write_bytes(b"".join(pem.bytes() for pem in server.cert_chain_pems))
        server.private_key_pem.write_to_path(str(self.key_file))
        server.private_key_and_cert_chain_pem.write_to_path(str(self.combined_file))

    def client_context(
        self, cn: str | None = None, *, ca: trustme.CA | None = None, tls_max: ssl.TLSVersion | None = None
    ) -> ssl.SSLContext:
        """A client's context that trusts our CA; with `cn`, it presents a certificate of that CN
        (signed by `ca`, ours by default)."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if cn is not None:
            (ca or self.ca).issue_cert(f"{cn}.clients.example", common_name=cn).configure_cert(context)
        if tls_max is not None:
            context.maximum_version = tls_max
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


class TlsBroker:
    def __init__(self, process: BrokerProcess, amqps_port: int, https_port: int) -> None:
        self.process = process
        self.amqps_port = amqps_port
        self.https_port = https_port

    def pika_params(self, context: ssl.SSLContext, **extra) -> pika.ConnectionParameters:
        return pika.ConnectionParameters(
            "127.0.0.1",
            self.amqps_port,
            ssl_options=pika.SSLOptions(context, "127.0.0.1"),
            socket_timeout=5,
            blocked_connection_timeout=5,
            **extra,
        )

    def connect(self, context: ssl.SSLContext, **extra) -> pika.BlockingConnection:
        return pika.BlockingConnection(self.pika_params(context, **extra))


def _start(tmp_path_factory, pki: Pki, name: str, args: list[str]):
    root = tmp_path_factory.mktemp(name)
    amqps_port, https_port = free_port(), free_port()
    process = BrokerProcess(
        root / "data",
        root / "server.log",
        [
            "--amqps-port",
            str(amqps_port),
            "--https-port",
            str(https_port),
            "--handshake-timeout-s",
            str(HANDSHAKE_TIMEOUT_S),
            "--tls-ca",
            str(pki.ca_file),
            *args,
        ],
    )
    return TlsBroker(process.start(), amqps_port, https_port)


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory, pki):
    """Client certificates optional: checked when sent, and then EXTERNAL is offered."""
    broker = _start(
        tmp_path_factory,
        pki,
        "tls-optional",
        ["--tls-cert", str(pki.cert_file), "--tls-key", str(pki.key_file), "--tls-verify-peer", "optional"],
    )
    try:
        yield broker
    finally:
        broker.process.stop()


@pytest.fixture(scope="module")
def strict_broker(tmp_path_factory, pki):
    """Client certificates required, TLS 1.3 only; the key is in the certificate's file."""
    broker = _start(
        tmp_path_factory,
        pki,
        "tls-required",
        ["--tls-cert", str(pki.combined_file), "--tls-verify-peer", "required", "--tls-min-version", "1.3"],
    )
    try:
        yield broker
    finally:
        broker.process.stop()


def _round_trip(connection: pika.BlockingConnection) -> None:
    """Declare, publish with confirms, consume and ack: the whole path over this connection."""
    channel = connection.channel()
    channel.confirm_delivery()
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    channel.queue_declare(queue, durable=True)
    try:
        for i in range(20):
            channel.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2), mandatory=True)
        got: list[bytes] = []

        def on_message(ch, method, properties, body) -> None:
            got.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(got) == 20:
                ch.stop_consuming()

        channel.basic_consume(queue, on_message)
        connection.call_later(10, channel.stop_consuming)
        channel.start_consuming()
        assert got == [b"m%d" % i for i in range(20)]
    finally:
        channel.queue_delete(queue)


# --------------------------------------------------------------------------------- AMQPS


def test_pika_over_tls_publish_confirm_consume(tls_broker, pki):
    connection = tls_broker.connect(pki.client_context())
    try:
        _round_trip(connection)
    finally:
        connection.close()
    # the plain port still serves plain AMQP
    plain = tls_broker.process.connect()
    plain.close()


def test_aio_pika_over_tls_publish_confirm_consume(tls_broker, pki):
    import aio_pika

    async def scenario() -> None:
        connection = await aio_pika.connect(
            f"amqps://guest:guest@127.0.0.1:{tls_broker.amqps_port}/", ssl_context=pki.client_context(), timeout=5
        )
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(f"tls-aio-{uuid.uuid4().hex[:8]}", durable=True)
            for i in range(10):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(b"a%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue.name,
                )
                assert confirmation is not None  # an ack (a nack raises)
            got = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        got.append(message.body)
                    if len(got) == 10:
                        break
            assert got == [b"a%d" % i for i in range(10)]
            await queue.delete()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_client_that_never_finishes_the_tls_handshake_is_dropped(tls_broker):
    with socket.create_connection(("127.0.0.1", tls_broker.amqps_port), timeout=10) as s:
        started = time.monotonic()
        assert s.recv(1) == b""  # closed by the server, without a word from us
        waited = time.monotonic() - started
    assert HANDSHAKE_TIMEOUT_S * 0.8 <= waited < HANDSHAKE_TIMEOUT_S + 3, waited
    assert wait_until(lambda: "TLS handshake failed: timed out" in tls_broker.process.log_text(), 5)
    assert "Traceback" not in tls_broker.process.log_text()


def test_plain_amqp_on_the_tls_port_is_refused_without_a_traceback(tls_broker):
    with socket.create_connection(("127.0.0.1", tls_broker.amqps_port), timeout=10) as s:
        s.sendall(b"AMQP\x00\x00\x09\x01")
        try:
            while s.recv(4096):  # (perhaps an alert, then the close)
                pass
        except ConnectionResetError:
            pass
    assert wait_until(lambda: "TLS handshake failed" in tls_broker.process.log_text(), 5)
    assert "Traceback" not in tls_broker.process.log_text()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_1_1_is_refused_when_1_2_is_the_minimum(tls_broker, pki):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        context.set_ciphers("DEFAULT:@SECLEVEL=0")  # let this OpenSSL offer TLS 1.1 at all
        context.minimum_version = ssl.TLSVersion.TLSv1_1
        context.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError) as exc:
        pytest.skip(f"this OpenSSL cannot try TLS 1.1: {exc}")
    log_before = len(tls_broker.process.log_text())
    with (
        socket.create_connection(("127.0.0.1", tls_broker.amqps_port), timeout=10) as raw,
        pytest.raises((ssl.SSLError, ConnectionResetError)) as failure,
    ):
        context.wrap_socket(raw).close()
    if "NO_PROTOCOLS_AVAILABLE" in str(failure.value) or "no protocols available" in str(failure.value):
        pytest.skip("this OpenSSL refuses to send a TLS 1.1 hello")
    # the server saw the hello and refused it
    assert wait_until(lambda: "TLS handshake failed" in tls_broker.process.log_text()[log_before:], 5)


def test_tls_1_2_is_refused_when_1_3_is_the_minimum(strict_broker, pki):
    context = pki.client_context("guest", tls_max=ssl.TLSVersion.TLSv1_2)
    with pytest.raises(REFUSED):
        strict_broker.connect(context, connection_attempts=1)
    assert wait_until(lambda: "TLS handshake failed" in strict_broker.process.log_text(), 5)
    # the same client certificate over TLS 1.3 is served
    strict_broker.connect(pki.client_context("guest"), credentials=pika.credentials.ExternalCredentials()).close()


# ------------------------------------------------------------------- client certificates


def test_a_client_without_a_certificate_is_refused_when_one_is_required(strict_broker, pki):
    with pytest.raises(REFUSED):
        strict_broker.connect(pki.client_context(), connection_attempts=1)
    assert wait_until(lambda: "TLS handshake failed" in strict_broker.process.log_text(), 5)
    assert "Traceback" not in strict_broker.process.log_text()


def test_a_certificate_from_an_untrusted_ca_is_refused(tls_broker, pki):
    context = pki.client_context("guest", ca=pki.other_ca)
    log_before = len(tls_broker.process.log_text())
    with pytest.raises(REFUSED):
        tls_broker.connect(context, connection_attempts=1, credentials=pika.credentials.ExternalCredentials())
    assert wait_until(lambda: "TLS handshake failed" in tls_broker.process.log_text()[log_before:], 5)


def test_external_logs_in_as_the_certificate_cn(tls_broker, pki):
    connection = tls_broker.connect(
        pki.client_context("guest"),
        credentials=pika.credentials.ExternalCredentials(),
    )
    try:
        _round_trip(connection)
        # the admin API (over HTTPS) sees the TCP peer under the TLS stream, and the CN as user
        request = urllib.request.Request(
            f"https://127.0.0.1:{tls_broker.https_port}/api/connections", headers=GUEST_AUTH
        )
        with urllib.request.urlopen(request, context=pki.client_context(), timeout=5) as response:
            rows = json.loads(response.read())
        assert any(r.get("user") == "guest" and r.get("peer_host") == "127.0.0.1" for r in rows), rows
    finally:
        connection.close()


def test_external_with_a_required_certificate(strict_broker, pki):
    connection = strict_broker.connect(pki.client_context("guest"), credentials=pika.credentials.ExternalCredentials())
    try:
        _round_trip(connection)
    finally:
        connection.close()


def test_aio_pika_external(tls_broker, pki):
    import aio_pika

    async def scenario() -> None:
        connection = await aio_pika.connect(
            f"amqps://127.0.0.1:{tls_broker.amqps_port}/?auth=external",
            ssl_context=pki.client_context("guest"),
            timeout=5,
        )
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue(exclusive=True)
            await channel.default_exchange.publish(aio_pika.Message(b"hi"), routing_key=queue.name)
            message = await queue.get(timeout=5)
            assert message is not None and message.body == b"hi"
            await message.ack()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_external_is_refused_for_a_cn_that_is_no_user(tls_broker, pki):
    with pytest.raises(REFUSED):
        tls_broker.connect(
            pki.client_context("mallory"), connection_attempts=1, credentials=pika.credentials.ExternalCredentials()
        )
    assert wait_until(
        lambda: "login refused for user 'mallory' (EXTERNAL: no such user)" in tls_broker.process.log_text(), 5
    )


def test_external_is_not_offered_without_a_client_certificate(tls_broker, pki):
    # pika finds no EXTERNAL in connection.start's mechanisms and gives up itself
    with pytest.raises(pika.exceptions.AMQPConnectionError) as failure:
        tls_broker.connect(
            pki.client_context(), connection_attempts=1, credentials=pika.credentials.ExternalCredentials()
        )
    assert "SASL" in repr(failure.value) or "mechanism" in repr(failure.value).lower()
    # ... nor on the plain port
    with pytest.raises(REFUSED):
        pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                tls_broker.process.amqp_port,
                connection_attempts=1,
                credentials=pika.credentials.ExternalCredentials(),
            )
        )


def test_a_client_certificate_does_not_stop_a_password_login(tls_broker, pki):
    connection = tls_broker.connect(pki.client_context("mallory"))  # PLAIN guest/guest
    connection.close()


# ----------------------------------------------------------------------- admin over HTTPS


def maxqctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MAXQCTL, *args], capture_output=True, text=True, timeout=30)


def test_maxqctl_over_https(tls_broker, pki):
    node = f"https://127.0.0.1:{tls_broker.https_port}"
    result = maxqctl("--node", node, "--cacert", str(pki.ca_file), "status")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("node maxq1")
    # --cacert alone implies https
    result = maxqctl("--node", f"127.0.0.1:{tls_broker.https_port}", "--cacert", str(pki.ca_file), "list", "queues")
    assert result.returncode == 0, result.stderr
    # the node's certificate is not trusted without our CA
    result = maxqctl("--node", node, "status")
    assert result.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in result.stderr, result.stderr
    # plain HTTP still answers on the HTTP port
    result = maxqctl("--node", f"127.0.0.1:{tls_broker.process.http_port}", "status")
    assert result.returncode == 0, result.stderr


def test_plain_http_on_the_https_port_gets_no_answer(tls_broker):
    with socket.create_connection(("127.0.0.1", tls_broker.https_port), timeout=10) as s:
        s.sendall(b"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        reply = b""
        try:
            while chunk := s.recv(4096):
                reply += chunk
        except ConnectionResetError:
            pass
    assert b"HTTP/1.1 200" not in reply
    assert "Traceback" not in tls_broker.process.log_text()


# ------------------------------------------------------------------------------ start-up


def _start_fails(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "maxq_raft",
            "--data-dir",
            str(tmp_path / "data"),
            "--amqp-port",
            str(free_port()),
            "--http-port",
            "0",
            "--amqps-port",
            str(free_port()),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_a_missing_certificate_fails_the_start(tmp_path):
    result = _start_fails(tmp_path, "--tls-cert", str(tmp_path / "nope.pem"))
    assert "TLS certificate file not found" in result.stderr and "nope.pem" in result.stderr


def test_a_key_that_is_not_a_key_fails_the_start(tmp_path, pki):
    bad_key = tmp_path / "bad-key.pem"
    bad_key.write_text("not a key\n")
    result = _start_fails(tmp_path, "--tls-cert", str(pki.cert_file), "--tls-key", str(bad_key))
    assert "cannot use the TLS certificate and key" in result.stderr


def test_a_key_of_another_certificate_fails_the_start(tmp_path, pki):
    other_key = tmp_path / "other-key.pem"
    trustme.CA().issue_cert("127.0.0.1").private_key_pem.write_to_path(str(other_key))
    result = _start_fails(tmp_path, "--tls-cert", str(pki.cert_file), "--tls-key", str(other_key))
    assert "cannot use the TLS certificate and key" in result.stderr


def test_verify_peer_needs_a_ca(tmp_path, pki):
    result = _start_fails(tmp_path, "--tls-cert", str(pki.combined_file), "--tls-verify-peer", "required")
    assert "needs tls_ca" in result.stderr


# ------------------------------------------------------------------------------ settings


def test_tls_settings_from_flags_environment_and_file(tmp_path):
    from maxq_raft.config import load_settings

    settings, _ = load_settings([], environ={})
    assert (settings.tls_cert, settings.tls_verify_peer, settings.tls_min_version) == ("", "none", "1.2")
    assert (settings.amqps_port, settings.https_port) == (5671, 15671)  # used only with a certificate
    settings, _ = load_settings(
        ["--tls-cert", "c.pem", "--tls-ca", "ca.pem", "--tls-verify-peer", "required", "--amqps-port", "0"], environ={}
    )
    assert (settings.tls_cert, settings.tls_ca, settings.tls_verify_peer, settings.amqps_port) == (
        "c.pem",
        "ca.pem",
        "required",
        0,
    )
    settings, _ = load_settings([], environ={"MAXQ_TLS_CERT": "e.pem", "MAXQ_TLS_MIN_VERSION": "1.3"})
    assert (settings.tls_cert, settings.tls_min_version) == ("e.pem", "1.3")
    config = tmp_path / "maxq.toml"
    config.write_text('tls_cert = "f.pem"\ntls_key = "k.pem"\nhttps_port = 16000\n')
    settings, _ = load_settings(["--config", str(config)], environ={})
    assert (settings.tls_cert, settings.tls_key, settings.https_port) == ("f.pem", "k.pem", 16000)


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--tls-cert", "c.pem", "--tls-min-version", "1.1"], "tls_min_version must be 1.2 or 1.3"),
        (["--tls-cert", "c.pem", "--tls-verify-peer", "yes"], "tls_verify_peer must be none, optional or required"),
        (["--tls-key", "k.pem"], "tls_key needs tls_cert"),
        (["--tls-verify-peer", "optional"], "tls_verify_peer needs tls_cert"),
        (["--amqps-port", "70000"], "amqps_port must be a port number"),
    ],
)
def test_bad_tls_settings_are_refused(argv, text):
    from maxq_raft.config import SettingsError, load_settings

    with pytest.raises(SettingsError, match=text):
        load_settings(argv, environ={})


def test_the_sqs_endpoint_is_https_with_a_certificate(tls_broker, pki):
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ConnectionClosedError

    process = tls_broker.process
    status, key, _ = api(process, "POST", "/api/users/guest/access-keys")
    assert status == 201, key

    def sqs(scheme: str):
        return boto3.client(
            "sqs",
            endpoint_url=f"{scheme}://127.0.0.1:{process.sqs_port}",
            region_name="us-east-1",
            aws_access_key_id=key["access_key_id"],
            aws_secret_access_key=key["secret_access_key"],
            verify=str(pki.ca_file),
            config=Config(retries={"max_attempts": 1}, read_timeout=10, connect_timeout=5),
        )

    client = sqs("https")
    url = client.create_queue(QueueName="over-tls")["QueueUrl"]
    assert url.startswith(f"https://127.0.0.1:{process.sqs_port}/")
    client.send_message(QueueUrl=url, MessageBody="secret")
    assert client.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"][0]["Body"] == "secret"
    with pytest.raises(ConnectionClosedError):
        sqs("http").list_queues()  # the port speaks TLS only: a plain request gets no answer
    client.delete_queue(QueueUrl=url)
    api(process, "DELETE", f"/api/access-keys/{key['access_key_id']}")
