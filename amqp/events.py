"""Events a `ServerConnection` hands to its owner (bytes in, events out, as in h11).

The connection handles the protocol's own bookkeeping (handshake, tuning, heartbeats,
channel open/close, content assembly) and reports only what the broker must act on.
Events are small records, never changed once handed out (a `PublishesReceived` gains
bodies only while `next_events` is still reading); the hot ones (`ContentReceived`,
`MethodReceived`, one per publish or ack) are not frozen, because a frozen dataclass's
`__init__` sets each field through `object.__setattr__` and costs three times as much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from .spec import BasicPublish, Method
from .values import FieldTable


@dataclass(frozen=True, slots=True)
class ConnectionOpened:
    """connection.open accepted: the peer is authenticated and bound to a vhost."""

    user: str
    vhost: str
    client_properties: FieldTable
    channel_max: int
    frame_max: int
    heartbeat_s: int


@dataclass(frozen=True, slots=True)
class ChannelOpened:
    channel: int


@dataclass(frozen=True, slots=True)
class ChannelClosed:
    """The channel is gone: closed by the peer, or our close was acknowledged.

    The broker releases everything the channel held (consumers, unacked deliveries). When the
    peer closed it, the broker then calls `finish_peer_close` once what it owes the channel
    (confirms) is written; until then the number stays taken and the peer's frames on it are
    dropped.
    """

    channel: int
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class MethodReceived:
    """A method without content on an open channel, for the broker to perform."""

    channel: int
    method: Method


@dataclass(slots=True)
class ContentReceived:
    """A method with content (basic.publish), assembled from its method, header and body frames.

    `props_raw` is the encoded property list exactly as the publisher sent it, so the broker can
    forward it to consumers without decoding and re-encoding.
    """

    channel: int
    method: BasicPublish
    props_raw: bytes
    body: bytes


@dataclass(slots=True)
class PublishesReceived:
    """Consecutive whole basic.publishes on one channel with the same method (exchange, routing
    key, flags) and the same property list, in the order they came: one per body. A connection
    made with `publish_runs=True` reports a whole publish this way (a run of one when the next
    differs); one of several body frames still comes as a ContentReceived.

    A publisher mostly repeats itself: the broker checks and routes a run once (Session)."""

    channel: int
    method: BasicPublish
    props_raw: bytes
    bodies: list[bytes]


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """Terminal: flush `data_to_send()` and close the socket.

    `by_peer` is True when the peer asked to close (or vanished), False when we closed it.
    """

    reply_code: int
    reply_text: str
    by_peer: bool


Event: TypeAlias = (
    ConnectionOpened
    | ChannelOpened
    | ChannelClosed
    | MethodReceived
    | ContentReceived
    | PublishesReceived
    | ConnectionClosed
)
