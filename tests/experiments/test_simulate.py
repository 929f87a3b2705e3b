"""The simulated cluster: strategies unchanged on SimGrid, against the emulation, the alpha-beta model and theory.

Every simulation runs in a forked process (SimGrid's engine is one per process). Skipped, with the reason,
where SimGrid's Python module is not installed (`apt-get install -y python3-simgrid`; .ci/run does it).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import strategies
from experiments.cluster.netns import _alive
from experiments.config.sweep import RunSpec
from experiments.pipeline.substrate import Run
from experiments.results.dataset import read_steps
from experiments.simulate.platform import Platform
from experiments.simulate.substrate import (
    SimGridSubstrate,
    SimSpec,
    Timeline,
    load,
    run_in_child,
    simulate_in_child,
    simulate_sweep,
    summarize_simulated,
)
from strategies.transport.communicator import CommError
from strategies.transport.link import Network
from strategies.transport.simgrid import simgrid_available
from strategies.transport.simgrid_run import run_simgrid
from strategies.transport.threads import run_threads

pytestmark = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")

# what the simulator accepts, by capability: bytes the communicator counts, no model wrapper
SIMULABLE = [n for n in strategies.names() if strategies.get(n).counted and not strategies.get(n).wraps_model]
PARAMS = {"parameter_server": {"servers": 2}}


def _sync_only(numel: int) -> Timeline:
    """No compute at all: the step is one sync of `numel` float32 elements in one bucket."""
    return Timeline(0.0, 0.0, 0.0, (numel,), (0.0,), "none")


def _simulate(strategy: str, workers: int, numel: int, platform: Platform, params: dict | None = None,
              bucket_mb=None, overlap=False, compute: Timeline | None = None, steps: int = 1,
              **settings) -> tuple[dict, list]:
    spec = RunSpec(sweep="test", strategy=strategy, workers=workers, steps=steps, warmup_steps=0,
                   link={"bandwidth": f"{platform.bandwidth * 8 / 1e9:g}Gbit",
                         "latency": f"{platform.latency * 1e6:g}us"},
                   strategy_params=params if params is not None else PARAMS.get(strategy, {}), **settings)
    (run,) = SimGridSubstrate([(spec, SimSpec(platform, compute or _sync_only(numel), bucket_mb, overlap))]).runs()
    results, error, wall = simulate_in_child(run.spec, run.settings)
    assert not error, error
    row, steps_rows = summarize_simulated(run.spec, run.settings, results, error, wall, "now", run.run_id)
    assert row["status"] == "ok", row["error"]
    return row, steps_rows


def _sync_time(row: dict) -> float:
    return row["comm_s"]


def _child_call(fn, world: int, platform: Platform) -> list:
    """run_simgrid(fn) in a forked process; its results, or RuntimeError with the child's error."""
    result, error, _ = run_in_child(lambda: run_simgrid(world, fn, lambda sg: platform.build(sg, world),
                                                        platform.config))
    if error:
        raise RuntimeError(error)
    return result


def _emulated_sync_s(strategy: str, workers: int, numel: int, network: Network, repeats: int = 3) -> float:
    """The python link emulation, measured: thread ranks, emulated NICs; the slowest rank's time, the best of
    `repeats` (delays from other processes only ever add time)."""
    config = strategies.make(strategy)
    op = "sum" if config.exact else "mean"

    def fn(comm):
        runtime = config.bind(comm, workers)
        x = torch.ones(numel)
        times = []
        for _ in range(repeats + 1):  # the first call also checks sizes between ranks: not timed
            comm.barrier()
            start = time.perf_counter()
            if runtime.is_server:
                runtime.serve(numel, torch.float32, op)
            else:
                runtime.sync(x, op)
            times.append(time.perf_counter() - start)
        return times[1:]

    per_rank = run_threads(config.world_size(workers), fn, network=network)
    return min(max(rank[i] for rank in per_rank) for i in range(repeats))


