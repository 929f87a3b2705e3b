"""Size knobs priced by the model: the values tried for a strategy's size knob, the cheapest of a set of settings,
and the value a run takes when it leaves the knob unset.

A size knob cuts a sync into messages: the parameter server's `partition_mb`, hierarchical's `pipeline_mb`, the
double binary tree's `chunks`. `syncbench map` tries these values per cell (reports/strategy_map.py) and a sweep's
run that does not set the knob takes the one the model prices cheapest for its workers, servers, buckets and link
(experiments/config/sweep.py); a run that sets it records how much slower than the best its setting is in the
model, so the report can say so. Every price is strategies.cost.sync_seconds.

Units: bytes and seconds; MiB = 2^20 bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import strategies as registry
from strategies.cost import Fabric, sync_seconds

PARTITIONS_MB = (1.0, 4.0, 16.0)
CHUNKS = (1, 2, 4, 8, 16, 32)
PIPELINE_MB = (0.125, 0.5, 2.0, 8.0, math.inf)
# the size knob of each strategy that has one, and the values tried for it
SIZE_KNOBS = {"parameter_server": ("partition_mb", PARTITIONS_MB),
              "hierarchical": ("pipeline_mb", PIPELINE_MB),
              "double_binary_tree": ("chunks", CHUNKS)}
# an explicit setting this much slower in the model than the knob's best value is reported
SLOWER_NOTED = 0.10


def cheapest(candidates: Iterable, price: Callable) -> tuple[object, float, str]:
    """(the cheapest candidate, its price, '') over candidates that price; a candidate whose price raises
    ValueError / NotImplementedError cannot run and is skipped. Ties keep the first tried. (None, nan, why the
    first failed) when none prices."""
    best, best_s, why = None, math.nan, ""
    for c in candidates:
        try:
            seconds = price(c)
        except (ValueError, NotImplementedError) as e:
            why = why or str(e)
            continue
        if best is None or seconds < best_s:
            best, best_s = c, seconds
    return best, best_s, ("" if best is not None else why)


def buckets_seconds(config, workers: int, bucket_numels, fabric: Fabric) -> float:
    """One step's communication in the model: each bucket synced one after another (sync_seconds each)."""
    return sum(sync_seconds(config, workers, numel, fabric) for numel in bucket_numels)


@dataclass(frozen=True)
class KnobChoice:
    """What the model says of a run's size knob: its name, the value the run uses, whether the model chose it (the
    run left it unset), the model's best value and the run's value's price over the best's (1.0 at the best)."""

    knob: str
    value: float
    chosen: bool
    best: float
    slowdown: float

    def record(self) -> dict:
        return {"knob": self.knob, "value": self.value, "chosen": self.chosen, "best": self.best,
                "slowdown": self.slowdown}


def choose(strategy: str, params: dict, workers: int, bucket_numels, fabric: Fabric, total_numel: int,
           make: Callable | None = None) -> KnobChoice | None:
    """The size knob of `strategy` priced at its declared default and every value of SIZE_KNOBS that the run
    accepts (a value its check_messages refuses for this model, or its check_workers for this n, is not a
    candidate): set in `params`, the run's value against the best; unset, the best becomes the run's value. The
    declared default is tried first, so a tie keeps it (a tiny model's one partition per server is the same sync at
    every partition size). `make(**params)` builds the strategy (default: the registry's, no wrappers). None: no
    size knob, or the model cannot price this run."""
    if strategy not in SIZE_KNOBS:
        return None
    knob, tried = SIZE_KNOBS[strategy]
    default = getattr(registry.get(strategy), knob)
    values = (default, *(v for v in tried if v != default))
    make = make or (lambda **p: registry.make(strategy, **p))

    def price(value):
        config = make(**{**params, knob: value})
        if hasattr(config, "check_workers"):
            config.check_workers(workers)
        config.check_messages(workers, total_numel)
        return buckets_seconds(config, workers, bucket_numels, fabric)

    best, best_s, _ = cheapest(values, price)
    if best is None:
        return None
    if knob not in params:
        return KnobChoice(knob, best, True, best, 1.0)
    try:
        given_s = price(params[knob])
    except (ValueError, NotImplementedError):
        return None
    # a value the candidates do not include may beat them all: then it is the best
    if given_s <= best_s:
        return KnobChoice(knob, params[knob], False, params[knob], 1.0)
    return KnobChoice(knob, params[knob], False, best, given_s / best_s if best_s > 0 else math.inf)
