"""A FUSE passthrough that can hold writes and fsyncs: the disk-stall fault's file system.

Theory of operation: `python -m maxq_jepsen.stallfs BACKING MOUNTPOINT CONTROL FSNAME` mounts BACKING at
MOUNTPOINT (fusepy over libfuse2, foreground, multi-threaded) and passes every call through to
the backing folder. A watcher thread reads CONTROL every CONTROL_POLL_S: while it says "stall",
every write, fsync, fdatasync, flush of a written file, truncate and create waits (reads do not:
a stalled disk in the wild is a stalled write queue). "run" (or a missing file) releases them.
A stall never outlives STALL_MAX_S, so a harness that died without unstalling cannot wedge a
broker for ever. The harness mounts a node's data folder through this before the node starts
(docs/reliability.md, "Faults": 0.8 s stalls measured as asked), flips CONTROL to stall the
leader, and unmounts at teardown (`fusermount -u`, lazily if busy).

The harness never imports this module (fusepy is only needed where the fault runs).
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time

CONTROL_POLL_S = 0.05
STALL_MAX_S = 120.0


class Gate:
    """Open unless the control file says "stall"; waits are bounded by STALL_MAX_S."""

    def __init__(self, control: str) -> None:
        self.control = control
        self.open = threading.Event()
        self.open.set()
        self.stalled_since: float | None = None
        self.held = 0  # calls that found the gate shut during the current stall (logged at its end)
        threading.Thread(target=self._watch, name="stallfs-control", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                with open(self.control) as f:
                    stall = f.read().strip() == "stall"
            except OSError:
                stall = False
            if stall and self.stalled_since is None:
                self.stalled_since = time.monotonic()
                self.held = 0
                print("stallfs: stall", flush=True)
            if not stall and self.stalled_since is not None:
                print(
                    f"stallfs: run after {time.monotonic() - self.stalled_since:.1f} s, {self.held} calls held",
                    flush=True,
                )
                self.stalled_since = None
            over = self.stalled_since is not None and time.monotonic() - self.stalled_since > STALL_MAX_S
            if stall and not over:
                self.open.clear()
            else:
                self.open.set()
            time.sleep(CONTROL_POLL_S)

    def wait(self) -> None:
        if not self.open.is_set():
            self.held += 1  # a counter for the log only: a lost increment under a race does not matter
        self.open.wait(STALL_MAX_S)


def make_ops(backing: str, gate: Gate):
    from fuse import FuseOSError, Operations  # fusepy: only where the fault runs

    class Passthrough(Operations):
        def __init__(self) -> None:
            self.root = os.path.realpath(backing)

        def _p(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def __call__(self, op, path, *args):
            try:
                return super().__call__(op, path, *args)
            except OSError as exc:
                raise FuseOSError(exc.errno or errno.EIO) from None

        # -- metadata -------------------------------------------------------------------
        def access(self, path, mode):
            if not os.access(self._p(path), mode):
                raise FuseOSError(errno.EACCES)

        def getattr(self, path, fh=None):
            st = os.lstat(self._p(path))
            return {
                k: getattr(st, k)
                for k in (
                    "st_atime",
                    "st_ctime",
                    "st_gid",
                    "st_mode",
                    "st_mtime",
                    "st_nlink",
                    "st_size",
                    "st_uid",
                    "st_blocks",
                )
            }

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._p(path))]

        def readlink(self, path):
            return os.readlink(self._p(path))

        def statfs(self, path):
            sv = os.statvfs(self._p(path))
            return {
                k: getattr(sv, k)
                for k in (
                    "f_bavail",
                    "f_bfree",
                    "f_blocks",
                    "f_bsize",
                    "f_favail",
                    "f_ffree",
                    "f_files",
                    "f_flag",
                    "f_frsize",
                    "f_namemax",
                )
            }

        def chmod(self, path, mode):
            return os.chmod(self._p(path), mode)

        def chown(self, path, uid, gid):
            return os.chown(self._p(path), uid, gid)

        def utimens(self, path, times=None):
            return os.utime(self._p(path), times)

        # -- namespace changes (held too: they are journal writes on a real disk) ---------
        def mkdir(self, path, mode):
            gate.wait()
            return os.mkdir(self._p(path), mode)

        def rmdir(self, path):
            gate.wait()
            return os.rmdir(self._p(path))

        def unlink(self, path):
            gate.wait()
            return os.unlink(self._p(path))

        def rename(self, old, new):
            gate.wait()
            return os.rename(self._p(old), self._p(new))

        def link(self, target, name):
            gate.wait()
            return os.link(self._p(name), self._p(target))

        def symlink(self, name, target):
            gate.wait()
            return os.symlink(target, self._p(name))

        # -- files ----------------------------------------------------------------------
        def open(self, path, flags):
            return os.open(self._p(path), flags)

        def create(self, path, mode, fi=None):
            gate.wait()
            return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def read(self, path, length, offset, fh):
            return os.pread(fh, length, offset)

        def write(self, path, data, offset, fh):
            gate.wait()
            return os.pwrite(fh, data, offset)

        def truncate(self, path, length, fh=None):
            gate.wait()
            if fh is not None:
                return os.ftruncate(fh, length)
            with open(self._p(path), "r+b") as f:
                f.truncate(length)

        def flush(self, path, fh):
            return None  # close(2) of a dup'd handle: nothing to push (writes went straight through)

        def release(self, path, fh):
            return os.close(fh)

        def fsync(self, path, datasync, fh):
            gate.wait()
            return os.fdatasync(fh) if datasync else os.fsync(fh)

    return Passthrough()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m maxq_jepsen.stallfs BACKING MOUNTPOINT CONTROL FSNAME", file=sys.stderr)
        return 2
    backing, mountpoint, control, fsname = argv
    from fuse import FUSE

    gate = Gate(control)
    # foreground: the harness owns the process; multi-threaded: a held write must not hold reads.
    # fsname (the mount's source, mxqjfs-<harness pid>) lets a later harness find a dead one's mounts.
    FUSE(make_ops(backing, gate), mountpoint, foreground=True, nothreads=False, fsname=fsname)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
