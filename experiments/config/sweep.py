"""Sweep files: TOML -> a validated Sweep -> one RunSpec per grid point.

The whole file is checked before any actor starts; every problem is reported with its key, its value and
what would be accepted.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import strategies
from experiments.config import faults as fault_settings
from strategies.base import PARAMETERS
from strategies.cost import Fabric
from strategies.knobs import choose
from strategies.registry import WRAPPER_SETTINGS
from strategies.transport.link import Network, parse_bandwidth, parse_latency
from strategies.transport.names import P2P, default_p2p
from workloads.buckets import make_buckets
from workloads.data import DATASETS
from workloads.files import FileLimitError, check_depth, check_text, read_bounded
from workloads.models import MODELS, check_model_args, memory_problem, param_count, param_sizes
from workloads.profile import ProfileError, load_profile

DEVICES = ("cpu", "cuda")
TOP_LEVEL = ("name", "description", "defaults", "grid", "strategy_params")


@dataclass(frozen=True)
class Range:
    """The accepted values of a numeric setting: finite, from low to high (ends included unless open)."""

    low: float
    high: float
    low_open: bool = False  # low itself is not accepted (lr > 0)
    high_open: bool = False  # high itself is not accepted (momentum < 1)
    text: str = ""  # how to say it when the raw numbers would not read well (bandwidth)

    def describe(self) -> str:
        if self.text:
            return self.text
        return (f"values {'>' if self.low_open else '>='} {_num(self.low)} "
                f"and {'<' if self.high_open else '<='} {_num(self.high)}")

    def problem(self, key: str, value) -> str | None:
        """An error naming the key, the value and the range, or None when the value is accepted."""
        try:
            finite = math.isfinite(value)
        except OverflowError:  # an integer beyond any float: out of every range
            return f"{key} = {value!r}: accepted are {self.describe()}"
        if not finite:
            return f"{key} = {value!r}: must be a finite number, {self.describe()}"
        too_low = value <= self.low if self.low_open else value < self.low
        too_high = value >= self.high if self.high_open else value > self.high
        return f"{key} = {value!r}: accepted are {self.describe()}" if too_low or too_high else None


def _num(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


MAX_TRACE_STEPS = 16  # traced steps per run: each records every rank's phases and messages (bounded events table)
MAX_TRACED_RANKS = 64  # ranks of a traced run (workers + servers); larger runs trace nothing unless refused
DEFAULT_TRACE_STEPS = 3  # trace_steps not given: this many, in runs of at most MAX_TRACED_RANKS ranks (else none)

# Every numeric setting and its range, checked before Ray starts (README: "Settings and their ranges").
# A new numeric setting gets a row here; tests/experiments/test_hostile_input.py checks that none is missing.
RANGES: dict[str, Range] = {
    "image_size": Range(8, 1024),
    "num_classes": Range(2, 100_000),
    "batch_size": Range(1, 65_536),
    "steps": Range(1, 1_000_000),
    "warmup_steps": Range(0, 999_999),  # and fewer than steps, so some steps are timed
    "seed": Range(0, 2**31 - 1),
    "workers": Range(1, 16_384),  # SimGrid simulates thousands; real runs are bounded by the machine (limits.py)
    "lr": Range(0, 100, low_open=True),
    "momentum": Range(0, 1, high_open=True),
    "weight_decay": Range(0, 1),
    "timeout": Range(1, 86_400),  # seconds: every wait of a run (and a whole thread-rank run)
    "link.bandwidth": Range(125e3, 12.5e12, text="1Mbit to 100Tbit (125KB/s to 12.5TB/s)"),
    "link.latency": Range(0, 1, text="0s to 1s"),
    "straggler.slowdown": Range(1, 100),
    "bucket_mb": Range(0, 1_000_000, low_open=True),  # MiB, as DDP's bucket_cap_mb
    # compression and local SGD (strategies/compression.py, strategies/local_sgd.py)
    "powersgd_rank": Range(1, 1024),
    "powersgd_start": Range(0, 1_000_000),
    "topk_ratio": Range(0, 1, low_open=True),
    "sync_every": Range(1, 1_000_000),
    "outer_lr": Range(0, 100, low_open=True),
    "outer_momentum": Range(0, 1, high_open=True),
    "eval_every": Range(1, 1_000_000),  # steps between held-out evaluations (a run with a target)
    "ranks_per_node": Range(1, 1024),  # ranks sharing one node's NIC
    "repeats": Range(1, 1000),  # each run repeated with seeds seed, seed + 1, ...
    "trace_steps": Range(0, MAX_TRACE_STEPS),  # steps after warm-up whose events are recorded (0: none)
}
TARGET_METRICS = ("accuracy", "loss")  # target = { metric = "accuracy", value = 0.95 }: held-out top-1 or mean loss
MAX_RANKS = 16_384  # workers + servers of one run
MAX_RUNS = 10_000  # grid points of one sweep; expanding them takes about 0.3 ms each
MAX_SWEEP_BYTES = 1_000_000  # a sweep file; 10,000 grid values take about 100 KB


class SweepError(ValueError):
    """A sweep file that cannot run; the message lists every problem found."""


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; picklable, sent to every actor."""

    sweep: str = "sweep"
    workload: str = "resnet18"
    dataset: str = "synthetic"
    image_size: int = 32
    num_classes: int = 10
    batch_size: int = 32
    steps: int = 20
    warmup_steps: int = 3
    device: str = "cpu"
    seed: int = 0
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    strategy: str = "ring"
    workers: int = 1
    link: dict | None = None
    straggler: dict | None = None
    # failure injection and recovery (experiments/config/faults.py: their forms; strategies/faults.py: the modes)
    failures: dict | None = None
    recovery: dict | None = None
    timeout: float = 120.0
    strategy_params: dict = field(default_factory=dict)
    bucket_mb: float | None = None  # MiB per gradient bucket (DDP's grouping); None: one flat bucket
    overlap: bool = False  # sync each bucket from a communication thread as soon as its gradients are ready
    compute: str = "real"  # "real": the model computes; "profile": a measured timeline is replayed
    profile: str | None = None  # compute = "profile": a profile JSON file; None: measured at the run's start
    # what carries the messages (strategies.transport.names.P2P); a sweep that does not say takes default_p2p(device):
    # syncbench's sockets for host tensors, gloo/NCCL for GPU ones
    p2p: str = "sockets"
    # compression of the gradients (strategies/compression.py) and its parameters
    compression: str = "none"
    powersgd_rank: int = 1
    powersgd_start: int = 10
    powersgd_warm_start: bool = True
    topk_ratio: float = 0.01
    error_feedback: bool = True
    # local SGD / DiLoCo (strategies/local_sgd.py): average parameters every sync_every steps
    sync_every: int = 1
    outer_optimizer: str = "none"
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    # time to target: {"metric": "accuracy" | "loss", "value": v}, evaluated on held-out data every eval_every steps
    # (and after the last), outside the timed part of the step; None: no target
    target: dict | None = None
    eval_every: int = 10
    # nodes of this many consecutive ranks: they share one NIC (the link) and talk over link.intra_* inside the node;
    # node-aware strategies (hierarchical) group by it
    ranks_per_node: int = 1
    # the sweep's `repeats`: this run is repeat number `repeat` (0-based) of its configuration, its seed seed + repeat
    repeat: int = 0
    # the first trace_steps steps after warm-up record every rank's phases and messages (experiments/pipeline/trace.py);
    # None: DEFAULT_TRACE_STEPS in a run of at most MAX_TRACED_RANKS ranks, none in a larger one
    trace_steps: int | None = None
    # what the model says of the strategy's size knob (strategies/knobs.py KnobChoice.record(): the knob, the value
    # used, whether the model chose it because the sweep left it unset, the model's best value and the run's value's
    # price over the best's); None: no size knob or no link to price. Derived from the settings: not in the run id,
    # and a run the model set is the same run as one the sweep set to that value (listed twice, it runs once)
    knob_choice: dict | None = field(default=None, compare=False)

    @property
    def run_id(self) -> str:
        """Stable across invocations: the same configuration always gets the same id (resume relies on it).

        128 bits of SHA-256 over every setting: two different runs collide with probability ~2^-128 (the
        8-hex-digit id before it collided for seeds 13466 and 31908); parse() checks uniqueness anyway.
        """
        settings = {k: v for k, v in asdict(self).items()
                    if k != "knob_choice" and not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}
        blob = json.dumps(settings, sort_keys=True, default=str)
        digest = hashlib.sha256(blob.encode()).hexdigest()[:32]
        link = re.sub(r"[^A-Za-z0-9.]+", "_", self.link_label).strip("_")
        return f"{self.strategy}-n{self.workers}-{self.workload}-{link}-{digest}"

    @property
    def link_label(self) -> str:
        if not self.link:
            return "full speed"
        label = str(self.link["bandwidth"])
        if self.link.get("latency"):
            label += f" {self.link['latency']}"
        if self.link.get("intra_bandwidth") or self.link.get("intra_latency"):
            label += f" intra {self.link.get('intra_bandwidth', 'unlimited')}" + (
                f" {self.link['intra_latency']}" if self.link.get("intra_latency") else "")
        if self.link.get("ranks"):
            label += " (heterogeneous)"
        if self.link.get("emulation") == "kernel":
            label += " kernel"
        return label

    def network(self) -> Network | None:
        network = Network.from_spec(self.link)
        return network.with_nodes(self.ranks_per_node) if network and self.ranks_per_node > 1 else network

    @functools.cached_property
    def config(self):
        """The strategy with the run's compression and local-SGD settings applied (a strategy's own table may
        also set them: [strategy_params.ring] compression = "fp16"): a frozen StrategyConfig made once per RunSpec,
        on first use, and carried with it (a pickled RunSpec takes it to every actor; not a field: neither the run
        id nor equality see it, and replace() makes a new one)."""
        # a node-aware strategy groups ranks by the run's nodes unless its own table says otherwise
        node_aware = "ranks_per_node" in strategies.get(self.strategy).parameters()
        nodes = {"ranks_per_node": self.ranks_per_node} if node_aware else {}
        return strategies.make(self.strategy, **{**self.wrapper_settings(), **nodes, **self.strategy_params})

    def strategy_config(self):
        """The run's strategy config (RunSpec.config), made once."""
        return self.config

    def wrapper_settings(self) -> dict:
        """The compression and local-SGD settings the run applies (the strategy's table wins over the run's)."""
        return {k: self.strategy_params.get(k, getattr(self, k)) for k in WRAPPER_SETTINGS}

    def world_size(self) -> int:
        return self.strategy_config().world_size(self.workers)



