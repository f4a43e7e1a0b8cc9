"""Message trace (x-trace) on a real 3-node cluster: the records are derived from the replicated
log on every member, so a message routed to two queues (one acked, one dead-lettered) has the
same trace on each member, and `maxqctl trace` on a survivor reads all of it after the member
the client used was killed (server/tracer.py, docs/queue-features.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pika

from ..helpers import GUEST_AUTH, wait_until

MAXQCTL = str(Path(sys.executable).parent / "maxqctl")


def maxqctl(member, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MAXQCTL, "--node", f"127.0.0.1:{member.http_port}", *args], capture_output=True, text=True, timeout=30
    )


def put_policy(member, name: str, body: dict) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{member.http_port}/api/policies/%2F/{name}",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={**GUEST_AUTH, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (201, 204)


def test_trace_read_on_a_survivor_after_the_publishers_member_was_killed(cluster):
    n1, n2, n3 = cluster["n1"], cluster["n2"], cluster["n3"]
    put_policy(n1, "trace-all", {"pattern": "^traced-", "definition": {"trace": True}, "apply-to": "queues"})
    conn = n1.connect(socket_timeout=10)
    channel = conn.channel()
    channel.exchange_declare("trace-fanout", "fanout")
    channel.exchange_declare("trace-dlx", "fanout")
    channel.queue_declare("traced-acked", durable=True)
    channel.queue_declare("traced-rejected", durable=True, arguments={"x-dead-letter-exchange": "trace-dlx"})
    channel.queue_declare("traced-dead", durable=True)
    channel.queue_bind("traced-acked", "trace-fanout")
    channel.queue_bind("traced-rejected", "trace-fanout")
    channel.queue_bind("traced-dead", "trace-dlx")
    for queue in ("traced-acked", "traced-rejected", "traced-dead"):
        assert wait_until(lambda q=queue: n1.admin(f"/api/queues/%2F/{q}")["trace"], 10), queue
    channel.confirm_delivery()
    props = pika.BasicProperties(message_id="order-42", correlation_id="corr-42", delivery_mode=2)
    channel.basic_publish("trace-fanout", "orders", b"payload", props)
    method, _, _ = wait_until(lambda: (got := channel.basic_get("traced-acked"))[0] and got, 10)
    channel.basic_ack(method.delivery_tag)
    method, _, _ = wait_until(lambda: (got := channel.basic_get("traced-rejected"))[0] and got, 10)
    channel.basic_reject(method.delivery_tag, requeue=False)
    conn.close()

    def complete(member) -> list | None:
        records = member.admin("/api/trace/%2F?message_id=order-42")
        return records if any(r["queue"] == "traced-dead" and r["event"] == "enqueued" for r in records) else None

    def once(records: list) -> list:
        """Without a dead letter's repeated copies: dead-lettering is at-least-once. If n1 led
        traced-rejected's group and dies after the copy's commit but before the source's
        `DeadLettered`, the next leader performs it again after DEAD_LETTER_STALE_MS
        (server/dead_letter.py), and every member then holds a second `enqueued` in traced-dead
        (read in the code as the cause of one CI failure of this test; not reproduced here)."""
        seen = False
        out = []
        for r in records:
            if r["queue"] == "traced-dead" and r["event"] == "enqueued":
                if seen:
                    continue
                seen = True
            out.append(r)
        return out

    on_n1 = wait_until(lambda: complete(n1), 15)
    assert on_n1, n1.admin("/api/trace/%2F?message_id=order-42")
    n1.kill()

    result = wait_until(lambda: (r := maxqctl(n2, "trace", "order-42", "--json")).returncode == 0 and r, 10)
    assert result, result.stderr
    on_n2 = once(json.loads(result.stdout))
    assert on_n2 == on_n1, "every member holds the same records"
    assert once(wait_until(lambda: complete(n3), 10)) == on_n1

    def events(queue: str) -> list[str]:
        return [r["event"] for r in on_n2 if r["queue"] == queue]

    assert events("traced-acked") == ["published", "enqueued", "delivered", "acked"]
    assert events("traced-rejected") == ["published", "enqueued", "delivered", "rejected", "dead-lettered"]
    assert events("traced-dead") == ["enqueued"]
    published = [r for r in on_n2 if r["event"] == "published"]
    assert all(r["connection"].startswith("n1@") and r["user"] == "guest" for r in published)
    assert all(sorted(r["routed_queues"]) == ["traced-acked", "traced-rejected"] for r in published)
    dead = next(r for r in on_n2 if r["event"] == "dead-lettered")
    assert dead["reason"] == "rejected" and dead["exchange"] == "trace-dlx"

    table = maxqctl(n3, "trace", "order-42")
    on_n3 = complete(n3)
    assert table.returncode == 0 and len(table.stdout.splitlines()) in (1 + len(on_n1), 1 + len(on_n3)), table.stdout
    by_correlation = maxqctl(n3, "trace", "--correlation-id", "corr-42", "--json")
    assert once(json.loads(by_correlation.stdout)) == on_n1
    by_queue = maxqctl(n2, "trace", "--queue", "traced-acked", "--since", "10m", "--json")
    assert [r["event"] for r in json.loads(by_queue.stdout)] == ["published", "enqueued", "delivered", "acked"]

    # The killed member comes back: it replays its log over the trace it kept, and holds the
    # same records as a member that never stopped, none twice (trace_store.py: a replayed row
    # is skipped).
    cluster["n1"].launch()
    cluster["n1"].wait_ready(60)
    after = wait_until(lambda: (records := complete(n1)) is not None and records == complete(n2) and records, 20)
    if not after:
        after, survivor = n1.admin("/api/trace/%2F?message_id=order-42"), complete(n2) or []
        gone = [r for r in survivor if r not in after]
        extra = [r for r in after if r not in survivor]
        raise AssertionError(f"n1 after its restart, against n2: missing {gone}, extra {extra}")
    assert once(after) == on_n1