@pytest.mark.timing  # the emulated side is measured wall-clock time
@pytest.mark.parametrize("workers", [4, 8])
def test_simulated_sync_matches_the_python_emulation(workers):
    """Star platform, SimGrid's corrections off, the emulation's NIC model (nic = "buffered": a rank's sends
    leave one at a time into a buffering switch, each receiver's port drains one at a time): every strategy's
    simulated sync of one 1 MB array within 10% of the same sync measured over the python link emulation
    (thread ranks, 100 Mbit/s, 50 us NICs: slow enough that the copies and reductions the emulation also does
    stay a few percent of the time)."""
    network = Network.from_spec({"bandwidth": "100Mbit", "latency": "50us"})
    platform = Platform.parse({"bandwidth": "100Mbit", "latency": "50us", "network_model": "alpha_beta",
                               "nic": "buffered"})
    numel = 250_000
    for strategy in SIMULABLE:
        if (strategy, workers) in SIMULATION_GAPS:
            # not checked either way: the emulated side is wall-clock time, and on a loaded machine it grows into
            # the simulated one (a strict "must still differ" failed at load 3, 2026-11-26)
            continue
        _check_simulated_against_emulated(strategy, workers, numel, network, platform)


# Known disagreements between the simulator and the python emulation, with what causes them:
SIMULATION_GAPS = {
    # the double binary tree lets a pipeline slot's sends leave once the slot before's sends have completed; a
    # SimGrid send completes when the receiver has the message, an emulated one when it has left the sender's
    # NIC, so on SimGrid each of the 8-rank tree's slots also waits a delivery (0.231 s against 0.204 s measured,
    # 2026-11-24); at 4 ranks (fewer, shorter slots) they agree within 10%
    ("double_binary_tree", 8): "slot gating waits for send completion, which the two substrates define differently",
}


def _check_simulated_against_emulated(strategy, workers, numel, network, platform):
    measured = _emulated_sync_s(strategy, workers, numel, network)
    # a node-aware strategy's nodes come from the run's ranks_per_node (RunSpec.strategy_config): the run
    # states the strategy's default, which the emulation above uses (else node_parameter_server ran with nodes
    # of 1, a flat parameter server: 0.480 s against 0.163 s, once listed here as a gap)
    config = strategies.make(strategy)
    nodes = {"ranks_per_node": config.ranks_per_node} if "ranks_per_node" in config.parameters() else {}
    row, _ = _simulate(strategy, workers, numel, platform, params={}, **nodes)
    assert row["comm_s"] == pytest.approx(measured, rel=0.10), (strategy, workers, row["comm_s"], measured)


def test_ring_at_128_ranks_matches_the_alpha_beta_model():
    """128 ranks on a star with SimGrid's corrections off: ring (32,512 messages) within 5% of the alpha-beta model.

    Halving-doubling at 1,024 ranks on the same link is checked against the model where its memory is measured
    (test_simulate_scale.py, the same simulation); ring at 1,024 ranks (2.1 million messages) takes 9 minutes: the
    next test, when SYNCBENCH_SLOW_SIMULATION=1."""
    platform = Platform.parse({"bandwidth": "10Gbit", "latency": "20us", "network_model": "alpha_beta"})
    row, _ = _simulate("ring", 128, 25_557_032, platform)  # ResNet-50
    assert row["comm_s"] == pytest.approx(row["model_comm_s"], rel=0.05), row


@pytest.mark.skipif(not os.environ.get("SYNCBENCH_SLOW_SIMULATION"),
                    reason="ring at 1,024 ranks (2.1 million messages) takes about 9 minutes on this 2-core machine, "
                           "too long for CI: set SYNCBENCH_SLOW_SIMULATION=1 to run it")
