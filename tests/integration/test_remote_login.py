"""Logging in from another host: a network namespace joined to this one by a veth pair.

The node listens on the veth's address; clients run inside the namespace, so the node sees a
non-loopback peer, as it would a client on another machine. There, `guest` is refused (AMQP and
the admin API), a user made with maxqctl gets in with pika and aio-pika, and the first
administrator given with --default-user (which replaces guest) can make more users.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 for a network namespace"
    ),
]

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def remote_host():
    """A namespace 'remote' whose address is .2, reaching this host's .1 over a veth pair."""
    tag = uuid.uuid4().hex[:6]
    ns, veth, peer = f"mxqa{tag}", f"mxqa{tag}h", f"mxqa{tag}r"
    octet = 16 + int(tag[:2], 16) % 200
    host_ip, remote_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer, "netns", ns)
        _ip("addr", "add", f"{host_ip}/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{remote_ip}/30", "dev", peer)
        _ip("-n", ns, "link", "set", peer, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        yield ns, host_ip
    finally:
        subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def in_ns(ns: str, *cmd: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ip", "netns", "exec", ns, *cmd], capture_output=True, text=True, timeout=60, input=stdin, cwd="/"
    )


CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    import pika, pika.exceptions
    host, port, user, password, which = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    try:
        if which == "pika":
            params = pika.ConnectionParameters(host, port, "/", pika.PlainCredentials(user, password),
                                               connection_attempts=1, socket_timeout=5)
            conn = pika.BlockingConnection(params)
            ch = conn.channel()
            q = ch.queue_declare("", exclusive=True).method.queue
            ch.basic_publish("", q, b"from afar")
            print(ch.basic_get(q, auto_ack=True)[2].decode())
            conn.close()
        else:
            import aio_pika
            async def main():
                conn = await aio_pika.connect(f"amqp://{user}:{password}@{host}:{port}/", timeout=10)
                async with conn:
                    ch = await conn.channel()
                    q = await ch.declare_queue("", exclusive=True)
                    await ch.default_exchange.publish(aio_pika.Message(b"from afar"), routing_key=q.name)
                    message = await q.get(timeout=5)
                    await message.ack()
                    print(message.body.decode())
            asyncio.run(main())
    except Exception as exc:
        print("refused:", type(exc).__name__, exc)
    """
)


def client(ns: str, host: str, port: int, user: str, password: str, which: str = "pika") -> str:
    result = in_ns(ns, sys.executable, "-c", CLIENT, host, str(port), user, password, which)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def ctl_from(ns: str, host: str, port: int, user: str, password: str, *args: str, stdin: str | None = None):
    return in_ns(ns, MAXQCTL, "--node", f"{host}:{port}", "--user", user, "--password", password, *args, stdin=stdin)


def test_users_log_in_from_another_host_and_guest_does_not(start_broker, remote_host, tmp_path):
    ns, host_ip = remote_host
    pass_file = tmp_path / "admin-pass"
    pass_file.write_text("first-admin-pass\n")
    pass_file.chmod(0o600)
    broker = start_broker(
        [
            "--amqp-host",
            host_ip,
            "--http-host",
            host_ip,
            "--default-user",
            "admin",
            "--default-pass-file",
            str(pass_file),
        ]
    )
    port, http_port = broker.amqp_port, broker.http_port
    assert "default user 'admin' created" in broker.log_text()
    # guest is gone (--default-user replaces it), and from afar it would be refused anyway
    assert client(ns, host_ip, port, "guest", "guest").startswith("refused:")
    answer = ctl_from(ns, host_ip, http_port, "guest", "guest", "list-users")
    assert answer.returncode == 4 and "401" in answer.stderr
    # The first administrator makes a user from afar; that user logs in with pika and aio-pika.
    made = ctl_from(ns, host_ip, http_port, "admin", "first-admin-pass", "add-user", "app", stdin="app-pass\n")
    assert made.returncode == 0, made.stderr
    granted = ctl_from(
        ns, host_ip, http_port, "admin", "first-admin-pass", "set-permissions", "app", "^amq\\.gen", ".*", ".*"
    )
    assert granted.returncode == 0, granted.stderr
    assert client(ns, host_ip, port, "app", "app-pass") == "from afar"
    assert client(ns, host_ip, port, "app", "app-pass", "aio_pika") == "from afar"
    assert client(ns, host_ip, port, "app", "wrong").startswith("refused:")
    listed = ctl_from(ns, host_ip, http_port, "admin", "first-admin-pass", "list-users")
    assert listed.returncode == 0 and "app" in listed.stdout and "guest" not in listed.stdout

    # A restart keeps the users; --default-user does nothing on a node whose users exist.
    broker.stop()
    pass_file.write_text("other-pass\n")
    broker.start()
    second_start = broker.log_text().split("maxq-server ready")[1]  # from the first ready line to the second
    assert "default user" not in second_start
    assert client(ns, host_ip, port, "app", "app-pass") == "from afar"
    assert ctl_from(ns, host_ip, http_port, "admin", "first-admin-pass", "list-vhosts").returncode == 0
    assert ctl_from(ns, host_ip, http_port, "admin", "other-pass", "list-vhosts").returncode == 4
