"""Deduplication of publishes on a queue (issue #21, part 3): the queue arguments of the
community plugin rabbitmq-message-deduplication, as replicated state of the queue machine.

Theory of operation: a queue declared with `x-message-deduplication: true` (or given it by a
policy) has a `DedupWindow`. A publish whose `x-deduplication-header` header holds an id the
window has recorded, and that has not expired, is a duplicate: it is not enqueued, and the
publisher's confirm says it was taken (an `Enqueue` reply counts it as accepted). Any other
publish with an id is enqueued and its id recorded; publishes without the header are never
deduplicated. Within one Enqueue the first publish of an id wins, and a later one shares its
fate (confirmed if it was enqueued, refused with it by a full reject-publish queue); an id whose
publish a full queue refused is not recorded, so publishing it again may work.

The window is by count and by time, both decided from the log only:
- count (`x-cache-size`, DEDUP_CACHE_SIZE_DEFAULT when absent): the window is the ids recorded
  by the last `size_max` recordings, oldest first in `order`; a recording beyond that evicts the
  oldest slot. An id recorded again (after it expired) takes a new slot and leaves its old one
  empty ("stale"), so memory and a single node's stored records are bounded by `size_max` alike.
- time (`x-cache-ttl` ms of queue time, or the publish's own `x-cache-ttl` header, which wins as
  on the plugin's exchanges): an id whose time is over is not a duplicate any more. Expired ids
  at the front of `order` are dropped at each Enqueue with ids and at each Tick, PRUNE_BATCH_MAX
  at most (bounded work per log entry); one behind a longer-lived one waits for its slot to come
  to the front or be evicted (it no longer counts).

The id is the shell's `dedup_key` of the header's value: strings and integers (and booleans,
floats) are told apart by type as the plugin's cache keys are; a long one is replaced by its
SHA-256, so an id costs a bounded amount of memory. The Enqueue carries `(position, key, ttl)`
for each of its publishes with an id, beside the messages: a queue without deduplication
ignores them, so a policy switching it on or off takes effect at one point of the log.

Replication: the window is state of the machine, in its snapshot header (`dump` / `load`, every
slot in order, stale ones too, so a restored replica evicts exactly as the original would). A
durable queue on a single node also keeps it in its backing (the records an SQS FIFO queue's
window uses, fifo.py: the two never share a queue, since a FIFO queue ignores this argument):
each recording is written, and what left the front is forgotten as one range, so a restart
reads back the window it had.

Unlike the plugin's queue-level mode, an id stays in the window when its message is consumed:
it leaves only by count or time (docs/queue-features.md says why).

Exchange windows (the plugin's exchange type `x-message-deduplication`, routing as fanout): the
plugin keeps one cache per exchange, checked and filled before routing, which here would be a
metadata-group commit apart from the queues' commits: a crash between the two would record an
id whose message no queue stored, and the publisher's retry would then be dropped and
confirmed. So the exchange's window lives in each queue it routes to, decided in the same log
entry as the enqueue: the Enqueue's item carries the exchange and its window
(`ExchangeScope`: name, x-cache-size, x-cache-ttl), and each queue keeps an `ExchangeWindow`
per such exchange. A queue so gets at most one copy of an id published to the exchange within
its window, which is what the plugin's single cache gives every queue bound to it; what differs
is that a queue bound after an id was published still gets that id once. A queue's own window
(x-message-deduplication on the queue) applies as well: a publish is a duplicate if any window
that applies to it has seen its id. An exchange window takes the exchange's size and TTL from
each Enqueue that names it (a redeclared exchange's new arguments apply from then on), leaves at
a Tick once empty, and goes with its queue. On a single node, its slots are stored beside the
queue window's, numbered from its `store_base` (a multiple of EXCHANGE_WINDOW_STRIDE) with the
exchange's name in the record, and read back at a restart with the size they had; a half
message (transactions.py) is checked by the queue's window only.
"""

from __future__ import annotations

import hashlib
from collections import deque
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from .commands import Enqueue, malformed
from .queue_args import DEDUP_CACHE_SIZE_DEFAULT, DEDUP_CACHE_SIZE_MAX, EXPIRY_MS_MAX
from .queue_types import Overflowed, Rejected