@pytest.mark.timeout(1800)
def test_ring_at_1024_ranks_matches_the_alpha_beta_model():
    platform = Platform.parse({"bandwidth": "10Gbit", "latency": "20us", "network_model": "alpha_beta"})
    row, _ = _simulate("ring", 1024, 25_557_032, platform)
    assert row["comm_s"] == pytest.approx(row["model_comm_s"], rel=0.05), row


def test_oversubscribed_fat_tree_slows_all_to_all_and_parameter_server_more_than_ring():
    numel, workers = 1_000_000, 16
    star = Platform.parse({"bandwidth": "1Gbit", "latency": "50us"})
    tree = Platform.parse({"bandwidth": "1Gbit", "latency": "50us", "topology": "fat_tree", "hosts_per_leaf": 4,
                           "oversubscription": 4})
    slowdown = {}
    for strategy in ("ring", "all_to_all", "parameter_server"):
        params = {"servers": 4} if strategy == "parameter_server" else {}
        on_star, _ = _simulate(strategy, workers, numel, star, params)
        on_tree, _ = _simulate(strategy, workers, numel, tree, params)
        slowdown[strategy] = on_tree["comm_s"] / on_star["comm_s"]
    assert slowdown["ring"] < 1.5, slowdown
    assert slowdown["all_to_all"] > 2 * slowdown["ring"], slowdown
    assert slowdown["parameter_server"] > 2 * slowdown["ring"], slowdown


def test_simulation_is_deterministic():
    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "50us", "topology": "fat_tree", "hosts_per_leaf": 2,
                               "oversubscription": 2})
    compute = Timeline.fixed(0.01, 0.02, 0.005, (1000, 200_000, 3000, 50_000))
    first = _simulate("parameter_server", 6, 0, platform, {"servers": 2}, bucket_mb=0.1, overlap=True,
                      compute=compute, steps=2)
    second = _simulate("parameter_server", 6, 0, platform, {"servers": 2}, bucket_mb=0.1, overlap=True,
                       compute=compute, steps=2)
    assert pd.DataFrame(first[1]).equals(pd.DataFrame(second[1]))  # every rank's every step: times, bytes
    assert first[0]["step_time_s"] == second[0]["step_time_s"]


@pytest.mark.parametrize("strategy", SIMULABLE)
def test_every_strategy_runs_unchanged_with_exact_bytes(strategy):
    """Buckets, overlap, nodes of 4 GPUs, uneven sizes: bytes per rank equal the analytic traffic (the summary
    fails the run otherwise) and overlap never makes the step longer."""
    platform = Platform.parse({"bandwidth": "10Gbit", "latency": "20us", "topology": "nodes", "gpus_per_node": 4})
    compute = Timeline.fixed(0.002, 0.004, 0.001, (4097, 1, 300_001, 77, 90_000))
    plain, _ = _simulate(strategy, 6, 0, platform, bucket_mb=0.5, compute=compute)
    overlapped, rows = _simulate(strategy, 6, 0, platform, bucket_mb=0.5, overlap=True, compute=compute)
    assert plain["bytes_sent_per_worker"] > 0
    assert plain["bytes_sent_per_worker"] == overlapped["bytes_sent_per_worker"]
    assert overlapped["step_time_s"] <= plain["step_time_s"] + 1e-9


@pytest.mark.parametrize("params", strategies.get("parameter_server").variants)
def test_every_parameter_server_variant_simulates_with_exact_bytes(params):
    """Dedicated and colocated, update and summation: the step loop's roles on simulated ranks, bytes as declared."""
    platform = Platform.parse({"bandwidth": "10Gbit", "latency": "20us"})
    compute = Timeline.fixed(0.002, 0.004, 0.001, (4097, 1, 300_001, 77))
    params = {**params, "partition_mb": 0.25}  # the variants' tiny partitions would mean thousands of messages
    row, _ = _simulate("parameter_server", 4, 0, platform, params=params, bucket_mb=0.5, overlap=True,
                       compute=compute, steps=2)
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"] > 0


