"""One table of sweep settings: each setting's name, type, range, unit, default and meaning, defined once.

Everything else derives from SETTINGS: the RunSpec's fields and defaults and which settings the run id leaves out
(experiments/config/run.py), the sweep's keys, type checks, range checks and their error messages, the tables of
docs/settings.md (experiments/config/settings_doc.py; a test fails when the committed page is out of date) and
`syncbench schema --settings`.
"""

from __future__ import annotations

import enum
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


class Omit(enum.Enum):
    """The marks of Setting.omitted_at (a value no setting takes)."""

    NEVER = "always in the run id"
    AT_DEFAULT = "left out of the run id at its default"


NEVER, AT_DEFAULT = Omit.NEVER, Omit.AT_DEFAULT


@dataclass(frozen=True)
class Setting:
    """One sweep setting. A dotted name (link.bandwidth) is a key inside a table setting (link = { ... }), checked
    by that table's own parse; type dict: a table setting (link, straggler, ...), parsed by its own check; type
    None: a value parsed from text (a bandwidth, a latency). Every undotted row but `repeats` is a RunSpec field
    (experiments/config/run.py) of this type with this default."""

    name: str
    type: type | None  # int, float, bool, str, or dict (a table)
    meaning: str
    range: Range | None = None
    unit: str = ""
    default: object = None  # the value of a run that does not set it (None: unset)
    # A setting added after results existed is left out of the run id at this value, so earlier results keep their
    # ids and resume: AT_DEFAULT (its default), NEVER (always in the id), or a value of its own (p2p: "gloo", the
    # transport of every run before the sockets became the default)
    omitted_at: object = NEVER

    @property
    def run_field(self) -> bool:
        """A field of every run (RunSpec); False for a key inside a table and for `repeats` (it makes runs)."""
        return "." not in self.name and self.name != "repeats"

    @property
    def annotation(self):
        """The RunSpec field's type: the row's, optional when the default is unset."""
        return self.type if self.default is not None else self.type | None

    def id_omitted(self) -> object:
        """The value at which the run id leaves the setting out (NEVER: it never does)."""
        return self.default if self.omitted_at is AT_DEFAULT else self.omitted_at

    def problem(self, value) -> str | None:
        """The type's error, else the range's, else None (a table's keys are checked by its own parse)."""
        if self.type not in (None, dict) and (problem := type_problem(self.name, self.type, value)):
            return problem
        return self.range.problem(self.name, value) if self.range else None


MAX_TRACE_STEPS = 16  # traced steps per run: each records every rank's phases and messages (bounded events table)
MAX_TRACED_RANKS = 64  # ranks of a traced run (workers + servers); larger runs trace nothing unless refused
DEFAULT_TRACE_STEPS = 3  # trace_steps not given: this many, in runs of at most MAX_TRACED_RANKS ranks (else none)
MAX_RANKS = 16_384  # workers + servers of one run

