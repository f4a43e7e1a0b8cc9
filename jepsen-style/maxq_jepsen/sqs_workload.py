"""The SQS workload: boto3 senders and receivers against the members' SQS endpoints (issue #18).

Theory of operation: the same history vocabulary as the AMQP workload (workload.py), so that the
same checker judges it. A sender's message id is "<process>-<n>", written at the head of the
body (SQS chooses its own MessageId; the body is what both sides can name). SendMessage and
SendMessageBatch (the choice and the batch size are seeded) record `invoke` per message before
the request, then `ok` on HTTP 200 (per Successful entry of a batch), `info` for a Failed entry
or for any exception (a timeout, a connection lost, a 5xx: the message may have been enqueued).
Nothing is ever recorded `fail`: this endpoint gives no answer that proves a message was not
enqueued that we can tell apart from one that may have been.

A receiver long-polls ReceiveMessage(10, WaitTimeSeconds=1, VisibilityTimeout=V), records each
message as f="deliver" with `value.receive_invoke` (the time the receive was invoked: the
checker's "received after deleted" rule needs the earliest moment the broker could have picked
the message) and `value.receive_count` (ApproximateReceiveCount; redelivered = count > 1). Then
it deletes most of them (DeleteMessageBatch, sometimes DeleteMessage one by one) and, with the
seeded probability `abandon_ratio`, leaves one alone so that its visibility runs out and it is
received again. A delete records `invoke` and `ok`/`info` with the receive it answers
(`value.receive_invoke`): an HTTP 200 to a DeleteMessage with a receipt handle that is no longer
the latest deletes nothing (SQS's rule), and the checker decides from these times whether the
handle was certainly the latest.

Sessions: as in workload.py, a worker talks to one node per session (its thread inside the node's
namespace in the netns lab) and moves to another node after any error. Every request has a
timeout (botocore's connect/read timeouts), botocore retries are off (a retry would be a second
send the history does not show), sessions and time are bounded.

`setup` makes guest's access key through the admin API and creates the queue through SQS;
`drain` receives and deletes until every node shows the queue empty (ready, in flight, delayed).
"""

from __future__ import annotations

import base64
import json
import random
import threading
import time
import urllib.request
import zlib
from urllib.parse import quote

import boto3
from botocore.config import Config

from .history import INFO, INVOKE, OK, HistoryWriter
from .workload import SESSIONS_MAX, WorkloadConfig, message_body, no_enter

RECEIVE_WAIT_S = 1
REQUEST_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 2.0
BATCH_MAX = 10
DRAIN_VISIBILITY_S = 60  # the drain deletes within it: its deletes are certain
DRAIN_EMPTY_ROUNDS = 3
SETUP_TIMEOUT_S = 30.0
REGION = "us-east-1"


def sqs_client(endpoint: str, key: tuple[str, str]):
    config = Config(
        retries={"total_max_attempts": 1, "mode": "standard"},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=REQUEST_TIMEOUT_S + RECEIVE_WAIT_S,
        max_pool_connections=2,
    )
    return boto3.session.Session().client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=key[0],
        aws_secret_access_key=key[1],
        config=config,
    )


def queue_url(endpoint: str, queue: str) -> str:
    return f"{endpoint}/{quote('/', safe='')}/{quote(queue, safe='')}"


def body_text(message_id: str, seed: int, size_bytes: int) -> str:
    """The AMQP workload's body made text (SQS bodies are Unicode): the id, then base64 filler."""
    raw = message_body(message_id, seed, size_bytes)
    head = f"{message_id} seed={seed} "
    return head + base64.b64encode(raw[len(head) :]).decode()


def id_of(body: str) -> str:
    return body.split(" ", 1)[0]


def _text(error: BaseException) -> str:
    return repr(error)[:300]


def setup(lab, config: WorkloadConfig, timeout_s: float = SETUP_TIMEOUT_S) -> tuple[str, str]:
    """guest's access key (made on the first node) and the queue (created through SQS). Retried
    until `timeout_s`: a cluster may still be electing."""
    node = lab.nodes[0]
    deadline = time.monotonic() + timeout_s
    last: BaseException | None = None
    key: tuple[str, str] | None = None
    while time.monotonic() < deadline:
        try:
            with lab.enter(node.name):
                if key is None:
                    request = urllib.request.Request(
                        f"{lab.admin_url(node)}/api/users/guest/access-keys",
                        method="POST",
                        data=b"{}",
                        headers={
                            "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                            "Content-Type": "application/json",
                        },
                    )
                    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
                        made = json.loads(answer.read())
                    key = (made["access_key_id"], made["secret_access_key"])
                client = sqs_client(lab.sqs_url(node), key)
                client.create_queue(
                    QueueName=config.queue, Attributes={"VisibilityTimeout": str(config.visibility_timeout_s)}
                )
                return key
        except Exception as exc:
            last = exc
            time.sleep(0.5)
    raise RuntimeError(f"sqs setup failed within {timeout_s}s: {last!r}")


