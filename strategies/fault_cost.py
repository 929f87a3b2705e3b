"""The expected time to reach step S when every worker fails at a rate, for each recovery mode (pure functions).

Failures are exponential: every worker slot fails after a mean of `mtbf_s` seconds (independently), so a group of
n fails at rate n / mtbf_s; a job of n workers sees its first failure after M = mtbf_s / n on average.

- checkpoint_restart: the classic restart-cost formula (Daly, "A higher order estimate of the optimum checkpoint
  interval for restart dumps", FGCS 2006), exact for exponential failures:
      T = M e^(R/M) (e^((tau + delta)/M) - 1) Ts / tau
  Ts = S x step_s the failure-free time, delta the seconds one checkpoint costs, R the restart (detection,
  restarting every rank, reading the checkpoint), tau the compute between checkpoints. The interval: Daly's
  higher-order optimum tau = sqrt(2 delta M) (1 + sqrt(delta / 2M) / 3 + delta / 18M) - delta (delta < 2M; else
  tau = M), Young's sqrt(2 delta M) to first order, rounded to whole steps (checkpoints fall between steps).
- elastic: no completed step is lost. A failure stops the group for w = detection + re-forming, loses the part of
  the step in flight (half a step on average) and, until the replacement joins (rejoin_s after the failure, at a
  step boundary), leaves the group at n - 1 with slower steps. Overlaps are priced as they happen: a failure
  while the group recovers restarts the recovery; two slots missing at once slow the group as one (each size
  below n at the measured step of n - 1). See _shrink_time; to first order T = Ts / (1 - lambda c), c = w +
  step_s / 2 + (rejoin_s + step_s_shrunk / 2 - w)(1 - step_s / step_s_shrunk), lambda the failure rate of the
  slots not missing. Failures faster than the group recovers: S is never reached, said so.
- ps_shrink, synchronous server: as elastic with nothing to re-form (the barrier shrinks once the failure is
  detected, its own timeout).
- ps_shrink, barrier-free server: nobody waits; the group loses the failed worker's pushes until its
  replacement joins and its push in flight: c = (rejoin_s + step_s / 2) / n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from strategies.faults import CHECKPOINT_RESTART, ELASTIC, MODES, NONE, PS_SHRINK, REWEIGHT, FaultSettingError


@dataclass(frozen=True)
class FaultCosts:
    """What one run's steps and recoveries take, in seconds (measured, simulated or assumed, said by the caller).

    step_s          a step at n workers, failure-free
    step_s_shrunk   the seconds n - 1 survivors take for one step's progress (elastic, ps_shrink): the same global
                    batch, so with a fixed batch per worker, their step time x n / (n - 1); None: as step_s
    detect_s        from a death to its detection (the communicator's timeout, a heartbeat)
    restart_s       checkpoint_restart: from detection to the restarted job's first step (start-up, reading)
    checkpoint_s    checkpoint_restart: one checkpoint (delta)
    reform_s        elastic: re-forming the group at n - 1
    rejoin_s        elastic, ps_shrink: from the failure until a replacement has joined (start-up, fetch)
    barrier_free    ps_shrink: the server has no barrier (staleness or async)
    """

    step_s: float
    step_s_shrunk: float | None = None
    detect_s: float = 0.0
    restart_s: float = 0.0
    checkpoint_s: float = 0.0
    reform_s: float = 0.0
    rejoin_s: float = 0.0
    barrier_free: bool = False

    def __post_init__(self):
        for name in ("step_s", "step_s_shrunk", "detect_s", "restart_s", "checkpoint_s", "reform_s", "rejoin_s"):
            value = getattr(self, name)
            if value is None and name == "step_s_shrunk":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0 or (value == 0 and name in ("step_s", "step_s_shrunk")):
                raise FaultSettingError(f"{name} = {value!r}: accepted are finite seconds >= 0 (> 0 for a step)")


@dataclass(frozen=True)
class Expectation:
    """The model's answer: expected seconds to reach step S (inf: never, `cause` says why), the failures expected
    on the way, the checkpoint interval in steps (checkpoint_restart), and the failure-free seconds."""

    seconds: float
    failures: float
    failure_free_s: float
    checkpoint_every: int = 0
    cause: str = ""

    @property
    def overhead(self) -> float:
        """seconds / failure-free seconds - 1: what failures cost, as a fraction."""
        return self.seconds / self.failure_free_s - 1


def young_interval(checkpoint_s: float, mtbf_job_s: float) -> float:
    """Young (1974): the compute between checkpoints that minimizes the expected time, to first order."""
    return math.sqrt(2 * checkpoint_s * mtbf_job_s)


def daly_interval(checkpoint_s: float, mtbf_job_s: float) -> float:
    """Daly (2006): the higher-order optimum compute between checkpoints (tau = M when delta >= 2M)."""
    delta, m = checkpoint_s, mtbf_job_s
    if delta >= 2 * m:
        return m
    return math.sqrt(2 * delta * m) * (1 + math.sqrt(delta / (2 * m)) / 3 + delta / (18 * m)) - delta


def checkpoint_restart_time(work_s: float, interval_s: float, checkpoint_s: float, restart_s: float,
                            mtbf_job_s: float) -> float:
    """Daly's expected wall time of `work_s` of compute with a checkpoint of checkpoint_s after every interval_s."""
    m = mtbf_job_s
    exponent = restart_s / m + (interval_s + checkpoint_s) / m
    if exponent > 700:  # e^700 overflows a float: a job that never gets through one interval
        return math.inf
    return m * math.exp(restart_s / m) * math.expm1((interval_s + checkpoint_s) / m) * work_s / interval_s


def expected_time(mode: str, steps: int, workers: int, mtbf_s: float, costs: FaultCosts,
                  checkpoint_every: int | None = None, servers: int = 0, replicas: int = 0) -> Expectation:
    """Expected seconds for `workers` workers to reach step `steps` when each fails after mtbf_s on average.
    checkpoint_every (checkpoint_restart): steps between checkpoints; None: Daly's optimum in whole steps.
    servers (synchronous ps_shrink): price the failures of that many dedicated servers too, each as often as a
    worker: covered by a replica (replicas >= 1: the group stops for detection + re-forming the chains, nothing
    lost, see strategies/fault_replicas.py), or, without one, ending the run (never reaching S). 0: servers not
    priced (as for the other modes: checkpoint_restart restarts them with the rest)."""
    if mode not in MODES or mode == REWEIGHT:
        accepted = ", ".join(m for m in MODES if m != REWEIGHT)
        raise FaultSettingError(f"mode = {mode!r}: the model prices {accepted} (reweight changes the mixing, not "
                                f"the time to a step)")
    if not isinstance(steps, int) or steps < 1 or not isinstance(workers, int) or workers < 1:
        raise FaultSettingError(f"steps = {steps!r}, workers = {workers!r}: accepted are whole numbers >= 1")
    if not (isinstance(mtbf_s, (int, float)) and math.isfinite(mtbf_s) and mtbf_s > 0):
        raise FaultSettingError(f"mtbf_s = {mtbf_s!r}: accepted are finite seconds > 0")
    work = steps * costs.step_s
    rate = workers / mtbf_s
    mtbf_job = mtbf_s / workers
    if mode == NONE:  # the run reaches S only if nothing fails before: P = e^(-Ts/M)
        return Expectation(work if rate == 0 else math.inf, rate * work, work, cause=(
            f"without recovery the first failure ends the run: it reaches step {steps} with probability "
            f"{math.exp(-work / mtbf_job):.3g}"))
    if mode == CHECKPOINT_RESTART:
        every = checkpoint_every
        if every is None:
            every = max(1, round(daly_interval(costs.checkpoint_s, mtbf_job) / costs.step_s))
        elif not isinstance(every, int) or every < 1:
            raise FaultSettingError(f"checkpoint_every = {every!r}: accepted are whole numbers of steps >= 1")
        seconds = checkpoint_restart_time(work, every * costs.step_s, costs.checkpoint_s,
                                          costs.detect_s + costs.restart_s, mtbf_job)
        cause = "" if math.isfinite(seconds) else "an interval plus its checkpoint outlasts the job's MTBF by far"
        return Expectation(seconds, rate * seconds, work, every, cause)
    if mode == PS_SHRINK and costs.barrier_free:  # nobody waits: the group lacks one worker's pushes a while
        rate = workers / (mtbf_s + costs.rejoin_s)  # a slot awaiting its replacement cannot fail
        per_failure = (costs.rejoin_s + costs.step_s / 2) / workers
        load = rate * per_failure
        if load >= 1:
            return Expectation(math.inf, math.inf, work, cause=(
                f"failures every {mtbf_job:.3g} s on average, each costing {per_failure:.3g} s: the group never "
                f"catches up (rate x cost = {load:.3g} >= 1)"))
        seconds = work / (1 - load)
        return Expectation(seconds, rate * seconds, work)
    if servers and mode == PS_SHRINK and not replicas:
        return Expectation(math.inf, math.inf, work, cause=(
            f"a server failure ends a ps_shrink run without replicas: it reaches step {steps} with probability "
            f"{math.exp(-work * servers / mtbf_s):.3g} (recovery.replicas >= 1, or checkpoint_restart)"))
    return _shrink_time(mode, work, workers, mtbf_s, costs, servers if mode == PS_SHRINK else 0)


def shrink_windows(mode: str, costs: FaultCosts) -> tuple[float, float]:
    """(w, r) of a failure that the group survives at n - 1 (elastic, a synchronous ps_shrink): w the seconds
    without progress from the failure (detection, and re-forming for elastic), r the seconds its slot is missing
    (the replacement joins rejoin_s after the failure, at the next step boundary: half a shrunk step later on
    average; r = w where the replacement is there before the group has re-formed)."""
    w = costs.detect_s + (costs.reform_s if mode == ELASTIC else 0.0)
    shrunk = costs.step_s_shrunk or costs.step_s
    r = costs.rejoin_s + shrunk / 2 if costs.rejoin_s > w else w
    return w, r


def _shrink_time(mode: str, work: float, workers: int, mtbf_s: float, costs: FaultCosts,
                 servers: int = 0) -> Expectation:
    """Elastic and the synchronous ps_shrink: progress per second of wall time, failures at rate lambda.

    Each failure stops progress for w seconds from it and leaves its slot missing for r; failures overlap (a
    failure while another is being recovered restarts the recovery from it; two slots missing at once cost no
    more than one, each size below n priced at the measured step of n - 1). Over Poisson failures the time
    covered by the windows of length w is 1 - e^(-lambda w), by the missing slots 1 - e^(-lambda r); a failure
    outside a window (rate lambda e^(-lambda w)) also loses the part of the step in flight, half a step:
        progress rate = e^(-lambda r) + (e^(-lambda w) - e^(-lambda r)) step_s / step_s_shrunk
                        - lambda e^(-lambda w) step_s / 2,     T = Ts / progress rate
    with lambda = n / (mtbf_s + r) (a missing slot cannot fail). To first order T = Ts / (1 - lambda c), c = w +
    step_s / 2 + (r - w)(1 - step_s / step_s_shrunk).

    Replicated servers (`servers` of them, each failing at 1 / mtbf_s): a server's failure stops the group for
    w_s = detection + re-forming the chains (a replica becomes primary; nothing missing after), independent of
    the workers' windows: every term above is multiplied by e^(-lambda_s w_s), and its failures outside a window
    lose half a step too."""
    w, r = shrink_windows(mode, costs)
    rate = workers / (mtbf_s + r)
    pace = costs.step_s / (costs.step_s_shrunk or costs.step_s)
    full, up = math.exp(-rate * r), math.exp(-rate * w)
    server_rate, w_s = servers / mtbf_s, costs.detect_s + costs.reform_s
    server_up = math.exp(-server_rate * w_s)
    progress = server_up * (full + (up - full) * pace - (rate + server_rate) * up * costs.step_s / 2)
    if progress <= 0:
        return Expectation(math.inf, math.inf, work, cause=(
            f"failures every {mtbf_s / workers:.3g} s on average, each stopping the group for {w:.3g} s and "
            f"slowing it for {r - w:.3g} s: the group never catches up (progress rate {progress:.3g} <= 0)"))
    seconds = work / progress
    return Expectation(seconds, (rate + server_rate) * seconds, work)


def time_to_target(mode: str, steps_to_target: float, workers: int, mtbf_s: float, costs: FaultCosts,
                   steps: int = 10_000, **kwargs) -> float:
    """Expected seconds to the target accuracy under the failure rate: steps_to_target x the expected seconds per
    step of a run to step `steps` (expected_time's, every mode's time linear in the work). The failures are taken
    not to change the steps to target: checkpoint_restart resumes bit-identically; elastic and ps_shrink keep the
    global batch (the survivors' mean). NaN when steps_to_target is NaN (never reached); inf when the run never
    reaches a step."""
    if isinstance(steps_to_target, bool) or not isinstance(steps_to_target, (int, float)) or steps_to_target < 0:
        raise FaultSettingError(f"steps_to_target = {steps_to_target!r}: accepted are steps >= 0 (NaN: never)")
    if math.isnan(steps_to_target):
        return math.nan
    return steps_to_target * expected_time(mode, steps, workers, mtbf_s, costs, **kwargs).seconds / steps


def crossover_mtbf(first: tuple[str, FaultCosts], second: tuple[str, FaultCosts], steps: int, workers: int,
                   low_s: float = 60.0, high_s: float = 1e9) -> float | None:
    """The lowest per-worker MTBF in [low_s, high_s] at which two (mode, costs) swap places in the time to reach
    step `steps` (where the ranking changes): a scan of 200 points on log MTBF, then bisection; None when neither
    overtakes the other (MTBFs where both never reach the step are skipped)."""

    def sign(log_mtbf):
        mtbf = math.exp(log_mtbf)
        a = expected_time(first[0], steps, workers, mtbf, first[1]).seconds
        b = expected_time(second[0], steps, workers, mtbf, second[1]).seconds
        if math.isinf(a) and math.isinf(b) or a == b:
            return 0
        return 1 if a > b else -1

    grid = np.linspace(math.log(low_s), math.log(high_s), 200)
    signs = [sign(x) for x in grid]
    for (lo, s_lo), (hi, s_hi) in zip(zip(grid, signs), zip(grid[1:], signs[1:])):
        if s_lo and s_hi and s_lo != s_hi:
            for _ in range(60):
                mid = (lo + hi) / 2
                if sign(mid) == s_lo:
                    lo = mid
                else:
                    hi = mid
            return math.exp((lo + hi) / 2)
    return None


# -- a link down for t seconds: who waits, and for how long ----------------------------------------------------

@dataclass(frozen=True)
class OutagePrice:
    """What one link outage costs a run's time to step S. outcome STALL: every rank in `stalled` reaches step S
    `stall_s` later (the outage: nobody catches up, no step has slack in this model), the others on time. outcome
    FAILURE: the outage outlasted the timeout, the rank is taken for dead; priced as a failure by the recovery mode
    (expected_time's costs, detection = the timeout), so stall_s is NaN here."""

    outcome: str
    stalled: tuple[int, ...]
    stall_s: float


def outage_price(config, workers: int, outage, steps: int, timeout_s: float, idle_s: float = 0.0,
                 rto_s: float | None = None) -> OutagePrice:
    """The model's price of `outage` (a strategies.faults.LinkOutage) for strategy `config` at `workers` workers,
    at step S = `steps`. `idle_s`: the seconds from a step's start before the rank needs its link (its compute):
    the outage's first idle_s cost nothing, so the stall is max(0, t - idle_s).
    `rto_s` (over TCP: the kernel-shaped network; strategies/fault_tcp.py): the data moves again at the first
    retransmission after the link is back, not when it is back, so the stall is tcp_stall_s (the backoff's
    staircase: rto, 3 rto, 7 rto, ... from the transfer's first send), and a resumption at or after the timeout is
    a failure even for an outage shorter than it.
    - an exact allreduce (every rank needs every rank's part every step) and a synchronous server (its barrier
      waits for every push; a server's own link: every worker's pull): every rank stalls by the outage;
    - a barrier-free server (async): a worker's link stalls that worker only; a server's link stalls every worker
      (each pushes to every server). With a staleness bound k the others also wait once they are k steps ahead
      (by the outage less k of their steps): priced here as async, the others' stall left out;
    - neighbour averaging: the ranks that receive from the rank in step s stall then, their receivers in s + 1,
      and so on: the ranks reached within S - s rounds of the topology's graph (each round's for
      one_peer_exponential)."""
    from strategies.base import PARAMETERS
    from strategies.faults import FAILURE, STALL, check_outages, outage_outcome

    servers = config.num_servers(workers)
    [outage] = check_outages([outage], workers, steps, servers)
    if not (math.isfinite(idle_s) and idle_s >= 0):
        raise FaultSettingError(f"idle_s = {idle_s!r}: accepted are seconds >= 0 (a step's compute)")
    if outage_outcome(outage.seconds, timeout_s) == FAILURE:
        return OutagePrice(FAILURE, (), math.nan)
    stall = max(0.0, outage.seconds - idle_s)
    if rto_s is not None:
        from strategies.fault_tcp import tcp_stall_s

        stall = tcp_stall_s(outage.seconds, rto_s, idle_s)
        if idle_s + stall >= timeout_s:  # the peers' receives time out before the retransmission gets through
            return OutagePrice(FAILURE, (), math.nan)
    if getattr(config, "asynchronous", False) and outage.rank < workers:  # either mode, update or summation
        return OutagePrice(STALL, (outage.rank,), stall)
    if config.role == PARAMETERS and not config.exact:
        return OutagePrice(STALL, _reached(config.topology, workers, outage, steps), stall)
    return OutagePrice(STALL, tuple(range(workers)), stall)


def _reached(topology: str, workers: int, outage, steps: int) -> tuple[int, ...]:
    """The ranks a neighbour-averaging run's delay reaches by step S: rank r, then each round s .. S - 1 every rank
    that receives from a rank already reached."""
    from strategies.decentralized import in_neighbours

    late = {outage.rank}
    for round_ in range(outage.step, steps):
        late |= {i for i, near in enumerate(in_neighbours(topology, workers, round_)) if late.intersection(near)}
    return tuple(sorted(late))
