"""One training run on one rank: the step loop every worker executes, measured or simulated, top to bottom.

Per step on a worker: compute (forward, backward), the role's communication, the role's apply. What differs
between substrates is the clock and what a step computes, both held by the `compute` object: a measured run
(`train`, below) runs the model (`real`) or replays a profile's timeline (`profile`) on the wall clock; the
SimGrid substrate replays a timeline on the simulated clock (experiments/simulate/substrate.py) and calls the
same `run_steps`. What a rank synchronizes is a small piece per role, chosen from the strategy's declared role:
- GradientAveraging (ring, halving_doubling, ...): sync the flat gradient buffer (mean), then a local SGD step.
- ParameterAveraging (decentralized): a local SGD step, then average the flat parameters with the neighbours.
- PushPull (a worker of the parameter server): push the flat gradients; the servers reduce them, apply SGD to
  their shard of the parameters and send parameters back, which the worker copies in.
- serve_steps (a server rank): per step, receive every bucket, update its shard, reply.
`worker_role(config)` and `server_loop(config)` choose the pieces: the seams where an asynchronous server (and
the worker role that talks to it) attaches. Each rank records one row per step (`_row`: the same columns on every
substrate); experiments/pipeline/summary.py turns them into the run's numbers.

Buckets and overlap (experiments/pipeline/bucket_sync.py): the buffer is synchronized bucket by bucket
(`bucket_mb`, DDP's grouping; one flat bucket by default, today's behaviour bit for bit). With `overlap`, each
bucket is synced as soon as its last gradient is ready, while backward goes on (a communication thread when
measured, inline in simulated time); the optimizer waits for the last bucket. Decentralized averaging works on
parameters, which exist only after the local step: it averages per bucket after that step and never overlaps
(the sweep records overlap = false for it). `ddp` wraps the model in torch's DistributedDataParallel, which
always overlaps: its wait inside backward is counted as exposed communication.

Compute modes of a measured run: `real` runs the model; `profile` replays a measured timeline
(workloads/profile.py: forward, each gradient becoming ready, optimizer) through the same autograd hooks while
the strategy moves the real flat buffers. The gradients hold real values: one real forward/backward per rank at
the start of the run, re-accumulated by every replayed backward (never recomputed: the timing does not depend
on them). The parameters do not train in profile mode (the optimizer's time is replayed, not its arithmetic).
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from experiments.pipeline.bucket_sync import BucketSync
from experiments.pipeline.compute import Compute
from experiments.pipeline.trace import StepTrace, worker_phases
from strategies.base import GRADIENTS, PARAMETERS, ROLES, SERVER
from workloads.buckets import make_buckets
from workloads.data import make_dataset
from workloads.flat import FlatModel
from workloads.models import build_model
from workloads.profile import ReplayModel, load_profile, measure_profile, profile_from_dict

# Model init draws from torch's global RNG: ranks that are threads of one process (the tests' transport)
# must not interleave their draws, or equal seeds give different models.
_INIT_LOCK = threading.Lock()


def train(ctx, spec, progress=None) -> dict:
    """Run `spec` on this rank of a measured run; returns {"steps": [row, ...], "final": {...}}.

    `progress`: a queue rank 0 puts each finished step number on (the runner's live display), or None.
    """
    config = spec.strategy_config()  # compression and local SGD applied (strategies/compression.py, local_sgd.py)
    config.bind(ctx.comm, spec.workers)  # checks the world size before anything is built
    device = torch.device(ctx.device)
    profile = _profile_for(ctx, spec) if spec.compute == "profile" else None
    if profile is not None and (problem := replay_problem(profile, spec, spec.profile or profile.id)):
        raise ValueError(problem)  # every rank holds the same profile: every rank stops here, at once
    with _INIT_LOCK:
        torch.manual_seed(spec.seed + ctx.rank)  # the global stream (dropout): reproducible, rank-specific
        model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                            seed=spec.seed).to(device)
    # the flat buffers feed a collective; a rank alone in real mode has none and trains as a plain loop would
    flat = FlatModel(model) if ctx.comm.world_size > 1 or profile is not None else None
    buckets = make_buckets([p.numel() for p in flat.trainable], spec.bucket_mb) if flat else ()
    if ctx.rank >= spec.workers:
        return server_loop(config)(ctx.comm, spec, config, buckets, ShardUpdate(spec, flat))
    compute = MeasuredCompute(ctx, spec, config, model, flat, profile, device)
    result = run_steps(ctx.comm, spec, config, compute, buckets, progress)
    ctx.state["params"] = compute.params()  # the last run's parameters, kept on the actor (tests compare them)
    return result


def replay_problem(profile, spec, where: str) -> str:
    """'' when one replayed step fits in the run's timeout, else why not: a rank computing longer than the
    timeout leaves its peers waiting past it, and a run alone would go silent for that long."""
    slowest = float(spec.straggler["slowdown"]) if spec.straggler else 1.0
    step_s = profile.step_s * slowest
    if step_s <= spec.timeout:
        return ""
    return (f"profile {where}: one replayed step takes {step_s:g} s (forward_s {profile.forward_s:g} + backward_s "
            f"{profile.backward_s:g} + optimizer_s {profile.optimizer_s:g}"
            + (f", x{slowest:g} straggler" if slowest > 1 else "")
            + f"), longer than the run's timeout = {spec.timeout:g} s: no rank may compute longer than the timeout "
            f"its peers wait; raise timeout or use a profile whose step fits in it")


# -- the step loop ------------------------------------------------------------------------------------------


def run_steps(comm, spec, config, compute, buckets, progress=None) -> dict:
    """The step loop of a worker rank on any substrate; `compute` holds the clock and what a step computes."""
    clock = compute.clock
    role = worker_role(config)
    syncer = _bucket_sync(comm, spec, config, compute, buckets, role)
    hook = compute.hook_state  # ddp through a strategy: DDP's buckets on a communication thread
    rows = []
    loss_value = math.nan
    if spec.target and not compute.evaluates:
        raise ValueError(f"target = {spec.target!r}: {type(compute).__name__} does not train a model to evaluate "
                         f"(accepted: a measured run with compute = \"real\")")
    trace = StepTrace(spec, comm, clock)  # the traced steps' events (trace_steps; none: nothing recorded)
    run_start = clock()
    try:
        for step in range(spec.steps):
            comm.check_deadline()  # the run's whole-time bound, where the substrate sets one
            comm.reset_counters()
            trace.begin(step, syncer)
            step_start = clock()
            # -- compute: forward, backward (with overlap, buckets sync meanwhile) ------------------------------
            compute.begin_step()
            if syncer is not None:
                syncer.begin_step()
            loss, samples, exposed_in_backward = compute.forward_backward()  # exposed: comm outlasting backward
            fb_end = clock()
            backward_end = fb_end - exposed_in_backward
            role.before_sync(compute)
            compute.synchronize()
            compute.straggle(clock() - step_start - exposed_in_backward)
            compute_end = clock()
            compute_s = compute_end - step_start - exposed_in_backward
            # -- communication: what is left of the buckets' syncs (everything, without overlap) ----------------
            comm_start = clock()
            role.sync(syncer)
            compute.synchronize()
            comm_end = clock()
            comm_s = comm_end - comm_start + exposed_in_backward
            # -- apply ----------------------------------------------------------------------------------------
            apply_start = clock()
            role.apply(compute)
            compute.synchronize()
            apply_end = clock()
            compute_s += apply_end - apply_start
            if trace.wants(step):  # the phases from the readings above: they sum to compute_s and comm_s
                readings = {"step_start": step_start, "forward_end": compute.forward_end,
                            "fb_end": fb_end, "compute_end": compute_end, "comm_start": comm_start,
                            "comm_end": comm_end, "apply_start": apply_start, "apply_end": apply_end}
                worker_phases(trace, readings, exposed_in_backward, config.role, compute.straggles)
                trace.end(syncer)
            counters = comm.counters()
            loss_value = compute.loss_value(loss)
            if compute.trains and not math.isfinite(loss_value):  # diverged: fail, never record a NaN as ok
                raise FloatingPointError(f"loss is {loss_value} at step {step} on rank {comm.rank} "
                                         f"(lr = {spec.lr:g}, momentum = {spec.momentum:g}): the training diverged")
            busy = syncer.busy_s if syncer is not None else (hook.busy_s if hook is not None
                                                             else math.nan if compute.wraps else 0.0)
            row = _row(spec, step, comm.rank, "worker", compute_s, comm_s, counters, clock() - run_start,
                       loss=loss_value, samples=samples, backward_end_s=backward_end - step_start, comm_busy_s=busy,
                       overlap_fraction=_overlap_fraction(busy, comm_s))
            if not config.exact:  # decentralized: how far apart the workers' parameters are (uncounted)
                row["consensus_distance"] = compute.consensus_distance(comm)
            if spec.target and ((step + 1) % spec.eval_every == 0 or step + 1 == spec.steps):
                row["eval_value"] = compute.evaluate(spec.target["metric"])  # outside the timed part of the step
            rows.append(row)
            if progress is not None and comm.rank == 0:  # outside the timed part of the step
                progress.put_nowait(step + 1)
    finally:
        if syncer is not None:
            syncer.close()
        if hook is not None:
            hook.close()
        compute.close()
    numels = [b.numel for b in buckets] if buckets else [compute.numel]
    final = {"loss": loss_value, "numel": compute.numel, "buckets": len(numels), "bucket_numels": numels,
             "bucket_shapes": [_bucket_shapes(compute.flat, b) for b in buckets] if compute.flat is not None else None,
             "trained": compute.trains,
             "consensus_distance": rows[-1]["consensus_distance"] if rows else math.nan, **compute.final()}
    return {"steps": rows, "final": final, "events": trace.events}


def _bucket_sync(comm, spec, config, compute, buckets, role) -> BucketSync | None:
    """The buckets' syncs of a worker rank (None: nothing to sync, or ddp's own hook syncs), started."""
    if compute.flat is None or comm.world_size == 1 or compute.wraps:
        return None
    syncer = BucketSync(config, comm, spec.workers, role.buffer(compute.flat), buckets,
                        overlap=spec.overlap and role.overlaps, threaded=compute.threaded, clock=compute.clock)
    if syncer.overlap:
        compute.on_ready = syncer.grad_ready  # backward hands each gradient over as it becomes ready
    if config.role == SERVER and config.num_servers(spec.workers) == 0:
        role.serve_beside(syncer, compute)  # servers without ranks of their own run inside these workers
    for bucket, runtime in zip(syncer.buckets, syncer.runtimes):
        runtime.start(syncer.buffer[bucket.lo:bucket.hi])  # DiLoCo's anchor: the parameters before step 0
        runtime.set_shapes(_bucket_shapes(compute.flat, bucket))  # PowerSGD: one matrix per parameter's shape
    return syncer


def params_digest(params: torch.Tensor) -> str:
    """A checksum of a worker's parameter bits at the end of a run (blake2b, ~0.2 s per 100 MB): the summary
    compares them, so a strategy declared exact and identical whose ranks end different is recorded failed."""
    data = params.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _bucket_shapes(flat, bucket) -> list[list[int]]:
    """The shapes of a bucket's parameters in buffer order (registration order: the bucket lists them reversed)."""
    return [list(flat.trainable[i].shape) for i in sorted(bucket.params)]


