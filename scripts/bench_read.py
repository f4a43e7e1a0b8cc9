#!/usr/bin/env python3
"""What reading a publish costs the server's sans-IO connection: bytes in, events out, no socket.

    .venv/bin/python scripts/bench_read.py [--size 16] [--reads 200] [--repeat 7]

A client's handshake and channel.open, then reads of READ_SIZE_BYTES (128 KiB, the most a
single node's session reads) each full of whole basic.publish triples (method, content header, one body frame
of `--size` bytes, as a publisher's socket delivers them): `ServerConnection.receive_data` and
`next_events` per read. Printed: the best wall time per publish over `--repeat` rounds of
`--reads` reads (the least disturbed by other processes; the machine's speed moves it by tens
of percent from day to day, so compare builds in the same minute, not with a figure from
another day).
"""

from __future__ import annotations

import argparse
import time

from maxq_raft.amqp import spec
from maxq_raft.amqp.connection import ServerConnection, State
from maxq_raft.amqp.events import ContentReceived
from maxq_raft.amqp.frames import PROTOCOL_HEADER, encode_content, encode_method_frame
from maxq_raft.amqp.properties import BasicProperties, encode_properties
from maxq_raft.server.session import READ_SIZE_BYTES


def open_connection() -> ServerConnection:
    conn = ServerConnection(
        authenticate=lambda mechanism, user, password: (user, password) == ("guest", "guest"),
        vhost_allowed=lambda user, vhost: None,
        server_properties={"product": "bench"},
    )
    handshake = [
        PROTOCOL_HEADER,
        encode_method_frame(
            0,
            spec.ConnectionStartOk(client_properties={}, mechanism="PLAIN", response=b"\0guest\0guest", locale="en_US"),
        ),
        encode_method_frame(0, spec.ConnectionTuneOk(channel_max=2047, frame_max=131072, heartbeat=0)),
        encode_method_frame(0, spec.ConnectionOpen(virtual_host="/")),
        encode_method_frame(1, spec.ChannelOpen()),
    ]
    for part in handshake:
        conn.receive_data(part, 0.0)
        conn.next_events()
    conn.data_to_send(0.0)
    if conn.state is not State.OPEN:
        raise SystemExit(f"the handshake did not open the connection: {conn.state}")
    return conn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=16, help="body bytes")
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    one = encode_content(
        1,
        spec.BasicPublish(exchange="", routing_key="bench-q-0"),
        encode_properties(BasicProperties()),
        b"x" * args.size,
        131072,
    )
    per_read = max(1, READ_SIZE_BYTES // len(one))
    data = one * per_read
    conn = open_connection()
    best_s = float("inf")
    for _ in range(args.repeat):
        started = time.perf_counter()
        for _ in range(args.reads):
            conn.receive_data(data, 0.0)
            events = conn.next_events()
        best_s = min(best_s, (time.perf_counter() - started) / (args.reads * per_read))
        if len(events) != per_read or not all(type(event) is ContentReceived for event in events):
            raise SystemExit(f"expected {per_read} publishes per read, got {events[:3]!r}...")
    print(f"{best_s * 1e9:.0f} ns per publish of {args.size} B ({per_read} per read, best of {args.repeat})")


if __name__ == "__main__":
    main()
