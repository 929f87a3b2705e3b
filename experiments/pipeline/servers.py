"""A server rank's loop (ranks workers..world_size-1 of a strategy with servers): the synchronous one, bucket by
bucket per step, or the one without a global barrier (a parameter server with staleness s, "async" or backups),
which serves every worker for the whole run. The workers' side is the step loop (experiments/pipeline/train.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from experiments.pipeline.rows import step_row
from experiments.pipeline.trace import StepTrace
from strategies.parameter_server_async import unit_buckets
from strategies.transport.ops import wire_dtype


def serve_steps(comm, spec, config, buckets, update, first: int = 0, hooks=None) -> dict:
    """A parameter server rank: per step, serve the buckets in bucket order as the workers push them (per
    bucket, as BytePS does); `update(bucket, reduced, where)` steps this server's shard and returns the
    parameters to send back, timing itself on `update.clock` (its time is the server's compute). `first`: the step
    it starts at (a run with failures resumes its servers at a step; experiments/pipeline/sweep_faults.py);
    `hooks.end(step, row)` after each step, where given (on Ray actors the step is counted there once every rank
    has it, as the workers' hooks count it: experiments/pipeline/ray_sweep_faults.py)."""
    clock = update.clock
    runtimes = [config.bind(comm, spec.workers) for _ in buckets]
    rows = []
    trace = StepTrace(spec, comm, clock)  # the traced steps: each bucket served, and the messages
    run_start = clock()
    for step in range(first, spec.steps):
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
        rows.append(step_row(spec, step, comm.rank, "server", update.busy_s, total - update.busy_s, comm.counters(),
                             clock() - run_start, comm_busy_s=total))
        if hooks is not None:
            hooks.end(step, rows[-1])
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": update.numel,
                                     "consensus_distance": math.nan, "buckets": len(buckets),
                                     "bucket_numels": [b.numel for b in buckets], "trained": False},
            "events": trace.events}


def serve_without_barrier(comm, spec, config, buckets, update) -> dict:
    """A parameter server without a global barrier (staleness s, "async", backups): it serves every worker for
    the whole run, each from a thread of its own, bucket by bucket and partition by partition, in either mode
    (strategies/parameter_server_async.py); the workers' roles are unchanged (update mode: PushPull; summation:
    GradientAveraging, their optimizers apply the sums). One row per step: the staleness of every gradient
    partition it applied, the time its replies waited at the bound, the late pushes it dropped; its bytes from
    the pushes it took (each push is answered: as many bytes out as in)."""
    clock = update.clock
    runtime = config.bind(comm, spec.workers)
    trace = StepTrace(spec, comm, clock)  # the traced steps: each push served, its update and wait, the messages
    units = unit_buckets([b.numel for b in buckets], comm.rank - spec.workers, runtime.servers,
                         wire_dtype(update.dtype).itemsize, config.partition_mb)
    trace.begin_run(units)
    start = clock()
    try:
        records = runtime.serve_run(spec.steps, [b.numel for b in buckets], update.dtype,
                                    lambda bucket, gradient, where: update(buckets[bucket], gradient, where),
                                    device=update.device)
    finally:
        comm.recorder = None  # recording off, whatever happened
    trace.end_run(records, units)
    per_step = (clock() - start) / max(spec.steps, 1)
    itemsize = torch.empty(0, dtype=update.dtype).element_size()
    rows = []
    for step in range(spec.steps):
        pushes = [r for r in records if r.step == step]
        moved = itemsize * sum(r.numel for r in pushes)
        counters = SimpleNamespace(bytes_sent=moved, bytes_recv=moved)
        row = step_row(spec, step, comm.rank, "server", update.busy_s / max(spec.steps, 1), per_step, counters,
                       per_step * (step + 1), comm_busy_s=per_step)
        row |= {"staleness": [r.staleness for r in pushes if not r.dropped],
                "bound_wait_s": sum(r.bound_wait_s for r in pushes),
                "dropped_pushes": len({r.worker for r in pushes if r.dropped})}  # a worker's late step: one
        rows.append(row)
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": update.numel,
                                     "consensus_distance": math.nan, "buckets": len(buckets),
                                     "bucket_numels": [b.numel for b in buckets], "trained": False},
            "events": trace.events}


def server_loop(config):
    """A server rank's loop (ranks workers..world_size-1 of a strategy with servers): the synchronous one, or the
    one without a global barrier (a parameter server with staleness s, "async" or backups); both serve update
    and summation servers alike (a summation server ignores `update`)."""
    return serve_without_barrier if config.asynchronous else serve_steps
