"""Read-your-writes across members: what a client saw declared on one member, another member
acts on at once, as RabbitMQ's cluster-wide metadata transactions give (server/metadata_sync.py),
over AMQP, the admin API and the SQS API, for objects and for users, vhosts, permissions and keys.

A member applies the metadata log a moment after the member that answered the declare. Here
that moment is made long: the member the client uses next is stopped (SIGSTOP) while another
member declares, and continued once the client's next method is on its way, so that it reads
that method and the metadata leader's appends at the same time. Before the barrier, it read the
method first: the publish was returned unroutable, the consume refused with 404."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pika
import pika.exceptions
import pytest

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import PROTOCOL_HEADER, encode_method_frame

from ..helpers import api
from ..integration.test_sqs import client as sqs_client
from ..raw_client import RawClient
from .conftest import Cluster, Member, running_cluster

STOPPED_S = 0.3  # how long the acting member stays stopped after the client's method was sent


@pytest.fixture
def trio_cluster(tmp_path):
    with running_cluster(tmp_path) as c:
        yield c


def while_stopped(
    cluster: Cluster,
    declare: Callable[[Member], None],
    act: Callable[[Member, threading.Event, threading.Event], Any],
) -> Any:
    """Run `declare(member)` through one member while another (neither leads the metadata group)
    is stopped, then let `act(member, ready, go)` go on in a thread against the stopped one, which
    is continued once `act` is under way. `act` sets `ready` when connected and waits for `go`.
    Returns what `act` returned or raised."""
    leader = cluster.leader_of("meta")
    acting, declaring = [m for name, m in cluster.members.items() if name != leader][:2]
    ready, go = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = act(acting, ready, go)
        except Exception as exc:
            outcome["result"] = exc
        ready.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    acting.proc.send_signal(signal.SIGSTOP)
    try:
        declare(declaring)
        go.set()
        time.sleep(STOPPED_S)
    finally:
        acting.proc.send_signal(signal.SIGCONT)
    thread.join(30)
    assert not thread.is_alive()
    return outcome["result"]


def declare_then_act(
    cluster: Cluster, declare: Callable[[Any], None], act: Callable[[Any], Any], confirm: bool = False
) -> Any:
    """`while_stopped` over AMQP: `declare(channel)`, then `act(channel)` on a channel opened
    (in confirm mode if `confirm`) before the acting member was stopped."""

    def declare_on(member: Member) -> None:
        with member.connect() as conn:
            declare(conn.channel())

    def act_on(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        conn = member.connect(heartbeat=0)
        try:
            channel = conn.channel()
            if confirm:
                channel.confirm_delivery()
            ready.set()
            go.wait(30)
            return act(channel)
        finally:
            try:
                conn.close()
            except Exception:
                pass

    return while_stopped(cluster, declare_on, act_on)


def messages_in(member: Member, queue: str) -> int:
    with member.connect() as conn:
        return conn.channel().queue_declare(queue, passive=True).method.message_count


def test_a_publish_right_after_a_declare_on_another_member_is_routed(trio_cluster: Cluster) -> None:
    def publish(channel) -> str:
        channel.basic_publish("", "fresh", b"x", mandatory=True)
        return "confirmed"

    result = declare_then_act(trio_cluster, lambda ch: ch.queue_declare("fresh"), publish, confirm=True)
    assert result == "confirmed", repr(result)
    assert messages_in(trio_cluster["n1"], "fresh") == 1


def test_a_publish_to_an_exchange_just_declared_elsewhere_reaches_its_bound_queue(trio_cluster: Cluster) -> None:
    def declare(channel) -> None:
        channel.exchange_declare("fresh-x", "fanout")
        channel.queue_declare("bound")
        channel.queue_bind("bound", "fresh-x")

    def publish(channel) -> str:
        channel.basic_publish("fresh-x", "", b"x", mandatory=True)
        return "confirmed"

    result = declare_then_act(trio_cluster, declare, publish, confirm=True)
    assert result == "confirmed", repr(result)
    assert messages_in(trio_cluster["n1"], "bound") == 1


def test_a_consume_and_a_get_right_after_a_declare_elsewhere_find_the_queue(trio_cluster: Cluster) -> None:
    def declare(channel) -> None:
        channel.queue_declare("fresh-c")
        channel.queue_declare("fresh-g")
        channel.basic_publish("", "fresh-g", b"got")

    def consume_and_get(channel) -> tuple:
        tag = channel.basic_consume("fresh-c", lambda *_: None)
        method, _props, body = channel.basic_get("fresh-g", auto_ack=True)
        return tag, body

    result = declare_then_act(trio_cluster, declare, consume_and_get)
    assert isinstance(result, tuple), repr(result)
    assert result[1] == b"got"


def test_a_delete_right_after_a_declare_elsewhere_deletes_the_queue(trio_cluster: Cluster) -> None:
    result = declare_then_act(trio_cluster, lambda ch: ch.queue_declare("doomed"), lambda ch: ch.queue_delete("doomed"))
    assert not isinstance(result, Exception), repr(result)
    with trio_cluster["n1"].connect() as conn, pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        conn.channel().queue_declare("doomed", passive=True)
    assert closed.value.reply_code == 404


def test_a_transaction_committed_right_after_a_declare_elsewhere_is_routed(trio_cluster: Cluster) -> None:
    def commit(channel) -> str:
        channel.tx_select()
        channel.basic_publish("", "fresh-t", b"x")
        channel.tx_commit()
        return "committed"

    result = declare_then_act(trio_cluster, lambda ch: ch.queue_declare("fresh-t"), commit)
    assert result == "committed", repr(result)
    assert messages_in(trio_cluster["n1"], "fresh-t") == 1


def test_a_publish_nothing_routes_is_still_returned(trio_cluster: Cluster) -> None:
    # After the barrier a route still empty is what it was: returned (mandatory) and confirmed.
    def publish(channel) -> str:
        channel.basic_publish("", "never-declared", b"x", mandatory=True)
        return "confirmed"

    result = declare_then_act(trio_cluster, lambda ch: ch.queue_declare("other"), publish, confirm=True)
    assert isinstance(result, pika.exceptions.UnroutableError), repr(result)


def test_an_sqs_send_right_after_a_create_queue_on_another_member_finds_the_queue(trio_cluster: Cluster) -> None:
    status, key, _ = api(trio_cluster["n1"], "POST", "/api/users/guest/access-keys")
    assert status == 201, key
    keys = key["access_key_id"], key["secret_access_key"]

    def create(member: Member) -> None:
        sqs_client(member, *keys).create_queue(QueueName="made-elsewhere")

    def send(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        sqs = sqs_client(member, *keys)
        ready.set()
        go.wait(30)
        url = sqs.get_queue_url(QueueName="made-elsewhere")["QueueUrl"]
        return sqs.send_message(QueueUrl=url, MessageBody="hello")

    result = while_stopped(trio_cluster, create, send)
    assert isinstance(result, dict) and "MessageId" in result, repr(result)
    assert messages_in(trio_cluster["n1"], "made-elsewhere") == 1


def declare_bound_queue(member: Member) -> None:
    with member.connect() as conn:
        channel = conn.channel()
        channel.exchange_declare("made-x", "fanout")
        channel.queue_declare("made-q")
        channel.queue_bind("made-q", "made-x")


def test_a_management_get_right_after_a_declare_elsewhere_finds_the_queue(trio_cluster: Cluster) -> None:
    def look(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        ready.set()
        go.wait(30)
        return api(member, "GET", "/api/queues/%2F/made-q")[:2]

    result = while_stopped(trio_cluster, declare_bound_queue, look)
    assert not isinstance(result, Exception), repr(result)
    status, shown = result
    assert status == 200 and shown["name"] == "made-q", result


def test_a_management_publish_right_after_a_declare_elsewhere_is_routed(trio_cluster: Cluster) -> None:
    def publish(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        ready.set()
        go.wait(30)
        body = {"properties": {}, "routing_key": "", "payload": "hi", "payload_encoding": "string"}
        return api(member, "POST", "/api/exchanges/%2F/made-x/publish", body)[:2]

    result = while_stopped(trio_cluster, declare_bound_queue, publish)
    assert result == (200, {"routed": True}), repr(result)
    assert messages_in(trio_cluster["n1"], "made-q") == 1


@pytest.mark.parametrize("request_kind", ["delete", "bind"])
def test_a_management_delete_or_binding_right_after_a_declare_elsewhere_acts_on_the_objects(
    trio_cluster: Cluster, request_kind: str
) -> None:
    def change(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        ready.set()
        go.wait(30)
        if request_kind == "delete":
            return api(member, "DELETE", "/api/queues/%2F/made-q")[0]
        return api(member, "POST", "/api/bindings/%2F/e/made-x/q/made-q", {"routing_key": "k"})[0]

    result = while_stopped(trio_cluster, declare_bound_queue, change)
    if request_kind == "delete":
        assert result == 204, repr(result)
        with trio_cluster["n1"].connect() as conn, pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            conn.channel().queue_declare("made-q", passive=True)
        assert closed.value.reply_code == 404
    else:
        assert result == 201, repr(result)
        status, bindings, _ = api(trio_cluster["n1"], "GET", "/api/bindings/%2F/e/made-x/q/made-q")
        assert status == 200 and sorted(b["routing_key"] for b in bindings) == ["k", "made-q"], bindings


# Users, vhosts, permissions and access keys: what a provisioning script made through one member,
# the client it started next presents to another at once (behind a load balancer, say). Before the
# barrier the login was refused (403), the vhost not found (530), the admin API answered 401 and
# the SQS API InvalidClientTokenId.


def provision(member: Member, user: str, vhost: str) -> None:
    """Through `member`'s admin API: `vhost`, and `user` (password "pw", administrator) with every
    permission in it (as guest; whichever of them exist already are left as they are)."""
    status, body, _ = api(member, "PUT", f"/api/vhosts/{quote(vhost, safe='')}")
    assert status in (201, 204), body
    if user != "guest":
        status, body, _ = api(member, "PUT", f"/api/users/{user}", {"password": "pw", "tags": "administrator"})
        assert status == 201, body
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    status, body, _ = api(member, "PUT", f"/api/permissions/{quote(vhost, safe='')}/{user}", everything)
    assert status in (201, 204), body


def pipelined_handshake(user: str, password: str, vhost: str) -> bytes:
    """Everything a client sends up to connection.open, sent at once: the member reads the login
    and the open with the metadata leader's appends when it is continued."""
    start_ok = spec.ConnectionStartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN",
        response=b"\x00" + user.encode() + b"\x00" + password.encode(),
        locale="en_US",
    )
    return b"".join(
        (
            PROTOCOL_HEADER,
            encode_method_frame(0, start_ok),
            encode_method_frame(0, spec.ConnectionTuneOk(channel_max=2047, frame_max=131072, heartbeat=0)),
            encode_method_frame(0, spec.ConnectionOpen(virtual_host=vhost)),
        )
    )


