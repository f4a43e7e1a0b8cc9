"""maxq-perf against a real maxq-server: a ~1 s run of each main mode yields a sane JSON line.

No timing thresholds: the box may be loaded. What is checked is the shape and the accounting:
rates are positive, a drained run consumed exactly what it published, latency percentiles are
present and ordered, and broker figures appear when the broker pid is given. Plus the pure
pieces the data path rests on (confirm window bookkeeping, delivery parsing, histogram).
"""

from __future__ import annotations

import json
import subprocess
import sys
from array import array
from pathlib import Path

from maxq_raft.amqp import spec
from maxq_raft.amqp.frames import encode_content, encode_method_frame
from maxq_raft.amqp.properties import BasicProperties, encode_properties
from maxq_raft.perf.histogram import Histogram
from maxq_raft.perf.wire import ConfirmTracker, DeliveryParser, PublishBatch, acks_for

MAXQ_PERF = str(Path(sys.executable).parent / "maxq-perf")
RUN_TIMEOUT_S = 60


def run_perf(broker, *args: str) -> dict:
    cmd = [MAXQ_PERF, "--port", str(broker.amqp_port), "--broker-pid", str(broker.pid), "--no-table", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    return json.loads(lines[0])


def check_latency(summary: dict | None) -> None:
    assert summary is not None and summary["n"] > 0
    assert 0 <= summary["p50"] <= summary["p90"] <= summary["p99"] <= summary["p999"] <= summary["max"] * 1.01


def test_transient_autoack_run_is_drained(broker):
    result = run_perf(broker, "-d", "1", "--warmup", "0.2", "--queue-prefix", "smoke-t")
    assert result["tool"] == "maxq-perf" and result["scenario"] == "s1"
    assert result["pub_rate"] > 0 and result["cons_rate"] > 0
    assert result["drained"] is True
    assert result["consumed_total"] == result["published_total"] > 0
    check_latency(result["lat_us"])
    assert result["broker_cpu_s_per_M_cons"] is not None and result["broker_rss_mb_end"] > 0


def test_persistent_confirms_manual_ack_run_is_drained(broker):
    result = run_perf(
        broker,
        "-d",
        "1",
        "--warmup",
        "0.2",
        "-s",
        "1024",
        "--persistent",
        "--durable",
        "--confirm",
        "100",
        "--manual-ack",
        "--multi-ack",
        "10",
        "--queue-prefix",
        "smoke-p",
    )
    assert result["pub_rate"] > 0 and result["confirm_rate"] > 0
    assert result["nacked"] == 0
    assert result["drained"] is True
    assert result["consumed_total"] == result["published_total"] > 0
    check_latency(result["lat_us"])
    check_latency(result["confirm_lat_us"])


def test_backlog_publishes_then_drains_everything(broker):
    result = run_perf(broker, "--backlog", "3000", "--sample-every", "1000", "--queue-prefix", "smoke-b")
    assert result["scenario"] == "s4"
    assert result["published"] == result["confirmed"] == result["drained"] == 3000
    assert result["pub_rate"] > 0 and result["drain_rate"] > 0
    assert [s["n"] for s in result["pub_samples"]][-1] == 3000


# -- the pure pieces -------------------------------------------------------------------------


def test_confirm_tracker_window_with_multiple_single_and_out_of_order_confirms():
    t = ConfirmTracker()
    t.measuring = True
    t.sent(5, 1_000)
    t.sent(5, 2_000)
    assert t.outstanding == 10
    t.on_confirm(3, True, False, 11_000)  # multiple up to 3
    assert t.confirmed == 3 and t.outstanding == 7
    t.on_confirm(5, False, False, 12_000)  # out of order single
    assert t.confirmed == 4 and t.watermark == 3
    t.on_confirm(4, False, True, 12_000)  # the gap, as a nack: watermark jumps over 5
    assert t.watermark == 5 and t.nacked == 1
    t.on_confirm(10, True, False, 22_000)
    assert t.outstanding == 0 and t.confirmed == 10
    assert t.histogram.n == 10 and not t.batches
    t.on_confirm(10, True, False, 23_000)  # a duplicate changes nothing
    assert t.confirmed == 10


def test_delivery_parser_reads_split_stream_and_tags():
    props = encode_properties(BasicProperties(delivery_mode=1))
    stream = bytearray()
    for tag in range(1, 4):
        stream += encode_method_frame(
            1, spec.BasicDeliver(consumer_tag="ctag", delivery_tag=tag, exchange="", routing_key="q")
        )
        stream += encode_content(1, spec.BasicPublish(), props, (1234).to_bytes(8, "little") + b"x" * 3000, 1024)[
            len(encode_method_frame(1, spec.BasicPublish())) :
        ]
    parser = DeliveryParser(manual_ack=True)
    parser.samples = array("q")
    buf = bytes(stream)
    off = 0
    for cut in (5, 100, 2000, len(buf)):  # feed growing prefixes, as reads would
        off = parser.parse(buf[:cut], off, cut, 2234)
    assert off == len(buf)
    assert parser.consumed == 3 and parser.tags == [1, 2, 3]
    assert list(parser.samples) == [1000, 1000, 1000]
    assert acks_for([1, 2, 3, 4, 5], 2) == ([2, 4, 5], True)
    assert acks_for([7, 8], 1) == ([7, 8], False)


def test_publish_batch_stamps_time_and_sequence():
    batch = PublishBatch(
        channel=1,
        exchange="",
        routing_key="q",
        body_size=16,
        persistent=True,
        frame_max=131072,
        producer_id=3,
        batch_bytes=4096,
    )
    data = bytes(batch.stamp(2, 99, 7))
    assert len(data) == 2 * batch.message_bytes
    first = batch.body_offsets[0]
    assert int.from_bytes(data[first : first + 8], "little") == 99
    assert int.from_bytes(data[first + 8 : first + 16], "little") == (3 << 48) | 7


def test_histogram_percentiles_and_merge():
    a, b = Histogram(), Histogram()
    a.add_raw(array("q", range(1, 1001)))  # 1..1000 ns
    b.add(1_000_000, 1000)
    merged = Histogram.from_wire(a.to_wire())
    merged.merge(b)
    assert merged.n == 2000 and merged.max_ns == 1_000_000
    assert abs(merged.percentile_us(25) - 0.5) < 0.01
    assert abs(merged.percentile_us(99) - 1000) / 1000 < 0.01