# Every sweep setting, in the order of the RunSpec's fields and of the problems reported. A new setting is a row
# here and the code that uses it: its RunSpec field, the sweep's checks and messages, docs/settings.md's table
# (python -m experiments.config.settings_doc --write docs/settings.md) and `syncbench schema --settings` derive
# from the row. A numeric one needs a range; one added after results existed, omitted_at=AT_DEFAULT.
SETTINGS: tuple[Setting, ...] = (
    Setting("workload", str, "the model every rank trains (workloads/models.py)", default="resnet18"),
    Setting("dataset", str, "the data it trains on: synthetic, or digits (held-out data for a target)",
            default="synthetic"),
    Setting("image_size", int, "input images are image_size x image_size", Range(8, 1024), "pixels", default=32),
    Setting("num_classes", int, "classes of the model's output", Range(2, 100_000), default=10),
    Setting("batch_size", int, "samples per worker per step", Range(1, 65_536), "samples", default=32),
    Setting("steps", int, "steps of a run, warm-up included", Range(1, 1_000_000), "steps", default=20),
    # and fewer than steps, so some steps are timed
    Setting("warmup_steps", int, "first steps left out of the timings", Range(0, 999_999), "steps", default=3),
    Setting("device", str, "where a rank computes: cpu or cuda", default="cpu"),
    Setting("seed", int, "the run's random seed (repeat r takes seed + r)", Range(0, 2**31 - 1), default=0),
    Setting("lr", float, "the optimizer's learning rate", Range(0, 100, low_open=True), default=0.05),
    Setting("momentum", float, "SGD momentum", Range(0, 1, high_open=True), default=0.9),
    Setting("weight_decay", float, "SGD weight decay", Range(0, 1), default=0.0),
    Setting("strategy", str, "the gradient-sync strategy (strategies/)", default="ring"),
    # SimGrid simulates thousands; real runs are bounded by the machine (limits.py)
    Setting("workers", int, "data-parallel ranks that train", Range(1, 16_384), "ranks", default=1),
    Setting("link", dict, "the emulated network: a bandwidth (\"1Gbit\") or a table { bandwidth, latency, "
            "intra_bandwidth, intra_latency, emulation, ranks }; unset: full speed"),
    Setting("link.bandwidth", None, "the emulated NIC's bandwidth",
            Range(125e3, 12.5e12, text="1Mbit to 100Tbit (125KB/s to 12.5TB/s)"), "bytes/s"),
    Setting("link.latency", None, "the emulated link's one-way latency", Range(0, 1, text="0s to 1s"), "s"),
    Setting("straggler", dict, "slowed workers: { ranks = [1], slowdown = 2.0 }"),
    Setting("straggler.slowdown", float, "a straggler's compute takes this many times as long", Range(1, 100),
            default=2.0),
    # failure injection and recovery (experiments/config/faults.py: their forms; strategies/faults.py: the modes)
    Setting("failures", dict, "ranks that fail: { schedule = [{ rank, step }] } or { mtbf = \"7.9h\", seed }",
            omitted_at=AT_DEFAULT),
    Setting("failures.seed", int, "the seed of failures drawn from an mtbf",
            Range(0, 2**31 - 1, text="whole numbers 0 to 2,147,483,647")),
    Setting("recovery", dict, "how a run recovers from failures: { mode = ... }, one of none, checkpoint_restart, "
                              "elastic, ps_shrink, reweight, survivors (each family's own) (docs/faults.md)",
            omitted_at=AT_DEFAULT),
    Setting("timeout", float, "every wait of a run (and a whole thread-rank run)", Range(1, 86_400), "s",
            default=120.0),
    Setting("bucket_mb", float, "gradient bucket size (DDP's bucket_cap_mb); unset: one flat bucket",
            Range(0, 1_000_000, low_open=True), "MiB", omitted_at=AT_DEFAULT),
    Setting("overlap", bool, "sync each bucket from a communication thread as soon as its gradients are ready",
            default=False, omitted_at=AT_DEFAULT),
    Setting("compute", str, "real: the model computes; profile: a measured timeline is replayed", default="real",
            omitted_at=AT_DEFAULT),
    Setting("profile", str, "compute = profile: a profile JSON file; unset: measured at the run's start",
            omitted_at=AT_DEFAULT),
    Setting("p2p", str, "what carries the messages (sockets, gloo); unset: sockets for host tensors, gloo (NCCL) "
            "for GPU ones", default="sockets", omitted_at="gloo"),
    # compression and local SGD (strategies/compression.py, strategies/local_sgd.py)
    Setting("compression", str, "gradient compression: none, fp16, bf16, powersgd or topk", default="none",
            omitted_at=AT_DEFAULT),
    Setting("powersgd_rank", int, "PowerSGD's rank", Range(1, 1024), default=1, omitted_at=AT_DEFAULT),
    Setting("powersgd_start", int, "steps before PowerSGD compresses", Range(0, 1_000_000), "steps", default=10,
            omitted_at=AT_DEFAULT),
    Setting("powersgd_warm_start", bool, "PowerSGD reuses its last Q", default=True, omitted_at=AT_DEFAULT),
    Setting("topk_ratio", float, "the share of gradient entries top-k keeps", Range(0, 1, low_open=True),
            default=0.01, omitted_at=AT_DEFAULT),
    Setting("error_feedback", bool, "compression adds back what it dropped the step before", default=True,
            omitted_at=AT_DEFAULT),
    Setting("sync_every", int, "local SGD: average parameters every sync_every steps", Range(1, 1_000_000), "steps",
            default=1, omitted_at=AT_DEFAULT),
    Setting("outer_optimizer", str, "local SGD's outer optimizer (none, or DiLoCo's nesterov)", default="none",
            omitted_at=AT_DEFAULT),
    Setting("outer_lr", float, "the outer optimizer's learning rate", Range(0, 100, low_open=True), default=0.7,
            omitted_at=AT_DEFAULT),
    Setting("outer_momentum", float, "the outer optimizer's momentum", Range(0, 1, high_open=True), default=0.9,
            omitted_at=AT_DEFAULT),
    # time to target: evaluated on held-out data every eval_every steps (and after the last), outside the timed part
    Setting("target", dict, "a run's target: { metric = \"accuracy\", value = 0.95 } or { metric = \"loss\", "
            "value = 0.3 }", omitted_at=AT_DEFAULT),
    Setting("eval_every", int, "steps between held-out evaluations (a run with a target)", Range(1, 1_000_000),
            "steps", default=10, omitted_at=AT_DEFAULT),
    # node-aware strategies (hierarchical) group by it; inside a node ranks talk over link.intra_*
    Setting("ranks_per_node", int, "ranks sharing one node's NIC", Range(1, 1024), "ranks", default=1,
            omitted_at=AT_DEFAULT),
    Setting("repeats", int, "each run repeated with seeds seed, seed + 1, ...", Range(1, 1000), "runs", default=1),
    Setting("trace_steps", int, f"steps after warm-up whose events are recorded (0: none); unset: "
            f"{DEFAULT_TRACE_STEPS} in runs of at most {MAX_TRACED_RANKS} ranks, none in larger ones",
            Range(0, MAX_TRACE_STEPS), "steps", omitted_at=AT_DEFAULT),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
RANGES: dict[str, Range] = {s.name: s.range for s in SETTINGS if s.range is not None}
# the types the sweep checks itself (a table setting is checked by its own parse)
TYPES: dict[str, type] = {s.name: s.type for s in SETTINGS if s.type not in (None, dict) and "." not in s.name}
