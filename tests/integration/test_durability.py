"""What survives a restart, through pika against real `maxq-server` processes.

Most scenarios run twice: a clean stop (SIGTERM, exit 0) and a crash (SIGKILL). The rules are
RabbitMQ's: durable queues, durable exchanges and bindings between two durable ends come back;
persistent messages (delivery_mode 2) on durable queues come back; transient messages, transient
queues and exchanges, and bindings with a transient end do not; messages delivered but not acked
come back with redelivered=true; acked messages never come back; a confirm means the message is
on disk, so a crash mid-stream loses no confirmed message and duplicates none.

A restart is a new process on the same data folder with new ports (`restart`): the fixture's
ready check reads the log, which a second start on the same log would pass at once. Before a
SIGKILL a test makes sure the broker took in what it sent: a confirm (persistent publishes) or a
synchronous method on the same channel (acks, deletes), since AMQP processes a channel in order.
Two tests drive the store's queue backing directly, for cases that would take minutes of
publishing to reach through the broker. Every wait is bounded; every server is stopped by the
fixture.
"""

from __future__ import annotations

import threading
import time

import pika
import pytest
from pika.exceptions import AMQPError, ChannelClosedByBroker

from maxq_raft.machines.message import Message
from maxq_raft.server.message_store import LOAD_BYTES_MAX, QueueBacking
from maxq_raft.storage.rocks import RocksSegmentStore

from ..helpers import message_count

pytestmark = pytest.mark.timeout(120)

PERSISTENT = pika.BasicProperties(delivery_mode=2)
TRANSIENT = pika.BasicProperties(delivery_mode=1)
HOW = ["sigterm", "sigkill"]
DRAIN_TIMEOUT_S = 30.0


def restart(start_broker, server, how: str):
    """Stop `server` (cleanly or by SIGKILL) and start a new process on its data folder."""
    if how == "sigkill":
        server.kill()
        assert server.proc.returncode == -9
    else:
        assert server.stop() == 0, server.log_text()
    return start_broker(data_dir=server.data_dir)


def gone(connection, kind: str, name: str) -> bool:
    """True if a passive declare of queue/exchange `name` is refused with 404."""
    channel = connection.channel()
    try:
        if kind == "queue":
            channel.queue_declare(name, passive=True)
        else:
            channel.exchange_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        assert exc.reply_code == 404, exc
        return True
    channel.close()
    return False


def drain(channel, name: str, expected: int | None = None, timeout_s: float = DRAIN_TIMEOUT_S) -> list:
    """Every message of `name` as (body, redelivered), by basic.get (auto-ack); bounded."""
    out = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, _props, body = channel.basic_get(name, auto_ack=True)
        if method is None:
            break
        out.append((body, method.redelivered))
        if expected is not None and len(out) > expected + 1000:
            break  # far too many: stop, the assertion will show it
    return out


def consume_all(connection, channel, name: str, expected: int, timeout_s: float = DRAIN_TIMEOUT_S) -> list[bytes]:
    """Bodies of `expected` messages by basic.consume (no-ack), faster than basic.get; bounded."""
    bodies: list[bytes] = []

    def on_message(_ch, _method, _props, body):
        bodies.append(body)

    tag = channel.basic_consume(name, on_message, auto_ack=True)
    deadline = time.monotonic() + timeout_s
    while len(bodies) < expected and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    channel.basic_cancel(tag)
    connection.process_data_events(time_limit=0.2)  # anything beyond `expected` shows up too
    return bodies


def publish_confirmed(channel, exchange: str, routing_key: str, bodies, props=PERSISTENT) -> None:
    """Publish on a channel in confirm mode; pika's BlockingChannel waits for each confirm."""
    for body in bodies:
        channel.basic_publish(exchange, routing_key, body, props)


# ------------------------------------------------------------------------ queues × messages


