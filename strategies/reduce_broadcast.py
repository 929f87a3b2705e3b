"""Reduce to root 0, then broadcast from it: binomial trees (default) or the flat "driver" pattern.

Trees: ceil(log2 n) rounds each way, d bytes per message. Flat (tree=False): the root receives from and
sends to every worker directly, (n-1) x d bytes each way through its one NIC.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ops import finish_reduction
from strategies.primitives import Scratch, flat_broadcast, flat_reduce, tree_broadcast, tree_reduce, tree_traffic

ROOT = 0


class ReduceBroadcast(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.ranks = list(range(workers))
        self.scratch = Scratch()

    def _sync(self, flat, op):
        reduce, broadcast = (tree_reduce, tree_broadcast) if self.config.tree else (flat_reduce, flat_broadcast)
        reduce(self.comm, flat, op, self.ranks, ROOT, self.scratch)
        if self.rank == ROOT:
            finish_reduction(flat, op, self.workers)
        broadcast(self.comm, flat, self.ranks, ROOT)


@dataclass(frozen=True)
class ReduceBroadcastConfig(StrategyConfig):
    name = "reduce_broadcast"
    summary = "reduce to rank 0 then broadcast: binomial trees (tree=true) or the flat driver pattern"
    runtime = ReduceBroadcast
    variants = ({"tree": True}, {"tree": False})
    sends_while_receiving = False  # every rank receives (reduce), then sends (broadcast): one way at a time
    tree: bool = True

    def validate(self):
        if not isinstance(self.tree, bool):
            raise ValueError(f"reduce_broadcast: tree={self.tree!r} is not accepted: use true or false")

    def traffic(self, workers, numel, itemsize=4):
        n, nbytes = workers, numel * itemsize
        m = 1 if nbytes else 0
        if self.tree:
            # The broadcast runs the reduce tree backwards: each rank sends what it received and vice versa.
            # Critical path: L = ceil(log2 n) levels each way, one whole array per level (the root's sends
            # serialize, but each child starts its subtree as soon as it has the array): 2 L latencies, 2 L d.
            ranks = tuple(RankTraffic("worker", sent + recv, recv + sent, ms + mr, mr + ms)
                          for sent, recv, ms, mr in tree_traffic(n, nbytes))
            levels = (n - 1).bit_length()
            return Traffic(ranks, rounds=2 * levels, path_bytes=2 * levels * nbytes)
        # flat: all n-1 workers send at once, so their latencies overlap and the root's receive side takes
        # (n-1) d; then the root's n-1 sends serialize on its transmit side, a latency each: n latencies in
        # all (0 for one worker), 2 (n-1) d through the root's NIC.
        peers = n - 1
        root = RankTraffic("worker", peers * nbytes, peers * nbytes, peers * m, peers * m)
        leaf = RankTraffic("worker", nbytes, nbytes, m, m)
        return Traffic((root,) + (leaf,) * peers, rounds=n if n > 1 else 0, path_bytes=2 * peers * nbytes)
