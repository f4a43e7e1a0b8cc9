"""The engine's messages between members (ReplicationNode.send_message), faked: one ordered link
per (sender, receiver); as a fault, a message on its way is dropped.

Theory of operation: what a member sends another goes at the end of the link's queue and is
taken from its front (`take`), so a link never reorders. `drop` loses one message anywhere in a
link (a link that went down and came back: what was on it is gone); the receiver notices at the
next message's number. `cut` loses everything to and from a member that restarted (its
connections went with its process), or from a leader that lost its leadership by being cut
off. A message to a name that is no member is dropped at once,
as the engine's hub does (no link to it: its `messages_dropped`), and counted (`nowhere`).
"""

from __future__ import annotations

import random
from collections import deque

import msgpack


class Links:
    def __init__(self, members: list[str]) -> None:
        self.members = members
        self.queues: dict[tuple[str, str], deque[bytes]] = {}  # (sender, receiver) -> payloads in order
        self.sent = 0
        self.dropped = 0
        self.nowhere: dict[str, int] = {}  # a name that is no member -> messages sent to it
        self.asks_lost: set[str] = set()  # the members a resync request ("?") of was lost (for the checks)

    def send(self, sender: str, receiver: str, payload: bytes) -> bool:
        """False: `receiver` is no member (dropped)."""
        if receiver not in self.members:
            self.nowhere[receiver] = self.nowhere.get(receiver, 0) + 1
            return False
        self.queues.setdefault((sender, receiver), deque()).append(payload)
        self.sent += 1
        return True

    def busy(self) -> list[tuple[str, str]]:
        """The links with a message on its way, in a fixed order (their creation's)."""
        return [link for link, queue in self.queues.items() if queue]

    def take(self, link: tuple[str, str]) -> bytes:
        return self.queues[link].popleft()

    def drop(self, rng: random.Random) -> tuple[tuple[str, str], int] | None:
        """Lose one message of a busy link (any of them); returns (link, its position)."""
        busy = self.busy()
        if not busy:
            return None
        link = rng.choice(busy)
        queue = self.queues[link]
        position = rng.randrange(len(queue))
        self._lost(link[0], queue[position])
        del queue[position]
        self.dropped += 1
        return link, position

    def _lost(self, sender: str, payload: bytes) -> None:
        if ["?"] in msgpack.unpackb(payload, raw=False)[2]:  # ([life, number, items]: never fragments here)
            self.asks_lost.add(sender)

    def cut(self, member: str, outgoing_only: bool = False) -> int:
        """Lose what is on the links to and from `member` (or only from it); returns how many."""
        lost = 0
        for (sender, receiver), queue in self.queues.items():
            if sender == member or (receiver == member and not outgoing_only):
                lost += len(queue)
                for payload in queue:
                    self._lost(sender, payload)
                queue.clear()
        self.dropped += lost
        return lost

    def pending(self) -> int:
        return sum(len(queue) for queue in self.queues.values())
