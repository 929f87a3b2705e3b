"""The "Traffic per level" section (issue 26.3) on small hand-made results in the results schema: 2 nodes x 2
ranks, 16 MB of gradients, 1 Gbit/s NICs, 100 Gbit/s inside the node. By hand: the flat ring's busiest node NIC
carries 2(n-1)/n S x 2 ranks / 2 (rank 1 -> 2 and 3 -> 0 leave their node, 1.5 S each way) = 24 MB, 0.192 s;
hierarchical's S = 16 MB, 0.128 s; both bound by the NIC (the intra port's 24 / 16 MB take 2 ms / 1.3 ms)."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from experiments.results import schema
from reports import levels, load
from reports.page import ENV
from reports.sections import SECTIONS, Absent, Results

NUMEL, NIC, INTRA = 4_000_000, 125e6, 100e9 / 8


def _run(run_id, strategy, comm_s, *, k=2, intra=INTRA, seed=0, **params):
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="nodes", substrate="threads", workload="resnet18", image_size=32,
        batch_size=16, steps=4, warmup_steps=1, device="cpu", seed=seed, lr=0.1, strategy=strategy,
        **{f"param_{key}": v for key, v in params.items()}, workers=4, servers=0, bytes_counted=True,
        link_bandwidth=NIC, link_latency_s=0.0, link_emulation="python", ranks_per_node=k,
        link_intra_bandwidth=intra if k > 1 else math.nan, link_intra_latency_s=0.0 if k > 1 else math.nan,
        straggler_slowdown=1.0, compute="profile", status="ok", throughput=64 / (0.2 + comm_s),
        step_time_s=0.2 + comm_s, compute_s=0.2, comm_s=comm_s, comm_fraction=comm_s / (0.2 + comm_s),
        exposed_comm_s=comm_s, numel=NUMEL, model_bytes=NUMEL * 4, final_loss=1.0, param_norm=1.0,
        transport="threads", cores=2, gpu="", host="h", started_at="2026-01-01T00:00:00", duration_s=1.0)


def _results(tmp_path, rows) -> Results:
    pq.write_table(schema.to_arrow(rows, schema.RUNS), tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return Results(runs=runs, ok=runs[runs["ok"]], steps=None, sweep_text=None, links=load.link_order(runs))


def test_bytes_times_and_bound_per_level_by_hand(tmp_path):
    rows = [_run("ring0", "ring", 0.20), _run("ring1", "ring", 0.22, seed=1),
            _run("hier", "hierarchical", 0.14, ranks_per_node=2, inner="ring"),
            _run("a2a", "all_to_all", 0.5)]
    body = levels.section(_results(tmp_path, rows))
    frame = body["table"].frame.set_index("strategy")
    ring, hier = frame.loc["ring"], frame.loc[[s for s in frame.index if s.startswith("hierarchical")][0]]
    assert (ring["NIC MB/step"], hier["NIC MB/step"]) == (24.0, 16.0)
    assert (ring["intra MB/step"], hier["intra MB/step"]) == (24.0, 16.0)
    assert ring["NIC s"] == pytest.approx(0.192) and hier["NIC s"] == pytest.approx(0.128)
    assert ring["intra s"] == pytest.approx(24e6 / INTRA)
    assert ring["bound"] == hier["bound"] == "node NIC"
    assert ring["measured comm s"] == pytest.approx(0.21)  # the mean of its two repeats
    # hierarchical's price is its pipeline (cost.hierarchical_node_seconds): the NIC's 0.128 s plus the first
    # reduce-scatter and last all-gather of its pieces inside the node, 0.2% more at this intra bandwidth
    assert hier["measured / model"] == pytest.approx(0.14 / 0.128, rel=2e-3)
    assert "no per-level traffic" in frame.loc["all_to_all", "note"]  # priced by totals only: said, not guessed
    assert math.isnan(frame.loc["all_to_all", "NIC s"])
    assert body["verdicts"] == [f"resnet18, 4 workers in nodes of 2, {ring['link']}: {hier.name} communicates "
                                f"least (0.140 s per step, 0.67x the flat ring's); its bound is the node NIC."]


def test_a_slow_intra_node_link_is_the_bound(tmp_path):
    """100 Mbit/s inside the node: hierarchical's 16 MB of the node's rings on a rank's port, and the 8 MB of its
    across-node ring, which cross its port too (port, NIC, switch, NIC, port: the simulator's route, the model's
    replay), 24 MB at 12.5 MB/s, pipelined: 1.92 s; the NIC's 0.128 s. (The rings' bytes alone said 1.28 s.)"""
    body = levels.section(_results(tmp_path, [_run("hier", "hierarchical", 1.3, intra=12.5e6, ranks_per_node=2)]))
    row = body["table"].frame.iloc[0]
    assert row["bound"] == "inside the node" and row["model comm s"] == pytest.approx(1.92, rel=1e-4)


def test_absent_without_nodes_and_rendered_with_them(tmp_path):
    """Its template renders the table and the verdict (the whole page's build is the other report tests')."""
    flat = _results(tmp_path, [_run("ring", "ring", 0.2, k=1)])
    assert isinstance(levels.section(flat), Absent)
    assert "levels" in [section.id for section in SECTIONS]
    (tmp_path / "nodes").mkdir()
    nodes = _results(tmp_path / "nodes", [_run("ring", "ring", 0.2), _run("hier", "hierarchical", 0.14,
                                                                           ranks_per_node=2)])
    html = ENV.get_template("sections/levels.html.j2").render(**levels.section(nodes))
    assert "communicates least" in html and "node NIC" in html and "NIC MB/step" in html
