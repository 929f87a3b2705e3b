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

from strategies.native import NativeConfig

MIB = 2**20


@dataclass(frozen=True)
class DdpConfig(NativeConfig):
    """As a collective, native's: the backend's allreduce, its bytes hidden (counted = False), ring's path."""

    name = "ddp"
    summary = "torch DistributedDataParallel: backend allreduce per bucket inside backward (bytes uncounted)"
    wraps_model = True  # training wraps the model (wrap()) instead of calling sync() on a buffer

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
