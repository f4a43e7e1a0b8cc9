"""The shapes of the network faults, as pure functions (no processes, no namespaces).

Theory of operation: a partition is a list of directed cuts (a, b): packets from a to b are
dropped. Who is then in a *minority* is a property of the cuts alone: two members talk only when
neither direction between them is cut (Raft's messages and their answers ride one TCP flow), and
a member whose connected component (over such two-way links, followed transitively) holds fewer
than a quorum of the members can never be part of a commit. That is the only minority we claim:
a member that sees the bridge node of a `bridge`, or the two neighbours of a `majorities ring`,
can reach a leader that commits, so its confirms are legitimate, and it is not a minority.

Loss and partitions share one nft table in the switch namespace (`nft_script`), so that one
atomic transaction always states the whole network fault; delay lives in the delayed node's own
namespace (iptables NFQUEUE rules, `delay_rules`), read by the userspace delayer.
"""

from __future__ import annotations

import random

LOSS_PERCENT_RANGE = (20, 30)


def quorum(count: int) -> int:
    return count // 2 + 1


def isolate(names: list[str], side: list[str]) -> list[tuple[str, str]]:
    """Both directions between `side` and every other node."""
    others = [n for n in names if n not in side]
    return [(a, b) for a in side for b in others] + [(b, a) for a in side for b in others]


def components(names: list[str], cuts: list[tuple[str, str]]) -> list[list[str]]:
    """Connected components over two-way links (an edge a-b exists when neither a->b nor b->a is cut)."""
    cut = set(cuts)
    seen: set[str] = set()
    out = []
    for start in names:
        if start in seen:
            continue
        component, frontier = [], [start]
        seen.add(start)
        while frontier:
            a = frontier.pop()
            component.append(a)
            for b in names:
                if b not in seen and (a, b) not in cut and (b, a) not in cut:
                    seen.add(b)
                    frontier.append(b)
        out.append(sorted(component))
    return out


def minority_of(names: list[str], cuts: list[tuple[str, str]]) -> list[str]:
    """The members that no commit can include while `cuts` hold (their component is below quorum)."""
    need = quorum(len(names))
    return sorted(n for c in components(names, cuts) if len(c) < need for n in c)


