"""Every parameter-server mode on the simulator and on the kernel-shaped cluster (issue 22.8).

SimGrid: small runs of each mode (dedicated/colocated x update/summation, SSP, async, backups) give exactly the
bytes traffic() declares; the synchronous ones take the traffic model's time (and, where the model is BytePS's
bound, that bound) on a star; the barrier-free ones let a fast worker run ahead of a straggler in simulated time
as far as their setting allows, and the staleness they record follows the simulated schedule. Skipped where
SimGrid is not installed. The kernel-shaped cluster: one tiny sweep of the modes across shaped nodes (root).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pytest

from experiments.cluster import netns
from experiments.config.sweep import RunSpec
from experiments.pipeline.substrate import Run
from experiments.results.dataset import read_runs, read_steps
from experiments.simulate.platform import Platform
from experiments.simulate.substrate import (
    MAX_ACTORS,
    SimGridSubstrate,
    SimSpec,
    Timeline,
    simulate_in_child,
    simulated_actors,
    summarize_simulated,
)
from strategies.cost import byteps_optimum
from strategies.transport.simgrid import simgrid_available

REPO = Path(__file__).resolve().parents[2]

SIMGRID = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")
# alpha_beta: a lone message takes exactly latency + bytes / bandwidth; fifo: a rank's sends leave one at a time,
# as messages to one peer do on its one TCP connection (with "shared" every pushed partition would be a flow of
# its own and none would finish before the last: no pipelining, up to twice the model; docs/simulation.md)
STAR = Platform.parse({"bandwidth": "1Gbit", "latency": "20us", "network_model": "alpha_beta", "nic": "fifo"})


def _simulate(params: dict, workers: int, timeline: Timeline, steps: int = 1, platform: Platform = STAR,
              bucket_mb: float | None = None, **settings) -> tuple[dict, pd.DataFrame]:
    spec = RunSpec(sweep="test", strategy="parameter_server", workers=workers, steps=steps, warmup_steps=0,
                   link={"bandwidth": "1Gbit", "latency": "20us"}, strategy_params=params, **settings)
    substrate = SimGridSubstrate([(spec, SimSpec(platform, timeline, bucket_mb))])
    (run,) = substrate.runs()
    substrate.check([run])
    results, error, wall = simulate_in_child(run.spec, run.settings)
    row, steps_rows = summarize_simulated(run.spec, run.settings, results, error, wall, "now", run.run_id)
    assert row["status"] == "ok", row["error"]
    return row, pd.DataFrame(steps_rows)


def _sync_only(numel: int) -> Timeline:
    return Timeline(0.0, 0.0, 0.0, (numel,), (0.0,), "none")


SYNCHRONOUS = [{"servers": 2}, {"servers": 2, "mode": "summation"}, {"servers": 4, "placement": "colocated"},
               {"servers": 4, "placement": "colocated", "mode": "summation"}]


@SIMGRID
@pytest.mark.parametrize("params", SYNCHRONOUS, ids=lambda p: "-".join(map(str, p.values())))
def test_synchronous_modes_move_the_declared_bytes_in_the_traffic_models_time(params):
    """4 workers, 2.5M floats (10 MB, 4 MiB partitions): every rank's bytes equal traffic(); the simulated sync
    within 10% of traffic()'s alpha-beta time, which for colocated servers on every worker is BytePS's bound."""
    row, _ = _simulate(params, 4, _sync_only(2_500_000))
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"] > 0
    assert row["comm_s"] == pytest.approx(row["model_comm_s"], rel=0.10)
    if params.get("placement") == "colocated":  # k = n colocated: M / B x 2(n-1)/n, the allreduce bound
        assert row["comm_s"] == pytest.approx(byteps_optimum(4, 0, 10e6, STAR.bandwidth), rel=0.10)


@SIMGRID
def test_dedicated_servers_with_small_partitions_reach_bytepss_optimum():
    """k = n = 4 dedicated servers, 64 KiB partitions of 8 MB: the fill (one partition's fan-out) is small and the
    sync takes BytePS's optimum, M / B, within 10% (a ring would take 2(n-1)/n M / B = 1.5x as long)."""
    row, _ = _simulate({"servers": 4, "partition_mb": 0.0625}, 4, _sync_only(2_000_000))
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"]
    optimum = byteps_optimum(4, 4, 8e6, STAR.bandwidth)
    assert optimum == pytest.approx(8e6 / STAR.bandwidth)
    assert row["comm_s"] == pytest.approx(optimum, rel=0.10)


# compute-bound steps: 30 ms of compute, 90 ms for the straggler (rank 1, x3), 0.4 MB of gradients per push
STRAGGLING = Timeline(0.01, 0.02, 0.0, (100_000,), (0.0,), "fixed")
STRAGGLER = {"ranks": [1], "slowdown": 3.0}


def _worker_steps(steps: pd.DataFrame) -> pd.DataFrame:
    workers = steps[steps["role"] == "worker"].copy()
    workers["step_s"] = workers["compute_s"] + workers["comm_s"]
    return workers


@SIMGRID
@pytest.mark.parametrize("mode", ["update", "summation"])
def test_async_fast_workers_do_not_wait_for_the_straggler_and_staleness_follows_the_schedule(mode):
    """async: the fast workers' steps after the first take their own compute plus a push/pull (no wait for the
    straggler's 90 ms), the straggler's take its own; each push's staleness is the number of other workers'
    pushes the server took since this worker's previous reply: recomputed here from the simulated times at
    which each worker's steps ended (from step 2 on: every step-0 push leaves when the straggler reaches the
    first sync's size check, in an order the times cannot tell)."""
    row, steps = _simulate({"servers": 1, "staleness": "async", "mode": mode}, 4, STRAGGLING, steps=6,
                           straggler=STRAGGLER)
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"] > 0
    workers = _worker_steps(steps)
    later = workers[workers["step"] > 0]  # step 0 also checks sizes on the control plane: everyone meets there
    fast, slow = later[later["rank"] != 1]["step_s"], later[later["rank"] == 1]["step_s"]
    assert fast.max() < 0.06 and slow.min() > 0.09, (fast.tolist(), slow.tolist())
    # the push of step t leaves when that step's compute ends: wall_s (its end) - comm_s
    workers["push_s"] = workers["wall_s"] - workers["comm_s"]
    pushes = workers.sort_values("push_s")[["rank", "step", "push_s"]].values.tolist()
    # pushes at the same simulated time (the fast workers leave step 0 together) reach the server in an order the
    # times cannot tell: such a tie may or may not count, so the staleness is bounded by the strict and the
    # closed interval, exact where nobody ties
    bounds = {}
    for rank, step, push_s in pushes:
        if step < 2:
            continue
        since = next(p for r, s, p in pushes if r == rank and s == step - 1)
        others = [p for r, _, p in pushes if r != rank]
        bounds[(int(rank), int(step))] = (sum(1 for p in others if since + 1e-9 < p < push_s - 1e-9),
                                          sum(1 for p in others if since - 1e-9 <= p <= push_s + 1e-9))
    server = steps[steps["role"] == "server"].sort_values("step")
    got = {(w, int(s)): v for s, values in zip(server["step"], server["staleness"]) for w, v in enumerate(values)}
    outside = {key: (got[key], low, high) for key, (low, high) in bounds.items() if not low <= got[key] <= high}
    assert not outside, outside
    assert sum(low == high for low, high in bounds.values()) >= len(bounds) // 2  # mostly exact, not a range
    assert got[(1, 2)] >= 5  # the straggler's pushes are the stale ones: 3 fast workers, 2.5 steps each meanwhile


@SIMGRID
def test_ssp_holds_fast_workers_at_the_bound_and_backups_drop_the_straggler():
    """SSP s = 1: a fast worker runs at most one step ahead of the straggler, then waits for it at the bound
    (time recorded on the server); staleness stays below (n - 1)(2s + 1). backups = 1: every step is made of
    the 3 fast pushes, the straggler's is dropped, and nobody waits for it."""
    s, n = 1, 4
    row, steps = _simulate({"servers": 1, "staleness": s}, n, STRAGGLING, steps=6, straggler=STRAGGLER)
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"]
    workers = _worker_steps(steps)
    server = steps[steps["role"] == "server"]
    assert server["bound_wait_s"].sum() > 0.1
    assert max(max(v) for v in server["staleness"]) <= (n - 1) * (2 * s + 1)
    ends = workers.pivot(index="step", columns="rank", values="wall_s")
    # the step a fast worker finishes by the time the straggler finishes step t is at most t + s + 1
    for t in range(4):
        ahead = (ends.drop(columns=1) <= ends.loc[t, 1] + 1e-9).sum().max() - 1
        assert ahead <= t + s + 1, ends
    row, steps = _simulate({"servers": 1, "backups": 1}, n, STRAGGLING, steps=4, straggler=STRAGGLER)
    server = steps[steps["role"] == "server"]
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"]
    assert server["dropped_pushes"].tolist() == [1, 1, 1, 1]
    later = _worker_steps(steps).query("step > 0 and rank != 1")
    assert later["step_s"].max() < 0.06  # the straggler's step takes 0.09 s
    # the run's pace: the slowest rank's step time, and beside it the fastest worker's, at which the servers'
    # parameters advance (time to target uses it)
    assert row["fast_step_s"] < 0.06 < 0.09 <= row["step_time_s"] + 1e-9, (row["fast_step_s"], row["step_time_s"])


# one flat bucket (a sweep's default) of 544k floats cut into 0.25 MiB partitions: each server holds several
# units, so a worker's next push has often arrived before the server posts its receive (the small runs above hold
# one unit per server); 0.5 MiB buckets: several buckets, whose sizes the workers check between their pushes
MULTI_UNIT = Timeline.fixed(0.002, 0.004, 0.001, (4097, 300_001, 77, 90_000, 150_000))
SHARED_STAR = Platform.parse({"bandwidth": "10Gbit", "latency": "20us", "network_model": "tcp", "nic": "shared"})
FIFO_STAR = Platform.parse({"bandwidth": "10Gbit", "latency": "20us", "network_model": "tcp", "nic": "fifo"})
BARRIER_FREE = [{"staleness": "async"}, {"staleness": 2, "mode": "summation"}, {"backups": 1}, {"staleness": 10**6}]
BARRIER_FREE_IDS = ["async", "ssp2-summation", "backups1", "ssp1e6"]  # 10^6: the largest staleness accepted


def _barrier_free_on_many_units(params: dict, nic: str, bucket_mb: float | None) -> None:
    platform = SHARED_STAR if nic == "shared" else FIFO_STAR
    steps = 3
    row, rows = _simulate({"servers": 2, "partition_mb": 0.25, **params}, 4, MULTI_UNIT, steps=steps,
                          platform=platform, bucket_mb=bucket_mb, straggler={"ranks": [1], "slowdown": 2.0})
    assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"] > 0
    server = rows[rows["role"] == "server"]
    assert len(server) == 2 * steps
    if "backups" in params:  # the straggler's push of every step is late, on both servers
        assert (server["dropped_pushes"] == 1).all(), server["dropped_pushes"].tolist()


@SIMGRID
@pytest.mark.parametrize("nic", ["shared", "fifo"])
@pytest.mark.parametrize("params", BARRIER_FREE, ids=BARRIER_FREE_IDS)
def test_barrier_free_servers_take_pushes_that_arrived_before_their_receive_on_many_units(params, nic):
    """The ResNet-50 sweep that failed with pybind11's TypeError on simgrid.PyGetAsync (or aborted), in small: 4
    workers and 2 servers on a 10 Gbit/s star, worker 1 twice as slow, one bucket of several partitions per
    server, a few steps, NICs shared and fifo: every barrier-free mode runs, with the declared bytes, and
    backups drop the straggler's push of every step."""
    _barrier_free_on_many_units(params, nic, None)


@SIMGRID
@pytest.mark.parametrize("params", BARRIER_FREE[:3], ids=BARRIER_FREE_IDS[:3])
def test_barrier_free_servers_serve_several_buckets_while_the_workers_check_their_sizes(params):
    """Several buckets: a worker checks bucket b + 1's size on the control plane only once bucket b's replies are
    in, so the server's checks run beside its serving loop (run before it, they deadlocked the simulation)."""
    _barrier_free_on_many_units(params, "fifo", 0.5)


def test_barrier_free_servers_need_no_actor_per_worker_and_too_many_ranks_are_refused_before_work():
    """A barrier-free server serves all its workers from its one actor: 1,024 workers x 128 async servers need
    1,152 SimGrid actors (OS threads), not 132k, and are accepted as the synchronous servers are; a run of more
    ranks than MAX_ACTORS is refused before work, naming the count."""
    substrate = SimGridSubstrate([])
    for staleness in ("async", 2, 0):
        spec = RunSpec(strategy="parameter_server", workers=1024, link={"bandwidth": "10Gbit"},
                       strategy_params={"servers": 128, "staleness": staleness})
        assert simulated_actors(spec, spec.strategy_config()) == 1152
        assert substrate.problems(Run(spec.run_id, spec)) == []
    spec = RunSpec(strategy="parameter_server", workers=MAX_ACTORS, link={"bandwidth": "10Gbit"},
                   strategy_params={"servers": 1, "staleness": "async"})
    problems = substrate.problems(Run(spec.run_id, spec))
    assert len(problems) == 1 and f"{MAX_ACTORS + 1:,} SimGrid actors (each an OS thread, one per rank) exceed " \
        f"this simulator's {MAX_ACTORS:,}" in problems[0], problems


# -- the kernel-shaped cluster ---------------------------------------------------------------------------------

NETNS_PROBLEM = netns.support_problem()
NODES = 3
# every mode in one sweep whose variants hold only valid combinations (barrier-free servers are dedicated; backups
# are synchronous): 2 workers and 1 server, 3 shaped nodes, over gloo (a barrier-free server receives from a thread
# per worker, which the sockets transport refuses; the synchronous server over sockets crosses the shaped nodes in
# test_cluster_netns's sweep of every strategy)
PS_SWEEP = """
name = "kernel-ps"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 2
warmup_steps = 1
workers = 2
timeout = 60
p2p = "gloo"
link = { bandwidth = "1Gbit", emulation = "kernel" }
[grid]
strategy = ["parameter_server"]
[[strategy_params.parameter_server]]
servers = 1
placement = ["dedicated", "colocated"]
mode = ["update", "summation"]
[[strategy_params.parameter_server]]
servers = 1
mode = ["update", "summation"]
staleness = [2, "async"]
[[strategy_params.parameter_server]]
servers = 1
mode = ["update", "summation"]
backups = 1
"""


@pytest.fixture(scope="module")
def ps_cluster():
    """A 3-node, 1 Gbit/s namespace cluster under a name and state directory of this module's own; always down."""
    saved = os.environ.get(netns.STATE_ENV)
    root = tempfile.mkdtemp(prefix="sbp", dir="/tmp")  # short: Ray's socket paths in it must fit in 107 bytes
    os.environ[netns.STATE_ENV] = root
    name = f"p{os.getpid() % 100000}"
    try:
        # Ray's memory monitor kills a node's actors when the whole machine passes 95% of its memory: on a machine
        # shared with other jobs that is theirs, not these runs' (about 1 GB): off for this cluster's nodes
        up = _syncbench("cluster", "up", "--nodes", str(NODES), "--bandwidth", "1Gbit", "--name", name,
                        env={**os.environ, "RAY_memory_monitor_refresh_ms": "0"})
        assert up.returncode == 0, up.stderr[-3000:]
        yield netns.Cluster.load(name)
    finally:
        netns.down(name, log=lambda *_: None)
        shutil.rmtree(root, ignore_errors=True)
        if saved is None:
            os.environ.pop(netns.STATE_ENV, None)
        else:
            os.environ[netns.STATE_ENV] = saved


def _syncbench(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.ray
@pytest.mark.netns
@pytest.mark.timeout(1800)  # a cluster up and a sweep: minutes on a loaded machine
@pytest.mark.skipif(NETNS_PROBLEM is not None, reason=f"no namespace cluster here: {NETNS_PROBLEM}")
def test_every_parameter_server_mode_runs_across_kernel_shaped_nodes(ps_cluster, tmp_path):
    """Dedicated/colocated x update/summation, SSP, async and backups on 2 workers (+1 server node) in one sweep over
    real TCP through tc-shaped links: every run ok with traffic()'s bytes, the barrier-free ones with their staleness
    recorded on the server rows, and the namespaces gone after `down` (the fixture)."""
    sweep = tmp_path / "ps.toml"
    sweep.write_text(PS_SWEEP)
    done = _syncbench("run", str(sweep), "--out", str(tmp_path / "ps"), "--no-report", "--address",
                      ps_cluster.address)
    assert done.returncode == 0, done.stderr[-4000:]
    runs, steps = read_runs(tmp_path / "ps"), read_steps(tmp_path / "ps")
    assert len(runs) == 10 and (runs["status"] == "ok").all(), runs[["run_id", "error"]].to_string()  # 4 + 4 + 2
    servers = steps[steps["role"] == "server"]
    barrier_free = 0
    for run in runs.to_dict("records"):
        staleness = run["param_staleness"]  # a union (int | str): a value, or a struct with one member set
        if isinstance(staleness, dict):
            staleness = next((v for v in staleness.values() if v is not None), None)
        stale = staleness not in (None, 0)
        mine = servers[servers["run_id"] == run["run_id"]]
        if stale or (run["param_backups"] or 0) > 0:  # one server row per step, every stale push recorded
            barrier_free += 1
            assert len(mine) == 2, (run["run_id"], mine)
            if stale:
                assert all(len(s) == 2 for s in mine["staleness"]), mine["staleness"].tolist()
    assert barrier_free == 6  # 4 stale (SSP, async x update, summation) + 2 with backups
    assert set(runs["link"]) == {"1Gbit kernel"}
    assert (runs["bytes_sent_per_worker"] == runs["analytic_bytes_sent_per_worker"]).all()


def test_barrier_free_servers_over_the_sockets_transport_are_refused_on_ray_before_work():
    """Measured on the kernel-shaped cluster: a barrier-free server's per-worker threads over p2p = "sockets"
    failed ("concurrent poll() invocation"), so the Ray substrate refuses them naming p2p; gloo and the
    synchronous server are accepted."""
    from experiments.pipeline.ray_substrate import RaySubstrate

    ray = RaySubstrate.__new__(RaySubstrate)
    for p2p, params, refused in (("sockets", {"staleness": 2}, True), ("sockets", {"backups": 1}, True),
                                 ("gloo", {"staleness": "async"}, False), ("sockets", {}, False)):
        spec = RunSpec(strategy="parameter_server", workers=2, p2p=p2p, strategy_params={"servers": 1, **params})
        problems = ray.problems(Run(spec.run_id, spec))
        assert bool(problems) == refused and all("p2p = 'sockets'" in p for p in problems), (p2p, params, problems)
