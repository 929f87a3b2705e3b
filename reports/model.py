"""The `syncbench model` table and the extrapolation, built on the cost model in strategies/cost.py (the formulas,
BytePS's optimum, calibration, the overlap timeline: re-exported here for the report's modules).

Units: bytes and seconds everywhere; MB = 10^6 bytes, Gbit = 10^9 bits.
"""

from __future__ import annotations

import functools
import math

import pandas as pd

from strategies import make as make_strategy
from strategies import names as strategy_names
from strategies.cost import (  # noqa: F401 - re-exported: the report's modules price communication through here
    GBIT,
    MB,
    AlphaBeta,
    Timeline,
    bandwidth_needed,
    byteps_optimum,
    calibrate,
    comm_time,
    critical_path,
    optimum_comm_s,
    overlap_timeline,
    parallel_efficiency,
    parse_strategy,
)
from workloads.models import MODELS as WORKLOAD_MODELS
from workloads.models import param_count

MODELS = tuple(m for m in WORKLOAD_MODELS if m != "tiny")  # the torchvision models `syncbench model` knows
EXTRAPOLATION_WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
EXTRAPOLATION_LINKS = {"1 Gbit": 1 * GBIT, "10 Gbit": 10 * GBIT, "25 Gbit": 25 * GBIT, "100 Gbit": 100 * GBIT}
TARGET_EFFICIENCIES = (0.5, 0.8, 0.9)
# `syncbench model --workers`: counting the analytic traffic of 1,024 workers takes ~5 s on one core, and it
# grows about as n^2, so 10,000 would take minutes
MAX_MODEL_WORKERS = 1024


@functools.cache
def model_numel(model: str) -> int:
    """Parameter count of a model with 1,000 classes (vgg16 -> 138,357,544), counted by workloads; cached."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: known are {', '.join(MODELS)} (or give model bytes)")
    return param_count(model, num_classes=1000, image_size=224)


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
