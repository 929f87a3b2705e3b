"""Failures in a sweep's training on thread ranks: the real step loop loses a rank and recovers by its mode.

Each case is worked against a reference computed apart from the sweep's code: the survivors' mean gradient applied
by one plain torch SGD (elastic), the failure-free run's parameters bit for bit (checkpoint_restart), the
survivors' Metropolis mixing (reweight); a failure without recovery ends the run with its cause, its completed
steps on disk.
"""

from __future__ import annotations

import io
import textwrap
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from experiments.config import sweep as sweep_mod
from experiments.config.sweep import RunSpec
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.substrate import Run, Substrate, ThreadSubstrate
from experiments.pipeline.sweep_faults import SweepSegments, execute
from experiments.pipeline.train import train
from experiments.results import dataset
from strategies.faults import Failure
from strategies.transport.threads import run_threads
from workloads.data import make_dataset
from workloads.flat import FlatModel
from workloads.models import build_model

BASE = dict(workload="tiny", image_size=16, batch_size=8, steps=6, warmup_steps=1, workers=4, lr=0.05,
            momentum=0.9, timeout=60)
META = {"started_at": "2026-01-01T00:00:00+00:00", "transport": "threads", "gpu": "", "cores": 2, "host": "test",
        "substrate": "threads"}


def spec_of(strategy="ring", schedule=((2, 2),), **recovery) -> RunSpec:
    return RunSpec(strategy=strategy, failures={"schedule": [list(f) for f in schedule]}, recovery=recovery or None,
                   **BASE)


def reference(spec: RunSpec, alive_at, donor_of=None) -> torch.Tensor:
    """The survivors' training worked out in one process: at each step every live slot's gradient on its own
    shard (its own BatchNorm statistics), their mean applied by one torch SGD. `alive_at(step)`: the live slots;
    `donor_of(step)`: {joining slot: the peer whose buffers it copies}."""
    models, data = {}, {}
    for slot in range(spec.workers):
        torch.manual_seed(spec.seed + slot)
        models[slot] = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                                   seed=spec.seed)
        data[slot] = make_dataset(spec.dataset, spec.batch_size, spec.image_size, spec.num_classes, slot,
                                  spec.workers, spec.seed)
    flats = {slot: FlatModel(model) for slot, model in models.items()}
    x = flats[0].params.detach().clone().requires_grad_(True)
    optimizer = torch.optim.SGD([x], lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    for step in range(spec.steps):
        for slot, donor in (donor_of(step) if donor_of else {}).items():
            for mine, theirs in zip(models[slot].buffers(), models[donor].buffers()):
                mine.copy_(theirs)
        grads = []
        for slot in alive_at(step):
            flat = flats[slot]
            with torch.no_grad():
                flat.params.copy_(x)
            flat.zero_grad()
            images, labels = data[slot].next_batch()
            F.cross_entropy(models[slot](images), labels).backward()
            grads.append(flat.grads.clone())
        x.grad = torch.stack(grads).mean(0)
        optimizer.step()
    return x.detach()


@pytest.mark.parametrize("strategy, mode", [("ring", "elastic"), ("halving_doubling", "elastic"),
                                            ("parameter_server", "ps_shrink")])
def test_the_survivors_train_on_their_mean_and_a_replacement_rejoins(strategy, mode):
    spec = spec_of(strategy, [(2, 2)], mode=mode, rejoin_steps=2)  # slot 2 dies in step 2, back at step 4
    run = SweepSegments(spec).run()
    assert (run.completed_steps, run.steps_run, run.ended) == (6, 6, None)
    [failure] = run.failures
    assert (failure.step, failure.rank, failure.steps_lost, failure.survivors) == (2, 2, 0, 3)
    expected = reference(spec, lambda s: [0, 1, 3] if s in (2, 3) else [0, 1, 2, 3],
                         lambda s: {2: 0} if s == 4 else {})
    for slot in range(4):
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), expected, rtol=1e-5, atol=1e-6)