def _setting(point: dict, key: str):
    """A run setting of a grid point: its value, or RunSpec's default (the one place defaults live)."""
    return point.get(key, getattr(RunSpec, key))

# keys a sweep sets per run; `repeats` expands into runs with `repeat` = 0, 1, ... (set by parse, not by the sweep)
RUN_KEYS = ({f.name for f in fields(RunSpec)} - {"sweep", "strategy_params", "repeat", "knob_choice"}) | {"repeats"}
# Settings added after results existed: at these values they stay out of the run id, so earlier results resume
# (p2p: runs before the sockets became the default were gloo's, and a gloo run keeps that id).
_LATER_DEFAULTS = {"bucket_mb": None, "overlap": False, "compute": "real", "profile": None, "p2p": "gloo",
                   "target": None, "eval_every": 10, "ranks_per_node": 1, "repeat": 0, "trace_steps": None,
                   "failures": None, "recovery": None,
                   **{f.name: f.default for f in fields(RunSpec) if f.name in WRAPPER_SETTINGS}}
COMPUTE_MODES = ("real", "profile")


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
    skipped: list[tuple[str, str]] = []
    ranks_seen: dict[int, list[bool]] = {}  # link.ranks.N: per run, whether it has rank N
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
        raise SweepError(_report(where, errors))

    axes = [(k, v) for k, v in grid.items()]
    total = math.prod(len(values) for _, values in axes)
    if total > MAX_RUNS:  # refuse before expanding: 7 million points took minutes
        sizes = " x ".join(f"grid.{k} ({len(v):,})" for k, v in axes)
        raise SweepError(f"{where}: the grid has {total:,} points ({sizes}): at most {MAX_RUNS:,} runs per sweep; "
                         f"split it into several sweeps")
    runs, seen = [], {}
    for i, combo in enumerate(itertools.product(*[values for _, values in axes]), 1):
        point = {**defaults, **dict(zip([k for k, _ in axes], combo))}
        if _crosses_compute(grid):  # real runs and their profile twins: each takes only the settings of its mode
            if point.get("compute") == "profile" and "target" not in grid and point.get("target") is not None:
                del point["target"]  # a replayed profile does not train: the twin gives seconds per step
            if point.get("compute") == "real" and "profile" not in grid and point.get("profile") is not None:
                del point["profile"]  # the real run computes: the profile is its twin's
        # a list under [strategy_params.<strategy>] is one more grid axis, for that strategy's runs only
        strategy = _setting(point, "strategy")
        strategy = strategy if isinstance(strategy, str) else ""  # a bad value: _make_spec names it
        for params in _strategy_param_points(params_by_strategy.get(strategy, {})):
            before = len(errors)
            first = _make_spec(name, dict(point), {strategy: params}, errors, ranks_seen, measured)
            if skip_invalid and len(errors) > before:
                shown = {k: point.get(k) for k, _ in axes} | {"strategy": strategy} | (
                    params if isinstance(params, dict) else {})
                skipped.append((", ".join(f"{k}={v!r}" for k, v in shown.items()), "; ".join(errors[before:])))
                del errors[before:]
                continue
            if first is None:
                continue
            # repeats: the same run again with the next seeds, each its own run (repeat 0 keeps its id)
            for spec in [replace(first, seed=first.seed + r, repeat=r) for r in range(point.get("repeats", 1))]:
                twin = seen.setdefault(spec.run_id, spec)
                if twin is spec:
                    runs.append(spec)
                elif twin != spec:  # equal specs are one run listed twice; different ones must never share an id
                    errors.append(f"run id {spec.run_id} names two different runs: {twin} and {spec}")
        if progress is not None and total > 2000 and (i % 1000 == 0 or i == total):
            progress(i, total)
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
    if errors:
        raise SweepError(_report(where, sorted(set(errors), key=errors.index)))
    if not runs:
        more = f" ({len(skipped)} grid point(s) skipped: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise SweepError(f"{where}: the grid expands to no runs{more}")
    return Sweep(name=name, description=str(data.get("description", "")), runs=tuple(runs), source=source,
                 skipped=tuple(skipped))


