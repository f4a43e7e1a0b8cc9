"""Publisher confirms and transactions through pika.

References: rabbit_channel handle_method for confirm.select / tx.select / tx.commit /
tx.rollback ("cannot switch from confirm to tx mode", "cannot switch from tx to confirm mode",
"channel is not transactional"), deliver_to_queues (a basic.return is sent before the confirm
of the same message), coalesce_and_send (confirms may be coalesced with multiple=true).
"""

from __future__ import annotations

import uuid

import pytest
from pika import spec
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from ..helpers import wait_until

pytestmark = pytest.mark.timeout(60)


def ready_count(connection, name: str) -> int:
    channel = connection.channel()
    try:
        return channel.queue_declare(name, passive=True).method.message_count
    finally:
        channel.close()


# ------------------------------------------------------------------------------ confirms


def test_every_publish_is_confirmed(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.confirm_delivery()
    for i in range(50):
        channel.basic_publish("", name, b"m%d" % i)  # raises if nacked or not confirmed
    assert ready_count(connection, name) == 50


def raw_confirm_channel(connection):
    """A channel in confirm mode driven through pika's lower-level Channel, so that every wait is
    bounded (BlockingChannel.basic_publish would wait for a missing confirm forever). Returns the
    channel and the list of events it records: ("return", body) and ("ack"/"nack", tag, multiple)."""
    events = []
    channel = connection.channel()

    def on_confirm(frame):
        kind = "ack" if isinstance(frame.method, spec.Basic.Ack) else "nack"
        events.append((kind, frame.method.delivery_tag, frame.method.multiple))

    channel._impl.add_on_return_callback(lambda ch, method, props, body: events.append(("return", body)))
    select_ok = []
    channel._impl.confirm_delivery(ack_nack_callback=on_confirm, callback=select_ok.append)
    assert wait_until(lambda: select_ok, 5.0, connections=[connection])
    return channel, events


def test_unroutable_publish_is_confirmed(env):
    # rabbit_channel process_routing_confirm: a message routed to no queue is confirmed at once.
    connection = env.connect()
    channel, events = raw_confirm_channel(connection)
    channel._impl.basic_publish("amq.direct", "nobody-" + uuid.uuid4().hex, b"dropped")
    assert wait_until(lambda: events, 2.0, connections=[connection]), "no confirm for an unroutable publish"
    assert events == [("ack", 1, False)]


def test_confirms_may_be_coalesced_with_multiple(env):
    # pika's BlockingChannel waits for each confirm; its underlying Channel does not, so 500
    # publishes go out in one burst and the broker acks them per read with multiple=true.
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    acks, nacks, select_ok = [], [], []

    def on_confirm(frame):
        (acks if isinstance(frame.method, spec.Basic.Ack) else nacks).append(frame.method)

    channel._impl.confirm_delivery(ack_nack_callback=on_confirm, callback=select_ok.append)
    assert wait_until(lambda: select_ok, 5.0, connections=[connection])
    total = 500
    for i in range(total):
        channel._impl.basic_publish("", name, b"m%d" % i)
    assert wait_until(lambda: acks and acks[-1].delivery_tag == total, 5.0, connections=[connection])
    assert nacks == []
    confirmed: set[int] = set()
    highest = 0
    for ack in acks:
        assert ack.delivery_tag > highest, "confirms arrive in order"
        confirmed.update(range(highest + 1, ack.delivery_tag + 1) if ack.multiple else [ack.delivery_tag])
        highest = ack.delivery_tag
    assert confirmed == set(range(1, total + 1))
    assert any(ack.multiple for ack in acks), "500 publishes in one burst should give at least one multiple ack"
    assert ready_count(connection, name) == total


def test_mandatory_unroutable_with_confirms_is_returned_then_acked(env):
    connection = env.connect()
    key = "nobody-" + uuid.uuid4().hex
    # The order on the wire, seen through the lower-level channel: the return, then the ack.
    raw, events = raw_confirm_channel(connection)
    raw._impl.basic_publish("amq.direct", key, b"first", mandatory=True)
    assert wait_until(lambda: len(events) == 2, 2.0, connections=[connection]), events
    assert events == [("return", b"first"), ("ack", 1, False)]
    # And as pika's BlockingChannel reports it: UnroutableError once the ack came.
    channel = connection.channel()
    channel.confirm_delivery()
    with pytest.raises(UnroutableError) as exc:
        channel.basic_publish("amq.direct", key, b"back", mandatory=True)
    [returned] = exc.value.messages
    assert (returned.method.reply_code, returned.method.reply_text, returned.method.routing_key) == (
        312,
        "NO_ROUTE",
        key,
    )
    assert returned.body == b"back"


def test_mandatory_unroutable_with_confirms_in_a_mixed_read(env):
    # The same publish followed, in one burst, by one that reaches a queue: the return comes
    # first, then one ack covering both (multiple=true), as coalesce_and_send may send it.
    connection = env.connect()
    name = env.queue_name()
    connection.channel().queue_declare(name)
    raw, events = raw_confirm_channel(connection)
    raw._impl.basic_publish("amq.direct", "nobody-" + name, b"back", mandatory=True)
    raw._impl.basic_publish("", name, b"kept")
    assert wait_until(lambda: any(e[0] == "ack" and e[1] == 2 for e in events), 5.0, connections=[connection]), events
    assert events[0] == ("return", b"back")
    confirmed = set()
    for kind, tag, multiple in events[1:]:
        assert kind == "ack"
        confirmed.update(range(1, tag + 1) if multiple else [tag])
    assert confirmed == {1, 2}
    assert ready_count(connection, name) == 1


# ------------------------------------------------------------------------------------ tx


def test_tx_commit_and_rollback_of_publishes(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.tx_select()
    for i in range(3):
        channel.basic_publish("", name, b"m%d" % i)
    connection.process_data_events(time_limit=0.1)
    assert ready_count(connection, name) == 0, "uncommitted publishes are invisible"
    channel.tx_commit()
    assert ready_count(connection, name) == 3
    channel.basic_publish("", name, b"rolled-back")
    channel.tx_rollback()
    channel.tx_commit()  # the channel stays transactional; nothing left to commit
    assert ready_count(connection, name) == 3
    bodies = [channel.basic_get(name, auto_ack=True)[2] for _ in range(3)]
    assert bodies == [b"m0", b"m1", b"m2"]


def test_tx_acks_take_effect_at_commit(env):
    connection = env.connect()
    setup = connection.channel()
    name = env.queue_name()
    setup.queue_declare(name)
    setup.basic_publish("", name, b"a")
    setup.basic_publish("", name, b"b")
    channel = connection.channel()
    channel.tx_select()
    tag_a = channel.basic_get(name)[0].delivery_tag
    tag_b = channel.basic_get(name)[0].delivery_tag
    channel.basic_ack(tag_a)
    channel.tx_rollback()  # the ack is forgotten: `a` is unacked again, under its tag
    channel.basic_ack(tag_a)  # so acking it again is fine
    channel.basic_ack(tag_b)
    channel.tx_commit()
    channel.close()  # nothing was left unacked: nothing comes back
    assert ready_count(connection, name) == 0
    # An ack that is never committed does not happen: closing the channel requeues the message.
    setup.basic_publish("", name, b"c")
    channel = connection.channel()
    channel.tx_select()
    tag_c = channel.basic_get(name)[0].delivery_tag
    channel.basic_ack(tag_c)
    channel.close()
    assert ready_count(connection, name) == 1


def test_tx_ack_of_a_tag_already_acked_in_the_tx_is_refused(env):
    connection = env.connect()
    channel = connection.channel()
    name = env.queue_name()
    channel.queue_declare(name)
    channel.basic_publish("", name, b"a")
    channel.tx_select()
    tag = channel.basic_get(name)[0].delivery_tag
    channel.basic_ack(tag)
    channel.basic_ack(tag)
    with pytest.raises(ChannelClosedByBroker) as exc:
        channel.tx_commit()
    assert (exc.value.reply_code, exc.value.reply_text) == (406, f"PRECONDITION_FAILED - unknown delivery tag {tag}")
    assert ready_count(connection, name) == 1


@pytest.mark.parametrize(
    "first, second, text",
    [
        ("confirm", "tx", "PRECONDITION_FAILED - cannot switch from confirm to tx mode"),
        ("tx", "confirm", "PRECONDITION_FAILED - cannot switch from tx to confirm mode"),
    ],
)
def test_switching_between_confirm_and_tx_is_refused(env, first, second, text):
    channel = env.connect().channel()
    select = {"confirm": channel.confirm_delivery, "tx": channel.tx_select}
    select[first]()
    with pytest.raises(ChannelClosedByBroker) as exc:
        select[second]()
    assert (exc.value.reply_code, exc.value.reply_text) == (406, text)


@pytest.mark.parametrize("method", ["tx_commit", "tx_rollback"])
def test_commit_or_rollback_without_select_is_refused(env, method):
    channel = env.connect().channel()
    with pytest.raises(ChannelClosedByBroker) as exc:
        getattr(channel, method)()
    assert (exc.value.reply_code, exc.value.reply_text) == (406, "PRECONDITION_FAILED - channel is not transactional")
