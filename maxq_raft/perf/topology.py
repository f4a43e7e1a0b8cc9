"""The queues and the fanout exchange a run uses: declared fresh before, deleted after.

Theory of operation: like amqpload, every queue is deleted and declared again before a run so
that a backlog left by an earlier (failed) run never counts in this one; the fanout exchange
is declared (idempotent) and bound to every queue. After the run the queues are deleted unless
--keep-queues; the exchange is left, as amqpload leaves it (garagemq never answers
exchange.delete, and declaring it again next time is harmless).
"""

from __future__ import annotations

from .client import AmqpClient
from .options import PerfOptions
from .workers import exchange_name, queue_name


def connect(options: PerfOptions) -> AmqpClient:
    return AmqpClient(
        options.host,
        options.port,
        user=options.user,
        password=options.password,
        vhost=options.vhost,
        frame_max=options.frame_max,
    ).connect()


def declare(options: PerfOptions) -> None:
    if options.no_declare:
        return
    client = connect(options)
    try:
        for i in range(options.queues):
            client.queue_delete(queue_name(options, i))
            client.queue_declare(queue_name(options, i), durable=options.durable, arguments=options.queue_args)
        if options.fanout:
            client.exchange_declare(exchange_name(options), "fanout", durable=options.durable)
            for i in range(options.queues):
                client.queue_bind(queue_name(options, i), exchange_name(options))
    finally:
        client.close()


def delete(options: PerfOptions) -> None:
    if options.no_declare or options.keep_queues:
        return
    client = connect(options)
    try:
        for i in range(options.queues):
            client.queue_delete(queue_name(options, i))
    finally:
        client.close()
