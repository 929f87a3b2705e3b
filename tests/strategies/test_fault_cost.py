"""The failure model: hand-computed values, its limits, and a Monte Carlo of the same failure process."""

from __future__ import annotations

import math

import numpy as np
import pytest

from strategies.fault_cost import (
    FaultCosts,
    checkpoint_restart_time,
    crossover_mtbf,
    daly_interval,
    expected_time,
    shrink_windows,
    time_to_target,
    young_interval,
)
from strategies.faults import FaultSettingError

# 100 workers failing every 100,000 s each: the job fails every M = 1,000 s; 1,000 steps of 1 s
N, MTBF, S = 100, 100_000.0, 1000


def test_young_and_daly_intervals_by_hand():
    # delta = 5 s, M = 1,000 s: Young sqrt(2 x 5 x 1000) = 100; Daly 100 x (1 + sqrt(5/2000)/3 + 5/18000) - 5
    assert young_interval(5, 1000) == pytest.approx(100)
    assert daly_interval(5, 1000) == pytest.approx(100 * (1 + 0.05 / 3 + 5 / 18000) - 5)
    assert daly_interval(5, 1000) == pytest.approx(96.694, abs=1e-3)
    assert daly_interval(3000, 1000) == 1000  # delta >= 2M: one interval of M


def test_checkpoint_restart_by_hand():
    # delta 5, detection 5 + restart 30 = R 35: Daly's interval 96.69 s -> 97 steps;
    # T = 1000 e^(35/1000) (e^((97 + 5)/1000) - 1) x 1000 / 97 = 1000 x 1.0356197 x 0.1073835 x 10.309278 = 1146.48
    costs = FaultCosts(step_s=1.0, detect_s=5, restart_s=30, checkpoint_s=5)
    got = expected_time("checkpoint_restart", S, N, MTBF, costs)
    assert got.checkpoint_every == 97
    assert got.seconds == pytest.approx(1000 * 1.0356197 * 0.1073835 * (1000 / 97), rel=1e-6)
    assert got.seconds == pytest.approx(1146.45, abs=0.05)
    assert got.failures == pytest.approx(got.seconds / 1000)
    # a given interval: every 10 steps costs more checkpoints: 1000 e^0.035 (e^0.015 - 1) x 100
    ten = expected_time("checkpoint_restart", S, N, MTBF, costs, checkpoint_every=10)
    assert ten.seconds == pytest.approx(1000 * math.exp(0.035) * math.expm1(0.015) * 100)
    assert ten.seconds > got.seconds  # the optimum is the optimum
    for every in (60, 80, 120, 150):
        assert expected_time("checkpoint_restart", S, N, MTBF, costs, checkpoint_every=every).seconds >= got.seconds


def test_elastic_and_ps_by_hand():
    costs = FaultCosts(step_s=1.0, step_s_shrunk=1.25, detect_s=5, reform_s=10, rejoin_s=60)
    # elastic: no progress for w = 5 + 10 = 15 s from a failure; its slot missing for r = 60 + 1.25 / 2 = 60.625 s
    # (the replacement joins at the next step boundary); a missing slot cannot fail: lambda = 100 / 100060.625.
    # progress rate = e^(-lambda r) + (e^(-lambda w) - e^(-lambda r)) x 1 / 1.25 - lambda e^(-lambda w) x 0.5
    assert shrink_windows("elastic", costs) == (15, 60.625)
    rate = 100 / 100_060.625
    progress = math.exp(-rate * 60.625) + (math.exp(-rate * 15) - math.exp(-rate * 60.625)) * 0.8 \
        - rate * math.exp(-rate * 15) * 0.5
    got = expected_time("elastic", S, N, MTBF, costs)
    assert got.seconds == pytest.approx(1000 / progress)
    assert got.seconds == pytest.approx(1024.75, abs=0.01)  # 1000 / (0.941211 + 0.035128 - 0.000492)
    assert got.failures == pytest.approx(rate * got.seconds)
    # to first order: c = 15 + 0.5 + (60.625 - 15)(1 - 0.8) = 24.625 s a failure
    assert got.seconds == pytest.approx(1000 / (1 - rate * 24.625), rel=1e-3)
    # synchronous PS: nothing to re-form, w = 5: c = 5 + 0.5 + 55.625 x 0.2 = 16.625
    assert shrink_windows("ps_shrink", costs) == (5, 60.625)
    progress = math.exp(-rate * 60.625) + (math.exp(-rate * 5) - math.exp(-rate * 60.625)) * 0.8 \
        - rate * math.exp(-rate * 5) * 0.5
    assert expected_time("ps_shrink", S, N, MTBF, costs).seconds == pytest.approx(1000 / progress)
    assert expected_time("ps_shrink", S, N, MTBF, costs).seconds == pytest.approx(1000 / (1 - rate * 16.625),
                                                                                  rel=1e-3)
    # a replacement there before the group has re-formed: no slow period, r = w
    quick = FaultCosts(step_s=1.0, step_s_shrunk=1.25, detect_s=5, reform_s=10, rejoin_s=12)
    assert shrink_windows("elastic", quick) == (15, 15)
    # barrier-free PS: c = (60 + 0.5) / 100, lambda = 100 / 100060
    free = FaultCosts(step_s=1.0, detect_s=5, rejoin_s=60, barrier_free=True)
    assert expected_time("ps_shrink", S, N, MTBF, free).seconds == pytest.approx(1000 / (1 - 100 / 100_060 * 0.605))


