"""The lab: where the nodes under test run, and the handles the nemesis uses to hurt them.

Theory of operation: a `Lab` owns a set of `Node`s. Each node is one real `maxq-server` process
with its own data folder and log, started, killed (SIGKILL), restarted on the same data folder
and the same address, paused (SIGSTOP) and resumed (SIGCONT). Clients only ever ask the lab for a
node's AMQP address, so they do not care where the node lives.

Backends:
  LocalLab   processes on 127.0.0.1: one node (no cluster flags), or N cluster members, each
             with its own AMQP, HTTP (admin) and Raft port and `--peer` flags naming the others.
  NetnsLab   one network namespace per host, 10.77.0.i/24 on a bridge that lives in its own
             "switch" namespace, so the machine's network is never touched. Raft runs between
             the 10.77.0.i addresses; it adds `partition(cuts)` / `heal_network()`: every cut is
             an `ip saddr A ip daddr B drop` rule, all applied in one atomic `nft -f` in the
             switch namespace (docs/reliability.md, "A lab that worked" and "Faults"). Established
             TCP flows are cut too. Packet loss lives in the same table (`set_loss`: an nft
             `numgen random` rule per lossy node), so one transaction always states the whole
             network fault. Delay (`start_delay`) is an iptables NFQUEUE rule pair in the node's
             own namespace plus a userspace delayer process (delayer.py) there.
             Clients reach a node over the loopback of the node's own namespace: the broker
             has only the `guest` user, and guest may only log in from loopback (RabbitMQ's
             loopback_users), so a client thread enters the node's namespace (setns(2) is per
             thread) for the moment it opens its socket (`Lab.enter(node)`), then returns. A
             partition cuts the nodes from each other, never a client from its node: the
             clients are co-located with the nodes, as in Jepsen's own setup.

Features a run asks for (`features`), set up before the nodes start and undone at teardown:
  "disk"   every node's data folder is a FUSE passthrough mount (stallfs.py) of a backing
           folder, so `stall_disk(node)` can hold its writes and fsyncs; unmounted at teardown
           (`fusermount -u`, lazily when busy); mounts of dead harnesses are unmounted at setup.
  "clock"  every node runs under libfaketime with its own skew file, so `skew_clock(node, s)`
           moves its wall clock (monotonic untouched; see faults.faketime_env).
  "diskfull" every node's data folder is on a tmpfs of its own (DISK_FULL_FS_SIZE; root), so
           `fill_disk(node, slack)` can fill that filesystem with a ballast file but `slack`
           bytes, which the node's own writes then use up (short writes, ENOSPC, its disk
           alarm), and `empty_disk(node)` deletes the ballast; unmounted at teardown (lazily
           when busy); mounts of dead harnesses (source `mxqjdf-<pid>`) are unmounted at setup.
           With "disk" too, the tmpfs is the FUSE mount's backing folder.

A cluster's members wait for each other at start (`launch` all, then `wait_ready` all); a
member restarted later prints its ready line once it has caught up with the majority. The
lab also reads the cluster's status (`/api/cluster/status` on any live member) to find the
leader of a group, e.g. the shard that holds the workload's queue (`queue_group`).

A restart reuses the node's port: the clients' reconnect loops must find the node where it was.
Ports come from below the kernel's ephemeral range, so that a client's own ephemeral port can
never be the node's port (a TCP self-connect on loopback while the node is down).
Every wait here is bounded; `teardown` stops every process (SIGCONT first, then SIGTERM, then
SIGKILL) and is safe to call twice.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

from maxq_raft.perf.ports import free_port_in

from . import faults

READY_TIMEOUT_S = 30.0
CLUSTER_READY_TIMEOUT_S = 90.0  # two cores shared with other work: a cold cluster start is slow
STATUS_TIMEOUT_S = 3.0
CLUSTER_SECRET = "maxq-jepsen-secret"
SERVER_ENV = "MAXQ_JEPSEN_SERVER"
STOP_TIMEOUT_S = 10.0
# Below Linux's default ephemeral range (32768-60999), and above the ports the test suite's own
# brokers take (tests/conftest.py: 20000-29999), which may run beside a harness (pytest-xdist).
PORT_RANGE = (30000, 32000)
PORT_TRIES_MAX = 200
LOG_PROBLEM_MARKERS = ("Traceback", "CRITICAL")
MAXQCTL_ENV = "MAXQ_JEPSEN_MAXQCTL"
MAXQCTL_TIMEOUT_S = 60.0  # a membership change waits at most 35 s on the node


class LabError(Exception):
    pass


def pick_port(taken: set[int]) -> int:
    """A free port of PORT_RANGE not in `taken` (added to it)."""
    # (SystemRandom: ports are not part of the seeded run, any free one will do)
    port = free_port_in(*PORT_RANGE, taken, random.SystemRandom(), PORT_TRIES_MAX)
    if port is None:
        raise LabError(f"no free port in {PORT_RANGE} after {PORT_TRIES_MAX} tries")
    return port


def server_command() -> list[str]:
    """maxq-server from the interpreter's own venv (the harness runs on the project's .venv).

    Wrapped in `setpriv --pdeathsig KILL` when there is one (util-linux): if the harness itself is
    SIGKILLed (a CI timeout), its brokers die with it instead of holding ports and data folders.
    The death signal fires when the *thread* that started the node exits, so nodes are only ever
    started from the runner's main thread.

    $MAXQ_JEPSEN_SERVER (a shell-quoted command) replaces maxq-server, to test another build, e.g.
    `env PYTHONPATH=/tmp/build .venv/bin/python -P -m maxq_raft` for a `git archive` of a commit."""
    override = os.environ.get(SERVER_ENV)
    script = Path(sys.executable).parent / "maxq-server"
    if override:
        command = shlex.split(override)
    else:
        command = [str(script)] if script.exists() else [sys.executable, "-m", "maxq_raft"]
    setpriv = shutil.which("setpriv")
    if setpriv is not None and sys.platform.startswith("linux"):
        return [setpriv, "--pdeathsig", "KILL", "--", *command]
    return command


class Node:
    """One maxq-server process; its data folder and port outlive the process."""

    def __init__(
        self,
        name: str,
        host: str,
        amqp_port: int,
        data_dir: Path,
        log_path: Path,
        extra_args: list[str],
        http_port: int = 0,
        raft_port: int | None = None,
        prefix: list[str] | None = None,
        netns: str | None = None,
        sqs_port: int = 0,
    ) -> None:
        self.name = name
        self.host = host
        self.netns = netns  # the namespace the node runs in (None: the harness's own)
        self.amqp_port = amqp_port
        self.http_port = http_port  # 0: no admin API (the single node does not need it)
        self.raft_port = raft_port  # None: not a cluster member
        self.sqs_port = sqs_port  # 0: no SQS endpoint (only the sqs workload needs one)
        self.peers: dict[str, str] = {}  # name -> "host:raft_port" of the other members
        self.shards = 0
        self.prefix = list(prefix or [])  # e.g. ["ip", "netns", "exec", ns]: where the process runs
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.join = False  # start with `--join on` (a wiped member waiting for maxqctl add-node)
        self.env: dict[str, str] = {}  # extra environment (e.g. libfaketime for clock skew)
        self.starts = 0
        self._log = None
        self._log_offset = 0

    def __repr__(self) -> str:
        return f"Node({self.name} {self.host}:{self.amqp_port} pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def clustered(self) -> bool:
        return self.raft_port is not None

    def command(self) -> list[str]:
        # In a namespace the listeners take every address of the host: the node's peers use
        # 10.77.0.i, its clients 127.0.0.1 (see the module docstring).
        bind = "0.0.0.0" if self.netns else self.host
        cmd = [
            *self.prefix,
            *server_command(),
            "--data-dir",
            str(self.data_dir),
            "--amqp-host",
            bind,
            "--amqp-port",
            str(self.amqp_port),
            "--http-host",
            bind,
            "--http-port",
            str(self.http_port),
            "--node-id",
            self.name,
        ]
        if self.sqs_port:
            cmd += ["--sqs-port", str(self.sqs_port)]
        if self.clustered:
            cmd += ["--raft-addr", f"{self.host}:{self.raft_port}", "--cluster-secret", CLUSTER_SECRET]
            if self.shards:
                cmd += ["--shards", str(self.shards)]
            for peer, address in sorted(self.peers.items()):
                cmd += ["--peer", f"{peer}@{address}"]
            if self.join:
                cmd += ["--join", "on"]
        return [*cmd, *self.extra_args]

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def admin_address(self) -> str:
        """Where maxqctl reaches this member's HTTP admin API (from inside its namespace)."""
        return f"{'127.0.0.1' if self.netns else self.host}:{self.http_port}"

    def start(self, timeout_s: float | None = None) -> None:
        self.launch()
        self.wait_ready(timeout_s)

    def launch(self) -> None:
        """Start the process without waiting (cluster members wait for each other to be ready).
        `ip netns exec` and `setpriv` both exec: the Popen pid is the broker's own pid."""
        assert not self.alive(), f"{self.name} is already running"
        assert threading.current_thread() is threading.main_thread(), "see server_command: pdeathsig"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.log_path, "ab")
        self._log_offset = self.log_path.stat().st_size  # only a ready line written by this start counts
        # cwd is the data folder's parent, never the repo root: our amqp/ must not shadow py-amqp.
        self.proc = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(self.data_dir.parent),
            start_new_session=True,
            # No Prometheus port: the nodes share loopback, and its default (15692) is one port. By
            # environment, not option, so that a server built from an older commit starts too.
            env={**os.environ, "MAXQ_PROMETHEUS_PORT": "0", **self.env},
        )
        self.paused = False
        self.starts += 1

    def wait_ready(self, timeout_s: float | None = None, give_up_on: tuple[bytes, ...] = ()) -> None:
        """Until this start's "maxq-server ready" line. A line of this start containing one of
        `give_up_on` ends the wait at once with a LabError naming it (the process is left running)."""
        if timeout_s is None:
            timeout_s = CLUSTER_READY_TIMEOUT_S if self.clustered else READY_TIMEOUT_S
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(
                    f"{self.name} exited with {self.proc.returncode} while starting; log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                text = f.read()
            if b"maxq-server ready" in text:
                return
            for marker in give_up_on:
                if marker in text:
                    line = next(row for row in text.splitlines() if marker in row).decode(errors="replace")
                    raise LabError(f"{self.name} will not become ready: {line.strip()[:300]}")
            time.sleep(0.05)
        self.kill()
        raise LabError(f"{self.name} not ready after {timeout_s}s; log {self.log_path}:\n{self.log_tail()}")

    def status(self, timeout_s: float = STATUS_TIMEOUT_S) -> dict | None:
        """This member's view of the cluster (the admin API's /api/cluster/status), None if it does not answer."""
        return self.admin_get("/api/cluster/status", timeout_s)

    def admin_get(self, path: str, timeout_s: float = STATUS_TIMEOUT_S) -> dict | None:
        """GET `path` of this member's admin API as JSON; None if it does not answer, or not 200."""
        if not self.http_port or not self.alive() or self.paused:
            return None
        try:
            with in_netns(self.netns):
                host = "127.0.0.1" if self.netns else self.host
                url = f"http://{host}:{self.http_port}{path}"
                # guest's credentials: the request comes from loopback inside the namespace
                request = urllib.request.Request(url, headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    answer = json.load(response)
                    return answer if isinstance(answer, dict) else None
        except (OSError, ValueError):
            return None

    def kill(self) -> None:
        """SIGKILL, as a crash (also of a paused process)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)
        self.paused = False

    def pause(self) -> None:
        if self.alive() and not self.paused:
            self.proc.send_signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive() and self.paused:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def stop(self) -> int | None:
        """Clean stop (SIGTERM), SIGKILL if it does not go in time. Safe to call twice."""
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
                self.paused = False
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode if self.proc is not None else None

    def log_tail(self, bytes_max: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return ""
        return data[-bytes_max:].decode(errors="replace")

    def log_problems(self, lines_max: int = 20) -> list[str]:
        """Log lines that point at a broker bug (tracebacks, critical errors)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return []
        return log_problems(text.splitlines())[:lines_max]


LOG_RECORD_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # a record's first line: its time
TRACEBACK_LINES_MAX = 400  # a traceback longer than this is cut there


def log_problems(lines: list[str]) -> list[str]:
    """The lines of a node's log that point at a broker bug: CRITICAL records, and each traceback
    as one line naming the record it belongs to and the exception it ends with (its first line
    alone said nothing, and the run's data folder, with the log, is deleted afterwards)."""
    found = []
    for i, line in enumerate(lines):
        if "Traceback" in line:
            end = i + 1
            while end < min(len(lines), i + TRACEBACK_LINES_MAX) and not LOG_RECORD_START.match(lines[end]):
                end += 1
            body = [text for text in lines[i + 1 : end] if text.strip()]
            record = lines[i - 1] if i > 0 else "(no record before it)"
            raised = body[-1].strip() if body else "(no exception line)"
            where = body[-3].strip() if len(body) >= 3 else ""
            found.append(f"{line.strip()} in: {record} ... {where} -> {raised}")
        elif any(marker in line for marker in LOG_PROBLEM_MARKERS):
            found.append(line)
    return found


def maxqctl_command(asker: Node, *args: str) -> list[str]:
    """`maxqctl --node <asker's admin API> --json ARGS`, run where the asker lives (its namespace).
    $MAXQ_JEPSEN_MAXQCTL (shell-quoted) replaces `python -m maxq_raft.cli.maxqctl` (another build)."""
    override = os.environ.get(MAXQCTL_ENV)
    base = shlex.split(override) if override else [sys.executable, "-m", "maxq_raft.cli.maxqctl"]
    return [*asker.prefix, *base, "--node", asker.admin_address, "--json", *args]


def run_maxqctl(asker: Node, *args: str, timeout_s: float = MAXQCTL_TIMEOUT_S) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr); exit None when it did not finish in time. cwd is the data
    folder's parent, never the repo root (our amqp/ must not shadow py-amqp)."""
    try:
        done = subprocess.run(
            maxqctl_command(asker, *args),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=str(asker.data_dir.parent.parent),
        )
    except subprocess.TimeoutExpired:
        return None, "", f"maxqctl did not finish in {timeout_s:g} s"
    return done.returncode, done.stdout, done.stderr


class Lab:
    """The interface every backend implements (see the module docstring)."""

    backend = "abstract"
    nodes: list[Node]
    root: Path
    features: frozenset = frozenset()
    helpers: dict  # "fs:<node>" / "delay:<node>" -> Popen of a helper process the lab started

    def setup(self) -> None:
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def address(self, node: Node) -> tuple[str, int]:
        """Where a client reaches `node`'s AMQP listener (from inside `enter(node)`)."""
        return ("127.0.0.1" if node.netns else node.host), node.amqp_port

    def sqs_url(self, node: Node) -> str:
        """Where a client reaches `node`'s SQS endpoint (from inside `enter(node)`)."""
        return f"http://{'127.0.0.1' if node.netns else node.host}:{node.sqs_port}"

    def admin_url(self, node: Node) -> str:
        return f"http://{node.admin_address}"

    def enter(self, name: str):
        """A context in which the calling thread's new sockets reach node `name` at `address`."""
        return in_netns(self.node(name).netns)

    def describe(self) -> dict:
        return {
            "backend": self.backend,
            "nodes": {n.name: f"{n.host}:{n.amqp_port}" for n in self.nodes},
            "raft": {n.name: f"{n.host}:{n.raft_port}" for n in self.nodes if n.clustered},
        }

    @property
    def clustered(self) -> bool:
        return any(n.clustered for n in self.nodes)

    def shards(self) -> int:
        return self.nodes[0].shards

    def queue_group(self, vhost: str, queue: str) -> str:
        """The shard group the queue lives in, as a live member's queue record says (the member
        that declared it may have chosen a group it leads: x-queue-leader-locator client-local,
        the default); before any member answers for it, where its name hashes (`shard_of`)."""
        path = f"/api/queues/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}"
        for node in self.nodes:
            record = node.admin_get(path)
            if record is not None and isinstance(record.get("group"), str):
                return record["group"]
        return shard_of((vhost, queue), self.shards())

    def leader_of(self, group: str) -> Node | None:
        """The leader of a Raft group as the live members see it: the answer with the highest term
        wins (a deposed leader cut off in a minority may still believe it leads). None: no leader."""
        best: tuple[int, str] | None = None
        for node in self.nodes:
            status = node.status()
            if status is None:
                continue
            for g in status.get("groups", []):
                if g.get("group") == group and g.get("leader") is not None:
                    term = g.get("term") or 0
                    if best is None or term > best[0]:
                        best = (term, g["leader"])
        if best is None:
            return None
        try:
            return self.node(best[1])
        except KeyError:
            return None

    def leaders(self) -> dict[str, str]:
        """Every group's leader as the live members see them (highest term wins), by group name."""
        best: dict[str, tuple[int, str]] = {}
        for node in self.nodes:
            status = node.status()
            for g in (status or {}).get("groups", []):
                if g.get("group") and g.get("leader") is not None:
                    term = g.get("term") or 0
                    if g["group"] not in best or term > best[g["group"]][0]:
                        best[g["group"]] = (term, g["leader"])
        return {group: leader for group, (_, leader) in sorted(best.items())}

    def partition(self, cuts: list[tuple[str, str]]) -> None:
        raise LabError(f"the {self.backend} lab cannot cut links (partitions need --lab netns)")

    def heal_network(self) -> None:
        pass  # nothing to heal where nothing can be cut

    # -- features: disk (FUSE mounts) and clock (libfaketime), both labs -----------------------

    def prepare_features(self) -> None:
        """Before the nodes start: mount data folders through stallfs, give nodes their skew files."""
        self.helpers = getattr(self, "helpers", {})
        self.small_disks: dict[str, Path] = getattr(self, "small_disks", {})
        if "diskfull" in self.features:
            unmount_stale()
            for node in self.nodes:
                self._mount_small_disk(node)
        if "disk" in self.features:
            unmount_stale()
            for node in self.nodes:
                self._mount(node)
        if "clock" in self.features:
            library = faketime_library()
            if library is None:
                raise LabError("libfaketime is missing (apt-get install -y faketime): clock-skew cannot run")
            for node in self.nodes:
                skew_file = self.root / f"{node.name}.skew"
                skew_file.write_text("+0\n")
                node.env = {
                    **faults.faketime_env(library, str(skew_file)),
                    "PYTHONPATH": os.pathsep.join([str(FAKETIME_SITE), os.environ.get("PYTHONPATH", "")]).rstrip(
                        os.pathsep
                    ),
                }

    def _mount(self, node: Node) -> None:
        backing = node.data_dir.with_name("data.backing")
        backing.mkdir(parents=True, exist_ok=True)
        node.data_dir.mkdir(parents=True, exist_ok=True)
        control = self.root / f"{node.name}.stall"
        control.write_text("run\n")
        log = open(self.root / f"{node.name}.stallfs.log", "ab")
        proc = subprocess.Popen(
            [
                *helper_prefix(),
                sys.executable,
                "-m",
                "maxq_jepsen.stallfs",
                str(backing),
                str(node.data_dir),
                str(control),
                f"mxqjfs-{os.getpid()}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(self.root),
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(JEPSEN_DIR)},
        )
        log.close()
        self.helpers[f"fs:{node.name}"] = proc
        deadline = time.monotonic() + MOUNT_TIMEOUT_S
        while not os.path.ismount(node.data_dir):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise LabError(
                    f"stallfs for {node.name} did not mount {node.data_dir} (exit {proc.poll()}); "
                    f"log {self.root / (node.name + '.stallfs.log')}"
                )
            time.sleep(0.05)

    def _mount_small_disk(self, node: Node) -> None:
        # Under stallfs (feature "disk") the bytes land in its backing folder: the tmpfs goes there.
        target = node.data_dir.with_name("data.backing") if "disk" in self.features else node.data_dir
        target.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_FULL_FS_SIZE}", f"mxqjdf-{os.getpid()}", str(target)],
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise LabError(f"cannot mount a tmpfs at {target} for disk-full (root needed): {done.stderr.strip()}")
        self.small_disks[node.name] = target

    def fill_disk(self, node: Node, slack_bytes: int) -> dict:
        """Fill the node's filesystem but `slack_bytes` with a ballast file (allocated, not just sized)."""
        if node.name not in self.small_disks:
            raise LabError(
                "the data folders are not on small filesystems: the run must include disk-full from the start"
            )
        target = self.small_disks[node.name]
        before = _free_bytes(target)
        fd = os.open(target / BALLAST_NAME, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            # In steps: tmpfs undoes a fallocate that does not fit whole, and the node's own writes
            # take room meanwhile; a step that does not fit is halved, down to a page.
            offset, chunk = os.fstat(fd).st_size, FILL_CHUNK_BYTES
            for _ in range(FILL_STEPS_MAX):
                room = _free_bytes(target) - slack_bytes
                if room < FILL_PAGE_BYTES or chunk < FILL_PAGE_BYTES:
                    break
                step = min(chunk, room)
                try:
                    os.posix_fallocate(fd, offset, step)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk //= 2
                    continue
                offset += step
        finally:
            os.close(fd)
        return {"free_before_bytes": before, "free_after_bytes": _free_bytes(target)}

    def empty_disk(self, node: Node) -> None:
        if node.name in self.small_disks:
            with contextlib.suppress(FileNotFoundError):
                (self.small_disks[node.name] / BALLAST_NAME).unlink()

    def stall_disk(self, node: Node, stall: bool = True) -> None:
        if "disk" not in self.features:
            raise LabError("the data folders are not FUSE mounts: the run must include disk-stall from the start")
        (self.root / f"{node.name}.stall").write_text("stall\n" if stall else "run\n")

    def skew_clock(self, node: Node, seconds: float) -> None:
        if "clock" not in self.features:
            raise LabError("the nodes do not run under faketime: the run must include clock-skew from the start")
        path = self.root / f"{node.name}.skew"
        tmp = path.with_suffix(".skew.tmp")
        tmp.write_text(faults.faketime_offset(seconds) + "\n")
        os.replace(tmp, path)  # a reader never sees a half-written offset

    def release_features(self) -> list[str]:
        """After the nodes stopped: stop helpers, unmount. Safe to call twice; returns the errors."""
        errors = []
        for key, proc in sorted(getattr(self, "helpers", {}).items()):
            if key.startswith("fs:"):
                node = self.node(key[3:])
                for lazy in (False, True):
                    if not os.path.ismount(node.data_dir):
                        break
                    done = subprocess.run(
                        ["fusermount", "-u", *(["-z"] if lazy else []), str(node.data_dir)],
                        capture_output=True,
                        text=True,
                        timeout=CMD_TIMEOUT_S,
                    )
                    if done.returncode != 0 and lazy:
                        errors.append(f"unmount {node.data_dir}: {done.stderr.strip()}")
            stop_process(proc)
        self.helpers = {}
        for name, target in sorted(getattr(self, "small_disks", {}).items()):
            for lazy in (False, True):
                if not os.path.ismount(target):
                    break
                done = subprocess.run(
                    ["umount", *(["-l"] if lazy else []), str(target)],
                    capture_output=True,
                    text=True,
                    timeout=CMD_TIMEOUT_S,
                )
                if done.returncode != 0 and lazy:
                    errors.append(f"unmount {target} ({name}): {done.stderr.strip()}")
        self.small_disks = {}
        return errors


def shard_of(queue_key: tuple[str, str], count: int) -> str:
    """The shard group a queue lives in; a copy of maxq_raft.server.cluster.shard_of (the harness
    never imports the broker: it only talks to it). `Lab.leader_of` finds the group by this name
    in the status, so a drift between the two shows up as "no such group", never silently."""
    vhost, name = queue_key
    digest = zlib.crc32(vhost.encode() + b"\0" + name.encode())
    return f"shard-{digest % count}"


class LocalLab(Lab):
    """Nodes as processes on loopback: one plain node, or a cluster of `node_count` members."""

    backend = "local"

    def __init__(
        self,
        root: Path,
        node_count: int = 1,
        server_args: list[str] | None = None,
        shards: int = 2,
        features: frozenset = frozenset(),
    ) -> None:
        if not 1 <= node_count <= 9:
            raise LabError(f"the local lab runs 1 to 9 nodes, not {node_count}")
        self.root = Path(root)
        self.features = frozenset(features)
        self.helpers = {}
        self.nodes = make_nodes(
            self.root,
            node_count,
            server_args or [],
            shards,
            host_of=lambda i: "127.0.0.1",
            prefix_of=lambda i: [],
            features=self.features,
        )

    def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.prepare_features()
            start_all(self.nodes)
        except BaseException:
            self.teardown()
            raise

    def teardown(self) -> None:
        errors = []
        for node in self.nodes:
            try:
                node.stop()
            except Exception as exc:  # keep stopping the others
                errors.append(f"{node.name}: {exc!r}")
        errors += self.release_features()
        if errors:
            raise LabError("teardown: " + "; ".join(errors))


NS_BASE = "mxqj-"  # every namespace this harness makes is named mxqj-<pid>-<host>
# The harness process's pid in the names: two harnesses at once (CI and a person) keep apart, and a
# namespace whose harness is dead is stale (deleted at the next setup).
NS_PREFIX = f"{NS_BASE}{os.getpid()}-"
NS_SWITCH = NS_PREFIX + "sw"
SUBNET = "10.77.0"
NFT_TABLE = "mxqj"
CMD_TIMEOUT_S = 15.0
CLONE_NEWNET = 0x40000000


def _sh(*cmd: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(cmd), input=stdin, capture_output=True, text=True, timeout=CMD_TIMEOUT_S)
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()[:500]}")
    return done