class SqsWorker(threading.Thread):
    """One client process of the history: sessions (one node each) until stopped."""

    def __init__(
        self,
        process: str,
        history: HistoryWriter,
        nodes: list[tuple[str, str]],
        key: tuple[str, str],
        config: WorkloadConfig,
        seed: int,
        stop: threading.Event,
        hard_deadline: float,
        enter=no_enter,
    ) -> None:
        super().__init__(name=f"jepsen-{process}", daemon=True)
        self.process = process
        self.history = history
        self.nodes = nodes  # (name, endpoint)
        self.key = key
        self.config = config
        self.seed = seed
        self.stop_event = stop
        self.hard_deadline = hard_deadline
        self.rng = random.Random(f"{seed}:{process}")
        self.enter = enter
        self.session = 0
        self.error: BaseException | None = None

    def record(self, type: str, f: str, node: str, **fields) -> None:
        self.history.write(type, f, self.process, session=self.session, node=node, **fields)

    def run(self) -> None:
        try:
            last = None
            while (
                not self.stop_event.is_set() and time.monotonic() < self.hard_deadline and self.session < SESSIONS_MAX
            ):
                self.session += 1
                choices = [n for n in self.nodes if n[0] != last] or self.nodes
                name, endpoint = self.rng.choice(choices)
                with self.enter(name):  # the client's sockets are made in the node's namespace
                    client = sqs_client(endpoint, self.key)
                    url = queue_url(endpoint, self.config.queue)
                    self.record(OK, "connect", name)
                    try:
                        while not self.stop_event.is_set() and time.monotonic() < self.hard_deadline:
                            if not self.step(client, url, name):
                                break
                    finally:
                        client.close()
                last = name
                self.stop_event.wait(self.rng.uniform(*self.config.reconnect_delay_s))
        except BaseException as exc:  # a harness bug: keep it for the runner
            self.error = exc
            self.history.write(INFO, "worker-error", self.process, error=repr(exc))

    def step(self, client, url: str, node: str) -> bool:
        """One request or a few; False ends the session (go to another node)."""
        raise NotImplementedError


class SqsSender(SqsWorker):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seq = 0
        self.next_send = time.monotonic()

    def step(self, client, url: str, node: str) -> bool:
        now = time.monotonic()
        if now < self.next_send:
            self.stop_event.wait(min(0.05, self.next_send - now))
            return True
        if self.seq >= self.config.messages_per_publisher_max:
            self.stop_event.wait(0.1)
            return True
        count = self.rng.randint(2, BATCH_MAX) if self.rng.random() < 0.5 else 1
        interval_s = count / self.config.rate_per_publisher_hz
        self.next_send = max(self.next_send + interval_s * self.rng.uniform(0.5, 1.5), now - 1.0)
        ids = []
        for _ in range(count):
            self.seq += 1
            ids.append(f"{self.process}-{self.seq}")
        bodies = {mid: body_text(mid, self.seed, self.config.body_bytes) for mid in ids}
        for mid in ids:
            self.record(INVOKE, "publish", node, id=mid, crc=zlib.crc32(bodies[mid].encode()))
        try:
            if count == 1:
                client.send_message(QueueUrl=url, MessageBody=bodies[ids[0]])
                self.record(OK, "publish", node, id=ids[0])
                return True
            answer = client.send_message_batch(
                QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": bodies[mid]} for i, mid in enumerate(ids)]
            )
        except Exception as exc:
            for mid in ids:
                self.record(INFO, "publish", node, id=mid, error=_text(exc))
            return False
        done = set()
        for entry in answer.get("Successful", []):
            mid = ids[int(entry["Id"])]
            done.add(mid)
            self.record(OK, "publish", node, id=mid)
        failed = False
        for entry in answer.get("Failed", []):
            mid = ids[int(entry["Id"])]
            done.add(mid)
            failed = True
            self.record(INFO, "publish", node, id=mid, error=f"{entry.get('Code')}: {entry.get('Message')}"[:300])
        for mid in ids:
            if mid not in done:
                self.record(INFO, "publish", node, id=mid, error="no entry in the answer")
        return not failed


class SqsReceiver(SqsWorker):
    def step(self, client, url: str, node: str) -> bool:
        receive_invoke = self.history.now()
        try:
            answer = client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=BATCH_MAX,
                WaitTimeSeconds=RECEIVE_WAIT_S,
                VisibilityTimeout=self.config.visibility_timeout_s,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        except Exception as exc:
            self.record(INFO, "receive", node, error=_text(exc))
            return False
        to_delete = []
        for message in answer.get("Messages", []):
            count = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            mid = id_of(message["Body"])
            abandon = self.rng.random() < self.config.abandon_ratio
            self.record(
                OK,
                "deliver",
                node,
                id=mid,
                redelivered=count > 1,
                crc=zlib.crc32(message["Body"].encode()),
                queue=self.config.queue,
                value={"receive_invoke": receive_invoke, "receive_count": count, "abandoned": abandon},
            )
            if not abandon:
                to_delete.append((mid, message["ReceiptHandle"]))
        if not to_delete:
            return True
        return delete(self, client, url, node, to_delete, receive_invoke, batch=self.rng.random() < 0.7)


