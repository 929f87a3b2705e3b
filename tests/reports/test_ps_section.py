"""The "Parameter server vs allreduce" section (issue 22.6) on small hand-made results in the results schema: the
BytePS formula column against hand-computed values, the verdict's winner with its ratio, a tie inside the spread,
the straggler table's idle fraction, and a sweep without PS runs listing the section as absent."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from experiments.results import schema
from reports import load, ps
from reports.page import build
from reports.sections import Absent, Results, parameter_server

MODEL_BYTES = 44_700_000  # ResNet-18's 44.7 MB of gradients
GBIT = 125e6  # 1 Gbit/s in bytes per second


def _run(run_id: str, strategy: str, throughput: float, *, seed: int = 0, comm_s: float = 0.5, workers: int = 4,
         slowdown: float = 1.0, **params) -> dict:
    batch, compute_s = 32, 0.2
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="ps", substrate="ray", workload="resnet18", image_size=32,
        batch_size=batch, steps=10, warmup_steps=2, device="cpu", seed=seed, lr=0.1, strategy=strategy,
        **{f"param_{k}": v for k, v in params.items()},
        workers=workers, servers=params.get("servers", 0) if params.get("placement") != "colocated" else 0,
        bytes_counted=True, link_bandwidth=GBIT, link_latency_s=0.0, link_emulation="python",
        straggler_ranks=[1] if slowdown != 1.0 else [], straggler_slowdown=slowdown, compute="profile",
        status="ok", throughput=throughput, step_time_s=workers * batch / throughput, compute_s=compute_s,
        comm_s=comm_s, comm_fraction=comm_s / (compute_s + comm_s), exposed_comm_s=comm_s,
        numel=MODEL_BYTES // 4, model_bytes=MODEL_BYTES, final_loss=1.0, param_norm=1.0, transport="gloo",
        cores=64, gpu="", host="h", started_at="2026-01-01T00:00:00", duration_s=1.0)


def _ps(run_id: str, throughput: float, **kw) -> dict:
    params = {"servers": 4, "placement": "dedicated", "mode": "update", "partition_mb": 4.0, "staleness": 0,
              "backups": 0}
    params |= {k: kw.pop(k) for k in list(kw) if k in params}
    return _run(run_id, "parameter_server", throughput, **params, **kw)


def _results(tmp_path, rows: list[dict], steps: list[dict] | None = None) -> Results:
    # typed by the strategy's declaration (staleness: int | str), as the runner writes it
    pq.write_table(schema.to_arrow(rows, schema.RUNS), tmp_path / "runs.parquet")
    if steps:
        pq.write_table(schema.to_arrow(steps, schema.STEPS), tmp_path / "steps.parquet")
    runs = load.load_runs(tmp_path)
    return Results(runs=runs, ok=runs[runs["ok"]], steps=load.load_steps(tmp_path) if steps else None,
                   sweep_text=None, links=load.link_order(runs))


def test_the_formula_column_is_bytepss_optimum_by_hand(tmp_path):
    """n = 4, M = 44.7 MB, B = 125 MB/s: t = 2 n (n-1) M / ((n^2 + k n - 2k) B) = 24 M / ((16 + 4k - 2k) B).
    k = 4 dedicated: 24 x 44.7 / (24 x 125) = 0.3576 s (M/B). k = 1: 24 x 44.7 / (18 x 125) = 0.4768 s.
    k = 2: 24 x 44.7 / (20 x 125) = 0.42912 s. Colocated servers bring no NIC (k = 0): 6 x 44.7 / (4 x 125) =
    0.5364 s, a ring's bound. Measured / formula for k = 4 at 0.4 s: 0.4 / 0.3576; PS / ring at 0.6 s: 0.4 / 0.6."""
    r = _results(tmp_path, [_run("ring", "ring", 100.0, comm_s=0.6),
                            _ps("k4", 120.0, comm_s=0.4), _ps("k1", 80.0, servers=1, comm_s=1.5),
                            _ps("k2", 90.0, servers=2, comm_s=0.9),
                            _ps("c4", 95.0, placement="colocated", mode="summation", comm_s=0.62)])
    comm = ps.comm_frame(r.ok).set_index(["k", "placement"])
    assert comm.loc[(4, "dedicated"), "BytePS formula s"] == pytest.approx(0.3576, abs=1e-12)
    assert comm.loc[(1, "dedicated"), "BytePS formula s"] == pytest.approx(0.4768, abs=1e-12)
    assert comm.loc[(2, "dedicated"), "BytePS formula s"] == pytest.approx(0.42912, abs=1e-12)
    assert comm.loc[(4, "colocated"), "BytePS formula s"] == pytest.approx(0.5364, abs=1e-12)
    assert comm.loc[(4, "colocated"), "mode"] == "summation"
    assert comm.loc[(4, "dedicated"), "measured / formula"] == pytest.approx(0.4 / 0.3576)
    assert comm.loc[(4, "dedicated"), "PS / allreduce"] == pytest.approx(0.4 / 0.6)
    assert set(comm["allreduce"]) == {"ring"}


def test_a_ps_faster_than_ring_beyond_the_spread_is_named_with_its_ratio(tmp_path):
    """Ring 100 and 102 samples/s (mean 101), PS k = 4 150 and 152 (mean 151): 151 > 102 outside the spread;
    151 / 101 = 1.495 -> '1.50x'. The slower PS (k = 1) is not the one named."""
    rows = [_run(f"ring-{s}", "ring", t, seed=s) for s, t in enumerate([100.0, 102.0])]
    rows += [_ps(f"k4-{s}", t, seed=s) for s, t in enumerate([150.0, 152.0])]
    rows += [_ps(f"k1-{s}", t, seed=s, servers=1) for s, t in enumerate([60.0, 62.0])]
    (line,) = ps.ps_verdicts(_results(tmp_path, rows).ok)
    assert "the parameter server wins" in line
    assert "1.50x" in line and "servers=4" in line and "servers=1" not in line
    assert "150.0-152.0" in line and "100.0-102.0" in line


