"""The broker on Raft: channel commands proposed to their group, applied on every replica.

Theory of operation: a cluster member runs one metadata group ("meta": vhosts, exchanges, queue
records, bindings) and S shard groups ("shard-0" ...); a queue lives in the shard its name hashes
to. Channels do not apply commands here: `submit` adds each to the open entry of its group, and
at the end of the current scheduler pass (`run_sync_soon`) each open entry is proposed, so the
publishes of every connection of this node for one shard ride in one Raft entry. Entries larger
than ENTRY_BYTES_TARGET are proposed at once and the next one opened; many are in flight.

Every replica applies every committed entry in log order (`_apply`, on the trio thread): the
machines decide alike everywhere, and each node performs only the effects that are its own (a
`Deliver` to a consumer whose connection it holds; others find no handle and skip it). An entry
names its origin (node and process life) and, per command, the origin's request id: the origin hands the machine's
reply to the waiting channel (consume-ok, get-ok, declare-ok ...) before the command's effects
are performed, so consume-ok precedes the first delivery. A proposal that fails ("not leader",
"timeout", "busy") answers its requests with `Unavailable` and nacks the confirms that waited on
it; a publish is confirmed only once every entry carrying it has committed (on a majority,
fsynced on each: replication/engine.py).

A queue is created in its shard (`Create`) before its record is committed in the metadata group,
so by the time any node can route to it, the shard's log already has it: a shard's log alone
decides what its queues hold, whatever pace the metadata group keeps on a replica.

Nodes that go: consumers are owned by "node@connection/channel". A node that starts commits
`Down("node@")` in every shard before it serves (its consumers of an earlier life go, their
unacked messages come back redelivered); the metadata leader commits the same for a member it
has not heard from for NODE_DOWN_AFTER_S. Shard leaders are spread over the members (a member
leading more than its share hands one over every BALANCE_EVERY_S), so the leaders' work is too.
A node whose current life such a Down ended in any group (it was cut off, and the others moved
on) starts a new life and closes its client connections: they reconnect and start over.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import zlib
from collections import deque
from typing import Any, Callable

import trio

from ..amqp import spec
from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.apply_order import apply_committed
from ..machines.priority_queue import make_queue_machine
from ..machines.queue import Meta, QueueMachine, Rejected
from ..machines.queue_args import settings_or_default
from ..machines.shard import ALL_QUEUES, ends_life
from ..replication.entries import EntryError, decode_entry, encode_entry
from . import cluster_snapshot
from .applier import Applier
from .broker import Unavailable
from .command_log import META_GROUP, CommandLog
from .confirms import Pending
from .message_store import QueueBacking

log = logging.getLogger("maxq.cluster")

ENTRY_BYTES_TARGET = 256 * 1024  # well under the engine's 1 MiB payload cap
MESSAGE_OVERHEAD_BYTES = 48
NODE_DOWN_AFTER_S = 3.0
BALANCE_EVERY_S = 5.0
QUORUM_LOST_AFTER_S = 1.5
OUTCOME_WAIT_S = 10.0  # an entry not (known to be) committed is proposed again for this long
RETRYABLE = ("not leader", "timeout", "busy")
CLEANUP_COMMANDS = (qc.Down, md.OwnerDown)  # never given up: see _proposed
NOT_LEADER_RETRY_EVERY_S = 0.05
WATCH_INTERVAL_S = 0.5
BARRIER_RETRY_S = 0.5
SNAPSHOT_EVERY_BYTES = 64 * 1024 * 1024  # --snapshot-every-mb
SNAPSHOT_CHECK_S = 1.0
FLOW_BYTES_HIGH = 4 * 1024 * 1024  # see ClusterLog.flow_bytes
FLOW_BYTES_LOW = 2 * 1024 * 1024
FLOW_LOG_EVERY_S = 10.0


def default_shards() -> int:
    return 2 * (os.cpu_count() or 1)


def shard_groups(count: int) -> list[str]:
    return [f"shard-{i}" for i in range(count)]


def shard_of(queue_key: tuple[str, str], count: int) -> str:
    """The shard group a queue lives in: a hash of vhost and name (every member computes the same)."""
    vhost, name = queue_key
    digest = zlib.crc32(vhost.encode() + b"\0" + name.encode())
    return f"shard-{digest % count}"


class OpenEntry(Pending):
    """Commands gathered for one group, proposed together (done once committed and applied here)."""

    __slots__ = ("group", "items", "requests", "size", "payload", "first_proposed",
                 "seq", "origin", "committed", "maybe_appended", "tombstone", "flow_bytes")

    def __init__(self, group: str) -> None:
        super().__init__()
        self.group = group
        self.items: list = []
        self.requests: list[int] = []
        self.size = 0
        self.payload: bytes | None = None
        self.first_proposed = 0.0
        self.seq = 0  # this life's sequence number of the entry in its group
        self.origin = ""
        self.committed = False  # an attempt committed: it completes when applied here
        self.maybe_appended = False  # an attempt's outcome was unknown: never nack it
        self.tombstone = False  # fills the seq of an entry given up on (no commands)
        self.flow_bytes = 0  # what it counts in ClusterLog.flow_bytes until it is done


class ClusterLog(CommandLog):
    def __init__(self, broker, node, shard_count: int, snapshot_every_bytes: int = SNAPSHOT_EVERY_BYTES) -> None:
        super().__init__(broker)
        self.node = node  # ReplicationNode (or anything with its propose/leader/peer API)
        self.applier = Applier(broker, self)
        # Request ids restart with the process while the log keeps old entries: an entry is this
        # life's only if its origin names this life, or a replayed entry would answer a new request.
        self.origin = f"{broker.node_id}@{secrets.token_hex(6)}"
        self.shards = shard_groups(shard_count)
        self.open: dict[str, OpenEntry] = {}
        self.requests: dict[int, Callable[[Any], None]] = {}
        self.next_request = 1
        self._flush_scheduled = False
        self._token = trio.lowlevel.current_trio_token()
        self._down_since: dict[str, float] = {}
        self._declared_down: dict[str, None] = {}
        self._retries: list[OpenEntry] = []
        self.entry_seq: dict[str, int] = {}  # group -> last seq this life gave an entry
        self.in_flight: dict[tuple[str, int], OpenEntry] = {}  # (group, seq) -> entry, until done
        self._retry_wanted = trio.Event()
        self._quorum_lost_at: float | None = None
        self._next_balance_at = 0.0
        self.entries_applied = 0
        self.entries_proposed = 0
        self.entries_failed = 0
        # Snapshots (cluster_snapshot.py): per group, the last index applied here, the log bytes
        # applied since the last snapshot, and the groups whose snapshot is being written.
        self.meta_group = META_GROUP
        self.snapshot_every_bytes = snapshot_every_bytes
        self.applied_index: dict[str, int] = {}
        self.log_bytes_since: dict[str, int] = {}
        self.snapshot_next_try: dict[str, int] = {}
        self.snapshotting: set[str] = set()
        self.snapshots_taken = 0
        self.snapshots_loaded = 0
        # Flow control: the bytes of this life's entries proposed and not yet done. Above
        # FLOW_BYTES_HIGH publishing connections stop being read until it is back under
        # FLOW_BYTES_LOW (Session._reader), as RabbitMQ's credit flow blocks a channel whose
        # queue is behind: a publisher faster than the cluster commits is slowed down rather
        # than piling proposals into the hub until heartbeats starve and leaders are lost.
        self.flow_bytes = 0
        self.flow_blocks = 0
        self._flow_logged_at = -FLOW_LOG_EVERY_S

    # ------------------------------------------------------------ placement

    def group_of(self, target) -> str:
        if target is None:
            return META_GROUP
        return shard_of(target, len(self.shards))

    def leads(self, group: str) -> bool:
        return self.node.is_leader(group)

    @property
    def replication_node(self):
        return self.node

    def make_queue(self, key: tuple[str, str], create: qc.Create) -> QueueMachine:
        """A queue's machine on this member: its store only takes what overflows the in-memory
        window (the Raft log is what is durable), under an id of this member's own."""
        broker = self.broker
        queue_id = broker.next_queue_id
        broker.next_queue_id += 1
        broker.queue_ids[key] = queue_id
        backing = QueueBacking(broker.store, queue_id, False, broker.epoch, None) if broker.store is not None else None
        settings = settings_or_default(key[0], key[1], create.arguments)
        return make_queue_machine(key[0], key[1], backing=backing, durable=False, settings=settings)

    # -------------------------------------------------------------- submit

    def submit(self, target, command, then: Callable[[Any], None] | None, group: str | None = None) -> OpenEntry:
        """Add a command to its group's open entry; `then(reply)` runs once it is applied here
        (or with `Unavailable`). Returns the entry, for confirms to wait on."""
        group = group or self.group_of(target)
        entry = self.open.get(group)
        if entry is None:
            entry = self.open[group] = OpenEntry(group)
        request = 0
        if then is not None:
            request = self.next_request
            self.next_request += 1
            self.requests[request] = then
            entry.requests.append(request)
        entry.items.append((target, command, request))
        if type(command) is qc.Enqueue:
            entry.size += sum(len(m.body) + len(m.props_raw) + len(m.routing_key) + MESSAGE_OVERHEAD_BYTES
                              for m in command.messages)
        else:
            entry.size += 256
        if entry.size >= ENTRY_BYTES_TARGET:
            del self.open[group]
            self._propose(entry)
        elif not self._flush_scheduled:
            try:
                self._token.run_sync_soon(self.flush)
                self._flush_scheduled = True
            except trio.RunFinishedError:
                pass  # shutting down: nothing will be proposed any more
        return entry

    def flush(self) -> None:
        self._flush_scheduled = False
        entries, self.open = self.open, {}
        for entry in entries.values():
            self._propose(entry)

    def _propose(self, entry: OpenEntry) -> None:
        if entry.payload is None:
            seq = entry.seq
            tracked = not seq  # a filler (tombstone) reuses a seq and is not tracked
            if tracked:
                seq = entry.seq = self.entry_seq.get(entry.group, 0) + 1
                self.entry_seq[entry.group] = seq
                entry.origin = self.origin
                self.in_flight[(entry.group, seq)] = entry
            entry.payload = encode_entry(self.broker.clock_ms(), entry.items, entry.origin, seq)
            entry.first_proposed = trio.current_time()
            self.entries_proposed += 1
            if tracked:
                entry.flow_bytes = len(entry.payload)
                self.flow_bytes += entry.flow_bytes
                if not self.flow_blocked and self.flow_bytes >= FLOW_BYTES_HIGH:
                    self.flow_blocked = True
                    self.flow_room = trio.Event()
                    self.flow_blocks += 1
                    now = trio.current_time()
                    if now - self._flow_logged_at >= FLOW_LOG_EVERY_S:
                        self._flow_logged_at = now
                        log.info("publishers paused: %d KiB proposed and not yet committed (%d pauses so far)",
                                 self.flow_bytes // 1024, self.flow_blocks)
        payload = entry.payload
        token = self._token

        def proposed(index, error) -> None:  # the hub thread
            try:
                token.run_sync_soon(self._proposed, entry, error)
            except trio.RunFinishedError:
                pass
        try:
            self.node.propose(entry.group, payload, proposed)
        except ValueError as exc:  # a payload over the engine's cap: a bug of ours, not the client's
            log.error("cannot propose to %s: %s", entry.group, exc)
            self._proposed(entry, "too large")

    def _proposed(self, entry: OpenEntry, error: str | None) -> None:
        """The engine's answer to one attempt. A commit completes the entry when it is applied
        here (in its origin's order); a failure is tried again while OUTCOME_WAIT_S lasts: the
        appliers apply each (origin, seq) once, so a repeat cannot duplicate nor reorder."""
        if entry.done or entry.origin != self.origin:
            return
        if error is None:
            entry.committed = True
            return
        if error == "timeout":
            entry.maybe_appended = True
        if entry.committed:
            return
        if error in RETRYABLE and (entry.tombstone or trio.current_time() - entry.first_proposed < OUTCOME_WAIT_S):
            self._retries.append(entry)
            if len(self._retries) == 1:
                self._retry_wanted.set()
            return
        if entry.tombstone:
            return
        # Given up: nack only what no attempt may have appended; otherwise the outcome is unknown.
        self._complete(entry, "timeout" if entry.maybe_appended else error)
        # Later entries of this life wait for this seq on every member: fill it with nothing
        # (if the original commits after all, whichever comes first counts, the other is a copy).
        filler = OpenEntry(entry.group)
        filler.tombstone = True
        filler.seq, filler.origin = entry.seq, entry.origin
        self._propose(filler)
        # A consumer or connection that went away must go from the machines even when this node
        # could not commit that for a while, or it stays registered for good and takes its share
        # of the messages, which then sit unacked forever (jepsen seed 86). Those commands are
        # safe to apply late (an owner id names one connection or channel of one life), so they
        # go again in a new entry: if the original commits after all, the copy finds nothing.
        cleanup = [(target, command) for target, command, _request in entry.items
                   if type(command) in CLEANUP_COMMANDS and not command.owner.endswith("@")]  # not a node's lives
        if cleanup and error != "stopped":  # stopping: the others release this node's consumers
            log.warning("%s: %d consumer/connection clean-ups proposed again", entry.group, len(cleanup))
            for target, command in cleanup:
                self.submit(target, command, None, group=entry.group)

    def _complete(self, entry: OpenEntry, error: str | None) -> None:
        self.in_flight.pop((entry.group, entry.seq), None)
        if entry.flow_bytes:
            self.flow_bytes -= entry.flow_bytes
            entry.flow_bytes = 0
            if self.flow_blocked and self.flow_bytes <= FLOW_BYTES_LOW:
                self.flow_blocked = False
                self.flow_room.set()
        if entry.done:
            return
        if error is not None:
            self.entries_failed += 1
            log.warning("%s: %d commands not committed (%s)", entry.group, len(entry.items), error)
            for request in entry.requests:
                then = self.requests.pop(request, None)
                if then is not None:
                    self._call(then, Unavailable(error))
        else:
            # Applied already (on_commit's hop ran first); a request still here had its command
            # skipped (a malformed entry): answer it rather than leave a channel waiting.
            for request in entry.requests:
                then = self.requests.pop(request, None)
                if then is not None:
                    self._call(then, Rejected(541, "command was not applied"))
        self.confirms.done(entry, error)

    @staticmethod
    def _call(then, reply) -> None:
        try:
            then(reply)
        except Exception:  # the channel continuations handle their own errors; this is the backstop
            log.exception("continuation failed")

    # ---------------------------------------------------------------- apply

    def on_commit(self, group: str, entries: list) -> None:
        """The engine's callback (hub thread): hop to the trio thread, in order."""
        try:
            self._token.run_sync_soon(self._apply, group, entries)
        except trio.RunFinishedError:
            pass

    def _apply(self, group: str, entries: list) -> None:
        """Apply committed entries in each origin's own order, each (origin, seq) once: a copy
        (a repeated proposal) is skipped, an entry that overtook an earlier one of its origin
        waits for it (machines/apply_order.py). Every member sees the same log, so every member
        decides alike."""
        order = self.broker.groups[group].order
        if entries:
            self.applied_index[group] = entries[-1][0]
            self.log_bytes_since[group] = self.log_bytes_since.get(group, 0) + sum(len(p) for _i, p in entries)
        for index, payload in entries:
            try:
                entry = decode_entry(payload)
            except EntryError as exc:
                log.error("%s: entry %d skipped: %s", group, index, exc)
                continue
            origin, seq = entry.origin, entry.seq
            if seq and order.is_dead(origin):
                if origin == self.origin:
                    # The cluster declared this life gone, in an entry this member never applied
                    # (it came inside a snapshot): nothing of this life will be applied again.
                    log.warning("%s: this node's life was declared down by the cluster; starting a new one", group)
                    self._cut_off()
                continue
            # (the payload as it came: a snapshot carries a held one raw)
            apply_committed(order, origin, seq, payload, entry, lambda e: self._apply_entry(group, index, e),
                            decode_entry)
        if self.log_bytes_since.get(group, 0) >= self.snapshot_next_try.get(group, self.snapshot_every_bytes):
            self._maybe_snapshot(group)

    # ------------------------------------------------------------ snapshots

    async def snapshot_when_due(self) -> None:
        """Look again every SNAPSHOT_CHECK_S at groups whose log grew enough but whose state was
        too big to snapshot then (their messages have been consumed since, with little log)."""
        while True:
            await trio.sleep(SNAPSHOT_CHECK_S)
            for group, since in list(self.log_bytes_since.items()):
                if since >= self.snapshot_every_bytes:
                    self._maybe_snapshot(group)

    def _maybe_snapshot(self, group: str) -> None:
        """Snapshot the group's state and let the engine compact its log, when that pays: the
        state (bodies of queued messages included) is well below the log it replaces."""
        if group in self.snapshotting or self.node is None:
            return
        since = self.log_bytes_since.get(group, 0)
        if group != META_GROUP:
            live = sum(q.ready_bytes for k, q in self.broker.queues.items() if self.group_of(k) == group)
            if live * 2 > since:
                # Most of the log is still queued messages: try again after more log (or later,
                # snapshot_when_due, once they are consumed).
                self.snapshot_next_try[group] = since + self.snapshot_every_bytes // 4
                return
        index = self.applied_index.get(group, 0)
        try:
            body = cluster_snapshot.dump_group(self, group, index)
        except Exception:
            log.exception("%s: snapshot at %d could not be made", group, index)
            self.snapshot_next_try[group] = since + self.snapshot_every_bytes
            return
        self.snapshotting.add(group)
        token = self._token

        def saved(header, error) -> None:  # the hub or the writer thread
            try:
                token.run_sync_soon(self._snapshot_saved, group, index, header, error)
            except trio.RunFinishedError:
                pass
        self.node.take_snapshot(group, index, body, saved)

    def _snapshot_saved(self, group: str, index: int, header, error: str | None) -> None:
        self.snapshotting.discard(group)
        if header is None:
            log.info("%s: no snapshot at %d (%s); trying again later", group, index, error)
            self.snapshot_next_try[group] = self.log_bytes_since.get(group, 0) + self.snapshot_every_bytes // 4
            return
        self.snapshots_taken += 1
        self.log_bytes_since[group] = 0
        self.snapshot_next_try.pop(group, None)
        log.info("%s: snapshot at index %d saved (%d bytes); the log before it is compacted", group, index,
                 header.body_bytes)

    def on_snapshot(self, group: str, header) -> None:
        """The engine's callback (hub thread): this member's state for `group` is the snapshot's
        (a restart, or the leader installed it because this member fell behind its log)."""
        try:
            self._token.run_sync_soon(self._load_snapshot, group, header)
        except trio.RunFinishedError:
            pass

    def _load_snapshot(self, group: str, header) -> None:
        if self.broker.sessions:
            # Caught up by a snapshot while serving: the clients' view of this member jumps; they
            # reconnect and see the new state (their consumers are cancelled through the log).
            log.warning("%s: this member fell behind the compacted log and installs a snapshot; closing %d "
                        "client connections", group, len(self.broker.sessions))
            self._close_sessions("this member caught up from a snapshot; reconnect")
        try:
            cluster_snapshot.load_group(self, group, header)
        except Exception:
            log.critical("%s: the snapshot at %d cannot be loaded; this member stops", group, header.index,
                         exc_info=True)
            raise
        self.applied_index[group] = header.index
        self.log_bytes_since[group] = 0
        self.snapshots_loaded += 1
        log.info("%s: state loaded from the snapshot at index %d", group, header.index)
        # This life's entries the snapshot already applied will never be applied here: they are
        # done (committed); what waits on them (the start-up barrier, confirms) must hear so.
        order = self.broker.groups[group].order
        applied_below = order.applied_below(self.origin)
        for (g, seq), entry in list(self.in_flight.items()):
            if g == group and seq < applied_below:
                self._complete(entry, None)
        if order.is_dead(self.origin):
            # The Down that ended this life is inside the snapshot: it was never applied here, so
            # _apply_all never saw it. Without a new life every entry of this node would be
            # skipped by every member and its clients would wait forever.
            log.warning("%s: the snapshot says this node's life was declared down; starting a new one", group)
            self._cut_off()

    def _apply_entry(self, group: str, index: int, entry) -> None:
        requests = self.requests
        self.entries_applied += 1
        meta = Meta(index, entry.time_ms)
        origin = entry.origin
        mine = origin == self.origin
        machines = self.broker.groups[group]
        apply = self.applier.apply
        for target, command, request in entry.items:
            then = requests.pop(request, None) if mine and request else None
            try:
                apply(machines, meta, target, command, origin, mine, None if then is None else _guarded(then))
            except Exception:
                # The machines never raise; this is our glue. Going on keeps this member
                # applying the log (stopping would stall it for good).
                log.exception("%s: entry %d: applying %s failed", group, index, type(command).__name__)
                if then is not None:
                    self._call(then, Rejected(541, f"internal error applying {type(command).__name__}"))
        if mine:
            own = self.in_flight.get((group, entry.seq))
            if own is not None:
                self._complete(own, None)

    def lives_down(self, effect) -> None:
        """A node's lives were declared dead in a group: if that ended this life there (the
        others declared this node gone and moved on), start a new life. Heeded in any group:
        the Downs of one declaration commit in each group at its own pace, and one that comes
        after this node's new life had entries in that group ends the new life there too and
        takes its consumers (found by tests/sim: before, only shard-0's was heeded, and the
        node kept serving a consumer its queue no longer had)."""
        if ends_life(effect, self.origin, self.broker.groups[effect.group].order):
            self._cut_off()

    def reply_elsewhere(self, key: str, exchange: str, routing_key: str, props_raw: bytes, body: bytes) -> bool:
        """A direct reply-to reply whose requester is on another member: send it there through
        a shard (False: the key names no other member)."""
        node, sep, _ = key.partition("~")
        if not sep or node == self.node_id or node not in self.members():
            return False
        group = self.shards[zlib.crc32(key.encode()) % len(self.shards)]
        self.submit(ALL_QUEUES, qc.Reply(key, exchange, routing_key, props_raw, body), None, group=group)
        return True

    def _auto_delete_idle(self, group: str) -> None:
        """After a member's consumers went: its auto-delete queues left without one go too."""
        for key in [k for k in self.broker.queues if self.group_of(k) == group]:
            self.broker.maybe_auto_delete(key)

    def _cut_off(self) -> None:
        """The others declared this node gone (it was cut off): its consumers no longer exist
        in the machines and its life's entries are skipped from here on, so it starts a new life
        and its clients reconnect and start over."""
        if self.broker.sessions:
            log.warning("this node was declared down by the cluster; closing %d client connections", len(self.broker.sessions))
        self._close_sessions("node was cut off from the cluster; reconnect")
        self.origin = f"{self.node_id}@{secrets.token_hex(6)}"
        self.entry_seq = {}
        in_flight, self.in_flight = self.in_flight, {}
        for entry in in_flight.values():
            self._complete(entry, "timeout")
        # The channel and connection clean-ups among them go again from the new life, as when an
        # entry is given up (_proposed): the old life's entries may never be applied where it
        # was not declared dead, and a consumer whose channel closed would stay registered for
        # good, taking its share of the messages (found by tests/sim).
        for entry in in_flight.values():
            for target, command, _request in entry.items:
                if type(command) in CLEANUP_COMMANDS and not command.owner.endswith("@"):
                    self.submit(target, command, None, group=entry.group)

    def _close_sessions(self, reason: str) -> None:
        for session in list(self.broker.sessions.values()):
            session.conn.close(spec.CONNECTION_FORCED, reason, now=trio.current_time())
            session.wake()

    # ------------------------------------------------------------ leadership

    # -------------------------------------------------------------- start-up

    async def barrier(self) -> None:
        """Commit this node's `Down` in every group: once applied here, the log before it is too
        (the retained log replays first), and nothing of an earlier life holds messages."""
        pending = {META_GROUP: md.OwnerDown(self.node_id + "@"), **{g: qc.Down(self.node_id + "@") for g in self.shards}}
        announced = False
        while pending:
            results: dict[str, Any] = {}
            done = trio.Event()
            for group, command in pending.items():
                def answered(reply, group=group) -> None:
                    results[group] = reply
                    if len(results) == len(pending):
                        done.set()
                self.submit(None if group == META_GROUP else ALL_QUEUES, command, answered, group=group)
            await done.wait()
            pending = {g: c for g, c in pending.items() if type(results[g]) is Unavailable}
            if pending:
                if not announced:
                    log.info("waiting for a quorum of the cluster (%s: %s)", ", ".join(sorted(pending)),
                             results[next(iter(pending))].reason)
                    announced = True
                await trio.sleep(BARRIER_RETRY_S)

    async def retry_proposals(self) -> None:
        while True:
            await self._retry_wanted.wait()
            self._retry_wanted = trio.Event()
            await trio.sleep(NOT_LEADER_RETRY_EVERY_S)
            retries, self._retries = self._retries, []
            for entry in retries:
                # Not an entry of a life cut off since (_cut_off): its callers were answered and
                # its clean-ups proposed again by the new life. Proposed now, it would commit
                # after the new life's entries and could fill a gap of the old life's seqs where
                # that life was not declared dead, releasing its held entries late: a consume of
                # a channel whose close was applied already (found by tests/sim).
                if entry.origin == self.origin:
                    self._propose(entry)

    # ------------------------------------------------------------ watchdog

    async def watch_members(self) -> None:
        """On the metadata leader: a member silent for NODE_DOWN_AFTER_S is declared down. On
        every member: cut off from a majority for QUORUM_LOST_AFTER_S, it closes its clients'
        connections (they should go to a node that can commit) and refuses new ones until it
        is back; removed from the cluster, it stops."""
        while True:
            await trio.sleep(WATCH_INTERVAL_S)
            now = trio.current_time()
            try:
                leading = self.node.is_leader(META_GROUP)
                members = [m for m in self.members() if m != self.node_id]
                removed = self.node.groups[META_GROUP].removed
            except Exception:
                log.exception("watchdog: cannot read the membership")
                continue
            if now >= self._next_balance_at:
                self._next_balance_at = now + BALANCE_EVERY_S
                self._balance_leaders(members)
            if removed:
                log.warning("this node was removed from the cluster: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            connected = 1 + sum(1 for m in members if self.node.peer_is_up(m))
            if connected * 2 > len(members) + 1:
                if not self.quorum_ok:
                    log.info("a majority of the cluster is reachable again: serving clients")
                self.quorum_ok = True
                self._quorum_lost_at = None
            elif self.quorum_ok:
                if self._quorum_lost_at is None:
                    self._quorum_lost_at = now
                elif now - self._quorum_lost_at >= QUORUM_LOST_AFTER_S:
                    self.quorum_ok = False
                    log.warning("cut off from the majority (%d of %d members reachable): closing client connections",
                                connected, len(members) + 1)
                    self._close_sessions("this node is cut off from the cluster majority; reconnect to another node")
            for member in members:
                if self.node.peer_is_up(member):
                    self._down_since.pop(member, None)
                    self._declared_down.pop(member, None)
                    continue
                since = self._down_since.setdefault(member, now)
                if leading and member not in self._declared_down and now - since >= NODE_DOWN_AFTER_S:
                    self._declared_down[member] = None
                    log.warning("member %s silent for %.1f s: releasing its consumers and exclusive queues",
                                member, now - since)
                    self.submit(None, md.OwnerDown(member + "@"), None)
                    for group in self.shards:
                        self.submit(ALL_QUEUES, qc.Down(member + "@"), lambda _r, g=group: self._auto_delete_idle(g),
                                    group=group)

    def _balance_leaders(self, others: list[str]) -> None:
        """Spread group leaders over the members: a member leading two groups more than another
        hands one of its shards to the member leading fewest (one move per round, all up)."""
        if not others or not all(self.node.peer_is_up(m) for m in others):
            return
        leads: dict[str, list[str]] = {m: [] for m in [self.node_id, *others]}
        for group in [META_GROUP, *self.shards]:
            leader = self.node.leader(group)
            if leader is None:
                return  # an election is on: wait for the next round
            leads.setdefault(leader, []).append(group)
        mine = [g for g in leads.get(self.node_id, []) if g != META_GROUP]
        target = min(others, key=lambda m: len(leads.get(m, [])))
        if mine and len(leads[self.node_id]) - len(leads.get(target, [])) >= 2:
            log.info("moving the leadership of %s to %s (this node leads %d of %d groups)",
                     mine[-1], target, len(leads[self.node_id]), len(self.shards) + 1)
            self.node.transfer_leadership(mine[-1], target)

    def members(self) -> list[str]:
        return self.node.groups[META_GROUP].member_ids()


def _guarded(then: Callable[[Any], None]) -> Callable[[Any], None]:
    """A continuation whose own exceptions are logged, never raised into the apply loop."""
    def call(reply: Any) -> None:
        try:
            then(reply)
        except Exception:  # the channel continuations handle their own errors; this is the backstop
            log.exception("continuation failed")
    return call
