"""One training run on one rank: what every worker (and server) actor executes, top to bottom.

Per step on a worker: forward, backward (compute), the strategy's hook (communication), optimizer step.
- gradients  (ring, halving_doubling, ...): sync the flat gradient buffer (mean), then a local SGD step.
- parameters (decentralized): a local SGD step, then average the flat parameters with the neighbours.
- server     (parameter_server): push the flat gradients; the servers reduce them, apply SGD to their
  shard of the parameters and send parameters back, which the worker copies in.
Each rank records one row per step; the runner turns them into the run's numbers.

Buckets and overlap (experiments/pipeline/bucket_sync.py): the buffer is synchronized bucket by bucket
(`bucket_mb`, DDP's grouping; one flat bucket by default, today's behaviour bit for bit). With `overlap`, a
communication thread syncs each bucket as soon as autograd has accumulated its last gradient, while backward
goes on; the optimizer waits for the last bucket. Decentralized averaging works on parameters, which exist
only after the local step: it averages per bucket after that step and never overlaps (the sweep records
overlap = false for it). `ddp` wraps the model in torch's DistributedDataParallel, which always overlaps.

Compute modes: `real` runs the model; `profile` replays a measured timeline (workloads/profile.py: forward,
each gradient becoming ready, optimizer) through the same autograd hooks while the strategy moves the real
flat buffers. The gradients hold real values: one real forward/backward per rank at the start of the run,
re-accumulated by every replayed backward (never recomputed: the timing does not depend on them). The
parameters do not train in profile mode (the optimizer's time is replayed, not its arithmetic).
"""

from __future__ import annotations

import math
import threading
import time

import torch
import torch.nn.functional as F

import strategies
from experiments.pipeline.bucket_sync import BucketSync
from strategies.base import GRADIENTS, PARAMETERS, SERVER
from workloads.buckets import make_buckets
from workloads.data import make_dataset
from workloads.flat import FlatModel
from workloads.models import build_model
from workloads.profile import ReplayModel, load_profile, measure_profile, profile_from_dict

# Model init draws from torch's global RNG: ranks that are threads of one process (the tests' transport)
# must not interleave their draws, or equal seeds give different models.
_INIT_LOCK = threading.Lock()


def train(ctx, spec, progress=None) -> dict:
    """Run `spec` on this rank; returns {"steps": [row, ...], "final": {...}}.

    `progress`: a queue rank 0 puts each finished step number on (the runner's live display), or None.
    """
    config = strategies.make(spec.strategy, **spec.strategy_params)
    config.bind(ctx.comm, spec.workers)  # checks the world size before anything is built
    device = torch.device(ctx.device)
    profile = _profile_for(ctx, spec) if spec.compute == "profile" else None
    with _INIT_LOCK:
        torch.manual_seed(spec.seed + ctx.rank)  # the global stream (dropout): reproducible, rank-specific
        model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                            seed=spec.seed).to(device)
    # the flat buffers feed a collective; a rank alone in real mode has none and trains as a plain loop would
    flat = FlatModel(model) if ctx.comm.world_size > 1 or profile is not None else None
    buckets = make_buckets([p.numel() for p in flat.trainable], spec.bucket_mb) if flat else ()
    if ctx.rank >= spec.workers:
        return _serve(ctx, spec, config, flat, buckets)
    return _work(ctx, spec, config, model, flat, buckets, profile, device, progress)


def profile_key(spec, device: str) -> tuple:
    """What a measured profile depends on: ranks replaying the same key replay the same profile."""
    return ("profile", spec.workload, spec.batch_size, spec.image_size, spec.num_classes, device)


def _profile_for(ctx, spec):
    """The run's profile: its file, else the one the runner measured at the sweep's start and installed on
    this actor (experiments/pipeline/profiles.py), else measured here on rank 0 alone and shared with every
    rank over the control plane (uncounted); each rank keeps it for the next runs of its actor."""
    if spec.profile:
        profile = load_profile(spec.profile)
        profile.check_run(spec.workload, spec.batch_size, spec.image_size, spec.num_classes, where=spec.profile)
        return profile
    key = profile_key(spec, ctx.device)
    if key not in ctx.state:
        measured = None
        if ctx.rank == 0:  # the other ranks wait in the exchange below: the measurement runs alone
            measured = measure_profile(spec.workload, spec.batch_size, spec.image_size, ctx.device,
                                       spec.num_classes, seed=spec.seed, lr=spec.lr,
                                       momentum=spec.momentum).as_dict()
        data = ctx.comm.allgather_object(measured)[0] if ctx.comm.world_size > 1 else measured
        ctx.state[key] = profile_from_dict(data, where="the profile measured at the start")
    return ctx.state[key]


def _optimizer(spec, params):
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