def _setns(fd: int) -> None:
    """setns(2) for the calling thread (os.setns is Python 3.12+; we run on 3.11)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise LabError(f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def in_netns(ns: str | None):
    """Run the body with the calling thread in network namespace `ns` (None: stay), then go back.
    Sockets keep the namespace they were made in, so a connection opened inside lives on after."""
    if ns is None:
        yield
        return
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


class NetnsLab(Lab):
    """One network namespace per host on a bridge in a switch namespace; clients in their own.

    Nodes run under `ip netns exec`; clients enter a node's namespace to connect (`enter`)."""

    backend = "netns"

    def __init__(
        self,
        root: Path,
        node_count: int = 3,
        server_args: list[str] | None = None,
        shards: int = 2,
        features: frozenset = frozenset(),
    ) -> None:
        if not 1 <= node_count <= 9:
            raise LabError(f"the namespace lab runs 1 to 9 nodes, not {node_count}")
        self.root = Path(root)
        self.features = frozenset(features)
        self.helpers = {}
        self.loss: dict[str, int] = {}  # node -> percent of its packets dropped (both directions)
        self.ns = {f"n{i}": f"{NS_PREFIX}n{i}" for i in range(1, node_count + 1)}
        self.nodes = make_nodes(
            self.root,
            node_count,
            server_args or [],
            shards,
            host_of=lambda i: f"{SUBNET}.{i}",
            prefix_of=lambda i: ["ip", "netns", "exec", f"{NS_PREFIX}n{i}"],
            ports_fixed=True,
            netns_of=lambda i: f"{NS_PREFIX}n{i}",
            features=self.features,
        )
        self.cuts: list[tuple[str, str]] = []

    def describe(self) -> dict:
        return {**super().describe(), "namespaces": dict(self.ns)}

    def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        ok, why = netns_available()
        if not ok:
            raise LabError(f"network namespaces do not work here: {why}")
        if shutil.which("nft") is None:
            raise LabError("nft is missing (apt-get install -y nftables): the namespace lab cuts links with it")
        try:
            delete_stale_namespaces()
            _sh("ip", "netns", "add", NS_SWITCH)
            _sh("ip", "-n", NS_SWITCH, "link", "set", "lo", "up")
            _sh("ip", "-n", NS_SWITCH, "link", "add", "br0", "type", "bridge")
            _sh("ip", "-n", NS_SWITCH, "link", "set", "br0", "up")
            hosts = [(ns, f"{SUBNET}.{i}") for i, ns in enumerate(self.ns.values(), 1)]
            for j, (ns, address) in enumerate(hosts, 1):
                veth, peer = f"mxqj{j}", f"mxqj{j}s"
                _sh("ip", "netns", "add", ns)
                _sh("ip", "-n", ns, "link", "set", "lo", "up")
                _sh("ip", "link", "add", veth, "netns", ns, "type", "veth", "peer", "name", peer, "netns", NS_SWITCH)
                _sh("ip", "-n", NS_SWITCH, "link", "set", peer, "master", "br0")
                _sh("ip", "-n", NS_SWITCH, "link", "set", peer, "up")
                _sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", veth)
                _sh("ip", "-n", ns, "link", "set", veth, "up")
            self._apply([])  # the (empty) table exists from the start: a cut is then one replace
            self.prepare_features()
            start_all(self.nodes)
        except BaseException:
            self.teardown()
            raise

    def _apply(self, cuts: list[tuple[str, str]], loss: dict[str, int] | None = None) -> None:
        """One atomic nft transaction: the table is replaced with exactly `cuts` and `loss`."""
        script = faults.nft_script(NFT_TABLE, {n.name: n.host for n in self.nodes}, cuts, loss or {})
        _sh("ip", "netns", "exec", NS_SWITCH, "nft", "-f", "-", stdin=script)

    def partition(self, cuts: list[tuple[str, str]]) -> None:
        """Drop every packet from node a to node b for each (a, b) in `cuts` (directed links)."""
        self._apply(sorted(set(cuts)), self.loss)
        self.cuts = sorted(set(cuts))

    def heal_network(self) -> None:
        if self.cuts:
            self._apply([], self.loss)
            self.cuts = []

    def set_loss(self, loss: dict[str, int]) -> None:
        """Drop `percent` of every packet each named node sends or is sent (its links to the others)."""
        self._apply(self.cuts, dict(loss))
        self.loss = dict(loss)

    def heal_loss(self) -> int | None:
        """Remove the loss rules; returns how many packets they dropped (None: nothing was lossy)."""
        if not self.loss:
            return None
        listed = _sh("ip", "netns", "exec", NS_SWITCH, "nft", "list", "table", "bridge", NFT_TABLE, check=False)
        self._apply(self.cuts, {})
        self.loss = {}
        return faults.loss_counters(listed.stdout) if listed.returncode == 0 else None

    def start_delay(self, node: Node, low_ms: float, high_ms: float, seed: str) -> None:
        """Delay `node`'s packets to and from its peers by low..high ms: a delayer bound to an NFQUEUE
        in the node's namespace, then the iptables rules that feed it (the delayer first, so no
        packet is queued with nobody there; --queue-bypass covers a delayer that dies)."""
        key = f"delay:{node.name}"
        if key in self.helpers and self.helpers[key].poll() is None:
            raise LabError(f"{node.name} is already delayed")
        queue_num = DELAY_QUEUE_BASE + self.nodes.index(node)
        log_path = self.root / f"{node.name}.delayer.log"
        log = open(log_path, "ab")
        offset = log_path.stat().st_size
        proc = subprocess.Popen(
            [
                *node.prefix,
                *helper_prefix(),
                sys.executable,
                "-m",
                "maxq_jepsen.delayer",
                str(queue_num),
                f"{low_ms:g}",
                f"{high_ms:g}",
                seed,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(self.root),
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(JEPSEN_DIR)},
        )
        log.close()
        self.helpers[key] = proc
        deadline = time.monotonic() + HELPER_READY_TIMEOUT_S
        while True:
            with open(log_path, "rb") as f:
                f.seek(offset)
                if b"delayer ready" in f.read():
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                self.stop_delay(node)
                raise LabError(f"the delayer for {node.name} did not start (exit {proc.poll()}); log {log_path}")
            time.sleep(0.05)
        for rule in faults.delay_rules("-A", f"{SUBNET}.0/24", queue_num):
            _sh("ip", "netns", "exec", node.netns, *rule)

    def stop_delay(self, node: Node) -> str | None:
        """Remove the rules (each until it is gone, bounded), then stop the delayer. Idempotent.
        Returns the delayer's last line ("delayer stopped: N delayed, ..."), None if none ran."""
        queue_num = DELAY_QUEUE_BASE + self.nodes.index(node)
        for rule in faults.delay_rules("-D", f"{SUBNET}.0/24", queue_num):
            for _ in range(4):
                if _sh("ip", "netns", "exec", node.netns, *rule, check=False).returncode != 0:
                    break
        proc = self.helpers.pop(f"delay:{node.name}", None)
        if proc is None:
            return None
        stop_process(proc)
        lines = (self.root / f"{node.name}.delayer.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else ""

    def teardown(self) -> None:
        errors = []
        for node in self.nodes:
            if f"delay:{node.name}" in self.helpers:
                try:
                    self.stop_delay(node)
                except Exception as exc:
                    errors.append(f"delayer {node.name}: {exc!r}")
        for node in self.nodes:
            try:
                node.stop()
            except Exception as exc:
                errors.append(f"{node.name}: {exc!r}")
        errors += self.release_features()
        try:
            delete_stale_namespaces()
        except Exception as exc:
            errors.append(f"delete namespaces: {exc!r}")
        if errors:
            raise LabError("teardown: " + "; ".join(errors))


JEPSEN_DIR = Path(__file__).resolve().parent.parent  # jepsen-style/: helpers run as `-m maxq_jepsen.<x>`
FAKETIME_SITE = Path(__file__).resolve().parent / "faketime_site"
FAKETIME_LIBRARIES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)
MOUNT_TIMEOUT_S = 15.0
# disk-full's filesystems: a cap, not a reservation (tmpfs takes memory only for what is written);
# room for a run's data, well above what a node needs free to start again (main.py: 64 MiB + its
# 50 MiB disk limit).
DISK_FULL_FS_SIZE = "1g"
BALLAST_NAME = ".jepsen-ballast"
FILL_CHUNK_BYTES = 64 << 20
FILL_PAGE_BYTES = 4096
FILL_STEPS_MAX = 400  # 1 GiB in 64 MiB steps, and halvings down to a page, many times over
HELPER_READY_TIMEOUT_S = 15.0
DELAY_QUEUE_BASE = 100


