"""torch's DistributedDataParallel: the baseline users actually run, in the same actors and process group.

In training the worker wraps its model in DDP (`wrap`), which registers autograd hooks, groups gradients into
buckets (the run's `bucket_mb`, the same grouping as syncbench's buckets: a 1 MiB first bucket, then
`bucket_mb` MiB, in the order gradients become ready) and allreduces each bucket through the backend (gloo on
CPU, NCCL when every worker owns a GPU) while backward goes on: DDP always overlaps. Its bytes move inside
the backend, so the communicator neither counts nor slows them (counted = False, like `native`).

As a collective (verify, bench, the plug-in harness) a sync is what DDP's reducer runs per bucket: the
backend's allreduce of the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ring import RingConfig

MIB = 2**20


class Ddp(Strategy):
    def _sync(self, flat, op):
        self.comm.native_allreduce(flat, op)


@dataclass(frozen=True)
class DdpConfig(StrategyConfig):
    name = "ddp"
    summary = "torch DistributedDataParallel: backend allreduce per bucket inside backward (bytes uncounted)"
    runtime = Ddp
    counted = False
    wraps_model = True  # training wraps the model (wrap()) instead of calling sync() on a buffer

    def traffic(self, workers, numel, itemsize=4):
        # The backend hides its bytes (counted=False); rounds and path are a ring's, gloo's and NCCL's
        # algorithm for large messages.
        ring = RingConfig().traffic(workers, numel, itemsize)
        ranks = tuple(RankTraffic("worker", 0, 0, 0, 0) for _ in range(workers))
        return Traffic(ranks, rounds=ring.rounds, path_bytes=ring.path_bytes, counted=False)

    def wrap(self, model, bucket_mb: float | None, device):
        """`model` in DistributedDataParallel over the default process group, buckets as syncbench's."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if not dist.is_initialized():
            raise RuntimeError("ddp needs ranks joined by torch.distributed (Ray actors, `syncbench run`); "
                               "thread ranks cannot run it: accepted strategies there are the others")
        if bucket_mb is None:  # one flat bucket: a cap above the whole model
            total = sum(p.numel() * p.element_size() for p in model.parameters())
            caps = {"bucket_cap_mb": total / MIB + 1}
        else:  # DDP's own grouping with the run's size: a 1 MiB first bucket, then bucket_mb MiB each
            caps = {"bucket_cap_mb_list": [min(1.0, bucket_mb), bucket_mb]}
        device_ids = [device.index or 0] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **caps)
