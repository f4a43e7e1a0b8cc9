"""Consumer pause and resume in the queue machine (issue #20, item 2).

Theory of operation: a pause is a standing rule of the queue, `(scope, key)`:
- `("queue", "")`: every consumer of the queue;
- `("tag", T)`: consumers whose consumer tag is T (on any channel, now or later);
- `("connection", C)`: consumers on connection C ("node@connection", the prefix of an owner).
A consumer is paused while any rule covers it. A paused consumer keeps its subscription and its
unacked deliveries (it may still ack, nack or reject them); it simply gets nothing new, as if its
prefetch were full. Resuming removes exactly the rule named, then hands out what waits.

The rules are machine state, so they replicate with the log, are in the queue's snapshot, and
survive a failover and a restart (a single node, which replays no log, keeps a durable queue's
rules in its store: `Backing.pauses_write`): a consumer that comes back with a paused tag (or on a paused
queue) attaches paused. A connection's id is not reused after it closes, so a connection rule
outlives its connection harmlessly; `resume` removes it.

Each `Consumer` carries `paused`, kept equal to "some rule covers it" at every change of rules
and at attach, so the delivery loops test one attribute, not the rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .commands import PauseConsumers, malformed
from .queue_types import Rejected

if TYPE_CHECKING:
    from .consumer import Consumer
    from .queue_types import Backing, Effect

PAUSE_SCOPES = ("queue", "tag", "connection")
PAUSE_RULES_MAX = 1024  # per queue: every rule is state in every replica and every snapshot


def consumer_tag(consumer: Consumer) -> str:
    """The AMQP consumer tag: a consumer id is "owner/tag" (server/channel.py)."""
    return consumer.consumer_id[len(consumer.owner) + 1 :]


def consumer_connection(consumer: Consumer) -> str:
    """ "node@connection" of an owner "node@connection/channel"."""
    return consumer.owner.rpartition("/")[0]


class QueuePauses:
    """The pause half of `QueueMachine` (a mixin: it reads `consumers` and calls `_service`)."""

    if TYPE_CHECKING:
        # QueueMachine's
        consumers: dict[str, Consumer]
        backing: Backing | None
        durable: bool

        def _service(self) -> list[Effect]: ...

    def _init_pauses(self) -> None:
        self.pause_rules: set[tuple[str, str]] = set()

    def covered_by_pause(self, consumer: Consumer) -> bool:
        rules = self.pause_rules
        if not rules:
            return False
        return (
            ("queue", "") in rules
            or ("tag", consumer_tag(consumer)) in rules
            or ("connection", consumer_connection(consumer)) in rules
        )

    @property
    def paused_consumer_count(self) -> int:
        """Consumers attached (not cancelled) and paused."""
        return sum(1 for c in self.consumers.values() if c.active and c.paused)

    def _pause_consumers(self, cmd: PauseConsumers) -> tuple[int | Rejected, list[Effect]]:
        """Add (`paused`) or remove the rule; the reply is how many consumers are paused now."""
        scope, key, paused = cmd.scope, cmd.key, cmd.paused
        if (
            type(scope) is not str
            or scope not in PAUSE_SCOPES
            or type(key) is not str
            or (scope == "queue") != (key == "")
            or type(paused) is not bool
        ):
            return malformed(cmd), []
        rule = (scope, key)
        if paused:
            if rule not in self.pause_rules and len(self.pause_rules) >= PAUSE_RULES_MAX:
                return Rejected(406, f"too many consumer pauses on this queue (at most {PAUSE_RULES_MAX})"), []
            self.pause_rules.add(rule)
        else:
            self.pause_rules.discard(rule)
        for consumer in self.consumers.values():
            consumer.paused = self.covered_by_pause(consumer)
        if self.durable:  # a single node has no log to replay at a restart: its store keeps them
            self.backing.pauses_write(sorted(self.pause_rules))  # type: ignore[union-attr]  # durable: a backing
        return self.paused_consumer_count, ([] if paused else self._service())

    def _dump_pauses(self) -> dict[str, Any]:
        return {"pause_rules": sorted([scope, key] for scope, key in self.pause_rules)}

    def recover_pauses(self) -> None:
        """A restarted single node: the rules its backing kept (before any consumer attaches)."""
        if self.backing is None or not self.durable:
            return
        self.pause_rules = {(scope, key) for scope, key in self.backing.pauses_stored()}

    def _load_pauses(self, header: dict[str, Any]) -> None:
        """After the consumers are loaded. (No "pause_rules" in a dump made before pauses.)"""
        self.pause_rules = {(scope, key) for scope, key in header.get("pause_rules", [])}
        for consumer in self.consumers.values():
            consumer.paused = self.covered_by_pause(consumer)
