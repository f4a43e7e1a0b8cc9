"""The userspace delayer behind the `delay` fault (this kernel has no tc netem).

Theory of operation: `python -m maxq_jepsen.delayer QUEUE MIN_MS MAX_MS SEED`, started inside the
delayed node's namespace, binds NFQUEUE QUEUE (the node's iptables rules send its packets to and
from its peers there, see faults.delay_rules) and accepts each packet after a delay drawn from
[MIN_MS, MAX_MS] (seeded): packets are held, not dropped, so TCP sees latency and reordering,
never loss. One thread: a select on the queue's socket with the next due time as the timeout.
Held packets are bounded (HELD_MAX; beyond it a packet passes at once) and a SIGTERM accepts
everything still held before it exits, so stopping the delayer never drops a packet it holds.
The harness never imports this module (NetfilterQueue is only needed where the fault runs).
"""

from __future__ import annotations

import heapq
import random
import select
import signal
import socket
import sys
import time

HELD_MAX = 20000
QUEUE_LEN_MAX = 8192


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m maxq_jepsen.delayer QUEUE MIN_MS MAX_MS SEED", file=sys.stderr)
        return 2
    queue_num, low_ms, high_ms, seed = int(argv[0]), float(argv[1]), float(argv[2]), argv[3]
    assert 0 <= low_ms <= high_ms <= 10000
    from netfilterqueue import NetfilterQueue

    rng = random.Random(f"{seed}:delayer")
    held: list = []  # heap of (due, n, packet)
    counter = [0, 0]  # packets held, packets passed at once (bound reached)
    stopping = []

    def on_packet(packet) -> None:
        if len(held) >= HELD_MAX:
            counter[1] += 1
            packet.accept()
            return
        counter[0] += 1
        heapq.heappush(held, (time.monotonic() + rng.uniform(low_ms, high_ms) / 1000.0, counter[0], packet))

    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    nfq = NetfilterQueue()
    nfq.bind(queue_num, on_packet, max_len=QUEUE_LEN_MAX)
    sock = socket.fromfd(nfq.get_fd(), socket.AF_UNIX, socket.SOCK_STREAM)
    print(f"delayer ready: queue {queue_num}, {low_ms:g}-{high_ms:g} ms", flush=True)
    try:
        while not stopping:
            timeout = 0.5 if not held else max(0.0, min(0.5, held[0][0] - time.monotonic()))
            try:
                readable, _, _ = select.select([sock], [], [], timeout)
            except InterruptedError:
                continue
            if readable:
                nfq.run(block=False)
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
    finally:
        while held:  # let everything still held go on its way
            heapq.heappop(held)[2].accept()
        sock.close()
        nfq.unbind()
        print(f"delayer stopped: {counter[0]} delayed, {counter[1]} passed at once", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
