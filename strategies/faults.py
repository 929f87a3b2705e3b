"""Failures and recovery: which worker fails when, and how each strategy family goes on (the pure logic).

A failure is a rank that dies during a step: `Failure(step, rank)` means the rank completed steps
0..step-1 and its part of `step` never arrives. A run's failures come from a schedule (listed by the sweep) or
from a rate: every worker slot fails after an exponential time with mean `mtbf_s` (seeded), its replacement
after another, and so on (`draw_failures`).

Recovery modes, each fitting some strategies (`check_fits` refuses the others before any work):
- none (any strategy): the run ends at the first failure, the cause named, its completed steps kept (what a
  run without recovery does).
- checkpoint_restart (any strategy): parameters are saved every `checkpoint_every` steps; a failure stops the
  job, every rank restarts (the failed one replaced) and resumes from the last checkpoint: the steps since it
  are lost and redone; the result is bit-identical to a run without the failure.
- elastic (exact allreduce over send/recv: ring, naive ring, halving-doubling, double binary tree,
  reduce+broadcast, all-to-all): the survivors re-form the group at n - 1 from the current step (the step in
  flight is redone by them, no completed step is lost); a replacement joins after `rejoin_steps` steps and
  fetches the parameters from a peer.
- ps_shrink (parameter server): a synchronous server's barrier shrinks to the survivors (their mean, as
  elastic); a barrier-free server (staleness or async) changes nothing: the others never waited for the failed
  worker. A server failure is not covered (it needs a replica): refused, checkpoint_restart covers it.
- reweight (decentralized averaging on a symmetric topology): the failed rank's neighbours drop it and every
  survivor re-weights with Metropolis weights on the survivors' graph, so the mixing matrix stays doubly
  stochastic; its spectral gap is recomputed. A survivors' graph that falls apart cannot mix: the run ends,
  cause named.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from strategies.base import PARAMETERS, SERVER, StrategyConfig

NONE = "none"
CHECKPOINT_RESTART = "checkpoint_restart"
ELASTIC = "elastic"
PS_SHRINK = "ps_shrink"
REWEIGHT = "reweight"
MODES = (NONE, CHECKPOINT_RESTART, ELASTIC, PS_SHRINK, REWEIGHT)
# exact allreduce strategies written over send/recv whose group re-forms at any size
ELASTIC_STRATEGIES = ("ring", "naive_ring", "halving_doubling", "double_binary_tree", "reduce_broadcast",
                      "all_to_all")
MAX_FAILURES = 10_000  # failures of one run (a schedule's rows, or a rate's draws over the run)


class FaultSettingError(ValueError):
    """A failure or recovery setting that cannot run: names the value and what is accepted."""


class RunEnded(RuntimeError):  # noqa: N818 - it is an outcome, not a programming error
    """A failure the recovery mode cannot recover from: the run ends here, the cause named, completed steps kept."""

    def __init__(self, cause: str, completed_steps: int):
        super().__init__(f"the run ended after {completed_steps} completed step(s): {cause}")
        self.cause = cause
        self.completed_steps = completed_steps


@dataclass(frozen=True, order=True)
class Failure:
    """Worker `rank` dies during `step` (0-based): it completed steps 0..step-1."""

    step: int
    rank: int


@dataclass(frozen=True)
class Recovery:
    """How a run goes on after a failure. checkpoint_every: steps between checkpoints (checkpoint_restart);
    rejoin_steps: steps the survivors run alone before a replacement joins (elastic, ps_shrink; None: never);
    replicas: ps_shrink, each server shard chain-replicated on this many further servers, so that a server's
    failure is covered (0: none, a server failure is refused; strategies/fault_replicas.py)."""

    mode: str
    checkpoint_every: int = 0
    rejoin_steps: int | None = None
    replicas: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise FaultSettingError(f"recovery.mode = {self.mode!r}: accepted are {', '.join(MODES)}")
        if self.mode == CHECKPOINT_RESTART:
            if not _whole(self.checkpoint_every) or self.checkpoint_every < 1:
                raise FaultSettingError(f"recovery.checkpoint_every = {self.checkpoint_every!r}: checkpoint_restart "
                                        f"needs a whole number of steps >= 1")
        elif self.checkpoint_every:
            raise FaultSettingError(f"recovery.checkpoint_every = {self.checkpoint_every!r} applies to "
                                    f"checkpoint_restart only, not to mode {self.mode!r}")
        if self.rejoin_steps is not None:
            if self.mode not in (ELASTIC, PS_SHRINK):
                raise FaultSettingError(f"recovery.rejoin_steps = {self.rejoin_steps!r}: a replacement joins a "
                                        f"running group in modes elastic and ps_shrink only, not {self.mode!r}")
            if not _whole(self.rejoin_steps) or self.rejoin_steps < 1:
                raise FaultSettingError(f"recovery.rejoin_steps = {self.rejoin_steps!r}: accepted are whole "
                                        f"numbers of steps >= 1 (or leave it out: the group stays smaller)")
        _check_replicas_setting(self)


def _check_replicas_setting(recovery: Recovery) -> None:
    """replicas: a whole number >= 0, and only where a server's shard is served (ps_shrink)."""
    if not _whole(recovery.replicas) or recovery.replicas < 0:
        raise FaultSettingError(f"recovery.replicas = {recovery.replicas!r}: accepted are whole numbers >= 0 (servers "
                                f"further down each shard's chain)")
    if recovery.replicas and recovery.mode != PS_SHRINK:
        raise FaultSettingError(f"recovery.replicas = {recovery.replicas!r}: server replicas belong to a parameter "
                                f"server's recovery, mode 'ps_shrink', not {recovery.mode!r}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_schedule(failures, workers: int, steps: int, servers: int = 0) -> tuple[Failure, ...]:
    """The schedule sorted by step; FaultSettingError naming a rank or step outside the run, or a rank failing
    twice in one step."""
    out = []
    if len(failures) > MAX_FAILURES:
        raise FaultSettingError(f"failures: {len(failures):,} listed, at most {MAX_FAILURES:,}")
    for f in failures:
        if not _whole(f.rank) or not 0 <= f.rank < workers + servers:
            ranks = f"0..{workers - 1}" + (f" (servers {workers}..{workers + servers - 1})" if servers else "")
            raise FaultSettingError(f"failure rank = {f.rank!r}: the run has ranks {ranks}")
        if not _whole(f.step) or not 0 <= f.step < steps:
            raise FaultSettingError(f"failure step = {f.step!r}: the run has steps 0..{steps - 1}")
        out.append(Failure(f.step, f.rank))
    if len(set(out)) != len(out):
        raise FaultSettingError(f"failures {sorted(out)}: a rank listed twice at one step")
    return tuple(sorted(out))


def draw_failures(workers: int, mtbf_s: float, step_s: float, steps: int, seed: int) -> tuple[Failure, ...]:
    """Failures of a run of `steps` steps of `step_s` seconds when every worker slot fails after an exponential
    time of mean `mtbf_s` (its replacement after another, from the replacement's start). Seeded: the same
    arguments draw the same failures. A failure at time t falls in step floor(t / step_s)."""
    if not (mtbf_s > 0 and math.isfinite(mtbf_s)):
        raise FaultSettingError(f"mtbf_s = {mtbf_s!r}: accepted are finite seconds > 0")
    if not (step_s > 0 and math.isfinite(step_s)):
        raise FaultSettingError(f"step_s = {step_s!r}: accepted are finite seconds > 0")
    horizon = steps * step_s
    expected = workers * horizon / mtbf_s
    if expected > MAX_FAILURES:
        raise FaultSettingError(f"mtbf_s = {mtbf_s:g} with {workers} workers over {steps} steps of {step_s:g} s "
                                f"expects {expected:,.0f} failures: at most {MAX_FAILURES:,} per run")
    rng = np.random.default_rng([seed, workers, 39])
    out = []
    for rank in range(workers):
        t = rng.exponential(mtbf_s)
        while t < horizon:
            out.append(Failure(int(t // step_s), rank))
            t += rng.exponential(mtbf_s)
    return tuple(sorted(set(out)))


def check_fits(mode: str, config: StrategyConfig, workers: int, failures=(), replicas: int = 0) -> None:
    """FaultSettingError, before any work, when recovery `mode` does not fit the strategy (or one of its
    failures: a server rank's under ps_shrink without replicas), naming what is accepted."""
    if replicas:
        check_replicas_fit(config, workers, replicas)
    name = config.name
    if mode not in MODES:
        raise FaultSettingError(f"recovery.mode = {mode!r}: accepted are {', '.join(MODES)}")
    if mode == ELASTIC and name not in ELASTIC_STRATEGIES:
        raise FaultSettingError(f"recovery.mode = 'elastic' does not fit strategy {name!r}: the survivors re-form "
                                f"an exact allreduce group; accepted are {', '.join(ELASTIC_STRATEGIES)} "
                                f"(checkpoint_restart fits any strategy)")
    if mode == PS_SHRINK:
        if config.role != SERVER:
            raise FaultSettingError(f"recovery.mode = 'ps_shrink' does not fit strategy {name!r}: it shrinks a "
                                    f"parameter server's barrier; accepted are strategies with server ranks "
                                    f"(parameter_server)")
        if getattr(config, "placement", "dedicated") != "dedicated":
            raise FaultSettingError(f"recovery.mode = 'ps_shrink' with placement = {config.placement!r}: a "
                                    f"colocated server dies with its worker; accepted is placement = 'dedicated'")
        for f in failures:
            if f.rank >= workers and not replicas:
                raise FaultSettingError(f"failure of server rank {f.rank} at step {f.step}: ps_shrink covers "
                                        f"worker failures; a server's needs a replica (recovery.replicas >= 1) or "
                                        f"recovery.mode = 'checkpoint_restart'")
    if mode == REWEIGHT:
        if config.role != PARAMETERS or config.exact:
            raise FaultSettingError(f"recovery.mode = 'reweight' does not fit strategy {name!r}: it re-weights a "
                                    f"neighbour-averaging mixing matrix; accepted is decentralized")
        if getattr(config, "topology", "") == "one_peer_exponential":
            raise FaultSettingError("recovery.mode = 'reweight' with topology = 'one_peer_exponential': its graph "
                                    "is directed and changes every round (Metropolis weights need a symmetric "
                                    "graph); accepted are topologies ring, torus, exponential, complete")


def check_replicas_fit(config: StrategyConfig, workers: int, replicas: int) -> None:
    """Chain replication (recovery.replicas) fits a synchronous parameter server with dedicated servers, at
    least replicas + 1 of them (each shard's chain: its primary and `replicas` further servers)."""
    if config.name != "parameter_server" or getattr(config, "placement", "dedicated") != "dedicated":
        raise FaultSettingError(f"recovery.replicas = {replicas!r} does not fit strategy {config.name!r} "
                                f"(placement {getattr(config, 'placement', None)!r}): replicas are of a parameter "
                                f"server's dedicated servers; accepted is parameter_server, placement 'dedicated'")
    if getattr(config, "asynchronous", False):
        raise FaultSettingError(f"recovery.replicas = {replicas!r} with a barrier-free parameter server: thread ranks "
                                f"chain-replicate a synchronous server's steps (staleness = 0, backups = 0)")
    servers = config.num_servers(workers)
    if servers < 2:
        raise FaultSettingError(f"recovery.replicas = {replicas!r} with servers = {servers}: a replica is another "
                                f"server; accepted are parameter servers with servers >= 2")
    if replicas >= servers:
        raise FaultSettingError(f"recovery.replicas = {replicas!r} with servers = {servers}: each shard's chain is its "
                                f"primary and `replicas` further servers, so accepted are 1 to {servers - 1}")


# -- decentralized: the survivors' graph and its re-weighted mixing matrix ------------------------------------

def survivors_graph(config, workers: int, failed) -> tuple[list[int], list[list[int]]]:
    """(survivors in rank order, each survivor's neighbours as positions among the survivors): the strategy's
    topology of `workers` ranks with the failed ranks and their edges removed."""
    from strategies.decentralized import in_neighbours

    dead = set(failed)
    alive = [r for r in range(workers) if r not in dead]
    where = {r: i for i, r in enumerate(alive)}
    peers = in_neighbours(config.topology, workers)
    return alive, [sorted(where[j] for j in peers[r] if j in where) for r in alive]


def metropolis(peers: list[list[int]]) -> np.ndarray:
    """W_ij = 1 / (1 + max(deg i, deg j)) on every edge, W_ii = 1 - sum of row i: symmetric with rows summing
    to 1, hence doubly stochastic, on any symmetric graph (Xiao and Boyd's Metropolis-Hastings weights)."""
    m = len(peers)
    w = np.zeros((m, m))
    for i, near in enumerate(peers):
        for j in near:
            w[i, j] = 1 / (1 + max(len(near), len(peers[j])))
        w[i, i] = 1 - w[i].sum()
    return w


def spectral_gap(w: np.ndarray) -> float:
    """1 - |lambda_2(W)|: 0 when the graph is disconnected (then it never mixes)."""
    if len(w) <= 1:
        return 1.0
    moduli = np.sort(np.abs(np.linalg.eigvals(w)))[::-1]
    return min(1.0, max(0.0, float(1 - moduli[1])))


def connected(peers: list[list[int]]) -> bool:
    if not peers:
        return False
    seen, todo = {0}, [0]
    while todo:
        for j in peers[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(peers)


# -- a link down for t seconds: no rank dies, the rank's NIC carries nothing for a while ----------------------

OUTAGE_MAX_S = 3600.0  # one hour: a link down longer than that is a failure for any communicator's timeout
STALL = "stall"  # the outage ended before the communicator's timeout: everyone waiting on the rank waited
FAILURE = "failure"  # it outlasted the timeout: the rank was taken for dead and the recovery mode applied


@dataclass(frozen=True, order=True)
class LinkOutage:
    """Rank `rank`'s NIC carries nothing for `seconds` from the start of step `step` (0-based); the rank lives.

    What it costs is the stall: every rank that waits on it in that step (a ring: everyone; a barrier-free
    parameter server: that worker only; neighbour averaging: its neighbours, one hop further each step). An outage
    at least the communicator's timeout long is a failure: the rank's peers give it up and the recovery mode
    applies (`outage_outcome`)."""

    step: int
    rank: int
    seconds: float


def check_outages(outages, workers: int, steps: int, servers: int = 0) -> tuple[LinkOutage, ...]:
    """The outages sorted by step; FaultSettingError naming a rank, step or duration outside the run, or a link
    listed twice at one step."""
    out = []
    if len(outages) > MAX_FAILURES:
        raise FaultSettingError(f"link outages: {len(outages):,} listed, at most {MAX_FAILURES:,}")
    for o in outages:
        if not _whole(o.rank) or not 0 <= o.rank < workers + servers:
            ranks = f"0..{workers - 1}" + (f" (servers {workers}..{workers + servers - 1})" if servers else "")
            raise FaultSettingError(f"link outage link = {o.rank!r}: the run has ranks {ranks}")
        if not _whole(o.step) or not 0 <= o.step < steps:
            raise FaultSettingError(f"link outage step = {o.step!r}: the run has steps 0..{steps - 1}")
        seconds = o.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                math.isfinite(seconds) and 0 < seconds <= OUTAGE_MAX_S):
            raise FaultSettingError(f"link outage seconds = {seconds!r}: accepted are seconds > 0 and at most "
                                    f"{OUTAGE_MAX_S:g}")
        out.append(LinkOutage(o.step, o.rank, float(seconds)))
    if len({(o.step, o.rank) for o in out}) != len(out):
        raise FaultSettingError(f"link outages {sorted(out)}: a link listed twice at one step")
    return tuple(sorted(out))


def outage_outcome(seconds: float, timeout_s: float) -> str:
    """STALL when an outage of `seconds` ends before a peer's wait of `timeout_s` gives up on the rank, else
    FAILURE (the recovery mode applies). A peer's wait on the rank starts no earlier than the outage, so an
    outage shorter than the timeout never fails a run; one at least as long fails it once a peer waits on it."""
    return STALL if seconds < timeout_s else FAILURE
