"""The analytic cost of a strategy: the alpha-beta time of its traffic(), BytePS's optimum, calibration and the
timeline of buckets overlapped with backward. The pipeline, the benchmarks, `syncbench model` and the report
all price communication here (reports/model.py builds the `model` table and the extrapolation on top).

For a strategy with analytic traffic (rounds, path_bytes) for n workers and a gradient of d bytes:

    Tt = rounds x alpha + path_bytes x beta          communication time per step (beta = 1 / bandwidth)
    P  = Ts / (Ts + Tt)                               parallel efficiency, Ts the compute time per step
    Tp = Ts + Tt                                      step time
    S  = path_bytes x P / ((1 - P) x Ts - P x rounds x alpha)   bandwidth needed for efficiency P

Units: bytes and seconds everywhere; MB = 10^6 bytes, Gbit = 10^9 bits.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import json
import math
from dataclasses import dataclass

import numpy as np

from strategies.cost_bandwidth import bandwidth_for  # noqa: F401 - cost.bandwidth_for

# the price on nodes lives in its own module; its names stay importable from here
from strategies.cost_nodes import (  # noqa: F401 - re-exported
    NodeCost,
    hierarchical_node_seconds,
    node_cost,
    node_levels,
    node_seconds,
    sync_period,
)
from strategies.cost_servers import barrier_free_update_seconds, server_update_seconds  # noqa: F401 - cost.* names

MB = 1e6
GBIT = 1e9 / 8  # bytes per second of a 1 Gbit/s link


# ---- the formulas ----------------------------------------------------------------------------------------

def comm_time(rounds: float, path_bytes: float, bandwidth: float, latency: float = 0.0) -> float:
    """Tt = rounds x alpha + path_bytes x beta: alpha = latency (s), beta = 1 / bandwidth (bytes/s)."""
    return rounds * latency + path_bytes / bandwidth


def byteps_optimum(workers: int, servers: int, nbytes: float, bandwidth: float) -> float:
    """BytePS (OSDI 2020): the least time n workers and k extra server NICs (all of bandwidth B, full duplex) can
    synchronize M bytes in, t = 2 n (n - 1) M / ((n^2 + k n - 2 k) B). k = 0 is an allreduce's 2 (n - 1) M / (n B),
    k = n gives M / B; a server's link carries n / k times a worker's bytes."""
    n, k = workers, servers
    if n <= 1 and k == 0:
        return 0.0  # one worker alone has nothing to agree on
    return 2 * n * (n - 1) * nbytes / ((n * n + k * n - 2 * k) * bandwidth) if n > 1 else nbytes / bandwidth


def optimum_comm_s(config, workers: int, nbytes: float, bandwidth: float) -> float:
    """The architecture's bound for an exact strategy: BytePS's optimum with the strategy's extra server ranks
    (0 for an allreduce or colocated servers); NaN for an inexact one (it does not compute the same thing)."""
    if not config.exact:
        return math.nan
    return byteps_optimum(workers, config.num_servers(workers), nbytes, bandwidth)


def parse_strategy(text: str) -> tuple[str, dict]:
    """'parameter_server:servers=4,placement=colocated' -> ('parameter_server', {'servers': 4, 'placement': ...}).

    Values read as TOML would: integers, numbers, true/false, anything else a string."""
    name, _, rest = str(text).partition(":")
    params = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise ValueError(f"bad strategy parameter {item!r} in {text!r}: expected name:key=value[,key=value...], "
                             f"e.g. parameter_server:servers=4,placement=colocated")
        params[key.strip()] = _parameter_value(value.strip())
    return name.strip(), params


def _parameter_value(text: str):
    if text in ("true", "false"):
        return text == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def parallel_efficiency(compute_s: float, comm_s: float) -> float:
    """P = Ts / (Ts + Tt)."""
    return compute_s / (compute_s + comm_s)


def bandwidth_needed(path_bytes: float, compute_s: float, efficiency: float, rounds: float = 0.0,
                     latency: float = 0.0) -> float:
    """S = path_bytes x P / ((1-P) Ts - P x rounds x alpha) bytes/s; inf if latency alone uses the budget.

    Solving P = Ts / (Ts + Tt) for the bandwidth: Tt may be (1-P) Ts / P seconds, of which rounds x alpha
    go to latency and the rest carries the bytes. With zero latency: S = path_bytes x P / ((1-P) Ts).
    """
    if not 0 < efficiency < 1:
        raise ValueError(f"bad target efficiency {efficiency!r}: expected a number between 0 and 1, e.g. 0.9")
    budget = (1 - efficiency) * compute_s / efficiency - rounds * latency  # seconds left to carry the bytes
    if path_bytes == 0:
        return 0.0 if budget >= 0 else math.inf
    if budget <= 0:
        return math.inf
    return path_bytes / budget


@dataclass(frozen=True)
class AlphaBeta:
    """A calibrated alpha-beta model: alpha seconds per round, beta seconds per byte on the critical path."""

    alpha: float
    beta: float
    runs: int  # how many measurements the fit used
    rmse: float  # root-mean-square error of the fit, seconds

    @property
    def bandwidth(self) -> float:
        """The effective bandwidth 1/beta in bytes/s (math.inf when beta is 0)."""
        return 1 / self.beta if self.beta > 0 else math.inf

    def predict(self, rounds, path_bytes):
        return np.asarray(rounds, float) * self.alpha + np.asarray(path_bytes, float) * self.beta


def calibrate(rounds, path_bytes, comm_s) -> AlphaBeta:
    """Least-squares fit comm_s ~ rounds x alpha + path_bytes x beta with alpha >= 0 and beta >= 0."""
    rounds, path_bytes, comm_s = (np.asarray(v, float) for v in (rounds, path_bytes, comm_s))
    keep = np.isfinite(rounds) & np.isfinite(path_bytes) & np.isfinite(comm_s)
    rounds, path_bytes, comm_s = rounds[keep], path_bytes[keep], comm_s[keep]
    if len(comm_s) == 0:
        raise ValueError("cannot calibrate alpha and beta: no measurement has rounds, bytes and time")
    # With two unknowns the non-negative least-squares solution is the best of: the free fit (if both come
    # out non-negative), alpha alone, beta alone, or nothing.
    candidates = [(0.0, 0.0)]
    if rounds @ rounds > 0:
        candidates.append((max(rounds @ comm_s / (rounds @ rounds), 0.0), 0.0))
    if path_bytes @ path_bytes > 0:
        candidates.append((0.0, max(path_bytes @ comm_s / (path_bytes @ path_bytes), 0.0)))
    scale = np.array([max(np.abs(rounds).max(), 1e-300), max(np.abs(path_bytes).max(), 1e-300)])
    design = np.column_stack([rounds, path_bytes]) / scale  # so rounds (~10) and bytes (~1e8) are alike
    free, *_ = np.linalg.lstsq(design, comm_s, rcond=None)
    free = free / scale
    if (free >= 0).all():
        candidates.append((float(free[0]), float(free[1])))

    def sse(ab):
        return float(((rounds * ab[0] + path_bytes * ab[1] - comm_s) ** 2).sum())

    alpha, beta = min(candidates, key=sse)
    return AlphaBeta(alpha, beta, len(comm_s), math.sqrt(sse((alpha, beta)) / len(comm_s)))


# ---- analytic traffic from the strategies --------------------------------------------------------------

def _params_key(params: dict | str | None) -> str:
    if params is None or params == "":
        return "{}"
    if isinstance(params, str):
        params = json.loads(params)
    return json.dumps(params, sort_keys=True)


@functools.lru_cache(maxsize=4096)
def _traffic(name: str, params_key: str, workers: int, numel: int, itemsize: int,
             shapes: tuple | None = None) -> tuple[float, float, str]:
    import strategies

    return config_path(strategies.make(name, **json.loads(params_key)), workers, numel, itemsize, shapes)


def config_path(config, workers: int, numel: int, itemsize: int = 4,
                shapes: tuple | None = None) -> tuple[float, float, str]:
    """(rounds, path_bytes, note) per step of a strategy config (wrappers included: compression, local SGD) for
    one buffer of numel elements; cached (a bisection over bandwidths prices one traffic() hundreds of times)."""
    if shapes is not None:
        shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
    try:
        return _config_path(config, workers, numel, itemsize, shapes)
    except TypeError:  # an unhashable config (a plug-in's): priced uncached
        return _config_path.__wrapped__(config, workers, numel, itemsize, shapes)


@functools.lru_cache(maxsize=4096)
def _config_path(config, workers: int, numel: int, itemsize: int, shapes) -> tuple[float, float, str]:
    import strategies

    # the buffer's tensors, for a strategy whose bytes depend on them (PowerSGD compresses each tensor on its own)
    layout = {"shapes": shapes} if shapes is not None and "shapes" in inspect.signature(config.traffic).parameters \
        else {}
    traffic = config.traffic(workers, numel, itemsize, **layout)
    if not traffic.counted:  # the backend hides its bytes (native): model it as a ring allreduce
        ring = strategies.make("ring").traffic(workers, numel, itemsize)
        return ring.rounds, ring.path_bytes, "modelled as ring (the backend hides its bytes)"
    path = traffic.path_bytes
    replayed = getattr(config, "replayed_path_bytes", None)
    if replayed is not None:
        # a pipeline whose ranks do not keep its slots in step (double_binary_tree): its schedule replayed is its
        # path (None: too many messages to replay, traffic()'s sum of the slots stands)
        replayed_path = replayed(workers, numel, itemsize)
        path = path if replayed_path is None else replayed_path
    period = sync_period(config)
    if period > 1:  # local SGD: a sync's traffic on one step in H, none on the others
        return (traffic.rounds / period, path / period,
                f"one sync every {period} steps: its traffic / {period} per step")
    return traffic.rounds, path, ""


def pipeline_fill(name: str, workers: int, numel: int, params: dict | str | None = None,
                  itemsize: int = 4) -> tuple[float, float]:
    """(rounds, bytes) of one sync's critical path that the next sync's streaming overlaps when the strategy keeps
    syncs in flight together (Strategy.isync; the synchronous dedicated parameter server: the last partition's
    fan-out, which the next bucket's pushes do not wait for); (0, 0) for a strategy that syncs one after another."""
    import strategies

    config = strategies.make(name, **json.loads(_params_key(params)))
    fill = getattr(config, "pipeline_fill", None)
    return fill(workers, numel, itemsize) if fill is not None and workers > 1 else (0, 0)


def critical_path(name: str, workers: int, numel: int, params: dict | str | None = None,
                  itemsize: int = 4, shapes=None) -> tuple[float, float, str]:
    """(rounds, path_bytes, note) of a strategy's analytic traffic per step; cached, as large n is slow to count.

    Per step: local SGD (sync_every = H > 1) synchronizes on one step in H, so its rounds and bytes are a sync's
    / H (what the run measures per step over whole periods); every other strategy's are its traffic()'s.
    `shapes`: the tensors the buffer holds, in buffer order (None: one tensor); PowerSGD's bytes depend on them."""
    if workers < 1:
        raise ValueError(f"bad workers {workers!r}: expected a whole number >= 1")
    if shapes is not None:
        shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
        if sum(math.prod(shape) for shape in shapes) != numel:
            raise ValueError(f"shapes hold {sum(math.prod(shape) for shape in shapes):,} elements, the buffer "
                             f"{numel:,}: give the buffer's own tensors (or none)")
    return _traffic(name, _params_key(params), int(workers), int(numel), itemsize, shapes)


# ---- the network's physics ---------------------------------------------------------------------------------

class NetworkModel(enum.StrEnum):
    """The physics a sync is priced on, SimGrid's two network models (experiments/simulate/platform.py):
    alpha_beta, a lone message of m bytes takes latency + m / bandwidth exactly (CM02, corrections off); tcp,
    SimGrid 3.32's LV08 with its default corrections (lv08_fabric)."""

    ALPHA_BETA = "alpha_beta"
    TCP = "tcp"

    @classmethod
    def parse(cls, value) -> NetworkModel:
        """The model named by value ('alpha_beta' or 'tcp'); ValueError naming the bad value and the accepted."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"bad network model {value!r}: accepted are "
                             f"{', '.join(m.value for m in cls)}") from None


# SimGrid 3.32's LV08 defaults (src/surf/network_cm02.cpp, network_interface.cpp): a flow's rate is
# 0.97 x its max-min share, its latency 13.01 x the route's, its share bounded by the TCP window,
# TCP-gamma / (2 x the route's latency, uncorrected), and each flow loads the reverse route with 5% of
# its rate (its ACKs: network/crosstraffic).
LV08_BANDWIDTH_FACTOR = 0.97
LV08_LATENCY_FACTOR = 13.01
LV08_TCP_GAMMA = 4194304.0  # bytes: network/TCP-gamma
LV08_CROSSTRAFFIC = 0.05


def tcp_window_bound(route_latency: float) -> float:
    """LV08's bound on one flow's rate, bytes/s: TCP-gamma / (2 x route latency); unbounded at zero latency."""
    return LV08_TCP_GAMMA / (2 * route_latency) if route_latency > 0 else math.inf


def sends_while_receiving(config) -> bool:
    """Whether the strategy's ranks send while they receive (StrategyConfig.sends_while_receiving of the strategy a
    wrapper runs): then under tcp a NIC's outgoing link also carries the ACKs of its incoming flows."""
    inner = config.unwrapped() if hasattr(config, "unwrapped") else config
    return bool(getattr(inner, "sends_while_receiving", True))