def bridge_plan(names: list[str], rng: random.Random) -> tuple[list[tuple[str, str]], dict]:
    """Jepsen's bridge: two sides cut from each other, one node (the bridge) sees both.

    Sides differ by at most one node. The graph stays connected through the bridge, so no member
    is in a minority by `minority_of`; the caller claims exactly what that function says."""
    order = list(names)
    rng.shuffle(order)
    bridge, rest = order[0], order[1:]
    left, right = sorted(rest[: len(rest) // 2]), sorted(rest[len(rest) // 2 :])
    cuts = [(a, b) for a in left for b in right] + [(b, a) for a in left for b in right]
    return cuts, {"bridge": bridge, "sides": [left, right]}


RING_NODES_MIN = 5


def ring_plan(names: list[str], rng: random.Random) -> tuple[list[tuple[str, str]], dict]:
    """Majorities ring: members on a ring in a random order; each sees itself and its k nearest on
    either side, the smallest k for which that is a majority. Every member sees a different
    majority, no two members see the same one, and no member is in a minority.

    Needs at least RING_NODES_MIN members: on 3, a member's majority ({a, b}) is also its
    neighbour's, so the shape is just "no fault" (two-way links make a sees b iff b sees a)."""
    n = len(names)
    if n < RING_NODES_MIN:
        raise ValueError(
            f"a majorities ring needs {RING_NODES_MIN} or more members, not {n}: on 3 every "
            f"majority of one member is also another's (use partition-halves or bridge)"
        )
    order = list(names)
    rng.shuffle(order)
    k = (n // 2 + 1) // 2  # 2k+1 >= quorum
    while 2 * k + 1 < quorum(n):
        k += 1
    sees = {order[i]: sorted(order[(i + d) % n] for d in range(-k, k + 1)) for i in range(n)}
    cuts = [(a, b) for a in order for b in order if a != b and b not in sees[a]]
    return cuts, {"ring": order, "sees": sees}


def visible(names: list[str], cuts: list[tuple[str, str]]) -> dict[str, list[str]]:
    """Who each member can talk to (two-way), itself included."""
    cut = set(cuts)
    return {a: sorted(b for b in names if a == b or ((a, b) not in cut and (b, a) not in cut)) for a in names}


def nft_script(table: str, hosts: dict[str, str], cuts: list[tuple[str, str]], loss: dict[str, int]) -> str:
    """The whole network fault as one nft transaction for the switch's bridge table: every cut is
    `ip saddr A ip daddr B drop`; every lossy node drops P % of what it sends and of what it is
    sent (`numgen random mod 100 < P`, measured 18.5-21 % for 20). The table is declared, deleted
    and made again, so the transaction works whether or not it existed, and replaces it whole."""
    rules = [f"    ip saddr {hosts[a]} ip daddr {hosts[b]} drop\n" for a, b in cuts]
    for name, percent in sorted(loss.items()):
        assert 0 < percent < 100, percent
        # counters: the heal reads how many packets the loss really dropped (loss_counters)
        rules.append(f"    ip saddr {hosts[name]} numgen random mod 100 < {percent} counter drop\n")
        rules.append(f"    ip daddr {hosts[name]} numgen random mod 100 < {percent} counter drop\n")
    return (
        f"table bridge {table}\ndelete table bridge {table}\n"
        f"table bridge {table} {{\n  chain cut {{\n    type filter hook forward priority 0; policy accept;\n"
        f"{''.join(rules)}  }}\n}}\n"
    )


def loss_counters(listing: str) -> int:
    """Packets dropped by the loss rules, from `nft list table` output (their `counter packets N`)."""
    total = 0
    for line in listing.splitlines():
        if "numgen random" in line and "counter packets" in line:
            words = line.split()
            total += int(words[words.index("packets") + 1])
    return total


def delay_rules(verb: str, subnet_cidr: str, queue_num: int) -> list[list[str]]:
    """iptables argument lists (run inside the delayed node's namespace) that send the node's
    packets to and from its peers (never loopback: its clients are co-located) to NFQUEUE
    `queue_num`. `--queue-bypass`: when no delayer listens, packets pass instead of being dropped,
    so a dead delayer can never turn a delay into a partition. verb: -A to add, -D to delete."""
    assert verb in ("-A", "-D")
    common = ["-j", "NFQUEUE", "--queue-num", str(queue_num), "--queue-bypass"]
    return [
        ["iptables", "-w", "5", verb, "OUTPUT", "-d", subnet_cidr, "!", "-o", "lo", *common],
        ["iptables", "-w", "5", verb, "INPUT", "-s", subnet_cidr, "!", "-i", "lo", *common],
    ]


def faketime_offset(seconds: float) -> str:
    """libfaketime's relative offset text for a skew of `seconds` (sign always written)."""
    return f"{'+' if seconds >= 0 else '-'}{abs(seconds):g}"


def faketime_env(library: str, skew_file: str) -> dict[str, str]:
    """The environment that runs a node under libfaketime with a skew read from `skew_file`.

    Only the wall clock is faked: CLOCK_MONOTONIC is left alone (FAKETIME_DONT_FAKE_MONOTONIC),
    because Raft's election and heartbeat timers and trio's deadlines run on it, and a real NTP
    step moves the wall clock only; message TTLs and expiry use wall time, so they see the skew.
    The file is re-read on every wall-clock call (FAKETIME_NO_CACHE): measured 5 us per time.time()
    instead of 0.08 (monotonic calls stay 0.08); with the default cache, or FAKETIME_CACHE_DURATION=1,
    libfaketime 0.9.10 did not see a new offset for as long as we watched."""
    return {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": skew_file,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_RESET": "1",
    }