def test_the_failure_free_reference_is_the_training_the_sweep_runs():
    """The reference above is the sweep's own training when nothing fails (so it can check the survivors' runs)."""
    spec = RunSpec(strategy="ring", **BASE)

    def body(comm):
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        train(ctx, spec)
        return ctx.state["params"].clone()

    params = run_threads(4, body, timeout=60)
    torch.testing.assert_close(params[0], reference(spec, lambda s: [0, 1, 2, 3]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["ring", "parameter_server"])
def test_checkpoint_restart_resumes_bit_identically(strategy):
    spec = spec_of(strategy, [(4, 1)], mode="checkpoint_restart", checkpoint_every=3)  # steps 3 lost, redone
    run = SweepSegments(spec).run()
    assert (run.completed_steps, run.steps_run) == (6, 7)
    assert [(f.step, f.rank, f.steps_lost) for f in run.failures] == [(4, 1, 1)]
    clean = SweepSegments(spec, schedule=[]).run()  # the same run, nothing failing
    assert clean.steps_run == 6 and not clean.failures

    def body(comm):  # the sweep's run without failures (train(), not the segments)
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        train(ctx, RunSpec(strategy=strategy, **BASE))
        return ctx.state.get("params")

    plain = run_threads(spec.world_size(), body, timeout=60)
    for slot in range(4):
        assert torch.equal(torch.as_tensor(run.params[slot]), torch.as_tensor(clean.params[slot]))
        assert torch.equal(torch.as_tensor(run.params[slot]), plain[slot])


def test_a_replacement_that_dies_in_the_step_it_joins_is_lost_again_not_a_crash():
    """An mtbf can take a replacement before it completes a step (its clock starts at the death it replaces): it
    had kept no state, and the survivors go on without it (the run once ended with a KeyError)."""
    row, steps, _ = execute(spec_of("ring", [(2, 1), (4, 1)], mode="elastic", rejoin_steps=2), META)
    assert row["status"] == "ok", row["error"]
    assert (row["failure_steps"], row["failure_ranks"], row["steps_lost"]) == ((2, 4), (1, 1), 0)
    workers = pd.DataFrame(steps).query("role == 'worker'").groupby("step").size()
    assert list(workers) == [4, 4, 3, 3, 3, 3]  # back at step 4, lost in it; its next replacement is due after 6


def test_a_replacement_whose_first_segment_is_cut_by_another_failure_joins_again_from_a_peer():
    """Slot 1 dies in step 2 and its replacement joins at step 4, where slot 2 dies before any step completes: the
    replacement had kept no state, so it fetches again at the redone step 4 (it once restarted from the initial
    weights, and the run failed its exactness check)."""
    spec = spec_of("ring", [(2, 1), (4, 2)], mode="elastic", rejoin_steps=2)
    run = SweepSegments(spec).run()
    assert (run.completed_steps, run.ended, [(f.step, f.rank) for f in run.failures]) == (6, None, [(2, 1), (4, 2)])
    expected = reference(spec, lambda s: [0, 1, 2, 3] if s < 2 else [0, 2, 3] if s < 4 else [0, 1, 3],
                         lambda s: {1: 0} if s == 4 else {})
    for slot in (0, 1, 3):
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), expected, rtol=1e-5, atol=1e-6)


def test_reweight_mixes_with_the_survivors_metropolis_weights():
    row, steps, _ = execute(spec_of("decentralized", [(3, 2)], mode="reweight"), META)
    assert row["status"] == "ok", row["error"]  # every step's bytes matched its graph's: 1 or 2 neighbours
    # a ring of 4 losing rank 2 is the path 3 - 0 - 1: W = [[1/3, 1/3, 1/3], [1/3, 2/3, 0], [1/3, 0, 2/3]]
    assert row["spectral_gap"] == pytest.approx(1 / 3)
    after = pd.DataFrame(steps).query("role == 'worker' and step == 4").sort_values("rank")
    assert list(after["bytes_sent"]) == [2 * 4 * row["numel"], 4 * row["numel"], 4 * row["numel"]]
    assert (row["failure_count"], row["steps_lost"], row["completed_steps"]) == (1, 0, 6)


def test_ps_shrink_goes_on_with_the_survivors():
    row, steps, _ = execute(spec_of("parameter_server", [(2, 3)], mode="ps_shrink"), META)
    assert row["status"] == "ok", row["error"]
    workers = pd.DataFrame(steps).query("role == 'worker'").groupby("step").size()
    assert list(workers) == [4, 4, 3, 3, 3, 3]
    assert (row["failure_steps"], row["failure_ranks"], row["steps_lost"]) == ((2,), (3,), 0)
    assert row["recovery_s"] >= 0 and row["detection_s"] >= 0 and row["time_to_step_s"] > 0
    assert row["run_throughput"] > 0


SWEEP = """
name = "fsweep-test"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 6
warmup_steps = 1
workers = 4
strategy = "ring"
failures = { schedule = [{ rank = 1, step = 3 }] }
[grid]
recovery = [{ mode = "none" }, { mode = "elastic" }]
"""


def test_a_run_without_recovery_ends_with_its_cause_and_every_completed_step_on_disk(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(SWEEP))
    sweep = sweep_mod.load(path)
    ThreadSubstrate().check(ThreadSubstrate().runs(sweep))  # no longer refused
    runs = run_sweep(sweep, tmp_path / "out", log=io.StringIO(), substrate=ThreadSubstrate()).set_index(
        "recovery_mode")
    steps = dataset.read_steps(tmp_path / "out")
    ended = runs.loc["none"]
    assert ended["status"] == "failed" and "rank(s) [1] failed during step 3" in ended["error"]
    assert "recovery.mode = 'none'" in ended["error"]
    assert ended["completed_steps"] == 3 and pd.isna(ended["time_to_step_s"])
    kept = steps[steps["run_id"] == ended["run_id"]]
    assert sorted(set(kept["step"])) == [0, 1, 2] and len(kept) == 12  # every completed step, every rank
    went_on = runs.loc["elastic"]
    assert went_on["status"] == "ok" and went_on["completed_steps"] == 6
    assert len(steps[steps["run_id"] == went_on["run_id"]]) == 3 * 4 + 3 * 3