# ---- the one price of a sync --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fabric:
    """The network a sync is priced on: every rank's NIC (bytes/s, seconds) or, with ranks_per_node > 1, every
    node's NIC shared by its ranks and an intra-node link between them (the simulator's `nodes` platform, the
    link emulation's intra link)."""

    bandwidth: float
    latency: float = 0.0
    ranks_per_node: int = 1
    intra_bandwidth: float = math.inf
    intra_latency: float = 0.0
    network: NetworkModel = NetworkModel.ALPHA_BETA

    def __post_init__(self):
        object.__setattr__(self, "network", NetworkModel.parse(self.network))
        if not self.bandwidth > 0:
            raise ValueError(f"bad bandwidth {self.bandwidth!r}: expected bytes/s greater than zero")
        if not 0 <= self.latency < math.inf:
            raise ValueError(f"bad latency {self.latency!r}: expected seconds >= 0")
        k = self.ranks_per_node
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"bad ranks per node {k!r}: expected a whole number >= 1")
        if not self.intra_bandwidth > 0:
            raise ValueError(f"bad intra-node bandwidth {self.intra_bandwidth!r}: expected bytes/s greater than zero")

    def with_bandwidth(self, bandwidth: float) -> Fabric:
        return dataclasses.replace(self, bandwidth=bandwidth)

    def priced(self, config) -> Fabric:
        """The alpha_beta fabric whose price is this fabric's for `config`: itself on alpha_beta, lv08_fabric on
        tcp."""
        if self.network is NetworkModel.ALPHA_BETA:
            return self
        return lv08_fabric(self, sends_while_receiving(config))