def _strategy_param_points(params) -> list:
    """A strategy's parameter table -> one table per combination of its list values (`servers = [1, 2, 4]` gives
    three); an array of tables ([[strategy_params.ring]], one variant each: compression = "fp16" in one,
    sync_every = 4 in another) -> the points of each table; not a table: as it is, for _make_spec to refuse."""
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


def _report(where: str, errors: list[str]) -> str:
    return f"{where}: {len(errors)} problem(s):\n" + "\n".join(f"  - {e}" for e in errors)


_TYPES = {"workload": str, "dataset": str, "device": str, "strategy": str, "image_size": int,
          "num_classes": int, "batch_size": int, "steps": int, "warmup_steps": int, "seed": int,
          "workers": int, "lr": float, "momentum": float, "weight_decay": float, "timeout": float,
          "bucket_mb": float, "overlap": bool, "compute": str, "profile": str, "p2p": str,
          "compression": str, "powersgd_rank": int, "powersgd_start": int, "powersgd_warm_start": bool,
          "topk_ratio": float, "error_feedback": bool, "sync_every": int, "outer_optimizer": str, "outer_lr": float,
          "outer_momentum": float, "eval_every": int, "ranks_per_node": int, "repeats": int,
          "trace_steps": int}


def _make_spec(name: str, point: dict, params_by_strategy: dict, errors: list[str],
               ranks_seen: dict[int, list[bool]] | None = None, measured: bool = True) -> RunSpec | None:
    """One grid point -> RunSpec, appending an error per bad value (key, value, what is accepted)."""
    start = len(errors)
    for key, typ in _TYPES.items():
        if key not in point:
            continue
        value = point[key]
        ok = isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            point[key], ok = float(value), True
        if not ok:
            expected = {float: "a number", bool: "true or false"}.get(typ, typ.__name__)
            errors.append(f"{key} = {value!r}: expected {expected}")
    if len(errors) > start:
        return None

    def bad(key, accepted):
        errors.append(f"{key} = {point[key]!r}: accepted are {accepted}")

    if _setting(point, "workload") not in MODELS:
        bad("workload", ", ".join(MODELS))
    if _setting(point, "dataset") not in DATASETS:
        bad("dataset", ", ".join(DATASETS))
    if _setting(point, "device") not in DEVICES:
        bad("device", ", ".join(DEVICES))
    if _setting(point, "strategy") not in strategies.names():
        bad("strategy", ", ".join(strategies.names()))
    if "p2p" not in point:  # recorded in the run: its id and transport say which it took
        point["p2p"] = default_p2p(_setting(point, "device"))
    if point["p2p"] not in P2P:
        bad("p2p", ", ".join(P2P))
    elif point["p2p"] != "gloo" and _setting(point, "device") == "cuda":
        errors.append(f"p2p = {point['p2p']!r} with device = \"cuda\": syncbench's sockets carry host tensors; "
                      f"GPU runs take p2p = \"gloo\" (NCCL when every rank has its own GPU)")
    for key, accepted in RANGES.items():
        if key in point and (problem := accepted.problem(key, point[key])):
            errors.append(problem)
    if _setting(point, "workload") in MODELS:
        try:
            check_model_args(_setting(point, "workload"), _setting(point, "num_classes"),
                             _setting(point, "image_size"))
        except ValueError as e:
            errors.append(f"workload {point.get('workload', 'resnet18')!r}: {e}")
        else:  # a batch one rank cannot train here: said now, not by the allocator once Ray has started
            model = (_setting(point, k) for k in ("workload", "num_classes", "image_size", "batch_size", "device"))
            # a replayed profile keeps no activations, but one measured at the start of the sweep does
            computes = measured and (_setting(point, "compute") == "real" or point.get("profile") is None)
            if computes and len(errors) == start and (problem := memory_problem(*model)):
                errors.append(problem)
    if point.get("dataset") == "digits" and _setting(point, "num_classes") < 10:
        errors.append(f"num_classes = {point['num_classes']!r}: the digits data set has 10 classes, need >= 10")
    steps, warmup = _setting(point, "steps"), _setting(point, "warmup_steps")
    if not 0 <= warmup < steps:
        errors.append(f"warmup_steps = {warmup!r}: must be >= 0 and less than steps ({steps}) so some steps are timed")
    link = point.get("link")
    if link in ("none", "off", False, "full speed"):
        link = None
    elif isinstance(link, str):
        link = {"bandwidth": link}
    if link is not None:
        if not isinstance(link, dict):
            errors.append(f"link = {link!r}: expected a table like {{ bandwidth = \"1Gbit\", latency = \"50us\" }} "
                          f"or \"none\"")
        else:
            try:
                network = Network.from_spec(link)
            except ValueError as e:
                errors.append(f"link: {e}")
            else:
                _check_link_ranges(link, network, errors)
    straggler = point.get("straggler")
    if straggler is not None:
        straggler = _check_straggler(straggler, errors)
    if point.get("target") is not None:
        point["target"] = _check_target(point, errors)
    if len(errors) > start:
        return None
    strategy = _setting(point, "strategy")
    params = dict(params_by_strategy.get(strategy, {})) if isinstance(params_by_strategy.get(strategy), dict) else {}
    try:
        strategies.make(strategy, **params)
    except (ValueError, TypeError) as e:
        errors.append(f"strategy_params.{strategy}: {e}")
        return None
    try:  # the run's compression and local-SGD settings, applied to this strategy
        wrappers = {k: point[k] for k in WRAPPER_SETTINGS if k in point}
        config = strategies.make(strategy, **{**wrappers, **params})
    except (ValueError, TypeError) as e:
        errors.append(f"strategy {strategy!r}: {e}")
        return None
    workers = _setting(point, "workers")
    try:
        world = config.world_size(workers)
    except ValueError as e:  # a setting that does not fit this many workers (colocated servers, backups)
        errors.append(f"strategy_params.{strategy}: {e}")
        return None
    if point.get("trace_steps") and world > MAX_TRACED_RANKS:
        errors.append(f"trace_steps = {point['trace_steps']} with {world:,} ranks: runs of at most "
                      f"{MAX_TRACED_RANKS} ranks are traced (the events table stays bounded); set trace_steps = 0")
    if world > MAX_RANKS:
        servers = f" + {world - workers} server(s)" if world > workers else ""
        errors.append(f"{strategy} with workers = {workers}{servers} needs {world:,} ranks: at most {MAX_RANKS:,}")
    elif _setting(point, "workload") in MODELS:
        try:  # a partition, chunk or pipeline setting that would cut the model's gradients into too many messages
            config.check_messages(workers, _param_count(_setting(point, "workload"), _setting(point, "num_classes"),
                                                        _setting(point, "image_size")))
        except ValueError as e:
            errors.append(f"strategy_params.{strategy}: {e}")
            return None
    knob = None
    if link and len(errors) == start and _setting(point, "workload") in MODELS:
        params, knob = _size_knob(strategy, params, wrappers, point, Network.from_spec(link))
    if link and link.get("ranks"):
        # a per-rank link applies to the runs that have that rank (a 1-worker baseline beside 4-worker runs keeps
        # the default link, and its label says so); a rank no run of the sweep has is refused by parse()
        ranks = {r: sub for r, sub in link["ranks"].items() if int(r) < world}
        if ranks_seen is not None:
            for r in link["ranks"]:
                ranks_seen.setdefault(int(r), []).append(int(r) < world)
        link = {**link, "ranks": ranks} if ranks else {k: v for k, v in link.items() if k != "ranks"}
    for rank in (straggler or {}).get("ranks", []):
        if rank >= workers:  # an empty straggler would record a balanced run as a straggler one
            errors.append(f"straggler.ranks = {straggler['ranks']!r}: workers = {workers} has worker ranks "
                          f"0..{workers - 1} only")
            break
    _check_compute(point, config, errors)
    if "failures" in point or "recovery" in point:
        point["failures"], point["recovery"] = fault_settings.check(point, config, workers, steps, errors)
    if len(errors) > start:
        return None
    if config.role == PARAMETERS or config.wraps_model:
        # neighbour averaging works on parameters, which exist only after the local step: it never overlaps;
        # DistributedDataParallel always does. One run each, whatever the grid says.
        point["overlap"] = config.wraps_model
    if link and link.get("emulation") == "python":  # the default: the same run id with or without it
        link = {k: v for k, v in link.items() if k != "emulation"}
    values = {k: v for k, v in point.items() if k in RUN_KEYS and k not in ("link", "straggler", "repeats")}
    if values.get("target") is None:
        values.pop("target", None)
    return RunSpec(sweep=name, link=link, straggler=straggler, strategy_params=params, knob_choice=knob, **values)