if TYPE_CHECKING:
    from .message import Message
    from .queue_args import QueueSettings
    from .queue_types import Backing, Effect

DEDUP_HEADER = "x-deduplication-header"
CACHE_TTL_HEADER = "x-cache-ttl"
NO_EXPIRY_MS = (1 << 63) - 1  # an id without a TTL: it leaves by count only
PRUNE_BATCH_MAX = 4096  # expired slots dropped per command at most (as queue_limits.DROP_BATCH_MAX)
# An id longer than this (UTF-8 bytes, with its type tag) is kept as its SHA-256 instead: the
# memory an id costs is bounded, and a single node's store record has room for it (255 bytes).
KEY_BYTES_MAX = 128
# An exchange window's slots are stored from its store base, a multiple of this: the queue's own
# window numbers below it (one number per recording: 2^40 of them is beyond any queue's life).
EXCHANGE_WINDOW_STRIDE = 1 << 40
EXCHANGE_NAME_BYTES_MAX = 255  # (AMQP's shortstr)

# An exchange window as an Enqueue item carries it: (exchange name, x-cache-size, x-cache-ttl ms or None).
ExchangeScope = tuple[str, int, "int | None"]


def dedup_key(value: Any) -> str | None:
    """The window's key for an `x-deduplication-header` value, or None: not deduplicated.

    A type tag keeps the string "1" and the integer 1 apart, as the plugin's cache does (it
    keys on the Erlang term). Tables, arrays, timestamps and void carry no id (the plugin
    ignores list and tuple values too)."""
    if isinstance(value, bytes):
        try:
            key = "s" + value.decode("utf-8")
        except UnicodeDecodeError:
            key = "x" + value.hex()
    elif isinstance(value, str):
        key = "s" + value
    elif isinstance(value, bool):
        key = "t" if value else "f"
    elif isinstance(value, int):
        key = f"i{value}"
    elif isinstance(value, (float, Decimal)):
        key = "d" + repr(value)
    else:
        return None
    if key.isascii() and len(key) <= KEY_BYTES_MAX:
        return key
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:  # (a lone surrogate: kept as its hash, which any store can hold)
        raw = key.encode("utf-8", "surrogatepass")
        return "h" + hashlib.sha256(raw).hexdigest()
    return key if len(raw) <= KEY_BYTES_MAX else "h" + hashlib.sha256(raw).hexdigest()


def dedup_ttl(value: Any) -> int | None:
    """A publish's `x-cache-ttl` header as a TTL in ms, or None (the queue's applies): an
    integer from 1 to the TTL ceiling; anything else is ignored, as the plugin ignores it."""
    if type(value) is int and 0 < value <= EXPIRY_MS_MAX:
        return value
    return None


def _bad_key(key: Any) -> bool:
    """Not a key `dedup_key` makes (checked for every id of an Enqueue before any is used)."""
    if type(key) is not str or not 0 < len(key) <= KEY_BYTES_MAX:
        return True
    if key.isascii():
        return False
    try:
        return len(key.encode("utf-8")) > KEY_BYTES_MAX
    except UnicodeEncodeError:
        return True


def dedup_exchange_error(arguments: Any) -> str | None:
    """The text of the 406 an x-message-deduplication exchange's declare gets for these
    arguments, or None. As the plugin: x-cache-size is required, an integer above 0 (and here at
    most DEDUP_CACHE_SIZE_MAX, as on queues); x-cache-ttl, if given, an integer above 0 (ms);
    x-cache-persistence, if given, "memory" or "disk" (both mean replicated and stored here)."""
    size = arguments.get("x-cache-size")
    if type(size) is not int or not 0 < size <= DEDUP_CACHE_SIZE_MAX:
        return (
            "Missing or invalid argument, 'x-cache-size' must be an integer greater than 0"
            f" and at most {DEDUP_CACHE_SIZE_MAX}"
        )
    ttl = arguments.get("x-cache-ttl")
    if ttl is not None and (type(ttl) is not int or not 0 < ttl <= EXPIRY_MS_MAX):
        return "Invalid argument, 'x-cache-ttl' must be an integer greater than 0"
    persistence = arguments.get("x-cache-persistence")
    if isinstance(persistence, bytes):
        persistence = persistence.decode("utf-8", "replace")
    if persistence is not None and persistence not in ("memory", "disk"):
        return "Invalid argument, 'x-cache-persistence' must be either 'disk' or 'memory'"
    return None