def lv08_fabric(fabric: Fabric, duplex: bool) -> Fabric:
    """SimGrid's LV08 as an alpha_beta fabric: every latency x 13.01; every link's bandwidth bounded by one
    flow's TCP window over its route (NIC routes: latency + intra latency on nodes; intra-node routes: intra
    latency), x 0.97, and / 1.05 where the strategy sends while it receives (`duplex`: a link carries its own
    flows and 5% of the reverse flows' rate in ACKs). The window is priced as one flow per link, exact where a
    rank streams to one peer at a time, pessimistic where its bytes go to several peers at once."""
    ack = 1 + LV08_CROSSTRAFFIC if duplex else 1.0
    nic_route = fabric.latency + (fabric.intra_latency if fabric.ranks_per_node > 1 else 0.0)

    def rate(bandwidth: float, route_latency: float) -> float:
        return LV08_BANDWIDTH_FACTOR * min(bandwidth, tcp_window_bound(route_latency)) / ack

    return Fabric(rate(fabric.bandwidth, nic_route), fabric.latency * LV08_LATENCY_FACTOR, fabric.ranks_per_node,
                  rate(fabric.intra_bandwidth, fabric.intra_latency), fabric.intra_latency * LV08_LATENCY_FACTOR)


def sync_seconds(config, workers: int, numel: int, fabric: Fabric, itemsize: int = 4, shapes=None) -> float:
    """The one price of one sync of a numel-element buffer (per step: local SGD's sync / H): `syncbench model`, the
    simulator's alpha-beta column, `syncbench validate`, the report's model sections and the bandwidth needed all
    call it. One rank per NIC: rounds x latency + path bytes / bandwidth (traffic()'s critical path). Nodes of
    several ranks: node_cost's time (the NIC shared by the node's ranks, each level at its own bandwidth); a
    strategy with no per-level traffic raises ValueError naming the ones that have it. On a tcp fabric the same
    price on LV08's corrected links (Fabric.priced)."""
    if workers <= 1 or numel == 0:
        return 0.0
    fabric = fabric.priced(config)
    if fabric.ranks_per_node > 1:
        return node_cost(config, workers, numel, fabric.ranks_per_node, fabric.bandwidth, fabric.intra_bandwidth,
                         fabric.latency, fabric.intra_latency, itemsize).time_s
    rounds, path_bytes, _ = config_path(config, workers, numel, itemsize, shapes)
    return comm_time(rounds, path_bytes, fabric.bandwidth, fabric.latency)


