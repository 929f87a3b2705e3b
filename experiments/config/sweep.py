"""Sweep files: TOML -> a validated Sweep -> one RunSpec per grid point.

The whole file is checked before any actor starts; every problem is reported with its key, its value and
what would be accepted. The settings and their ranges are one table (experiments/config/settings.py); a grid
point becomes a RunSpec in experiments/config/point.py; the [simulate] table is experiments/config/simulate_table.py.
"""

from __future__ import annotations

import itertools
import json
import math
import tomllib
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import strategies
from experiments.config.point import COMPUTE_MODES, DEVICES, TARGET_METRICS, make_spec
from experiments.config.run import RUN_KEYS, RunSpec, setting
from experiments.config.settings import (
    DEFAULT_TRACE_STEPS,
    MAX_RANKS,
    MAX_TRACE_STEPS,
    MAX_TRACED_RANKS,
    RANGES,
    SETTINGS,
    Range,
    SweepError,
    report,
)
from experiments.config.settings import TYPES as _TYPES
from experiments.config.simulate_table import SIMULATE_RANGES, SIMULATE_TYPES, check_simulate
from workloads.files import FileLimitError, check_depth, check_text, read_bounded

__all__ = ["COMPUTE_MODES", "DEFAULT_TRACE_STEPS", "DEVICES", "MAX_RANKS", "MAX_RUNS", "MAX_SWEEP_BYTES",
           "MAX_TRACED_RANKS", "MAX_TRACE_STEPS", "RANGES", "RUN_KEYS", "SETTINGS", "SIMULATE_RANGES",
           "SIMULATE_TYPES", "TARGET_METRICS", "TOP_LEVEL", "_TYPES", "Range", "RunSpec", "Sweep", "SweepError",
           "check_simulate", "load", "loads_toml", "parse", "read_toml", "run_label", "varying_axes"]

TOP_LEVEL = ("name", "description", "defaults", "grid", "strategy_params")
MAX_RUNS = 10_000  # grid points of one sweep; expanding them takes about 0.3 ms each
MAX_SWEEP_BYTES = 1_000_000  # a sweep file; 10,000 grid values take about 100 KB


@dataclass(frozen=True)
class Sweep:
    name: str
    description: str
    runs: tuple[RunSpec, ...]
    source: str  # the TOML text, saved beside the results
    skipped: tuple[tuple[str, str], ...] = ()  # --skip-invalid: (grid point, why it cannot run) of each left out


