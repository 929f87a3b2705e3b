"""torch's DistributedDataParallel: the baseline users actually run, in the same actors and process group.

In training the worker wraps its model in DDP (`wrap`), which registers autograd hooks, groups gradients into
buckets (the run's `bucket_mb`, the same grouping as syncbench's buckets: a 1 MiB first bucket, then
`bucket_mb` MiB, in the order gradients become ready) and allreduces each bucket through the backend (gloo on
CPU, NCCL when every worker owns a GPU) while backward goes on: DDP always overlaps. Its bytes move inside
the backend, so the communicator neither counts nor slows them (counted = False, like `native`).

As a collective (verify, bench, the plug-in harness) a sync is what DDP's reducer runs per bucket: the
backend's allreduce of the buffer.

`comm = "<a registered gradient strategy>"` (default "gloo": the above) keeps DDP's reducer (its buckets, order
and overlap) but moves each bucket through that strategy over syncbench's counted, emulated communicator: a
DDP communication hook runs the strategy on the bucket synchronously and hands back a completed Future. DDP
then runs over a local one-rank process group (its broadcasts and hooks stay local), the run is counted, and its
traffic is the strategy's summed over the buckets the hook saw (recorded per step: DDP rebuilds its buckets after
the first iteration).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.native import NativeConfig

MIB = 2**20


class _Counted:
    """counted: False for the class (gloo, the default variant), the comm strategy's for an instance."""

    def __get__(self, obj, cls=None):
        return False if obj is None or obj.comm == "gloo" else True


class HookState:
    """The comm strategy bound to this rank's communicator and the bucket sizes its hook saw, per step."""

    def __init__(self, runtime):
        self.runtime, self.steps = runtime, [[]]

    def new_step(self) -> None:
        self.steps.append([])


def _hook(state: HookState, bucket):
    import torch

    buffer = bucket.buffer()
    state.steps[-1].append(int(buffer.numel()))
    state.runtime.sync(buffer, "mean")
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _local_group():
    """A one-rank gloo process group of this rank's own: DDP's reducer without any bytes outside the hook."""
    import torch
    import torch.distributed as dist

    store = dist.HashStore()
    group = dist.ProcessGroup(store, 0, 1)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                            dist.ProcessGroupGloo(store, 0, 1))
    return group


@dataclass(frozen=True)
class DdpConfig(NativeConfig):
    """As a collective, native's: the backend's allreduce, its bytes hidden (counted = False), ring's path."""

    name = "ddp"
    summary = "torch DistributedDataParallel: backend allreduce per bucket inside backward (bytes uncounted)"
    wraps_model = True  # training wraps the model (wrap()) instead of calling sync() on a buffer
    comm: str = "gloo"
    counted = _Counted()

    def validate(self):
        if self.comm != "gloo" and self.comm not in _hookable():
            raise ValueError(f"ddp: comm = {self.comm!r} is not accepted (accepted: \"gloo\", "
                             f"{', '.join(repr(n) for n in _hookable())})")

    def comm_strategy(self):
        from strategies import registry

        return registry.make(self.comm)

    def traffic(self, workers, numel, itemsize=4):
        if self.comm == "gloo":
            return super().traffic(workers, numel, itemsize)
        return self.comm_strategy().traffic(workers, numel, itemsize)

    def wrap(self, model, bucket_mb: float | None, device, comm=None, workers: int | None = None):
        """`model` in DistributedDataParallel over the default process group, buckets as syncbench's; with a comm
        strategy over a local group, each bucket through the strategy on `comm` (syncbench's communicator)."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        hooked = self.comm != "gloo"
        if hooked and comm is None:
            raise RuntimeError(f"ddp comm = {self.comm!r} needs syncbench's communicator to wrap the model")
        if not hooked and not dist.is_initialized():
            raise RuntimeError("ddp needs ranks joined by torch.distributed (Ray actors, `syncbench run`); "
                               "thread ranks cannot run it: accepted strategies there are the others")
        if bucket_mb is None:  # one flat bucket: a cap above the whole model
            total = sum(p.numel() * p.element_size() for p in model.parameters())
            caps = {"bucket_cap_mb": total / MIB + 1}
        else:  # DDP's own grouping with the run's size: a 1 MiB first bucket, then bucket_mb MiB each
            caps = {"bucket_cap_mb_list": [min(1.0, bucket_mb), bucket_mb]}
        device_ids = [device.index or 0] if device.type == "cuda" else None
        if not hooked:
            return DistributedDataParallel(model, device_ids=device_ids, **caps)
        wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=_local_group(), **caps)
        wrapped.hook_state = HookState(self.comm_strategy().bind(comm, workers or comm.world_size))
        wrapped.register_comm_hook(wrapped.hook_state, _hook)
        return wrapped


def _hookable() -> list[str]:
    """Registered strategies a bucket can go through: exact, counted gradient averaging through sync()."""
    from strategies import registry
    from strategies.base import GRADIENTS

    names = []
    for name in registry.names():
        cls = registry.get(name)
        if (name != "ddp" and cls.role == GRADIENTS and cls.exact and cls.counted is True
                and not cls.wraps_model):
            names.append(name)
    return names
