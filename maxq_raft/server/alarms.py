"""Resource alarms: memory high watermark and free-disk low watermark, as RabbitMQ has them.

Theory of operation: a task samples the process's RSS and the data folder's free space every
`SAMPLE_INTERVAL_S`. While either limit is crossed the alarm is on: connections that publish
get `connection.blocked` (when their client announced the capability) and are no longer read,
so nothing they send is taken in; consumers keep draining, which is what clears a memory alarm.
When both readings are back under their limits (with a little hysteresis so the alarm does not
flap) every blocked connection gets `connection.unblocked` and is read again. Nothing is lost:
blocked publishes simply wait in the client's socket.

A store that cannot write (storage/guarded.py: a write or an fsync failed) raises the disk alarm
too, whatever the free space reads, until it writes again (`set_store_failure`): the free-space
limit is a threshold, a failed write is a fact.

While the memory alarm is on, each sample first asks the C allocator to give its free pages back
(heap.py): glibc keeps freed heap (drained 256 KiB bodies, say) in its arenas, so without it RSS
can stay above the clear level after the queues have drained, and the alarm stays on for nothing.
RabbitMQ does the same on its side by garbage-collecting its processes when the alarm trips.
"""

from __future__ import annotations

import logging
import os

import trio

from .heap import return_free_heap_to_os

log = logging.getLogger("maxq.alarms")

SAMPLE_INTERVAL_S = 1.0
DEFAULT_MEMORY_RATIO = 0.4  # RabbitMQ's vm_memory_high_watermark
CLEAR_RATIO = 0.95  # a memory alarm clears below 95 % of the watermark
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE_BYTES


def machine_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * _PAGE_BYTES


def disk_free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class ResourceAlarms:
    def __init__(self, data_dir: str, memory_high_watermark_mb: int, disk_free_limit_mb: int) -> None:
        self.data_dir = data_dir
        self.memory_limit_bytes = (
            (memory_high_watermark_mb << 20)
            if memory_high_watermark_mb
            else int(machine_memory_bytes() * DEFAULT_MEMORY_RATIO)
        )
        self.disk_limit_bytes = disk_free_limit_mb << 20
        self.memory_alarm = False
        self.free_space_alarm = False
        self.store_failure: str | None = None  # why the store cannot write, while it cannot
        self.cleared = trio.Event()
        self.cleared.set()

    @property
    def disk_alarm(self) -> bool:
        return self.free_space_alarm or self.store_failure is not None

    @property
    def active(self) -> bool:
        return self.memory_alarm or self.disk_alarm

    def set_store_failure(self, reason: str | None) -> None:
        was = self.active
        if reason is not None and self.store_failure is None:
            log.warning("disk alarm: the message store cannot write (%s); blocking publishers", reason)
        elif reason is None and self.store_failure is not None:
            log.warning("disk alarm: the message store writes again")
        self.store_failure = reason
        self._note_change(was)

    def _note_change(self, was: bool) -> None:
        if self.active and not was:
            self.cleared = trio.Event()
        elif was and not self.active:
            self.cleared.set()

    def sample(self) -> None:
        if self.memory_alarm:
            return_free_heap_to_os()
        rss = rss_bytes()
        free = disk_free_bytes(self.data_dir)
        was = self.active
        if rss > self.memory_limit_bytes:
            if not self.memory_alarm:
                log.warning(
                    "memory alarm: RSS %d MiB above the high watermark %d MiB; blocking publishers",
                    rss >> 20,
                    self.memory_limit_bytes >> 20,
                )
            self.memory_alarm = True
        elif self.memory_alarm and rss < self.memory_limit_bytes * CLEAR_RATIO:
            log.warning("memory alarm cleared: RSS %d MiB", rss >> 20)
            self.memory_alarm = False
        if free < self.disk_limit_bytes:
            if not self.free_space_alarm:
                log.warning(
                    "disk alarm: %d MiB free in %s, below the limit %d MiB; blocking publishers",
                    free >> 20,
                    self.data_dir,
                    self.disk_limit_bytes >> 20,
                )
            self.free_space_alarm = True
        elif self.free_space_alarm and free > self.disk_limit_bytes * 1.05:
            log.warning("disk alarm cleared: %d MiB free", free >> 20)
            self.free_space_alarm = False
        self._note_change(was)

    async def run(self) -> None:
        while True:
            self.sample()
            await trio.sleep(SAMPLE_INTERVAL_S)
