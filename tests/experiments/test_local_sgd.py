"""Local SGD and DiLoCo (strategies/local_sgd.py) and compression through the pipeline on thread ranks: the
pipeline's train() against hand-computed references on a tiny model, and the run summary's byte check."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from experiments.config.sweep import RunSpec, SweepError, parse
from experiments.pipeline.summary import summarize
from experiments.pipeline.train import train
from strategies.transport.threads import run_threads
from workloads.data import make_dataset
from workloads.models import build_model

WORKERS = 3
SETTINGS = dict(workload="tiny", dataset="digits", image_size=8, batch_size=6, steps=4, warmup_steps=1,
                lr=0.1, momentum=0.9, weight_decay=0.05, seed=3, workers=WORKERS, timeout=60.0, p2p="threads")
META = {"started_at": "2026-01-01T00:00:00", "duration_s": 1.0, "transport": "threads", "gpu": "", "cores": 8,
        "host": "h"}


def _train(spec: RunSpec):
    """Each worker's result and final flat parameters after `spec` ran through the pipeline on thread ranks."""

    def rank(comm):
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        result = train(ctx, spec)
        return result, ctx.state["params"].clone()

    torch.set_num_threads(1)
    out = run_threads(spec.world_size(), rank, timeout=60)
    return [r for r, _ in out], [p for _, p in out]


def _local_reference(spec: RunSpec, outer: bool) -> list[torch.Tensor]:
    """Each worker alone: SGD on its own batches (its own momentum), parameters averaged every H steps; with
    `outer`, DiLoCo's Nesterov step written out by hand on the anchor (buf = mu buf + g; anchor -= lr (g + mu buf))."""
    models = [build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size, seed=spec.seed)
              for _ in range(spec.workers)]
    data = [make_dataset(spec.dataset, batch_size=spec.batch_size, image_size=spec.image_size,
                         num_classes=spec.num_classes, rank=r, world_size=spec.workers, seed=spec.seed)
            for r in range(spec.workers)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
                  for m in models]
    anchor = torch.nn.utils.parameters_to_vector(models[0].parameters()).detach().clone()
    buf = None
    for step in range(spec.steps):
        for model, opt, d in zip(models, optimizers, data):
            x, y = d.next_batch()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if (step + 1) % spec.sync_every:
            continue
        vectors = [torch.nn.utils.parameters_to_vector(m.parameters()).detach() for m in models]
        average = torch.stack(vectors).mean(dim=0)
        if outer:
            g = anchor - average
            buf = g.clone() if buf is None else spec.outer_momentum * buf + g
            anchor = anchor - spec.outer_lr * (g + spec.outer_momentum * buf)
            average = anchor
        for m in models:
            torch.nn.utils.vector_to_parameters(average.clone(), m.parameters())
    return [torch.nn.utils.parameters_to_vector(m.parameters()).detach() for m in models]


def test_sync_every_1_and_no_compression_are_todays_training_bit_for_bit():
    today = _train(RunSpec(strategy="ring", **SETTINGS))[1]
    explicit = _train(RunSpec(strategy="ring", sync_every=1, compression="none", **SETTINGS))[1]
    for a, b in zip(today, explicit):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert RunSpec(strategy="ring", sync_every=1).run_id == RunSpec(strategy="ring").run_id  # old results resume


@pytest.mark.parametrize("outer", [False, True])
def test_local_sgd_and_diloco_equal_the_hand_computed_reference(outer):
    spec = RunSpec(strategy="ring", sync_every=2, outer_optimizer="nesterov" if outer else "none", **SETTINGS)
    results, params = _train(spec)
    want = _local_reference(spec, outer)
    for rank, (got, ref) in enumerate(zip(params, want)):
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=0, msg=f"rank {rank}")
    for got in params[1:]:  # after the 4th step, a sync step: the workers hold the same parameters
        assert got.numpy().tobytes() == params[0].numpy().tobytes()


def test_between_syncs_workers_differ_and_move_no_bytes():
    spec = RunSpec(strategy="ring", **{**SETTINGS, "steps": 3}, sync_every=2)
    results, params = _train(spec)
    assert not torch.equal(params[0], params[1])  # step 3 was local: each worker stepped on its own batch
    for result in results:
        sent = [row["bytes_sent"] for row in result["steps"]]
        assert sent[0] == 0 and sent[2] == 0 and sent[1] > 0


