"""Sending a snapshot to a follower that is behind the leader's compacted log, and receiving it.

Theory of operation: pysyncobj's leader takes its snapshot path when a follower's next index is
at or below the first entry it still has, and asks its Serializer for "transmission data" (a
pickled state, read back with pickle on the follower). `NoPickleSerializer` stands in for that
Serializer: it never serializes or loads anything; asked for transmission data, it tells the
group's transport to install the follower itself and returns None.

The transport then (group_transport.py) tells pysyncobj the follower is disconnected (so
pysyncobj sends it nothing while the install runs) and an `InstallSender` streams the leader's
latest snapshot file to it as `snapshot_chunk` messages, at most WINDOW_BYTES ahead of the
follower's `snapshot_ack`s (flow control over the shared link). The follower's
`InstallReceiver` appends chunks at the offset it expects (anything else is answered with the
offset it wants, so a lost chunk is re-sent), fdatasyncs the file when the last one arrives,
checks it whole (crc) and renames it into place; the group then makes the snapshot its log's
base (RaftLog.install_base) and its machines' state, and acks `done` once that base is durable.
The leader moves the follower's next index past the snapshot and reconnects it in pysyncobj.
A stalled install is abandoned after STALL_S; pysyncobj then starts over.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pysyncobj.serializer import SERIALIZER_STATE

from .snapshot_file import SnapshotError, SnapshotHeader, read_header, snapshot_path

__all__ = ["NoPickleSerializer", "InstallSender", "InstallReceiver", "CHUNK_BYTES", "WINDOW_BYTES", "STALL_S"]

log = logging.getLogger(__name__)

CHUNK_BYTES = 512 * 1024
WINDOW_BYTES = 4 * 1024 * 1024
STALL_S = 10.0


class NoPickleSerializer:
    """pysyncobj's Serializer interface, without pickles: installs go through the transport."""

    def __init__(self, on_need_install) -> None:
        self.on_need_install = on_need_install  # (node) -> None

    def checkSerializing(self):  # noqa: N802 - pysyncobj's interface
        return SERIALIZER_STATE.NOT_SERIALIZING, None

    def serialize(self, data, id):  # noqa: A002 - pysyncobj's interface
        raise RuntimeError("pysyncobj's own log compaction is disabled (it would pickle the state)")

    def deserialize(self):
        raise RuntimeError("pysyncobj's snapshot loading is not used (snapshot_install.py installs)")

    def getTransmissionData(self, node):  # noqa: N802
        self.on_need_install(node)
        return None

    def setTransmissionData(self, data):  # noqa: N802
        return False

    def cancelTransmisstion(self, node):  # noqa: N802 - pysyncobj's spelling
        pass


class InstallSender:
    """Leader side: one snapshot file streamed to one follower."""

    def __init__(self, nid: str, header: SnapshotHeader, term: int, clock=time.monotonic) -> None:
        assert header.path is not None
        self.nid = nid
        self.header = header
        self.term = term
        self.clock = clock
        self.fd = os.open(header.path, os.O_RDONLY)  # stays readable if a newer snapshot replaces it
        self.size = os.fstat(self.fd).st_size
        self.sent = 0  # bytes put on the wire
        self.acked = 0  # bytes the follower has
        self.done = False
        self.last_progress = clock()
        self.started = self.last_progress

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def stalled(self) -> bool:
        return self.clock() - self.last_progress > STALL_S

    def next_messages(self, budget: int = WINDOW_BYTES) -> list[dict]:
        out = []
        while self.sent < self.size and self.sent - self.acked < budget:
            n = min(CHUNK_BYTES, self.size - self.sent)
            data = os.pread(self.fd, n, self.sent)
            if len(data) != n:
                raise OSError(f"snapshot {self.header.path} shrank while being sent")
            out.append(
                {
                    "type": "snapshot_chunk",
                    "term": self.term,
                    "index": self.header.index,
                    "offset": self.sent,
                    "data": data,
                    "is_last": self.sent + n == self.size,
                }
            )
            self.sent += n
        return out

    def on_ack(self, m: dict) -> None:
        if m["index"] != self.header.index or m["term"] != self.term:
            return
        self.last_progress = self.clock()
        if m["done"]:
            self.done = True
            return
        offset = m["offset"]
        if offset < self.acked or offset > self.size:
            return
        self.acked = offset
        if offset < self.sent:
            self.sent = offset  # the follower missed a chunk: send again from what it has


class InstallReceiver:
    """Follower side: chunks of one snapshot appended to `<folder>/incoming.recv`."""

    def __init__(self, folder: Path, index: int, term: int) -> None:
        self.folder = folder
        self.index = index
        self.term = term
        folder.mkdir(parents=True, exist_ok=True)
        self.tmp = folder / "incoming.recv"
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def on_chunk(self, m: dict) -> tuple[int, SnapshotHeader | None]:
        """(offset to ack, the checked snapshot once complete)."""
        if m["offset"] != self.size:
            return self.size, None
        data = m["data"]
        try:
            os.write(self.fd, data)  # a local file: short writes do not happen for regular files
            self.size += len(data)
            if not m["is_last"]:
                return self.size, None
            os.fdatasync(self.fd)
        except OSError:
            # A full disk or an I/O error: the partial file must not keep the space it took;
            # the error stops this node (engine: fail-stop), which starts again when it can.
            self.close()
            self.tmp.unlink(missing_ok=True)
            raise
        self.close()
        path = snapshot_path(self.folder, self.index)
        try:
            header = read_header(self.tmp)
        except SnapshotError as exc:
            log.error("received snapshot at index %d is bad: %s", self.index, exc)
            self.tmp.unlink(missing_ok=True)
            raise
        if header.index != self.index:
            self.tmp.unlink(missing_ok=True)
            raise SnapshotError(f"received snapshot says index {header.index}, the leader said {self.index}")
        os.replace(self.tmp, path)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        header.path = path
        return self.size, header