def faketime_library() -> str | None:
    return next((p for p in FAKETIME_LIBRARIES if os.path.exists(p)), None)


def helper_prefix() -> list[str]:
    """setpriv --pdeathsig KILL for helper processes too (see server_command): they die with the harness."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv and sys.platform.startswith("linux") else []


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL when it does not go in time."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT_S)


def unmount_stale() -> list[str]:
    """Lazily unmount stallfs and disk-full tmpfs mounts whose harness is dead (a crashed run's
    leftovers): the mount source names the harness (`mxqjfs-<pid>`, `mxqjdf-<pid>`); a live
    harness's mounts are left alone."""
    done = []
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return done
    for line in reversed(lines):  # the newest first: a tmpfs may sit under a stallfs mount
        parts = line.split()
        if len(parts) < 3:
            continue
        fuse = parts[0].startswith("mxqjfs-") and parts[2].startswith("fuse")
        tmpfs = parts[0].startswith("mxqjdf-") and parts[2] == "tmpfs"
        owner = parts[0][len("mxqjfs-") :]
        if (fuse or tmpfs) and owner.isdigit() and not _pid_alive(int(owner)):
            command = ["fusermount", "-u", "-z"] if fuse else ["umount", "-l"]
            subprocess.run([*command, parts[1]], capture_output=True, timeout=CMD_TIMEOUT_S)
            done.append(parts[1])
    return done


