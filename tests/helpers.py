"""Helpers the tests share: bounded waits, small AMQP client chores, small filesystems.

Every wait here is bounded in time and in turns; a predicate is polled, never a sleep of a
guessed length. A pika BlockingConnection only receives (deliveries, confirms, returns,
connection.blocked) while something processes its events, so a wait on what a connection
received names that connection and is pumped instead of sleeping.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

from maxq_raft.server.queue_stats import STATS_EVERY_S

if TYPE_CHECKING:
    import pika
    from pika.adapters.blocking_connection import BlockingChannel

T = TypeVar("T")

# The admin API wants a user's credentials: guest's work from loopback, as in RabbitMQ.
GUEST_AUTH = {"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="}  # guest:guest


def api(
    broker,
    method: str,
    path: str,
    body: dict | None = None,
    auth: tuple[str, str] | None = ("guest", "guest"),
    headers: dict[str, str] | None = None,
):
    """One admin API request as `auth`'s user: (status, JSON body or None, WWW-Authenticate)."""
    conn = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=10)
    headers = dict(headers or {})
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else None), response.getheader("WWW-Authenticate")
    finally:
        conn.close()


# --------------------------------------------------------------------------------- waiting


# What the management API and SQS's queue attributes show of a queue whose group the member asked
# holds no replica of is what the group's leader last reported (server/queue_stats.py): a test
# reading them through such a member waits for two reports.
STATS_SHOWN_S = 2 * STATS_EVERY_S + 2.0


def wait_until(
    predicate: Callable[[], T],
    timeout_s: float,
    step_s: float = 0.05,
    *,
    connections: Sequence[pika.BlockingConnection] = (),
) -> T:
    """Poll `predicate` until it answers something true, and return that answer; after
    `timeout_s`, return its last (false) answer. `assert wait_until(...)` is the usual use.

    With `connections`, each step processes their events for up to `step_s` (returning early when
    something arrives) instead of sleeping. Closed ones are skipped: a test may close one while it
    waits on the others."""
    deadline = time.monotonic() + timeout_s
    while True:  # bounded by the deadline
        answer = predicate()
        if answer or time.monotonic() >= deadline:
            return answer
        pumped = False
        for connection in connections:
            if connection.is_open:
                connection.process_data_events(time_limit=step_s)
                pumped = True
        if not pumped:
            time.sleep(step_s)


def wait_for(
    predicate: Callable[[], T],
    timeout_s: float,
    what: str,
    step_s: float = 0.1,
    *,
    connections: Sequence[pika.BlockingConnection] = (),
) -> T:
    """`wait_until`, but a timeout is a failure: raises AssertionError naming `what` (a phrase:
    "a new leader"). Returns the predicate's true answer, so a wait can also fetch a value.
    Its callers mostly poll other processes (the admin API, logs): 0.1 s steps are enough."""
    answer = wait_until(predicate, timeout_s, step_s, connections=connections)
    if not answer:
        raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
    return answer


def pump(connections: Sequence[pika.BlockingConnection], duration_s: float) -> None:
    """Process events on `connections` for `duration_s`, whatever arrives: long enough for what
    should NOT come (a delivery past the prefetch, a second reply) to show up, or for frames in
    flight to land. An error the broker sends (connection.close) is raised here, as pika does."""
    wait_until(lambda: False, duration_s, connections=connections)


# ------------------------------------------------------------------------ AMQP client chores


class Collector:
    """An on_message_callback that records (consumer tag, delivery tag, redelivered, body)."""

    def __init__(self) -> None:
        self.messages: list[tuple] = []

    def __call__(self, channel, method, properties, body) -> None:
        self.messages.append((method.consumer_tag, method.delivery_tag, method.redelivered, body))

    @property
    def bodies(self) -> list[bytes]:
        return [m[3] for m in self.messages]


def publish_confirmed(process, queue: str, body: bytes) -> None:
    """Declare `queue` durable on `process` (a started server) and publish `body` to it,
    persistent, mandatory, and confirmed before this returns."""
    import pika

    with process.connect() as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare(queue, durable=True)
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=True)


def message_count(channel: BlockingChannel, queue: str) -> int:
    """The ready messages of `queue` (unacknowledged ones do not count), as a passive
    queue.declare reports them."""
    return channel.queue_declare(queue, passive=True).method.message_count


def get_one(channel: BlockingChannel, queue: str, timeout_s: float = 10.0, *, auto_ack: bool = False) -> tuple:
    """(method, properties, body) of the next message of `queue`, by basic.get until one comes:
    dead lettering, a TTL or a delay takes a tick. AssertionError after `timeout_s`."""

    def got() -> tuple | None:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        return None if method is None else (method, properties, body)

    return wait_for(got, timeout_s, f"a message in {queue}", step_s=0.02)


def get_bodies(channel: BlockingChannel, queue: str, limit: int = 100) -> list[bytes]:
    """The bodies ready in `queue`, at most `limit` of them, by basic.get with no-ack."""
    bodies = []
    for _ in range(limit):
        method, _properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        bodies.append(body)
    return bodies


def drain(channel: BlockingChannel, queue: str, limit: int = 1000) -> list[bytes]:
    """Every body ready in `queue`, by basic.get with no-ack; more than `limit` is a failure
    (a queue that does not empty would otherwise keep the test busy)."""
    bodies = get_bodies(channel, queue, limit + 1)
    if len(bodies) > limit:
        raise AssertionError(f"{queue} did not drain: more than {limit} messages")
    return bodies


# ------------------------------------------------------------------------------ filesystems


@contextlib.contextmanager
def small_filesystem(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's size=, e.g. "48m") at `mount_point`, unmounted after (the
    caller stops what uses it first). Needs root; the caller skips otherwise (`can_mount`)."""
    mount_point.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        for _ in range(50):  # bounded: a process still stopping may hold it for a moment
            if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode == 0:
                break
            if subprocess.run(["mountpoint", "-q", str(mount_point)]).returncode != 0:
                break
            time.sleep(0.1)


def grow_filesystem(mount_point: Path, size: str = "1g") -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount_point)], check=True)


def can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


FAULTS = Path(__file__).resolve().parent / "faults"


def build_fsync_shim(folder: Path) -> Path:
    """Build tests/faults/fsync_fail.c (an LD_PRELOAD shim: fsync and fdatasync fail with EIO
    while the file named by MAXQ_FAIL_FSYNC_FILE exists); skips the test without a C compiler."""
    import pytest

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("building the fsync fault shim needs a C compiler")
    out = folder / "fsync_fail.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(out), str(FAULTS / "fsync_fail.c"), "-ldl"],
        check=True,
        capture_output=True,
    )
    return out


def load_script(name: str, path: Path) -> ModuleType:
    """A script of scripts/ as a module (scripts/ is not a package, and some have no .py),
    without putting scripts/ on sys.path for every other test."""
    loader = importlib.machinery.SourceFileLoader(name, str(path))
    spec = importlib.util.spec_from_loader(name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
