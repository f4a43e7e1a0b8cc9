"""What one connection's user may do in its vhost: RabbitMQ's resource and topic checks.

Theory of operation: a connection checks each operation against the metadata machine's
permissions as this node holds them, where rabbit_channel checks them, and refuses with
RabbitMQ's 403 ACCESS_REFUSED texts. The answers are cached per connection (publishers name the
same exchange again and again) and the cache is dropped whenever the machine's
`access_version` moves, so a permission change applies to the next operation of every
connection, as RabbitMQ's channel permission cache does at its next refresh.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..amqp import spec
from ..machines import metadata as md
from .errors import AccessRefused

KINDS = ("configure", "write", "read")
CACHED_MAX = 256  # answers kept per connection; beyond it the cache starts again


def _resource(resource_type: str, name: str, vhost: str) -> str:
    return f"{resource_type} '{name}' in vhost '{vhost}'"  # rabbit_misc:rs


class Authorization:
    def __init__(self, broker: Any, user: str, vhost: str) -> None:
        self.broker = broker  # broker.meta: a snapshot install replaces the machine
        self.user = user
        self.vhost = vhost
        self._meta: md.MetadataMachine | None = None
        self._version = -1
        self._answers: dict[tuple[str, str, str], bool] = {}
        self._published_to: str | None = None  # see check_publish

    def _permitted(self, kind: str, resource_type: str, name: str) -> bool:
        meta: md.MetadataMachine = self.broker.meta
        if meta is not self._meta or meta.access_version != self._version or len(self._answers) >= CACHED_MAX:
            self._answers.clear()
            # (and the publish allowed last: its check is made again too. Kept, it outlived a
            # refusal that refreshed the version, and the next publish to that exchange, on any
            # channel of the connection, went through unchecked)
            self._published_to = None
            self._meta = meta
            self._version = meta.access_version
        key = (kind, resource_type, name)
        answer = self._answers.get(key)
        if answer is None:
            permission = meta.permission(self.vhost, self.user)
            answer = self._answers[key] = permission is not None and permission.allows(kind, name)
        return answer

    def check(self, kind: str, resource_type: str, name: str) -> None:
        """ChannelError 403 unless the user may `kind` ("configure", "write", "read") the
        exchange or queue `name`."""
        if not self._permitted(kind, resource_type, name):
            raise AccessRefused(
                spec.ACCESS_REFUSED,
                f"{kind} access to {_resource(resource_type, name, self.vhost)} refused for user '{self.user}'",
            )

    def check_publish(self, meta: md.MetadataMachine, exchange: str) -> None:
        """`check("write", "exchange", exchange)` for a publish, `meta` being `broker.meta`: the
        last exchange allowed is kept beside the cache, because a publisher names the same one
        again and again and the general lookup cost 3 % of a transient publish's CPU (py-spy)."""
        if exchange == self._published_to and meta is self._meta and meta.access_version == self._version:
            return
        self.check("write", "exchange", exchange)  # raises, or leaves _meta and _version current
        self._published_to = exchange

    def check_topic(self, kind: str, exchange: str, routing_key: str) -> None:
        """RabbitMQ's topic authorisation on a topic exchange: without a topic permission for
        the exchange every routing key is allowed; with one, its pattern must match."""
        v = self.broker.meta.vhosts.get(self.vhost)
        mine = v.topic_permissions.get(self.user) if v is not None else None
        if not mine:
            return
        permission = mine.get(exchange)
        if permission is None:
            return
        if not permission.allows(kind, routing_key, {"username": self.user, "vhost": self.vhost}):
            raise AccessRefused(
                spec.ACCESS_REFUSED,
                f"{kind} access to topic '{routing_key}' in exchange '{exchange}' in vhost '{self.vhost}' "
                f"refused for user '{self.user}'",
            )

    def is_topic_exchange(self, exchange: str) -> bool:
        record = self.broker.meta.exchange(self.vhost, exchange)
        return record is not None and record.routing_type == "topic"


def vhost_refusal(
    meta: md.MetadataMachine, user: str, vhost: str, connections: Callable[[Callable[[Any], bool]], int]
) -> str | None:
    """Why `user` may not open `vhost` (RabbitMQ's 530 NOT_ALLOWED texts), or None.
    `connections(predicate)` counts this node's open connections that match; it is called only
    when a limit is set (counting is linear in the connections)."""
    v = meta.vhosts.get(vhost)
    if v is None:
        return f"vhost {vhost} not found"
    if user not in v.permissions:
        return f"access to vhost '{vhost}' refused for user '{user}'"
    limit = v.limits.get("max-connections")
    if limit is not None and connections(lambda s: s.vhost == vhost) >= limit:
        return f"access to vhost '{vhost}' refused for user '{user}': connection limit ({limit}) is reached"
    record = meta.users.get(user)
    limit = record.limits.get("max-connections") if record is not None else None
    if limit is not None and connections(lambda s: s.user == user) >= limit:
        return f"Connection refused for user '{user}'. User connection limit ({limit}) is reached"
    return None
