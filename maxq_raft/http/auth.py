"""Who is asking the admin API, and what their tags let them do (RabbitMQ management's rules).

Every request carries HTTP basic credentials of a MaxQ-Raft user (the AMQP users: one store);
without them, or with wrong ones, the answer is 401 with a `WWW-Authenticate` challenge. As in
RabbitMQ, `guest` is refused from anywhere but loopback, and only users with a management tag
may use the API at all:

    management     reads what is in the vhosts it has permissions in, and its own connections
    policymaker    management, and sets and clears policies in those vhosts
    monitoring     management, and reads everything (every vhost, every connection, the cluster)
    administrator  everything: users, vhosts, permissions, limits, cluster membership

A route names the tag it needs (`Need`); list views are filtered for users who may not see
everything (`visible`).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from enum import IntEnum

from ..machines import metadata as md
from ..machines.access import UserRecord
from ..server.session import is_loopback

REALM = "MaxQ-Raft Management"
MANAGEMENT_TAGS = frozenset({"management", "policymaker", "monitoring", "administrator"})


class Need(IntEnum):
    """What a route needs, weakest first."""

    MANAGEMENT = 1  # any management user (views are filtered)
    POLICYMAKER = 2
    MONITORING = 3
    ADMINISTRATOR = 4


NEED_WORDS = {
    Need.MANAGEMENT: "management",
    Need.POLICYMAKER: "policymaker",
    Need.MONITORING: "monitor",
    Need.ADMINISTRATOR: "administrator",
}


class Unauthorized(Exception):
    """401: no user, or one the API does not let in (the text is RabbitMQ's reason)."""


class Forbidden(Exception):
    """A known management user without the tag the route needs (RabbitMQ answers 401 too)."""


class LoginFailed(Unauthorized):
    """No such user, or not its password: a user (or a password) just made through another
    cluster member may not be applied here yet (admin_app asks again after a metadata barrier)."""


@dataclass(frozen=True)
class Caller:
    user: UserRecord

    @property
    def name(self) -> str:
        return self.user.name

    def has(self, need: Need) -> bool:
        tags = set(self.user.tags)
        if "administrator" in tags:
            return True
        if need is Need.MONITORING:
            return "monitoring" in tags
        if need is Need.POLICYMAKER:
            return "policymaker" in tags
        if need is Need.MANAGEMENT:
            return bool(tags & MANAGEMENT_TAGS)
        return False

    @property
    def sees_everything(self) -> bool:
        return self.has(Need.MONITORING)

    def vhosts(self, meta: md.MetadataMachine) -> set[str]:
        """The vhosts this user may see (those it has permissions in; all for monitoring)."""
        if self.sees_everything:
            return set(meta.vhosts)
        return {name for name, v in meta.vhosts.items() if self.name in v.permissions}


def authenticate(meta: md.MetadataMachine, authorization: str | None, peer_host: str) -> Caller:
    """The caller named by an `Authorization: Basic ...` header; Unauthorized without valid
    credentials, Forbidden for a user without a management tag."""
    if not authorization:
        raise Unauthorized("Not authorized: send the credentials of a user with HTTP basic auth")
    scheme, _, encoded = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        raise Unauthorized("Not authorized: only HTTP basic auth is accepted")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise Unauthorized("Not authorized: malformed basic credentials") from None
    username, colon, password = decoded.partition(":")
    user = meta.users.get(username)
    if not colon or user is None or not user.password_matches(password):
        raise LoginFailed("Login failed")
    if username == md.GUEST and not is_loopback(peer_host):
        raise Unauthorized("User can only log in via localhost")  # RabbitMQ's loopback_users
    caller = Caller(user)
    if not caller.has(Need.MANAGEMENT):
        raise Forbidden("Not management user")  # a known user: RabbitMQ's "not_authorised"
    return caller


def check(caller: Caller, need: Need, meta: md.MetadataMachine, vhost: str | None = None) -> None:
    """Forbidden unless the caller has what `need` asks (and, for a vhost's objects, may see it)."""
    if not caller.has(need):
        raise Forbidden(f"Not {NEED_WORDS[need]} user")  # RabbitMQ's reasons
    if vhost is not None and not caller.has(Need.ADMINISTRATOR) and vhost not in caller.vhosts(meta):
        raise Forbidden("User not authorised to access virtual host")


def visible(caller: Caller, meta: md.MetadataMachine, items: list) -> list:
    """A list view's items this caller may see: everything for monitoring and administrators;
    else the items of its vhosts, and of connections only its own."""
    if caller.sees_everything:
        return items
    vhosts = caller.vhosts(meta)
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        if "vhost" in item and item["vhost"] not in vhosts:
            continue
        if ("peer_host" in item or "connection_details" in item) and item.get("user") != caller.name:
            continue  # a connection or a channel: its user's own only
        out.append(item)
    return out