def _row(spec, step: int, rank: int, role: str, compute_s: float, comm_s: float, counters, wall_s: float,
         loss: float = math.nan, samples: int = 0, backward_end_s: float = math.nan,
         comm_busy_s: float = math.nan, overlap_fraction: float = math.nan) -> dict:
    """One rank's step: the same columns for workers and servers, measured or simulated."""
    return {"step": step, "rank": rank, "role": role, "timed": step >= spec.warmup_steps,
            "compute_s": float(compute_s), "comm_s": float(comm_s), "bytes_sent": int(counters.bytes_sent),
            "bytes_recv": int(counters.bytes_recv), "loss": float(loss), "samples": int(samples),
            "consensus_distance": math.nan, "wall_s": float(wall_s), "backward_end_s": float(backward_end_s),
            "exposed_comm_s": float(comm_s), "comm_busy_s": float(comm_busy_s),
            "overlap_fraction": float(overlap_fraction),
            # a parameter server without a barrier fills these on its server rows (serve_without_barrier)
            "staleness": [], "bound_wait_s": math.nan, "dropped_pushes": 0, "eval_value": math.nan}


def _overlap_fraction(busy_s: float, exposed_s: float) -> float:
    """The share of communication time hidden behind computation: 1 - exposed / busy (NaN: nothing moved or
    the backend hides it)."""
    if not busy_s > 0:
        return math.nan
    return min(1.0, max(0.0, 1.0 - exposed_s / busy_s))