def exchange_scope(name: str, arguments: Any) -> ExchangeScope:
    """The window an x-message-deduplication exchange's publishes carry (its arguments were
    checked by `dedup_exchange_error` when it was declared)."""
    return (name, arguments["x-cache-size"], arguments.get("x-cache-ttl"))


def _bad_scope(exchange: Any, size_max: Any, ttl_ms: Any) -> bool:
    """Not an exchange window a session sends (`exchange_scope`)."""
    return (
        type(exchange) is not str
        or not 0 < len(exchange.encode("utf-8", "surrogatepass")) <= EXCHANGE_NAME_BYTES_MAX
        or type(size_max) is not int
        or not 0 < size_max <= DEDUP_CACHE_SIZE_MAX
        or ttl_ms is not None
        and (type(ttl_ms) is not int or not 0 < ttl_ms <= EXPIRY_MS_MAX)
    )


def dedup_items(cmd: Enqueue, count: int) -> dict[int, tuple[str, int | None, ExchangeScope | None]] | Rejected:
    """An Enqueue's `dedup` items checked, by position (of its `count` messages): key, TTL, and
    the exchange window of a publish to an x-message-deduplication exchange (or None)."""
    dedup: Any = cmd.dedup  # (checked here: the field's type is what the shell should send)
    if type(dedup) is not list and type(dedup) is not tuple:
        return malformed(cmd, "dedup must be a list")
    ids: dict[int, tuple[str, int | None, ExchangeScope | None]] = {}
    previous = -1
    for item in dedup:
        if type(item) is not list and type(item) is not tuple or len(item) not in (3, 6):
            return malformed(cmd, f"bad dedup item {item!r}")
        position, key, ttl_ms = item[:3]
        if (
            type(position) is not int
            or not previous < position < count
            or _bad_key(key)
            or ttl_ms is not None
            and (type(ttl_ms) is not int or not 0 < ttl_ms <= EXPIRY_MS_MAX)
            or len(item) == 6
            and _bad_scope(*item[3:])
        ):
            return malformed(cmd, f"bad dedup item {item!r}")
        ids[position] = (key, ttl_ms, (item[3], item[4], item[5]) if len(item) == 6 else None)
        previous = position
    return ids


