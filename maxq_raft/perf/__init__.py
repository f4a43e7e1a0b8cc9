"""maxq-perf: an AMQP 0-9-1 load generator (PerfTest-like) that speaks to any broker.

Theory of operation: set-up (handshake, declares, qos, confirm.select) goes through a small
blocking client on our codec (client.py); the data path is pre-encoded publish batches and
offset-based frame parsing on raw sockets (wire.py, stream.py), one forked process per
producer and per consumer (workers.py) steered through shared memory by the parent
(fleet.py). The modes are throughput (throughput.py; amqpload's s1/s2/s3), backlog
(backlog.py; s4) and many queues/connections (many.py; s5); output is one JSON line with
amqpload's field names (report.py). Broker CPU and RSS are read from /proc (procstat.py);
latency histograms are log-linear like amqpload's (histogram.py). docs/perf-tool.md has the
usage and how the tool was checked against amqpload.
"""
