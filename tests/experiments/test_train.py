"""Training under every strategy, on thread ranks (fast): the synchronous strategies are equivalent."""

import math
from types import SimpleNamespace

import numpy as np
import torch

import strategies
from experiments.config.sweep import RunSpec
from experiments.pipeline.summary import summarize
from experiments.pipeline.train import train
from experiments.results import schema
from strategies.base import PARAMETERS
from strategies.transport.threads import run_threads

# Every registered exact strategy that averages gradients or serves them (not neighbour averaging), with each
# declared variant; a model-wrapping one (ddp) needs torch.distributed ranks: tests/experiments/test_overlap.py.
SYNCHRONOUS = [(name, params) for name, params in strategies.registry.settings()
               if strategies.get(name).exact and strategies.get(name).role != PARAMETERS
               and not strategies.get(name).wraps_model]


def train_on_threads(spec: RunSpec):
    def body(comm):
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        result = train(ctx, spec)
        result["params"] = ctx.state["params"].clone() if comm.rank < spec.workers else None
        return result

    return run_threads(spec.world_size(), body, timeout=60)


def spec_for(strategy, workers=3, steps=5, params=None, **kw):
    params = params if params is not None else ({"servers": 1} if strategy == "parameter_server" else {})
    return RunSpec(workload="tiny", image_size=16, batch_size=8, steps=steps, warmup_steps=1, strategy=strategy,
                   workers=workers, strategy_params=params, **kw)


def final_norms(results, workers):
    return [r["final"]["param_norm"] for r in results[:workers]]


def test_synchronous_strategies_end_with_the_same_parameters():
    torch.set_num_threads(1)
    params = {}
    assert {"ring", "native", "parameter_server", "chain"} <= {name for name, _ in SYNCHRONOUS}
    for name, variant in SYNCHRONOUS:
        results = train_on_threads(spec_for(name, params=variant))
        for r in results[1:3]:  # every worker holds the same parameters
            assert torch.allclose(r["params"], results[0]["params"], atol=1e-5, rtol=0), name
        params[(name, str(variant))] = results[0]["params"]
    reference = params[("native", "{}")]
    for key, p in params.items():
        diff = float((p - reference).abs().max())
        assert diff <= 1e-5, (key, diff)
    # and training moved the parameters: a run of 1 step ends elsewhere
    one_step = train_on_threads(spec_for("ring", steps=1))[0]["params"]
    assert float((one_step - reference).abs().max()) > 1e-3


def test_decentralized_records_consensus_and_workers_differ():
    results = train_on_threads(spec_for("decentralized", workers=4))
    distances = [row["consensus_distance"] for row in results[0]["steps"]]
    assert all(d > 0 and math.isfinite(d) for d in distances)  # neighbours only: the workers never agree
    norms = final_norms(results, 4)
    assert max(norms) - min(norms) > 0  # neighbour averaging is not an exact allreduce


def test_summary_row_is_complete_and_plausible():
    spec = spec_for("parameter_server", workers=2, steps=4)
    results = train_on_threads(spec)
    row, steps = summarize(spec, results, "", {"started_at": "t", "duration_s": 1.0, "transport": "threads",
                                               "gpu": "", "cores": 2, "host": "h"})
    assert row["status"] == "ok" and row["servers"] == 1
    # the numbers from the step rows, by DESIGN.md's definitions: per timed step the slowest worker's compute +
    # communication; throughput = the group's samples / the summed step times (warm-up step 0 left out)
    timed = [s for s in steps if s["role"] == "worker" and s["timed"]]
    assert sorted({s["step"] for s in timed}) == [1, 2, 3]
    slowest = [max((s for s in timed if s["step"] == k), key=lambda s: s["compute_s"] + s["comm_s"])
               for k in (1, 2, 3)]
    step_s = [s["compute_s"] + s["comm_s"] for s in slowest]
    assert math.isclose(row["step_time_s"], sum(step_s) / 3, rel_tol=1e-9)
    assert math.isclose(row["throughput"], sum(s["samples"] for s in timed) / sum(step_s), rel_tol=1e-9)
    assert math.isclose(row["comm_s"], sum(s["comm_s"] for s in slowest) / 3, rel_tol=1e-9) and row["comm_s"] > 0
    assert math.isclose(row["comm_fraction"], sum(s["comm_s"] for s in slowest) / sum(step_s), rel_tol=1e-9)
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"]
    config = strategies.make("parameter_server", servers=1)
    traffic = config.traffic(2, row["numel"], 4)
    assert row["bytes_sent_per_server"] == traffic.servers()[0].bytes_sent
    assert len(steps) == 4 * 3 and {s["role"] for s in steps} == {"worker", "server"}
    assert row["cores_oversubscribed"] is True and row["gpu_shared"] is False  # 2 workers + 1 server, 2 cores
    assert row["bytes_counted"] is True and row["param_servers"] == 1 and row["straggler_slowdown"] == 1.0
    assert set(row) >= set(schema.names(schema.RUNS))
    assert np.isfinite(row["final_loss"]) and row["param_norm"] > 0


def test_workers_sharing_a_gpu_are_labelled_gpu_shared_not_oversubscribed_cores():
    """Two CUDA workers that could not get NCCL (one GPU) share it: that is gpu_shared, and with cores to spare
    the cores are not oversubscribed (the report said "more ranks than CPU cores" for these runs)."""
    spec = RunSpec(workload="tiny", image_size=16, batch_size=8, steps=2, warmup_steps=1, strategy="ring",
                   workers=2, device="cuda")
    meta = {"started_at": "t", "duration_s": 1.0, "transport": "gloo", "gpu": "H100", "cores": 16, "host": "h"}
    row, _ = summarize(spec, None, "not run", meta)
    assert row["gpu_shared"] is True and row["cores_oversubscribed"] is False
    with_nccl, _ = summarize(spec, None, "not run", meta | {"transport": "nccl"})
    assert with_nccl["gpu_shared"] is False


def test_a_finished_run_leaves_no_model_alive():
    """Ray actors and thread ranks run sweep after sweep in one process: a run's model, buffers and data must be
    freed when it ends. Autograd holds tensor hooks in C++, out of the collector's sight, so a hook reaching the run
    through its parameters kept every run alive (~0.5 GB per resnet18 run) until the hooks were removed."""
    import gc

    from workloads.models import TinyCNN

    def alive() -> int:
        gc.collect()
        return sum(isinstance(o, TinyCNN) for o in gc.get_objects())

    before = alive()
    for compute, overlap in (("real", False), ("real", True)):
        spec = RunSpec(workload="tiny", image_size=8, batch_size=4, steps=2, warmup_steps=0, workers=2,
                       p2p="threads", timeout=60.0, compute=compute, overlap=overlap,
                       bucket_mb=0.01 if overlap else None)
        run_threads(2, lambda comm, spec=spec: train(
            SimpleNamespace(rank=comm.rank, world_size=2, comm=comm, device="cpu", state={}), spec), timeout=60)
    assert alive() == before
