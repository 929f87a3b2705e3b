"""SimGrid's sharing as a platform choice (experiments/simulate/platform.py): 'full' everywhere by default, 'lazy' only
for the ring on the alpha-beta star with shared NICs, where no link carries two flows and the lazy update has
nothing to get wrong; what makes the ring's step at 1,024 ranks fit in 10 minutes of simulation."""

from __future__ import annotations

import time

import pytest

from experiments.cli.main import main
from experiments.simulate.faults import FaultSim, step_seconds
from experiments.simulate.platform import Platform
from experiments.simulate.ring_replay import ReplayedRingSteps, ring_step_seconds
from experiments.simulate.substrate import run_child
from strategies.fault_cost import FaultCosts
from strategies.transport.simgrid import simgrid_available

COSTS = FaultCosts(step_s=1.0, detect_s=0.5, reform_s=0.3, rejoin_s=3.0)
LAZY = Platform(network_model="alpha_beta", sharing="lazy")
FULL = Platform(network_model="alpha_beta")


def test_full_is_the_default_and_lazy_drops_only_the_exact_solver():
    assert Platform().sharing == "full" and "network/optim:Full" in Platform().config
    assert "network/optim:Full" in FULL.config and "network/model:LV08" in Platform().config
    assert LAZY.config == tuple(c for c in FULL.config if c != "network/optim:Full")
    assert Platform.parse({"network_model": "alpha_beta", "sharing": "lazy"}) == LAZY


@pytest.mark.parametrize("spec, words", [
    ({"sharing": "eager"}, "sharing = 'eager': accepted are 'full'"),
    ({"network_model": "tcp", "sharing": "lazy"}, "sharing = 'lazy' on star, tcp, nic shared: accepted on the star"),
    ({"network_model": "alpha_beta", "topology": "fat_tree", "sharing": "lazy"}, "on fat_tree, alpha_beta"),
    ({"network_model": "alpha_beta", "topology": "nodes", "sharing": "lazy"}, "on nodes, alpha_beta"),
    ({"network_model": "alpha_beta", "nic": "fifo", "sharing": "lazy"}, "nic fifo: accepted on the star"),
])
def test_lazy_sharing_is_refused_off_the_star_of_shared_nics(spec, words):
    with pytest.raises(ValueError, match=words):
        Platform.parse(spec)


@pytest.mark.parametrize("strategy, mode, params", [
    ("parameter_server", "ps_shrink", {"servers": 2}),  # every worker's push shares its server's NIC
    ("halving_doubling", "elastic", {}),
    ("ring", "elastic", {"compression": "topk", "topk_ratio": 0.1}),  # its allgather of indices and values
])
def test_lazy_sharing_is_refused_for_strategies_whose_flows_share_links(strategy, mode, params):
    with pytest.raises(ValueError, match=f"platform sharing = 'lazy' with {strategy}.*accepted for ring"):
        FaultSim(strategy, 8, 10, mode, 20.0, COSTS, params=params, platform=LAZY)
    FaultSim(strategy, 8, 10, mode, 20.0, COSTS, params=params, platform=FULL)  # full: accepted


@pytest.mark.parametrize("workers, live, numel", [(8, 7, 1_000_003), (16, 13, 100_003)])
@pytest.mark.simgrid
@pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")
def test_lazy_and_full_sharing_give_the_rings_step_alike(workers, live, numel):
    steps = {}
    for platform in (LAZY, FULL):
        sim = FaultSim("ring", workers, 10, "elastic", 20.0, COSTS, numel=numel, platform=platform)
        done = run_child(lambda sim=sim: step_seconds(sim, live))
        assert not done.error, done.error
        steps[platform.sharing] = done.result[0]
    want = ring_step_seconds(live, numel, 0.1 * workers / live, FULL.latency, FULL.bandwidth)
    assert steps["lazy"] == pytest.approx(steps["full"], rel=1e-12, abs=0)
    assert steps["lazy"] == pytest.approx(want, rel=1e-12, abs=0)


def test_the_step_at_n_alone_is_used_only_once_the_replay_gives_it():
    # checkpoint_restart asks for the step at n only: it is checked against the replay too (lazy sharing's check)
    sim = FaultSim("ring", 8, 10, "checkpoint_restart", 20.0, COSTS, checkpoint_every=2, numel=1000, platform=LAZY)
    right = ring_step_seconds(8, 1000, 0.1, LAZY.latency, LAZY.bandwidth)
    assert ReplayedRingSteps(sim, known={8: right})(8) == right
    with pytest.raises(RuntimeError, match="the ring replay gives .* over 1e-09; not used"):
        ReplayedRingSteps(sim, known={8: right * (1 + 1e-6)})(8)


@pytest.mark.simgrid
@pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")
def test_replay_shrunk_simulates_the_ring_with_lazy_sharing_to_the_same_rows(capsys):
    argv = ["faults", "--simulate", "2", "--workers", "4", "--steps", "40", "--mtbf", "30s", "--compose",
            "--numel", "10000", "--checkpoint-every", "0", "--modes", "elastic,checkpoint_restart"]
    started = time.perf_counter()
    assert main(argv + ["--strategy", "ring", "--replay-shrunk"]) == 0
    took = time.perf_counter() - started
    lazy = capsys.readouterr().out.splitlines()
    # the rows' wall: each row's own (the step simulated inside the first row's comparison counted once, not twice)
    walls = [line.split()[-1] for line in lazy if line.startswith("ring")]
    half_unit = sum(0.5 * 10.0 ** -len(w.partition(".")[2]) for w in walls)  # each printed rounded
    assert 0 < sum(float(w) for w in walls) <= took + half_unit
    assert any(line.startswith("#   replayed: 3") and "lazy sharing" in line for line in lazy)
    assert main(argv + ["--strategy", "ring"]) == 0  # full sharing, every size simulated: the same rows
    full = capsys.readouterr().out.splitlines()
    rows = [[line.split()[:9] for line in out if line.startswith("ring")] for out in (lazy, full)]
    assert len(rows[0]) == 2 and rows[0] == rows[1]
