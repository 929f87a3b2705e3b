"""Ring allreduce: reduce-scatter over n-1 rounds, then all-gather over n-1 rounds, chunks of about d/n.

Each worker sends 2(n-1)/n x d bytes whatever n is: the bandwidth-optimal allreduce (Patarasuk & Yuan).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds, nonempty
from strategies.ops import finish_reduction
from strategies.primitives import Scratch, ring_allgather, ring_reduce_scatter


class Ring(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.ranks = list(range(workers))
        self.scratch = Scratch()

    def _sync(self, flat, op):
        bounds = chunk_bounds(flat.numel(), self.workers)
        owned = ring_reduce_scatter(self.comm, flat, bounds, op, self.ranks, self.scratch)
        lo, hi = bounds[owned]
        finish_reduction(flat[lo:hi], op, self.workers)  # mean: divide the owned chunk once, before sharing
        ring_allgather(self.comm, flat, bounds, self.ranks, owned)


@dataclass(frozen=True)
class RingConfig(StrategyConfig):
    name = "ring"
    summary = "ring reduce-scatter + all-gather: 2(n-1) rounds, 2(n-1)/n x d bytes per worker"
    runtime = Ring

    def traffic(self, workers, numel, itemsize=4):
        sizes = [(hi - lo) * itemsize for lo, hi in chunk_bounds(numel, workers)]
        n = workers
        ranks = []
        for pos in range(n):
            # reduce-scatter sends chunks pos, pos-1, .., pos-n+2; all-gather sends pos+1, pos, .., pos-n+3
            rs_sent = [sizes[(pos - r) % n] for r in range(n - 1)]
            rs_recv = [sizes[(pos - r - 1) % n] for r in range(n - 1)]
            ag_sent = [sizes[(pos + 1 - r) % n] for r in range(n - 1)]
            ag_recv = [sizes[(pos - r) % n] for r in range(n - 1)]
            sent, recv = rs_sent + ag_sent, rs_recv + ag_recv
            ranks.append(RankTraffic("worker", sum(sent), sum(recv), nonempty(*sent), nonempty(*recv)))
        return Traffic(tuple(ranks), rounds=2 * (n - 1), path_bytes=2 * (n - 1) * max(sizes))