class DedupWindow:
    """The recorded ids of one queue: `entries` (key -> (expires ms, slot number)) and `order`
    (slot number, key), oldest first, at most `size_max` slots. A slot whose key has a later
    slot in `entries` is stale: it only waits to leave the front."""

    def __init__(self, size_max: int, ttl_ms: int | None) -> None:
        self.size_max = size_max
        self.ttl_ms = ttl_ms
        self.entries: dict[str, tuple[int, int]] = {}
        self.order: deque[tuple[int, str]] = deque()
        self.next_number = 1  # the next slot's number: numbers only go up (store keys)
        self.duplicates = 0  # publishes dropped (not in snapshots, as the machine's stats_*)

    def seen(self, key: str, now_ms: int) -> bool:
        entry = self.entries.get(key)
        return entry is not None and entry[0] > now_ms

    def record(self, key: str, expires_ms: int) -> int:
        """A new slot for `key` (the caller knows it is not `seen`); its number."""
        number = self.next_number
        self.next_number += 1
        self.entries[key] = (expires_ms, number)  # (an expired earlier slot of it becomes stale)
        self.order.append((number, key))
        if len(self.order) > self.size_max:
            self._pop_front()
        return number

    def _pop_front(self) -> None:
        number, key = self.order.popleft()
        entry = self.entries.get(key)
        if entry is not None and entry[1] == number:
            del self.entries[key]

    def prune(self, now_ms: int, limit: int = PRUNE_BATCH_MAX) -> None:
        """Drop the front slots that are stale or expired (see the module notes), at most
        `limit`: the rest wait for the next call (a window whose ids all expired at once must
        not stall its group; they are no duplicates meanwhile, and count against the size)."""
        order = self.order
        entries = self.entries
        while order and limit > 0:
            number, key = order[0]
            entry = entries.get(key)
            if entry is not None and entry[1] == number and entry[0] > now_ms:
                return
            self._pop_front()
            limit -= 1

    def resize(self, size_max: int) -> None:
        self.size_max = size_max
        while len(self.order) > size_max:  # (bounded by the slots held)
            self._pop_front()

    @property
    def first_number(self) -> int:
        """Every slot below this number has left the window."""
        return self.order[0][0] if self.order else self.next_number

    # ------------------------------------------------------------ dump and load

    def dump(self) -> dict[str, Any]:
        """Every slot in order: `[number, key, expires ms]`, expires None for a stale one."""
        slots = []
        entries = self.entries
        for number, key in self.order:
            entry = entries[key]
            slots.append([number, key, entry[0] if entry[1] == number else None])
        return {"next_number": self.next_number, "slots": slots}

    def load(self, dumped: dict[str, Any]) -> None:
        next_number = dumped["next_number"]
        if type(next_number) is not int:
            raise TypeError("a deduplication window's next number is an int")
        previous = 0
        for number, key, expires_ms in dumped["slots"]:
            if type(number) is not int or not previous < number < next_number or _bad_key(key):
                raise ValueError(f"bad deduplication slot {number!r} {key!r}")
            if expires_ms is not None:
                if type(expires_ms) is not int:
                    raise TypeError("a deduplication slot's expiry is an int")
                self.entries[key] = (expires_ms, number)
            self.order.append((number, key))
            previous = number
        for number, key in self.order:  # (a stale slot's key has a later, live slot)
            entry = self.entries.get(key)
            if entry is None or entry[1] < number:
                raise ValueError(f"deduplication slot {number} has no live slot for its key")
        self.next_number = next_number
        self.resize(self.size_max)

    def check_invariants(self) -> None:
        assert len(self.order) <= self.size_max, "the window holds at most size_max slots"
        assert len(self.entries) <= len(self.order)
        previous = 0
        live = 0
        for number, key in self.order:
            assert previous < number < self.next_number, "slots in number order"
            entry = self.entries.get(key)
            assert entry is not None, "a slot's key is in entries (its own slot or a later one)"
            assert entry[1] >= number
            live += entry[1] == number
            previous = number
        assert live == len(self.entries), "every entry has its own slot"


class ExchangeWindow(DedupWindow):
    """An x-message-deduplication exchange's window in one queue (see the module notes)."""

    def __init__(self, exchange: str, size_max: int, ttl_ms: int | None, store_base: int) -> None:
        super().__init__(size_max, ttl_ms)
        self.exchange = exchange
        self.store_base = store_base  # its slot numbers are stored from here (single node)
        self.forgotten_below = 1  # what the backing was last told had left (durable queues)

    def dump_scoped(self) -> list[Any]:
        return [self.exchange, self.size_max, self.ttl_ms, self.store_base, self.dump()]


def make_window(settings: QueueSettings) -> DedupWindow | None:
    """The window `settings` ask for (None: no deduplication; an SQS FIFO queue has its own)."""
    if not settings.deduplication or settings.fifo:
        return None
    size_max = settings.dedup_cache_size or DEDUP_CACHE_SIZE_DEFAULT
    return DedupWindow(size_max, settings.dedup_cache_ttl_ms)


