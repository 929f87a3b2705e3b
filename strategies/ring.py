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
        n, total, nonzero = workers, sum(sizes), nonempty(*sizes)
        ranks = []
        for pos in range(n):
            # round r of the reduce-scatter sends chunk pos - r and receives pos - r - 1 (r = 0 .. n-2): every
            # chunk but pos + 1 is sent and every chunk but pos received; the all-gather sends pos + 1 - r and
            # receives pos - r: every chunk but pos + 2 sent, every chunk but pos + 1 received. (Summed this way,
            # not round by round: O(n) for 16,384 ranks instead of O(n^2).)
            skip_rs_sent, skip_recv, skip_ag_sent = sizes[(pos + 1) % n], sizes[pos], sizes[(pos + 2) % n]
            sent = (total - skip_rs_sent) + (total - skip_ag_sent)
            recv = (total - skip_recv) + (total - skip_rs_sent)
            msgs_sent = 2 * nonzero - nonempty(skip_rs_sent, skip_ag_sent)
            msgs_recv = 2 * nonzero - nonempty(skip_recv, skip_rs_sent)
            ranks.append(RankTraffic("worker", sent, recv, msgs_sent, msgs_recv))
        return Traffic(tuple(ranks), rounds=2 * (n - 1), path_bytes=2 * (n - 1) * max(sizes))