@pytest.mark.parametrize("h", [2, 4])
def test_bytes_per_step_are_traffic_over_h_and_the_summary_checks_every_step(h):
    spec = RunSpec(strategy="ring", **{**SETTINGS, "steps": 8, "warmup_steps": 0}, sync_every=h)
    results, _ = _train(spec)
    row, _ = summarize(spec, results, "", META)
    assert row["status"] == "ok", row["error"]
    full = RunSpec(strategy="ring", **SETTINGS).strategy_config().traffic(WORKERS, int(row["numel"]))
    per_worker = sum(r.bytes_sent for r in full.workers()) / WORKERS  # a ring's chunks differ by an element
    assert row["bytes_sent_per_worker"] == pytest.approx(per_worker / h, rel=1e-12)
    assert row["analytic_bytes_sent_per_worker"] == pytest.approx(per_worker / h, rel=1e-12)
    assert (row["sync_every"], row["compression"]) == (h, "none")
    # the report's model prices a step as a sync's bytes / H: exactly what the run measured per step
    from strategies.cost import critical_path

    rounds, path_bytes, _ = critical_path("ring", WORKERS, int(row["numel"]), {"sync_every": h})
    assert (path_bytes, rounds) == (row["analytic_path_bytes"], row["analytic_rounds"])
    assert path_bytes == full.path_bytes / h
    # a step whose bytes disagree with its own step's traffic fails the run, naming the step
    results[1]["steps"][0]["bytes_sent"] = 4
    row, _ = summarize(spec, results, "", META)
    assert row["status"] == "failed" and "rank 1 step 0" in row["error"]


@pytest.mark.parametrize("compression", ["fp16", "topk", "powersgd"])
def test_compressed_training_records_its_compressed_bytes(compression):
    spec = RunSpec(strategy="ring", compression=compression, topk_ratio=0.05, powersgd_start=2, **SETTINGS)
    results, params = _train(spec)
    row, _ = summarize(spec, results, "", META)
    assert row["status"] == "ok", row["error"]
    assert row["compression"] == compression and row["param_norm"] > 0
    exact = RunSpec(strategy="ring", **SETTINGS).strategy_config().traffic(WORKERS, int(row["numel"]))
    assert row["bytes_sent_per_worker"] < exact.worker_bytes_sent
    for got in params[1:]:  # compressed averages are still the same bits on every worker
        assert got.numpy().tobytes() == params[0].numpy().tobytes()
    if compression == "powersgd":  # each parameter its own matrix: the summary checked the bytes per tensor
        model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size)
        shapes = [list(p.shape) for p in model.parameters()]
        assert results[0]["final"]["bucket_shapes"] == [shapes]
        config = spec.strategy_config()
        per_tensor = config.step_traffic(WORKERS, int(row["numel"]), 4, spec.steps - 1, shapes=shapes)
        assert per_tensor != config.step_traffic(WORKERS, int(row["numel"]), 4, spec.steps - 1)
        assert results[0]["steps"][-1]["bytes_sent"] == per_tensor.ranks[0].bytes_sent


def test_sweep_refuses_bad_settings_before_any_run():
    base = {"defaults": {"workers": 2, "steps": 5}}
    cases = [({"compression": "int8"}, "compression = 'int8': accepted are 'none', 'fp16'"),
             ({"sync_every": 0}, "sync_every = 0: accepted are"),
             ({"compression": "fp16", "sync_every": 4}, "compression = 'fp16' with sync_every = 4"),
             ({"strategy": "parameter_server", "compression": "topk"}, "'parameter_server'"),
             ({"strategy": "parameter_server", "sync_every": 2}, "'parameter_server'"),
             ({"outer_optimizer": "adam", "sync_every": 4}, "outer_optimizer = 'adam': accepted are 'none', "
                                                            "'nesterov'")]
    for settings, match in cases:
        with pytest.raises(SweepError, match=match):
            parse({"defaults": {**base["defaults"], **settings}})


def test_a_strategy_table_array_gives_one_run_per_variant():
    sweep = parse({"defaults": {"workers": 2, "steps": 5}, "grid": {"strategy": ["ring", "parameter_server"]},
                   "strategy_params": {"ring": [{"compression": ["none", "fp16"]}, {"sync_every": 4}],
                                       "parameter_server": {"staleness": 2}}})
    got = sorted((r.strategy, r.wrapper_settings()["compression"], r.wrapper_settings()["sync_every"])
                 for r in sweep.runs)
    assert got == [("parameter_server", "none", 1), ("ring", "fp16", 1), ("ring", "none", 1), ("ring", "none", 4)]
