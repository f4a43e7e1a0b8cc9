"""A group's snapshot on disk: the machines' state at one log index, in one checked file.

Theory of operation: a snapshot replaces the log up to its index. The engine treats its body as
opaque bytes (the broker writes and reads it: machine state as msgpack records); the header says
where it stands in the log: the index and term of its last entry, the two entries pysyncobj
keeps as the first of a compacted log (`prev` = index - 1, `last` = index, their real commands:
a member that leads later sends `last` to followers as an ordinary entry), and the group's
members at that index (the log that named them is gone).

File (`<folder>/snapshot-<index, 20 digits>.snap`), big-endian:
  magic "MQSN" | u32 version | u32 header length | header (msgpack map) | body | u32 crc32
The crc covers everything before it. A file is written as `.tmp`, fdatasynced, renamed, and the
folder fsynced: a snapshot exists whole or not at all. Nothing here is a pickle.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import msgpack

__all__ = [
    "SnapshotError",
    "SnapshotHeader",
    "write_snapshot",
    "read_header",
    "read_body",
    "latest_snapshot",
    "prune_snapshots",
    "snapshot_path",
]

log = logging.getLogger(__name__)

MAGIC = b"MQSN"
VERSION = 1
_HEAD = struct.Struct(">4sII")
_CRC = struct.Struct(">I")
HEADER_BYTES_MAX = 4 * 1024 * 1024  # two entries (<= 1 MiB each) and a member list
READ_CHUNK_BYTES = 1024 * 1024
_NAME_RE = re.compile(r"^snapshot-(\d{20})\.snap$")


class SnapshotError(Exception):
    """A snapshot file is missing, torn, corrupt or of an unknown version."""


class SnapshotHeader:
    __slots__ = ("group", "index", "term", "prev", "last", "members", "path", "body_offset", "body_bytes")

    def __init__(
        self,
        group: str,
        index: int,
        term: int,
        prev: tuple,
        last: tuple,
        members: list,
        path: Path | None = None,
        body_offset: int = 0,
        body_bytes: int = 0,
    ) -> None:
        self.group = group
        self.index = index
        self.term = term
        self.prev = prev  # (command, index - 1, term)
        self.last = last  # (command, index, term)
        self.members = members  # [(node_id, host, port)]
        self.path = path
        self.body_offset = body_offset
        self.body_bytes = body_bytes

    def encode(self) -> bytes:
        return msgpack.packb(
            {
                "group": self.group,
                "index": self.index,
                "term": self.term,
                "prev": list(self.prev),
                "last": list(self.last),
                "members": [list(m) for m in self.members],
            },
            use_bin_type=True,
        )

    @classmethod
    def decode(cls, raw: bytes, path: Path) -> SnapshotHeader:
        try:
            h = msgpack.unpackb(raw, raw=False, strict_map_key=True)
            prev, last = h["prev"], h["last"]
            header = cls(
                h["group"],
                h["index"],
                h["term"],
                (bytes(prev[0]), prev[1], prev[2]),
                (bytes(last[0]), last[1], last[2]),
                [(str(m[0]), str(m[1]), int(m[2])) for m in h["members"]],
                path,
            )
        except Exception as exc:  # msgpack and the lookups raise several types on garbage
            raise SnapshotError(f"{path}: bad header: {exc}") from None
        if not (
            type(header.index) is int
            and header.index >= 2
            and header.last[1] == header.index
            and header.prev[1] == header.index - 1
            and header.last[2] == header.term
            and header.prev[2] <= header.term
        ):
            raise SnapshotError(f"{path}: inconsistent header (index {header.index})")
        return header


def snapshot_path(folder: Path, index: int) -> Path:
    return folder / f"snapshot-{index:020d}.snap"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_snapshot(folder: Path, header: SnapshotHeader, body: Iterable[bytes]) -> Path:
    """Write a snapshot durably (any thread); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = snapshot_path(folder, header.index)
    tmp = path.with_suffix(".tmp")
    raw = header.encode()
    head = _HEAD.pack(MAGIC, VERSION, len(raw)) + raw
    crc = zlib.crc32(head)
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for chunk in body:
                if chunk:
                    f.write(chunk)
                    crc = zlib.crc32(chunk, crc)
            f.write(_CRC.pack(crc))
            f.flush()
            os.fdatasync(f.fileno())
    except BaseException:
        # A full disk or a failed fdatasync: the partial file must not keep the space it took
        # (the caller logs the error and tries again later).
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    _fsync_dir(folder)
    return path


def read_header(path: Path, *, verify: bool = True) -> SnapshotHeader:
    """The header of a snapshot file; with verify, the whole file's crc is checked first."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            fixed = f.read(_HEAD.size)
            if len(fixed) < _HEAD.size:
                raise SnapshotError(f"{path}: torn (shorter than its fixed header)")
            magic, version, hlen = _HEAD.unpack(fixed)
            if magic != MAGIC:
                raise SnapshotError(f"{path}: not a snapshot (magic {magic!r})")
            if version != VERSION:
                raise SnapshotError(f"{path}: snapshot version {version} (this build reads {VERSION})")
            if hlen > HEADER_BYTES_MAX or _HEAD.size + hlen + _CRC.size > size:
                raise SnapshotError(f"{path}: torn or corrupt (header of {hlen} bytes in a {size}-byte file)")
            raw = f.read(hlen)
            if verify:
                crc = zlib.crc32(fixed + raw)
                left = size - _HEAD.size - hlen - _CRC.size
                while left > 0:
                    chunk = f.read(min(READ_CHUNK_BYTES, left))
                    if not chunk:
                        raise SnapshotError(f"{path}: torn (ends early)")
                    crc = zlib.crc32(chunk, crc)
                    left -= len(chunk)
                (want,) = _CRC.unpack(f.read(_CRC.size))
                if crc != want:
                    raise SnapshotError(f"{path}: crc mismatch (corrupt)")
    except OSError as exc:
        raise SnapshotError(f"{path}: {exc.strerror or exc}") from None
    header = SnapshotHeader.decode(raw, path)
    header.body_offset = _HEAD.size + hlen
    header.body_bytes = size - header.body_offset - _CRC.size
    return header


def read_body(header: SnapshotHeader, chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
    """The body of a checked snapshot, in chunks."""
    assert header.path is not None
    with open(header.path, "rb") as f:
        f.seek(header.body_offset)
        left = header.body_bytes
        while left > 0:
            chunk = f.read(min(chunk_bytes, left))
            if not chunk:
                raise SnapshotError(f"{header.path}: ends early")
            left -= len(chunk)
            yield chunk


def _indexed(folder: Path) -> list[tuple[int, Path]]:
    found = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        m = _NAME_RE.match(name)
        if m:
            found.append((int(m.group(1)), folder / name))
    found.sort()
    return found


def latest_snapshot(folder: Path) -> SnapshotHeader | None:
    """The newest whole snapshot in folder (newest first; a bad one is logged and skipped)."""
    for _index, path in reversed(_indexed(folder)):
        try:
            return read_header(path)
        except SnapshotError as exc:
            log.error("snapshot skipped: %s", exc)
    return None


def prune_snapshots(folder: Path, keep_index: int) -> int:
    """Delete snapshot files other than keep_index's, and stale temp files; how many went."""
    n = 0
    for index, path in _indexed(folder):
        if index != keep_index:
            path.unlink(missing_ok=True)
            n += 1
    for name in os.listdir(folder) if folder.is_dir() else []:
        if name.endswith(".tmp"):
            (folder / name).unlink(missing_ok=True)
            n += 1
    return n