def test_failures_faster_than_recovery_never_reach_the_step():
    # windows of 1,200 s without progress, a failure every 1,000 s: a failure meanwhile restarts the window, so the
    # group is up e^(-1.2) of the time and gets there slowly: T = 1000 e^(lambda 1200) / (1 - lambda / 2)
    slow = FaultCosts(step_s=1.0, detect_s=600, reform_s=600)
    rate = 100 / 101_200
    assert expected_time("elastic", S, N, MTBF, slow).seconds == pytest.approx(
        1000 * math.exp(rate * 1200) / (1 - rate / 2))
    # steps of 2,500 s, a failure every 1,000 s losing half the step in flight: never
    costs = FaultCosts(step_s=2500.0, detect_s=5)
    got = expected_time("elastic", S, N, MTBF, costs)
    assert math.isinf(got.seconds) and "never catches up" in got.cause
    none = expected_time("none", S, N, MTBF, FaultCosts(step_s=1.0))
    assert math.isinf(none.seconds) and f"{math.exp(-1):.3g}" in none.cause


@pytest.mark.parametrize("kwargs, words", [
    ({"mode": "reweight"}, "the model prices none, checkpoint_restart, elastic, ps_shrink"),
    ({"mtbf_s": 0.0}, "mtbf_s = 0.0"),
    ({"steps": 0}, "steps = 0"),
    ({"checkpoint_every": 0, "mode": "checkpoint_restart"}, "checkpoint_every = 0"),
])
def test_bad_model_inputs_are_named(kwargs, words):
    args = {"mode": "elastic", "steps": S, "workers": N, "mtbf_s": MTBF, "costs": FaultCosts(step_s=1.0)} | kwargs
    with pytest.raises(FaultSettingError, match=words):
        expected_time(**args)
    with pytest.raises(FaultSettingError, match="step_s = 0"):
        FaultCosts(step_s=0)
    with pytest.raises(FaultSettingError, match="detect_s = -1"):
        FaultCosts(step_s=1, detect_s=-1)


# -- a Monte Carlo of the same process: exponential failures, the same recoveries --------------------------------

def monte_carlo_checkpoint(rng, work, tau, delta, restart, m):
    """Intervals of tau compute + delta checkpoint; a failure loses the attempt, then a restart of `restart`
    seconds (itself interrupted by failures) before trying again."""
    total = 0.0
    for _ in range(round(work / tau)):
        while True:
            t = rng.exponential(m)
            if t >= tau + delta:
                total += tau + delta
                break
            total += t
            while (r := rng.exponential(m)) < restart:
                total += r
            total += restart
    return total


def monte_carlo_shrink(rng, work, rate, w, r, pace, step):
    """Failures at `rate`; from each, no progress for w seconds (a failure meanwhile restarts the window) and its
    slot missing for r (progress at `pace` while any slot is missing); a failure outside a window loses half a
    step of progress (the step in flight)."""
    t, done, window_end, missing_end = 0.0, 0.0, 0.0, 0.0
    while True:
        failure = t + rng.exponential(1 / rate)
        start = max(t, window_end)
        slow = max(0.0, min(failure, missing_end) - start)
        fast = max(0.0, failure - max(start, missing_end))
        if done + slow * pace >= work:
            return start + (work - done) / pace
        if done + slow * pace + fast >= work:
            return max(start, missing_end) + work - done - slow * pace
        done += slow * pace + fast
        if failure >= window_end:
            done = max(0.0, done - step / 2)
        window_end, missing_end, t = failure + w, max(missing_end, failure + r), failure


