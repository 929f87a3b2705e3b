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
- a server rank runs a loop of its own (experiments/pipeline/servers.py): per step, receive every bucket, update
  its shard, reply; or, without a global barrier, serve every worker for the whole run.
`worker_role(config)` and `server_loop(config)` choose the pieces: the seams where an asynchronous server (and
the worker role that talks to it) attaches. Each rank records one row per step (experiments/pipeline/rows.py: the
same columns on every substrate); experiments/pipeline/summary.py turns them into the run's numbers.

Buckets and overlap (experiments/pipeline/bucket_sync.py): the buffer is synchronized bucket by bucket
(`bucket_mb`, DDP's grouping; one flat bucket by default, today's behaviour bit for bit). With `overlap`, each
bucket is synced as soon as its last gradient is ready, while backward goes on (a communication thread when
measured, inline in simulated time); the optimizer waits for the last bucket. Decentralized averaging works on
parameters, which exist only after the local step: it averages per bucket after that step and never overlaps
(the sweep records overlap = false for it). `ddp` wraps the model in torch's DistributedDataParallel, which
always overlaps: its wait inside backward is counted as exposed communication.

Compute modes of a measured run: `real` runs the model; `profile` replays a measured timeline
(workloads/profile.py: forward, each gradient becoming ready, optimizer) through the same autograd hooks while
the strategy moves the real flat buffers (both in experiments/pipeline/measured.py). The gradients hold real
values: one real forward/backward per rank at the start of the run, re-accumulated by every replayed backward
(never recomputed: the timing does not depend on them). The parameters do not train in profile mode (the
optimizer's time is replayed, not its arithmetic).
"""

from __future__ import annotations

import math
import threading

import torch

from experiments.pipeline.bucket_sync import BucketSync
from experiments.pipeline.measured import (  # noqa: F401 - profile_key, straggler_slowdown: imported from here
    MeasuredCompute,
    ShardUpdate,
    profile_for,
    profile_key,
    replay_problem,
    straggler_slowdown,
)
from experiments.pipeline.rows import overlap_fraction, step_row
from experiments.pipeline.servers import server_loop
from experiments.pipeline.trace import StepTrace, worker_phases
from strategies.base import GRADIENTS, PARAMETERS, ROLES, SERVER
from workloads.buckets import make_buckets
from workloads.flat import FlatModel
from workloads.models import build_model

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
    profile = profile_for(ctx, spec) if spec.compute == "profile" else None
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



# -- the step loop ------------------------------------------------------------------------------------------


def run_steps(comm, spec, config, compute, buckets, progress=None, hooks=None) -> dict:
    """The step loop of a worker rank on any substrate; `compute` holds the clock and what a step computes.
    `hooks`: a run with failures (experiments/pipeline/sweep_faults.py): hooks.begin(step) before each step (where
    a failing rank dies), hooks.end(step, row) after it (where the step is counted once every rank has it); the loop
    runs steps hooks.first..spec.steps - 1 (a segment resumed at a step)."""
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
        for step in range(0 if hooks is None else hooks.first, spec.steps):
            if hooks is not None:
                hooks.begin(step)
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
            row = step_row(spec, step, comm.rank, "worker", compute_s, comm_s, counters, clock() - run_start,
                           loss=loss_value, samples=samples, backward_end_s=backward_end - step_start,
                           comm_busy_s=busy, overlap_fraction=overlap_fraction(busy, comm_s))
            if not config.exact:  # decentralized: how far apart the workers' parameters are (uncounted)
                row["consensus_distance"] = compute.consensus_distance(comm)
            if spec.target and ((step + 1) % spec.eval_every == 0 or step + 1 == spec.steps):
                row["eval_value"] = compute.evaluate(spec.target["metric"])  # outside the timed part of the step
            rows.append(row)
            if hooks is not None:
                hooks.end(step, row)
            if progress is not None and comm.rank == 0:  # outside the timed part of the step
                progress.put_nowait(step + 1)
    finally:
        if syncer is not None:
            syncer.close()
        if hook is not None:
            hook.close()
        compute.close()
    return {"steps": rows, "final": _final(compute, buckets, rows), "events": trace.events}


def _final(compute, buckets, rows) -> dict:
    """What a worker reports at the end of its steps: the last loss, the buffers it synchronized, its numbers."""
    numels = [b.numel for b in buckets] if buckets else [compute.numel]
    return {"loss": rows[-1]["loss"] if rows else math.nan, "numel": compute.numel, "buckets": len(numels),
            "bucket_numels": numels,
            "bucket_shapes": [_bucket_shapes(compute.flat, b) for b in buckets] if compute.flat is not None else None,
            "trained": compute.trains,
            "consensus_distance": rows[-1]["consensus_distance"] if rows else math.nan, **compute.final()}


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


def _bucket_shapes(flat, bucket) -> list[list[int]]:
    """The shapes of a bucket's parameters in buffer order (registration order: the bucket lists them reversed)."""
    return [list(flat.trainable[i].shape) for i in sorted(bucket.params)]



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


WORKER_ROLES = {GRADIENTS: GradientAveraging, PARAMETERS: ParameterAveraging, SERVER: PushPull}


def worker_role(config):
    """The worker's piece for the strategy's declared role."""
    if config.role not in WORKER_ROLES:
        raise ValueError(f"strategy {config.name!r} declares role {config.role!r}: accepted are "
                         f"{', '.join(ROLES)}")
    return WORKER_ROLES[config.role]()