def _size_knob(strategy: str, params: dict, wrappers: dict, point: dict, network: Network) -> tuple[dict, dict | None]:
    """The run's strategy parameters with an unset size knob set to the value the model prices cheapest for its
    workers, servers, buckets and link (the default link of a heterogeneous one), and the KnobChoice record; the
    parameters unchanged and None when the strategy has no size knob or the model cannot price the run."""
    nodes = {"ranks_per_node": _setting(point, "ranks_per_node")} \
        if "ranks_per_node" in strategies.get(strategy).parameters() else {}
    sizes = param_sizes(_setting(point, "workload"), _setting(point, "num_classes"), _setting(point, "image_size"))
    buckets = [b.numel for b in make_buckets(sizes, _setting(point, "bucket_mb"))]
    fabric = Fabric(network.default.bandwidth, network.default.latency, _setting(point, "ranks_per_node"),
                    network.intra.bandwidth, network.intra.latency)
    choice = choose(strategy, params, _setting(point, "workers"), buckets, fabric, sum(sizes),
                    make=lambda **p: strategies.make(strategy, **{**wrappers, **nodes, **p}))
    if choice is None:
        return params, None
    return {**params, choice.knob: choice.value}, choice.record()


@functools.lru_cache(maxsize=64)
def _param_count(workload: str, num_classes: int, image_size: int) -> int:
    return param_count(workload, num_classes, image_size)


