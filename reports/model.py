"""The bandwidth-requirement and alpha-beta cost model, in one place for `syncbench model` and the report.

For a strategy with analytic traffic (rounds, path_bytes) for n workers and a gradient of d bytes:

    Tt = rounds x alpha + path_bytes x beta          communication time per step (beta = 1 / bandwidth)
    P  = Ts / (Ts + Tt)                               parallel efficiency, Ts the compute time per step
    Tp = Ts + Tt                                      step time
    S  = path_bytes x P / ((1 - P) x Ts - P x rounds x alpha)   bandwidth needed for efficiency P

Units: bytes and seconds everywhere; MB = 10^6 bytes, Gbit = 10^9 bits.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from strategies import make as make_strategy
from strategies import names as strategy_names
from workloads.models import MODELS as WORKLOAD_MODELS
from workloads.models import param_count

MB = 1e6
GBIT = 1e9 / 8  # bytes per second of a 1 Gbit/s link

MODELS = tuple(m for m in WORKLOAD_MODELS if m != "tiny")  # the torchvision models `syncbench model` knows
EXTRAPOLATION_WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
EXTRAPOLATION_LINKS = {"1 Gbit": 1 * GBIT, "10 Gbit": 10 * GBIT, "25 Gbit": 25 * GBIT, "100 Gbit": 100 * GBIT}
TARGET_EFFICIENCIES = (0.5, 0.8, 0.9)
# `syncbench model --workers`: counting the analytic traffic of 1,024 workers takes ~5 s on one core, and it
# grows about as n^2, so 10,000 would take minutes
MAX_MODEL_WORKERS = 1024


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

@functools.cache
def model_numel(model: str) -> int:
    """Parameter count of a model with 1,000 classes (vgg16 -> 138,357,544), counted by workloads; cached."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: known are {', '.join(MODELS)} (or give model bytes)")
    return param_count(model, num_classes=1000, image_size=224)


def _params_key(params: dict | str | None) -> str:
    if params is None or params == "":
        return "{}"
    if isinstance(params, str):
        params = json.loads(params)
    return json.dumps(params, sort_keys=True)


@functools.lru_cache(maxsize=4096)
def _traffic(name: str, params_key: str, workers: int, numel: int, itemsize: int) -> tuple[int, int, str]:
    config = make_strategy(name, **json.loads(params_key))
    traffic = config.traffic(workers, numel, itemsize)
    if not traffic.counted:  # the backend hides its bytes (native): model it as a ring allreduce
        ring = make_strategy("ring").traffic(workers, numel, itemsize)
        return ring.rounds, ring.path_bytes, "modelled as ring (the backend hides its bytes)"
    return traffic.rounds, traffic.path_bytes, ""


def critical_path(name: str, workers: int, numel: int, params: dict | str | None = None,
                  itemsize: int = 4) -> tuple[int, int, str]:
    """(rounds, path_bytes, note) of a strategy's analytic traffic; cached, as large n is slow to count."""
    if workers < 1:
        raise ValueError(f"bad workers {workers!r}: expected a whole number >= 1")
    return _traffic(name, _params_key(params), int(workers), int(numel), itemsize)


# ---- buckets overlapped with backward ---------------------------------------------------------------------

@dataclass(frozen=True)
class Timeline:
    """A predicted step with bucketed communication: seconds from the step's start."""

    backward_end_s: float  # forward + backward
    comm_end_s: float      # the last bucket synchronized
    busy_s: float          # sum of the buckets' communication times
    exposed_s: float       # communication the step waits for: max(0, comm_end - backward_end) with overlap
    step_s: float          # forward + backward + exposed + optimizer

    @property
    def overlap_fraction(self) -> float:
        return 1 - self.exposed_s / self.busy_s if self.busy_s > 0 else math.nan


