"""Every registered strategy x world size x size x op: results against a numpy reference, bytes against
the strategy's analytic traffic. A newly registered strategy is picked up with no edits here.

One test per (strategy settings, world size); the sizes and ops loop inside it and every assertion names
its case, so a failure says exactly which one broke.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import strategies
from strategies.ops import reference
from strategies.testing import NUMELS, WORLD_SIZES, check_strategy, check_traffic, make_inputs, run_collective

# Extra settings to cover for the built-ins that have parameters; any other strategy runs with its defaults.
VARIANTS = {
    "parameter_server": [{"servers": k} for k in (1, 2, 3)],
    "reduce_broadcast": [{"tree": True}, {"tree": False}],
    "decentralized": [{"topology": t, "weights": w}
                      for t in ("ring", "torus", "exponential", "complete", "one_peer_exponential")
                      for w in ("uniform", "metropolis")],
}


def settings():
    for name in strategies.names():
        for params in VARIANTS.get(name, [{}]):
            yield name, params


def label(name, params):
    return name + "".join(f"[{k}={v}]" for k, v in params.items())


@pytest.mark.parametrize("workers", WORLD_SIZES)
@pytest.mark.parametrize("name,params", list(settings()), ids=[label(*s) for s in settings()])
def test_results_and_traffic(name, params, workers):
    cases = check_strategy(name, world_sizes=(workers,), **params)
    assert cases == len(NUMELS) * len(strategies.make(name, **params).ops)


@pytest.mark.parametrize("name,params", list(settings()), ids=[label(*s) for s in settings()])
def test_int64(name, params):
    """Integer arrays reduce exactly with sum, min and max (and prod where it cannot overflow)."""
    config = strategies.make(name, **params)
    for workers, numel, op in itertools.product((2, 3, 5, 8), (1, 7, 1000), ("sum", "min", "max", "prod")):
        if op not in config.ops or not config.exact:
            continue
        case = f"{label(name, params)} int64 workers={workers} numel={numel} op={op}"
        inputs = make_inputs(workers, numel, op, np.int64)
        if op == "prod":
            inputs = [np.clip(a, -3, 3) for a in inputs]
        outputs, traffic = run_collective(name, inputs, op=op, timeout=20, **params)
        for rank, got in enumerate(outputs):
            assert got.dtype == np.int64, f"{case}: rank {rank} dtype {got.dtype}"
            np.testing.assert_array_equal(got, reference(inputs, op), err_msg=f"{case}: rank {rank}")
        check_traffic(config, workers, numel, 8, traffic, case)


@pytest.mark.parametrize("name", ["ring", "all_to_all", "reduce_broadcast", "halving_doubling",
                                  "parameter_server", "native"])
def test_every_rank_bitwise_identical(name):
    """Strategies that reduce each element once (or in one fixed order) give every rank the same bits."""
    for workers, op in itertools.product((3, 5, 8), ("sum", "mean")):
        inputs = make_inputs(workers, 4099, op)
        outputs, _ = run_collective(name, inputs, op=op, timeout=20)
        for rank, got in enumerate(outputs):
            assert np.array_equal(got, outputs[0]), f"{name} workers={workers} op={op}: rank {rank} differs"
