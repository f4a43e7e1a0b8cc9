"""Shared fixtures for the integration tests (pytest finds them here; nothing to import)."""

from __future__ import annotations

import uuid

import pika
import pytest


class Env:
    """Connections and names a test uses; everything is closed and deleted afterwards."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connections: list = []
        self.queues: list[str] = []
        self.exchanges: list[str] = []

    def connect(self) -> pika.BlockingConnection:
        connection = pika.BlockingConnection(pika.ConnectionParameters(port=self.port))
        self.connections.append(connection)
        return connection

    def channel(self):
        return self.connect().channel()

    def queue_name(self, prefix: str = "q") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.queues.append(name)
        return name

    def exchange_name(self, prefix: str = "x") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        self.exchanges.append(name)
        return name

    def close(self) -> None:
        for connection in self.connections:
            if connection.is_open:
                connection.close()
        connection = pika.BlockingConnection(pika.ConnectionParameters(port=self.port))
        try:
            channel = connection.channel()
            for name in self.queues:
                channel.queue_delete(name)
            for name in self.exchanges:
                channel.exchange_delete(name)
        finally:
            connection.close()


@pytest.fixture
def env(broker):
    """A test's connections and names on the shared broker, cleaned up after it."""
    e = Env(broker.amqp_port)
    try:
        yield e
    finally:
        e.close()
