"""Real clients, unchanged, against a real `maxq-server`: pika (blocking and asynchronous),
aio-pika, kombu and celery. Every wait is bounded; names are unique per test so the tests share
one broker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pika
import pytest

TIMEOUT_S = 10.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ------------------------------------------------------------------------------------ pika


def test_pika_blocking_topology_publish_get_consume(broker):
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port, socket_timeout=5))
    try:
        channel = connection.channel()
        exchange, queue = unique("bx"), unique("bq")
        channel.exchange_declare(exchange, "topic", auto_delete=True)
        channel.queue_declare(queue, auto_delete=False, arguments={"x-max-length": 1000})
        channel.queue_bind(queue, exchange, "orders.*")
        channel.confirm_delivery()
        props = pika.BasicProperties(
            content_type="application/json",
            headers={"n": 1, "list": [1, "a"]},
            message_id="m1",
            correlation_id="c1",
            priority=3,
            delivery_mode=2,
            timestamp=1_700_000_000,
            app_id="tests",
        )
        channel.basic_publish(exchange, "orders.new", b'{"a": 1}', props)
        with pytest.raises(pika.exceptions.UnroutableError):
            channel.basic_publish(exchange, "nothing.matches.this", b"x", mandatory=True)
        method, got_props, body = channel.basic_get(queue)
        assert body == b'{"a": 1}' and method.routing_key == "orders.new" and method.exchange == exchange
        for name in (
            "content_type",
            "headers",
            "message_id",
            "correlation_id",
            "priority",
            "delivery_mode",
            "timestamp",
            "app_id",
        ):
            assert getattr(got_props, name) == getattr(props, name), name
        channel.basic_ack(method.delivery_tag)
        for i in range(50):
            channel.basic_publish("", queue, b"%d" % i)
        channel.basic_qos(prefetch_count=10)
        received = []
        for method, _props, body in channel.consume(queue, inactivity_timeout=5):
            assert method is not None, f"timed out after {len(received)} messages"
            received.append(int(body))
            channel.basic_ack(method.delivery_tag)
            if len(received) == 50:
                break
        channel.cancel()
        assert received == list(range(50))
        assert channel.queue_delete(queue).method.message_count == 0
    finally:
        connection.close()


def test_pika_blocking_nack_requeue_redelivers(broker):
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port, socket_timeout=5))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.basic_publish("", queue, b"again")
        method, _, _ = channel.basic_get(queue)
        channel.basic_nack(method.delivery_tag, requeue=True)
        method, _, body = channel.basic_get(queue)
        assert body == b"again" and method.redelivered
        channel.basic_ack(method.delivery_tag)
        # A soft error closes only the channel; the connection goes on.
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
            channel.queue_declare(unique("missing"), passive=True)
        assert info.value.reply_code == 404
        assert connection.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
    finally:
        connection.close()


def test_pika_select_connection_async_round_trip(broker):
    """The asynchronous adapter: publish 200 with confirms and consume them, callbacks only."""
    count = 200
    state = {"confirmed": 0, "received": [], "error": None, "queue": None}
    params = pika.ConnectionParameters(port=broker.amqp_port, socket_timeout=5)

    def on_open(connection):
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel):
        state["channel"] = channel
        channel.confirm_delivery(on_confirm)
        channel.queue_declare("", exclusive=True, callback=on_declared)

    def on_declared(frame):
        channel = state["channel"]
        state["queue"] = frame.method.queue
        channel.basic_consume(frame.method.queue, on_message, auto_ack=False)
        for i in range(count):
            channel.basic_publish("", frame.method.queue, b"%d" % i)

    def on_confirm(frame):
        assert isinstance(frame.method, pika.spec.Basic.Ack), frame
        # multiple=True acks everything up to the tag.
        state["confirmed"] = frame.method.delivery_tag if frame.method.multiple else state["confirmed"] + 1
        maybe_done()

    def on_message(channel, method, _props, body):
        state["received"].append(int(body))
        channel.basic_ack(method.delivery_tag)
        maybe_done()

    def maybe_done():
        if len(state["received"]) == count and state["confirmed"] == count and not connection.is_closing:
            connection.close()

    def on_open_error(_connection, error):
        state["error"] = error
        connection.ioloop.stop()

    def on_closed(_connection, reason):
        if not isinstance(reason, pika.exceptions.ConnectionClosedByClient):
            state["error"] = reason
        connection.ioloop.stop()

    def on_timeout():
        state["error"] = f"timed out: {state['confirmed']} confirmed, {len(state['received'])} received"
        connection.ioloop.stop()

    connection = pika.SelectConnection(
        params, on_open_callback=on_open, on_open_error_callback=on_open_error, on_close_callback=on_closed
    )
    timer = connection.ioloop.call_later(TIMEOUT_S, on_timeout)
    try:
        connection.ioloop.start()
    finally:
        connection.ioloop.remove_timeout(timer)
        if connection.is_open:
            connection.close()
            connection.ioloop.start()  # until on_closed stops it
    assert state["error"] is None, state["error"]
    assert state["received"] == list(range(count))


# -------------------------------------------------------------------------------- aio-pika


def test_aio_pika_confirms_manual_ack_and_direct_reply_to(broker):
    import aio_pika
    import pamqp.commands

    async def scenario():
        url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}/"
        connection = await aio_pika.connect_robust(url, timeout=5)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            queue = await channel.declare_queue(unique("aq"), auto_delete=True)
            for i in range(20):
                confirmation = await channel.default_exchange.publish(
                    aio_pika.Message(b"%d" % i, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue.name
                )
                assert isinstance(confirmation, pamqp.commands.Basic.Ack), confirmation
            # Manual ack: reject the first one with requeue, then take all 20.
            seen = []
            await channel.set_qos(prefetch_count=5)
            async with queue.iterator() as messages:
                async for message in messages:
                    if not seen and not message.redelivered:
                        await message.reject(requeue=True)
                        seen.append("rejected")
                        continue
                    seen.append(int(message.body))
                    await message.ack()
                    if len(seen) == 21:
                        break
            assert sorted(seen[1:]) == list(range(20))

            # RPC over direct reply-to (amq.rabbitmq.reply-to): the server consumes a request
            # queue and answers to the address the broker put in reply_to.
            server_channel = await connection.channel()
            requests = await server_channel.declare_queue(unique("rpc"), exclusive=True)

            async def serve(message: aio_pika.abc.AbstractIncomingMessage):
                async with message.process():
                    assert message.reply_to.startswith("amq.rabbitmq.reply-to.")
                    await server_channel.default_exchange.publish(
                        aio_pika.Message(b"re:" + message.body, correlation_id=message.correlation_id),
                        routing_key=message.reply_to,
                    )

            await requests.consume(serve)
            client_channel = await connection.channel()
            reply_queue = await client_channel.get_queue("amq.rabbitmq.reply-to", ensure=False)
            replies: asyncio.Queue = asyncio.Queue()

            async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await replies.put(message)

            await reply_queue.consume(on_reply, no_ack=True)
            for i in range(3):
                await client_channel.default_exchange.publish(
                    aio_pika.Message(b"ping%d" % i, correlation_id=str(i), reply_to="amq.rabbitmq.reply-to"),
                    routing_key=requests.name,
                )
            answers = {}
            for _ in range(3):
                reply = await replies.get()
                answers[reply.correlation_id] = reply.body
            assert answers == {"0": b"re:ping0", "1": b"re:ping1", "2": b"re:ping2"}

    asyncio.run(asyncio.wait_for(scenario(), TIMEOUT_S * 2))


# ----------------------------------------------------------------------------------- kombu


def test_kombu_producer_consumer_round_trip(broker):
    import kombu

    exchange = kombu.Exchange(unique("kx"), type="direct", durable=False)
    queue = kombu.Queue(unique("kq"), exchange=exchange, routing_key="jobs", auto_delete=True)
    received = []
    with kombu.Connection(f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//", connect_timeout=5) as connection:
        assert type(connection.transport).__module__ == "kombu.transport.pyamqp"
        producer = connection.Producer(serializer="json")
        for i in range(10):
            producer.publish(
                {"job": i, "text": "héllo"}, exchange=exchange, routing_key="jobs", declare=[queue], retry=False
            )

        def on_message(body, message):
            received.append(body)
            message.ack()

        with connection.Consumer(queue, callbacks=[on_message], accept=["json"]):
            deadline = time.monotonic() + TIMEOUT_S
            while len(received) < 10 and time.monotonic() < deadline:
                connection.drain_events(timeout=1)
        # SimpleQueue: kombu's other common API.
        simple = connection.SimpleQueue(unique("simple"))
        simple.put({"hello": "world"})
        message = simple.get(block=True, timeout=5)
        assert message.payload == {"hello": "world"}
        message.ack()
        simple.close()
    assert received == [{"job": i, "text": "héllo"} for i in range(10)]


# ---------------------------------------------------------------------------------- celery


CELERY_TASKS = """
from celery import Celery