# -- the roles: what a worker synchronizes, and when ---------------------------------------------------------


class GradientAveraging:
    """Allreduce family: average the flat gradients (bucket by bucket, overlapped if asked), then a local step."""

    overlaps = True

    def buffer(self, flat) -> torch.Tensor:
        return flat.grads

    def before_sync(self, compute) -> None:
        """After backward, before the communication."""

    def sync(self, syncer) -> None:
        if syncer is not None:  # None: nothing to agree on (one rank), or the backend synced inside backward (ddp)
            syncer.finish()

    def apply(self, compute) -> None:
        compute.optimizer_step()


class ParameterAveraging(GradientAveraging):
    """Decentralized: a local step first, then average the parameters with the neighbours (never overlapped:
    the parameters exist only after the step)."""

    overlaps = False

    def buffer(self, flat) -> torch.Tensor:
        return flat.params

    def before_sync(self, compute) -> None:
        compute.optimizer_step()

    def apply(self, compute) -> None:
        """The averaged parameters are the result."""


class PushPull(GradientAveraging):
    """A worker of the parameter server: push the gradients; the servers step and reply with parameters, which
    arrive in the gradient buffer and are copied in (the worker runs no optimizer)."""

    def apply(self, compute) -> None:
        compute.take_parameters()

    def serve_beside(self, syncer, compute) -> None:
        """Colocated servers (a parameter server's placement = "colocated"): this worker's runtime of each bucket
        also serves a shard of it and steps that shard's parameters with the server's optimizer."""
        update = compute.server_update()  # Compute's default refuses: no servers beside these workers
        for bucket, runtime in zip(syncer.buckets, syncer.runtimes):
            runtime.update = lambda reduced, where, bucket=bucket: update(bucket, reduced, where)


