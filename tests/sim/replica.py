"""A simulated cluster member's state: its groups, applied from the committed logs as the server does.

Theory of operation: a replica holds the metadata group and the shard groups its node holds
(machines/shard.py: all S of them, or a few, layout.py), whose queue machines keep what leaves
their window in the member's real queue backing (server/message_store.py) over an in-memory
segment store, as `ClusterLog.make_queue` makes them. `apply(group, index, payload)` is `ClusterLog._apply` for one committed entry minus the
shell: decode, skip an entry of a life declared dead (telling `on_dead_origin`, where the
server would start a new life if it were its own), then `apply_committed` (the same function
server/cluster.py calls) with each command applied to its group's machine.

A replica can be snapshotted (`snapshot()`: `dump_group` per group, the bytes a member writes)
and rebuilt from one (`Replica.restored`: `load_group_body`, what a member does at start or when
the leader installs a snapshot), after which it replays the log from the snapshot's index on.

`digest(group)` summarises a group's replicated state: its apply order and every queue's
records as `dump_queue` writes them (ready messages in order, consumers and what they hold,
counters), or the metadata records; replicas that applied the same prefix must agree. Queue
digests are cached and recomputed only for queues a command touched since.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import msgpack

from .api import (
    ALL_QUEUES,
    META_GROUP,
    Broker,
    MemoryKV,
    MemorySegmentStore,
    Meta,
    MetaGroup,
    PublishRates,
    QueueBacking,
    QueueTimers,
    ShardMachine,
    TraceLog,
    Tracer,
    apply_committed,
    decode_entry,
    dump_group,
    dump_metadata,
    dump_queue,
    load_group_body,
    make_queue_machine,
    settings_or_default,
)

# Where a dumped queue holds messages (machines/snapshot.py's places). `dying` and `unstore`
# name messages on their way out within a command; between commands they are empty here.
PRESENT_PLACES = (
    "ready",
    "lane",
    "returned",
    "dead_lettering",
    "checked_out",
    "delayed",
    "spilled",
    "lane_spilled",
    "delayed_spilled",
)
_pack = msgpack.Packer(use_bin_type=True).pack


def message_number(body: bytes) -> int:
    """The workload's number of a message (its body is b"m<number>")."""
    assert body[:1] == b"m", body
    return int(body[1:])


