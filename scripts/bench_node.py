"""A fresh single maxq-server for the small benchmark scripts (bench_fair_dispatch.py,
bench_transactions.py): a free port, a new data folder, stopped and the folder removed at the end."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from free_ports import free_port  # (scripts/, sys.path[0] when a script runs)

VENV_BIN = Path(__file__).resolve().parent.parent / ".venv" / "bin"
READY_TIMEOUT_S = 30.0


class Node:
    """A fresh maxq-server on a free port and a new data folder; stopped (and the folder gone) at the end."""

    def __init__(self, prefix: str) -> None:
        self.data = tempfile.mkdtemp(prefix=prefix)
        self.port = free_port()
        self.log = Path(self.data) / "server.log"
        server = VENV_BIN / "maxq-server"
        if not server.exists():
            sys.exit(f"{server} is missing: run scripts/test once")
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(server), "--data-dir", f"{self.data}/data", "--amqp-port", str(self.port)]
                + ["--http-port", "0", "--prometheus-port", "0"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data,
                start_new_session=True,
            )
        until = time.monotonic() + READY_TIMEOUT_S
        while "maxq-server ready" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > until:
                self.stop()
                sys.exit(f"maxq-server did not start:\n{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.data, ignore_errors=True)