@pytest.mark.parametrize("made", ["user", "vhost"])
def test_a_login_and_an_open_right_after_a_user_or_vhost_made_elsewhere_are_let_in(
    trio_cluster: Cluster, made: str
) -> None:
    user, password, vhost = ("ann", "pw", "/") if made == "user" else ("guest", "guest", "fresh-vhost")

    def connect(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        client = RawClient(member.amqp_port)
        try:
            ready.set()
            go.wait(30)
            client.send(pipelined_handshake(user, password, vhost))
            return [type(frame[2]).__name__ if frame else None for frame in (client.next_frame() for _ in range(3))]
        finally:
            client.close()

    result = while_stopped(trio_cluster, lambda member: provision(member, user, vhost), connect)
    assert result == ["ConnectionStart", "ConnectionTune", "ConnectionOpenOk"], repr(result)


def test_a_login_still_wrong_after_the_barrier_is_refused(trio_cluster: Cluster) -> None:
    def connect(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        client = RawClient(member.amqp_port)
        try:
            ready.set()
            go.wait(30)
            client.send(pipelined_handshake("ann", "not-the-password", "/"))
            client.expect(spec.ConnectionStart)
            return client.next_frame()
        finally:
            client.close()

    result = while_stopped(trio_cluster, lambda member: provision(member, "ann", "/"), connect)
    assert result is not None and isinstance(result[2], spec.ConnectionClose), repr(result)
    assert result[2].reply_code == spec.ACCESS_REFUSED, result


def test_an_admin_request_by_a_user_just_added_elsewhere_is_let_in(trio_cluster: Cluster) -> None:
    def look(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        ready.set()
        go.wait(30)
        return api(member, "GET", "/api/vhosts/fresh-vhost", auth=("ops", "pw"))[:2]

    result = while_stopped(trio_cluster, lambda member: provision(member, "ops", "fresh-vhost"), look)
    assert not isinstance(result, Exception), repr(result)
    status, shown = result
    assert status == 200 and shown["name"] == "fresh-vhost", result
    # and a wrong password is still refused, after its barrier
    assert api(trio_cluster["n2"], "GET", "/api/overview", auth=("ops", "wrong"))[0] == 401


def test_an_sqs_request_with_a_key_just_made_elsewhere_is_let_in(trio_cluster: Cluster) -> None:
    made: dict[str, tuple[str, str]] = {}

    def make_key(member: Member) -> None:
        status, key, _ = api(member, "POST", "/api/users/guest/access-keys")
        assert status == 201, key
        made["keys"] = key["access_key_id"], key["secret_access_key"]

    def list_queues(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        ready.set()
        go.wait(30)
        return sqs_client(member, *made["keys"]).list_queues()

    result = while_stopped(trio_cluster, make_key, list_queues)
    assert isinstance(result, dict) and "ResponseMetadata" in result, repr(result)


@pytest.mark.parametrize("path", ["/api/users/kay/access-keys", "/api/user-limits/kay/max-connections"])
def test_an_admin_change_for_a_user_just_added_elsewhere_finds_the_user(trio_cluster: Cluster, path: str) -> None:
    def change(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        ready.set()
        go.wait(30)
        if path.endswith("access-keys"):
            return api(member, "POST", path)[:2]
        return api(member, "PUT", path, {"value": 10})[:2]

    result = while_stopped(trio_cluster, lambda member: provision(member, "kay", "/"), change)
    assert not isinstance(result, Exception), repr(result)
    assert result[0] in (201, 204), result


def test_a_declare_right_after_its_permission_was_widened_elsewhere_is_let_in(trio_cluster: Cluster) -> None:
    # "app" may do nothing in "/" at first, everywhere; its permissions are widened through one
    # member while its connection to another waits to declare (RabbitMQ caches no refusal).
    nothing = {"configure": "^$", "write": "^$", "read": "^$"}
    assert api(trio_cluster["n1"], "PUT", "/api/users/app", {"password": "pw", "tags": ""})[0] == 201
    assert api(trio_cluster["n1"], "PUT", "/api/permissions/%2F/app", nothing)[0] == 201
    credentials = pika.PlainCredentials("app", "pw")
    for member in trio_cluster.members.values():  # (each has applied both before the test goes on)
        deadline = time.monotonic() + 30
        while True:
            try:
                member.connect(credentials=credentials).close()
                break
            except pika.exceptions.AMQPConnectionError:
                assert time.monotonic() < deadline, member.name
                time.sleep(0.1)

    def widen(member: Member) -> None:
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        assert api(member, "PUT", "/api/permissions/%2F/app", everything)[0] == 204

    def declare(member: Member, ready: threading.Event, go: threading.Event) -> Any:
        with member.connect(credentials=credentials, heartbeat=0) as conn:
            channel = conn.channel()
            ready.set()
            go.wait(30)
            channel.queue_declare("app-q")
            channel.confirm_delivery()
            channel.basic_publish("", "app-q", b"x")
            return "declared and published"

    result = while_stopped(trio_cluster, widen, declare)
    assert result == "declared and published", repr(result)
    assert messages_in(trio_cluster["n1"], "app-q") == 1
