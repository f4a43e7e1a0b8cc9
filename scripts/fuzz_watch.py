"""What scripts/fuzz watches while it fuzzes: a pika client that must be served throughout, the
server's RSS, and the server's log.

Probe: its own thread and connection; every PROBE_INTERVAL_S it publishes one message with
publisher confirms to a queue of its own and consumes it back. A round trip fails if anything
raises, or if it takes longer than its deadline (a round still running when the run ends counts
too); after a failure the probe reconnects.

RSS: VmRSS from /proc/PID/status every few seconds. `rss_verdict` calls memory flat by a stated
rule: after dropping the first WARMUP_SHARE of the samples, the median of the last quarter is at
most FLAT_GROWTH_SHARE above the first quarter's median, or at most FLAT_GROWTH_MIB above it,
whichever allows more. With the node's Prometheus endpoint, the sampler also reads the message
store's own memtable and block-cache bytes (at most every STORE_EVERY_S) and the rule is applied
to the RSS less those two: they are buffers with fixed bounds (storage/rocks.py) that fill slowly
under fuzzing, so a window of half an hour sees the rising side of a memtable's cycle, which is
not a leak. Those two must then stay within their bounds (STORE_CACHES_MAX_MIB), checked too.

Log: `log_findings` lists every Traceback and every ERROR or CRITICAL line, minus the ones that
JUSTIFIED_ERRORS explains.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions

PROBE_INTERVAL_S = 0.5
PROBE_QUEUE_PREFIX = "fuzz-probe-"
WARMUP_SHARE = 0.1
FLAT_GROWTH_SHARE = 0.10
FLAT_GROWTH_MIB = 16.0
STORE_EVERY_S = 5.0
# storage/rocks.py: up to 4 memtables of 64 MiB, the meta column family's 4 MiB, a 32 MiB block cache
STORE_CACHES_MAX_MIB = 4 * 64 + 4 + 32
# ERROR/CRITICAL lines that are not bugs, each with why (none so far: every one is reported).
JUSTIFIED_ERRORS: dict[str, str] = {}


@dataclass
class ProbeStats:
    ok: int = 0
    failed: int = 0
    slowest_s: float = 0.0
    failures: list[str] = field(default_factory=list)  # the first few, with times


class Probe(threading.Thread):
    """Publish-with-confirm and consume round trips on a pika connection, until stopped."""

    def __init__(self, host: str, port: int, user: str, password: str, deadline_s: float) -> None:
        super().__init__(name="fuzz-probe", daemon=True)
        self.params = pika.ConnectionParameters(
            host,
            port,
            credentials=pika.PlainCredentials(user, password),
            socket_timeout=deadline_s,
            blocked_connection_timeout=deadline_s,
            heartbeat=10,
            connection_attempts=1,
        )
        self.deadline_s = deadline_s
        self.stats = ProbeStats()
        self.stopping = threading.Event()
        self.round_started: float | None = None  # monotonic, while a round runs
        self.started_at = time.monotonic()
        self._connection: pika.BlockingConnection | None = None

    def _fail(self, why: str) -> None:
        self.stats.failed += 1
        if len(self.stats.failures) < 20:
            self.stats.failures.append(f"t+{time.monotonic() - self.started_at:.1f}s: {why}")

    def _open(self) -> tuple[pika.adapters.blocking_connection.BlockingChannel, str, list[bytes]]:
        self._connection = pika.BlockingConnection(self.params)
        channel = self._connection.channel()
        channel.confirm_delivery()
        queue = PROBE_QUEUE_PREFIX + uuid.uuid4().hex[:12]
        channel.queue_declare(queue, exclusive=True)
        received: list[bytes] = []
        channel.basic_consume(queue, lambda ch, method, _props, body: received.append(body), auto_ack=True)
        return channel, queue, received

    def _close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except Exception:
                pass
            self._connection = None

    def run(self) -> None:
        opened = None
        while not self.stopping.is_set():
            started = time.monotonic()
            self.round_started = started
            try:
                if opened is None:
                    opened = self._open()
                channel, queue, received = opened
                body = uuid.uuid4().bytes
                channel.basic_publish("", queue, body, mandatory=True)  # returns once confirmed
                assert self._connection is not None
                while body not in received and time.monotonic() - started < self.deadline_s:
                    self._connection.process_data_events(time_limit=0.02)
                took = time.monotonic() - started
                if body not in received:
                    self._fail(f"message not consumed within {self.deadline_s:.0f} s")
                elif took > self.deadline_s:
                    self._fail(f"round trip took {took:.1f} s")
                else:
                    self.stats.ok += 1
                    self.stats.slowest_s = max(self.stats.slowest_s, took)
                received.clear()
            except Exception as exc:  # any failure of the client counts, and it starts over
                self._fail(f"{type(exc).__name__}: {exc}")
                self._close()
                opened = None
            self.round_started = None
            self.stopping.wait(max(0.0, PROBE_INTERVAL_S - (time.monotonic() - started)))
        self._close()

    def stop(self, timeout_s: float) -> None:
        """Stop and wait; a round that is still stuck counts as a failure."""
        self.stopping.set()
        self.join(timeout_s)
        if self.is_alive():
            stuck = self.round_started
            self._fail(f"a round trip still running after {time.monotonic() - (stuck or time.monotonic()):.0f} s")

    def stuck_for_s(self) -> float:
        started = self.round_started
        return 0.0 if started is None else time.monotonic() - started


class RssSampler(threading.Thread):
    """VmRSS of a process (MiB) every `every_s`, with its time since start; with `metrics_url`,
    also the message store's memtable and block-cache MiB as the node reports them."""

    def __init__(self, pid: int, every_s: float, metrics_url: str | None = None) -> None:
        super().__init__(name="fuzz-rss", daemon=True)
        self.pid = pid
        self.every_s = every_s
        self.metrics_url = metrics_url
        self.samples: list[tuple[float, float]] = []  # (s since start, MiB)
        self.caches: list[float] = []  # the store's memtables + block cache (MiB) at each sample
        self.store_errors = 0
        self.stopping = threading.Event()

    def sample(self) -> float | None:
        try:
            text = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return None
        match = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
        return int(match.group(1)) / 1024 if match else None

    def store_caches_mib(self) -> float | None:
        """maxq_store_memtable_bytes + maxq_store_block_cache_bytes, or None if unreadable."""
        assert self.metrics_url is not None
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
                text = response.read().decode()
        except OSError:
            self.store_errors += 1
            return None
        found = re.findall(r"^maxq_store_(?:memtable|block_cache)_bytes (\S+)$", text, re.M)
        return sum(float(v) for v in found) / (1 << 20) if len(found) == 2 else None

    def run(self) -> None:
        started = time.monotonic()
        caches: float | None = None
        next_store = started
        while not self.stopping.is_set():
            if self.metrics_url is not None and time.monotonic() >= next_store:
                fresh = self.store_caches_mib()
                caches = caches if fresh is None else fresh  # (a failed read keeps the last figure)
                next_store = time.monotonic() + STORE_EVERY_S
            mib = self.sample()
            if mib is not None and (self.metrics_url is None or caches is not None):
                self.samples.append((round(time.monotonic() - started, 1), round(mib, 1)))
                if caches is not None:
                    self.caches.append(round(caches, 1))
            self.stopping.wait(self.every_s)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)

    def verdict(self) -> dict[str, object]:
        """rss_verdict of the RSS; with the store's figures, of the RSS less its caches, and the
        caches' largest value against their bounds."""
        rss = [mib for _, mib in self.samples]
        figures = rss_verdict(rss)
        if self.metrics_url is None or figures["flat"] is None:
            return figures
        less = rss_verdict([r - c for r, c in zip(rss, self.caches, strict=True)])
        caches_max = max(self.caches)
        return {
            **figures,
            "rss_flat": figures["flat"],
            "less_store_caches": less,
            "store_caches_max_mib": caches_max,
            "store_caches_bound_mib": STORE_CACHES_MAX_MIB,
            "flat": bool(less["flat"]) and caches_max <= STORE_CACHES_MAX_MIB,
        }


