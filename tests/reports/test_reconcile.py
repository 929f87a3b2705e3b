"""The report reconciles: for every configuration, the model, SimGrid (alpha_beta, tcp) and the measurements
(emulated, kernel-shaped links) side by side, the one trusted by the stated rule and how far each other is from it;
an extrapolated figure says the range it was fitted on and how far beyond it goes. Every expected value is worked
out in its comment."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.results import schema
from reports import calibration, load, reconcile, sections

NUMEL = 1_000_000  # 4 MB of float32 gradients
GBIT = 125e6
# ring at 4 workers: 2 (n - 1) = 6 rounds, 2 (n - 1) / n x 4 MB = 6 MB on the critical path; on 1 Gbit/s (125e6
# bytes/s) with 5 us of latency: 6 x 5e-6 + 6e6 / 125e6 = 0.00003 + 0.048 = 0.04803 s
MODEL_S = 6 * 5e-6 + 6e6 / GBIT


def _run(run_id: str, comm_s: float, *, kind: str = "emulated", workers: int = 4, **extra) -> dict:
    simulated = kind in ("tcp", "alpha_beta")
    values = dict(
        run_id=run_id, sweep="reconcile", substrate="simgrid" if simulated else "ray", workload="tiny",
        image_size=16, batch_size=32, steps=10, warmup_steps=2, device="cpu", seed=0, lr=0.1, strategy="ring",
        workers=workers, servers=0, bytes_counted=True, link_bandwidth=GBIT, link_latency_s=5e-6,
        link_emulation="" if simulated else ("kernel" if kind == "kernel" else "python"), straggler_slowdown=1.0,
        compute="fixed" if simulated else "real", status="ok", throughput=100.0, step_time_s=0.2 + comm_s,
        compute_s=0.2, comm_s=comm_s, comm_fraction=0.2, exposed_comm_s=comm_s, bytes_sent_per_worker=6e6,
        bytes_recv_per_worker=6e6, analytic_bytes_sent_per_worker=6e6, analytic_rounds=6.0, analytic_path_bytes=6e6,
        numel=NUMEL, model_bytes=4 * NUMEL, final_loss=1.0, param_norm=1.0,
        transport="simgrid" if simulated else "gloo", cores=0 if simulated else 64, gpu="", host="h",
        started_at="2026-01-01T00:00:00", duration_s=1.0)
    if simulated:
        values |= dict(sim_topology="star", sim_network_model=kind, sim_nic="shared", compute_source="fixed")
    return schema.row(schema.RUNS, **(values | extra))


def _ok(tmp_path, rows) -> pd.DataFrame:
    schema.conform(pd.DataFrame(rows), schema.RUNS).to_parquet(tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return runs[runs["ok"]]


def test_the_models_price_is_the_strategys_traffic_on_the_link(tmp_path):
    run = _ok(tmp_path, [_run("x", 0.05)]).iloc[0]
    assert reconcile.model_comm_s(run) == (pytest.approx(MODEL_S), "")


def test_every_source_side_by_side_and_the_most_trusted_one_decides(tmp_path):
    """Kernel 60 ms, emulated 55 (two repeats: 50 and 60), SimGrid tcp 52, alpha_beta 48.03, the model 48.03 ms:
    trusted is the kernel-shaped measurement; the others as multiples of it: 55 / 60 = 0.92x, 52 / 60 = 0.87x,
    48.03 / 60 = 0.80x; spread = 60 / 48.03 = 1.249."""
    ok = _ok(tmp_path, [_run("k", 0.060, kind="kernel"), _run("e0", 0.050), _run("e1", 0.060, seed=1),
                        _run("t", 0.052, kind="tcp"), _run("a", MODEL_S, kind="alpha_beta")])
    frame = reconcile.reconcile_frame(ok)
    assert len(frame) == 1  # one configuration, five sources
    row = frame.iloc[0]
    assert row["configuration"] == "ring" and row["platform"] == "one NIC per rank" and row["sources"] == 5
    assert row["trusted"] == "measured, kernel links"
    assert row["measured, emulated links ms"] == pytest.approx(55.0)
    assert row["model ms"] == pytest.approx(MODEL_S * 1e3)
    assert row["others / trusted"] == ("measured, emulated links 0.92x; SimGrid tcp 0.87x; SimGrid alpha_beta "
                                       "0.80x; model 0.80x")
    assert row["spread"] == pytest.approx(0.060 / MODEL_S)
    [sentence] = reconcile.disagreements(frame)  # 1.25x > 1.15: said, with the rule's choice
    assert "trusted: measured, kernel links, 60.00 ms per step" in sentence, sentence


def test_the_rule_falls_through_the_order_and_a_distorted_measurement_is_not_trusted(tmp_path):
    """Without a kernel run, the emulated one is trusted; distorted (more ranks than cores), SimGrid tcp is; with
    only simulations, tcp over alpha_beta; with only alpha_beta, it over the model."""
    cases = [([_run("e", 0.055), _run("t", 0.052, kind="tcp")], "measured, emulated links"),
             ([_run("e", 0.055, cores_oversubscribed=True), _run("t", 0.052, kind="tcp")], "SimGrid tcp"),
             ([_run("t", 0.052, kind="tcp"), _run("a", 0.049, kind="alpha_beta")], "SimGrid tcp"),
             ([_run("a", 0.049, kind="alpha_beta")], "SimGrid alpha_beta")]
    for rows, trusted in cases:
        row = reconcile.reconcile_frame(_ok(tmp_path, rows)).iloc[0]
        assert row["trusted"] == trusted, (trusted, row.to_dict())
    row = reconcile.reconcile_frame(_ok(tmp_path, cases[1][0])).iloc[0]
    assert "measured, emulated links: distorted by contention for the machine, not trusted" in row["note"]


def test_configurations_that_differ_are_rows_of_their_own_and_the_model_says_what_it_cannot_price(tmp_path):
    """Another worker count, a full-speed link (nothing to price: a note), a straggler (no compute imbalance in
    the model), nodes of 2 (priced per level) and a simulation with a FIFO NIC: five more rows; agreeing sources
    (within 15%) are no disagreement."""
    rows = [_run("e", MODEL_S), _run("e8", 0.1, workers=8),
            _run("f", 0.01, link_bandwidth=math.nan, link_emulation=""),
            _run("s", 0.3, straggler_ranks=[1], straggler_slowdown=2.0),
            _run("n", 0.05, ranks_per_node=2, link_intra_bandwidth=10 * GBIT, link_intra_latency_s=0.0),
            _run("q", 0.05, kind="tcp", sim_nic="fifo")]  # another simulated NIC: never averaged with a shared one
    frame = reconcile.reconcile_frame(_ok(tmp_path, rows))
    assert len(frame) == 6
    assert "one NIC per rank, fifo NIC (simulated)" in set(frame["platform"])
    by = {(r["workers"], r["link"], r["platform"], r["note"].split(":")[0] if r["note"] else ""): r
          for _, r in frame.iterrows()}
    full = next(r for k, r in by.items() if k[1] == "full speed")
    assert math.isnan(full["model ms"]) and "no emulated bandwidth to price" in full["note"]
    straggler = next(r for _, r in frame.iterrows() if "straggler" in r["note"])
    assert math.isnan(straggler["model ms"])
    nodes = next(r for _, r in frame.iterrows() if r["platform"].startswith("nodes of 2"))
    assert math.isfinite(nodes["model ms"]) and "node_cost" in nodes["note"]
    flat = next(r for _, r in frame.iterrows() if r["workers"] == 4 and r["platform"] == "one NIC per rank"
                and r["link"] != "full speed" and not r["note"])
    assert flat["spread"] == pytest.approx(1.0) and reconcile.disagreements(frame[frame.index == flat.name]) == []


def test_the_section_renders_the_rule_and_the_table(tmp_path):
    from reports.page import ENV

    ok = _ok(tmp_path, [_run("e", 0.055), _run("t", 0.052, kind="tcp")])
    body = sections.one_answer(sections.Results(ok, ok, None, None, load.link_order(ok)))
    html = ENV.get_template("sections/one-answer.html.j2").render(**body)
    assert ("measured, kernel links &gt; measured, emulated links &gt; SimGrid tcp &gt; SimGrid alpha_beta &gt; "
            "model") in html
    assert "<th>trusted</th>" in html


def test_an_extrapolation_names_the_range_it_was_fitted_on_and_how_far_beyond(tmp_path):
    """Ring at n = 2 and 4 on 1 Gbit/s and 4 at 10 Gbit/s, comm exactly alpha-beta with alpha 50 us: a plausible
    fit per link; the figure's n = 8..1024 is 256x the largest n fitted (4), its 100 Gbit/s 10x the fastest link
    fitted (10 Gbit/s = 1,250 MB/s)."""
    rows = []
    for bw in (GBIT, 10 * GBIT):
        for n, rounds, path in ((2, 2, 4e6), (4, 6, 6e6), (4, 6, 6e6)):
            rows.append(_run(f"r{n}-{bw:g}-{len(rows)}", rounds * 50e-6 + path / bw, workers=n, link_bandwidth=bw,
                             link_latency_s=0.0, analytic_rounds=float(rounds), analytic_path_bytes=path,
                             seed=len(rows)))
    ok = _ok(tmp_path, rows)
    fits, _ = calibration.calibration(ok)
    assert (fits["plausible"] == "yes").all(), fits.to_dict("records")
    alpha = calibration.extrapolation_alpha(fits, ok)
    rule = calibration.extrapolation_rule(fits, ok, alpha)
    assert "alpha fitted on 6 runs at n = 2-4 workers on links of 125.0-1,250.0 MB/s" in rule, rule
    assert "shown for n = 8-1,024 workers at 1-100 Gbit/s: up to 256x the largest n fitted and 10x the fastest " \
           "link fitted" in rule, rule
    # no plausible fit: the rule says the figure is the formula alone
    rule = calibration.extrapolation_rule(fits.assign(plausible="no"), ok,
                                          calibration.extrapolation_alpha(fits.assign(plausible="no"), ok))
    assert "fitted on nothing" in rule and "every point is the formula alone" in rule, rule
