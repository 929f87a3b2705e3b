"""ranks_per_node as a run setting: the sweep reads it ([defaults] or [grid]), the run's network places its ranks
in nodes (one NIC per node, link.intra_* inside it), a node-aware strategy groups by it, the thread substrate
runs it, and the Ray substrate refuses it before any work, naming the setting, unless the links are kernel-shaped
(k ranks per namespace: tests/experiments/test_cluster_netns.py)."""

from __future__ import annotations

import io

import pytest

from experiments.config import sweep as sweep_mod
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.substrate import Run, ThreadSubstrate
from strategies.transport.link import Link


def _sweep(strategies=("hierarchical", "ring"), **defaults):
    base = {"workload": "tiny", "image_size": 16, "batch_size": 4, "steps": 3, "warmup_steps": 1,
            "workers": 4}
    return sweep_mod.parse({"defaults": {**base, **defaults}, "grid": {"strategy": list(strategies)}})


def test_the_run_setting_reaches_the_network_and_the_strategy():
    link = {"bandwidth": "1Gbit", "intra_bandwidth": "100Gbit", "intra_latency": "2us"}
    hier, ring = _sweep(ranks_per_node=2, link=link).runs
    network = hier.network()
    assert network.ranks_per_node == 2 and network.intra == Link(100e9 / 8, 2e-6)
    assert hier.strategy_config().ranks_per_node == 2  # grouped by the run's nodes
    assert ring.network().ranks_per_node == 2  # the flat ring shares the same NICs
    flat = _sweep(link=link).runs[0]
    assert flat.network().ranks_per_node == 1 and flat.strategy_config().ranks_per_node == 1
    assert flat.run_id != hier.run_id


def test_bad_values_are_refused_by_value():
    with pytest.raises(ValueError, match="ranks_per_node"):
        _sweep(ranks_per_node=0)
    with pytest.raises(ValueError, match="ranks_per_node"):
        _sweep(ranks_per_node="2")


def test_substrates_that_cannot_place_nodes_refuse_before_work():
    from experiments.pipeline.ray_substrate import RaySubstrate
    from experiments.simulate.substrate import SimGridSubstrate

    runs = [Run(spec.run_id, spec) for spec in _sweep(ranks_per_node=2).runs]
    with pytest.raises(ValueError, match="ranks_per_node = 2 cannot be applied on the ray substrate with no link"):
        RaySubstrate.__new__(RaySubstrate).check(runs)
    python = [Run(s.run_id, s) for s in _sweep(ranks_per_node=2, link={"bandwidth": "1Gbit"}).runs]
    with pytest.raises(ValueError, match=r"with link emulation 'python'.*accepted there: ranks_per_node = 1, or "
                                         r"link = \{ bandwidth = ..., emulation = \"kernel\" \}.*--node-cpus 2"):
        RaySubstrate.__new__(RaySubstrate).check(python)
    kernel = [Run(s.run_id, s) for s in _sweep(ranks_per_node=2, link={"bandwidth": "1Gbit",
                                                                       "emulation": "kernel"}).runs]
    RaySubstrate.__new__(RaySubstrate).check(kernel)  # k ranks per namespace of the kernel-shaped cluster
    ThreadSubstrate.__new__(ThreadSubstrate).check(runs)  # accepted
    simgrid = SimGridSubstrate.__new__(SimGridSubstrate)  # accepted: the nodes platform (test_simulate.py)
    assert not [p for run in runs for p in simgrid.problems(run) if "ranks_per_node" in p]