def rss_verdict(samples: list[float]) -> dict[str, object]:
    """Start, end, max and the flatness verdict (the rule is in the module's docstring)."""
    if len(samples) < 8:
        return {"flat": None, "rule": "too few samples to judge", "samples": len(samples)}
    steady = samples[int(len(samples) * WARMUP_SHARE) :]
    quarter = max(1, len(steady) // 4)
    first = statistics.median(steady[:quarter])
    last = statistics.median(steady[-quarter:])
    allowed = max(first * FLAT_GROWTH_SHARE, FLAT_GROWTH_MIB)
    return {
        "flat": last - first <= allowed,
        "rule": (
            f"after the first {WARMUP_SHARE:.0%} of samples, median of the last quarter <= median of the first "
            f"quarter + max({FLAT_GROWTH_SHARE:.0%}, {FLAT_GROWTH_MIB:.0f} MiB)"
        ),
        "samples": len(samples),
        "start_mib": samples[0],
        "end_mib": samples[-1],
        "max_mib": max(samples),
        "first_quarter_median_mib": round(first, 1),
        "last_quarter_median_mib": round(last, 1),
        "allowed_growth_mib": round(allowed, 1),
    }


def log_findings(text: str) -> tuple[list[str], list[str], list[str]]:
    """(tracebacks, unexplained ERROR/CRITICAL lines, explained ones with the reason)."""
    lines = text.splitlines()
    tracebacks = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            # the log line before it says where; the last line of the traceback says what
            end = i + 1
            while end < len(lines) and (lines[end].startswith(" ") or not re.match(r"^\d{4}-\d\d-\d\d ", lines[end])):
                end += 1
            tracebacks.append("\n".join(lines[max(0, i - 1) : end])[-3000:])
    errors, explained = [], []
    for line in lines:
        if not re.match(r"^\S+ \S+ (ERROR|CRITICAL) ", line):
            continue
        reason = next((why for pattern, why in JUSTIFIED_ERRORS.items() if re.search(pattern, line)), None)
        (explained if reason else errors).append(line if reason is None else f"{line}  [{reason}]")
    return tracebacks, errors, explained


class LogWatcher(threading.Thread):
    """Notices a new Traceback/ERROR in the log as it happens and remembers which cases ran in
    the seconds before it (the log names connections by the server's numbers, not ours)."""

    def __init__(self, path: Path, recent: Callable[[], list[str]]) -> None:
        super().__init__(name="fuzz-log", daemon=True)
        self.path = path
        self.recent = recent  # () -> list of case labels that ran in the last few seconds
        self.suspects: list[dict[str, object]] = []
        self.stopping = threading.Event()
        self._offset = 0

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self.poll()

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                new = f.read()
        except OSError:
            return
        cut = new.rfind(b"\n") + 1
        self._offset += cut
        after_error = False  # a Traceback right after an ERROR line is that error's: named once
        for line in new[:cut].decode("utf-8", "replace").splitlines():
            is_error = re.match(r"^\S+ \S+ (ERROR|CRITICAL) ", line) is not None
            if (is_error or (line.startswith("Traceback") and not after_error)) and len(self.suspects) < 50:
                self.suspects.append({"line": line[:300], "recent_cases": self.recent()})
            after_error = is_error

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.poll()