class QueueDedup:
    """The deduplication part of `QueueMachine` (queue.py): the Enqueue path with ids."""

    if TYPE_CHECKING:
        settings: QueueSettings
        now_ms: int
        durable: bool
        deleted: bool
        backing: Backing | None

        def _enqueue_checked(self, messages: list[Message]) -> tuple[int | Overflowed, list[Effect]]: ...

    def _init_dedup(self, settings: QueueSettings) -> None:
        self.dedup_window = make_window(settings)
        self._dedup_forgotten_below = 1  # what the backing was last told had left (durable queues)
        # The next slot number while there is no window: a window started again goes on from
        # it, so a durable queue's stored records are never numbered twice.
        self._dedup_next_number = 1
        self.exchange_windows: dict[str, ExchangeWindow] = {}  # x-message-deduplication exchanges

    def _exchange_window(self, scope: ExchangeScope) -> ExchangeWindow:
        """The window of the exchange `scope` names, made (or given its current size and TTL)."""
        exchange, size_max, ttl_ms = scope
        window = self.exchange_windows.get(exchange)
        if window is None:
            bases = {w.store_base for w in self.exchange_windows.values()}
            base = EXCHANGE_WINDOW_STRIDE
            while base in bases:  # (bounded by the windows held)
                base += EXCHANGE_WINDOW_STRIDE
            window = self.exchange_windows[exchange] = ExchangeWindow(exchange, size_max, ttl_ms, base)
        else:
            window.ttl_ms = ttl_ms
            if window.size_max != size_max:
                window.resize(size_max)
        return window

    def _enqueue_dedup(self, cmd: Enqueue, messages: list[Message]) -> tuple[int | Overflowed | Rejected, list[Effect]]:
        """An Enqueue with ids (`cmd.dedup`), its messages already checked."""
        ids = dedup_items(cmd, len(messages))
        if isinstance(ids, Rejected):
            return ids, []
        window = self.dedup_window
        # position -> the windows that apply to it: the queue's own, an exchange's
        windows_of: dict[int, list[DedupWindow]] = {}
        for position, (_key, _ttl, scope) in ids.items():
            applying: list[DedupWindow] = [] if window is None else [window]
            if scope is not None:
                applying.append(self._exchange_window(scope))
            if applying:
                windows_of[position] = applying
        if not windows_of:  # no window here (now): the ids mean nothing
            return self._enqueue_checked(messages)
        now = self.now_ms
        used = {id(w): w for applying in windows_of.values() for w in applying}
        for w in used.values():
            w.prune(now)
        kept: list[int] = []  # positions enqueued
        first_of: dict[tuple[int, str], int] = {}  # (window, key) -> its first position in this Enqueue
        firsts: list[int] = []  # positions whose id is recorded, if enqueued
        repeats: dict[int, int] = {}  # position -> the earlier position in this Enqueue it repeats
        dropped = 0
        for position in range(len(messages)):
            found = windows_of.get(position)
            if found is not None:
                key = ids[position][0]
                if any(w.seen(key, now) for w in found):
                    dropped += 1
                    continue
                first = next((f for f in (first_of.get((id(w), key)) for w in found) if f is not None), None)
                if first is not None:
                    repeats[position] = first
                    continue
                for w in found:
                    first_of[(id(w), key)] = position
                firsts.append(position)
            kept.append(position)
        if window is not None:  # (counted once per publish, on the queue's window if it has one)
            window.duplicates += dropped + len(repeats)
        else:
            next(iter(used.values())).duplicates += dropped + len(repeats)
        reply, effects = self._enqueue_checked([messages[p] for p in kept]) if kept else (0, [])
        refused: set[int] = set()
        if type(reply) is Overflowed:
            refused = {kept[i] for i in reply.rejected}
            refused.update(p for p, first in repeats.items() if first in refused)
        recorded: list[tuple[int, int, str, str]] = []
        for position in firsts:
            if position in refused:
                continue
            key, item_ttl_ms, _scope = ids[position]
            for w in windows_of[position]:
                ttl_ms = item_ttl_ms or w.ttl_ms
                expires_ms = now + ttl_ms if ttl_ms is not None else NO_EXPIRY_MS
                number = w.record(key, expires_ms)
                if type(w) is ExchangeWindow:
                    recorded.append((w.store_base + number, expires_ms, key, w.exchange))
                else:
                    recorded.append((number, expires_ms, key, ""))
        if self.durable and (recorded or len(kept) < len(messages)):
            # Also with nothing new: the write makes a single node's confirm of a duplicate wait
            # for the next fsync, which covers the recording that made it one.
            next_number = None if window is None else window.next_number
            self.backing.dedup_write(recorded, next_number)  # type: ignore[union-attr]  # a durable queue has a backing
        self._dedup_forget()
        if refused:
            ordered = sorted(refused)
            return Overflowed(len(messages) - len(ordered), ordered), effects
        return len(messages), effects

    def _dedup_forget(self) -> None:
        """Tell a durable queue's backing which slots have left the front (one range a window)."""
        if not self.durable:
            return
        window = self.dedup_window
        if window is not None:
            first = window.first_number
            if first > self._dedup_forgotten_below:
                self.backing.dedup_forget(first)  # type: ignore[union-attr]  # a durable queue has a backing
                self._dedup_forgotten_below = first
        for scoped in self.exchange_windows.values():
            first = scoped.first_number
            if first > scoped.forgotten_below:
                base = scoped.store_base
                self.backing.dedup_forget(base + first, base)  # type: ignore[union-attr]  # durable: a backing
                scoped.forgotten_below = first

    def _prune_dedup_window(self) -> None:
        """At a Tick: expired ids at the front leave (a queue no one publishes to forgets too),
        and an exchange window left empty goes (an exchange deleted or no longer publishing)."""
        window = self.dedup_window
        if window is not None and window.order:
            window.prune(self.now_ms)
        for scoped in self.exchange_windows.values():
            scoped.prune(self.now_ms)
        self._dedup_forget()  # (an emptied window's whole store range too: its front is its next number)
        emptied = [exchange for exchange, scoped in self.exchange_windows.items() if not scoped.order]
        for exchange in emptied:
            del self.exchange_windows[exchange]

    def _dedup_settings(self, settings: QueueSettings) -> None:
        """A policy changed the queue's settings: the window starts, changes size or ends."""
        window = self.dedup_window
        if make_window(settings) is None:
            if window is not None:
                self._dedup_next_number = window.next_number
                if self.durable:
                    self.backing.dedup_forget(window.next_number)  # type: ignore[union-attr]  # a durable queue has a backing
            self.dedup_window = None
            return
        if window is None:
            window = self.dedup_window = make_window(settings)
            assert window is not None
            window.next_number = self._dedup_next_number
            if self.durable:
                # (a single node restarted while the window was off knows the number from its store)
                backing: Any = self.backing  # (a durable queue has a backing)
                window.next_number = max(window.next_number, backing.dedup_stored()[1])
                backing.dedup_write([], window.next_number)  # (and the store, the machine's)
            self._dedup_forgotten_below = window.next_number
            return
        # The TTL applies to ids recorded from now on (each slot keeps the expiry it was given).
        window.ttl_ms = settings.dedup_cache_ttl_ms
        window.resize(settings.dedup_cache_size or DEDUP_CACHE_SIZE_DEFAULT)
        self._dedup_forget()

    # ------------------------------------------------------- dump and load

    def _dump_dedup(self) -> dict[str, Any]:
        dumped: dict[str, Any] = {}
        window = self.dedup_window
        if window is not None:
            dumped["dedup_window"] = window.dump()
        elif self._dedup_next_number > 1:
            dumped["dedup_next_number"] = self._dedup_next_number
        if self.exchange_windows:
            dumped["exchange_windows"] = [w.dump_scoped() for w in self.exchange_windows.values()]
        return dumped

    def _load_dedup(self, header: dict[str, Any]) -> None:
        """From a header (absent before format version 4, or for a queue without a window;
        exchange windows from version 6)."""
        next_number = header.get("dedup_next_number", 1)
        if type(next_number) is not int:
            raise TypeError("a deduplication window's next number is an int")
        self._dedup_next_number = next_number
        dumped = header.get("dedup_window")
        window = self.dedup_window
        if dumped is not None and window is not None:
            window.load(dumped)
            self._dedup_forgotten_below = window.first_number
            if self.durable:
                self.backing.dedup_write(self._stored_slots(window), window.next_number)  # type: ignore[union-attr]  # a durable queue has a backing
        for exchange, size_max, ttl_ms, store_base, slots in header.get("exchange_windows", ()):
            if (
                _bad_scope(exchange, size_max, ttl_ms)
                or type(store_base) is not int
                or store_base <= 0
                or store_base % EXCHANGE_WINDOW_STRIDE
                or exchange in self.exchange_windows
            ):
                raise ValueError(f"bad exchange deduplication window {exchange!r}")
            scoped = self.exchange_windows[exchange] = ExchangeWindow(exchange, size_max, ttl_ms, store_base)
            scoped.load(slots)
            scoped.forgotten_below = scoped.first_number
            if self.durable:
                self.backing.dedup_write(self._stored_slots(scoped), None)  # type: ignore[union-attr]  # durable: a backing

    @staticmethod
    def _stored_slots(window: DedupWindow) -> list[tuple[int, int, str, str]]:
        """A loaded window's slots as a durable queue's backing keeps them, so the new backing
        holds what the original's did, as for stored messages (a stale slot's expiry is not
        kept: 0; its key's later slot wins)."""
        base, exchange = (window.store_base, window.exchange) if type(window) is ExchangeWindow else (0, "")
        entries = window.entries
        stored = []
        for number, key in window.order:
            expires_ms, live = entries[key]
            stored.append((base + number, expires_ms if live == number else 0, key, exchange))
        return stored

    def recover_dedup(self) -> None:
        """A restarted single node: the windows its backing kept (slots in number order; an id
        recorded again after it expired has a later slot, which wins). What the queue's window
        held before is dropped: at a restart only the metadata log was replayed, so at most a
        policy started it, empty, already numbering from the store's counter. An exchange
        window comes back with as many slots as it kept: the exchange's next publish gives it
        its size and TTL again."""
        if self.backing is None or not self.durable:
            return
        window = self.dedup_window
        if window is not None:
            stored, next_number = self.backing.dedup_stored(0, EXCHANGE_WINDOW_STRIDE)
            window.entries.clear()
            window.order.clear()
            _reload(window, stored, 0)
            window.next_number = max(window.next_number, next_number)
            window.resize(window.size_max)  # (x-cache-size may have changed since)
            self._dedup_forgotten_below = 0
        self.exchange_windows.clear()
        stored, _unused = self.backing.dedup_stored(EXCHANGE_WINDOW_STRIDE, None)
        by_base: dict[int, list[tuple[int, int, str, str]]] = {}
        for record in stored:
            by_base.setdefault(record[0] - record[0] % EXCHANGE_WINDOW_STRIDE, []).append(record)
        for base, records in by_base.items():
            exchange = records[-1][3]
            if _bad_scope(exchange, 1, None) or exchange in self.exchange_windows:
                continue  # (never written so; skipped rather than trusted)
            scoped = ExchangeWindow(exchange, min(len(records), DEDUP_CACHE_SIZE_MAX), None, base)
            _reload(scoped, records, base)
            scoped.forgotten_below = 0
            self.exchange_windows[exchange] = scoped
        self._dedup_forget()

    def _check_dedup(self) -> None:
        window = self.dedup_window
        if window is not None:
            window.check_invariants()
        else:
            assert not self.settings.deduplication or self.settings.fifo or self.deleted
        bases = set()
        for exchange, scoped in self.exchange_windows.items():
            assert scoped.exchange == exchange
            assert scoped.store_base > 0 and scoped.store_base % EXCHANGE_WINDOW_STRIDE == 0
            bases.add(scoped.store_base)
            scoped.check_invariants()
        assert len(bases) == len(self.exchange_windows), "each exchange window has its own store range"


def _reload(window: DedupWindow, stored: list[tuple[int, int, str, str]], base: int) -> None:
    """Slots a single node's store kept (numbered from `base`), into an empty window."""
    previous = 0
    for stored_number, expires_ms, key, _scope in stored:
        number = stored_number - base
        if number <= previous or _bad_key(key):
            continue  # (never written so; skipped rather than trusted)
        window.entries[key] = (expires_ms, number)
        window.order.append((number, key))
        previous = number
    window.next_number = max(window.next_number, previous + 1)