def _free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def delete_stale_namespaces() -> list[str]:
    """Delete this harness's namespaces and those of dead harnesses (a crashed run's leftovers;
    their veths go with them). Another live harness's namespaces are left alone."""
    listed = _sh("ip", "netns", "list", check=False).stdout
    names = []
    for line in listed.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NS_BASE):
            continue
        owner = name[len(NS_BASE) :].split("-", 1)[0]
        if name.startswith(NS_PREFIX) or not owner.isdigit() or not _pid_alive(int(owner)):
            names.append(name)
    for name in names:
        _sh("ip", "netns", "del", name, check=False)
    return names


def netns_available() -> tuple[bool, str]:
    """The preflight docs/reliability.md asks for: can this machine make a namespace?"""
    if os.geteuid() != 0:
        return False, "not root"
    name = f"{NS_PREFIX}preflight"
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"ip netns: {exc}"
    if made.returncode != 0:
        return False, made.stderr.strip()
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    if shutil.which("nft") is None:
        return False, "nft is missing (apt-get install -y nftables)"
    return True, "ok"


def make_nodes(
    root: Path,
    node_count: int,
    server_args: list[str],
    shards: int,
    host_of,
    prefix_of,
    ports_fixed: bool = False,
    netns_of=lambda i: None,
    features: frozenset = frozenset(),
) -> list[Node]:
    """The nodes of a lab; with more than one, cluster members that name each other as peers.
    Ports are chosen once: a restart finds the node where it was. In namespaces every host has
    its own address, so fixed ports do (nothing else listens there)."""
    taken: set[int] = set()

    def port(fixed: int) -> int:
        if ports_fixed:
            return fixed
        return pick_port(taken)

    clustered = node_count > 1
    # The sqs workload needs each node's SQS endpoint, and the admin API (even on one node) to
    # make the access key its clients sign with.
    sqs = "sqs" in features
    nodes = []
    for i in range(1, node_count + 1):
        name = f"n{i}"
        node = Node(
            name,
            host_of(i),
            port(5672),
            root / name / "data",
            root / f"{name}.log",
            server_args,
            http_port=port(15672) if clustered or sqs else 0,
            raft_port=port(7000) if clustered else None,
            prefix=prefix_of(i),
            netns=netns_of(i),
            sqs_port=port(9324) if sqs else 0,
        )
        node.shards = shards if clustered else 0
        nodes.append(node)
    for node in nodes:
        node.peers = {
            other.name: f"{other.host}:{other.raft_port}" for other in nodes if other is not node and clustered
        }
    return nodes


def start_all(nodes: list[Node]) -> None:
    """Launch every node, then wait for each: cluster members wait for each other to be ready."""
    for node in nodes:
        node.launch()
    for node in nodes:
        node.wait_ready()


def make_lab(
    backend: str,
    root: Path,
    node_count: int,
    server_args: list[str] | None = None,
    shards: int = 2,
    features: frozenset = frozenset(),
) -> Lab:
    if backend == "local":
        return LocalLab(root, node_count, server_args, shards, features)
    if backend == "netns":
        return NetnsLab(root, node_count, server_args, shards, features)
    raise LabError(f"unknown lab backend {backend!r}")
