"""What the node reads about its own process from the operating system, for /metrics and the
management API's node object: resident memory, open and allowed file descriptors, free disk."""

from __future__ import annotations

import os
import resource
from typing import Any

from ..server.alarms import disk_free_bytes, rss_bytes
from .metrics import ProcessSample


def sample_process(data_dir: str, store: Any = None) -> ProcessSample:
    try:
        open_fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_fds = 0
    return ProcessSample(
        resident_memory_bytes=rss_bytes(),
        open_fds=open_fds,
        max_fds=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        disk_free_bytes=disk_free_bytes(data_dir),
        store=store.usage() if hasattr(store, "usage") else {},
    )