@pytest.mark.parametrize("strategy", SIMULABLE)
def test_real_payloads_give_the_reference_result(strategy):
    """With CPU tensors instead of meta ones the values move: every strategy's sum is the reference."""
    config = strategies.make(strategy, **PARAMS.get(strategy, {}))
    workers, numel = 5, 1001

    def fn(comm):
        runtime = config.bind(comm, workers)
        if runtime.is_server:
            runtime.serve(numel, torch.float64, "sum" if config.exact else "mean")
            return None
        x = torch.arange(numel, dtype=torch.float64) * (comm.rank + 1)
        runtime.sync(x, "sum" if config.exact else "mean")
        return x.tolist()

    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "50us"})
    results = _child_call(fn, config.world_size(workers), platform)
    base = torch.arange(numel, dtype=torch.float64)
    if config.exact:
        for r in range(workers):
            assert torch.equal(torch.tensor(results[r], dtype=torch.float64), base * sum(range(1, workers + 1)))
    else:  # one round of neighbour averaging keeps the mean
        total = sum(torch.tensor(results[r], dtype=torch.float64) for r in range(workers))
        assert torch.allclose(total, base * sum(range(1, workers + 1)))


def test_native_and_a_deadlock_are_refused_with_clear_errors():
    """By capability, never by name: a strategy declaring counted = False (native) or wrapping the model (ddp)."""
    substrate = SimGridSubstrate([])
    for name, fragment in (("native", "declares counted = False"), ("ddp", "wraps the model")):
        spec = RunSpec(strategy=name, workers=2, link={"bandwidth": "1Gbit"})
        with pytest.raises(ValueError, match=f"(?s)simgrid substrate cannot run this sweep.*{fragment}"):
            substrate.check([Run(spec.run_id, spec)])

    def lonely(comm):
        if comm.rank == 0:
            comm.recv(torch.zeros(4), 1)

    with pytest.raises(Exception, match=r"deadlocked.*1 of 3 ranks never finished \(ranks 0\)"):
        _child_call(lonely, 3, Platform())


def test_a_straggler_is_applied_on_the_simulated_clock():
    """A straggler's timeline is stretched by its slowdown and the synchronous step waits for it (was ignored)."""
    platform = Platform.parse({"bandwidth": "10Gbit", "latency": "20us", "network_model": "alpha_beta"})
    timeline = Timeline.fixed(0.01, 0.02, 0.005, (1000, 20_000))
    base, _ = _simulate("ring", 4, 0, platform, compute=timeline, steps=2)
    slow, rows = _simulate("ring", 4, 0, platform, compute=timeline, steps=2,
                           straggler={"ranks": [1], "slowdown": 3.0})
    compute = pd.DataFrame(rows).query("timed").groupby("rank")["compute_s"].mean()
    assert compute[1] == pytest.approx(3 * compute[0]) and compute[0] == pytest.approx(0.035)
    assert slow["straggler_slowdown"] == 3.0 and slow["straggler_ranks"] == (1,)
    assert slow["step_time_s"] == pytest.approx(base["step_time_s"] + 2 * 0.035, abs=1e-3)


def test_settings_the_simulator_cannot_apply_are_refused_before_any_run():
    substrate = SimGridSubstrate([])
    link = {"bandwidth": "1Gbit"}
    for settings, fragment in (({"link": None}, "has no link"), ({"device": "cuda", "link": link}, "device = 'cuda'"),
                               ({"dataset": "digits", "link": link}, "dataset = 'digits'"),
                               ({"link": {**link, "emulation": "kernel"}}, "emulation = 'kernel'")):
        spec = RunSpec(strategy="ring", workers=2, **settings)
        with pytest.raises(ValueError, match=fragment):
            substrate.check([Run(spec.run_id, spec)])