def delete(worker, client, url: str, node: str, items, receive_invoke: float, batch: bool) -> bool:
    """Delete (id, receipt handle) pairs, recording each; False after an error."""
    for mid, _ in items:
        worker.record(INVOKE, "delete", node, id=mid, value={"receive_invoke": receive_invoke})
    if not batch:
        for i, (mid, handle) in enumerate(items):
            try:
                client.delete_message(QueueUrl=url, ReceiptHandle=handle)
            except Exception as exc:
                for later, _ in items[i:]:
                    worker.record(INFO, "delete", node, id=later, error=_text(exc))
                return False
            worker.record(OK, "delete", node, id=mid, value={"receive_invoke": receive_invoke})
        return True
    try:
        answer = client.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": str(i), "ReceiptHandle": handle} for i, (_, handle) in enumerate(items)]
        )
    except Exception as exc:
        for mid, _ in items:
            worker.record(INFO, "delete", node, id=mid, error=_text(exc))
        return False
    for entry in answer.get("Successful", []):
        worker.record(OK, "delete", node, id=items[int(entry["Id"])][0], value={"receive_invoke": receive_invoke})
    for entry in answer.get("Failed", []):
        worker.record(INFO, "delete", node, id=items[int(entry["Id"])][0], error=str(entry.get("Code"))[:300])
    return not answer.get("Failed")


class _DrainRecorder:
    """`delete` records through a worker; the drain is process "drain" with a session per node."""

    def __init__(self, history: HistoryWriter) -> None:
        self.history = history
        self.process = "drain"
        self.session = 0

    def record(self, type: str, f: str, node: str, **fields) -> None:
        self.history.write(type, f, self.process, session=self.session, node=node, **fields)


def queue_left(client, url: str) -> int:
    attributes = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    return sum(int(v) for v in attributes.values())


def drain(
    history: HistoryWriter, nodes: list[tuple[str, str]], key, config: WorkloadConfig, timeout_s: float, enter=no_enter
) -> dict:
    """Receive and delete everything from every node until each shows the queue empty (ready, in
    flight and delayed) DRAIN_EMPTY_ROUNDS times in a row; messages in flight to a receiver that
    let them be come back once their visibility runs out, so the drain waits for them (bounded)."""
    recorder = _DrainRecorder(history)
    deadline = time.monotonic() + timeout_s
    history.write(INVOKE, "drain", "drain")
    got = 0
    remaining: int | None = None
    last_error = None
    complete = True
    for name, endpoint in nodes:
        empty = 0
        while time.monotonic() < deadline and empty < DRAIN_EMPTY_ROUNDS:
            recorder.session += 1
            with enter(name):
                client = sqs_client(endpoint, key)
                url = queue_url(endpoint, config.queue)
                try:
                    while time.monotonic() < deadline and empty < DRAIN_EMPTY_ROUNDS:
                        receive_invoke = history.now()
                        answer = client.receive_message(
                            QueueUrl=url,
                            MaxNumberOfMessages=BATCH_MAX,
                            WaitTimeSeconds=RECEIVE_WAIT_S,
                            VisibilityTimeout=DRAIN_VISIBILITY_S,
                            MessageSystemAttributeNames=["ApproximateReceiveCount"],
                        )
                        messages = answer.get("Messages", [])
                        if not messages:
                            remaining = queue_left(client, url)
                            empty = empty + 1 if remaining == 0 else 0
                            continue
                        empty = 0
                        items = []
                        for message in messages:
                            count = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
                            mid = id_of(message["Body"])
                            got += 1
                            recorder.record(
                                OK,
                                "deliver",
                                name,
                                id=mid,
                                redelivered=count > 1,
                                crc=zlib.crc32(message["Body"].encode()),
                                queue=config.queue,
                                value={"receive_invoke": receive_invoke, "receive_count": count},
                            )
                            items.append((mid, message["ReceiptHandle"]))
                        delete(recorder, client, url, name, items, receive_invoke, batch=True)
                except Exception as exc:
                    last_error = _text(exc)
                    remaining = None
                    time.sleep(0.5)
                finally:
                    client.close()
        complete = complete and empty >= DRAIN_EMPTY_ROUNDS
    value = {"remaining": remaining if complete else None, "drained": got}
    if last_error and not complete:
        value["error"] = last_error
    history.write(OK if complete else INFO, "drain", "drain", value=value)
    return value