def serve_steps(comm, spec, config, buckets, update) -> dict:
    """A parameter server rank: per step, serve the buckets in bucket order as the workers push them (per
    bucket, as BytePS does); `update(bucket, reduced, where)` steps this server's shard and returns the
    parameters to send back, timing itself on `update.clock` (its time is the server's compute)."""
    clock = update.clock
    runtimes = [config.bind(comm, spec.workers) for _ in buckets]
    rows = []
    trace = StepTrace(spec, comm, clock)  # the traced steps: each bucket served, and the messages
    run_start = clock()
    for step in range(spec.steps):
        comm.check_deadline()
        comm.reset_counters()
        trace.begin(step)
        start, update.busy_s = clock(), 0.0
        for bucket in buckets:
            served = clock() if trace.wants(step) else 0.0
            runtimes[bucket.index].serve(bucket.numel, update.dtype, "mean",
                                         lambda reduced, where, bucket=bucket: update(bucket, reduced, where),
                                         device=update.device)
            if trace.wants(step):
                trace.serve(bucket.index, served, clock())
        total = clock() - start
        trace.end()
        rows.append(_row(spec, step, comm.rank, "server", update.busy_s, total - update.busy_s, comm.counters(),
                         clock() - run_start, comm_busy_s=total))
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": update.numel,
                                     "consensus_distance": math.nan, "buckets": len(buckets),
                                     "bucket_numels": [b.numel for b in buckets], "trained": False},
            "events": trace.events}


