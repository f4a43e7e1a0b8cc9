"""The first thing a user does: connect with pika, publish with confirms, consume, get."""

import pika


def test_publish_confirm_consume_roundtrip(broker):
    connection = pika.BlockingConnection(pika.ConnectionParameters(port=broker.amqp_port))
    try:
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        assert queue.startswith("amq.gen-")
        channel.confirm_delivery()
        for i in range(100):
            channel.basic_publish("", queue, b"m%d" % i, pika.BasicProperties(delivery_mode=2))
        bodies = []
        for method, _props, body in channel.consume(queue, inactivity_timeout=5):
            assert method is not None, "timed out waiting for deliveries"
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(bodies) == 100:
                break
        channel.cancel()
        assert bodies == [b"m%d" % i for i in range(100)]
        assert channel.basic_get(queue) == (None, None, None)
    finally:
        connection.close()