def test_simulate_command_writes_the_results_schema(tmp_path):
    sweep = tmp_path / "tiny.toml"
    sweep.write_text("""
name = "tiny"
[defaults]
workload = "tiny"
steps = 2
warmup_steps = 1
link = { bandwidth = "1Gbit", latency = "50us" }
[grid]
strategy = ["ring", "parameter_server"]
workers = [4]
[simulate]
topology = ["star", "fat_tree"]
hosts_per_leaf = 2
oversubscription = 2
network_model = "tcp"
forward_s = 0.01
backward_s = 0.02
optimizer_s = 0.001
""")
    out = tmp_path / "out"
    runs = simulate_sweep(sweep, out, log=open("/dev/null", "w"))
    assert len(runs) == 4 and (runs["status"] == "ok").all(), runs["error"].tolist()
    assert set(runs["substrate"]) == {"simgrid"} and set(runs["sim_network_model"]) == {"tcp"}
    assert set(runs["sim_topology"]) == {"star", "fat_tree"}
    assert (runs["bytes_sent_per_worker"] == runs["analytic_bytes_sent_per_worker"]).all()
    assert not read_steps(out).empty
    # the default TCP model is slower than the alpha-beta model: 97% goodput, latency x 13.01
    star = runs[runs["sim_topology"] == "star"]
    assert (star["comm_s"] > star["model_comm_s"]).all()


def test_simulate_table_errors_name_the_value(tmp_path):
    sweep = tmp_path / "bad.toml"
    base = '[defaults]\nworkload = "tiny"\nlink = "1Gbit"\n[grid]\nstrategy = ["ring"]\nworkers = [2]\n'
    sweep.write_text(base + '[simulate]\ntopology = "torus"\nforward_s = 0\nbackward_s = 0\noptimizer_s = 0\n')
    with pytest.raises(ValueError, match="topology = 'torus': accepted are star, fat_tree, nodes"):
        load(sweep)
    sweep.write_text(base + '[simulate]\nwarp = 9\n')
    with pytest.raises(ValueError, match=r"unknown \[simulate\] key\(s\) \['warp'\]"):
        load(sweep)
    sweep.write_text(base + '[simulate]\nforward_s = 0.1\n')
    with pytest.raises(ValueError, match="needs a compute timeline.*missing backward_s, optimizer_s"):
        load(sweep)
    sweep.write_text(base.replace('"ring"', '"native"') + '[simulate]\nforward_s = 0\n')
    with pytest.raises(ValueError, match="'native' declares counted = False"):
        load(sweep)
    assert math.isfinite(Platform.parse({"bandwidth": "25Gbit", "latency": "5us"}).bandwidth)


def test_messages_from_one_peer_match_receives_in_posting_order():
    """As over gloo: two receives from the same peer get its messages in the order they were posted, whichever
    is waited for first."""

    def fn(comm):
        if comm.rank == 0:
            first, second = torch.zeros(3), torch.zeros(3)
            a, b = comm.irecv(first, 1), comm.irecv(second, 1)
            b.wait()
            a.wait()
            return first.tolist(), second.tolist()
        comm.send(torch.ones(3), 0)
        comm.send(torch.full((3,), 2.0), 0)
        return None

    assert _child_call(fn, 2, Platform())[0] == ([1.0] * 3, [2.0] * 3)


def test_a_simulation_runs_on_one_cpu_and_gives_the_others_back():
    """SimGrid's actor threads run one at a time: the simulation pins itself to one CPU (threads hand over
    without cross-CPU wake-ups), runs its threads under SCHED_BATCH (a woken thread does not preempt its waker)
    and restores the process's CPUs, scheduling policy and garbage collector when it ends."""
    import gc

    def fn(comm):
        return sorted(os.sched_getaffinity(0)), gc.isenabled(), os.sched_getscheduler(0)

    def child():
        before = os.sched_getaffinity(0), os.sched_getscheduler(0)
        inside = run_simgrid(2, fn, lambda sg: Platform().build(sg, 2), Platform().config)
        return inside, (os.sched_getaffinity(0), os.sched_getscheduler(0)) == before, gc.isenabled(), before[1]

    result, error, _ = run_in_child(child)
    assert not error, error
    inside, restored, gc_back, policy_before = result
    for cpus, gc_on, policy in inside:
        assert len(cpus) == 1 and cpus[0] in os.sched_getaffinity(0) and not gc_on
        assert policy == getattr(os, "SCHED_BATCH", policy_before)
    assert restored and gc_back


