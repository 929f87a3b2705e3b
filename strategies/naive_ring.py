"""Naive ring allreduce: whole arrays passed around the ring, n-1 rounds, every rank reducing all of them.

Every worker sends and receives (n-1) x d bytes: the "naive approach" whose time is about n x d / b.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import Strategy, StrategyConfig, uniform_traffic
from strategies.primitives import Scratch, reduce_in_rank_order


class NaiveRing(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.scratch = Scratch()

    def _sync(self, flat, op):
        n, rank, numel = self.workers, self.rank, flat.numel()
        right, left = (rank + 1) % n, (rank - 1) % n
        arrays = self.scratch.get(n * numel, flat).view(n, numel)  # arrays[s]: rank s's original array
        arrays[rank].copy_(flat)
        # round r: forward rank (rank - r)'s array to the right, receive rank (rank - r - 1)'s from the left.
        # Each arrives in its own row, so every receive is posted up front (gloo sends wait for a posted one).
        pending = [self.comm.irecv(arrays[(rank - r - 1) % n], left) for r in range(n - 1)]
        sends = []
        for r in range(n - 1):
            sends.append(self.comm.isend(arrays[(rank - r) % n], right))
            pending[r].wait()
        for handle in sends:
            handle.wait()
        reduce_in_rank_order(flat, arrays, op)


@dataclass(frozen=True)
class NaiveRingConfig(StrategyConfig):
    name = "naive_ring"
    summary = "whole arrays forwarded around the ring: n-1 rounds, (n-1) x d bytes per worker"
    runtime = NaiveRing

    def traffic(self, workers, numel, itemsize=4):
        # n-1 dependent rounds (each forwards what the last delivered), each one whole array each way.
        hops, nbytes = workers - 1, numel * itemsize
        msgs = hops if nbytes else 0
        return uniform_traffic(workers, hops * nbytes, hops * nbytes, msgs, msgs, rounds=hops,
                               path_bytes=hops * nbytes)
