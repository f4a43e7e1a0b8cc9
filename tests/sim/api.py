"""Everything the simulation takes from the system under test, imported here and nowhere else.

The queue machine is used only through its public surface: `apply(meta, command) -> (reply,
effects)`, `check_invariants()`, the commands, `Message`, `Meta`, the `Deliver` effect and the
`Rejected` reply; its state is read only as `dump_queue` writes it (machines/snapshot.py). So a
rename or a split of machines/queue.py is a change to this file alone.

The rest is the replicated glue as the server runs it: the shard and metadata groups, the
per-origin apply order and its loop (`apply_committed`, also what server/cluster.py runs), the
log entry encoding, a group's snapshot (server/cluster_snapshot.py) over the member's real
queue backings (server/message_store.py) on an in-memory segment store; and, for groups held
by a few members, what their leaders send the others (server/remote.py's `Sender` and
`Receiver`, the counts of queue_stats.py). No trio, no sockets.
"""

from __future__ import annotations

import zlib

from maxq_raft.machines import commands as qc
from maxq_raft.machines import metadata as md
from maxq_raft.machines.apply_order import ApplyOrder, apply_committed
from maxq_raft.machines.fifo import DEDUP_WINDOW_MS
from maxq_raft.machines.metadata import META_GROUP
from maxq_raft.machines.priority_queue import make_queue_machine
from maxq_raft.machines.queue import Deliver, Message, Meta, Rejected
from maxq_raft.machines.queue_args import settings_or_default
from maxq_raft.machines.queue_types import HandleResult
from maxq_raft.machines.shard import ALL_QUEUES, LivesDown, MetaGroup, QueueAdded, ShardMachine, ends_life
from maxq_raft.machines.snapshot import dump_queue
from maxq_raft.replication.entries import decode_entry, encode_entry
from maxq_raft.server import remote
from maxq_raft.server.broker import Broker
from maxq_raft.server.cluster_snapshot import dump_group, load_group_body
from maxq_raft.server.message_store import QueueBacking
from maxq_raft.server.metadata_snapshot import dump_metadata
from maxq_raft.server.publish_rates import PublishRates
from maxq_raft.server.queue_stats import STATS_EVERY_S, STATS_PER_ITEM, QueueStats
from maxq_raft.server.queue_timers import QueueTimers
from maxq_raft.server.trace_store import MemoryKV, TraceLog
from maxq_raft.server.tracer import Tracer
from maxq_raft.storage.memory import MemorySegmentStore

__all__ = [
    "DEDUP_WINDOW_MS",
    "qc",
    "md",
    "ApplyOrder",
    "apply_committed",
    "make_queue_machine",
    "Deliver",
    "Message",
    "Meta",
    "Rejected",
    "HandleResult",
    "settings_or_default",
    "ALL_QUEUES",
    "LivesDown",
    "MetaGroup",
    "QueueAdded",
    "ShardMachine",
    "ends_life",
    "dump_queue",
    "decode_entry",
    "encode_entry",
    "dump_group",
    "load_group_body",
    "Broker",
    "PublishRates",
    "remote",
    "QueueStats",
    "STATS_EVERY_S",
    "STATS_PER_ITEM",
    "QueueTimers",
    "QueueBacking",
    "dump_metadata",
    "MemorySegmentStore",
    "MemoryKV",
    "TraceLog",
    "Tracer",
    "META_GROUP",
    "VHOST",
    "shard_of",
]

VHOST = "/"


def shard_of(queue_key: tuple[str, str], count: int) -> str:
    """server/cluster.py's shard_of, copied: importing cluster.py would bring trio in."""
    vhost, name = queue_key
    digest = zlib.crc32(vhost.encode() + b"\0" + name.encode())
    return f"shard-{digest % count}"
