"""maxq_jepsen: a Jepsen-style harness for MaxQ-Raft (real brokers, real faults, an offline checker).

Theory of operation: a *lab* runs real `maxq-server` processes (one node or a cluster, on loopback
or one network namespace per member); a *nemesis* injects faults into it on a seeded schedule of
quiet/fault/heal cycles; a *workload* of pika publishers and consumers records every operation
to a JSON-lines *history*; after the final heal, a bounded recovery wait and a drain, the pure
*checker* turns the history into verdicts (docs/reliability.md, "Verdict") and the *report* writes a summary
table, results.json and an HTML timeline. Everything random comes from the run's seed.

Modules: history (the record format), checker (history in, verdicts out), workload (pika
clients), nemesis (faults and the schedule), lab (where nodes run), runner (one run, start to
finish), report, profiles, cli.
"""

__all__ = ["checker", "history"]
