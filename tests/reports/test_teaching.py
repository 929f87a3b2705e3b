"""The teaching question in the report: bytes per worker and communication time against n = 2..64 for naive ring,
ring, a parameter server (one server) and reduce + broadcast; the model's curves, with the runs that ask the same
question drawn through them. Expected values worked out in the comments (M = 100 MB, B = 125e6 bytes/s)."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.results import schema
from reports import load, sections, teaching
from reports.page import ENV

M, B = 100e6, 125e6


def test_the_models_bytes_and_times_by_hand():
    """Naive ring: every worker forwards n - 1 whole copies: (n - 1) M sent, (n - 1) M / B s (n = 4: 300 MB, 2.4 s;
    n = 64: 6,300 MB, 50.4 s). Ring: 2 (n - 1) / n M (n = 4: 150 MB, 1.2 s; n = 64: 196.875 MB, 1.575 s). The
    parameter server's worker sends M whatever n; its server's NIC carries at least n M (the incast)."""
    model = teaching.model_frame(M, B, 0.0, workers=(2, 4, 64)).set_index(["strategy", "workers"])
    for n in (2, 4, 64):
        naive, ring = model.loc[("naive ring", n)], model.loc[("ring", n)]
        assert naive["MB sent per worker"] == pytest.approx((n - 1) * 100)
        assert naive["comm s"] == pytest.approx((n - 1) * M / B)
        assert ring["MB sent per worker"] == pytest.approx(2 * (n - 1) / n * 100)
        assert ring["comm s"] == pytest.approx(2 * (n - 1) / n * M / B)
        ps = model.loc[("parameter server, 1 server", n)]
        assert ps["MB sent per worker"] == pytest.approx(100)
        assert ps["MB through the busiest NIC"] >= n * 100
    assert set(model.index.get_level_values("strategy")) == {label for label, _, _ in teaching.STRATEGIES}


def _sim(run_id, strategy, workers, comm_s, sent, **extra):
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="teach", substrate="simgrid", workload="resnet50", image_size=224,
        batch_size=8, steps=2, warmup_steps=1, device="cpu", seed=0, lr=0.1, strategy=strategy, workers=workers,
        servers=1 if strategy == "parameter_server" else 0, bytes_counted=True, link_bandwidth=B, link_latency_s=0.0,
        link_emulation="", straggler_slowdown=1.0, compute="fixed", status="ok", throughput=1.0, step_time_s=comm_s,
        compute_s=0.0, comm_s=comm_s, comm_fraction=1.0, exposed_comm_s=comm_s, bytes_sent_per_worker=sent,
        bytes_recv_per_worker=sent, analytic_bytes_sent_per_worker=sent, analytic_rounds=1.0,
        analytic_path_bytes=sent, numel=25_000_000, model_bytes=100_000_000, final_loss=1.0, param_norm=1.0,
        transport="simgrid", cores=0, gpu="", host="h", started_at="2026-01-01T00:00:00", duration_s=1.0,
        sim_topology="star", sim_network_model="alpha_beta", sim_nic="shared", compute_source="fixed", **extra)


def _results(tmp_path, rows):
    schema.conform(pd.DataFrame(rows), schema.RUNS).to_parquet(tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return sections.Results(runs, runs[runs["ok"]], None, None, load.link_order(runs))


def test_the_runs_that_ask_the_question_are_drawn_through_the_model(tmp_path):
    """A simulated ring at n = 4 (1.2 s, the model's 150 MB / B: comm / model = 1.00) and a naive ring at 4
    (2.64 s against the model's 2.4: 1.10); a parameter server with 2 servers asks another question: left out."""
    r = _results(tmp_path, [_sim("r", "ring", 4, 1.2, 150e6), _sim("n", "naive_ring", 4, 2.64, 300e6),
                            _sim("p", "parameter_server", 4, 9.0, 100e6, param_servers=2,
                                 param_placement="dedicated")])
    model_bytes, bandwidth, _, runs = teaching.condition(r.ok)
    assert (model_bytes, bandwidth) == (100e6, B) and set(runs["run_id"]) == {"r", "n"}
    body = sections.teaching_question(r)
    assert not body["asked"]
    points = body["points"].frame.set_index("strategy")
    assert points.loc["ring", "comm / model"] == pytest.approx(1.0)
    assert points.loc["naive ring", "comm / model"] == pytest.approx(1.1)
    assert points.loc["ring", "source"] == "SimGrid alpha_beta"
    html = ENV.get_template("sections/teaching.html.j2").render(**body)
    assert "The runs against the model" in html and "plotly" in html


def test_without_such_runs_the_question_is_answered_as_asked(tmp_path):
    """No run of these strategies on a shaped link: the figure is the teacher's 100 MB on 1 Gbit/s, said so."""
    r = _results(tmp_path, [_sim("h", "halving_doubling", 4, 1.2, 150e6)])
    body = sections.teaching_question(r)
    assert body["asked"] and body["points"] is None
    assert (body["model_mb"], body["gbit"]) == ("100.00", "1")
    html = ENV.get_template("sections/teaching.html.j2").render(**body)
    assert "100.00 MB of fp32 gradients on 1 Gbit/s per NIC" in html