@pytest.mark.parametrize("how", HOW)
def test_durable_queue_keeps_persistent_messages_only_and_transient_queue_goes(start_broker, how):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("dq", durable=True)
    channel.queue_declare("tq", durable=False)
    for i in range(10):
        props = PERSISTENT if i % 2 == 0 else TRANSIENT
        channel.basic_publish("", "dq", f"d{i}".encode(), props)
        channel.basic_publish("", "tq", f"t{i}".encode(), props)
    assert message_count(channel, "dq") == 10
    connection.close()

    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    # RabbitMQ: queue.declare-ok right after the restart counts the recovered messages.
    assert channel.queue_declare("dq", durable=True).method.message_count == 5
    assert gone(connection, "queue", "tq")
    assert drain(channel, "dq") == [(f"d{i}".encode(), False) for i in range(0, 10, 2)]
    connection.close()


@pytest.mark.parametrize("how", HOW)
def test_unacked_come_back_redelivered_and_acked_never(start_broker, how):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("q", durable=True)
    publish_confirmed(channel, "", "q", [b"m%d" % i for i in range(10)])
    consumer = connection.channel()
    got = [consumer.basic_get("q") for _ in range(8)]
    assert [body for _method, _props, body in got] == [b"m%d" % i for i in range(8)]
    consumer.basic_ack(got[4][0].delivery_tag, multiple=True)  # m0..m4 acked; m5..m7 unacked; m8, m9 never delivered
    consumer.basic_qos(prefetch_count=0)  # a round trip on the same channel: the ack was applied
    assert message_count(channel, "q") == 2
    # The consumer's connection is still open: SIGTERM closes it (320), SIGKILL just drops it.
    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    assert message_count(channel, "q") == 5
    assert drain(channel, "q") == [(b"m5", True), (b"m6", True), (b"m7", True), (b"m8", False), (b"m9", False)]
    connection.close()


def test_a_new_message_is_not_redelivered_because_of_an_older_run(start_broker):
    """The delivered watermark survives restarts; seqs below it must never be handed out again,
    or a message never delivered would come back redelivered=true after the next restart."""
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("q", durable=True)
    for i in range(3):
        channel.basic_publish("", "q", b"t%d" % i, TRANSIENT)
    assert [body for body, _ in drain(channel, "q")] == [b"t0", b"t1", b"t2"]
    connection.close()
    server = restart(start_broker, server, "sigterm")
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish("", "q", b"p", PERSISTENT)
    connection.close()
    server = restart(start_broker, server, "sigkill")
    connection = server.connect(heartbeat=0)
    assert drain(connection.channel(), "q") == [(b"p", False)]
    connection.close()


# ------------------------------------------------------------------------- topology


@pytest.mark.parametrize("how", HOW)
def test_durable_exchanges_and_bindings_survive_transient_ones_do_not(start_broker, how):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("dq", durable=True)
    channel.queue_declare("tq", durable=False)
    channel.exchange_declare("dx", "direct", durable=True)
    channel.exchange_declare("dtop", "topic", durable=True)
    channel.exchange_declare("tx", "fanout", durable=False)
    channel.queue_bind("dq", "dx", "k")  # durable -> durable queue: survives
    channel.queue_bind("dq", "amq.topic", "a.*")  # built-in -> durable queue: survives
    channel.exchange_bind("dx", "dtop", "#")  # durable -> durable exchange: survives
    channel.queue_bind("tq", "dx", "k")  # to a transient queue: goes with it
    channel.queue_bind("dq", "tx")  # from a transient exchange: goes with it
    channel.exchange_bind("tx", "dx", "k")  # durable -> transient exchange: goes
    channel.queue_bind("dq", "dx", "gone")
    channel.queue_unbind("dq", "dx", "gone")  # an unbind is durable too
    channel.exchange_declare("dx-deleted", "direct", durable=True)
    channel.exchange_delete("dx-deleted")
    connection.close()

    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    assert not gone(connection, "exchange", "dx")
    assert not gone(connection, "exchange", "dtop")
    assert gone(connection, "exchange", "tx")
    assert gone(connection, "exchange", "dx-deleted")
    assert gone(connection, "queue", "tq")
    channel.confirm_delivery()
    # Each publish routes to dq exactly once if and only if its binding survived.
    channel.basic_publish("dx", "k", b"via-dx", PERSISTENT)
    channel.basic_publish("amq.topic", "a.b", b"via-amq.topic", PERSISTENT)
    channel.basic_publish("dtop", "k", b"via-dtop-e2e", PERSISTENT)
    channel.basic_publish("dx", "gone", b"via-unbound", PERSISTENT)
    assert drain(channel, "dq") == [(b"via-dx", False), (b"via-amq.topic", False), (b"via-dtop-e2e", False)]
    connection.close()


