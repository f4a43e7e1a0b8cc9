"""Exchanges through pika: declare/delete semantics, the built-in exchanges, routing by type,
exchange-to-exchange bindings and alternate exchanges, each checked against RabbitMQ's replies.

Reply texts are those rabbit_channel / rabbit_exchange / rabbit_misc format (see the notes on
each test); pika hands them over as ChannelClosedByBroker / ConnectionClosedByBroker.
"""

from __future__ import annotations

import uuid

import pika
import pytest
from pika.exceptions import ChannelClosedByBroker

from ..helpers import get_bodies, pump

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------------------- declare


def test_default_exchange_routes_by_queue_name(env):
    channel = env.channel()
    queue = env.queue_name()
    channel.queue_declare(queue)
    channel.basic_publish("", queue, b"hello")
    channel.basic_publish("", "no-such-queue-" + queue, b"dropped")
    method, _props, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"hello"
    assert method.exchange == "" and method.routing_key == queue
    assert channel.basic_get(queue, auto_ack=True) == (None, None, None)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("amq.direct", "direct"),
        ("amq.fanout", "fanout"),
        ("amq.topic", "topic"),
        ("amq.headers", "headers"),
        ("amq.match", "headers"),
    ],
)
def test_builtin_exchanges_exist_with_their_type(env, name, kind):
    channel = env.channel()
    channel.exchange_declare(name, passive=True)
    # Redeclaring with the same properties is allowed even with the reserved prefix
    # (check_name only applies when the exchange is created).
    channel.exchange_declare(name, kind, durable=True)
    other = "fanout" if kind != "fanout" else "direct"
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, other, durable=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' "
        f"in vhost '/': received '{other}' but current is '{kind}'"
    )


def test_passive_declare_of_missing_exchange_is_404(env):
    channel = env.channel()
    name = env.exchange_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, passive=True)
    assert exc.value.reply_code == 404
    assert exc.value.reply_text == f"NOT_FOUND - no exchange '{name}' in vhost '/'"


def test_default_exchange_cannot_be_declared_or_deleted(env):
    connection = env.connect()
    for action in (
        lambda ch: ch.exchange_declare("", "direct"),
        lambda ch: ch.exchange_declare("", passive=True),  # check_not_default_exchange runs for passive too
        lambda ch: ch.exchange_delete(""),
    ):
        channel = connection.channel()
        with pytest.raises(ChannelClosedByBroker) as exc:
            action(channel)
        assert exc.value.reply_code == 403
        assert exc.value.reply_text == "ACCESS_REFUSED - operation not permitted on the default exchange"


def test_durable_equivalence(env):
    channel = env.channel()
    name = env.exchange_name()
    channel.exchange_declare(name, "direct", durable=True)
    channel.exchange_declare(name, "direct", durable=True)  # same: fine
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, "direct", durable=False)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{name}' "
        "in vhost '/': received 'false' but current is 'true'"
    )


def test_type_equivalence(env):
    channel = env.channel()
    name = env.exchange_name()
    channel.exchange_declare(name, "topic")
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, "fanout")
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{name}' "
        "in vhost '/': received 'fanout' but current is 'topic'"
    )


def test_alternate_exchange_argument_equivalence(env):
    channel = env.channel()
    name = env.exchange_name()
    channel.exchange_declare(name, "direct", arguments={"alternate-exchange": "ae-one"})
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, "direct", arguments={"alternate-exchange": "ae-two"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == (
        f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange "
        f"'{name}' in vhost '/': received 'ae-two' but current is 'ae-one'"
    )


def test_reserved_prefix_is_refused(env):
    channel = env.channel()
    name = "amq.test-" + uuid.uuid4().hex[:8]
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, "direct")
    assert exc.value.reply_code == 403
    assert exc.value.reply_text == f"ACCESS_REFUSED - exchange name '{name}' contains reserved prefix 'amq.*'"


