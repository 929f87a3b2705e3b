"""Naive ring allreduce: whole arrays passed around the ring, n-1 rounds, each rank accumulating.

Every worker sends and receives (n-1) x d bytes: the "naive approach" whose time is about n x d / b.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import Strategy, StrategyConfig, uniform_traffic
from strategies.ops import finish_reduction, reduce_into
from strategies.primitives import Scratch


class NaiveRing(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.outgoing, self.incoming = Scratch(), Scratch()

    def _sync(self, flat, op):
        n, rank = self.workers, self.rank
        right, left = (rank + 1) % n, (rank - 1) % n
        forward = self.outgoing.get(flat.numel(), flat)
        received = self.incoming.get(flat.numel(), flat)
        forward.copy_(flat)
        for _ in range(n - 1):
            # round r: send the array of rank (rank - r) to the right, receive rank (rank - r - 1)'s from the left
            arrival = self.comm.irecv(received, left)  # posted first: gloo sends wait for a posted receive
            sent = self.comm.isend(forward, right)
            arrival.wait()
            reduce_into(flat, received, op)
            sent.wait()
            forward, received = received, forward
        finish_reduction(flat, op, n)


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