@pytest.mark.parametrize("how", HOW)
def test_a_durable_auto_delete_exchange_deleted_by_a_cascade_stays_deleted(start_broker, how):
    """RabbitMQ: an auto-delete exchange goes when its last binding goes, here because the
    (transient) queue it was bound to was deleted; that deletion is durable like any other."""
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.exchange_declare("adx", "fanout", durable=True, auto_delete=True)
    channel.queue_declare("tq", durable=False)
    channel.queue_bind("tq", "adx")
    channel.queue_delete("tq")
    assert gone(connection, "exchange", "adx")
    connection.close()
    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    assert gone(connection, "exchange", "adx")
    connection.close()


@pytest.mark.parametrize("how", HOW)
def test_purge_and_delete_survive_restart(start_broker, how):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("purged", durable=True)
    channel.queue_declare("deleted", durable=True)
    # More than the in-memory window holds (32 MiB of bodies): the purge covers the window and
    # the spilled tail.
    filler = bytes(20 << 10)
    for i in range(2000):
        channel.basic_publish("", "purged", b"old%d" % i + filler, PERSISTENT)
    channel.basic_publish("", "deleted", b"x", PERSISTENT)
    assert channel.queue_purge("purged").method.message_count == 2000
    assert channel.queue_delete("deleted").method.message_count == 1
    channel.confirm_delivery()
    publish_confirmed(channel, "", "purged", [b"new0", b"new1", b"new2"])
    connection.close()

    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    assert gone(connection, "queue", "deleted")
    channel = connection.channel()
    assert message_count(channel, "purged") == 3
    assert drain(channel, "purged") == [(b"new0", False), (b"new1", False), (b"new2", False)]
    connection.close()


# ------------------------------------------------------------------------- deep queue


def test_deep_queue_survives_restart_in_order(start_broker):
    # 40 MB: more than the in-memory window holds (32 MiB of bodies), so most of it is spilled.
    depth = 50_000
    pad = b"." * 800
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.queue_declare("deep", durable=True)
    for i in range(depth - 1):
        channel.basic_publish("", "deep", b"%d:" % i + pad, PERSISTENT)
    channel.confirm_delivery()
    # The last confirm covers everything before it: one fsync covers all earlier WAL writes.
    channel.basic_publish("", "deep", b"%d:" % (depth - 1) + pad, PERSISTENT)
    connection.close()

    server = restart(start_broker, server, "sigkill")
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    assert channel.queue_declare("deep", durable=True).method.message_count == depth
    channel.basic_qos(prefetch_count=2000)
    bodies = consume_all(connection, channel, "deep", depth)
    assert len(bodies) == depth
    assert bodies == [b"%d:" % i + pad for i in range(depth)]
    assert message_count(channel, "deep") == 0
    connection.close()