def fill_seconds(config, workers: int, numel: int, fabric: Fabric, itemsize: int = 4) -> float:
    """The tail of sync_seconds the next bucket's sync overlaps (pipeline_fill: the synchronous dedicated parameter
    server's last fan-out); 0 for a strategy that syncs one bucket after another, and on nodes."""
    fill = getattr(config, "pipeline_fill", None)
    if fill is None or workers <= 1 or fabric.ranks_per_node > 1:
        return 0.0
    fabric = fabric.priced(config)
    rounds, path = fill(workers, numel, itemsize)
    return comm_time(rounds, path, fabric.bandwidth, fabric.latency) if path else 0.0


def step_timeline(config, workers: int, buckets: list[tuple[float, int]], fabric: Fabric, forward_s: float,
                  backward_s: float, optimizer_s: float, overlap: bool, itemsize: int = 4,
                  bucket_shapes: list | None = None) -> Timeline:
    """One step's predicted timeline: each bucket (ready_s after backward starts, numel) priced by sync_seconds,
    streamed as overlap_timeline says (with overlap each starts when ready; a role that averages parameters after
    the step never overlaps)."""
    from strategies.base import PARAMETERS

    after_step = getattr(config, "role", "") == PARAMETERS
    shapes = bucket_shapes or [None] * len(buckets)
    timed = [(ready, sync_seconds(config, workers, numel, fabric, itemsize, shape),
              fill_seconds(config, workers, numel, fabric, itemsize))
             for (ready, numel), shape in zip(buckets, shapes)]
    updates = getattr(config, "server_updates", None)
    total = sum(numel for _, numel in buckets)
    if updates is not None and optimizer_s > 0 and total and workers > 1 and fabric.ranks_per_node == 1:
        timed = [(ready, server_update_seconds(comm, fill, updates(workers, numel, itemsize), optimizer_s / total),
                  fill) for (ready, comm, fill), (_, numel) in zip(timed, buckets)]
    pushes = getattr(config, "push_updates", None)
    if pushes is not None and optimizer_s > 0 and total and workers > 1 and fabric.ranks_per_node == 1:
        link = fabric.priced(config)
        timed = [(ready, barrier_free_update_seconds(comm, pushes(workers, numel, itemsize), workers,
                                                     config.servers, link.bandwidth, link.latency,
                                                     optimizer_s / total, itemsize), fill)
                 for (ready, comm, fill), (_, numel) in zip(timed, buckets)]
    return overlap_timeline(forward_s, backward_s, optimizer_s, timed, overlap=overlap and not after_step,
                            after_step=after_step)