def _as_one_parameter(flat) -> torch.nn.Parameter:
    """The flat buffers as one parameter: SGD's elementwise update in one pass instead of one per tensor
    (the same arithmetic; resnet18's 62 small updates cost as much as the flat gradients' zeroing)."""
    param = torch.nn.Parameter(flat.params)  # shares storage: updating it updates the model
    param.grad = flat.grads
    return param


def _work(ctx, spec, config, model, flat, buckets, profile, device, progress) -> dict:
    data = make_dataset(spec.dataset, batch_size=spec.batch_size, image_size=spec.image_size,
                        num_classes=spec.num_classes, rank=ctx.rank, world_size=spec.workers, seed=spec.seed,
                        device=device)
    slowdown = _slowdown(spec, ctx.rank)
    comm = ctx.comm
    net, replay = model, None
    if profile is not None:  # the timeline replaces the model's arithmetic; gradients from one real pass
        start_loss = _real_gradients(model, flat, data)
        replay = net = ReplayModel(profile, flat.trainable, [g.clone() for g in flat.grad_views], slowdown)
    wraps = config.wraps_model and comm.world_size > 1
    if wraps:  # ddp: torch's DistributedDataParallel averages gradients inside backward, bucket by bucket
        net = config.wrap(net, spec.bucket_mb, device)
    optimizer = None
    if config.role != SERVER:
        optimizer = _optimizer(spec, [_as_one_parameter(flat)] if flat else model.parameters())
    syncer = None
    if flat is not None and comm.world_size > 1 and not wraps:
        buffer = flat.params if config.role == PARAMETERS else flat.grads
        syncer = BucketSync(config, comm, spec.workers, buffer, buckets,
                            overlap=spec.overlap and config.role != PARAMETERS)
    last_ready = [math.nan]
    if flat is not None:  # autograd's post-accumulate-grad hooks: backward's end, and bucket readiness

        def ready(i):
            last_ready[0] = time.perf_counter()
            if syncer is not None and syncer.overlap:
                syncer.grad_ready(i)

        for i, p in enumerate(flat.trainable):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: ready(i))
    rows = []
    loss_value = math.nan
    model.train()
    run_start = time.perf_counter()
    try:
        for step in range(spec.steps):
            comm.reset_counters()
            step_start = time.perf_counter()
            if replay is not None:
                replay.begin_step()  # the replayed forward ends forward_s after this, zeroing included
            # -- compute: forward, backward (with overlap, buckets sync meanwhile) -------------------------
            if flat is not None:
                flat.zero_grad()
            else:
                optimizer.zero_grad()
            if syncer is not None:
                syncer.begin_step()
            if replay is not None:
                loss, samples = net(None), spec.batch_size
            else:
                x, y = data.next_batch()
                loss, samples = F.cross_entropy(net(x), y), int(y.shape[0])
            loss.backward()
            if replay is not None:
                replay.finish_backward()
            _synchronize(device)
            backward_end = time.perf_counter()
            exposed_in_backward = 0.0
            if wraps:  # DDP waited for its last allreduce inside backward(): that wait is exposed communication
                done = max(last_ready[0], replay.clock.backward_start + profile.backward_s * replay.scale
                           if replay is not None else last_ready[0])
                exposed_in_backward = max(0.0, backward_end - done)
                backward_end -= exposed_in_backward
            if config.role == PARAMETERS:  # decentralized: the local step comes before averaging
                _optimizer_step(optimizer, replay)
            _synchronize(device)
            compute_s = time.perf_counter() - step_start - exposed_in_backward
            if slowdown > 1 and replay is None:  # a straggler: stretch this step's compute by the slowdown
                time.sleep((slowdown - 1) * compute_s)  # a sleep leaves the shared cores to the other ranks
                compute_s = time.perf_counter() - step_start - exposed_in_backward
            # -- communication: what is left of the buckets' syncs (everything, without overlap) ------------
            comm_start = time.perf_counter()
            if syncer is not None:
                syncer.finish()
            _synchronize(device)
            comm_s = time.perf_counter() - comm_start + exposed_in_backward
            # -- apply --------------------------------------------------------------------------------------
            apply_start = time.perf_counter()
            if config.role == GRADIENTS:
                _optimizer_step(optimizer, replay)
            elif config.role == SERVER:
                flat.params.copy_(flat.grads)
            _synchronize(device)
            compute_s += time.perf_counter() - apply_start
            counters = comm.counters()
            loss_value = float(loss.detach()) if replay is None else start_loss
            if not math.isfinite(loss_value):  # the run has diverged: fail it, never record a NaN result as ok
                raise FloatingPointError(f"loss is {loss_value} at step {step} on rank {ctx.rank} "
                                         f"(lr = {spec.lr:g}, momentum = {spec.momentum:g}): the training diverged")
            busy = syncer.busy_s if syncer is not None else (math.nan if wraps else 0.0)
            row = {"step": step, "rank": ctx.rank, "role": "worker", "timed": step >= spec.warmup_steps,
                   "compute_s": compute_s, "comm_s": comm_s, "bytes_sent": counters.bytes_sent,
                   "bytes_recv": counters.bytes_recv, "loss": loss_value, "samples": samples,
                   "consensus_distance": math.nan, "wall_s": time.perf_counter() - run_start,
                   "backward_end_s": backward_end - step_start, "exposed_comm_s": comm_s, "comm_busy_s": busy,
                   "overlap_fraction": _overlap_fraction(busy, comm_s)}
            if not config.exact:  # decentralized: how far apart the workers' parameters are (uncounted)
                row["consensus_distance"] = _consensus(comm, flat.params) if flat else 0.0
            rows.append(row)
            if progress is not None and ctx.rank == 0:  # outside the timed part of the step
                progress.put_nowait(step + 1)
    finally:
        if syncer is not None:
            syncer.close()
    params = flat.params if flat else torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    ctx.state["params"] = params  # the last run's parameters, kept on the actor (tests compare them)
    final = {"loss": loss_value, "param_norm": float(params.norm()), "numel": params.numel(),
             "consensus_distance": rows[-1]["consensus_distance"] if rows else math.nan,
             "buckets": len(buckets) if buckets else 1, "profile_id": profile.id if profile else "",
             "profile_device": profile.device_name if profile else "",
             "profile_step_s": profile.step_s if profile else math.nan}
    if hasattr(data, "eval_batches"):
        final["accuracy"] = _accuracy(model, data)
    return {"steps": rows, "final": final}


