"""Parameter server: k server ranks each own a contiguous shard; workers push shards, servers reply.

Ranks 0..n-1 are workers, n..n+k-1 servers. Server s reduces shard s over all workers (in worker-rank
order) and sends back the result; in training its `update` hook applies the optimizer and returns
parameters. Each server's NIC carries n x d/k bytes each way: the incast that limits the design.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.base import SERVER, RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds, nonempty
from strategies.ops import check_op, finish_reduction, reduce_into, wire_dtype
from strategies.primitives import Scratch


class ParameterServer(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.servers = config.servers
        self.scratch = Scratch()

    def _sync(self, flat, op):
        shards = chunk_bounds(flat.numel(), self.servers)
        # worker w starts with server w mod k, so the first shards do not all land on one server
        order = [(self.rank + i) % self.servers for i in range(self.servers)]
        pushes = [self.comm.isend(flat[shards[s][0]:shards[s][1]], self.workers + s) for s in order]
        for handle in pushes:
            handle.wait()
        pulls = [self.comm.irecv(flat[shards[s][0]:shards[s][1]], self.workers + s) for s in order]
        for handle in pulls:
            handle.wait()

    def serve(self, numel, dtype, op="mean", update=None, device="cpu"):
        """Receive this server's shard from every worker, reduce it, (update it,) send the result back."""
        check_op(op, dtype, self.config.ops)
        self._check_size(numel)
        dtype = wire_dtype(dtype)  # as the workers send it (see Strategy.sync)
        lo, hi = chunk_bounds(numel, self.servers)[self.rank - self.workers]
        if hi == lo:
            return  # an empty shard: no parameters here, nothing moves
        incoming = self.scratch.get(self.workers * (hi - lo), torch.empty(0, dtype=dtype, device=device))
        incoming = incoming.view(self.workers, hi - lo)
        pushes = [self.comm.irecv(incoming[w], w) for w in range(self.workers)]
        for handle in pushes:
            handle.wait()
        reduced = incoming[0].clone()
        for w in range(1, self.workers):
            reduce_into(reduced, incoming[w], op)
        finish_reduction(reduced, op, self.workers)
        result = reduced if update is None else update(reduced, slice(lo, hi))
        if result.numel() != hi - lo:
            raise ValueError(f"parameter_server: update() returned {result.numel()} elements for shard "
                             f"[{lo}, {hi}): it must return exactly {hi - lo}")
        result = result.reshape(-1)
        replies = [self.comm.isend(result, w) for w in range(self.workers)]
        for handle in replies:
            handle.wait()


@dataclass(frozen=True)
class ParameterServerConfig(StrategyConfig):
    name = "parameter_server"
    summary = "k servers own shards: workers push d/k to each, servers reduce (and update) and send back"
    role = SERVER
    runtime = ParameterServer
    variants = ({"servers": 1}, {"servers": 2}, {"servers": 3})
    servers: int = 1

    def validate(self):
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ValueError(f"parameter_server: servers={self.servers!r} is not accepted: "
                             f"use an integer >= 1")

    def num_servers(self, workers):
        return self.servers

    def traffic(self, workers, numel, itemsize=4):
        n, shards = workers, [(hi - lo) * itemsize for lo, hi in chunk_bounds(numel, self.servers)]
        pushes = nonempty(*shards)
        worker = RankTraffic("worker", sum(shards), sum(shards), pushes, pushes)
        servers = tuple(RankTraffic("server", n * b, n * b, n * nonempty(b), n * nonempty(b)) for b in shards)
        # A worker's k pushes serialize on its transmit side (k latencies) while each server's receive side
        # takes n shards; then each server's n replies serialize on its transmit side (n latencies). The
        # busier of worker and server NIC sets the push, the server's the pull.
        shard = max(shards)
        return Traffic((worker,) * n + servers, rounds=pushes + (n if shard else 0),
                       path_bytes=max(sum(shards), n * shard) + n * shard)
