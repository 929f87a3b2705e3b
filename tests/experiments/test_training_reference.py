"""Training against an independent reference: n workers with an exact strategy equal one process running plain
SGD (momentum, weight decay) on the workers' combined batch, to 1e-6.

The workers run the pipeline's own rank entry (experiments.pipeline.train.train) on thread ranks, so the
strategy is applied exactly as a measured run applies it: flat buffers, bucket syncs, the worker's optimizer
or the parameter server's shard update. The reference uses only workloads/ (model, data) and torch.optim.SGD.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import strategies
from experiments.config.sweep import RunSpec
from experiments.pipeline.train import train
from strategies.base import PARAMETERS
from strategies.transport.threads import run_threads
from workloads.data import make_dataset
from workloads.models import build_model

WORKERS = 3
STEPS = 4
TOLERANCE = 1e-6
# large enough that weight decay and momentum move the parameters measurably within STEPS steps
SETTINGS = dict(workload="tiny", dataset="digits", image_size=8, batch_size=6, steps=STEPS, warmup_steps=1,
                lr=0.1, momentum=0.9, weight_decay=0.05, seed=3, workers=WORKERS, timeout=60.0)

# Gradient averaging: every registered exact strategy that syncs gradients through sync() (ddp wraps the model
# and needs torch.distributed ranks), with each of its declared variants.
GRADIENT_AVERAGING = [(name, params) for name, params in strategies.registry.settings()
                      if strategies.get(name).exact and strategies.get(name).role != PARAMETERS
                      and not strategies.get(name).wraps_model and name != "parameter_server"]


def _parameter_server_settings() -> list[dict]:
    """Every synchronous mode x placement the parameter server accepts, with one and two servers and partitions
    small enough that a shard is cut into several."""
    config = strategies.get("parameter_server")
    fields = config.parameters()
    modes = ["summation", "update"] if "mode" in fields else [None]
    placements = ["dedicated", "colocated"] if "placement" in fields else [None]
    out = []
    for mode in modes:
        for placement in placements:
            for servers in (1, 2):
                params = {"servers": servers}
                if mode is not None:
                    params["mode"] = mode
                if placement is not None:
                    params["placement"] = placement
                if "partition_mb" in fields:
                    params["partition_mb"] = 0.005  # ~1300 floats: the tiny model's shards split in partitions
                try:
                    config(**params)
                except ValueError:
                    continue  # a combination this version refuses is not one users can run
                out.append(params)
    return out


PARAMETER_SERVER = [("parameter_server", p) for p in _parameter_server_settings()]


def _train_on_threads(spec: RunSpec) -> list[torch.Tensor]:
    """Each worker's final flat parameters after `spec` ran through the pipeline on thread ranks."""

    def rank(comm):
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        train(ctx, spec)
        return ctx.state["params"].clone() if comm.rank < spec.workers else None

    return run_threads(spec.world_size(), rank, timeout=60)[:spec.workers]


def _reference(spec: RunSpec) -> torch.Tensor:
    """One process, one model, plain SGD on the concatenation of every worker's batch for each step."""
    model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size, seed=spec.seed)
    data = [make_dataset(spec.dataset, batch_size=spec.batch_size, image_size=spec.image_size,
                         num_classes=spec.num_classes, rank=r, world_size=spec.workers, seed=spec.seed)
            for r in range(spec.workers)]
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum,
                                weight_decay=spec.weight_decay)
    for _ in range(spec.steps):
        batches = [d.next_batch() for d in data]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()  # the mean over the combined batch
        optimizer.step()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


@pytest.fixture(scope="module")
def reference():
    torch.set_num_threads(1)
    return _reference(RunSpec(**SETTINGS))


def _check_against_reference(spec: RunSpec, reference: torch.Tensor) -> None:
    start = torch.nn.utils.parameters_to_vector(
        build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                    seed=spec.seed).parameters()).detach()
    moved = float((reference - start).abs().max())
    assert moved > 100 * TOLERANCE, f"the reference barely trained (moved {moved:g}): the check would be vacuous"
    for rank, params in enumerate(_train_on_threads(spec)):
        diff = float((params - reference).abs().max())
        assert diff <= TOLERANCE, (f"{spec.strategy} {spec.strategy_params} bucket_mb={spec.bucket_mb} "
                                   f"overlap={spec.overlap}: worker {rank} ends {diff:.3g} from single-process SGD "
                                   f"on the combined batch (tolerance {TOLERANCE:g})")


@pytest.mark.parametrize(("name", "params"), GRADIENT_AVERAGING, ids=lambda v: str(v) if v else "default")
def test_gradient_averaging_equals_sgd_on_the_combined_batch(name, params, reference):
    _check_against_reference(RunSpec(strategy=name, strategy_params=params, **SETTINGS), reference)


@pytest.mark.parametrize(("name", "params"), PARAMETER_SERVER, ids=lambda v: str(v) if v else "default")
def test_parameter_server_equals_sgd_on_the_combined_batch(name, params, reference):
    _check_against_reference(RunSpec(strategy=name, strategy_params=params, **SETTINGS), reference)


@pytest.mark.parametrize("overlap", [False, True], ids=["buckets", "buckets-overlapped"])
@pytest.mark.parametrize("name", ["ring", "parameter_server"])
def test_bucketed_sync_equals_sgd_on_the_combined_batch(name, overlap, reference):
    """Several buckets (about 1,300 floats each), synced after backward or overlapped with it."""
    params = {"servers": 2} if name == "parameter_server" else {}
    _check_against_reference(RunSpec(strategy=name, strategy_params=params, bucket_mb=0.005, overlap=overlap,
                                     **SETTINGS), reference)


def test_reference_is_sensitive_to_weight_decay_and_momentum(reference):
    """The reference itself tells weight decay and momentum apart (else dropping them could pass unseen)."""
    for change in ({"weight_decay": 0.0}, {"momentum": 0.0}):
        other = _reference(RunSpec(**{**SETTINGS, **change}))
        assert float((other - reference).abs().max()) > 100 * TOLERANCE, change
