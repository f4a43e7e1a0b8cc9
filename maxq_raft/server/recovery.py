"""A single node's start: what its store holds becomes its machines again, without reading messages.

Theory of operation (docs/storage.md, "Start-up"): the epoch goes up by one (records written by
earlier runs that were not durable are stale); the metadata log's snapshot and entries are
replayed through the local log, so every command is applied as it was the first time and its
cascades happen again (a durable queue's declare makes its machine with the store id it had);
what is not durable is deleted, as RabbitMQ drops transient queues and exchanges on restart;
each durable queue then learns from two point reads and two seeks what it holds (its counters
and its key bounds) and starts with everything "spilled", nothing in memory; records of queues
that no longer exist are dropped; a new metadata snapshot replaces the log. Then the metadata
log starts recording again (`Applier.topology`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..machines import metadata as md
from ..machines.delayed import DELAYED_BASE
from ..machines.queue import SEQ_MASK
from . import persistence
from .applier import NoTopologyRecord
from .local_log import LocalLog
from .message_store import DEDUP_QUEUE_BIT, TXN_QUEUE_BIT, WalSyncer, counters_key, decode_counters

log = logging.getLogger("maxq.broker")


def _ignore(_reply: Any) -> None:
    pass


def recover(broker, local_log: LocalLog, call_soon: Callable[..., None]) -> None:
    """Open what the store holds: durable topology and durable queues; drop everything else.
    Raises StorageError or MetadataCorruption when the store is damaged or cannot write."""
    store = broker.store
    broker.epoch = int.from_bytes(store.get_meta(persistence.EPOCH_KEY) or b"\0", "big") + 1
    store.write((), (), {persistence.EPOCH_KEY: broker.epoch.to_bytes(8, "big")}, wal=True)
    broker.next_queue_id = int.from_bytes(store.get_meta(persistence.NEXT_QUEUE_ID_KEY) or b"\0\0\0\0\0\0\0\1", "big")

    def sync_outcome(ticket: int, mark: Any) -> None:  # the syncer thread: hop to the loop
        try:
            call_soon(local_log.on_sync, ticket, mark)
        except RuntimeError:
            pass  # the loop is closing

    broker.syncer = WalSyncer(store, sync_outcome, fsync=broker.fsync)
    metadata_log = persistence.MetadataLog(store)
    local_log.applier.topology = NoTopologyRecord()  # replaying: nothing is logged again
    for command, queue_id in metadata_log.entries():
        if type(command) is md.DeclareQueue:
            local_log.forced_queue_id = queue_id
            try:
                local_log.declare_queue(command, _ignore)
            finally:
                local_log.forced_queue_id = None
        else:
            local_log.submit(None, command, None)
    # What is not durable does not survive a restart (RabbitMQ): queues, then exchanges.
    meta = broker.meta
    for vhost in list(meta.vhosts.values()):
        for queue in list(vhost.queues.values()):
            if not (queue.durable and queue.exclusive_owner is None):
                broker.delete_queue((vhost.name, queue.name))
        for exchange in list(vhost.exchanges.values()):
            if not exchange.durable:
                local_log.submit(None, md.DeleteExchange(vhost.name, exchange.name, False), None)
    live_ids = set()
    for queue_key, queue in broker.queues.items():
        queue_id = broker.queue_ids[queue_key]
        live_ids.add(queue_id)
        live_ids.add(queue_id | DEDUP_QUEUE_BIT)  # a FIFO or x-message-deduplication queue's window
        live_ids.add(queue_id | TXN_QUEUE_BIT)  # half messages of open transactions
        backing = queue.backing
        persistent, next_seq, delivered = decode_counters(store.get_meta(counters_key(queue_id)))
        bounds = store.bounds(queue_id)
        # Seqs are never reused, not even those of transient messages that are gone: a new
        # message at or below the delivered watermark would come back redelivered=true.
        # (The counters' next_seq moves only with durable writes; delivered with deliveries.)
        next_seq = max(
            next_seq, delivered + 1, (bounds[1] & SEQ_MASK) + 1 if bounds and bounds[1] < DELAYED_BASE else 0
        )
        if bounds and not persistent:
            # Nothing durable is stored, so whatever is there is transient records of an
            # earlier run that RocksDB had flushed: one range tombstone frees them, where
            # loading would only skip them (and they would stay on disk until the queue goes).
            store.drop_queue(queue_id)
            bounds = None
        backing.persistent, backing.delivered_upto, backing.next_seq = persistent, delivered, next_seq
        if bounds:
            # Two point reads, whatever the depth: the head is what is delivered first and
            # the tail holds the last writes before the stop, so damage there stops the start
            # (StorageError -> exit 1 naming the record) instead of failing the first
            # basic.get. Damage deeper in is met when read (logged), or by `--check`.
            store.get(queue_id, bounds[0])
            store.get(queue_id, bounds[1])
        queue.recover(
            next_seq=backing.next_seq,
            spilled_count=persistent if bounds else 0,
            spill_cursor=bounds[0] if bounds else 0,
        )
        queue.recover_fifo()
        queue.recover_pauses()
        queue.recover_dedup()
        queue.recover_txns()
    for queue_id in store.queue_ids():
        if queue_id not in live_ids:
            store.drop_queue(queue_id)
    topology = persistence.DurableTopology(metadata_log, broker.queue_ids)
    topology.start(meta)
    metadata_log.write_snapshot(persistence.snapshot_entries(meta, broker.queue_ids))
    store.sync_wal()
    local_log.applier.topology = topology
    log.info(
        "recovered %d durable queues (%d messages), %d exchanges",
        len(broker.queues),
        sum(q.ready_count for q in broker.queues.values()),
        sum(len(v.exchanges) for v in meta.vhosts.values()),
    )
