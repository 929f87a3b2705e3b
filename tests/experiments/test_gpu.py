"""GPU paths: models and data on CUDA, strategies over CUDA tensors. Skipped where there is no GPU (CI)."""

from types import SimpleNamespace

import pytest
import torch

from experiments.config.sweep import RunSpec
from experiments.pipeline.train import train
from strategies.transport.threads import run_threads

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")]


@pytest.mark.parametrize("strategy", ["ring", "parameter_server", "decentralized"])
def test_training_on_cuda_tensors(strategy):
    params = {"servers": 1} if strategy == "parameter_server" else {}
    spec = RunSpec(workload="tiny", image_size=16, batch_size=8, steps=3, warmup_steps=1, strategy=strategy,
                   workers=2, device="cuda", strategy_params=params)

    def body(comm):
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cuda", state={})
        result = train(ctx, spec)
        params = ctx.state.get("params")
        return result, (params.device.type if params is not None else None)

    results = run_threads(spec.world_size(), body, timeout=60)
    for (result, device_type), rank in zip(results, range(spec.workers)):
        assert device_type == "cuda", rank
        assert all(row["loss"] > 0 for row in result["steps"])