def overlap_timeline(forward_s: float, backward_s: float, optimizer_s: float,
                     buckets: list[tuple[float, float]], overlap: bool, after_step: bool = False) -> Timeline:
    """Predict one step from a compute timeline and each bucket's (ready_s, comm_s), in bucket order.

    ready_s: when the bucket's last gradient is ready, seconds after backward starts; comm_s: its sync time
    (comm_time of the strategy's traffic for the bucket). With overlap, bucket b starts at
    max(ready_b, end of bucket b-1) and the optimizer waits for the last one; without, the buckets follow
    backward one after another. `after_step`: the data exists only after the local optimizer step
    (decentralized averaging of parameters), so it never overlaps.
    P = Ts / (Ts + exposed) follows, with Ts = forward + backward + optimizer.
    """
    backward_end = forward_s + backward_s
    busy = sum(comm for _, comm in buckets)
    if after_step:
        end = backward_end + optimizer_s + busy
        return Timeline(backward_end, end, busy, busy, end)
    if not overlap:
        end = backward_end + busy
    else:
        end = forward_s
        for ready, comm in buckets:
            end = max(forward_s + ready, end) + comm
    exposed = max(0.0, end - backward_end)
    return Timeline(backward_end, end, busy, exposed, backward_end + exposed + optimizer_s)


# ---- the `syncbench model` table --------------------------------------------------------------------------

def model_table(model: str | None, model_bytes: float | None, workers: int, bandwidth: float,
                step_time: float, latency: float = 0.0, target_efficiency: float = 0.9,
                strategies: list[str] | None = None) -> pd.DataFrame:
    """One row per strategy: communication time, efficiency P, step time Tp and bandwidth for the target P.

    Give `model` (a torchvision name) or `model_bytes` (fp32 gradient bytes), not both. bandwidth in bytes/s,
    step_time (the compute time Ts) and latency in seconds.
    """
    if (model is None) == (model_bytes is None):
        raise ValueError(f"give a model name or model bytes, not {'both' if model else 'neither'} "
                         f"(model={model!r}, model_bytes={model_bytes!r})")
    if model is not None:
        numel = model_numel(model)
    else:
        if not model_bytes > 0:
            raise ValueError(f"bad model bytes {model_bytes!r}: expected a size > 0, e.g. 553.36MB")
        numel = round(model_bytes / 4)  # fp32
    if isinstance(workers, bool) or int(workers) != workers or not 1 <= workers <= MAX_MODEL_WORKERS:
        raise ValueError(f"bad workers {workers!r}: expected a whole number from 1 to {MAX_MODEL_WORKERS:,}")
    if not 0 < bandwidth < math.inf:
        raise ValueError(f"bad bandwidth {bandwidth!r}: expected bytes/s greater than zero")
    if not 0 < step_time < math.inf:
        raise ValueError(f"bad step time {step_time!r}: expected the compute time per step in seconds, > 0")
    if not 0 <= latency < math.inf:
        raise ValueError(f"bad latency {latency!r}: expected seconds >= 0")
    if not 0 < target_efficiency < 1:
        raise ValueError(f"bad target efficiency {target_efficiency!r}: expected a number between 0 and 1")
    known = strategy_names()
    specs = [parse_strategy(text) for text in strategies] if strategies else [(name, {}) for name in known]
    unknown = [n for n, _ in specs if n not in known]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}: known are {', '.join(known)}")
    labels = list(strategies) if strategies else known
    configs = []
    for label, (name, params) in zip(labels, specs):
        try:
            configs.append(make_strategy(name, **params))
        except TypeError as e:
            raise ValueError(f"strategy {label!r}: {e}") from None

    rows = []
    for label, (name, params), config in zip(labels, specs, configs):
        row = {"strategy": label, "workers": int(workers), "model_bytes": numel * 4}
        try:
            rounds, path_bytes, note = critical_path(name, int(workers), numel, params)
            optimum = optimum_comm_s(config, int(workers), numel * 4, bandwidth)
        except (ValueError, NotImplementedError) as e:  # e.g. a strategy that needs a power-of-two n
            rows.append(row | {"rounds": math.nan, "path_bytes": math.nan, "comm_s": math.nan,
                               "optimum_s": math.nan, "efficiency": math.nan, "step_s": math.nan,
                               "bandwidth_needed": math.nan, "note": str(e)})
            continue
        tt = comm_time(rounds, path_bytes, bandwidth, latency)
        rows.append(row | {
            "rounds": rounds,
            "path_bytes": path_bytes,
            "comm_s": tt,
            "optimum_s": optimum,
            "efficiency": parallel_efficiency(step_time, tt),
            "step_s": step_time + tt,
            "bandwidth_needed": bandwidth_needed(path_bytes, step_time, target_efficiency, rounds, latency),
            "note": note,
        })
    df = pd.DataFrame(rows)
    df.attrs.update(model=model or "", bandwidth=bandwidth, step_time=step_time, latency=latency,
                    target_efficiency=target_efficiency, numel=numel)
    return df


