"""One channel's delivery and publish bookkeeping, sans-IO: delivery tags, the unacked map and
what basic.ack/nack/reject take, basic.recover, publisher-confirm numbering, the tx buffer, and
when a delivery must be held back (the channel-wide prefetch).

Theory of operation: `ChannelState` is a pure object. The channel shell (`channel.py`) calls it
with each client method or delivery; it answers with what to do (the tag to write, the entries
to settle, the publishes to route at commit) or raises `ChannelError` / `HardError` with
RabbitMQ's code and text, before changing anything. It never sees a socket, the broker, trio or
a clock, so every rule here is tested directly (tests/server/test_channel_state.py, against a
reference model). It lives in `server/` rather than `amqp/` because what it holds is the
broker's (entries that name queue-machine messages) and its refusals are the broker's channel
errors; `amqp/connection.py` keeps the frame-level channel state (open, closing, content).

What it holds is opaque to it: an *entry* is what the shell needs to settle one delivery with its
queue (today (queue key, consumer id, queue seq)); an *item* is what it needs to write a held
delivery later; a *publish* is what it routes at commit; a settle *kind* is its name for ack,
requeue or discard (the queue command type).

Delivery tags (basic.deliver, basic.get-ok): per channel, from 1, one per delivery whether or
not it needs an ack. `unacked` maps the tags that do to their entries in tag order (tags only
grow, and a rollback rebuilds in order), so a `multiple` walk stops at the first tag above it.
Settling follows rabbit_channel:collect_acks: `multiple` with tag 0 takes everything
outstanding (also nothing); otherwise the named tag must be outstanding, else 406 "unknown
delivery tag N" (also for a tag settled before, or delivered with no-ack), and `multiple` takes
it and every outstanding tag below it. basic.recover (requeue=true) hands back everything
outstanding to be requeued; requeue=false is 540, as RabbitMQ.

Confirms (RabbitMQ's publisher-confirms extension): after confirm.select every basic.publish
takes the next publish seq, from 1; a basic.ack or basic.nack with `multiple` covers every seq
up to its tag that was not confirmed yet (`confirm_through`).

Transactions (class tx; rabbit_channel's `tx` field): after tx.select publishes and settles
are buffered. Settled tags leave `unacked` at once, so settling one again is a 406 as in
RabbitMQ; tx.commit hands over the publishes, then the settles in the order they were made;
tx.rollback drops the publishes and puts the settled entries back under their tags. A channel
is in confirm mode or transactional, never both (406 either way round).

Held deliveries: a delivery is written at once unless the channel-wide limit (basic.qos global)
is reached or earlier deliveries are already held (order is kept). `holding` says which, in one
attribute read for the hot path; the shell then `hold`s the item and, when acks make room,
writes what `next_released` gives back. (channel.flow active=false, which would pause a channel,
is refused as RabbitMQ refuses it: amqp/connection.py.) No-ack deliveries count against no limit but wait in line behind held ones.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from ..amqp import spec
from .errors import ChannelError, HardError

_NOTHING: list = []  # returned (never mutated) when a settle inside a transaction is buffered


class ChannelState:
    __slots__ = (
        "next_delivery_tag",
        "unacked",
        "prefetch_count",
        "prefetch_count_global",
        "held",
        "holding",
        "confirm",
        "publish_seq",
        "confirmed_upto",
        "tx",
        "tx_publishes",
        "tx_settles",
    )

    def __init__(self) -> None:
        self.next_delivery_tag = 1
        self.unacked: dict[int, Any] = {}  # delivery tag -> entry, in tag order
        self.prefetch_count = 0  # basic.qos(global=false): for consumers started after it
        self.prefetch_count_global = 0  # basic.qos(global=true): unacked deliveries on the channel
        self.held: deque = deque()  # items of deliveries not written yet, in order
        self.holding = False  # a delivery now must be held: see _must_hold
        self.confirm = False
        self.publish_seq = 0  # the last publish seq given out
        self.confirmed_upto = 0  # the last publish seq acked or nacked to the client
        self.tx = False
        self.tx_publishes: list = []
        self.tx_settles: list[tuple[Any, list[tuple[int, Any]]]] = []  # (kind, [(tag, entry)]) per settle

    @property
    def unconfirmed_count(self) -> int:
        """Publishes taken in confirm mode whose ack or nack has not been sent yet."""
        return self.publish_seq - self.confirmed_upto if self.confirm else 0

    # -------------------------------------------------------- deliveries

    def deliver(self, entry) -> int:
        """The tag of a delivery being written now; `entry` None when it needs no ack (no-ack
        consumer, direct reply-to). The caller checked `holding` first (basic.get need not)."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + 1
        if entry is not None:
            unacked = self.unacked
            unacked[tag] = entry
            limit = self.prefetch_count_global
            if limit and len(unacked) >= limit:
                self.holding = True
        return tag

    def deliver_no_ack(self, count: int) -> int:
        """The first of `count` consecutive tags of deliveries needing no ack, written now (the
        caller checked `holding`)."""
        tag = self.next_delivery_tag
        self.next_delivery_tag = tag + count
        return tag

    def hold(self, item) -> None:
        """Keep a delivery that may not be written now (`holding` was true)."""
        self.held.append(item)
        self.holding = True

    def next_released(self):
        """The oldest held item that may be written now (the caller then `deliver`s it), or None."""
        held = self.held
        if not held:
            return None
        limit = self.prefetch_count_global
        if limit and len(self.unacked) >= limit:
            return None
        item = held.popleft()
        self.holding = self._must_hold()
        return item

    def take_held(self, select: Callable[[Any], bool] | None = None) -> list:
        """Remove and return the held items `select` picks (all without one): their consumer or
        channel is going, so they will never be written."""
        if select is None:
            taken = list(self.held)
            self.held.clear()
        else:
            taken = [item for item in self.held if select(item)]
            if taken:
                self.held = deque(item for item in self.held if not select(item))
        self.holding = self._must_hold()
        return taken

    def qos(self, prefetch_size_bytes: int, prefetch_count: int, global_: bool) -> None:
        if prefetch_size_bytes:
            # rabbit_channel: a byte limit is refused with a connection error.
            raise HardError(spec.NOT_IMPLEMENTED, f"prefetch_size!=0 ({prefetch_size_bytes})")
        if global_:
            self.prefetch_count_global = prefetch_count
            self.holding = self._must_hold()
        else:
            self.prefetch_count = prefetch_count

    def consumer_prefetch_count(self) -> int:
        """The prefetch of a consumer started now: a channel-wide limit also bounds each
        consumer, so its queue never hands out more than the channel could write."""
        return self.prefetch_count or self.prefetch_count_global

    def _must_hold(self) -> bool:
        limit = self.prefetch_count_global
        return bool(self.held) or bool(limit and len(self.unacked) >= limit)

    # ---------------------------------------------------------- settling

    def settle(self, kind, delivery_tag: int, multiple: bool) -> list:
        """basic.ack / basic.nack / basic.reject (which has no `multiple`): the entries to settle
        as `kind` now, in tag order; none inside a transaction (they wait for tx.commit)."""
        unacked = self.unacked
        if not multiple:  # the common case: one tag
            entry = unacked.pop(delivery_tag, None)
            if entry is None:
                raise ChannelError(spec.PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
            if self.holding:
                self.holding = self._must_hold()
            if self.tx:
                self.tx_settles.append((kind, [(delivery_tag, entry)]))
                return _NOTHING
            return [entry]
        if delivery_tag == 0:
            taken = list(unacked.items())
            unacked.clear()
        else:
            if delivery_tag not in unacked:
                raise ChannelError(spec.PRECONDITION_FAILED, f"unknown delivery tag {delivery_tag}")
            taken = []
            for tag in unacked:  # tag order: stop at the first above the named one
                if tag > delivery_tag:
                    break
                taken.append((tag, unacked[tag]))
            for tag, _entry in taken:
                del unacked[tag]
        if self.holding:
            self.holding = self._must_hold()
        if self.tx:
            self.tx_settles.append((kind, taken))
            return _NOTHING
        return [entry for _tag, entry in taken]

    def recover(self, requeue: bool) -> list:
        """basic.recover / basic.recover-async: every outstanding entry, to be requeued (the
        queue redelivers them, flagged redelivered, under new tags). Not part of a transaction:
        RabbitMQ requeues at once, and what the transaction settled stays settled in it."""
        if not requeue:
            raise HardError(spec.NOT_IMPLEMENTED, "requeue=false")
        entries = list(self.unacked.values())
        self.unacked.clear()
        if self.holding:
            self.holding = self._must_hold()
        return entries

    # ---------------------------------------------------------- confirms

    def confirm_select(self) -> None:
        if self.tx:
            raise ChannelError(spec.PRECONDITION_FAILED, "cannot switch from tx to confirm mode")
        self.confirm = True

    def next_publish_seq(self) -> int:
        """The seq of a basic.publish on a channel in confirm mode (the caller checked `confirm`)."""
        seq = self.publish_seq + 1
        self.publish_seq = seq
        return seq

    def next_publish_seqs(self, count: int) -> int:
        """The first of the seqs of `count` publishes in a row (`next_publish_seq` of each)."""
        first = self.publish_seq + 1
        self.publish_seq += count
        return first

    def confirm_through(self, last_seq: int) -> bool:
        """Record that every seq up to `last_seq` is confirmed; whether the basic.ack/nack that
        says so needs `multiple` (it covers more than one publish). Confirms go out in seq order."""
        assert self.confirmed_upto < last_seq <= self.publish_seq, (self.confirmed_upto, last_seq, self.publish_seq)
        multiple = last_seq - self.confirmed_upto > 1
        self.confirmed_upto = last_seq
        return multiple

    # -------------------------------------------------------------- tx

    def tx_select(self) -> None:
        if self.confirm:
            raise ChannelError(spec.PRECONDITION_FAILED, "cannot switch from confirm to tx mode")
        self.tx = True

    def buffer_publish(self, publish) -> None:
        """A basic.publish inside a transaction (the caller checked `tx`): routed at commit."""
        self.tx_publishes.append(publish)

    def tx_commit(self) -> tuple[list, list[tuple[Any, list]]]:
        """(publishes, [(kind, entries)]) to perform now, publishes first as rabbit_channel does;
        the channel stays transactional with an empty buffer."""
        if not self.tx:
            raise ChannelError(spec.PRECONDITION_FAILED, "channel is not transactional")
        publishes, self.tx_publishes = self.tx_publishes, []
        settles, self.tx_settles = self.tx_settles, []
        return publishes, [(kind, [entry for _tag, entry in taken]) for kind, taken in settles]

    def tx_rollback(self) -> None:
        """Drop the buffered publishes; the deliveries settled in the transaction are
        outstanding again under their tags (so they may be acked again, or recovered)."""
        if not self.tx:
            raise ChannelError(spec.PRECONDITION_FAILED, "channel is not transactional")
        self.tx_publishes = []
        settles, self.tx_settles = self.tx_settles, []
        if settles:
            items = list(self.unacked.items())
            for _kind, taken in settles:
                items.extend(taken)
            items.sort(key=lambda item: item[0])
            self.unacked = dict(items)
            self.holding = self._must_hold()

    # ------------------------------------------------------------- close

    def close(self) -> None:
        """The channel is gone: forget everything. The queues take back what it had (the shell
        sends `Down`), so uncommitted settles never happened and held deliveries return too."""
        self.unacked.clear()
        self.held.clear()
        self.tx_publishes = []
        self.tx_settles = []
        self.holding = self._must_hold()

    def check_invariants(self) -> None:
        tags = list(self.unacked)
        assert tags == sorted(tags), "unacked out of tag order"
        assert not tags or 0 < tags[0] and tags[-1] < self.next_delivery_tag
        in_tx = [tag for _kind, taken in self.tx_settles for tag, _entry in taken]
        assert len(in_tx) == len(set(in_tx)), "a tag settled twice in one transaction"
        assert not set(in_tx) & set(tags), "a tag both outstanding and settled in the transaction"
        assert all(0 < tag < self.next_delivery_tag for tag in in_tx)
        assert self.tx or not (self.tx_settles or self.tx_publishes)
        assert not (self.tx and self.confirm)
        assert self.confirm or self.publish_seq == 0
        assert 0 <= self.confirmed_upto <= self.publish_seq
        assert self.holding == self._must_hold(), "holding out of date"