def test_settings_the_thread_substrate_cannot_recover_are_refused_before_work():
    wrapped = RunSpec(strategy="ring", compression="topk", failures={"schedule": [[2, 1]]},
                      recovery={"mode": "elastic"}, **BASE)
    problems = ThreadSubstrate().problems(Run(wrapped.run_id, wrapped))
    assert any("keeps state outside the model" in p for p in problems), problems
    server = spec_of("parameter_server", [(2, 4)], mode="checkpoint_restart", checkpoint_every=2)
    assert ThreadSubstrate().problems(Run(server.run_id, server)) == []  # a server's failure: sweep_outages.py


def test_simgrid_sweeps_refuse_failures_with_their_reason():
    """(Ray sweeps apply them: tests/experiments/test_sweep_faults_ray.py.)"""
    from experiments.simulate.substrate import SimGridSubstrate

    spec = spec_of("ring", [(2, 1)], mode="elastic")
    simgrid = Substrate.problems(SimGridSubstrate([]), Run(spec.run_id, spec))
    assert any("cannot be applied on the simgrid substrate (SimGrid 3.32's Python binding cannot turn a host off"
               in p for p in simgrid), simgrid
    assert all("--substrate threads" in p for p in simgrid if "failures" in p)


def test_an_mtbf_kills_a_slot_once_its_exponential_time_has_come_and_draws_its_replacement_s():
    spec = RunSpec(strategy="ring", failures={"mtbf_s": 10.0, "seed": 3}, recovery={"mode": "elastic"}, **BASE)
    run = SweepSegments(spec)
    draws = {slot: np.random.default_rng([3, slot, 39]) for slot in range(4)}
    first = {slot: rng.exponential(10.0) for slot, rng in draws.items()}
    assert run.due == pytest.approx(first)  # seeded per slot: the same draws every time
    slot = min(first, key=first.get)
    now = [first[slot] - 1e-6]
    run.clock = lambda: run.began + now[0]
    assert not any(run.dies(s, 3) for s in range(4))  # no slot's time has come
    now[0] = first[slot] + 1e-6
    assert run.dies(slot, 3) and run.pending == [Failure(3, slot)]
    assert run.due[slot] == pytest.approx(now[0] + draws[slot].exponential(10.0))  # the replacement's clock
    assert not run.dies(slot, 4)


def test_a_restart_on_real_data_resumes_its_shards_and_times_its_target_on_the_run_clock():
    """digits: each shard's position in its epoch goes with the checkpoint (a restart that forgot it would train
    on other batches); the target is met at the first evaluation, step 3, which the restart redid."""
    spec = RunSpec(strategy="ring", dataset="digits", failures={"schedule": [[3, 1]]},
                   recovery={"mode": "checkpoint_restart", "checkpoint_every": 2}, target={"metric": "loss",
                                                                                             "value": 1e9},
                   eval_every=4, **{**BASE, "image_size": 8})
    clean = SweepSegments(spec, schedule=[]).run()
    row, steps, _ = execute(spec, META)
    assert row["status"] == "ok", row["error"]
    assert (row["steps_lost"], row["steps_run"]) == (1, 7)
    restarted = SweepSegments(spec).run()
    for slot in range(4):
        assert torch.equal(torch.as_tensor(restarted.params[slot]), torch.as_tensor(clean.params[slot]))
    assert row["target_reached"] and row["steps_to_target"] == 4
    redone = pd.DataFrame(steps).query("role == 'worker' and step == 3")["wall_s"].max()
    assert row["time_to_target_s"] == redone and redone > row["detection_s"] + row["recovery_s"]


def test_survivors_stands_for_each_familys_own_mode_and_is_refused_where_there_is_none(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(SWEEP).replace('recovery = [{ mode = "none" }, { mode = "elastic" }]',
                                                   'recovery = [{ mode = "survivors" }]\n'
                                                   'strategy = ["ring", "halving_doubling", "parameter_server", '
                                                   '"decentralized"]').replace('strategy = "ring"\n', ""))
    modes = {run.strategy: run.recovery["mode"] for run in sweep_mod.load(path).runs}
    assert modes == {"ring": "elastic", "halving_doubling": "elastic", "parameter_server": "ps_shrink",
                     "decentralized": "reweight"}
    path.write_text(path.read_text().replace('"decentralized"]', '"hierarchical"]'))
    with pytest.raises(sweep_mod.SweepError, match="recovery.mode = 'survivors' with strategy 'hierarchical'"):
        sweep_mod.load(path)
