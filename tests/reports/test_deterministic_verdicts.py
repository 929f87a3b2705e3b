"""Certainty stated truly for simulated runs: SimGrid is deterministic (the same platform and timeline give the same
numbers on every seed), so a simulated lead is a lead and a tie only inside the stated tolerance
(verdicts.SIMULATED_TIE = 1%), never "not distinguishable" with advice to add seeds; the summary names the simulated
platform instead of this machine's cores; a synthetic profile is never called measured. Every expected value is
worked out in its comment."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.results import schema
from reports import load, ps, sections, tables, verdicts
from reports.page import ENV

GBIT = 125e6


def _run(run_id: str, strategy: str, throughput: float, *, seed: int = 0, substrate: str = "simgrid",
         workers: int = 4, **extra) -> dict:
    """A 4-worker run of 32 samples per worker (128 per step) on 1 Gbit/s: simulated on a star platform with
    SimGrid's tcp model, or measured (substrate ray) on the python-emulated link."""
    simulated = substrate == "simgrid"
    step_s = workers * 32 / throughput
    values = dict(
        run_id=run_id, sweep="certainty", substrate=substrate, workload="resnet50", image_size=224, batch_size=32,
        steps=10, warmup_steps=2, device="cpu", seed=seed, lr=0.1, strategy=strategy, workers=workers, servers=0,
        bytes_counted=True, link_bandwidth=GBIT, link_latency_s=5e-6, link_emulation="" if simulated else "python",
        straggler_slowdown=1.0, compute="fixed" if simulated else "real", status="ok", throughput=throughput,
        step_time_s=step_s, compute_s=step_s / 2, comm_s=step_s / 2, comm_fraction=0.5, exposed_comm_s=step_s / 2,
        bytes_sent_per_worker=1e6, bytes_recv_per_worker=1e6, analytic_bytes_sent_per_worker=1e6,
        analytic_rounds=6.0, analytic_path_bytes=1.5e6, numel=250_000, model_bytes=1_000_000, final_loss=math.nan,
        param_norm=math.nan, transport="simgrid" if simulated else "gloo", cores=0 if simulated else 64, gpu="",
        host="simhost", started_at="2026-01-01T00:00:00", duration_s=1.0)
    if simulated:
        values |= dict(sim_topology="star", sim_network_model="tcp", sim_nic="shared", compute_source="fixed")
    return schema.row(schema.RUNS, **(values | extra))