def test_the_model_matches_a_monte_carlo_of_its_process():
    rng = np.random.default_rng(39)
    want = checkpoint_restart_time(1000, 100, 5, 35, 1000)
    runs = [monte_carlo_checkpoint(rng, 1000, 100, 5, 35, 1000) for _ in range(4000)]
    assert np.mean(runs) == pytest.approx(want, rel=3 * np.std(runs) / np.sqrt(len(runs)) / want + 1e-3)
    # failures every 250 s against windows of 15 s and missing slots of 60.6 s: they overlap often
    elastic = FaultCosts(step_s=1.0, step_s_shrunk=1.25, detect_s=5, reform_s=10, rejoin_s=60)
    want = expected_time("elastic", S, 25, MTBF / 10, elastic).seconds
    rate = 25 / (MTBF / 10 + 60.625)
    runs = [monte_carlo_shrink(rng, 1000, rate, 15, 60.625, 0.8, 1.0) for _ in range(4000)]
    assert np.mean(runs) == pytest.approx(want, rel=3 * np.std(runs) / np.sqrt(len(runs)) / want + 1e-3)
    first_order = 1000 / (1 - rate * 24.625)  # the overlaps matter here: the old additive price is 0.5% high
    assert first_order > want + 3 * np.std(runs) / np.sqrt(len(runs))


def test_the_ranking_changes_with_the_failure_rate():
    # a ring at 0.5 s a step restarting from checkpoints vs a barrier-free PS at 0.6 s a step: the ring wins
    # while failures are rare, the PS once each of 1,024 workers fails more often than the crossover
    ring = ("checkpoint_restart", FaultCosts(step_s=0.5, detect_s=30, restart_s=300, checkpoint_s=20))
    ps = ("ps_shrink", FaultCosts(step_s=0.6, rejoin_s=300, barrier_free=True))
    at = crossover_mtbf(ring, ps, 10_000, 1024)
    assert at is not None
    below = expected_time(ring[0], 10_000, 1024, at / 2, ring[1]).seconds, \
        expected_time(ps[0], 10_000, 1024, at / 2, ps[1]).seconds
    above = expected_time(ring[0], 10_000, 1024, at * 2, ring[1]).seconds, \
        expected_time(ps[0], 10_000, 1024, at * 2, ps[1]).seconds
    assert below[0] > below[1] and above[0] < above[1]
    assert crossover_mtbf(ps, ps, 10_000, 1024) is None


def test_replicated_servers_by_hand():
    # synchronous PS, 4 servers failing as often as workers: with a replica each server failure stops the group
    # for w_s = 5 detect + 10 re-forming the chains, nothing missing after:
    # progress = e^(-lambda_s 15) (e^(-lambda r) + (e^(-lambda 5) - e^(-lambda r)) 0.8 - (lambda + lambda_s)
    # e^(-lambda 5) 0.5), lambda_s = 4 / 100000, r = 60.625
    costs = FaultCosts(step_s=1.0, step_s_shrunk=1.25, detect_s=5, reform_s=10, rejoin_s=60)
    rate, server_rate = 100 / 100_060.625, 4 / 100_000
    progress = math.exp(-server_rate * 15) * (
        math.exp(-rate * 60.625) + (math.exp(-rate * 5) - math.exp(-rate * 60.625)) * 0.8
        - (rate + server_rate) * math.exp(-rate * 5) * 0.5)
    got = expected_time("ps_shrink", S, N, MTBF, costs, servers=4, replicas=1)
    assert got.seconds == pytest.approx(1000 / progress)
    assert got.failures == pytest.approx((rate + server_rate) * got.seconds)
    workers_only = expected_time("ps_shrink", S, N, MTBF, costs)
    assert 0 < got.seconds - workers_only.seconds < 1000 * 4 / 100_000 * 16  # about 4e-5 x 15.5 s a second
    # without a replica a server failure ends the run: never, with the odds of no server failure named
    none = expected_time("ps_shrink", S, N, MTBF, costs, servers=4)
    assert math.isinf(none.seconds) and f"{math.exp(-1000 * 4 / 100_000):.3g}" in none.cause


def test_time_to_target_is_steps_to_target_times_the_seconds_per_step_under_failures():
    costs = FaultCosts(step_s=1.0, step_s_shrunk=1.25, detect_s=5, reform_s=10, rejoin_s=60)
    for mode in ("checkpoint_restart", "elastic", "ps_shrink"):
        per_step = expected_time(mode, S, N, MTBF, costs).seconds / S
        assert time_to_target(mode, 250, N, MTBF, costs, S) == pytest.approx(250 * per_step)
        assert time_to_target(mode, 250, N, MTBF, costs, S) > 250  # failures cost something
    assert math.isnan(time_to_target("elastic", math.nan, N, MTBF, costs))
    with pytest.raises(FaultSettingError, match="steps_to_target = -1"):
        time_to_target("elastic", -1, N, MTBF, costs)
