"""One table of sweep settings: each setting's name, type, range, unit and meaning, defined once.

The sweep's type checks, range checks and their error messages derive from SETTINGS; a setting's default is its
RunSpec field (experiments/config/run.py); docs/settings.md lists the ranges (a test checks it against RANGES).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class SweepError(ValueError):
    """A sweep file that cannot run; the message lists every problem found."""


def report(where: str, errors: list[str]) -> str:
    """Every problem of a file, one line each, under its name."""
    return f"{where}: {len(errors)} problem(s):\n" + "\n".join(f"  - {e}" for e in errors)


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


def is_number(value) -> bool:
    """An int or a float, not a bool (TOML's true is not 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_int(value) -> bool:
    """An int, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def type_problem(key: str, typ: type, value) -> str | None:
    """`key = value: expected ...` when value is not of typ (strict: a bool is not an int, a string not a bool;
    an int is a float), else None."""
    ok = is_number(value) if typ is float else isinstance(value, typ) and (typ is bool or not isinstance(value, bool))
    if ok:
        return None
    expected = {float: "a number", bool: "true or false"}.get(typ, typ.__name__)
    return f"{key} = {value!r}: expected {expected}"


@dataclass(frozen=True)
class Setting:
    """One sweep setting. A dotted name (link.bandwidth) is a key inside a table setting (link = { ... }), checked
    by that table's own parse; type None: a value parsed from text (a bandwidth, a latency)."""

    name: str
    type: type | None  # int, float, bool or str
    meaning: str
    range: Range | None = None
    unit: str = ""

    def problem(self, value) -> str | None:
        """The type's error, else the range's, else None."""
        if self.type is not None and (problem := type_problem(self.name, self.type, value)):
            return problem
        return self.range.problem(self.name, value) if self.range else None


MAX_TRACE_STEPS = 16  # traced steps per run: each records every rank's phases and messages (bounded events table)
MAX_TRACED_RANKS = 64  # ranks of a traced run (workers + servers); larger runs trace nothing unless refused
DEFAULT_TRACE_STEPS = 3  # trace_steps not given: this many, in runs of at most MAX_TRACED_RANKS ranks (else none)
MAX_RANKS = 16_384  # workers + servers of one run

# Every typed sweep setting (docs/settings.md), in the order problems are reported. A new setting gets a row here
# and a RunSpec field (its default); a numeric one needs a range (tests/experiments/test_hostile_input.py).
SETTINGS: tuple[Setting, ...] = (
    Setting("workload", str, "the model every rank trains (workloads/models.py)"),
    Setting("dataset", str, "the data it trains on: synthetic, or digits (held-out data for a target)"),
    Setting("device", str, "where a rank computes: cpu or cuda"),
    Setting("strategy", str, "the gradient-sync strategy (strategies/)"),
    Setting("image_size", int, "input images are image_size x image_size", Range(8, 1024), "pixels"),
    Setting("num_classes", int, "classes of the model's output", Range(2, 100_000)),
    Setting("batch_size", int, "samples per worker per step", Range(1, 65_536), "samples"),
    Setting("steps", int, "steps of a run, warm-up included", Range(1, 1_000_000), "steps"),
    # and fewer than steps, so some steps are timed
    Setting("warmup_steps", int, "first steps left out of the timings", Range(0, 999_999), "steps"),
    Setting("seed", int, "the run's random seed (repeat r takes seed + r)", Range(0, 2**31 - 1)),
    # SimGrid simulates thousands; real runs are bounded by the machine (limits.py)
    Setting("workers", int, "data-parallel ranks that train", Range(1, 16_384), "ranks"),
    Setting("lr", float, "the optimizer's learning rate", Range(0, 100, low_open=True)),
    Setting("momentum", float, "SGD momentum", Range(0, 1, high_open=True)),
    Setting("weight_decay", float, "SGD weight decay", Range(0, 1)),
    Setting("timeout", float, "every wait of a run (and a whole thread-rank run)", Range(1, 86_400), "s"),
    Setting("link.bandwidth", None, "the emulated NIC's bandwidth",
            Range(125e3, 12.5e12, text="1Mbit to 100Tbit (125KB/s to 12.5TB/s)"), "bytes/s"),
    Setting("link.latency", None, "the emulated link's one-way latency", Range(0, 1, text="0s to 1s"), "s"),
    Setting("straggler.slowdown", float, "a straggler's compute takes this many times as long", Range(1, 100)),
    Setting("failures.seed", int, "the seed of failures drawn from an mtbf",
            Range(0, 2**31 - 1, text="whole numbers 0 to 2,147,483,647")),
    Setting("bucket_mb", float, "gradient bucket size (DDP's bucket_cap_mb); unset: one flat bucket",
            Range(0, 1_000_000, low_open=True), "MiB"),
    Setting("overlap", bool, "sync each bucket from a communication thread as soon as its gradients are ready"),
    Setting("compute", str, "real: the model computes; profile: a measured timeline is replayed"),
    Setting("profile", str, "compute = profile: a profile JSON file; unset: measured at the run's start"),
    Setting("p2p", str, "what carries the messages (sockets, gloo)"),
    # compression and local SGD (strategies/compression.py, strategies/local_sgd.py)
    Setting("compression", str, "gradient compression (strategies/compression.py)"),
    Setting("powersgd_rank", int, "PowerSGD's rank", Range(1, 1024)),
    Setting("powersgd_start", int, "steps before PowerSGD compresses", Range(0, 1_000_000), "steps"),
    Setting("powersgd_warm_start", bool, "PowerSGD reuses its last Q"),
    Setting("topk_ratio", float, "the share of gradient entries top-k keeps", Range(0, 1, low_open=True)),
    Setting("error_feedback", bool, "compression adds back what it dropped the step before"),
    Setting("sync_every", int, "local SGD: average parameters every sync_every steps", Range(1, 1_000_000), "steps"),
    Setting("outer_optimizer", str, "local SGD's outer optimizer (none, or DiLoCo's nesterov)"),
    Setting("outer_lr", float, "the outer optimizer's learning rate", Range(0, 100, low_open=True)),
    Setting("outer_momentum", float, "the outer optimizer's momentum", Range(0, 1, high_open=True)),
    Setting("eval_every", int, "steps between held-out evaluations (a run with a target)", Range(1, 1_000_000),
            "steps"),
    Setting("ranks_per_node", int, "ranks sharing one node's NIC", Range(1, 1024), "ranks"),
    Setting("repeats", int, "each run repeated with seeds seed, seed + 1, ...", Range(1, 1000), "runs"),
    Setting("trace_steps", int, "steps after warm-up whose events are recorded (0: none)",
            Range(0, MAX_TRACE_STEPS), "steps"),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
RANGES: dict[str, Range] = {s.name: s.range for s in SETTINGS if s.range is not None}
TYPES: dict[str, type] = {s.name: s.type for s in SETTINGS if s.type is not None and "." not in s.name}