WORKER_ROLES = {GRADIENTS: GradientAveraging, PARAMETERS: ParameterAveraging, SERVER: PushPull}


def worker_role(config):
    """The worker's piece for the strategy's declared role."""
    if config.role not in WORKER_ROLES:
        raise ValueError(f"strategy {config.name!r} declares role {config.role!r}: accepted are "
                         f"{', '.join(ROLES)}")
    return WORKER_ROLES[config.role]()


def serve_without_barrier(comm, spec, config, buckets, update) -> dict:
    """A parameter server without a global barrier (staleness s, "async", backups): it serves every worker for
    the whole run, each from a thread of its own, bucket by bucket and partition by partition, in either mode
    (strategies/parameter_server_async.py); the workers' roles are unchanged (update mode: PushPull; summation:
    GradientAveraging, their optimizers apply the sums). One row per step: the staleness of every gradient
    partition it applied, the time its replies waited at the bound, the late pushes it dropped; its bytes from
    the pushes it took (each push is answered: as many bytes out as in)."""
    clock = update.clock
    runtime = config.bind(comm, spec.workers)
    start = clock()
    records = runtime.serve_run(spec.steps, [b.numel for b in buckets], update.dtype,
                                lambda bucket, gradient, where: update(buckets[bucket], gradient, where),
                                device=update.device)
    per_step = (clock() - start) / max(spec.steps, 1)
    itemsize = torch.empty(0, dtype=update.dtype).element_size()
    rows = []
    for step in range(spec.steps):
        pushes = [r for r in records if r.step == step]
        moved = itemsize * sum(r.numel for r in pushes)
        counters = SimpleNamespace(bytes_sent=moved, bytes_recv=moved)
        row = _row(spec, step, comm.rank, "server", update.busy_s / max(spec.steps, 1), per_step, counters,
                   per_step * (step + 1), comm_busy_s=per_step)
        row |= {"staleness": [r.staleness for r in pushes if not r.dropped],
                "bound_wait_s": sum(r.bound_wait_s for r in pushes),
                "dropped_pushes": len({r.worker for r in pushes if r.dropped})}  # a worker's late step: one
        rows.append(row)
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": update.numel,
                                     "consensus_distance": math.nan, "buckets": len(buckets),
                                     "bucket_numels": [b.numel for b in buckets], "trained": False}}


def server_loop(config):
    """A server rank's loop (ranks workers..world_size-1 of a strategy with servers): the synchronous one, or the
    one without a global barrier (a parameter server with staleness s, "async" or backups); both serve update
    and summation servers alike (a summation server ignores `update`)."""
    return serve_without_barrier if config.asynchronous else serve_steps


# -- measured compute: the model, or a profile's timeline, on the wall clock ----------------------------------


