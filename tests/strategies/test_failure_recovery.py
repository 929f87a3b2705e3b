"""Failures on thread ranks: each strategy family and recovery mode against hand-worked survivors' results."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import strategies
from strategies.decentralized import TOPOLOGIES
from strategies.fault_runs import run_with_failures
from strategies.faults import (
    Failure,
    FaultSettingError,
    Recovery,
    check_fits,
    check_schedule,
    connected,
    draw_failures,
    metropolis,
    spectral_gap,
    survivors_graph,
)

# Three workers with constant gradients 1, 2 and 6 (lr 1, x0 = 0), four steps; rank 2 dies during step 2.
# Steps 0-1 move x by the mean of all three, 3 each: x = -6 after step 1.
C = {0: 1.0, 1: 2.0, 2: 6.0}


def constant(slot, step, x):
    return np.full_like(x, C[slot])


def scripted(name, recovery, **params):
    return run_with_failures(name, 3, 4, [Failure(step=2, rank=2)], recovery, np.zeros(1), constant, 1.0, **params)


@pytest.mark.parametrize("name", ["ring", "halving_doubling", "double_binary_tree"])
def test_elastic_survivors_mean_from_the_step_in_flight(name):
    # survivors redo step 2 at n - 1: steps 2-3 move x by (1 + 2) / 2 each: -6 - 3 = -9; nothing lost
    run = scripted(name, Recovery("elastic"))
    assert {slot: x.tolist() for slot, x in run.params.items()} == {0: [-9.0], 1: [-9.0]}
    assert (run.completed_steps, run.steps_run, run.ended) == (4, 4, None)
    [record] = run.failures
    assert (record.step, record.rank, record.steps_lost, record.survivors) == (2, 2, 0, 2)
    assert 0 <= record.recovery_s < 2


@pytest.mark.parametrize("name", ["ring", "halving_doubling", "double_binary_tree"])
def test_elastic_replacement_joins_and_fetches_parameters(name):
    # step 2 at n - 1 (-1.5), the replacement joins at step 3 holding x = -7.5 fetched from a peer: the mean of
    # all three again (-3): -10.5 on every rank, the replacement's included
    run = scripted(name, Recovery("elastic", rejoin_steps=1))
    assert {slot: x.tolist() for slot, x in run.params.items()} == {0: [-10.5], 1: [-10.5], 2: [-10.5]}
    assert (run.completed_steps, run.steps_run) == (4, 4)


@pytest.mark.parametrize("name, params", [("ring", {}), ("halving_doubling", {}), ("double_binary_tree", {}),
                                          ("parameter_server", {}), ("decentralized", {})])
def test_checkpoint_restart_loses_the_steps_since_the_checkpoint(name, params):
    # checkpoints after steps 0 and 3 (every 3): the failure in step 2 throws away steps 0-1 (2 steps lost), all
    # three restart from x0 and run steps 0-3 again: the failure-free result, 4 x -3 = -12, after 6 steps run
    run = scripted(name, Recovery("checkpoint_restart", checkpoint_every=3), **params)
    assert run.params.keys() == {0, 1, 2}  # neighbour averaging by thirds rounds in the last bit: approx
    assert all(x.tolist() == pytest.approx([-12.0], abs=1e-12) for x in run.params.values())
    assert (run.completed_steps, run.steps_run) == (4, 6)
    [record] = run.failures
    assert (record.steps_lost, record.survivors) == (2, 3)


def test_synchronous_parameter_server_barrier_shrinks():
    run = scripted("parameter_server", Recovery("ps_shrink"))
    assert {slot: x.tolist() for slot, x in run.params.items()} == {0: [-9.0], 1: [-9.0]}
    assert (run.completed_steps, run.failures[0].steps_lost) == (4, 0)


def test_shrunk_server_barrier_grows_back_when_rank_0_is_replaced():
    # rank 0 dies in step 2: the survivors' mean (2 + 6) / 2 moves x from -6 to -10; slot 0's replacement fetches
    # -10 at step 3 (the server sizes its step by the run's parameters, not by slot 0's, which it has not yet)
    run = run_with_failures("parameter_server", 3, 4, [Failure(step=2, rank=0)], Recovery("ps_shrink", rejoin_steps=1),
                            np.zeros(1), constant, 1.0)
    assert {slot: x.tolist() for slot, x in run.params.items()} == {0: [-13.0], 1: [-13.0], 2: [-13.0]}


def test_barrier_free_parameter_server_changes_nothing():
    # gradients 3, 6 and 18: every push moves the server's x by lr * g / 3 (1, 2 or 6: exact in binary, so any
    # order of arrival sums to the same bits) as it arrives: the survivors push all 4 steps, rank 2 its first 2:
    # x = -(4 x 1 + 4 x 2 + 2 x 6) = -24
    run = run_with_failures("parameter_server", 3, 4, [Failure(step=2, rank=2)], Recovery("ps_shrink"), np.zeros(1),
                            lambda slot, step, x: np.full_like(x, (3.0, 6.0, 18.0)[slot]), 1.0, staleness="async")
    assert run.params["server"].tolist() == [-24.0]
    assert run.pushes == {0: 4, 1: 4, 2: 2}
    assert sorted(k for k in run.params if k != "server") == [0, 1]
    assert (run.completed_steps, run.failures[0].steps_lost, run.failures[0].recovery_s) == (4, 0, 0.0)


def test_decentralized_reweights_the_survivors():
    # ring of 4, uniform weights 1/3; gradients 0, 3, 6, 9; rank 3 dies during step 1.
    # step 0: local x = [0, -3, -6, -9], mixed: [-4, -3, -6, -5]
    # step 1: survivors 0 - 1 - 2 (a path), Metropolis: W = [[2/3, 1/3, 0], [1/3, 1/3, 1/3], [0, 1/3, 2/3]];
    # local x = [-4, -6, -12], mixed: [-14/3, -22/3, -10]; W's eigenvalues 1, 2/3, 0: spectral gap 1/3
    run = run_with_failures("decentralized", 4, 2, [Failure(step=1, rank=3)], Recovery("reweight"), np.zeros(1),
                            lambda slot, step, x: np.full_like(x, 3.0 * slot), 1.0)
    got = {slot: x.tolist() for slot, x in run.params.items()}
    assert got.keys() == {0, 1, 2}
    assert np.allclose([got[0][0], got[1][0], got[2][0]], [-14 / 3, -22 / 3, -10], rtol=0, atol=1e-12)
    [mixing] = run.mixings
    assert mixing.survivors == (0, 1, 2)
    assert np.allclose(mixing.matrix, [[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]])
    assert mixing.spectral_gap == pytest.approx(1 / 3)
    assert (run.completed_steps, run.failures[0].survivors) == (2, 3)


def test_decentralized_graph_falling_apart_ends_the_run_with_its_cause():
    # ranks 1 and 3 of a ring of 4 die together: 0 and 2 are no longer neighbours
    run = run_with_failures("decentralized", 4, 5, [Failure(step=3, rank=1), Failure(step=3, rank=3)],
                            Recovery("reweight"), np.zeros(2), lambda slot, step, x: x - slot, 0.5)
    assert run.ended is not None and "disconnected" in run.ended.cause and "{0: [], 2: []}" in run.ended.cause
    assert run.ended.completed_steps == 3 and run.completed_steps == 3
    assert [(r.step, r.rank, r.steps_lost) for r in run.failures] == [(3, 1, 0), (3, 3, 0)]
    assert all(np.isnan(r.recovery_s) for r in run.failures)  # never recovered
    assert run.params.keys() == {0, 2}  # the survivors' parameters after the 3 completed steps are kept


def test_elastic_last_worker_failing_ends_the_run():
    run = run_with_failures("ring", 1, 3, [Failure(step=1, rank=0)], Recovery("elastic"), np.zeros(1), constant, 1.0)
    assert run.ended is not None and "no worker left" in run.ended.cause and run.completed_steps == 1


@pytest.mark.parametrize("name", ["ring", "parameter_server", "decentralized"])
def test_without_recovery_the_first_failure_ends_the_run(name):
    run = scripted(name, Recovery("none"))
    assert run.ended is not None and "recovery.mode = 'none'" in run.ended.cause
    assert run.completed_steps == 2 and run.ended.completed_steps == 2
    assert all(x.tolist() == [-6.0] for x in run.params.values())  # steps 0-1 kept


def quadratic(slot, step, x):
    target = np.random.default_rng([slot, step]).standard_normal(x.shape).astype(x.dtype)
    return x - target


@pytest.mark.parametrize("name", ["ring", "halving_doubling", "double_binary_tree", "parameter_server",
                                  "decentralized"])
def test_checkpoint_restart_resumes_bit_identically(name):
    x0 = np.linspace(-1, 1, 7, dtype=np.float32)
    recovery = Recovery("checkpoint_restart", checkpoint_every=3)
    clean = run_with_failures(name, 4, 7, [], recovery, x0, quadratic, 0.25)
    failed = run_with_failures(name, 4, 7, [Failure(step=5, rank=1), Failure(step=6, rank=3)], recovery, x0,
                               quadratic, 0.25)
    assert clean.params.keys() == failed.params.keys() == {0, 1, 2, 3}
    for slot in clean.params:
        assert clean.params[slot].tobytes() == failed.params[slot].tobytes()
    # checkpoints once 3 and 6 steps are complete: step 5's failure goes back to 3 (steps 3-4 lost and redone),
    # step 6's to 6 (nothing lost)
    assert [(r.step, r.steps_lost) for r in failed.failures] == [(5, 2), (6, 0)]
    assert all(r.steps_lost <= 3 for r in failed.failures)
    assert failed.steps_run == 7 + 2


@pytest.mark.parametrize("name, mode", [("ring", "elastic"), ("halving_doubling", "elastic"),
                                        ("double_binary_tree", "elastic"), ("parameter_server", "ps_shrink")])
def test_two_failures_and_rejoins_match_the_survivors_reference(name, mode):
    """5 workers (4 and 3 after the failures: halving-doubling folds the odd ones), x-dependent gradients: each
    step averages the gradients of the slots alive then; the replacements fetch x from a peer."""
    x0 = np.arange(4, dtype=np.float64)
    failures = [Failure(step=2, rank=4), Failure(step=4, rank=1)]
    run = run_with_failures(name, 5, 8, failures, Recovery(mode, rejoin_steps=3), x0, quadratic, 0.5)
    alive_at = {0: range(5), 1: range(5), 2: [0, 1, 2, 3], 3: [0, 1, 2, 3], 4: [0, 2, 3], 5: [0, 2, 3, 4],
                6: [0, 2, 3, 4], 7: range(5)}  # 4 rejoins at step 2 + 3, 1 at step 4 + 3
    x = x0.copy()
    for step in range(8):
        x = x - 0.5 * np.mean([quadratic(s, step, x) for s in alive_at[step]], axis=0)
    assert run.params.keys() == {0, 1, 2, 3, 4}
    for got in run.params.values():
        np.testing.assert_allclose(got, x, rtol=1e-12, atol=1e-12)
    assert [(r.step, r.rank, r.steps_lost, r.survivors) for r in run.failures] == [(2, 4, 0, 4), (4, 1, 0, 3)]


def test_server_failure_restarts_from_the_checkpoint():
    # the server (rank 3 of 3 workers + 1 server) dies during step 2: the same -12 after a restart from step 0
    run = run_with_failures("parameter_server", 3, 4, [Failure(step=2, rank=3)],
                            Recovery("checkpoint_restart", checkpoint_every=3), np.zeros(1), constant, 1.0)
    assert run.params[0].tolist() == [-12.0] and run.failures[0].steps_lost == 2


# -- the mixing matrix after failures -------------------------------------------------------------------------

@pytest.mark.parametrize("topology", [t for t in TOPOLOGIES if t != "one_peer_exponential"])
def test_reweighted_mixing_stays_doubly_stochastic(topology):
    config = strategies.make("decentralized", topology=topology)
    checked = 0
    for workers in (5, 6, 8, 9):
        for failed in itertools.chain(itertools.combinations(range(workers), 1),
                                      itertools.combinations(range(workers), 2)):
            alive, peers = survivors_graph(config, workers, failed)
            assert alive == [r for r in range(workers) if r not in failed]
            if not connected(peers):
                continue
            w = metropolis(peers)
            assert np.allclose(w.sum(axis=0), 1) and np.allclose(w.sum(axis=1), 1)
            assert np.allclose(w, w.T) and (w >= -1e-15).all()
            gap = spectral_gap(w)
            assert 0 < gap <= 1
            assert gap == pytest.approx(1 - sorted(abs(np.linalg.eigvalsh(w)))[-2], abs=1e-9)
            checked += 1
    assert checked > 50


def test_disconnected_survivors_have_no_spectral_gap():
    config = strategies.make("decentralized", topology="ring")
    _, peers = survivors_graph(config, 6, [1, 4])
    assert not connected(peers)
    assert spectral_gap(metropolis(peers)) == pytest.approx(0, abs=1e-12)


# -- settings refused before any work ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode, name, params, words", [
    ("elastic", "parameter_server", {}, "accepted are ring"),
    ("elastic", "decentralized", {}, "does not fit strategy 'decentralized'"),
    ("elastic", "ddp", {}, "does not fit strategy 'ddp'"),
    ("ps_shrink", "ring", {}, "accepted are strategies with server ranks"),
    ("ps_shrink", "parameter_server", {"placement": "colocated"}, "placement = 'dedicated'"),
    ("reweight", "ring", {}, "accepted is decentralized"),
    ("reweight", "decentralized", {"topology": "one_peer_exponential"}, "symmetric graph"),
    ("retry", "ring", {}, "accepted are none, checkpoint_restart, elastic, ps_shrink, reweight"),
])
def test_a_mode_is_refused_for_strategies_it_does_not_fit(mode, name, params, words):
    with pytest.raises(FaultSettingError, match=words.replace("(", r"\(")):
        check_fits(mode, strategies.make(name, **params), 4)


def test_ps_shrink_refuses_a_server_failure_before_work():
    with pytest.raises(FaultSettingError, match="server rank 4 at step 1.*checkpoint_restart"):
        run_with_failures("parameter_server", 4, 3, [Failure(step=1, rank=4)], Recovery("ps_shrink"), np.zeros(1),
                          constant, 1.0)


@pytest.mark.parametrize("kwargs, words", [
    ({"mode": "checkpoint_restart"}, "checkpoint_every = 0"),
    ({"mode": "checkpoint_restart", "checkpoint_every": 2.5}, "whole number"),
    ({"mode": "elastic", "checkpoint_every": 3}, "checkpoint_restart only"),
    ({"mode": "reweight", "rejoin_steps": 2}, "elastic and ps_shrink only"),
    ({"mode": "elastic", "rejoin_steps": 0}, "rejoin_steps = 0"),
    ({"mode": "restart"}, "recovery.mode = 'restart'"),
])
def test_recovery_settings_are_checked(kwargs, words):
    with pytest.raises(FaultSettingError, match=words):
        Recovery(**kwargs)


@pytest.mark.parametrize("failures, words", [
    ([Failure(step=1, rank=4)], "failure rank = 4: the run has ranks 0..3"),
    ([Failure(step=9, rank=0)], "failure step = 9: the run has steps 0..8"),
    ([Failure(step=-1, rank=0)], "failure step = -1"),
    ([Failure(step=2, rank=1), Failure(step=2, rank=1)], "listed twice"),
])
def test_schedule_outside_the_run_is_refused(failures, words):
    with pytest.raises(FaultSettingError, match=words):
        check_schedule(failures, 4, 9)


def test_a_failure_rate_draws_seeded_exponential_failures():
    a = draw_failures(100, mtbf_s=50.0, step_s=1.0, steps=500, seed=7)
    assert a == draw_failures(100, mtbf_s=50.0, step_s=1.0, steps=500, seed=7)
    assert a != draw_failures(100, mtbf_s=50.0, step_s=1.0, steps=500, seed=8)
    # a renewal process per slot: about workers x horizon / mtbf = 1,000 failures (Poisson, sd about 32)
    assert abs(len(a) - 1000) < 5 * 32
    assert all(0 <= f.step < 500 and 0 <= f.rank < 100 for f in a)
    with pytest.raises(FaultSettingError, match="mtbf_s = 0"):
        draw_failures(4, 0, 1.0, 10, 0)
    with pytest.raises(FaultSettingError, match="expects 1,000,000 failures"):
        draw_failures(1000, 1.0, 1.0, 1000, 0)


def test_a_barrier_free_server_runs_its_failures_with_ps_shrink_only_on_thread_ranks():
    with pytest.raises(FaultSettingError, match="barrier-free parameter server .* ps_shrink only"):
        run_with_failures("parameter_server", 3, 4, [Failure(step=2, rank=1)], Recovery("none"), np.zeros(1),
                          constant, 1.0, staleness="async")


def test_one_rank_failing_twice_restarts_twice_in_order():
    # checkpoints every 2 steps; rank 1 dies in step 3 (back to 2: 1 lost), then, replaced, again in step 5 (back to
    # 4: 1 lost): 6 + 2 steps run, the failure-free result
    recovery = Recovery("checkpoint_restart", checkpoint_every=2)
    x0 = np.linspace(-1, 1, 3)
    run = run_with_failures("ring", 3, 6, [Failure(step=5, rank=1), Failure(step=3, rank=1)], recovery, x0,
                            quadratic, 0.25)
    clean = run_with_failures("ring", 3, 6, [], recovery, x0, quadratic, 0.25)
    assert [(r.step, r.rank, r.steps_lost) for r in run.failures] == [(3, 1, 1), (5, 1, 1)]
    assert run.steps_run == 8 and run.params[0].tobytes() == clean.params[0].tobytes()