def _check_compute(point: dict, config, errors: list[str]) -> None:
    """compute, profile and bucket_mb: a mode that exists, a profile file that fits the run's model and batch."""
    compute = _setting(point, "compute")
    if compute not in COMPUTE_MODES:
        errors.append(f"compute = {compute!r}: accepted are {', '.join(COMPUTE_MODES)}")
        return
    path = point.get("profile")
    if path is None:
        return
    if compute != "profile":
        errors.append(f"profile = {path!r} with compute = {compute!r}: a profile is replayed only with "
                      f"compute = \"profile\" (accepted: set compute = \"profile\", or drop profile)")
        return
    try:
        profile = load_profile(path)
        profile.check_run(_setting(point, "workload"), _setting(point, "batch_size"), _setting(point, "image_size"),
                          _setting(point, "num_classes"), where=f"profile = {path!r}")
    except ProfileError as e:
        errors.append(str(e))


# The [simulate] table of `syncbench simulate` (experiments/simulate/): each key's type and range,
# checked before anything is simulated (docs/settings.md). A list is one more grid axis (keys
# but the compute timeline's), each value checked. inf oversubscription or a 1e300 s latency crashed SimGrid.
SIMULATE_TYPES = {"topology": str, "network_model": str, "nic": str, "hosts_per_leaf": int, "oversubscription": float,
                  "gpus_per_node": int, "intra_bandwidth": "bandwidth", "intra_latency": "latency", "profile": str,
                  "forward_s": float, "backward_s": float, "optimizer_s": float, "bucket_mb": float, "overlap": bool}