def _real_gradients(model, flat, data) -> float:
    """One real forward and backward on this rank's batch: the gradients profile mode moves. Returns the loss."""
    x, y = data.next_batch()
    flat.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach())


def _optimizer_step(optimizer, replay) -> None:
    if replay is not None:
        replay.optimizer_step()
    else:
        optimizer.step()


def _overlap_fraction(busy_s: float, exposed_s: float) -> float:
    """The share of communication time hidden behind computation: 1 - exposed / busy (NaN: nothing moved or
    the backend hides it)."""
    if not busy_s > 0:
        return math.nan
    return min(1.0, max(0.0, 1.0 - exposed_s / busy_s))


def _serve(ctx, spec, config, flat, buckets) -> dict:
    """A parameter server: owns a shard of every bucket's parameters and their optimizer state; serves the
    buckets in bucket order, as the workers push them (per bucket, as BytePS does)."""
    runtimes = [config.bind(ctx.comm, spec.workers) for _ in buckets]
    shards: dict[tuple[int, int], tuple] = {}

    def updater(bucket):
        def update(reduced: torch.Tensor, where: slice) -> torch.Tensor:
            key = (bucket.index, where.start)
            if key not in shards:  # first step: take this shard of the (seeded, identical) initial parameters
                param = torch.nn.Parameter(flat.params[bucket.lo + where.start:bucket.lo + where.stop].detach().clone())
                shards[key] = (param, _optimizer(spec, [param]))
            param, optimizer = shards[key]
            param.grad = reduced
            optimizer.step()
            return param.data
        return update

    updates = [updater(bucket) for bucket in buckets]
    rows = []
    comm = ctx.comm
    run_start = time.perf_counter()
    for step in range(spec.steps):
        comm.reset_counters()
        start = time.perf_counter()
        for bucket in buckets:
            runtimes[bucket.index].serve(bucket.numel, flat.params.dtype, "mean", updates[bucket.index],
                                         device=flat.params.device)
        counters = comm.counters()
        comm_s = time.perf_counter() - start
        rows.append({"step": step, "rank": ctx.rank, "role": "server", "timed": step >= spec.warmup_steps,
                     "compute_s": 0.0, "comm_s": comm_s, "bytes_sent": counters.bytes_sent,
                     "bytes_recv": counters.bytes_recv, "loss": math.nan, "samples": 0,
                     "consensus_distance": math.nan, "wall_s": time.perf_counter() - run_start,
                     "backward_end_s": math.nan, "exposed_comm_s": comm_s, "comm_busy_s": comm_s,
                     "overlap_fraction": math.nan})
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": flat.numel,
                                     "consensus_distance": math.nan, "buckets": len(buckets),
                                     "profile_id": "", "profile_device": "", "profile_step_s": math.nan}}


def _slowdown(spec, rank: int) -> float:
    if spec.straggler and rank in spec.straggler["ranks"]:
        return float(spec.straggler["slowdown"])
    return 1.0


def _consensus(comm, params: torch.Tensor) -> float:
    """This rank's L2 distance to the workers' average parameters (backend allreduce, not counted or timed)."""
    average = params.detach().clone()
    comm.native_allreduce(average, "mean")
    return float((params - average).norm())


@torch.no_grad()
def _accuracy(model, data) -> float:
    """Top-1 accuracy on the held-out split."""
    model.eval()
    correct = total = 0
    for x, y in data.eval_batches():
        correct += int((model(x).argmax(dim=1) == y).sum())
        total += int(y.numel())
    model.train()
    return correct / max(total, 1)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