def test_a_killed_parent_leaves_no_simulation_running(tmp_path):
    """The simulation runs in a forked child; if its parent is killed (even by SIGKILL), the kernel kills the
    child too, so an interrupted `syncbench simulate` or test run leaves nothing behind."""
    import signal
    import subprocess
    import sys

    pid_file = tmp_path / "child.pid"
    # the forking module alone (the substrate re-exports it): importing the substrate's torch took most of the time
    script = (f"import os, time\n"
              f"from experiments.simulate.child import run_in_child\n"
              f"def call():\n"
              f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
              f"    time.sleep(120)\n"
              f"run_in_child(call)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=str(Path(__file__).resolve().parents[2]))
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child = int(pid_file.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), f"the simulation process {child} outlived its killed parent"
    finally:
        parent.kill()
        if pid_file.exists() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)



def test_ranks_per_node_places_ranks_in_nodes_and_bytes_per_level_equal_the_model(tmp_path):
    """ranks_per_node = 2 on SimGrid (issue 26): the run goes on the `nodes` platform (2 ranks behind one NIC, the
    link's intra_* inside), hierarchical groups by it, its bytes equal traffic(), and per level (inside a node,
    through the NIC) every rank's bytes equal cost.node_levels; a [simulate] topology that disagrees is refused."""
    from strategies import cost

    sweep = tmp_path / "nodes.toml"
    sweep.write_text('name = "n"\n[defaults]\nworkload = "tiny"\nworkers = 4\nsteps = 1\nwarmup_steps = 0\n'
                     'ranks_per_node = 2\nlink = { bandwidth = "1Gbit", intra_bandwidth = "100Gbit" }\n'
                     '[grid]\nstrategy = ["hierarchical"]\n[simulate]\nforward_s = 0.0\nbackward_s = 0.0\n'
                     'optimizer_s = 0.0\nnetwork_model = "alpha_beta"\n')
    _, [(spec, sim)] = load(sweep)
    assert (sim.platform.topology, sim.platform.gpus_per_node, sim.platform.intra_bandwidth) == ("nodes", 2, 12.5e9)
    results, error, wall = simulate_in_child(spec, sim)
    row, _ = summarize_simulated(spec, sim, results, error, wall, "now")
    assert row["status"] == "ok" and row["ranks_per_node"] == 2, row["error"]
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"] > 0
    config, workers, numel = strategies.make("hierarchical", ranks_per_node=2), 5, 1001

    def per_level(comm):
        comm.set_nodes(2)
        config.bind(comm, workers).sync(torch.ones(numel), "sum")
        peers = comm.counters().per_peer
        return [sum(c.bytes_sent for p, c in peers.items() if (comm.node_of(p) == comm.node_of(comm.rank)) == inside)
                for inside in (True, False)]

    nodes = Platform.parse({"topology": "nodes", "gpus_per_node": 2, "bandwidth": "1Gbit"})
    measured = _child_call(per_level, workers, nodes)
    levels = cost.node_levels(config, workers, numel, 4, 2)
    assert [m[0] for m in measured] == [t.bytes_sent for t in levels["intra"]]
    assert [m[1] for m in measured] == [t.bytes_sent for t in levels["nic"]]
    sweep.write_text(sweep.read_text() + 'topology = "star"\n')
    with pytest.raises(ValueError, match=r"ranks_per_node = 2 places ranks in nodes of 2, but \[simulate\] says "
                                         r"topology = 'star'"):
        load(sweep)


