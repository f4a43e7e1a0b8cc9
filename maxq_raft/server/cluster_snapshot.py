"""A cluster member's snapshot of one group: what its machines hold after a given log index.

Theory of operation: the engine keeps a snapshot file per group (replication/snapshot_file.py)
whose body is ours. A group's state here is (a) its apply order (machines/apply_order.py: each
origin's next sequence number, entries that came early, lives declared dead), and (b) its machines: the metadata machine for "meta" (metadata_snapshot.py), every queue
machine of the shard for a shard (machines/snapshot.py, bodies included). The body is a msgpack
stream of records:

  ["group", {"version": 1, "group": name, "index": index}]
  ["order", {origin: next seq}, [[origin, seq, entry payload], ...], [dead origin, ...]]
  ["meta", [metadata records]]                      (meta group)
  ["queue", vhost, name, n] + n queue records       (shard groups, one per queue)
  ["end", {"queues": n}]

`dump_group` runs on the trio thread between two applies, so the state is exactly the state
after `index`; `load_group` replaces the group's state on this member (at start, or when the
leader installs a snapshot because this member fell behind its compacted log). Queue ids and
store keys are this member's own: a loaded queue gets a fresh id and an empty backing, into
which load_queue writes what the original had spilled.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import msgpack

from ..machines.apply_order import ApplyOrder
from ..machines.snapshot import SnapshotError, dump_queue, load_queue
from ..replication.entries import decode_entry
from ..replication.snapshot_file import read_body
from .message_store import QueueBacking
from .metadata_snapshot import dump_metadata, load_metadata

__all__ = ["dump_group", "load_group", "load_group_body", "FORMAT_VERSION"]

log = logging.getLogger("maxq.cluster")

FORMAT_VERSION = 1


def dump_group(cluster, group: str, index: int) -> list[bytes]:
    """The body of the group's snapshot at `index` (the last entry applied here), as chunks."""
    pack = msgpack.Packer(use_bin_type=True).pack
    out = [pack(["group", {"version": FORMAT_VERSION, "group": group, "index": index}])]
    machines = cluster.broker.groups[group]
    expected, held, dead = machines.order.dump()
    out.append(pack(["order", expected, held, dead]))
    queues = 0
    if group == cluster.meta_group:
        out.append(pack(["meta", list(dump_metadata(machines.machine))]))
    else:
        for key, machine in machines.queues.items():
            records = list(dump_queue(machine))
            out.append(pack(["queue", key[0], key[1], len(records)]))
            out.extend(pack(r) for r in records)
            queues += 1
    out.append(pack(["end", {"queues": queues}]))
    return out


def load_group(cluster, group: str, header) -> None:
    """Make the group's state on this member the snapshot's (the trio thread)."""
    load_group_body(cluster, group, header.index, read_body(header))


def load_group_body(cluster, group: str, index: int, chunks: Iterable[bytes]) -> None:
    """`load_group` from the body's chunks as `dump_group` made them (a file's, or in memory:
    tests/sim restarts replicas from these)."""
    unpacker = msgpack.Unpacker(raw=False, use_list=True, strict_map_key=False, max_buffer_size=256 << 20)
    records = _records(unpacker, chunks)
    first = next(records, None)
    if (
        type(first) is not list
        or len(first) != 2
        or first[0] != "group"
        or type(first[1]) is not dict
        or first[1].get("version") != FORMAT_VERSION
        or first[1].get("group") != group
    ):
        raise SnapshotError(f"snapshot of {group} at {index}: not a group snapshot of this version: {str(first)[:80]}")
    order = next(records, None)
    if type(order) is not list or len(order) != 4 or order[0] != "order":
        raise SnapshotError(f"snapshot of {group} at {index}: no apply-order record")
    broker = cluster.broker
    loaded: dict[tuple, Any] = {}
    meta = None
    ended = None
    for record in records:
        kind = record[0] if type(record) is list and record else None
        if kind == "meta":
            meta = load_metadata(record[1])
        elif kind == "queue":
            _, vhost, name, n = record
            key = (vhost, name)
            queue_records = [next(records) for _ in range(n)]
            backing = None
            if broker.store is not None:
                queue_id = broker.next_queue_id
                broker.next_queue_id += 1
                broker.queue_ids[key] = queue_id
                backing = QueueBacking(broker.store, queue_id, False, broker.epoch, None)
            loaded[key] = load_queue(queue_records, backing=backing)
        elif kind == "end":
            ended = record[1]
            break
        else:
            raise SnapshotError(f"snapshot of {group} at {index}: unknown record {str(record)[:60]}")
    if ended is None or ended.get("queues") != len(loaded):
        raise SnapshotError(f"snapshot of {group} at {index}: truncated or miscounted")
    _, expected, held, dead = order
    for _origin, _seq, payload in held:
        decode_entry(payload)  # checked now: a bad one fails the load, not a later apply
    # The state is read whole: now replace this member's.
    machines = broker.groups[group]
    if group == cluster.meta_group:
        if meta is None:
            raise SnapshotError(f"snapshot of {group} at {index}: no metadata record")
        machines.machine = meta
        for vhost in list(meta.vhosts):  # the shell's settings of queues held elsewhere (x-publish-rate-limit)
            broker.queue_records_changed(vhost)
    else:
        for key in [k for k in machines.queues if k not in loaded]:
            old = machines.queues.pop(key)
            if old.backing is not None:
                old.backing.drop()
            if broker.queues.get(key) is old:
                del broker.queues[key]
            broker.queue_ids.pop(key, None)
            broker.queue_settings_changed(key, None)
        for key, machine in loaded.items():
            old = machines.queues.get(key)
            if old is not None and old.backing is not None and old.backing is not machine.backing:
                old.backing.drop()
            machines.queues[key] = machine
            broker.queues[key] = machine
            broker.queue_settings_changed(key, machine)  # (x-trace, x-publish-rate-limit: the installed settings)
    machines.order = ApplyOrder.load(expected, held, dead)


def _records(unpacker, chunks: Iterable[bytes]):
    for chunk in chunks:
        unpacker.feed(chunk)
        yield from unpacker
