"""What TCP adds to a link outage: Linux's retransmission backoff (pure functions).

A connection whose segments are lost while the link is down resends the oldest one when its retransmission timer
fires, one RTO after it was sent, then doubles the interval each time (2 RTO, 4 RTO, ...; each interval at most
TCP_RTO_MAX = 120 s) until a retransmission gets through. The link being back does not wake it: the data moves
again at the first retransmission at or after the link's return, so an outage of T stalls the transfer until

    resume = rto (2^k - 1)   (k the fewest retransmissions with rto (2^k - 1) >= T; a transfer in flight as the
                              link goes down; intervals capped at RTO_MAX)

which can be up to about twice the outage (T = 1 s at RTO 0.2 s: 1.4 s; at 0.216 s: 1.512 s).

The RTO (Linux, net/ipv4/tcp_input.c, tcp_rtt_estimator and __tcp_set_rto): srtt + max(4 rttvar, RTO_MIN), the
variation floored at RTO_MIN (net.ipv4.tcp_rto_min_us, 200,000 us by default): on loopback-like RTTs of micro- to
milliseconds, 200 ms plus the RTT (what `ss -ti` showed on the kernel-shaped network: 0.204 to 0.224 s; 0.42 to
0.45 s on some connections of a machine at load 20 to 30). The
connection gives up after tcp_retries2 = 15 retransmissions, at the first RTO past the hypothetical timeout of 15
doublings from RTO_MIN capped at RTO_MAX (924.6 s; Documentation/networking/ip-sysctl.rst): beyond any
communicator timeout syncbench accepts (600 s), so the timeout decides first.

An outage starting at a known point of a step (the stall is resume - when the transfer would have started) and
its expectation when the outage starts at a uniformly random point of a step (tcp_expected_stall_s).

Checked on the kernel-shaped network (docs/faults.md, "Over TCP"): outages of 2 and 3 s resumed at the kernel's
own due retransmission in 4 runs of 6; outages of 0.5 and 1 s stalled 1 to 2.1 s, off this staircase both ways.
"""

from __future__ import annotations

import math

RTO_MIN_S = 0.2  # TCP_RTO_MIN, net.ipv4.tcp_rto_min_us = 200000
RTO_MAX_S = 120.0  # TCP_RTO_MAX
RETRIES2 = 15  # net.ipv4.tcp_retries2