def test_unknown_type_is_a_channel_error(env):
    # rabbit_exchange:check_type: since rabbitmq-server#11214 (3.12.x, 3.13.x, 4.x) an unknown
    # type is 406 PRECONDITION_FAILED on the channel, no longer 503 on the whole connection.
    connection = env.connect()
    channel = connection.channel()
    name = env.exchange_name()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, "x-no-such-type")
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - unknown exchange type 'x-no-such-type'"
    assert connection.is_open
    # check_type runs before the lookup, so an existing exchange gets the same answer.
    channel = connection.channel()
    channel.exchange_declare(name, "direct")
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, "x-no-such-type")
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == "PRECONDITION_FAILED - unknown exchange type 'x-no-such-type'"


def test_auto_delete_exchange_goes_with_its_last_binding(env):
    channel = env.channel()
    name = env.exchange_name()
    q1, q2 = env.queue_name(), env.queue_name()
    channel.exchange_declare(name, "direct", auto_delete=True)
    channel.queue_declare(q1)
    channel.queue_declare(q2)
    channel.exchange_declare(name, passive=True)  # never bound: stays
    channel.queue_bind(q1, name, "a")
    channel.queue_bind(q2, name, "b")
    channel.queue_unbind(q1, name, "a")
    channel.exchange_declare(name, passive=True)  # one binding left
    channel.queue_delete(q2)  # deleting the queue removes the last binding
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, passive=True)
    assert exc.value.reply_code == 404


def test_internal_exchange_refuses_publishes_but_routes_from_other_exchanges(env):
    connection = env.connect()
    channel = connection.channel()
    internal, front = env.exchange_name("internal"), env.exchange_name("front")
    queue = env.queue_name()
    channel.exchange_declare(internal, "fanout", internal=True)
    channel.exchange_declare(front, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, internal)
    channel.exchange_bind(destination=internal, source=front)
    channel.basic_publish(front, "", b"via-front")
    assert get_bodies(channel, queue) == [b"via-front"]
    channel.basic_publish(internal, "", b"direct")
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_declare(queue, passive=True)  # the next synchronous call sees the close
    assert exc.value.reply_code == 403
    assert exc.value.reply_text == f"ACCESS_REFUSED - cannot publish to internal exchange '{internal}' in vhost '/'"


# -------------------------------------------------------------------------------- delete


