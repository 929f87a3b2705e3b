"""One training run on one rank: what every worker (and server) actor executes, top to bottom.

Per step on a worker: forward, backward (compute), the strategy's hook (communication), optimizer step.
- gradients  (ring, halving_doubling, ...): sync the flat gradient buffer (mean), then a local SGD step.
- parameters (decentralized): a local SGD step, then average the flat parameters with the neighbours.
- server     (parameter_server): push the flat gradients; the servers reduce them, apply SGD to their
  shard of the parameters and send parameters back, which the worker copies in.
Each rank records one row per step; the runner turns them into the run's numbers.
"""

from __future__ import annotations

import math
import threading
import time

import torch
import torch.nn.functional as F

import strategies
from strategies.base import GRADIENTS, PARAMETERS, SERVER
from workloads.data import make_dataset
from workloads.flat import FlatModel
from workloads.models import build_model

# Model init draws from torch's global RNG: ranks that are threads of one process (the tests' transport)
# must not interleave their draws, or equal seeds give different models.
_INIT_LOCK = threading.Lock()


def train(ctx, spec, progress=None) -> dict:
    """Run `spec` on this rank; returns {"steps": [row, ...], "final": {...}}.

    `progress`: a queue rank 0 puts each finished step number on (the runner's live display), or None.
    """
    config = strategies.make(spec.strategy, **spec.strategy_params)
    runtime = config.bind(ctx.comm, spec.workers)
    device = torch.device(ctx.device)
    with _INIT_LOCK:
        torch.manual_seed(spec.seed + ctx.rank)  # the global stream (dropout): reproducible, rank-specific
        model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                            seed=spec.seed).to(device)
    # the flat buffers feed a collective; a rank alone has none and trains exactly as a plain loop would
    flat = FlatModel(model) if ctx.comm.world_size > 1 else None
    if runtime.is_server:
        return _serve(ctx, spec, runtime, flat)
    return _work(ctx, spec, config, runtime, model, flat, device, progress)


def _optimizer(spec, params):
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)


def _as_one_parameter(flat) -> torch.nn.Parameter:
    """The flat buffers as one parameter: SGD's elementwise update in one pass instead of one per tensor
    (the same arithmetic; resnet18's 62 small updates cost as much as the flat gradients' zeroing)."""
    param = torch.nn.Parameter(flat.params)  # shares storage: updating it updates the model
    param.grad = flat.grads
    return param


def _work(ctx, spec, config, runtime, model, flat, device, progress) -> dict:
    data = make_dataset(spec.dataset, batch_size=spec.batch_size, image_size=spec.image_size,
                        num_classes=spec.num_classes, rank=ctx.rank, world_size=spec.workers, seed=spec.seed,
                        device=device)
    optimizer = None
    if config.role != SERVER:
        optimizer = _optimizer(spec, [_as_one_parameter(flat)] if flat else model.parameters())
    slowdown = _slowdown(spec, ctx.rank)
    comm = ctx.comm
    rows = []
    loss_value = math.nan
    model.train()
    run_start = time.perf_counter()
    for step in range(spec.steps):
        comm.reset_counters()
        step_start = time.perf_counter()
        # -- compute: forward, backward (and the local optimizer step for decentralized) --------------
        x, y = data.next_batch()
        if flat is not None:
            flat.zero_grad()
        else:
            optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        if config.role == PARAMETERS:
            optimizer.step()
        _synchronize(device)
        compute_s = time.perf_counter() - step_start
        if slowdown > 1:  # a straggler: stretch this step's measured compute by the slowdown factor
            time.sleep((slowdown - 1) * compute_s)  # a sleep leaves the shared cores to the other ranks
            compute_s = time.perf_counter() - step_start
        # -- communication: the strategy's hook -----------------------------------------------------
        comm_start = time.perf_counter()
        if flat is None:
            pass  # one rank: nothing to agree on
        elif config.role == PARAMETERS:
            runtime.sync(flat.params, "mean")
        else:  # GRADIENTS: average them; SERVER: gradients go up, parameters come back in the same buffer
            runtime.sync(flat.grads, "mean")
        _synchronize(device)
        comm_s = time.perf_counter() - comm_start
        # -- apply --------------------------------------------------------------------------------
        apply_start = time.perf_counter()
        if config.role == GRADIENTS:
            optimizer.step()
        elif config.role == SERVER:
            flat.params.copy_(flat.grads)
        _synchronize(device)
        compute_s += time.perf_counter() - apply_start
        counters = comm.counters()
        loss_value = float(loss.detach())
        row = {"step": step, "rank": ctx.rank, "role": "worker", "timed": step >= spec.warmup_steps,
               "compute_s": compute_s, "comm_s": comm_s, "bytes_sent": counters.bytes_sent,
               "bytes_recv": counters.bytes_recv, "loss": loss_value, "samples": int(y.shape[0]),
               "consensus_distance": math.nan, "wall_s": time.perf_counter() - run_start}
        if not config.exact:  # decentralized: how far apart the workers' parameters are (uncounted)
            row["consensus_distance"] = _consensus(comm, flat.params) if flat else 0.0
        rows.append(row)
        if progress is not None and ctx.rank == 0:  # outside the timed part of the step
            progress.put_nowait(step + 1)
    params = flat.params if flat else torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    ctx.state["params"] = params  # the last run's parameters, kept on the actor (tests compare them)
    final = {"loss": loss_value, "param_norm": float(params.norm()), "numel": params.numel(),
             "consensus_distance": rows[-1]["consensus_distance"] if rows else math.nan}
    if hasattr(data, "eval_batches"):
        final["accuracy"] = _accuracy(model, data)
    return {"steps": rows, "final": final}


def _serve(ctx, spec, runtime, flat) -> dict:
    """A parameter server: owns a shard of the parameters and its optimizer state."""
    numel = flat.numel
    shard = {}

    def update(reduced: torch.Tensor, where: slice) -> torch.Tensor:
        if "param" not in shard:  # first step: take this shard of the (seeded, identical) initial parameters
            shard["param"] = torch.nn.Parameter(flat.params[where].detach().clone())
            shard["opt"] = _optimizer(spec, [shard["param"]])
        shard["param"].grad = reduced
        shard["opt"].step()
        return shard["param"].data

    rows = []
    comm = ctx.comm
    run_start = time.perf_counter()
    for step in range(spec.steps):
        comm.reset_counters()
        start = time.perf_counter()
        runtime.serve(numel, flat.params.dtype, "mean", update, device=flat.params.device)
        counters = comm.counters()
        rows.append({"step": step, "rank": ctx.rank, "role": "server", "timed": step >= spec.warmup_steps,
                     "compute_s": 0.0, "comm_s": time.perf_counter() - start, "bytes_sent": counters.bytes_sent,
                     "bytes_recv": counters.bytes_recv, "loss": math.nan, "samples": 0,
                     "consensus_distance": math.nan, "wall_s": time.perf_counter() - run_start})
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": numel,
                                     "consensus_distance": math.nan}}


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
