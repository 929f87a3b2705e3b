"""All-to-all allreduce: every rank sends its whole array to every other rank and reduces locally.

One round of n-1 concurrent messages per rank; every rank reduces in rank order, so all results are
bitwise identical. Costs (n-1) x d bytes each way per worker and n x d memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import Strategy, StrategyConfig, uniform_traffic
from strategies.primitives import Scratch, reduce_in_rank_order


class AllToAll(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.scratch = Scratch()

    def _sync(self, flat, op):
        n, rank, numel = self.workers, self.rank, flat.numel()
        arrays = self.scratch.get(n * numel, flat).view(n, numel)
        arrays[rank].copy_(flat)
        # peer k steps away: send to rank + k, receive from rank - k (spreads the load over all receivers)
        recvs = [self.comm.irecv(arrays[(rank - k) % n], (rank - k) % n) for k in range(1, n)]
        sends = [self.comm.isend(arrays[rank], (rank + k) % n) for k in range(1, n)]
        for handle in recvs + sends:
            handle.wait()
        reduce_in_rank_order(flat, arrays, op)


@dataclass(frozen=True)
class AllToAllConfig(StrategyConfig):
    name = "all_to_all"
    summary = "every rank sends its whole array to every other and reduces locally: (n-1) x d bytes per worker"
    runtime = AllToAll

    def traffic(self, workers, numel, itemsize=4):
        # The n-1 sends serialize on each rank's transmit side (latency + d/B each) while its receive side
        # takes the n-1 incoming arrays at the same time: n-1 latencies and (n-1) x d bytes on the path.
        peers, nbytes = workers - 1, numel * itemsize
        msgs = peers if nbytes else 0
        return uniform_traffic(workers, peers * nbytes, peers * nbytes, msgs, msgs, rounds=peers,
                               path_bytes=peers * nbytes)