SIMULATE_RANGES: dict[str, Range] = {
    "simulate.hosts_per_leaf": Range(1, MAX_RANKS),
    "simulate.gpus_per_node": Range(1, 1_024),
    "simulate.oversubscription": Range(1, 1_024),  # 1 = full bisection bandwidth, 4 = 4:1
    "simulate.intra_bandwidth": RANGES["link.bandwidth"],
    "simulate.intra_latency": RANGES["link.latency"],
    "simulate.forward_s": Range(0, 86_400),
    "simulate.backward_s": Range(0, 86_400),
    "simulate.optimizer_s": Range(0, 86_400),
    "simulate.bucket_mb": RANGES["bucket_mb"],
}
_SIMULATE_SCALARS = ("profile", "forward_s", "backward_s", "optimizer_s")  # the compute timeline: one value each


def check_simulate(table, where: str) -> None:
    """Types (strict: the string "false" is not false) and ranges of a [simulate] table; SweepError listing every
    problem with its key, its value and what is accepted. Keys it does not know are left to the caller."""
    if not isinstance(table, dict):
        raise SweepError(f"{where}: simulate = {table!r}: expected a table ([simulate])")
    errors = []
    for key, typ in SIMULATE_TYPES.items():
        if key not in table:
            continue
        values = table[key]
        if isinstance(values, list) and key not in _SIMULATE_SCALARS:
            if not values:
                errors.append(f"simulate.{key} = []: expected a value or a non-empty list of values")
        else:
            values = [values]
        for value in values:
            if problem := _simulate_problem(key, typ, value):
                errors.append(problem)
    if errors:
        raise SweepError(_report(where, sorted(set(errors), key=errors.index)))