def read_toml(path: str | Path) -> tuple[dict, str]:
    """A sweep file's table and text; SweepError naming the file when it is missing or not TOML."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} does not exist")
    try:
        text = read_bounded(path, MAX_SWEEP_BYTES, "sweep file")
        return loads_toml(text, str(path)), text
    except FileLimitError as e:
        raise SweepError(str(e)) from None


def loads_toml(text: str, where: str) -> dict:
    """Parse TOML within workloads.files' bounds (nesting, digits); SweepError naming `where` otherwise.

    For sweep files and for the sweep.toml kept beside results (resume reads it back)."""
    try:
        check_text(text, where)
        data = tomllib.loads(text)
        check_depth(data, where)
    except FileLimitError as e:
        raise SweepError(str(e)) from None
    except (tomllib.TOMLDecodeError, ValueError) as e:  # ValueError: Python's int limit, past check_text's digits
        raise SweepError(f"{where}: not valid TOML: {e}") from None
    return data


def load(path: str | Path, progress=None, skip_invalid: bool = False) -> Sweep:
    data, text = read_toml(path)
    return parse(data, source=text, where=str(path), progress=progress, skip_invalid=skip_invalid)


def parse(data: dict, source: str = "", where: str = "sweep", progress=None, skip_invalid: bool = False,
          measured: bool = True) -> Sweep:
    """Validate a parsed TOML document and expand its grid; raise SweepError listing every problem.

    `progress(done, total)` is called every 1,000 grid points of a grid of more than 2,000 (a long expansion).
    `skip_invalid`: a grid point whose settings cannot run (colocated servers = 32 at 16 workers) is left out and
    listed in Sweep.skipped with its reasons, instead of refusing the sweep; problems of the file itself still do.
    `measured`: the runs compute on real ranks (not simulated), so a batch that cannot fit in memory is refused.
    """
    name, defaults, grid, params_by_strategy = _tables(data, where)
    axes = [(k, v) for k, v in grid.items()]
    total = math.prod(len(values) for _, values in axes)
    if total > MAX_RUNS:  # refuse before expanding: 7 million points took minutes
        sizes = " x ".join(f"grid.{k} ({len(v):,})" for k, v in axes)
        raise SweepError(f"{where}: the grid has {total:,} points ({sizes}): at most {MAX_RUNS:,} runs per sweep; "
                         f"split it into several sweeps")
    expansion = _Expansion(name, params_by_strategy, skip_invalid, measured)
    for i, combo in enumerate(itertools.product(*[values for _, values in axes]), 1):
        point = {**defaults, **dict(zip([k for k, _ in axes], combo))}
        if _crosses_compute(grid):  # real runs and their profile twins: each takes only the settings of its mode
            if point.get("compute") == "profile" and "target" not in grid and point.get("target") is not None:
                del point["target"]  # a replayed profile does not train: the twin gives seconds per step
            if point.get("compute") == "real" and "profile" not in grid and point.get("profile") is not None:
                del point["profile"]  # the real run computes: the profile is its twin's
        expansion.add(point, axes)
        if progress is not None and total > 2000 and (i % 1000 == 0 or i == total):
            progress(i, total)
    runs, skipped, errors = expansion.runs, expansion.skipped, expansion.errors
    _check_sweep(runs, expansion.ranks_seen, params_by_strategy, where, errors)
    if errors:
        raise SweepError(report(where, sorted(set(errors), key=errors.index)))
    if not runs:
        more = f" ({len(skipped)} grid point(s) skipped: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise SweepError(f"{where}: the grid expands to no runs{more}")
    return Sweep(name=name, description=str(data.get("description", "")), runs=tuple(runs), source=source,
                 skipped=tuple(skipped))


def _tables(data: dict, where: str) -> tuple[str, dict, dict, dict]:
    """The sweep's name and its [defaults], [grid] and [strategy_params] tables, their keys known; SweepError
    listing every problem otherwise."""
    errors: list[str] = []
    for key in data:
        if key not in TOP_LEVEL:
            hint = " (a [simulate] table: run this file with `syncbench simulate`)" if key == "simulate" else ""
            errors.append(f"unknown top-level key {key!r}: accepted are {', '.join(TOP_LEVEL)}{hint}")
    name = data.get("name", Path(where).stem)
    if not isinstance(name, str) or not name.strip():
        errors.append(f"name = {name!r}: expected a non-empty string")
        name = "sweep"
    defaults = _table(data, "defaults", errors)
    grid = _table(data, "grid", errors)
    params_by_strategy = _table(data, "strategy_params", errors)
    for key in defaults:
        _check_key(f"defaults.{key}", key, errors)
    for key, values in grid.items():
        _check_key(f"grid.{key}", key, errors)
        if not isinstance(values, list) or not values:
            errors.append(f"grid.{key} = {values!r}: expected a non-empty list of values")
    if errors:
        raise SweepError(report(where, errors))
    return name, defaults, grid, params_by_strategy


class _Expansion:
    """The runs of a sweep as its grid points come: each point's strategy-parameter variants and repeats, a run
    listed twice kept once, the problems (or, with skip_invalid, the points left out and why)."""

    def __init__(self, name: str, params_by_strategy: dict, skip_invalid: bool, measured: bool):
        self.name, self.params_by_strategy = name, params_by_strategy
        self.skip_invalid, self.measured = skip_invalid, measured
        self.runs: list[RunSpec] = []
        self.seen: dict[str, RunSpec] = {}
        self.skipped: list[tuple[str, str]] = []
        self.ranks_seen: dict[int, list[bool]] = {}  # link.ranks.N: per run, whether it has rank N
        self.errors: list[str] = []

    def add(self, point: dict, axes: list) -> None:
        # a list under [strategy_params.<strategy>] is one more grid axis, for that strategy's runs only
        strategy = setting(point, "strategy")
        strategy = strategy if isinstance(strategy, str) else ""  # a bad value: make_spec names it
        errors = self.errors
        for params in _strategy_param_points(self.params_by_strategy.get(strategy, {})):
            before = len(errors)
            first = make_spec(self.name, dict(point), {strategy: params}, errors, self.ranks_seen, self.measured)
            if self.skip_invalid and len(errors) > before:
                shown = {k: point.get(k) for k, _ in axes} | {"strategy": strategy} | (
                    params if isinstance(params, dict) else {})
                self.skipped.append((", ".join(f"{k}={v!r}" for k, v in shown.items()), "; ".join(errors[before:])))
                del errors[before:]
                continue
            if first is not None:
                self._add_repeats(first, point.get("repeats", 1))

    def _add_repeats(self, first: RunSpec, repeats: int) -> None:
        # repeats: the same run again with the next seeds, each its own run (repeat 0 keeps its id)
        for spec in [replace(first, seed=first.seed + r, repeat=r) for r in range(repeats)]:
            twin = self.seen.setdefault(spec.run_id, spec)
            if twin is spec:
                self.runs.append(spec)
            elif twin != spec:  # equal specs are one run listed twice; different ones must never share an id
                self.errors.append(f"run id {spec.run_id} names two different runs: {twin} and {spec}")


def _check_sweep(runs: list, ranks_seen: dict, params_by_strategy: dict, where: str, errors: list[str]) -> None:
    """What only the whole sweep shows: per-rank links no run has, too many runs, unknown strategy tables."""
    for rank, had in sorted(ranks_seen.items()):
        if not any(had):  # an override no run applies would be a typo silently ignored
            errors.append(f"link.ranks.{rank}: no run of the sweep has rank {rank} (each run has ranks 0..world "
                          f"size - 1: workers, then servers)")
    if len(runs) > MAX_RUNS:
        raise SweepError(f"{where}: the grid and the strategy parameters' lists expand to {len(runs):,} runs: at "
                         f"most {MAX_RUNS:,} per sweep; split it into several sweeps")
    for strategy_name, params in params_by_strategy.items():
        if strategy_name not in strategies.names():
            errors.append(f"strategy_params.{strategy_name}: unknown strategy; known are "
                          f"{', '.join(strategies.names())}")
        elif not isinstance(params, dict) and not (isinstance(params, list) and params
                                                   and all(isinstance(p, dict) for p in params)):
            errors.append(f"strategy_params.{strategy_name} = {params!r}: expected a table of parameters (or an "
                          f"array of tables, [[strategy_params.{strategy_name}]], one variant each)")


def _strategy_param_points(params) -> list:
    """A strategy's parameter table -> one table per combination of its list values (`servers = [1, 2, 4]` gives
    three); an array of tables ([[strategy_params.ring]], one variant each: compression = "fp16" in one,
    sync_every = 4 in another) -> the points of each table; not a table: as it is, for make_spec to refuse."""
    if isinstance(params, list) and params and all(isinstance(p, dict) for p in params):
        return [point for table in params for point in _strategy_param_points(table)]
    if not isinstance(params, dict):
        return [params]
    keys = list(params)
    values = [v if isinstance(v, list) and v else [v] for v in params.values()]
    return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def varying_axes(runs) -> list[str]:
    """The settings that differ between these runs, strategy parameters by their own names (`servers`), in a
    stable order: what the printed table, the progress lines and the report's labels must show."""
    settings = [_axis_values(run) for run in runs]
    keys = list(dict.fromkeys(k for s in settings for k in s))
    # a strategy parameter varies if it differs between the runs that have it (ring has no `servers`)
    return [k for k in keys if len({json.dumps(s[k], sort_keys=True, default=str) for s in settings if k in s}) > 1]


