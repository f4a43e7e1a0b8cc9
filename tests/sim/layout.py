"""Which nodes hold a replica of which shard group, and which holder leads each (issue #19).

Theory of operation: most runs keep every group on every node. Some (`PARTIAL_SHARE` of the
seeds, or every run when asked) place each shard group on a few of 3 to 5 nodes: its holders,
at least one, as `ClusterLog` runs with a replication factor. The metadata group is on every
node. A node applies only the groups it holds; the others it serves through their leader
(server/remote.py, elsewhere.py). Each shard group has a leader among its holders, which a
"leader" step may move to another holder.

The layout is drawn from its own `random.Random`, derived from the seed, never from the run's:
a seed whose layout says "every group everywhere" draws and does exactly what it did before
layouts existed (the regression seeds stay meaningful).
"""

from __future__ import annotations

import random

PARTIAL_SHARE = 0.1  # of the seeds (the regression seeds' layout draws are all above it)
NODES_MIN, NODES_MAX = 3, 5
FACTOR_MAX = 3


def layout_rng(seed: int) -> random.Random:
    return random.Random(seed * 7919 + 1)


class Layout:
    def __init__(self, partial: bool, holders: dict[str, tuple[str, ...]], leaders: dict[str, str]) -> None:
        self.partial = partial
        self.holders = holders  # shard group -> the nodes holding it, by name
        self.leaders = leaders  # shard group -> the holder leading it
        self.terms = dict.fromkeys(holders, 1)  # shard group -> its Raft term (one per leadership)
        # shard group -> the log index of its leadership's first entry (the entries before it were
        # appended in earlier terms: Group.term_from, remote.Sender.catching_up)
        self.term_from = dict.fromkeys(holders, 1)

    @classmethod
    def everywhere(cls, nodes: list[str], shards: list[str]) -> Layout:
        """Every group on every node (leaders: the first; nothing reads them in such a run)."""
        return cls(False, {group: tuple(nodes) for group in shards}, {group: nodes[0] for group in shards})

    @classmethod
    def draw(cls, rng: random.Random, shards: list[str], nodes: int) -> Layout:
        """Each shard group on `factor` of `nodes` nodes (n1 .. nN), its leader among them."""
        names = [f"n{i + 1}" for i in range(nodes)]
        factor = rng.randint(1, min(FACTOR_MAX, nodes - 1))
        holders = {group: tuple(sorted(rng.sample(names, factor))) for group in shards}
        leaders = {group: rng.choice(holders[group]) for group in shards}
        return cls(True, holders, leaders)

    def held_by(self, node: str) -> list[str]:
        """The shard groups `node` holds, in the run's order."""
        return [group for group, holders in self.holders.items() if node in holders]

    def leads(self, node: str, group: str) -> bool:
        return self.leaders.get(group) == node

    def hand_over(self, group: str, leader: str, first_index: int) -> None:
        """`leader` leads `group` now, in a new term whose first entry will be at `first_index`."""
        self.leaders[group] = leader
        self.terms[group] += 1
        self.term_from[group] = first_index