def test_delete_if_unused_refuses_a_bound_exchange(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.exchange_name()
    queue = env.queue_name()
    channel.exchange_declare(name, "direct")
    channel.queue_declare(queue)
    channel.queue_bind(queue, name, "k")
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_delete(name, if_unused=True)
    assert exc.value.reply_code == 406
    assert exc.value.reply_text == f"PRECONDITION_FAILED - exchange '{name}' in vhost '/' in use"
    channel = connection.channel()
    channel.exchange_declare(name, passive=True)
    channel.queue_unbind(queue, name, "k")
    channel.exchange_delete(name, if_unused=True)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_declare(name, passive=True)
    assert exc.value.reply_code == 404


def test_delete_removes_bindings_and_is_idempotent(env):
    channel = env.channel()
    name = env.exchange_name()
    queue = env.queue_name()
    channel.exchange_declare(name, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, name)
    channel.exchange_delete(name)
    channel.exchange_delete(name)  # missing: still delete-ok (rabbit_exchange:ensure_deleted)
    channel.exchange_declare(name, "fanout")  # recreated: the old binding is gone
    channel.basic_publish(name, "", b"nobody")
    assert get_bodies(channel, queue) == []


def test_builtin_exchanges_cannot_be_deleted(env):
    channel = env.channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_delete("amq.direct")
    assert exc.value.reply_code == 403
    assert exc.value.reply_text == "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed"


# ------------------------------------------------------------------------------- routing


def test_topic_routing_with_star_and_hash(env):
    channel = env.channel()
    name = env.exchange_name()
    channel.exchange_declare(name, "topic")
    patterns = {
        "star": "stock.*.nyse",
        "hash": "stock.#",
        "all": "#",
        "exact": "stock.ibm.nyse",
        "two": "*.*",
        "mid": "*.ibm.#",
    }
    queues = {}
    for label, pattern in patterns.items():
        queues[label] = env.queue_name(label)
        channel.queue_declare(queues[label])
        channel.queue_bind(queues[label], name, pattern)
    keys = ["stock.ibm.nyse", "stock.ibm", "stock", "stock.ibm.nyse.extra", "bond.ibm.lse", ""]
    for key in keys:
        channel.basic_publish(name, key, key.encode() or b"<empty>")
    got = {label: get_bodies(channel, queue) for label, queue in queues.items()}
    assert got == {
        "star": [b"stock.ibm.nyse"],
        "hash": [b"stock.ibm.nyse", b"stock.ibm", b"stock", b"stock.ibm.nyse.extra"],
        "all": [b"stock.ibm.nyse", b"stock.ibm", b"stock", b"stock.ibm.nyse.extra", b"bond.ibm.lse", b"<empty>"],
        "exact": [b"stock.ibm.nyse"],
        "two": [b"stock.ibm"],
        "mid": [b"stock.ibm.nyse", b"stock.ibm", b"stock.ibm.nyse.extra", b"bond.ibm.lse"],
    }


def test_headers_exchange_match_kinds(env):
    channel = env.channel()
    name = env.exchange_name()
    channel.exchange_declare(name, "headers")
    bindings = {
        "all": {"x-match": "all", "format": "pdf", "type": "report"},
        "any": {"x-match": "any", "format": "pdf", "type": "report"},
        "default": {"format": "pdf", "type": "report"},  # x-match defaults to all
        "allx": {"x-match": "all-with-x", "x-tenant": "acme", "format": "pdf"},
        "anyx": {"x-match": "any-with-x", "x-tenant": "acme"},
        "anyplain": {"x-match": "any", "x-tenant": "acme"},  # x- keys ignored: matches nothing
    }
    queues = {}
    for label, arguments in bindings.items():
        queues[label] = env.queue_name(label)
        channel.queue_declare(queues[label])
        channel.queue_bind(queues[label], name, "", arguments=arguments)
    messages = {
        b"pdf-report": {"format": "pdf", "type": "report"},
        b"pdf-only": {"format": "pdf"},
        b"pdf-acme": {"format": "pdf", "x-tenant": "acme"},
        b"acme-only": {"x-tenant": "acme"},
        b"none": {},
    }
    for body, headers in messages.items():
        channel.basic_publish(name, "ignored", body, pika.BasicProperties(headers=headers))
    got = {label: get_bodies(channel, queue) for label, queue in queues.items()}
    assert got == {
        "all": [b"pdf-report"],
        "any": [b"pdf-report", b"pdf-only", b"pdf-acme"],
        "default": [b"pdf-report"],
        "allx": [b"pdf-acme"],
        "anyx": [b"pdf-acme", b"acme-only"],
        "anyplain": [],
    }


def test_headers_binding_with_bad_x_match_is_refused(env):
    channel = env.channel()
    name = env.exchange_name()
    queue = env.queue_name()
    channel.exchange_declare(name, "headers")
    channel.queue_declare(queue)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.queue_bind(queue, name, "", arguments={"x-match": "some"})
    assert exc.value.reply_code == 406
    assert exc.value.reply_text.startswith("PRECONDITION_FAILED - Invalid x-match field value")


def test_exchange_to_exchange_bind_and_unbind(env):
    channel = env.channel()
    source, destination = env.exchange_name("src"), env.exchange_name("dst")
    queue = env.queue_name()
    channel.exchange_declare(source, "topic")
    channel.exchange_declare(destination, "direct")
    channel.queue_declare(queue)
    channel.queue_bind(queue, destination, "a.b")
    channel.exchange_bind(destination=destination, source=source, routing_key="a.*")
    channel.basic_publish(source, "a.b", b"through")
    channel.basic_publish(source, "x.y", b"no-match")
    assert get_bodies(channel, queue) == [b"through"]
    channel.exchange_unbind(destination=destination, source=source, routing_key="a.*")
    channel.basic_publish(source, "a.b", b"after-unbind")
    assert get_bodies(channel, queue) == []


def test_exchange_binding_to_missing_exchange_is_404(env):
    channel = env.channel()
    source = env.exchange_name()
    missing = env.exchange_name()
    channel.exchange_declare(source, "fanout")
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.exchange_bind(destination=missing, source=source)
    assert exc.value.reply_code == 404
    assert exc.value.reply_text == f"NOT_FOUND - no exchange '{missing}' in vhost '/'"


def test_exchange_binding_cycle_delivers_once(env):
    channel = env.channel()
    x1, x2 = env.exchange_name("x1"), env.exchange_name("x2")
    queue = env.queue_name()
    channel.exchange_declare(x1, "fanout")
    channel.exchange_declare(x2, "fanout")
    channel.queue_declare(queue)
    channel.exchange_bind(destination=x2, source=x1)
    channel.exchange_bind(destination=x1, source=x2)
    channel.queue_bind(queue, x2)
    channel.queue_bind(queue, x1)  # two paths to one queue: still one copy
    channel.basic_publish(x1, "", b"once")
    channel.basic_publish(x2, "", b"from-x2")
    assert get_bodies(channel, queue) == [b"once", b"from-x2"]


def test_alternate_exchange_takes_unroutable_messages(env):
    channel = env.channel()
    main, ae = env.exchange_name("main"), env.exchange_name("ae")
    routed, unrouted = env.queue_name("routed"), env.queue_name("unrouted")
    channel.exchange_declare(ae, "fanout")
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    channel.queue_declare(routed)
    channel.queue_declare(unrouted)
    channel.queue_bind(routed, main, "known")
    channel.queue_bind(unrouted, ae)
    channel.basic_publish(main, "known", b"routed")
    channel.basic_publish(main, "unknown", b"to-ae")
    assert get_bodies(channel, routed) == [b"routed"]
    assert get_bodies(channel, unrouted) == [b"to-ae"]


def test_alternate_exchange_counts_as_routed_for_mandatory(env):
    connection = env.connect()
    channel = connection.channel()
    main, ae = env.exchange_name("main"), env.exchange_name("ae")
    queue = env.queue_name()
    channel.exchange_declare(ae, "fanout")
    channel.exchange_declare(main, "direct", arguments={"alternate-exchange": ae})
    channel.queue_declare(queue)
    channel.queue_bind(queue, ae)
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args))
    channel.basic_publish(main, "nowhere", b"m", mandatory=True)
    pump([connection], 0.2)  # a basic.return would be in flight: publishes are asynchronous
    assert returned == []
    assert get_bodies(channel, queue) == [b"m"]


# ------------------------------------------------------------------- errors on publish


def test_publish_to_missing_exchange_closes_only_that_channel(env):
    connection = env.connect()
    good = connection.channel()
    bad = connection.channel()
    queue = env.queue_name()
    good.queue_declare(queue)
    missing = env.exchange_name()
    bad.basic_publish(missing, "k", b"lost")
    with pytest.raises(ChannelClosedByBroker) as exc:
        bad.queue_declare(queue, passive=True)
    assert exc.value.reply_code == 404
    assert exc.value.reply_text == f"NOT_FOUND - no exchange '{missing}' in vhost '/'"
    assert bad.is_closed and connection.is_open and good.is_open
    good.basic_publish("", queue, b"still-works")
    assert get_bodies(good, queue) == [b"still-works"]
    again = connection.channel()  # and new channels open fine
    again.queue_declare(queue, passive=True)
