"""Links down and servers failing in a sweep's training on thread ranks (experiments/pipeline/sweep_outages.py).

Hand-worked expectations: an outage stalls the step it falls in by at least its seconds and loses nothing (the
parameters are the run's without it, bit for bit); an outage its peers time out on is the rank failing at that
step (the same parameters, steps and steps lost as the run with that rank's scheduled failure); a server failing
under checkpoint_restart loses the steps since the last checkpoint and ends on the failure-free training's
parameters.
"""

from __future__ import annotations

import textwrap

import pandas as pd
import pytest
import torch

from experiments.config import sweep as sweep_mod
from experiments.config.sweep import RunSpec, SweepError
from experiments.pipeline.sweep_faults import SweepSegments, execute, needs_outage_segments
from experiments.pipeline.sweep_outages import SweepOutages, segments_for
from experiments.pipeline.train import train
from strategies.faults import FAILURE, STALL
from strategies.transport.threads import run_threads

BASE = dict(workload="tiny", image_size=16, batch_size=8, steps=5, warmup_steps=1, workers=4, lr=0.05,
            momentum=0.9)
META = {"started_at": "2026-01-01T00:00:00+00:00", "transport": "threads", "gpu": "", "cores": 2, "host": "test",
        "substrate": "threads"}


def params_of(segments) -> list[torch.Tensor]:
    return [torch.as_tensor(segments.params[slot].numpy()) for slot in sorted(segments.alive)]


def failure_free(strategy: str) -> list[torch.Tensor]:
    """The sweep's training without failures or outages (train(), not the segments)."""
    spec = RunSpec(strategy=strategy, timeout=60, **BASE)

    def body(comm):
        from types import SimpleNamespace

        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        train(ctx, spec)
        return ctx.state.get("params")

    return run_threads(spec.world_size(), body, timeout=60)[:spec.workers]


@pytest.mark.parametrize("strategy, link", [("ring", 2), ("parameter_server", 4)])  # rank 4: the server
def test_an_outage_stalls_its_step_by_its_seconds_and_loses_nothing(strategy, link):
    seconds = 0.4
    spec = RunSpec(strategy=strategy, failures={"outages": [[2, link, seconds]]}, timeout=60, **BASE)
    assert needs_outage_segments(spec)
    segments = SweepOutages(spec)
    row, steps, _ = execute(spec, META, segments)
    assert row["status"] == "ok", row["error"]
    assert (row["outage_count"], row["outage_failures"], row["failure_count"]) == (1, 0, 0)
    assert row["failure_setting"] == f"rank {link}'s link down 0.4 s at step 2"
    [record] = segments.out_outages
    assert (record.step, record.rank, record.outcome) == (2, link, STALL)
    workers = pd.DataFrame(steps).query("role == 'worker'")
    ends = workers.groupby("step")["wall_s"].max()
    assert ends[2] - ends[1] >= seconds  # the link went down after step 1 ended; step 2 ended after it came up
    waits = workers.query("step == 2").set_index("rank")
    assert (waits["comm_s"] + waits["compute_s"] >= seconds / 2).all(), waits  # every rank waited on the link
    for mine, clean in zip(params_of(segments), failure_free(strategy), strict=True):
        assert torch.equal(mine, clean)  # an outage loses no data


@pytest.mark.parametrize("mode", ["elastic", "checkpoint_restart"])
def test_an_outage_past_the_timeout_is_the_rank_failing_at_its_step(mode):
    recovery = {"mode": mode, "checkpoint_every": 2 if mode == "checkpoint_restart" else 0, "rejoin_steps": None}
    spec = RunSpec(strategy="ring", failures={"outages": [[3, 2, 2.5]]}, recovery=recovery, timeout=2, **BASE)
    segments = SweepOutages(spec)
    assert segments.bound_extra_s == 2.0  # the whole run's bound grows by the wait before the peers give up
    segments.bound_extra_s = 30.0  # not under test here: the loaded machine's model building must not end the run
    run = segments.run()
    [record] = segments.out_outages
    assert (record.step, record.rank, record.outcome) == (3, 2, FAILURE)
    assert "timed out after 2 s" in record.error  # a wait on rank 2, or on a ring peer waiting on it
    scheduled = SweepSegments(RunSpec(strategy="ring", failures={"schedule": [[3, 2]]}, recovery=recovery,
                                      timeout=60, **BASE))
    reference = scheduled.run()
    lost = 1 if mode == "checkpoint_restart" else 0  # checkpoints at 0, 2, 4: step 2 redone
    assert [(f.step, f.rank, f.steps_lost) for f in run.failures] == [(3, 2, lost)]
    assert (run.completed_steps, run.steps_run, run.ended) == (5, 5 + lost, None)
    assert [(f.step, f.rank, f.steps_lost) for f in reference.failures] == [(3, 2, lost)]
    assert reference.steps_run == run.steps_run
    for mine, theirs in zip(params_of(segments), params_of(scheduled), strict=True):
        assert torch.equal(mine, theirs)


