"""A monitoring client for the benchmarks (issue #17's cost check): reads a node's /metrics, and
with `paths="all"` also what the web UI's pages refresh, every SCRAPE_EVERY_S as guest, on a
thread, until stopped. Used by scripts/bench (the maxq-scraped target) and
scripts/bench_monitoring.py (interleaved pairs)."""

from __future__ import annotations

import base64
import threading
import time
import urllib.request

SCRAPE_EVERY_S = 1.0
# (port name, path): "metrics" is the node's --prometheus-port, "http" its --http-port
PATHS = {
    "metrics": [("metrics", "/metrics")],
    "all": [
        ("metrics", "/metrics"),
        ("metrics", "/metrics/detailed?family=queue_coarse_metrics"),
        ("http", "/api/overview"),
        ("http", "/api/queues"),
        ("http", "/api/exchanges"),
        ("http", "/api/connections"),
    ],
}


class Scraper(threading.Thread):
    """Reads PATHS[paths] every SCRAPE_EVERY_S until stopped; counts rounds, failures, the slowest."""

    def __init__(self, ports: dict[str, int], paths: str = "all") -> None:
        super().__init__(name="bench-scraper", daemon=True)
        self.ports = ports
        self.paths = PATHS[paths]
        self.stopping = threading.Event()
        self.rounds = self.failures = 0
        self.slowest_s = 0.0

    def run(self) -> None:
        auth = "Basic " + base64.b64encode(b"guest:guest").decode()
        while not self.stopping.wait(SCRAPE_EVERY_S):
            started = time.monotonic()
            for port_name, path in self.paths:
                request = urllib.request.Request(
                    f"http://127.0.0.1:{self.ports[port_name]}{path}", headers={"Authorization": auth}
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        response.read()
                except OSError:
                    self.failures += 1
            self.rounds += 1
            self.slowest_s = max(self.slowest_s, time.monotonic() - started)

    def stop(self) -> None:
        self.stopping.set()
        self.join(15)

    def summary(self) -> str:
        return (
            f"scraped {len(self.paths)} paths x {self.rounds} rounds, {self.failures} failed, "
            f"slowest round {self.slowest_s:.3f} s"
        )
