#!/usr/bin/env python3
"""Make a single node's data folder with this checkout's code, for the upgrade tests (issue #23).

A release keeps the data folder its code wrote under `tests/upgrade/fixtures/`, and every later
release's tests open it (`tests/upgrade/test_data_fixtures.py`): data written by an earlier version
must open with a later one. This script starts one node in a fresh folder, writes a known workload
through AMQP and the admin API (users, vhosts, permissions, a policy, durable exchanges of every type
with bindings, an alternate exchange, durable queues with persistent messages and queue features,
unacked deliveries at shutdown, a deduplication window), stops it with SIGTERM as an upgrade does
(or SIGKILL, `--kill`, as a crash before an upgrade does), and writes two files:

    <name>.tar.gz   the data folder (RocksDB's own info logs left out); with --cluster, the
                    folders of a 3-member cluster's members n1, n2, n3
    <name>.json     what the folder must hold: the definitions export, each queue's bodies in
                    delivery order, and how to check the rest

The expectations come from what this script published, except the definitions, which are the
node's own export before the stop (what an import of them would make).

    .venv/bin/python scripts/make_data_fixture.py --out tests/upgrade/fixtures
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.client
import json
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pika
from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

REPO = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0
PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
ALICE = ("alice", "alice-upgrade-pw")


class Node:
    """One maxq-server process of this checkout on loopback."""

    def __init__(self, data_dir: Path, extra_args: list[str] | None = None) -> None:
        """Starts the process; `wait_ready` waits for it (a cluster's members wait for each other)."""
        self.data_dir = data_dir
        self.amqp_port, self.http_port = free_port(), free_port()
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        args = [sys.executable, "-m", "maxq_raft", "--data-dir", str(data_dir)]
        args += ["--amqp-port", str(self.amqp_port), "--http-port", str(self.http_port)]
        args += ["--prometheus-port", str(free_port()), "--sqs-port", str(free_port()), *(extra_args or [])]
        self._log = open(self.log_path, "ab")
        # cwd outside the repo: our amqp/ folder must not shadow py-amqp (docs/design.md §1).
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(data_dir.parent))

    def wait_ready(self) -> Node:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while b"maxq-server ready" not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the node did not start:\n{self.log_path.read_text(errors='replace')}")
            time.sleep(0.05)
        return self

    def connect(self, vhost: str = "/", credentials: tuple[str, str] = ("guest", "guest")) -> pika.BlockingConnection:
        params = pika.ConnectionParameters(
            "127.0.0.1", self.amqp_port, vhost, pika.PlainCredentials(*credentials), heartbeat=0
        )
        return pika.BlockingConnection(params)

    def api(self, method: str, path: str, body: object = None) -> object:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        headers = {"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        if response.status >= 300:
            raise SystemExit(f"{method} {path}: {response.status} {raw!r}")
        return json.loads(raw) if raw else None

    def stop(self, how: signal.Signals = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(how)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        self._log.close()


def publish(channel, exchange: str, routing_key: str, bodies: list[str], props=PERSISTENT) -> None:
    for body in bodies:
        channel.basic_publish(exchange, routing_key, body.encode(), props, mandatory=False)


def write_workload(node: Node, clustered: bool) -> dict:
    """Everything the fixture holds; returns the expectations for the manifest."""
    node.api("PUT", "/api/vhosts/upgrade", {})
    node.api("PUT", "/api/users/alice", {"password": ALICE[1], "tags": "management"})
    node.api("PUT", "/api/permissions/upgrade/alice", {"configure": ".*", "write": ".*", "read": ".*"})
    node.api("PUT", "/api/permissions/%2F/alice", {"configure": "^alice-", "write": ".*", "read": "^q\\."})
    node.api(
        "PUT",
        "/api/policies/%2F/bounded",
        # Nothing that runs out with time: a fixture is opened months later (a message TTL of an hour
        # expired the messages of the first fixtures an hour after they were made).
        {"pattern": "^policy\\.", "apply-to": "queues", "definition": {"max-length": 1000}, "priority": 1},
    )
    queues: dict[str, dict] = {}

    def expect(name: str, bodies: list[str], *, ordered: bool = True, vhost: str = "/", **more) -> None:
        queues[name] = {"vhost": vhost, "bodies": bodies, "ordered": ordered, **more}

    connection = node.connect()
    ch = connection.channel()
    ch.confirm_delivery()
    for name, kind, args in [
        ("ex.direct", "direct", {}),
        ("ex.topic", "topic", {}),
        ("ex.fanout", "fanout", {}),
        ("ex.headers", "headers", {}),
        ("ex.ae", "fanout", {}),
        ("ex.with-ae", "direct", {"alternate-exchange": "ex.ae"}),
        ("ex.inner", "topic", {}),
        ("ex.delayed", "x-delayed-message", {"x-delayed-type": "direct"}),
    ]:
        ch.exchange_declare(name, kind, durable=True, arguments=args)
    ch.exchange_bind("ex.inner", "ex.topic", "e2e.#")

    def queue(name: str, **args) -> None:
        ch.queue_declare(name, durable=True, arguments=args or None)

    queue("q.plain")
    ch.queue_bind("q.plain", "ex.direct", "plain")
    bodies = [f"plain-{i}" for i in range(50)]
    publish(ch, "ex.direct", "plain", bodies)
    expect("q.plain", bodies)

    queue("q.topic")
    ch.queue_bind("q.topic", "ex.topic", "a.*.c")
    publish(ch, "ex.topic", "a.b.c", ["topic-0", "topic-1"])
    publish(ch, "ex.topic", "a.b.d", ["not-routed"])
    queue("q.e2e")
    ch.queue_bind("q.e2e", "ex.inner", "e2e.#")
    publish(ch, "ex.topic", "e2e.x.y", ["e2e-0"])
    expect("q.topic", ["topic-0", "topic-1"])
    expect("q.e2e", ["e2e-0"])

    for name in ("q.fanout1", "q.fanout2"):
        queue(name)
        ch.queue_bind(name, "ex.fanout", "")
    publish(ch, "ex.fanout", "ignored", ["fan-0", "fan-1", "fan-2"])
    expect("q.fanout1", ["fan-0", "fan-1", "fan-2"])
    expect("q.fanout2", ["fan-0", "fan-1", "fan-2"])

    queue("q.headers")
    ch.queue_bind("q.headers", "ex.headers", "", arguments={"x-match": "all", "kind": "h"})
    publish(ch, "ex.headers", "", ["hdr-0"], pika.BasicProperties(delivery_mode=2, headers={"kind": "h"}))
    publish(ch, "ex.headers", "", ["hdr-miss"], pika.BasicProperties(delivery_mode=2, headers={"kind": "x"}))
    expect("q.headers", ["hdr-0"])

    queue("q.ae")
    ch.queue_bind("q.ae", "ex.ae", "")
    publish(ch, "ex.with-ae", "nobody-binds-this", ["ae-0", "ae-1"])
    expect("q.ae", ["ae-0", "ae-1"])

    queue("q.priority", **{"x-max-priority": 9})
    sent = [(p, f"prio-{p}-{i}") for i in range(3) for p in (1, 9, 5, 0)]
    for priority, body in sent:
        ch.basic_publish("", "q.priority", body.encode(), pika.BasicProperties(delivery_mode=2, priority=priority))
    # Highest priority first, first in first out within one (a stable sort of the publish order).
    expect("q.priority", [body for _, body in sorted(sent, key=lambda pb: -pb[0])])

    queue("q.dlq")
    queue("q.rejectme", **{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "q.dlq"})
    publish(ch, "", "q.rejectme", ["dead-0", "dead-1", "kept-0"])
    for _ in range(2):
        method, _props, _body = ch.basic_get("q.rejectme")
        ch.basic_reject(method.delivery_tag, requeue=False)
    expect("q.rejectme", ["kept-0"])
    expect("q.dlq", ["dead-0", "dead-1"], x_death={"queue": "q.rejectme", "reason": "rejected"})

    queue("q.maxlen", **{"x-max-length": 5})
    publish(ch, "", "q.maxlen", [f"len-{i}" for i in range(8)])
    expect("q.maxlen", [f"len-{i}" for i in range(3, 8)])

    queue("q.dedup", **{"x-message-deduplication": True, "x-cache-size": 100})
    for i in range(10):
        props = pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": f"d{i}"})
        ch.basic_publish("", "q.dedup", f"dedup-{i}".encode(), props)
    ch.basic_publish(
        "", "q.dedup", b"dup", pika.BasicProperties(delivery_mode=2, headers={"x-deduplication-header": "d4"})
    )
    expect("q.dedup", [f"dedup-{i}" for i in range(10)], dedup_known_ids=["d0", "d4", "d9"])

    queue("q.quorum", **{"x-queue-type": "quorum"})
    publish(ch, "", "q.quorum", ["quorum-0", "quorum-1", "quorum-2"])
    expect("q.quorum", ["quorum-0", "quorum-1", "quorum-2"])

    queue("q.transient-messages")
    publish(ch, "", "q.transient-messages", ["transient-0"], TRANSIENT)
    publish(ch, "", "q.transient-messages", ["persistent-0"])
    if clustered:  # every message is in the Raft log, as every message of a quorum queue is stored
        expect("q.transient-messages", ["transient-0", "persistent-0"])
    else:  # a transient message does not outlive its node
        expect("q.transient-messages", ["persistent-0"])

    queue("policy.q")
    publish(ch, "", "policy.q", ["policy-0"])
    expect("policy.q", ["policy-0"])

    queue("q.unacked")
    publish(ch, "", "q.unacked", [f"unacked-{i}" for i in range(5)])
    expect("q.unacked", [f"unacked-{i}" for i in range(5)], redelivered=True)

    alice = node.connect("upgrade", ALICE)
    ach = alice.channel()
    ach.confirm_delivery()
    ach.queue_declare("q.v2", durable=True)
    publish(ach, "", "q.v2", ["v2-0", "v2-1", "v2-2"])
    alice.close()
    expect("q.v2", ["v2-0", "v2-1", "v2-2"], vhost="upgrade", user=ALICE[0], password=ALICE[1])

    # Deliveries left unacked when the node stops: a later version must redeliver them.
    holder = node.connect()
    hch = holder.channel()
    hch.basic_qos(prefetch_count=10)
    got: list[bytes] = []
    hch.basic_consume("q.unacked", lambda _c, _m, _p, body: got.append(body), auto_ack=False)
    deadline = time.monotonic() + 10
    while len(got) < 5 and time.monotonic() < deadline:
        holder.process_data_events(time_limit=0.1)
    if len(got) != 5:
        raise SystemExit(f"q.unacked: {len(got)} of 5 deliveries before the stop")
    definitions = node.api("GET", "/api/definitions")
    connection.close()
    # The holder is returned so that its connection (and its unacked deliveries) lives until the stop.
    return {"queues": queues, "definitions": definitions, "holder": holder}


MEMBERS = ["n1", "n2", "n3"]
SHARDS = 2
SNAPSHOT_EVERY_MB = "0.005"  # small: the folders hold group snapshots as well as Raft logs
CLUSTER_SECRET = "upgrade-fixture"


def member_args(name: str, raft_ports: dict[str, int]) -> list[str]:
    args = ["--node-id", name, "--raft-addr", f"127.0.0.1:{raft_ports[name]}", "--cluster-secret", CLUSTER_SECRET]
    args += ["--shards", str(SHARDS), "--snapshot-every-mb", SNAPSHOT_EVERY_MB]
    for peer, port in raft_ports.items():
        if peer != name:
            args += ["--peer", f"{peer}@127.0.0.1:{port}"]
    return args


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def formats() -> dict[str, object]:
    """The on-disk format versions this code writes, recorded beside the folder."""
    from maxq_raft.machines import snapshot as queue_snapshot
    from maxq_raft.server import cluster_snapshot, metadata_snapshot
    from maxq_raft.storage import rocks

    return {
        "store": rocks.FORMAT_VERSION.decode(),
        "queue_snapshot": queue_snapshot.FORMAT_VERSION,
        "metadata_snapshot": metadata_snapshot.FORMAT_VERSION,
        "group_snapshot": cluster_snapshot.FORMAT_VERSION,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "upgrade" / "fixtures")
    parser.add_argument("--name", help="file name without extension (default single-node-<version>-<date>-<stop>)")
    parser.add_argument(
        "--kill",
        action="store_true",
        help="stop the node with SIGKILL instead of SIGTERM: the folder is then as a crash leaves it (the "
        "messages in RocksDB's write-ahead log, not yet flushed to its tables)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help=f"a 3-member cluster ({', '.join(MEMBERS)}, --shards {SHARDS}, a group snapshot every few KB): the "
        "archive holds a folder per member, the workload goes through n1",
    )
    parser.add_argument(
        "--commit",
        help="the commit whose code makes the folder, recorded in the .json (default: this checkout's HEAD); "
        "run an earlier commit's code with PYTHONPATH naming its package folder",
    )
    options = parser.parse_args()
    from maxq_raft import __version__

    today = datetime.date.today().isoformat()
    stopped = "killed" if options.kill else "stopped"
    name = options.name or f"{'cluster' if options.cluster else 'single-node'}-{__version__}-{today}-{stopped}"
    options.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="maxq-fixture-") as tmp:
        root = Path(tmp)
        if options.cluster:
            raft_ports = {member: free_port() for member in MEMBERS}
            nodes = [Node(root / member, member_args(member, raft_ports)) for member in MEMBERS]
        else:
            nodes = [Node(root / "data")]
        try:
            for node in nodes:
                node.wait_ready()
            written = write_workload(nodes[0], options.cluster)
        finally:
            # The unacked holder's connection is still open: as at a real upgrade (or crash).
            for node in nodes:
                node.stop(signal.SIGKILL if options.kill else signal.SIGTERM)
        with tarfile.open(options.out / f"{name}.tar.gz", "w:gz") as tar:
            for node in nodes:
                # (a single node's folder is the archive's root, a member's is its name)
                top = node.data_dir if not options.cluster else root
                for path in sorted(node.data_dir.rglob("*")):
                    if path.is_file() and not path.name.startswith("LOG") and path.name != "LOCK":
                        tar.add(path, arcname=str(path.relative_to(top)))
    manifest = {
        "made_by": {
            "version": __version__,
            "commit": options.commit or git_commit(),
            "date": today,
            "stopped_by": "SIGKILL" if options.kill else "SIGTERM",
        },
        "formats": formats(),
        "members": MEMBERS if options.cluster else [],
        "queues": written["queues"],
        "definitions": written["definitions"],
    }
    (options.out / f"{name}.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {options.out / (name + '.tar.gz')} and {name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
