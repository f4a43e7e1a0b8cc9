"""The lab: where the nodes under test run, and the handles the nemesis uses to hurt them.

Theory of operation: a `Lab` owns a set of `Node`s. Each node is one real `maxq-server` process
with its own data folder and log, started, killed (SIGKILL), restarted on the same data folder
and the same address, paused (SIGSTOP) and resumed (SIGCONT). Clients only ever ask the lab for a
node's AMQP address, so they do not care where the node lives.

Backends:
  LocalLab   processes on 127.0.0.1 (today: the single node; the broker has no cluster yet).
  NetnsLab   (with the cluster) one network namespace per host, 10.77.0.i/24 on a bridge that
             lives in its own "switch" namespace, clients in one more namespace; it adds the
             network faults (partitions as one atomic `nft -f` in the switch namespace, loss,
             delay through NFQUEUE). RELIABILITY.md, "A lab that worked", has the commands. It
             implements the same methods, plus `partition(groups)` / `heal_network()`.

A restart reuses the node's port: the clients' reconnect loops must find the node where it was.
Ports come from below the kernel's ephemeral range, so that a client's own ephemeral port can
never be the node's port (a TCP self-connect on loopback while the node is down).
Every wait here is bounded; `teardown` stops every process (SIGCONT first, then SIGTERM, then
SIGKILL) and is safe to call twice.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import threading
import socket
import subprocess
import sys
import time
from pathlib import Path

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PORT_RANGE = (20000, 32000)  # below Linux's default ephemeral range (32768-60999)
PORT_TRIES_MAX = 200
LOG_PROBLEM_MARKERS = ("Traceback", "CRITICAL")


class LabError(Exception):
    pass


def pick_port(taken: set[int]) -> int:
    chooser = random.SystemRandom()  # ports are not part of the seeded run: any free one will do
    for _ in range(PORT_TRIES_MAX):
        port = chooser.randrange(*PORT_RANGE)
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise LabError(f"no free port in {PORT_RANGE} after {PORT_TRIES_MAX} tries")


def server_command() -> list[str]:
    """maxq-server from the interpreter's own venv (the harness runs on the project's .venv).

    Wrapped in `setpriv --pdeathsig KILL` when there is one (util-linux): if the harness itself is
    SIGKILLed (a CI timeout), its brokers die with it instead of holding ports and data folders.
    The death signal fires when the *thread* that started the node exits, so nodes are only ever
    started from the runner's main thread."""
    script = Path(sys.executable).parent / "maxq-server"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "maxq_raft"]
    setpriv = shutil.which("setpriv")
    if setpriv is not None and sys.platform.startswith("linux"):
        return [setpriv, "--pdeathsig", "KILL", "--", *command]
    return command


class Node:
    """One maxq-server process; its data folder and port outlive the process."""

    def __init__(self, name: str, host: str, amqp_port: int, data_dir: Path, log_path: Path, extra_args: list[str]) -> None:
        self.name = name
        self.host = host
        self.amqp_port = amqp_port
        self.data_dir = data_dir
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0
        self._log = None

    def __repr__(self) -> str:
        return f"Node({self.name} {self.host}:{self.amqp_port} pid={self.pid})"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        assert not self.alive(), f"{self.name} is already running"
        assert threading.current_thread() is threading.main_thread(), "see server_command: pdeathsig"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [*server_command(), "--data-dir", str(self.data_dir), "--amqp-host", self.host,
               "--amqp-port", str(self.amqp_port), "--http-port", "0", "--node-id", self.name, *self.extra_args]
        if self._log is None:
            self._log = open(self.log_path, "ab")
        offset = self.log_path.stat().st_size  # only a ready line written by this start counts
        # cwd is the data folder's parent, never the repo root: our amqp/ must not shadow py-amqp.
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(self.data_dir.parent),
                                     start_new_session=True)
        self.paused = False
        self.starts += 1
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LabError(f"{self.name} exited with {self.proc.returncode} while starting; log {self.log_path}:\n"
                               f"{self.log_tail()}")
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                if b"maxq-server ready" in f.read():
                    return
            time.sleep(0.05)
        self.kill()
        raise LabError(f"{self.name} not ready after {timeout_s}s; log {self.log_path}:\n{self.log_tail()}")

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
        found = [line for line in text.splitlines() if any(marker in line for marker in LOG_PROBLEM_MARKERS)]
        return found[:lines_max]


class Lab:
    """The interface every backend implements (see the module docstring)."""

    backend = "abstract"
    nodes: list[Node]

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
        """Where a client reaches `node`'s AMQP listener."""
        return node.host, node.amqp_port

    def describe(self) -> dict:
        return {"backend": self.backend, "nodes": {n.name: f"{n.host}:{n.amqp_port}" for n in self.nodes}}


class LocalLab(Lab):
    """Nodes as processes on loopback. One node until the broker is a cluster."""

    backend = "local"

    def __init__(self, root: Path, node_count: int = 1, server_args: list[str] | None = None) -> None:
        if node_count != 1:
            raise LabError("the broker has no cluster yet: the local lab runs one node "
                           "(the namespace lab with 3 or 5 hosts arrives with the cluster)")
        self.root = Path(root)
        taken: set[int] = set()
        self.nodes = []
        for i in range(1, node_count + 1):
            port = pick_port(taken)
            taken.add(port)
            name = f"n{i}"
            self.nodes.append(Node(name, "127.0.0.1", port, self.root / name / "data", self.root / f"{name}.log",
                                   server_args or []))

    def setup(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            for node in self.nodes:
                node.start()
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
        if errors:
            raise LabError("teardown: " + "; ".join(errors))


class NetnsLab(Lab):
    """One network namespace per host (with the cluster). Placeholder: refuses loudly, never passes."""

    backend = "netns"

    def __init__(self, *args, **kwargs) -> None:
        raise LabError("the namespace lab arrives with the cluster (RELIABILITY.md, 'A lab that worked'); "
                       "use the local lab")


def netns_available() -> tuple[bool, str]:
    """The preflight RELIABILITY.md asks for: can this machine make a namespace? (Not used yet.)"""
    name = f"mxqj-preflight-{os.getpid()}"
    try:
        made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"ip netns: {exc}"
    if made.returncode != 0:
        return False, made.stderr.strip()
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)
    return True, "ok"


def make_lab(backend: str, root: Path, node_count: int, server_args: list[str] | None = None) -> Lab:
    if backend == "local":
        return LocalLab(root, node_count, server_args)
    if backend == "netns":
        return NetnsLab(root, node_count, server_args)
    raise LabError(f"unknown lab backend {backend!r}")
