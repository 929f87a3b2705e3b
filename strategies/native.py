"""The backend's own allreduce (torch.distributed.all_reduce): the reference a user would otherwise pick."""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ring import RingConfig


class Native(Strategy):
    def _sync(self, flat, op):
        self.comm.native_allreduce(flat, op)


@dataclass(frozen=True)
class NativeConfig(StrategyConfig):
    name = "native"
    summary = "the backend's own allreduce (gloo/NCCL): bytes move inside it, uncounted"
    runtime = Native
    counted = False

    def traffic(self, workers, numel, itemsize=4):
        # The backend hides its bytes (counted=False); rounds and path are a ring's, the model gloo and NCCL
        # use for large messages.
        ring = RingConfig().traffic(workers, numel, itemsize)
        ranks = tuple(RankTraffic("worker", 0, 0, 0, 0) for _ in range(workers))
        return Traffic(ranks, rounds=ring.rounds, path_bytes=ring.path_bytes, counted=False)