@pytest.mark.parametrize("step, every, lost", [(3, 2, 1), (3, 4, 3)])
def test_a_server_failure_restarts_every_rank_and_the_servers_from_the_last_checkpoint(step, every, lost):
    """Server rank 4 (after 4 workers) dies in `step`; checkpoints every `every` steps: the last at step
    every x floor(step / every), so the steps since it are lost (at 4: none taken but the start's, the servers
    rebuilt from the seed)."""
    recovery = {"mode": "checkpoint_restart", "checkpoint_every": every, "rejoin_steps": None}
    spec = RunSpec(strategy="parameter_server", failures={"schedule": [[step, 4]]}, recovery=recovery, timeout=60,
                   **BASE)
    assert needs_outage_segments(spec)
    segments = SweepOutages(spec)
    row, _, _ = execute(spec, META, segments)
    assert row["status"] == "ok", row["error"]
    assert (row["failure_steps"], row["failure_ranks"], row["steps_lost"]) == ((step,), (4,), lost)
    assert (row["completed_steps"], row["steps_run"]) == (5, 5 + lost)
    assert row["failure_setting"] == f"rank 4 at step {step}"
    for mine, clean in zip(params_of(segments), failure_free("parameter_server"), strict=True):
        assert torch.equal(mine, clean)


def test_a_server_failure_without_recovery_ends_the_run_with_its_cause():
    spec = RunSpec(strategy="parameter_server", failures={"schedule": [[2, 4]]}, timeout=60, **BASE)
    with pytest.raises(ValueError, match="a server failing run on"):
        execute(spec, META)  # SweepSegments alone would not fail the server
    row, steps, _ = execute(spec, META, segments_for(spec))
    assert row["status"] == "failed" and "rank(s) [4] failed during step 2" in row["error"], row["error"]
    assert row["completed_steps"] == 2
    assert sorted(set(pd.DataFrame(steps).query("role == 'worker'")["step"])) == [0, 1]


SWEEP = """
name = "links"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 4
warmup_steps = 1
workers = 4
strategy = "parameter_server"
"""


@pytest.mark.parametrize("lines, fragment", [
    ('failures = { schedule = [{ rank = 4, step = 1 }] }\nrecovery = { mode = "ps_shrink", replicas = 1 }\n',
     "recovery.replicas = 1: chain-replicated servers run on the failure harness"),
    ('failures = { schedule = [{ rank = 4, step = 1 }] }\nrecovery = { mode = "ps_shrink" }\n',
     "server rank 4 at step 1"),
    ("failures = { schedule = [{ link = 5, step = 1, seconds = 1 }] }\n",
     "link outage link = 5: the run has ranks 0..3 (servers 4..4)"),
    ("failures = { schedule = [{ link = 1, step = 4, seconds = 1 }] }\n", "link outage step = 4"),
    ("failures = { schedule = [{ link = 1, step = 1, seconds = -1 }] }\n", "link outage seconds = -1"),
])
def test_settings_are_checked_before_work(tmp_path, lines, fragment):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(SWEEP + lines))
    with pytest.raises(SweepError) as info:
        sweep_mod.load(path)
    assert fragment in str(info.value), str(info.value)


def test_two_servers_several_buckets_one_link_down_and_the_other_server_failing():
    """3 workers, 2 servers (ranks 3 and 4), buckets and partitions of a few KB: server 0's link down 0.3 s in step
    2 (a stall), server 1 failing in step 3 with checkpoints every 2 (step 2 lost): the failure-free parameters."""
    base = {**BASE, "workers": 3, "bucket_mb": 0.01}
    recovery = {"mode": "checkpoint_restart", "checkpoint_every": 2, "rejoin_steps": None}
    spec = RunSpec(strategy="parameter_server", strategy_params={"servers": 2, "partition_mb": 0.005},
                   failures={"schedule": [[3, 4]], "outages": [[2, 3, 0.3]]}, recovery=recovery, timeout=60, **base)
    segments = SweepOutages(spec)
    run = segments.run()
    assert [(f.step, f.rank, f.steps_lost) for f in run.failures] == [(3, 4, 1)]
    assert (run.completed_steps, run.steps_run) == (5, 6)
    [record] = segments.out_outages
    assert (record.step, record.rank, record.outcome) == (2, 3, STALL) and record.held_s > 0
    clean = SweepSegments(spec, schedule=[])  # the same run, nothing failing
    clean.run()
    for mine, theirs in zip(params_of(segments), params_of(clean), strict=True):
        assert torch.equal(mine, theirs)