class Replica:
    def __init__(self, name: str, shards: list[str], window_max: int) -> None:
        self.name = name
        self.shards = shards
        self.window_max = window_max
        self.store = MemorySegmentStore(name)
        # What server/cluster_snapshot.py reads of a member: broker.groups and its store, the ids.
        self.broker = SimpleNamespace(
            groups={},
            store=self.store,
            next_queue_id=1,
            queue_ids={},
            queues={},
            epoch=1,
            # The shell's indexes of queue settings: the snapshot loader tells them each queue's
            # settings through Broker.queue_settings_changed, as on a member.
            tracer=Tracer(TraceLog(MemoryKV())),
            publish_rates=PublishRates(),
            queue_timers=QueueTimers(),  # (the ticker's index: touched by the same call)
        )
        self.broker.queue_settings_changed = functools.partial(Broker.queue_settings_changed, self.broker)
        # Nothing here reads a queue's settings through the broker (the shell's indexes only):
        # none is looked up elsewhere, even for a group this replica does not hold.
        self.broker.settings_elsewhere = lambda key: None
        self.broker.queue_records_changed = lambda vhost, name=None: None
        self.cluster = SimpleNamespace(broker=self.broker, meta_group=META_GROUP)
        self.broker.groups[META_GROUP] = MetaGroup()
        for group in shards:
            self.broker.groups[group] = ShardMachine(group, self._make_queue)
        self.applied: dict[str, int] = {group: 0 for group in self.broker.groups}
        # Called for every command applied: (group, index, entry, target, command, request, reply, effects).
        self.observer: Callable[..., None] | None = None
        # Called after each entry applied (held ones it released included): (group, index, entry).
        self.on_entry: Callable[[str, int, Any], None] | None = None
        # Called for an entry skipped because its life is dead: (group, origin).
        self.on_dead_origin: Callable[[str, str], None] | None = None
        # group -> the queues whose cached state is stale ({key: None}, or True: all of them)
        self._stale: dict[str, Any] = {group: True for group in shards}
        self._unchecked: dict[str, Any] = {group: True for group in shards}  # the same, for check_invariants
        self._queue_cache: dict[str, dict[tuple[str, str], tuple[bytes, tuple[int, ...], int]]] = {}
        self._digests: dict[str, bytes] = {}

    def _make_queue(self, key: tuple[str, str], create: Any):
        """ClusterLog.make_queue: a backing of this member's own under a fresh id."""
        broker = self.broker
        queue_id = broker.next_queue_id
        broker.next_queue_id += 1
        broker.queue_ids[key] = queue_id
        backing = QueueBacking(self.store, queue_id, False, broker.epoch, None)
        settings = settings_or_default(key[0], key[1], create.arguments)
        return make_queue_machine(
            key[0], key[1], backing=backing, durable=False, settings=settings, window_max=self.window_max
        )

    # ------------------------------------------------------------------ apply

    def apply(self, group: str, index: int, payload: bytes) -> None:
        assert index == self.applied[group] + 1, (self.name, group, index, self.applied[group])
        self.applied[group] = index
        self._digests.pop(group, None)  # (a held or skipped entry changes the order's state too)
        entry = decode_entry(payload)  # the simulation writes no malformed entry: let it raise
        order = self.broker.groups[group].order
        if entry.seq and order.is_dead(entry.origin):
            if self.on_dead_origin is not None:
                self.on_dead_origin(group, entry.origin)
            return
        apply_committed(
            order, entry.origin, entry.seq, payload, entry, lambda e: self._apply_entry(group, index, e), decode_entry
        )

    def _apply_entry(self, group: str, index: int, entry) -> None:
        meta = Meta(index, entry.time_ms)
        machines = self.broker.groups[group]
        origin = entry.origin
        observer = self.observer
        stale = self._stale
        for target, command, request in entry.items:
            reply, effects = machines.apply(meta, target, command, origin)
            if target is not None:
                if target == ALL_QUEUES:
                    stale[group] = True
                    self._unchecked[group] = True
                else:
                    if stale[group] is not True:
                        stale[group][target] = None
                    if self._unchecked[group] is not True:
                        self._unchecked[group][target] = None
            if observer is not None:
                observer(group, index, entry, target, command, request, reply, effects)
        if self.on_entry is not None:
            self.on_entry(group, index, entry)

    # ---------------------------------------------------------------- digests

    def queues(self, group: str) -> dict:
        return self.broker.groups[group].queues

    def queue_state(self, group: str, key: tuple[str, str]) -> tuple[bytes, tuple[int, ...], int]:
        """(digest, numbers of the messages it holds, how many it dropped) of one queue, from its
        dump. (Dropped: expired, over its length limit or its delivery limit, rejected.)"""
        self._refresh(group)
        return self._queue_cache[group][key]

    def _refresh(self, group: str) -> None:
        stale = self._stale[group]
        if not stale:
            return
        queues = self.broker.groups[group].queues
        cache = self._queue_cache.setdefault(group, {})
        if stale is True:
            cache.clear()
            keys = list(queues)
        else:
            keys = [key for key in stale if key in queues]
        for key in keys:
            records = list(dump_queue(queues[key]))
            numbers = []
            dropped = sum(records[0][1]["dropped"].values())
            for record in records:
                if record[0] == "messages" and record[1] in PRESENT_PLACES:
                    numbers.extend(message_number(m[4]) for m in record[3])
                elif record[0] == "messages" and record[1] == "backoff":
                    numbers.extend(message_number(m[1][4]) for m in record[3])
                elif record[0] == "messages" and record[1] == "in_flight":  # [receive id, deadline, received, message]
                    numbers.extend(message_number(m[3][4]) for m in record[3])
            cache[key] = (hashlib.blake2b(_pack(records), digest_size=16).digest(), tuple(numbers), dropped)
        self._stale[group] = {}

    def consumers(self, group: str, key: tuple[str, str]) -> list[tuple[str, str, bool, int]]:
        """(consumer id, owner, active, messages held) of each consumer of a queue, from its dump."""
        held: dict[str, int] = {}
        header: dict = {}
        for record in dump_queue(self.broker.groups[group].queues[key]):
            if record[0] == "queue":
                header = record[1]
            elif record[0] == "messages" and record[1] == "checked_out":
                held[record[2]] = held.get(record[2], 0) + len(record[3])
        return [(c[0], c[1], c[6], held.get(c[0], 0)) for c in header["consumers"]]

    def checked_out(self, group: str, key: tuple[str, str]) -> dict[str, list[tuple[int, int, int]]]:
        """(seq, delivery count, number) of each message a queue has checked out, per consumer, from its dump."""
        out: dict[str, list[tuple[int, int, int]]] = {}
        for record in dump_queue(self.broker.groups[group].queues[key]):
            if record[0] == "messages" and record[1] == "checked_out":
                # (a message record: seq first, the body fifth, the delivery count sixth)
                out.setdefault(record[2], []).extend((m[0], m[5], message_number(m[4])) for m in record[3])
        return out

    def digest(self, group: str) -> bytes:
        cached = self._digests.get(group)
        if cached is not None:
            return cached
        machines = self.broker.groups[group]
        h = hashlib.blake2b(_pack(machines.order.digest()), digest_size=16)
        if group == META_GROUP:
            h.update(_pack(list(dump_metadata(machines.machine))))
        else:
            self._refresh(group)
            cache = self._queue_cache[group]
            for key in machines.queues:
                h.update(_pack(list(key)))
                h.update(cache[key][0])
        digest = self._digests[group] = h.digest()
        return digest

    def check_invariants(self, all_queues: bool = False) -> None:
        """The queue machines' own invariants (the assertion in pairs with the digests): of
        those a command touched since the last check, or of all."""
        for group in self.shards:
            queues = self.broker.groups[group].queues
            unchecked = self._unchecked[group]
            for key in queues if all_queues or unchecked is True else [k for k in unchecked if k in queues]:
                queues[key].check_invariants()
            self._unchecked[group] = {}

    # -------------------------------------------------------------- snapshots

    def snapshot(self) -> dict[str, tuple[int, list[bytes]]]:
        """Each group's snapshot body at the index applied here, as a member writes it."""
        return {
            group: (self.applied[group], dump_group(self.cluster, group, self.applied[group]))
            for group in self.broker.groups
        }

    @classmethod
    def restored(
        cls, name: str, shards: list[str], window_max: int, snapshot: dict[str, tuple[int, list[bytes]]] | None
    ) -> Replica:
        """A member started afresh (a new store) from `snapshot` (None: from the start of the log), of
        the groups it holds (`shards`, and the metadata group)."""
        replica = cls(name, shards, window_max)
        for group, (index, chunks) in (snapshot or {}).items():
            if group not in replica.applied:
                continue  # (the leader's snapshot, here the witness's, has every group)
            load_group_body(replica.cluster, group, index, chunks)
            replica.applied[group] = index
        return replica
