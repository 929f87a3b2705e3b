"""The bandwidth a target efficiency needs: the inverse of the model's price, found on the price itself (so that
the answer fed back gives the target); `strategies.cost.bandwidth_for`."""

from __future__ import annotations

import math


def bandwidth_for(efficiency_at, target: float) -> float:
    """The least NIC bandwidth (bytes/s) at which efficiency_at(bandwidth), rising with it, reaches `target`, to a
    relative 1e-12 on the same price, so that the answer fed back gives the target; inf when even an infinite link
    falls short (latency alone).

    The bracket [1 B/s, 1e30 B/s] (efficiency below the target at its low end, at or above it at its high end)
    shrinks in log space to 1 + 1e-12 by ITP (Oliveira and Takahashi 2020: interpolate, truncate towards the middle,
    project into a bisection's bound), never in more prices than a bisection's 46 plus one and usually in far fewer:
    the interpolation is a secant in 1 / bandwidth, where 1 / P - 1 = exposed communication / compute is a + b /
    bandwidth while the price's order of events holds. hierarchical on 64 ranks in nodes of 4 (a replay a price): 11
    prices, not 48."""
    if not 0 < target < 1:
        raise ValueError(f"bad target efficiency {target!r}: expected a number between 0 and 1, e.g. 0.9")
    best = efficiency_at(1e30)
    if best < target:
        return math.inf

    def excess(u: float) -> tuple[bool, float]:
        """At bandwidth e^u: whether P reaches the target, and 1 / target - 1 / P (its sign, up to rounding)."""
        p = efficiency_at(math.exp(u))
        return p >= target, (1 / target - 1 / p if p > 0 else -math.inf)

    a, b = 0.0, math.log(1e30)  # log bandwidth: short at a, reached at b
    reached, f_a = excess(a)
    if reached:
        return 1.0
    f_b = max(1 / target - 1 / best, 0.0)
    eps = math.log1p(1e-12) / 2
    n_max = math.ceil(math.log2((b - a) / (2 * eps))) + 1
    kappa = 1e-6  # truncation's scale: small, the secant is a good guess here (ITP's 0.2 / width stalled it)
    for j in range(n_max + 1):
        if b - a <= 2 * eps:
            break
        middle = (a + b) / 2
        guess = middle
        if math.isfinite(f_a) and f_b > f_a:  # the secant in 1 / bandwidth, back to log bandwidth
            x_a, x_b = math.exp(-a), math.exp(-b)
            x = x_b + (x_a - x_b) * f_b / (f_b - f_a)
            guess = min(max(-math.log(x), a), b) if x > 0 else b
        sigma = math.copysign(1.0, middle - guess)
        delta = kappa * (b - a) ** 2
        guess = guess + sigma * delta if delta <= abs(middle - guess) else middle  # truncated towards the middle
        radius = eps * 2 ** (n_max - j) - (b - a) / 2
        if abs(guess - middle) > radius:  # projected into the bisection's bound
            guess = middle - sigma * radius
        guess = min(max(guess, a + eps / 2), b - eps / 2)  # strictly inside
        reached, f = excess(guess)
        if reached:
            b, f_b = guess, max(f, 0.0)
        else:
            a, f_a = guess, min(f, 0.0)
    return math.exp(b)
