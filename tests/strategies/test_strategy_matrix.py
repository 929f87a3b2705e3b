"""Every registered strategy x world size x size x op: results against a numpy reference, bytes against
the strategy's analytic traffic. A newly registered strategy is picked up with no edits here.

One test per (strategy settings, world size); the sizes and ops loop inside it and every assertion names
its case, so a failure says exactly which one broke.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import strategies
from strategies.ops import ACCEPTED, reference
from strategies.testing import (
    NUMELS,
    WORLD_SIZES,
    check_identical,
    check_strategy,
    check_traffic,
    make_inputs,
    run_collective,
)

IDENTITY_DTYPES = (np.float16, np.float32, np.float64, np.int8, np.uint32, np.bool_)


def settings():
    """Every registered strategy with each of the variants it declares (StrategyConfig.variants)."""
    return strategies.registry.settings()


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


@pytest.mark.parametrize("name,params", list(settings()), ids=[label(*s) for s in settings()])
def test_every_rank_bitwise_identical(name, params):
    """Every strategy that declares `identical` (every exact one must) gives every rank the same bits, for
    every op it supports and every dtype that op accepts (naive_ring included: it reduces in rank order)."""
    config = strategies.make(name, **params)
    if not config.identical:
        pytest.skip(f"{name} is a neighbour average: ranks are meant to differ")
    for workers, op in itertools.product((3, 5, 8), config.ops):
        for dtype in IDENTITY_DTYPES:
            if op not in ACCEPTED[torch.from_numpy(np.zeros(1, dtype)).dtype]:
                continue
            case = f"{label(name, params)} workers={workers} op={op} dtype={np.dtype(dtype)}"
            inputs = make_inputs(workers, 4099, op, dtype)
            outputs, _ = run_collective(name, inputs, op=op, timeout=20, **params)
            check_identical(outputs, case)