def _load(tmp_path, rows: list[dict]) -> pd.DataFrame:
    schema.conform(pd.DataFrame(rows), schema.RUNS).to_parquet(tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return runs[runs["ok"]]


def _best(ok):
    return verdicts.best_strategies(ok, load.link_order(ok))


@pytest.mark.parametrize("ring, other, lead", [
    (159.0, 100.0, 1.59),   # a 59% lead: one simulated run each is the answer, a lead
    (1300.0, 100.0, 13.0),  # a 13x lead
])
def test_a_simulated_lead_of_one_run_each_is_a_lead_without_advice_to_add_seeds(tmp_path, ring, other, lead):
    ok = _load(tmp_path, [_run("r", "ring", ring), _run("h", "halving_doubling", other)])
    best = _best(ok)
    row = best.iloc[0]
    assert row["verdict"] == "clear" and row["best strategy"] == "ring [simulated]"
    assert row["interval samples/s"] == "simulated: deterministic"
    [sentence] = verdicts.verdicts(best)
    assert f": use ring [simulated], ring [simulated] {ring:,.1f} samples/s (simulated: deterministic) against " \
           f"halving_doubling [simulated] {other:,.1f} samples/s (simulated: deterministic) for the next best, " \
           f"{lead:.2f}x" in sentence, sentence
    assert "A simulated lead: deterministic, no sampling interval (a tie only under 1%)." in sentence
    assert "tie" not in sentence.split("(a tie only")[0] and "seed" not in sentence and "repeat" not in sentence


def test_a_simulated_tie_is_only_inside_the_stated_tolerance(tmp_path):
    """100.9 against 100.0 is a 0.9% lead, under the 1% tolerance: a tie that says so. 101.0 against 100.0 is
    exactly 1%: still a tie (the lead must exceed it). 101.5 against 100.0 (1.5%) leads."""
    for ring, verdict in ((100.9, "tie"), (101.0, "tie"), (101.5, "clear")):
        ok = _load(tmp_path, [_run("r", "ring", ring), _run("h", "halving_doubling", 100.0)])
        best = _best(ok)
        assert best.iloc[0]["verdict"] == verdict, ring
        [sentence] = verdicts.verdicts(best)
        if verdict == "tie":
            assert "tie within the stated 1% tolerance" in sentence, sentence
            assert f"a lead of {(ring / 100 - 1) * 100:.2f}%" in sentence, sentence
            assert "not distinguishable" not in sentence and "seed" not in sentence and "repeat" not in sentence


def test_seeds_of_a_simulation_change_nothing_and_per_step_spread_is_no_sampling_interval(tmp_path):
    """Three seeds of a simulated ring at 106 samples/s against halving-doubling's one at 100 (6%): a lead; the
    measured rule would have needed two runs each and apart intervals. A simulated run's throughput_step_lo/hi
    (from steps that differ, e.g. a first bucket's pipeline fill) do not widen it into a tie: 90-130 would
    overlap 100."""
    rows = [_run(f"r{s}", "ring", 106.0, seed=s) for s in range(3)] + [_run("h", "halving_doubling", 100.0)]
    ok = _load(tmp_path, rows)
    ok = load.with_step_intervals(ok, None).assign(throughput_step_lo=[90.0] * 3 + [100.0],
                                                   throughput_step_hi=[130.0] * 3 + [100.0])
    best = _best(ok)
    assert best.iloc[0]["verdict"] == "clear" and best.iloc[0]["runs"] == 3


def test_measured_runs_keep_the_sampling_rule(tmp_path):
    """The same 59% lead measured once each (python-emulated link): one run each is a tie, and says why."""
    ok = _load(tmp_path, [_run("r", "ring", 159.0, substrate="ray"),
                          _run("h", "halving_doubling", 100.0, substrate="ray")])
    best = _best(ok)
    assert best.iloc[0]["verdict"] == "tie"
    [sentence] = verdicts.verdicts(best)
    assert "tie, not distinguishable" in sentence and "one run each" in sentence


def test_the_parameter_server_verdict_uses_the_same_rule_when_simulated(tmp_path):
    """A simulated PS at 59 samples/s against ring's 100 (ring 1.69x): no PS configuration wins, a simulated lead;
    at 100.5 against 100 (0.5%): a tie within the 1% tolerance, with the ratio 1.005."""
    def rows(ps_throughput):
        return [_run("r", "ring", 100.0),
                _run("p", "parameter_server", ps_throughput, servers=1, param_servers=1, param_placement="dedicated")]

    [sentence] = ps.ps_verdicts(_load(tmp_path, rows(59.0)))
    assert "no PS configuration wins: ring [simulated] is 1.69x the best one" in sentence, sentence
    assert "a simulated lead (deterministic: no sampling interval, a tie only under 1%)" in sentence
    [sentence] = ps.ps_verdicts(_load(tmp_path, rows(100.5)))
    assert "tie within the stated 1% tolerance" in sentence and "1.005x" in sentence, sentence
    assert "one run each" not in sentence


def _summary(ok_rows, tmp_path):
    ok = _load(tmp_path, ok_rows)
    return sections.summary(sections.Results(runs=ok, ok=ok, steps=None, sweep_text=None,
                                             links=load.link_order(ok)))


def test_a_simulated_report_names_its_platform_not_this_machines_cores(tmp_path):
    body = _summary([_run("r", "ring", 159.0), _run("h", "halving_doubling", 100.0)], tmp_path)
    assert body["machine"] is None
    assert body["simulated"] == "star, 1Gbit 5us (SimGrid tcp network model, fixed compute times)"
    html = ENV.get_template("sections/summary.html.j2").render(**body)
    assert "CPU cores" not in html and "Simulated platform:" in html
    # measured and simulated runs in one results directory: the machine is the measured runs'
    body = _summary([_run("r", "ring", 159.0), _run("m", "ring", 150.0, substrate="ray")], tmp_path)
    assert body["machine"]["cores"] == "64" and body["simulated"]


def test_a_synthetic_profile_is_called_synthetic_never_measured(tmp_path):
    """One run replayed a measured profile, one a synthetic one; a third, written before profile_synthetic existed,
    is known synthetic by its id's source ('-synthetic-', workloads/profile.py Profile.id)."""
    common = dict(substrate="ray", compute="profile")
    rows = [_run("a", "ring", 100.0, **common, profile_id="resnet50-b32-s224-cuda-1234abcd", profile_device="A100"),
            _run("b", "ring", 100.0, seed=1, **common, profile_id="resnet50-b32-s224-synthetic-5678abcd",
                 profile_device="synthetic: H100", profile_synthetic=True)]
    old = _run("c", "ring", 100.0, seed=2, **common, profile_id="resnet50-b32-s224-synthetic-9999abcd",
               profile_device="synthetic: H100")
    del old["profile_synthetic"]
    ok = _load(tmp_path, rows + [old])
    assert list(ok["profile_synthetic"]) == [False, True, True]
    r = sections.Results(runs=ok, ok=ok, steps=None, sweep_text=None, links=load.link_order(ok))
    [text] = [t for title, t in sections.warnings(r) if title == "Replayed compute:"]
    assert "1 replayed a measured compute profile (resnet50-b32-s224-cuda-1234abcd (A100))" in text, text
    assert "2 replayed a SYNTHETIC compute profile (described by a user, not measured)" in text, text
    [(ts, how)] = tables.compute_time_per_workload(ok[ok["profile_synthetic"]]).values()
    assert how == ("median compute time of the 4-worker runs, replayed from a SYNTHETIC profile (described, not "
                   "measured)")