def test_stale_transient_records_do_not_hide_the_persistent_ones_after_them(tmp_path):
    """A durable queue holding persistent, then many spilled transient, then persistent messages:
    if RocksDB flushed the transient records (written without the WAL) to disk before a restart,
    they are still there, from an earlier epoch. Loading must skip them, not stop at them: the
    machine reads an empty load as "nothing more is stored". (Through the backing directly: to
    get there through the broker takes more than two windows of transient messages flushed to
    SST files, minutes of publishing with pika.)"""
    store = RocksSegmentStore(tmp_path / "store")
    try:
        before = QueueBacking(store, 7, durable=True, epoch=1, syncer=FakeSyncer())
        messages = [stored_message(seq, persistent=seq < 10 or seq >= 210) for seq in range(220)]
        before.write(messages)
        assert before.persistent == 20
        after = QueueBacking(store, 7, durable=True, epoch=2, syncer=FakeSyncer())
        loaded, cursor = [], 0
        for _ in range(100):  # as the machine refills its window: until a load comes back empty
            batch = after.load(cursor, 15)
            if not batch:
                break
            assert len(batch) <= 15
            loaded.extend(batch)
            cursor = batch[-1].seq + 1
        assert [m.body for m in loaded] == [b"%d" % seq for seq in [*range(10), *range(210, 220)]]
        assert len(store.scan(7, 0, 1000)) == 20, "stale records met are deleted"
    finally:
        store.close()


def test_a_refill_brings_in_at_most_a_window_of_bytes(tmp_path):
    """The machine asks for `window_max` messages whatever their size; the backing stops at the
    window's byte bound, so refilling a deep queue of large messages cannot blow up memory."""
    store = RocksSegmentStore(tmp_path / "store")
    try:
        backing = QueueBacking(store, 3, durable=True, epoch=1, syncer=FakeSyncer())
        big = [stored_message(seq, persistent=True) for seq in range(80)]
        for message in big:
            message.body = b"%d:" % message.seq + bytes(1 << 20)
        backing.write(big)
        loaded = backing.load(0, 65536)
        assert 0 < len(loaded) <= LOAD_BYTES_MAX >> 20
        assert [m.seq for m in loaded] == list(range(len(loaded)))
        rest = backing.load(len(loaded), 65536)
        assert rest and rest[0].seq == len(loaded)
    finally:
        store.close()


class FakeSyncer:
    dirty = False


def stored_message(seq: int, persistent: bool) -> Message:
    message = Message("", "q", b"", b"%d" % seq, persistent)
    message.seq = seq
    return message


# --------------------------------------------------------- crash during confirmed publishing


class ConfirmingPublisher(threading.Thread):
    """Publishes persistent messages with unique ids as fast as confirms allow (a window of
    `window` outstanding), recording each id the broker confirmed; ends when the broker dies."""

    def __init__(self, port: int, queue: str, window: int = 500) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.queue = queue
        self.window = window
        self.published: list[int] = []  # id of delivery tag n is published[n - 1]
        self.confirmed: set[int] = set()
        self.nacked: set[int] = set()
        self._settled_upto = 0  # delivery tags <= this are confirmed or nacked
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def run(self) -> None:
        try:
            connection = pika.SelectConnection(
                pika.ConnectionParameters(port=self.port, heartbeat=0),
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_closed,
                on_close_callback=self._on_closed,
            )
            self.connection = connection
            connection.ioloop.start()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def _on_closed(self, connection, _exc) -> None:
        connection.ioloop.stop()

    def _on_open(self, connection) -> None:
        connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel) -> None:
        self.channel = channel
        channel.confirm_delivery(self._on_confirm, callback=lambda _frame: self._fill())

    def _fill(self) -> None:
        while len(self.published) - self._settled_upto < self.window:
            message_id = len(self.published)
            self.published.append(message_id)
            self.channel.basic_publish("", self.queue, b"%d" % message_id, PERSISTENT)

    def _on_confirm(self, frame) -> None:
        method = frame.method
        tag = method.delivery_tag
        first = self._settled_upto + 1 if method.multiple else tag
        target = self.confirmed if isinstance(method, pika.spec.Basic.Ack) else self.nacked
        with self.lock:
            for t in range(first, tag + 1):
                target.add(self.published[t - 1])
            self._settled_upto = max(self._settled_upto, tag)
        self._fill()