# ---- buckets overlapped with backward ---------------------------------------------------------------------

@dataclass(frozen=True)
class Timeline:
    """A predicted step with bucketed communication: seconds from the step's start."""

    backward_end_s: float  # forward + backward
    comm_end_s: float      # the last bucket synchronized
    busy_s: float          # time some bucket is in flight (sequential buckets: the sum of their times)
    exposed_s: float       # communication the step waits for: max(0, comm_end - backward_end) with overlap
    step_s: float          # forward + backward + exposed + optimizer

    @property
    def overlap_fraction(self) -> float:
        return 1 - self.exposed_s / self.busy_s if self.busy_s > 0 else math.nan


def overlap_timeline(forward_s: float, backward_s: float, optimizer_s: float,
                     buckets: list[tuple[float, ...]], overlap: bool, after_step: bool = False) -> Timeline:
    """Predict one step from a compute timeline and each bucket's (ready_s, comm_s[, fill_s]), in bucket order.

    ready_s: when the bucket's last gradient is ready, seconds after backward starts; comm_s: its sync time
    (comm_time of the strategy's traffic for the bucket); fill_s (default 0): the tail of comm_s the next bucket
    need not wait for, for a strategy that keeps buckets in flight together (pipeline_fill: the synchronous
    dedicated parameter server's last fan-out). Bucket b starts when the one before it has streamed (its end
    less its fill) and, with overlap, not before ready_b; without overlap not before backward's end. The
    optimizer waits for the last bucket to end. `after_step`: the data exists only after the local optimizer step
    (decentralized averaging of parameters), so it never overlaps. busy_s is the time some bucket is in flight.
    P = Ts / (Ts + exposed) follows, with Ts = forward + backward + optimizer.
    """
    backward_end = forward_s + backward_s
    if after_step:
        busy = sum(b[1] for b in buckets)
        end = backward_end + optimizer_s + busy
        return Timeline(backward_end, end, busy, busy, end)
    streamed = end = backward_end if not overlap else forward_s
    spans = []
    for ready, comm, *fill in buckets:
        tail = min(fill[0], comm) if fill else 0.0
        start = max(forward_s + ready, streamed) if overlap else streamed
        streamed = start + comm - tail
        spans.append((start, start + comm))
        end = max(end, start + comm)
    busy, reach = 0.0, -math.inf  # the union of the buckets' intervals (disjoint unless they pipeline)
    for start, stop in sorted(spans):
        if stop > reach:
            busy += stop - max(start, reach)
            reach = stop
    exposed = max(0.0, end - backward_end)
    return Timeline(backward_end, end, busy, exposed, backward_end + exposed + optimizer_s)