def test_a_lead_inside_the_spread_is_a_tie_and_ring_ahead_is_said(tmp_path):
    """PS 100 and 104 (mean 102) vs ring 101 and 103 (mean 102): the ranges overlap -> tie. Ring 200/202 against
    PS 100/102: ring's lowest beats the PS's highest -> no PS configuration wins, ring 201 / 101 = 1.99x."""
    rows = [_run(f"ring-{s}", "ring", t, seed=s) for s, t in enumerate([101.0, 103.0])]
    rows += [_ps(f"k4-{s}", t, seed=s) for s, t in enumerate([100.0, 104.0])]
    (line,) = ps.ps_verdicts(_results(tmp_path, rows).ok)
    assert "tie, not distinguishable" in line and "inside the spread" in line

    rows = [_run(f"ring-{s}", "ring", t, seed=s) for s, t in enumerate([200.0, 202.0])]
    rows += [_ps(f"k4-{s}", t, seed=s) for s, t in enumerate([100.0, 102.0])]
    (line,) = ps.ps_verdicts(_results(tmp_path, rows).ok)
    assert "no PS configuration wins" in line and "1.99x" in line


def _steps(run_id: str, workers: int, compute: list[float], comm: list[float], server: dict | None = None):
    out = []
    for step in range(4):
        for rank in range(workers):
            out.append(schema.row(schema.STEPS, run_id=run_id, step=step, rank=rank, role="worker", timed=step >= 2,
                                  compute_s=compute[rank], comm_s=comm[rank], samples=32))
        if server:
            out.append(schema.row(schema.STEPS, run_id=run_id, step=step, rank=workers, role="server",
                                  timed=step >= 2, samples=0, **server))
    return out


def test_with_a_straggler_the_schemes_get_samples_per_second_and_idle_fraction(tmp_path):
    """Rank 1 3x slower (0.6 s of compute, the others 0.2 s). Synchronous: the others wait 0.5 s, the straggler
    0.1 s: idle = (3 x 0.5 + 0.1) / (3 x 0.7 + 0.7) = 1.6 / 2.8 = 57.1%. SSP s=2: the others wait 0.1 s:
    idle = (0.3 + 0.1) / (3 x 0.3 + 0.7) = 0.4 / 1.6 = 25%; its server held 0.05 s per step at the bound and
    applied gradients of staleness 0, 1, 2 (mean 1, max 2)."""
    rows = [_ps("sync", 120.0, slowdown=3.0), _ps("ssp", 200.0, staleness=2, slowdown=3.0),
            _ps("async", 210.0, staleness="async", slowdown=3.0), _ps("b1", 190.0, backups=1, slowdown=3.0),
            _run("ring", "ring", 110.0, slowdown=3.0)]
    rows[3]["fast_step_s"] = 0.3  # backups: the fast workers' pace beside the slowest rank's 128 / 190 = 0.674 s
    steps = (_steps("sync", 4, [0.2, 0.6, 0.2, 0.2], [0.5, 0.1, 0.5, 0.5])
             + _steps("ssp", 4, [0.2, 0.6, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1],
                      {"bound_wait_s": 0.05, "staleness": [0, 1, 2], "dropped_pushes": 0}))
    r = _results(tmp_path, rows, steps)
    slow = ps.straggler_frame(r.ok, r.steps).set_index("scheme")
    assert set(slow.index) == {"synchronous", "SSP s=2", "async", "backups b=1", "allreduce"}
    assert slow.loc["synchronous", "workers idle %"] == pytest.approx(1.6 / 2.8 * 100)
    assert slow.loc["SSP s=2", "workers idle %"] == pytest.approx(25.0)
    assert slow.loc["SSP s=2", "held at bound s/step"] == pytest.approx(0.05)
    assert (slow.loc["SSP s=2", "staleness mean"], slow.loc["SSP s=2", "staleness max"]) == (1.0, 2.0)
    assert math.isnan(slow.loc["async", "workers idle %"])  # no steps recorded for it
    assert slow.loc["backups b=1", "slowest rank s/step"] == pytest.approx(128 / 190)
    assert slow.loc["backups b=1", "fastest worker s/step"] == pytest.approx(0.3)
    assert math.isnan(slow.loc["synchronous", "fastest worker s/step"])  # a barrier: one pace, the slowest rank's


def test_no_ps_runs_lists_the_section_as_absent(tmp_path):
    r = _results(tmp_path, [_run("ring", "ring", 100.0), _run("hd", "halving_doubling", 101.0)])
    assert isinstance(parameter_server(r), Absent)
    html = build(tmp_path).read_text()
    absent = html[html.index('<section id="not-in-this-sweep">'):]
    assert '<section id="parameter-server">' not in html
    assert "Parameter server vs allreduce" in absent


def test_the_page_shows_the_section(tmp_path):
    rows = [_run(f"ring-{s}", "ring", t, seed=s, comm_s=0.6) for s, t in enumerate([100.0, 102.0])]
    rows += [_ps(f"k4-{s}", t, seed=s, comm_s=0.4) for s, t in enumerate([150.0, 152.0])]
    rows += [_ps("ssp", 200.0, staleness=2, slowdown=3.0), _run("ring-slow", "ring", 90.0, slowdown=3.0)]
    _results(tmp_path, rows)
    html = build(tmp_path).read_text()
    section = html[html.index('<section id="parameter-server">'):]
    section = section[:section.index("</section>")]
    assert "0.3576" in section and "the parameter server wins" in section and "SSP s=2" in section
