"""Chain allreduce: reduce along the chain 0 -> 1 -> .. -> n-1, then broadcast back n-1 -> .. -> 0.

2(n-1) dependent rounds of whole arrays; every middle rank sends and receives 2d bytes. The last rank alone
forms the result, so every rank ends with the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ops import finish_reduction, reduce_into
from strategies.primitives import Scratch


class Chain(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.scratch = Scratch()

    def _sync(self, flat, op):
        n, rank = self.workers, self.rank
        # reduce: rank i receives x_0 (op) .. (op) x_{i-1} from i-1, adds its own, passes it to i+1
        if rank > 0:
            incoming = self.scratch.get(flat.numel(), flat)
            self.comm.recv(incoming, rank - 1)
            reduce_into(flat, incoming, op)
        if rank < n - 1:
            self.comm.send(flat, rank + 1)
            # broadcast: the result comes back from i+1 and goes on to i-1
            self.comm.recv(flat, rank + 1)
        else:
            finish_reduction(flat, op, n)
        if rank > 0:
            self.comm.send(flat, rank - 1)


@dataclass(frozen=True)
class ChainConfig(StrategyConfig):
    name = "chain"
    summary = "reduce along a chain, then broadcast back: 2(n-1) rounds of whole arrays"
    runtime = Chain

    def traffic(self, workers, numel, itemsize=4):
        nbytes, m = numel * itemsize, 1 if numel else 0
        ranks = []
        for rank in range(workers):
            links = (rank > 0) + (rank < workers - 1)  # each neighbour: one array each way
            ranks.append(RankTraffic("worker", links * nbytes, links * nbytes, links * m, links * m))
        return Traffic(tuple(ranks), rounds=2 * (workers - 1), path_bytes=2 * (workers - 1) * nbytes)