class AckingConsumer(threading.Thread):
    """Takes messages by basic.get and acks them; an id counts as acked once a synchronous
    method on the same channel has returned after the ack (so the broker applied it)."""

    def __init__(self, port: int, queue: str) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.queue = queue
        self.acked: set[int] = set()
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            connection = connect_port(self.port)
            channel = connection.channel()
            while not self.stop_event.is_set():
                batch = []
                for _ in range(50):
                    method, _props, body = channel.basic_get(self.queue)
                    if method is None:
                        break
                    batch.append((method.delivery_tag, int(body)))
                if not batch:
                    time.sleep(0.01)
                    continue
                channel.basic_ack(batch[-1][0], multiple=True)
                channel.basic_qos(prefetch_count=0)  # round trip: the ack has been applied
                self.acked.update(message_id for _tag, message_id in batch)
        except (AMQPError, OSError):
            pass  # the broker was killed


def connect_port(port: int) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters(port=port, heartbeat=0))


def test_sigkill_during_confirmed_publishing_loses_and_duplicates_nothing(start_broker):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    connection.channel().queue_declare("stream", durable=True)
    connection.close()
    publisher = ConfirmingPublisher(server.amqp_port, "stream")
    consumer = AckingConsumer(server.amqp_port, "stream")
    publisher.start()
    deadline = time.monotonic() + 20
    while len(publisher.confirmed) < 3000 and time.monotonic() < deadline:
        time.sleep(0.02)
    consumer.start()  # acks the head while publishing goes on
    while len(consumer.acked) < 1000 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(consumer.acked) >= 1000, "the consumer did not get going"
    server.kill()  # mid-stream: the publisher has a window of unconfirmed messages in flight
    publisher.join(10)
    consumer.join(10)
    assert not publisher.is_alive() and not consumer.is_alive()
    assert publisher.error is None, publisher.error
    with publisher.lock:
        confirmed = set(publisher.confirmed)
        published = len(publisher.published)
    assert not publisher.nacked
    assert len(confirmed) >= 3000 and published > len(confirmed), (len(confirmed), published)

    server = restart(start_broker, server, "sigkill")
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    count = message_count(channel, "stream")
    channel.basic_qos(prefetch_count=2000)
    ids = [int(body) for body in consume_all(connection, channel, "stream", count)]
    assert len(ids) == count
    assert len(ids) == len(set(ids)), "a message came back twice"
    assert set(ids) <= set(range(published)), "a message nobody published"
    assert not set(ids) & consumer.acked, "an acked message came back"
    missing = confirmed - consumer.acked - set(ids)
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:10]}"
    assert ids == sorted(ids), "recovered out of order"
    connection.close()


@pytest.mark.parametrize("how", HOW)
def test_a_partitioned_queue_comes_back_whole_and_keeps_routing_by_key(start_broker, how):
    server = start_broker()
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("pq", durable=True, arguments={"x-partitions": 3})
    keys = [f"key-{k}" for k in range(6)]
    for n in range(10):
        for key in keys:
            headers = {"x-partition-key": key}
            channel.basic_publish(
                "", "pq", f"{key}:{n}".encode(), pika.BasicProperties(delivery_mode=2, headers=headers)
            )
    connection.close()

    server = restart(start_broker, server, how)
    connection = server.connect(heartbeat=0)
    channel = connection.channel()
    channel.confirm_delivery()
    assert channel.queue_declare("pq", durable=True, arguments={"x-partitions": 3}).method.message_count == 60
    for key in keys:  # after the restart a key still goes where its earlier messages are
        channel.basic_publish(
            "", "pq", f"{key}:10".encode(), pika.BasicProperties(delivery_mode=2, headers={"x-partition-key": key})
        )
    got = [body.decode().split(":") for body in consume_all(connection, channel, "pq", 66)]
    for key in keys:
        assert [int(n) for k, n in got if k == key] == list(range(11)), key
    connection.close()
