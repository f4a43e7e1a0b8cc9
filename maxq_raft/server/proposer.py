"""A cluster member's proposer: commands gathered into entries, proposed, retried, and answered.

Theory of operation: `submit` adds a command to the open entry of its group; at the end of the
current scheduler pass (`run_sync_soon`) each open entry is proposed, so the publishes of every
connection of this node for one shard ride in one Raft entry. An entry larger than
ENTRY_BYTES_TARGET is proposed at once and the next one opened; many are in flight.

Each entry of this life gets the next sequence number of its group (1, 2, ...) and names this
life as its origin: every replica applies an origin's entries in that order, each once
(machines/apply_order.py), so a proposal can be repeated safely. A failed attempt ("not
leader", "timeout", "busy") is proposed again while OUTCOME_WAIT_S lasts; after that the entry is
given up: its waiting callers get `Unavailable`, its confirms a nack, or, if an attempt may have
been appended (a timeout), neither (the outcome is unknown); a filler with no commands takes its
sequence number so later entries of this life are not held forever, and what it carried that no
caller waits for and must not be lost (a consumer's or connection's clean-up, a consumer's acks
and credit) goes again in a new entry, in the order it came.

An entry is done when it is applied here (`applied`), which answers its requests and releases
the confirms waiting on it (confirms.py). Flow control: the bytes of this life's entries
proposed and not yet done; above FLOW_BYTES_HIGH publishing connections stop being read until it
is back under FLOW_BYTES_LOW (Session._reader), as RabbitMQ's credit flow blocks a channel whose
queue is behind: a publisher faster than the cluster commits is slowed down rather than piling
proposals into the replication hub until heartbeats starve and leaders are lost.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from typing import Any

import trio

from ..machines import commands as qc
from ..machines import metadata as md
from ..machines.queue_types import Rejected
from ..replication.entries import encode_entry
from ..replication.group import PAYLOAD_BYTES_MAX
from .confirms import Confirms, Pending, Unavailable
from .remote import end_awaited

log = logging.getLogger("maxq.cluster")

ENTRY_BYTES_TARGET = 256 * 1024  # well under the engine's 1 MiB payload cap
MESSAGE_OVERHEAD_BYTES = 48
# An entry's envelope (version, time, origin, seq, targets, command names) and msgpack's own bytes:
# what an entry may carry besides the sizes counted in `OpenEntry.size`.
ENVELOPE_BYTES_MAX = 16 * 1024
ENTRY_BYTES_MAX = PAYLOAD_BYTES_MAX - ENVELOPE_BYTES_MAX
OUTCOME_WAIT_S = 10.0  # an entry not (known to be) committed is proposed again for this long
RETRYABLE = ("not leader", "timeout", "busy")
UNENCODABLE = "cannot be encoded"  # (an entry whose commands encode_entry refused: _propose)
CLEANUP_COMMANDS = (qc.Down, md.OwnerDown)  # never given up: see `_proposed`
# A live consumer's acks, rejects, requeues and credit are cast: no caller waits to hear they were
# given up, and lost, the acked messages stay checked out to a consumer that lives on, its
# prefetch full, and it gets nothing more until its channel closes. Each is safe to apply late or
# twice: a settle or requeue names (consumer, message seq), and one of a message no longer checked
# out to that consumer is ignored; a credit applied twice lets one flow window more be written.
CONSUMER_COMMANDS = (qc.Settle, qc.Discard, qc.Requeue, qc.Credit)
NOT_LEADER_RETRY_EVERY_S = 0.05
# A consumer's credit and acks are entries too, and wait behind what is proposed before them: at
# 4 MiB / 2 MiB a 3-node transient consumer got 8,200 msgs/s beside a publisher taken at 139,000
# (each credit round trip queued behind ~4 MiB of publishes); at 1 MiB / 512 KiB 19,200, at
# 512 KiB / 256 KiB 32,200, with the persistent 128 B rate unchanged (docs/benchmarks.md,
# 2026-12-03). Two entries of ENTRY_BYTES_TARGET still fit under the mark.
FLOW_BYTES_HIGH = 512 * 1024
FLOW_BYTES_LOW = 256 * 1024
FLOW_LOG_EVERY_S = 10.0


class OpenEntry(Pending):
    """Commands gathered for one group, proposed together (done once committed and applied here)."""

    __slots__ = (
        "group",
        "items",
        "requests",
        "size",
        "payload",
        "first_proposed",
        "seq",
        "origin",
        "committed",
        "committed_at",
        "maybe_appended",
        "tombstone",
        "flow_bytes",
        "on_done",
    )

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
        self.committed_at = 0.0  # (trio time) when the engine said so
        self.maybe_appended = False  # an attempt's outcome was unknown: never nack it
        self.tombstone = False  # fills the seq of an entry given up on (no commands)
        self.flow_bytes = 0  # what it counts in Proposer.flow_bytes until it is done
        self.on_done: Callable[[str | None], None] | None = None  # (`Proposer.sync`)


class Proposer:
    def __init__(self, node_id: str, node: Any, confirms: Confirms, clock_ms: Callable[[], int]) -> None:
        self.node_id = node_id
        self.node = node  # ReplicationNode (or anything with its `propose`)
        self.confirms = confirms
        self.clock_ms = clock_ms
        # Request ids restart with the process while the log keeps old entries: an entry is this
        # life's only if its origin names this life, or a replayed entry would answer a new request.
        self.origin = f"{node_id}@{secrets.token_hex(6)}"
        self.open: dict[str, OpenEntry] = {}
        self.requests: dict[int, Callable[[Any], None]] = {}
        self.next_request = 1
        self.entry_seq: dict[str, int] = {}  # group -> last seq this life gave an entry
        self.in_flight: dict[tuple[str, int], OpenEntry] = {}  # (group, seq) -> entry, until done
        self._flush_scheduled = False
        self._token = trio.lowlevel.current_trio_token()
        self._retries: list[OpenEntry] = []
        self._retry_wanted = trio.Event()
        self.entries_proposed = 0
        self.entries_failed = 0
        self.flow_bytes = 0
        self.flow_blocked = False
        self.flow_room = trio.Event()
        self.flow_room.set()
        self.flow_blocks = 0
        self._flow_logged_at = -FLOW_LOG_EVERY_S
        # Whether this member holds a replica of a group (ClusterLog.holds): an entry of one it
        # does not is done when its leader says so, not when applied here (server/remote.py).
        self.holds: Callable[[str], bool] = lambda group: True
        # Whether every member's leader sends the end of a publish's entry (features.PUBLISH_ENDS):
        # until then such an entry is done at its commit, as an earlier release did.
        self.publish_ends: Callable[[], bool] = lambda: False

    def submit(self, group: str, target: Any, command: Any, then: Callable[[Any], None] | None) -> OpenEntry:
        """Add a command to its group's open entry; `then(reply)` runs once it is applied here
        (or with `Unavailable`). Returns the entry, for confirms to wait on."""
        size = _command_bytes(command)
        entry = self.open.get(group)
        if entry is not None and entry.items and entry.size + size > ENTRY_BYTES_MAX:
            # This command would take the open entry past the engine's cap: that one goes first.
            del self.open[group]
            self._propose(entry)
            entry = None
        if entry is None:
            entry = self.open[group] = OpenEntry(group)
        request = 0
        if then is not None:
            request = self.next_request
            self.next_request += 1
            self.requests[request] = then
            entry.requests.append(request)
        entry.items.append((target, command, request))
        entry.size += size
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

    def sync(self, group: str, then: Callable[[str | None], None]) -> None:
        """Propose an entry with no commands to `group` now; `then(error)` once it is done (applied
        here: everything the group committed before it was proposed is applied here too), or
        given up on (`error`)."""
        entry = OpenEntry(group)
        entry.on_done = then
        self._propose(entry)

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
            entry.first_proposed = trio.current_time()
            try:
                entry.payload = encode_entry(self.clock_ms(), entry.items, entry.origin, seq)
            except Exception as exc:  # a command no log can hold: a bug of ours, which must not end the node
                kinds = sorted({type(command).__name__ for _target, command, _request in entry.items})
                log.error("cannot encode an entry of %s (%s): %r", entry.group, ", ".join(kinds), exc)
                self._proposed(entry, UNENCODABLE)  # (its callers refused, its seq filled)
                return
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
                        log.info(
                            "publishers paused: %d KiB proposed and not yet committed (%d pauses so far)",
                            self.flow_bytes // 1024,
                            self.flow_blocks,
                        )
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
            entry.committed_at = trio.current_time()
            if not self.holds(entry.group) and not (
                end_awaited(entry.items) if self.publish_ends() else entry.requests
            ):
                # A group held elsewhere, and nothing to hear back: committed is all (server/remote.py).
                self.complete(entry, None)
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
        self.complete(entry, "timeout" if entry.maybe_appended else error)
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
        # CONSUMER_COMMANDS go again too, in their order among the clean-ups (an ack before its
        # channel's close still settles rather than requeues). None goes again when the node is
        # stopping: the others release its consumers.
        if error == "stopped":
            return
        again = [
            (target, command)
            for target, command, _request in entry.items
            if (
                type(command) in CONSUMER_COMMANDS
                or (type(command) in CLEANUP_COMMANDS and not command.owner.endswith("@"))  # (not a node's lives)
            )
            and (error != UNENCODABLE or _encodes(target, command))  # (proposed again, it would fail again)
        ]
        if again:
            log.warning(
                "%s: %d consumer/connection clean-ups, acks and credits proposed again", entry.group, len(again)
            )
            for target, command in again:
                self.submit(entry.group, target, command, None)

    async def retry_proposals(self) -> None:
        while True:  # for the life of the node; each turn waits for a retry
            await self._retry_wanted.wait()
            self._retry_wanted = trio.Event()
            await trio.sleep(NOT_LEADER_RETRY_EVERY_S)
            retries, self._retries = self._retries, []
            for entry in retries:
                # Not an entry of a life cut off since (new_life): its callers were answered and
                # its clean-ups proposed again by the new life. Proposed now, it would commit
                # after the new life's entries and could fill a gap of the old life's seqs where
                # that life was not declared dead, releasing its held entries late: a consume of
                # a channel whose close was applied already (found by tests/sim).
                if entry.origin == self.origin:
                    self._propose(entry)

    def expire_elsewhere(self, committed_before: float) -> None:
        """Entries of groups this member does not hold, committed before `committed_before`, whose
        end never came from the group's leader (server/remote.py: lost with a link, or the leader
        changed between commit and apply): their requests fail; their confirms cannot say whether
        a reject-publish queue took them (the outcome is unknown, as after a timeout)."""
        for entry in [e for e in self.in_flight.values() if e.committed and e.committed_at < committed_before]:
            if not self.holds(entry.group):
                log.warning(
                    "%s: the replies to %d requests never came from its leader", entry.group, len(entry.requests)
                )
                self.complete(entry, "timeout")

    # -- answers -----------------------------------------------------------------------------

    def take_request(self, request: int) -> Callable[[Any], None] | None:
        """The caller waiting for a command of this life's entry being applied here."""
        return self.requests.pop(request, None) if request else None

    def applied(self, group: str, seq: int) -> None:
        """This life's entry (group, seq) was applied here: it is done."""
        own = self.in_flight.get((group, seq))
        if own is not None:
            self.complete(own, None)

    def applied_below(self, group: str, seq: int) -> None:
        """A snapshot applied this life's entries of `group` below `seq`: they are done."""
        for (g, s), entry in list(self.in_flight.items()):
            if g == group and s < seq:
                self.complete(entry, None)

    def new_life(self) -> None:
        """The cluster declared this life gone: what is in flight will never be applied as this
        life's (its outcome is unknown), and later entries start a new life at seq 1."""
        self.origin = f"{self.node_id}@{secrets.token_hex(6)}"
        self.entry_seq = {}
        in_flight, self.in_flight = self.in_flight, {}
        for entry in in_flight.values():
            self.complete(entry, "timeout")
        # The channel and connection clean-ups among them go again from the new life, as when an
        # entry is given up (`_proposed`): the old life's entries may never be applied where it
        # was not declared dead, and a consumer whose channel closed would stay registered for
        # good, taking its share of the messages (found by tests/sim).
        for entry in in_flight.values():
            for target, command, _request in entry.items:
                if type(command) in CLEANUP_COMMANDS and not command.owner.endswith("@"):
                    self.submit(entry.group, target, command, None)

    def complete(self, entry: OpenEntry, error: str | None) -> None:
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
                    _call(then, Unavailable(error))
        else:
            # Applied already (on_commit's hop ran first); a request still here had its command
            # skipped (a malformed entry): answer it rather than leave a channel waiting.
            for request in entry.requests:
                then = self.requests.pop(request, None)
                if then is not None:
                    _call(then, Rejected(541, "command was not applied"))
        self.confirms.done(entry, error)
        if entry.on_done is not None:
            on_done, entry.on_done = entry.on_done, None
            _call(on_done, error)


def _encodes(target: Any, command: Any) -> bool:
    try:
        encode_entry(0, [(target, command, 0)], "", 1)
    except Exception:
        return False
    return True


def _call(then: Callable[[Any], None], reply: Any) -> None:
    try:
        then(reply)
    except Exception:  # the channel continuations handle their own errors; this is the backstop
        log.exception("continuation failed")


def _command_bytes(command: Any) -> int:
    """What a command adds to an entry, about (messages by their sizes, anything else 256 B)."""
    if type(command) is qc.Enqueue or type(command) is qc.EnqueueFifo:
        return sum(
            len(m.body) + len(m.props_raw) + len(m.routing_key) + MESSAGE_OVERHEAD_BYTES for m in command.messages
        )
    return 256


def message_bytes_max(frame_max: int, read_bytes: int) -> int:
    """The largest body a cluster member accepts: the command that carries it holds its properties
    (at most a frame), the other messages of the read that completed it (at most a read) and its
    own, in one entry of at most ENTRY_BYTES_MAX (a larger one could never be proposed)."""
    return ENTRY_BYTES_MAX - frame_max - read_bytes