def test_hierarchical_on_nodes_matches_its_per_level_model_and_beats_the_flat_ring():
    """Issue 26's SimGrid benchmark in small (`syncbench simulate --bench --ranks-per-node`): 4 nodes x 4 ranks,
    10 Gbit/s NICs, 100 Gbit/s inside, ResNet-50's buckets, corrections off: hierarchical's across-node phase and
    its whole sync within 10% of the alpha-beta model per level (cost.node_levels), exact bytes, and faster than the
    flat ring by at least the model's factor."""
    from experiments.simulate.bench import bench_nodes

    ring, hier = bench_nodes(16, 4, ["ring", "hierarchical"], log=open(os.devnull, "w"), network_model="alpha_beta")
    assert not ring["error"] and not hier["error"], (ring["error"], hier["error"])
    assert ring["bytes_ok"] and hier["bytes_ok"]
    assert hier["sim_nic_s"] == pytest.approx(hier["model_nic_s"], rel=0.10)
    assert hier["sim_s"] == pytest.approx(hier["model_s"], rel=0.10)
    # the model is hierarchical's pipeline as it runs (cost.hierarchical_node_seconds): the two ratios now agree
    # to 1e-4, so "at least the model's factor" holds within that
    assert ring["sim_s"] / hier["sim_s"] >= ring["model_s"] / hier["model_s"] * (1 - 1e-3)
    assert ring["model_s"] / hier["model_s"] > 1


def test_wait_any_takes_pushes_in_arrival_order_and_counts_them():
    """The receive a one-actor barrier-free server waits on (SimGridCommunicator.irecv_any / wait_any): whichever
    peer's message arrives first is taken first, values and counters as irecv's; messages that arrived together
    come back from one wait, in arrival order; an ordered irecv from the same peer meanwhile is refused."""
    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "10us", "network_model": "alpha_beta"})

    def fn(comm):
        if comm.rank < 3:
            comm.compute([0.2, 0.0, 0.2][comm.rank])  # rank 1 first, then 0 and 2 together
            comm.send(torch.full((1000,), float(comm.rank)), 3)
            return None
        bufs = [torch.zeros(1000) for _ in range(3)]
        posted = [comm.irecv_any(bufs[src], src) for src in range(3)]
        first = comm.wait_any(posted)
        rest = comm.wait_any([posted[0], posted[2]])
        try:
            comm.irecv(torch.zeros(1000), 0)
            comm.irecv_any(torch.zeros(1000), 0)
            refused = ""
        except CommError as e:
            refused = str(e)
        return first, rest, [b[0].item() for b in bufs], comm.counters().bytes_recv, refused

    first, rest, values, received, refused = _child_call(fn, 4, platform)[3]
    assert (first, rest, values, received) == ([1], [0, 1], [0.0, 1.0, 2.0], 3 * 4000)
    assert "irecv_any from rank 0 while an irecv from it is pending" in refused