def _simulate_problem(key: str, typ, value) -> str | None:
    name = f"simulate.{key}"
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ in ("bandwidth", "latency"):
        parse = parse_bandwidth if typ == "bandwidth" else parse_latency
        if not isinstance(value, str) and not number:
            example = '"150Gbit"' if typ == "bandwidth" else '"2us"'
            return f"{name} = {value!r}: expected a {typ} like {example}"
        try:
            value = parse(value)
        except ValueError as e:
            return f"{name}: {e}"
        if SIMULATE_RANGES[name].problem(name, value):
            shown = f"{value:g} bytes/s" if typ == "bandwidth" else f"{value:g} s"
            return f"{name} = {shown}: accepted are {SIMULATE_RANGES[name].describe()}"
        return None
    ok = number if typ is float else isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
    if not ok:
        expected = {float: "a number", bool: "true or false (not a string)"}.get(typ, typ.__name__)
        return f"{name} = {value!r}: expected {expected}"
    if name in SIMULATE_RANGES:
        return SIMULATE_RANGES[name].problem(name, value)
    return None


def _check_target(point: dict, errors: list[str]) -> dict | None:
    """target = { metric = "accuracy", value = 0.95 } (or a loss): a metric, a reachable value, held-out data to
    evaluate on and a model that trains (compute = "real")."""
    value = point["target"]
    if not isinstance(value, dict) or set(value) != {"metric", "value"} or value["metric"] not in TARGET_METRICS:
        errors.append(f"target = {value!r}: expected {{ metric = \"accuracy\", value = 0.95 }} or {{ metric = "
                      f"\"loss\", value = 0.3 }} (metrics: {', '.join(TARGET_METRICS)})")
        return None
    number = value["value"]
    high = 1.0 if value["metric"] == "accuracy" else 1e6
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 < number <= high:
        errors.append(f"target.value = {number!r}: accepted for {value['metric']} are numbers > 0 and <= {high:g}")
        return None
    if _setting(point, "dataset") != "digits":
        errors.append(f"target with dataset = {point.get('dataset', 'synthetic')!r}: a target is evaluated on held-out "
                      f"data (accepted: dataset = \"digits\")")
    if _setting(point, "compute") != "real":
        errors.append(f"target with compute = {point.get('compute')!r}: a replayed profile does not train "
                      f"(accepted: compute = \"real\"; or [grid] compute = [\"real\", \"profile\"]: the profile "
                      f"runs become the real ones' twins, without a target, and give the seconds per step)")
    return {"metric": value["metric"], "value": float(number)}


