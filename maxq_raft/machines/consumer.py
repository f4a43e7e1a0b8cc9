"""A consumer as a queue machine sees it: who holds it, its prefetch and flow credit, what it holds.

Its own module so that the queue's core (queue.py) and its limits (queue_limits.py) can both name
it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .message import Message


@dataclass
class Consumer:
    consumer_id: str
    owner: str  # the channel that holds it ("node@connection/channel"); `Down(owner)` releases it
    prefetch: int  # 0 = unlimited (manual ack only)
    no_ack: bool
    priority: int
    credit: int  # flow window: deliveries not yet written by the shell
    active: bool = True  # False after cancel: stays until its unacked are settled
    paused: bool = False  # a pause covers it (consumer_pauses.py): no new deliveries, acks still count
    rate_limit: int = 0  # x-consume-rate-limit of basic.consume: deliveries per second (0: none)
    rate_tat_us: int = 0  # its bucket (consume_rate.py)
    # seq -> Message, delivered with manual ack and not yet settled or returned (a no-ack consumer
    # holds some only if it reused the tag of a cancelled manual-ack consumer that held them)
    checked_out: dict[int, Message] = field(default_factory=dict)

    def has_room(self) -> bool:
        if not self.active or self.paused or self.credit <= 0:
            return False
        return self.no_ack or self.prefetch == 0 or len(self.checked_out) < self.prefetch
