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
DDP communication hook hands the bucket to a communication thread that runs the strategy on it (buckets in the
order DDP hands them over, while backward goes on) and completes the Future DDP waits for. DDP then runs over a
local one-rank process group (its broadcasts and hooks stay local), the run is counted, and its traffic is the
strategy's summed over the buckets the hook saw (recorded per step: DDP rebuilds its buckets after the first
iteration).

Compression (the run settings `compression`, `powersgd_*`, `topk_ratio`, `error_feedback`; strategies.make hands
them to `compressed()`) goes through DDP's own comm hooks where torch has them:
- comm = "gloo": torch's hooks over the backend (bytes uncounted, as ever): fp16 -> fp16_compress_hook, bf16 ->
  bf16_compress_hook, powersgd -> powerSGD_hook with PowerSGDState(matrix_approximation_rank = powersgd_rank,
  start_powerSGD_iter = powersgd_start, warm_start = powersgd_warm_start, use_error_feedback = error_feedback).
  topk is refused (torch has no top-k hook), and powersgd_start < 2 with error feedback or warm start (torch's
  PowerSGDState refuses it: DDP rebuilds its buckets after the first iteration).
- comm = "<strategy>": syncbench's codecs (strategies/compression.py) around that strategy, one runtime per bucket,
  over the counted transport: fp16, bf16 and topk, traffic exact per bucket. powersgd is refused: its bytes depend
  on each bucket's tensor layout and on the step (warm-up), which the hook's recorded bucket sizes do not carry;
  accepted instead are comm = "gloo" (torch's powerSGD_hook) or the strategy itself with compression = "powersgd".
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, fields, replace

from strategies.compression import Compression, compress
from strategies.native import Native, NativeConfig

MIB = 2**20


class _Counted:
    """counted: False for the class (gloo, the default variant), the comm strategy's for an instance."""

    def __get__(self, obj, cls=None):
        return False if obj is None or obj.comm == "gloo" else True


class HookState:
    """The comm strategy bound to this rank's communicator, one runtime per bucket (a compressed strategy's
    residual is its bucket's), the bucket sizes its hook saw, per step, and the communication thread that syncs
    the buckets while backward goes on (as the backend does for DDP over gloo)."""

    def __init__(self, bind):
        self.bind, self.runtimes, self.steps = bind, {}, [[]]
        self.busy_s = 0.0  # this step's seconds of syncing on the communication thread
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="ddp-comm-hook", daemon=True)
        self._thread.start()

    def runtime(self, index: int, numel: int):
        """Bucket `index`'s runtime; a bucket DDP rebuilt (after the first iteration) to another size starts anew."""
        key = (index, numel)
        if key not in self.runtimes:
            self.runtimes[key] = self.bind()
        return self.runtimes[key]

    def new_step(self) -> None:
        """A step begins: a new list of bucket sizes (unless the last step saw none), no busy time yet."""
        if self.steps[-1]:
            self.steps.append([])
        self.busy_s = 0.0

    def submit(self, runtime, buffer, future) -> None:
        self._queue.put((runtime, buffer, future))

    def close(self) -> None:
        """Stop the communication thread (the run is over; DDP waited for every future it was handed)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None

    def _loop(self) -> None:
        """Sync buckets one at a time in the order DDP hands them over (the order every rank sees), each future
        completed as its bucket is reduced; DDP's reducer waits for them at the end of backward. After a bucket
        fails every later one fails at once with it (it would wait out the timeout for peers that stopped)."""
        failed: BaseException | None = None
        while (item := self._queue.get()) is not None:
            runtime, buffer, future = item
            if failed is not None:  # the ranks are no longer matched on the wire: every later bucket fails at once
                future.set_exception(RuntimeError(f"bucket of {buffer.numel()} elements not synchronized: an "
                                                  f"earlier bucket failed ({type(failed).__name__}: {failed})"))
                continue
            start = time.perf_counter()
            try:
                runtime.sync(buffer, "mean")
            except BaseException as e:  # noqa: BLE001 - DDP's wait() raises it in the training thread
                failed = e
                future.set_exception(e)
                continue
            finally:
                self.busy_s += time.perf_counter() - start
            future.set_result(buffer)


def _hook(state: HookState, bucket):
    import torch

    buffer = bucket.buffer()
    state.steps[-1].append(int(buffer.numel()))
    future = torch.futures.Future()
    state.submit(state.runtime(bucket.index(), int(buffer.numel())), buffer, future)
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


class DdpCollective(Native):
    """ddp as a collective (verify, bench): the backend's allreduce. Compression lives in DDP's comm hook, which a
    bare collective does not run: refused rather than reported as compressed."""

    def _sync(self, flat, op):
        kind = self.config.compression.compression
        if kind != "none":
            raise ValueError(f"ddp with compression = {kind!r} compresses inside DDP's comm hook during training; as "
                             f"a collective (verify, bench) it has no hook (accepted there: compression = 'none')")
        super()._sync(flat, op)


@dataclass(frozen=True)
class DdpConfig(NativeConfig):
    """As a collective, native's: the backend's allreduce, its bytes hidden (counted = False), ring's path."""

    name = "ddp"
    summary = "torch DistributedDataParallel: backend allreduce per bucket inside backward (bytes uncounted)"
    wraps_model = True  # training wraps the model (wrap()) instead of calling sync() on a buffer
    runtime = DdpCollective
    comm: str = "gloo"
    compression: Compression = Compression()  # a run setting (compressed()), not a parameter of ddp's own
    counted = _Counted()

    @classmethod
    def parameters(cls):
        return {f.name: f.default for f in fields(cls) if f.name != "compression"}

    def validate(self):
        if self.comm != "gloo" and self.comm not in _hookable():
            raise ValueError(f"ddp: comm = {self.comm!r} is not accepted (accepted: \"gloo\", "
                             f"{', '.join(repr(n) for n in _hookable())})")
        s = self.compression
        if self.comm == "gloo" and s.compression == "topk":
            raise ValueError("ddp comm = 'gloo': compression = 'topk' has no DDP comm hook in torch (accepted with "
                             "comm = 'gloo': 'none', 'fp16', 'bf16', 'powersgd'; top-k: ddp with comm = a "
                             "strategy, e.g. comm = 'ring', or the strategy itself)")
        if (self.comm == "gloo" and s.compression == "powersgd" and s.powersgd_start < 2
                and (s.error_feedback or s.powersgd_warm_start)):
            raise ValueError(f"ddp comm = 'gloo': powersgd_start = {s.powersgd_start} with error feedback or warm "
                             f"start: torch's PowerSGDState needs start_powerSGD_iter >= 2 (DDP rebuilds its buckets "
                             f"after the first iteration; accepted: powersgd_start >= 2, or both off)")
        if self.comm != "gloo" and s.compression == "powersgd":
            raise ValueError(f"ddp comm = {self.comm!r}: compression = 'powersgd' is not offered through a strategy "
                             f"(its bytes depend on each bucket's tensor layout and warm-up, which the hook's "
                             f"recorded bucket sizes do not carry; accepted: comm = 'gloo' for torch's "
                             f"powerSGD_hook, or strategy = {self.comm!r} with compression = 'powersgd')")

    def compressed(self, settings: Compression) -> DdpConfig:
        """This ddp with `settings` applied through its comm hook (refused here, before any work, if unsupported)."""
        return replace(self, compression=settings)

    def comm_strategy(self):
        """The strategy each bucket goes through (comm = a strategy), with the run's compression around it."""
        from strategies import registry

        return compress(registry.make(self.comm), self.compression)

    def traffic(self, workers, numel, itemsize=4):
        if self.comm == "gloo":  # the backend's (uncounted); a 16-bit hook halves what it carries
            half = self.compression.compression in ("fp16", "bf16")
            return super().traffic(workers, numel, 2 if half else itemsize)
        return self.comm_strategy().traffic(workers, numel, itemsize)

    def wrap(self, model, bucket_mb: float | None, device, comm=None, workers: int | None = None,
             process_group=None):
        """`model` in DistributedDataParallel over `process_group` (default: the default group), buckets as
        syncbench's, with torch's compression hook if any; with a comm strategy over a local group, each bucket
        through the (compressed) strategy on `comm` (syncbench's communicator)."""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        hooked = self.comm != "gloo"
        if hooked and comm is None:
            raise RuntimeError(f"ddp comm = {self.comm!r} needs syncbench's communicator to wrap the model")
        if not hooked and process_group is None and not dist.is_initialized():
            raise RuntimeError("ddp needs ranks joined by torch.distributed (Ray actors, `syncbench run`); "
                               "thread ranks cannot run it: accepted strategies there are the others")
        if bucket_mb is None:  # one flat bucket: a cap above the whole model
            total = sum(p.numel() * p.element_size() for p in model.parameters())
            caps = {"bucket_cap_mb": total / MIB + 1}
        else:  # DDP's own grouping with the run's size: a 1 MiB first bucket, then bucket_mb MiB each
            caps = {"bucket_cap_mb_list": [min(1.0, bucket_mb), bucket_mb]}
        device_ids = [device.index or 0] if device.type == "cuda" else None
        if not hooked:
            wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=process_group, **caps)
            hook = _torch_hook(self.compression, process_group)
            if hook is not None:
                wrapped.register_comm_hook(*hook)
            return wrapped
        wrapped = DistributedDataParallel(model, device_ids=device_ids, process_group=_local_group(), **caps)
        strategy, workers = self.comm_strategy(), workers or comm.world_size
        wrapped.hook_state = HookState(lambda: strategy.bind(comm, workers))
        wrapped.register_comm_hook(wrapped.hook_state, _hook)
        return wrapped


def _torch_hook(settings: Compression, process_group):
    """(state, hook) of torch's DDP comm hook for these compression settings, None for 'none'."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if settings.compression == "fp16":
        return process_group, default_hooks.fp16_compress_hook
    if settings.compression == "bf16":
        return process_group, default_hooks.bf16_compress_hook
    if settings.compression == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=process_group, matrix_approximation_rank=settings.powersgd_rank,
            start_powerSGD_iter=settings.powersgd_start, warm_start=settings.powersgd_warm_start,
            use_error_feedback=settings.error_feedback)
        return state, powerSGD_hook.powerSGD_hook
    return None


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