def _crosses_compute(grid: dict) -> bool:
    """[grid] compute = ["real", "profile"]: every profile point is the twin of the real point with the same other
    settings (reports/tta.py). A [defaults] target then applies to the real runs only (a replayed profile does not
    train; the twin gives the seconds per step) and a [defaults] profile to the profile runs only. Set per point (in
    [grid]), a target on a profile run or a profile on a real run is still refused."""
    compute = grid.get("compute")
    return isinstance(compute, list) and "real" in compute and "profile" in compute


def _check_straggler(value, errors: list[str]) -> dict | None:
    if not isinstance(value, dict) or set(value) - {"ranks", "slowdown"} or "ranks" not in value:
        errors.append(f"straggler = {value!r}: expected {{ ranks = [1], slowdown = 2.0 }}")
        return None
    ranks, slowdown = value["ranks"], value.get("slowdown", 2.0)
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and not isinstance(r, bool)
                                                           and r >= 0 for r in ranks):
        errors.append(f"straggler.ranks = {ranks!r}: expected a non-empty list of worker ranks (integers >= 0)")
        return None
    if not isinstance(slowdown, (int, float)) or isinstance(slowdown, bool):
        errors.append(f"straggler.slowdown = {slowdown!r}: expected a number (2.0 = compute takes twice as long)")
        return None
    if problem := RANGES["straggler.slowdown"].problem("straggler.slowdown", slowdown):
        errors.append(problem + " (2.0 = compute takes twice as long)")
        return None
    return {"ranks": ranks, "slowdown": float(slowdown)}


def _check_link_ranges(link: dict, network: Network, errors: list[str]) -> None:
    """Bandwidth and latency of the default link and of every per-rank override, against RANGES."""
    links = [("link", network.default)] + [(f"link.ranks.{rank}", one) for rank, one in network.overrides]
    for where, one in links:
        for name, value, shown in (("bandwidth", one.bandwidth, f"{one.bandwidth:g} bytes/s"),
                                   ("latency", one.latency, f"{one.latency:g} s")):
            if RANGES[f"link.{name}"].problem(name, value):
                errors.append(f"{where}.{name} = {shown}: accepted are {RANGES[f'link.{name}'].describe()}")
    # the link inside a node: the NIC's ranges (a 1 bit/s or 2 s intra-node link sat silent past the timeout)
    for name, value, unit in (("bandwidth", network.intra.bandwidth, "bytes/s"),
                              ("latency", network.intra.latency, "s")):
        if f"intra_{name}" in link and RANGES[f"link.{name}"].problem(name, value):
            errors.append(f"link.intra_{name} = {value:g} {unit}: accepted are {RANGES[f'link.{name}'].describe()}")