def run_label(run, axes) -> str:
    """`strategy servers=4 placement=colocated ...`: the run's strategy and its values on the varying axes."""
    values = _axis_values(run)
    return " ".join([run.strategy] + [f"{k}={_show(values[k])}" for k in axes if k != "strategy" and k in values])


def _axis_values(run) -> dict:
    values = {k: v for k, v in asdict(run).items() if k not in ("sweep", "strategy_params")}
    values["link"], values["straggler"] = run.link_label, _show(run.straggler)
    return values | run.wrapper_settings() | {k: v for k, v in run.strategy_params.items() if k not in values}


def _show(value) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}:{_show(v)}" for k, v in value.items())
    return "-" if value is None else str(value)


def _table(data: dict, key: str, errors: list[str]) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        errors.append(f"{key} = {value!r}: expected a table ([{key}])")
        return {}
    return value


def _check_key(where: str, key: str, errors: list[str]) -> None:
    if key not in RUN_KEYS:
        errors.append(f"unknown key {where!r}: accepted are {', '.join(sorted(RUN_KEYS))}")


def _crosses_compute(grid: dict) -> bool:
    """[grid] compute = ["real", "profile"]: every profile point is the twin of the real point with the same other
    settings (reports/tta.py). A [defaults] target then applies to the real runs only (a replayed profile does not
    train; the twin gives the seconds per step) and a [defaults] profile to the profile runs only. Set per point (in
    [grid]), a target on a profile run or a profile on a real run is still refused."""
    compute = grid.get("compute")
    return isinstance(compute, list) and "real" in compute and "profile" in compute