def format_model_table(df: pd.DataFrame) -> str:
    """A plain table of model_table()'s rows, to paste into an issue."""
    a = df.attrs
    target = a.get("target_efficiency", 0.9)
    head = []
    if a:
        what = a["model"] or "model"
        head = [f"# {what}: {a['numel']:,} parameters, {a['numel'] * 4 / MB:,.2f} MB fp32; "
                f"link {a['bandwidth'] / MB:,.2f} MB/s ({a['bandwidth'] / GBIT:g} Gbit/s), "
                f"latency {a['latency'] * 1e6:g} us; compute time Ts {a['step_time']:g} s",
                "# MB = 10^6 bytes; S = bandwidth needed for the target efficiency; optimum = BytePS's bound "
                "2n(n-1)M/((n^2+kn-2k)B) with the strategy's k extra server NICs (k = 0: an allreduce's)"]
    columns = ["strategy", "workers", "rounds", "path MB", "comm s", "optimum s", "P", "step s",
               f"S for P={target:g} MB/s", "note"]
    lines = []
    for r in df.itertuples():
        if math.isnan(r.comm_s):
            cells = [r.strategy, str(r.workers), "-", "-", "-", "-", "-", "-", "-", r.note]
        else:
            s = "unreachable" if math.isinf(r.bandwidth_needed) else f"{r.bandwidth_needed / MB:,.0f}"
            optimum = "-" if math.isnan(r.optimum_s) else f"{r.optimum_s:.3f}"
            cells = [r.strategy, str(r.workers), f"{r.rounds:,}", f"{r.path_bytes / MB:,.2f}",
                     f"{r.comm_s:.3f}", optimum, f"{r.efficiency:.4f}", f"{r.step_s:.2f}", s, r.note]
        lines.append(cells)
    widths = [max([len(c)] + [len(cells[i]) for cells in lines]) for i, c in enumerate(columns)]
    left = (0, len(columns) - 1)  # strategy and note read left-aligned, numbers right-aligned
    fmt = "  ".join(f"{{:<{w}}}" if i in left else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = head + [fmt.format(*columns).rstrip()] + [fmt.format(*cells).rstrip() for cells in lines]
    return "\n".join(out)


# ---- the extrapolation --------------------------------------------------------------------------------

def extrapolate(numel: int, strategy_specs: list[tuple[str, str, str]], alpha: float,
                workers=EXTRAPOLATION_WORKERS, links: dict[str, float] | None = None,
                compute_s: float | None = None) -> pd.DataFrame:
    """Modelled comm time per step for each (label, name, params JSON) strategy, n and link; not measured."""
    links = EXTRAPOLATION_LINKS if links is None else links
    rows = []
    for label, name, params in strategy_specs:
        for n in workers:
            try:
                rounds, path_bytes, note = critical_path(name, n, numel, params)
            except (ValueError, NotImplementedError):
                continue  # this strategy cannot run on n workers (e.g. it needs a power of two)
            for link, bandwidth in links.items():
                tt = comm_time(rounds, path_bytes, bandwidth, alpha)
                row = {"strategy": label, "workers": n, "link": link, "bandwidth": bandwidth,
                       "rounds": rounds, "path_bytes": path_bytes, "comm_s": tt, "note": note}
                if compute_s is not None:
                    row |= {"efficiency": parallel_efficiency(compute_s, tt), "step_s": compute_s + tt}
                rows.append(row)
    return pd.DataFrame(rows)