app = Celery("maxqtasks", broker="{broker_url}", backend="rpc://")
app.conf.update(broker_connection_retry_on_startup=True, broker_connection_max_retries=3, task_serializer="json",
                result_serializer="json", accept_content=["json"], worker_prefetch_multiplier=4, result_expires=60)


@app.task
def add(x, y):
    return x + y


@app.task
def fail():
    raise ValueError("boom")
"""


def test_celery_task_with_rpc_result(broker, tmp_path):
    broker_url = f"amqp://guest:guest@127.0.0.1:{broker.amqp_port}//"
    (tmp_path / "maxqtasks.py").write_text(textwrap.dedent(CELERY_TASKS.format(broker_url=broker_url)))
    celery_bin = str(Path(sys.executable).parent / "celery")
    log_path = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "MAXQ_"))}
    env["PYTHONPATH"] = str(tmp_path)  # the task module only; never the repo root (docs/design.md §1)
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [
                celery_bin,
                "-A",
                "maxqtasks",
                "worker",
                "--pool=solo",
                "--concurrency=1",
                "--loglevel=INFO",
                "--hostname",
                f"w-{uuid.uuid4().hex[:6]}@test",
            ],
            cwd=str(tmp_path),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    sys.path.insert(0, str(tmp_path))
    try:
        import maxqtasks

        deadline = time.monotonic() + 30
        while "ready." not in log_path.read_text(errors="replace"):
            assert worker.poll() is None, f"worker exited {worker.returncode}:\n{log_path.read_text()}"
            assert time.monotonic() < deadline, f"worker not ready:\n{log_path.read_text()}"
            time.sleep(0.1)
        results = [maxqtasks.add.delay(i, 100) for i in range(5)]
        assert [r.get(timeout=TIMEOUT_S) for r in results] == [100, 101, 102, 103, 104]
        failing = maxqtasks.fail.delay()
        with pytest.raises(ValueError, match="boom"):
            failing.get(timeout=TIMEOUT_S)
        # Close the client side's connections (the result consumer's and the producer pool's):
        # a connection left open would make the shared broker wait out its shutdown grace.
        maxqtasks.app.backend.result_consumer.stop()
        maxqtasks.app.pool.force_close_all()
        maxqtasks.app.close()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("maxqtasks", None)
        worker.terminate()  # warm shutdown: the worker closes its channels and connection
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)
    text = log_path.read_text(errors="replace")
    errors = [
        line
        for line in text.splitlines()
        if ("ERROR/" in line or "CRITICAL/" in line) and "ValueError('boom')" not in line
    ]
    assert errors == [], text
    assert "Connection to broker lost" not in text, text