def linux_rto(srtt_s: float, rttvar_s: float, rto_min_s: float = RTO_MIN_S) -> float:
    """Linux's RTO for a smoothed RTT and its mean deviation (`ss -ti`'s rtt:srtt/rttvar): srtt + max(4 rttvar,
    rto_min), at most RTO_MAX."""
    for name, value in (("srtt_s", srtt_s), ("rttvar_s", rttvar_s), ("rto_min_s", rto_min_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} = {value!r}: accepted are seconds >= 0")
    return min(srtt_s + max(4 * rttvar_s, rto_min_s), RTO_MAX_S)


def give_up_s(retries: int = RETRIES2) -> float:
    """When Linux abandons a connection that never gets an answer (tcp_retries2's hypothetical timeout: `retries`
    + 1 intervals from RTO_MIN, doubling, capped at RTO_MAX): 924.6 s for the default 15."""
    return sum(min(RTO_MIN_S * 2 ** i, RTO_MAX_S) for i in range(retries + 1))


def _check(outage_s: float, rto_s: float) -> None:
    if not (math.isfinite(outage_s) and outage_s > 0):
        raise ValueError(f"outage_s = {outage_s!r}: accepted are seconds > 0")
    if not (math.isfinite(rto_s) and 0 < rto_s <= RTO_MAX_S):
        raise ValueError(f"rto_s = {rto_s!r}: accepted are seconds in (0, {RTO_MAX_S:g}] (Linux: >= 0.2)")


def retransmissions(rto_s: float, until_s: float, first_s: float | None = None) -> list[float]:
    """The retransmission times (seconds from the first lost send) up to and including the first at or after
    `until_s`: first_s (default rto_s), then each interval doubled, capped at RTO_MAX."""
    _check(max(until_s, 1e-9), rto_s)
    at = rto_s if first_s is None else first_s
    if not (math.isfinite(at) and at > 0):
        raise ValueError(f"first_s = {first_s!r}: accepted are seconds > 0")
    times, interval = [at], rto_s
    while times[-1] < until_s:
        interval = min(2 * interval, RTO_MAX_S)
        times.append(times[-1] + interval)
    return times


def tcp_resume_s(outage_s: float, rto_s: float, sent_s: float = 0.0, first_s: float | None = None) -> float:
    """When data moves again (seconds from the outage's start): a connection that first sends into the dead link
    `sent_s` into the outage (0: a transfer in flight as the link goes down) resends at sent_s + first_s (default:
    one RTO), then doubling; the first of those at or after the link's return. A transfer that starts once the
    link is back (sent_s >= outage_s) is not held: it starts at sent_s."""
    _check(outage_s, rto_s)
    if not (math.isfinite(sent_s) and sent_s >= 0):
        raise ValueError(f"sent_s = {sent_s!r}: accepted are seconds >= 0")
    if sent_s >= outage_s:
        return sent_s
    return sent_s + retransmissions(rto_s, outage_s - sent_s, first_s)[-1]


def tcp_stall_s(outage_s: float, rto_s: float, idle_s: float = 0.0, first_s: float | None = None) -> float:
    """The stall of a transfer when the link goes down `idle_s` before it starts (the outage from a step's start,
    idle_s its compute): it ends tcp_resume_s - idle_s later than without the outage (0 if the link is back
    first). Without TCP's backoff the same outage costs max(0, outage_s - idle_s)."""
    if not (math.isfinite(idle_s) and idle_s >= 0):
        raise ValueError(f"idle_s = {idle_s!r}: accepted are seconds >= 0 (a step's compute)")
    return tcp_resume_s(outage_s, rto_s, idle_s, first_s) - idle_s


def tcp_expected_stall_s(outage_s: float, rto_s: float, step_s: float, idle_s: float = 0.0) -> float:
    """The expected stall when the outage starts at a uniformly random point of a step of `step_s` seconds whose
    first `idle_s` are compute (the link idle) and the rest a transfer:
    - starting during the transfer (probability (step_s - idle_s) / step_s), the data in flight is lost at once:
      the stall is c(T), the first retransmission time >= T of a connection sending at 0;
    - starting u = idle_s - x before the transfer would start (x uniform in [0, idle_s)): the transfer's first send
      is u into the outage, so the stall is c(T - u) if u < T, else nothing.
    c is a staircase (rto, 3 rto, 7 rto, ...), so the integral over u is exact: the sum, over the staircase's
    steps, of each level times the length of remaining outage T - u that lands on it."""
    _check(outage_s, rto_s)
    if not (math.isfinite(step_s) and step_s > 0):
        raise ValueError(f"step_s = {step_s!r}: accepted are seconds > 0")
    if not (math.isfinite(idle_s) and 0 <= idle_s <= step_s):
        raise ValueError(f"idle_s = {idle_s!r}: accepted are seconds in [0, step_s = {step_s:g}]")
    levels = retransmissions(rto_s, outage_s)  # c_1 < c_2 < ...: rto, 3 rto, 7 rto, ... (capped)
    during_transfer = (step_s - idle_s) * levels[-1]
    # remaining outage r = T - u ranges over (T - idle_s, T] where positive; c(r) = c_k on (c_{k-1}, c_k]
    lo, hi = max(outage_s - idle_s, 0.0), outage_s
    before, below = 0.0, 0.0
    for level in levels:
        overlap = max(0.0, min(hi, level) - max(lo, below))
        before += level * overlap
        below = level
    return (during_transfer + before) / step_s