def test_any_source_receives_are_recorded_like_every_other_receive():
    """A recorder on a rank records irecv_any / wait_any's receives as irecv's: peer, bytes, the rank's posting
    order, posted when irecv_any was called and finished when wait_any took it, on the simulated clock; once each,
    whether the message had arrived before the receive was posted (rank 1) or after (rank 0), beside an ordered
    irecv (rank 2) recorded the same way. Nothing is recorded once the recorder is off."""
    from strategies.transport.recorder import Direction, MessageRecorder

    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "10us", "network_model": "alpha_beta"})

    def fn(comm):
        if comm.rank < 3:
            comm.compute([0.2, 0.0, 0.1][comm.rank])
            comm.send(torch.full((1000,), float(comm.rank)), 3)
            comm.send(torch.full((10,), float(comm.rank)), 3)
            return None
        comm.compute(0.05)  # rank 1's first message has arrived by now
        recorder = comm.recorder = MessageRecorder()
        receiving = {src: comm.irecv_any(torch.zeros(1000), src) for src in (0, 1)}
        ordered = comm.irecv(torch.zeros(1000), 2)
        taken = {}
        while receiving:
            srcs = list(receiving)
            for i in comm.wait_any([receiving[src] for src in srcs]):
                taken[srcs[i]] = comm.now()
                del receiving[srcs[i]]
        ordered.wait()
        taken[2] = comm.now()
        comm.recorder = None
        for src in (0, 1):  # their second messages: not recorded
            comm.wait_any([comm.irecv_any(torch.zeros(10), src)])
        comm.recv(torch.zeros(10), 2)
        return recorder.events(), taken

    events, taken = _child_call(fn, 4, platform)[3]
    assert sorted((e.peer, e.seq) for e in events) == [(0, 0), (1, 1), (2, 2)]  # once each, in posting order
    for e in events:
        assert (e.rank, e.direction, e.nbytes) == (3, Direction.RECV, 4000)
        assert e.posted == pytest.approx(0.05) and e.finished == pytest.approx(taken[e.peer])
    by_peer = {e.peer: e for e in events}
    assert by_peer[1].finished == pytest.approx(0.05)  # arrived before it was posted: taken at once
    assert by_peer[0].finished > 0.2 and by_peer[2].finished > 0.1


def test_wait_any_takes_pushes_that_arrived_before_the_server_posted_their_receive():
    """A barrier-free server posts a worker's next receive only once it has handled the previous push, so with
    several units per server (buckets, partitions) the next push has often arrived already (sends are eager).
    SimGrid 3.32 hands such a payload over only when its receive is waited for: taking it by its finish time
    raised pybind11's TypeError on simgrid.PyGetAsync. Here rank 0's pushes all arrive before the server posts,
    rank 1's after its first receive is posted (its small third push lands while the second is on the wire):
    every push is taken once, in order, with its values, sizes and counts."""
    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "10us", "network_model": "alpha_beta"})
    sizes = [4097, 30_001, 77]  # a multi-bucket push's units: uneven

    def fn(comm):
        if comm.rank < 2:
            comm.compute(0.05 * comm.rank)  # rank 0 pushes at once, rank 1 after the server has posted
            sent = [comm.isend(torch.full((n,), float(10 * comm.rank + u)), 2) for u, n in enumerate(sizes)]
            for handle in sent:
                handle.wait()
            return None
        comm.compute(0.02)  # every push of rank 0 has arrived by now
        taken = {0: [], 1: []}
        bufs = {src: torch.zeros(sizes[0]) for src in (0, 1)}
        receiving = {src: comm.irecv_any(bufs[src], src) for src in (0, 1)}
        while receiving:
            srcs = list(receiving)
            for i in comm.wait_any([receiving[src] for src in srcs]):
                src = srcs[i]
                del receiving[src]
                buf = bufs[src]
                taken[src].append((buf.numel(), buf.unique().tolist(), comm.now()))
                unit = len(taken[src])
                if unit < len(sizes):
                    bufs[src] = torch.zeros(sizes[unit])
                    receiving[src] = comm.irecv_any(bufs[src], src)
        counters = comm.counters()
        return taken, counters.bytes_recv, counters.msgs_recv

    taken, received, messages = _child_call(fn, 3, platform)[2]
    for src in (0, 1):
        assert [(n, values) for n, values, _ in taken[src]] == [(n, [10.0 * src + u]) for u, n in enumerate(sizes)]
    assert all(at == pytest.approx(0.02) for _, _, at in taken[0])  # arrived early: taken when posted
    assert all(at > 0.05 for _, _, at in taken[1])
    assert (received, messages) == (2 * 4 * sum(sizes), 6)