def test_node_aware_runs_on_thread_ranks_in_nodes(tmp_path):
    sweep = _sweep(("hierarchical", "ring", "node_parameter_server"), ranks_per_node=2,
                   link={"bandwidth": "1Gbit", "intra_bandwidth": "100Gbit", "intra_latency": "2us"})
    runs = run_sweep(sweep, tmp_path / "run", log=io.StringIO(), substrate=ThreadSubstrate())
    assert (runs["status"] == "ok").all(), runs["error"].tolist()  # bytes per step equal to traffic(), checked
    assert runs["ranks_per_node"].tolist() == [2, 2, 2]
    assert runs["link_intra_bandwidth"].tolist() == [100e9 / 8] * 3 and runs["link_intra_latency_s"].eq(2e-6).all()
    by = runs.set_index("strategy")
    assert by.loc["hierarchical", "param_ranks_per_node"] == 2
    assert by.loc["node_parameter_server", "param_ranks_per_node"] == 2


def test_run_on_threads_refuses_a_ray_address(capsys):
    from experiments.cli.main import main

    assert main(["run", "experiments/config/sweeps/nodes.toml", "--substrate", "threads", "--address", "auto"]) == 2
    assert "--substrate threads with --address auto" in capsys.readouterr().err


def test_the_model_prices_each_level_for_nodes_of_eight(capsys):
    """16 workers in nodes of 8, 100 MB, 10 Gbit NICs: the flat ring's node NIC carries 2(n-1)/n S = 187.5 MB
    (0.150 s), hierarchical's 2(m-1)/m S = 100 MB (0.080 s, 0.090 s with its pipeline's intra-node rounds); a
    strategy without per-level traffic is a note."""
    from experiments.cli.main import main
    from reports.model import model_table

    df = model_table(None, 100e6, 16, 10e9 / 8, 0.25, ranks_per_node=8, intra_bandwidth=100e9 / 8,
                     strategies=["ring", "hierarchical", "all_to_all"]).set_index("strategy")
    assert df.loc["ring", "nic_bytes"] == 187_500_000 and df.loc["hierarchical", "nic_bytes"] == 100_000_000
    assert df.loc["ring", "comm_s"] == pytest.approx(0.150)
    # hierarchical: its NIC's 0.080 s plus what its pipeline does not overlap (strategies.cost's
    # hierarchical_node_seconds, which SimGrid's alpha_beta model matches): 11 pieces, and in each stage the
    # node's ring rounds after the first two (5 of 7, NodeStage.finish) run after the across-node step, 0.18 ms
    # each: 0.080 + 11 x 5 x 0.18 ms = 0.090 s
    assert df.loc["hierarchical", "comm_s"] == pytest.approx(0.0904, rel=1e-3)
    assert df.loc["hierarchical", "bottleneck"] == "nic"
    assert "no per-level traffic" in df.loc["all_to_all", "note"]
    assert main(["model", "--model-bytes", "100MB", "--workers", "16", "--bandwidth", "10Gbit", "--step-time",
                 "0.25", "--ranks-per-node", "8", "--strategy", "hierarchical"]) == 0
    assert "nodes of 8 workers sharing one NIC" in capsys.readouterr().out
    with pytest.raises(ValueError, match="bad ranks per node 0"):
        model_table(None, 100e6, 16, 10e9 / 8, 0.25, ranks_per_node=0)


def test_bench_on_nodes_refuses_what_its_substrate_cannot_apply_before_work():
    """bench --ranks-per-node k: thread ranks with python emulation, Ray actors k per namespace with kernel links."""
    from experiments.bench.collectives import bench

    kernel = {"bandwidth": "1Gbit", "emulation": "kernel"}
    with pytest.raises(ValueError, match="--p2p threads with --emulation kernel: .*accepted there: gloo"):
        bench(4, [1 << 20], link=kernel, p2p="threads", ranks_per_node=2)
    with pytest.raises(ValueError, match="intra_bandwidth .* emulation 'kernel'.*loopback"):
        bench(4, [1 << 20], link={**kernel, "intra_bandwidth": "100Gbit"}, p2p="sockets", ranks_per_node=2)
    with pytest.raises(ValueError, match="--p2p gloo with --ranks-per-node 2: .*or --emulation kernel"):
        bench(4, [1 << 20], link={"bandwidth": "1Gbit"}, p2p="gloo", ranks_per_node=2)
