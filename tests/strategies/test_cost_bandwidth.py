"""cost.bandwidth_for: the least bandwidth that reaches a target efficiency, to a relative 1e-12, found in fewer
prices than a bisection (a price may be a schedule replay), never in more than a bisection's plus one."""

from __future__ import annotations

import math
import random

import pytest

from strategies.cost import bandwidth_for


def bisection(efficiency_at, target: float) -> float:
    """The reference: bisection in log space between 1 B/s and 1e30 B/s down to a ratio of 1 + 1e-12."""
    if efficiency_at(1e30) < target:
        return math.inf
    low, high = 1.0, 1e30
    while high / low >= 1 + 1e-12:
        mid = math.sqrt(low * high)
        low, high = (low, mid) if efficiency_at(mid) >= target else (mid, high)
    return high


def piecewise(seed: int):
    """A communication time rising with 1 / bandwidth in 1-5 straight pieces (the event order changing at their
    ends), a latency floor, a compute time: P(bandwidth) = Ts / (Ts + T)."""
    rng = random.Random(seed)
    floor = rng.choice([0.0, 1e-6, 1e-4, 1e-2])
    ends = sorted(10 ** rng.uniform(-12, -6) for _ in range(rng.randint(0, 4))) + [math.inf]
    slopes = [rng.uniform(1e6, 1e9) for _ in ends]
    compute = rng.choice([0.01, 0.5, 3.0])

    def seconds(x: float) -> float:
        total, start = floor, 0.0
        for end, slope in zip(ends, slopes):
            total += slope * max(0.0, min(x, end) - start)
            start = end
        return total

    return lambda bandwidth: compute / (compute + seconds(1 / bandwidth)), rng.choice([0.5, 0.9, 0.99])


@pytest.mark.parametrize("seed", range(60))
def test_the_answer_is_the_bisections_in_no_more_prices(seed):
    efficiency, target = piecewise(seed)
    calls = []

    def counted(bandwidth):
        calls.append(bandwidth)
        return efficiency(bandwidth)

    got, want = bandwidth_for(counted, target), bisection(efficiency, target)
    if math.isinf(want):
        assert math.isinf(got)
        return
    assert efficiency(got) >= target
    assert efficiency(got / (1 + 1e-12)) < target or got == 1.0  # the least, to 1e-12
    assert got == pytest.approx(want, rel=2e-12)
    assert len(calls) <= 49  # a bisection's 46, the two ends, one more


def test_one_straight_piece_takes_a_handful_of_prices():
    """T = 1 ms + 100 MB / bandwidth, Ts = 0.5 s, P = 0.9: the secant in 1 / bandwidth lands on the answer
    (Ts (1 - P) / P - 1 ms = 54.56 ms: 1.8330 GB/s) at once; the rest closes the bracket around it."""
    calls = []

    def efficiency(bandwidth):
        calls.append(bandwidth)
        return 0.5 / (0.5 + 1e-3 + 100e6 / bandwidth)

    got = bandwidth_for(efficiency, 0.9)
    assert got == pytest.approx(100e6 / (0.5 / 9 - 1e-3), rel=1e-11)
    assert len(calls) <= 10, len(calls)


def test_a_target_beyond_reach_and_a_bad_target():
    assert bandwidth_for(lambda bandwidth: 0.5, 0.9) == math.inf
    assert bandwidth_for(lambda bandwidth: 0.95, 0.9) == 1.0
    with pytest.raises(ValueError, match="between 0 and 1"):
        bandwidth_for(lambda bandwidth: 0.5, 1.0)