class MeasuredCompute(Compute):
    """What a measured worker computes per step: the model (`real`) or a replayed profile (`profile`), on the
    wall clock; with ddp the wrapped model also synchronizes the gradients inside backward."""

    clock = staticmethod(time.perf_counter)
    threaded = True  # overlap syncs buckets from a communication thread
    trains = True  # the loss is real: a non-finite one fails the run
    evaluates = True  # a trained model: evaluate() scores it on the held-out split

    def __init__(self, ctx, spec, config, model, flat, profile, device):
        self.spec, self.model, self.flat, self.profile, self.device = spec, model, flat, profile, device
        self.data = make_dataset(spec.dataset, batch_size=spec.batch_size, image_size=spec.image_size,
                                 num_classes=spec.num_classes, rank=ctx.rank, world_size=spec.workers,
                                 seed=spec.seed, device=device)
        self.slowdown = straggler_slowdown(spec, ctx.rank)
        self.net, self.replay, self.start_loss = model, None, math.nan
        if profile is not None:  # the timeline replaces the model's arithmetic; gradients from one real pass
            self.start_loss = _real_gradients(model, flat, self.data)
            self.replay = self.net = ReplayModel(profile, flat.trainable, [g.clone() for g in flat.grad_views],
                                                 self.slowdown)
        self.wraps = config.wraps_model and ctx.comm.world_size > 1
        if self.wraps:  # ddp: torch's DistributedDataParallel averages gradients inside backward, bucket by bucket
            self.net = config.wrap(self.net, spec.bucket_mb, device, comm=ctx.comm, workers=spec.workers)
        self.hook_state = getattr(self.net, "hook_state", None) if self.wraps else None  # ddp comm = a strategy
        self._optimizer = None  # made on first use: a parameter server's worker never steps
        self.on_ready = None  # called with i as parameter i's gradient is accumulated (bucket readiness)
        self.last_ready = math.nan
        # autograd's post-accumulate-grad hooks: backward's end, and bucket readiness. Autograd holds them in C++,
        # out of the garbage collector's sight: a hook reaching this object through its parameters is a cycle
        # nothing collects (every run's model and buffers stayed alive: ~0.5 GB per resnet18 run on thread ranks),
        # so close() removes them.
        self._hooks = [p.register_post_accumulate_grad_hook(lambda _p, i=i: self._ready(i))
                       for i, p in enumerate(flat.trainable)] if flat is not None else []
        model.train()

    def close(self) -> None:
        """The run is over: remove the autograd hooks (they would keep the model, buffers and data alive)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    @property
    def numel(self) -> int:
        return self.flat.numel if self.flat is not None else sum(p.numel() for p in self.model.parameters())

    def _ready(self, i: int) -> None:
        self.last_ready = time.perf_counter()
        if self.on_ready is not None:
            self.on_ready(i)

    def optimizer(self):
        if self._optimizer is None:
            params = [_as_one_parameter(self.flat)] if self.flat is not None else self.model.parameters()
            self._optimizer = _optimizer(self.spec, params)
        return self._optimizer

    def begin_step(self) -> None:
        if self.hook_state is not None:
            self.hook_state.new_step()  # the bucket sizes ddp's hook sees, per step, and its time
        if self.replay is not None:
            self.replay.begin_step()  # the replayed forward ends forward_s after this, zeroing included
        if self.flat is not None:
            self.flat.zero_grad()
        else:
            self.optimizer().zero_grad()

    def forward_backward(self) -> tuple[object, int, float]:
        """(loss, samples, seconds of communication that outlasted backward: ddp's last allreduce)."""
        if self.replay is not None:
            loss, samples = self.net(None), self.spec.batch_size
        else:
            x, y = self.data.next_batch()
            loss, samples = F.cross_entropy(self.net(x), y), int(y.shape[0])
        self.forward_end = time.perf_counter()  # where forward ended (the traced steps' phases)
        loss.backward()
        if self.replay is not None:
            self.replay.finish_backward()
        self.synchronize()
        if not self.wraps:
            return loss, samples, 0.0
        done = self.last_ready  # DDP waited for its last allreduce inside backward(): exposed communication
        if self.replay is not None:
            done = max(done, self.replay.clock.backward_start + self.profile.backward_s * self.replay.scale)
        return loss, samples, max(0.0, time.perf_counter() - done)

    def optimizer_step(self) -> None:
        if self.replay is not None:
            self.replay.optimizer_step()
        else:
            self.optimizer().step()

    def take_parameters(self) -> None:
        self.flat.params.copy_(self.flat.grads)

    def server_update(self):
        """The optimizer of the servers colocated with this worker (see PushPull.serve_beside)."""
        return ShardUpdate(self.spec, self.flat)

    @property
    def straggles(self) -> bool:
        """A straggler in real mode sleeps its extra time (the replay stretches itself)."""
        return self.slowdown > 1 and self.replay is None

    def straggle(self, compute_s: float) -> None:
        """A straggler in real mode: stretch this step's compute by the slowdown (the replay stretches itself)."""
        if self.slowdown > 1 and self.replay is None:
            time.sleep((self.slowdown - 1) * compute_s)  # a sleep leaves the shared cores to the other ranks

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def loss_value(self, loss) -> float:
        return float(loss.detach()) if self.replay is None else self.start_loss

    def consensus_distance(self, comm) -> float:
        return _consensus(comm, self.flat.params) if self.flat is not None else 0.0

    def evaluate(self, metric: str) -> float:
        """This worker's model on the held-out split: top-1 accuracy, or the mean cross-entropy loss."""
        return _accuracy(self.model, self.data) if metric == "accuracy" else _eval_loss(self.model, self.data)

    def params(self) -> torch.Tensor:
        if self.flat is not None:
            return self.flat.params
        return torch.nn.utils.parameters_to_vector(self.model.parameters()).detach()

    def final(self) -> dict:
        profile = self.profile
        final = {"param_norm": float(self.params().norm()), "params_digest": params_digest(self.params()),
                 "profile_id": profile.id if profile else "",
                 "profile_device": profile.device_name if profile else "",
                 "profile_synthetic": bool(profile and profile.synthetic),
                 "profile_step_s": profile.step_s if profile else math.nan}
        # held-out accuracy of a model that trained; a replayed (profile) step applies one fixed gradient, so its
        # model's accuracy says nothing and is left out (NaN), not printed beside the real runs'
        if hasattr(self.data, "eval_batches") and self.replay is None:
            final["accuracy"] = _accuracy(self.model, self.data)
        if self.hook_state is not None:  # ddp through a strategy: the buckets DDP's reducer handed it, per step
            final["step_bucket_numels"] = [list(sizes) for sizes in self.hook_state.steps if sizes]
            final["bucket_numels"] = final["step_bucket_numels"][-1]
        return final


class ShardUpdate:
    """A measured server's update: owns a shard of every bucket's parameters and their optimizer state."""

    clock = staticmethod(time.perf_counter)

    def __init__(self, spec, flat):
        self.spec, self.flat = spec, flat
        self.dtype, self.device, self.numel = flat.params.dtype, flat.params.device, flat.numel
        self.shards: dict[tuple[int, int], tuple] = {}
        self.busy_s = 0.0

    def __call__(self, bucket, reduced: torch.Tensor, where: slice) -> torch.Tensor:
        start = time.perf_counter()
        key = (bucket.index, where.start)
        if key not in self.shards:  # first step: take this shard of the (seeded, identical) initial parameters
            lo = bucket.lo + where.start
            param = torch.nn.Parameter(self.flat.params[lo:lo + where.stop - where.start].detach().clone())
            self.shards[key] = (param, _optimizer(self.spec, [param]))
        param, optimizer = self.shards[key]
        param.grad = reduced
        optimizer.step()
        self.busy_s += time.perf_counter() - start
        return param.data


def straggler_slowdown(spec, rank: int) -> float:
    """How much slower this rank computes (1.0: not a straggler)."""
    if spec.straggler and rank in spec.straggler["ranks"]:
        return float(spec.straggler["slowdown"])
    return 1.0


# -- helpers ------------------------------------------------------------------------------------------------


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


def _real_gradients(model, flat, data) -> float:
    """One real forward and backward on this rank's batch: the gradients profile mode moves. Returns the loss."""
    x, y = data.next_batch()
    flat.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return float(loss.detach())


def _consensus(comm, params: torch.Tensor) -> float:
    """This rank's L2 distance to the workers' average parameters (backend allreduce, not counted or timed)."""
    average = params.detach().clone()
    comm.native_allreduce(average, "mean")
    return float((params - average).norm())


@torch.no_grad()
def _eval_loss(model, data) -> float:
    """Mean cross-entropy on the held-out split."""
    model.eval()
    total = count = 0.0
    for x, y in data.eval_batches():
        total += float(F.cross_entropy(model(x), y, reduction="sum"))
        count += int(y.numel())
    model.train()
    return total / max(count, 1)


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
