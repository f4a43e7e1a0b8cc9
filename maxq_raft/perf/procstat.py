"""What /proc says about other processes: the broker's RSS and CPU, ours, the whole machine's.

Theory of operation: the broker's cost is read from outside, as amqpload does, so that any
broker (Erlang, Go, Python) is measured the same way: CPU seconds are utime + stime of
/proc/PID/stat summed over the given pids (a cluster's nodes), RSS is VmRSS of
/proc/PID/status. `machine_busy_s` is every core's non-idle time from /proc/stat; whatever of
it is neither the broker nor the load generator is "other tenants", the noise figure.
A pid that has gone away counts as zero rather than failing the run.
"""

from __future__ import annotations

import os

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        # the command name may contain spaces and ')' : fields are counted after the last ')'
        fields = raw[raw.rfind(b")") + 2 :].split()
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S  # utime, stime
    return total


def rss_kb(pids: list[int]) -> int | None:
    if not pids:
        return None
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return total


def rss_mb(pids: list[int]) -> float | None:
    kb = rss_kb(pids)
    return None if kb is None else round(kb / 1024.0, 1)


def machine_busy_s() -> float:
    with open("/proc/stat", "rb") as f:
        fields = f.readline().split()[1:9]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS_PER_S


def self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system
