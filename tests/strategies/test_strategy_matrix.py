"""Every registered strategy x world size x size x op: results against a numpy reference, bytes against
the strategy's analytic traffic. A newly registered strategy is picked up with no edits here.

One test per (strategy settings, world size); the sizes and ops loop inside it on one group of thread ranks
(strategies.testing.check_strategy) and the failure names every case that broke.

Within one strategy the ops differ only inside strategies.ops (reduce_into, finish_reduction, prescale,
wire_form): every op runs at every world size on an awkward small size and the largest one; every size runs with
one op of each kind (float sum: order-dependent; mean: the division each strategy places; max: exact; bxor: the
int32 path).
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
    default_dtype,
    make_inputs,
    run_collective,
)

IDENTITY_DTYPES = (np.float16, np.float32, np.float64, np.int8, np.uint32, np.bool_)
EVERY_SIZE_OPS = ("sum", "mean", "max", "bxor")
EVERY_OP_NUMELS = (7, 4099)  # 7: fewer elements than 8 ranks, a multiple of none of 2-5; 4099: prime, the largest
assert set(EVERY_OP_NUMELS) <= set(NUMELS) and 4099 in EVERY_OP_NUMELS and {3, 5, 8} <= set(WORLD_SIZES)
# an identity case whose analytic messages per rank exceed this at 4099 elements (the partitioned parameter
# server's 100-byte partitions: 4,424 at 8 ranks in float64; no other strategy sends over 32) runs at the largest
# of IDENTITY_NUMELS under it
IDENTITY_NUMELS = (4099, 1031, 257)  # primes: no partition or chunk divides them
MAX_IDENTITY_MESSAGES = 150
MAX_MATRIX_MESSAGES = 600
# integer identity cases: wrapping arithmetic, a comparison (unsigned ones travel sign-flipped), bitwise, logical
INTEGER_IDENTITY_OPS = ("sum", "max", "bxor", "lor")


def settings():
    """Every registered strategy with each of the variants it declares (StrategyConfig.variants)."""
    return strategies.registry.settings()


def label(name, params):
    return name + "".join(f"[{k}={v}]" for k, v in params.items())


@pytest.mark.parametrize("workers", WORLD_SIZES)
@pytest.mark.parametrize("name,params", list(settings()), ids=[label(*s) for s in settings()])
def test_results_and_traffic(name, params, workers):
    config = strategies.make(name, **params)
    every_size = [op for op in config.ops if op in EVERY_SIZE_OPS] or list(config.ops[:1])
    rest = [op for op in config.ops if op not in every_size]
    numels, every_op_numels = (proportionate(config, workers, n) for n in (NUMELS, EVERY_OP_NUMELS))
    cases = check_strategy(name, world_sizes=(workers,), numels=numels, ops=every_size, **params)
    if rest:
        cases += check_strategy(name, world_sizes=(workers,), numels=every_op_numels, ops=rest, **params)
    assert cases == len(NUMELS) * len(every_size) + len(EVERY_OP_NUMELS) * len(rest)


def proportionate(config, workers: int, numels: tuple[int, ...]) -> tuple[int, ...]:
    """`numels`, with 4099 run at 1031 where some rank would exchange over MAX_MATRIX_MESSAGES messages in float32:
    only a parameter server cut into 100-byte partitions (2,212 at 8 ranks); 1031 is prime, so its 40 partitions
    still do not divide it, and 1000 keeps its own case."""
    def messages(numel):
        return max(r.msgs_sent + r.msgs_recv for r in config.traffic(workers, numel, 4).ranks)

    return tuple(1031 if n == 4099 and messages(n) > MAX_MATRIX_MESSAGES else n for n in numels)


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


def identity_numel(config, workers: int, itemsize: int) -> int:
    """4099 elements, or fewer (still prime) where the strategy would cut them into thousands of tiny messages."""
    for numel in IDENTITY_NUMELS:
        if max(r.msgs_sent + r.msgs_recv for r in config.traffic(workers, numel, itemsize).ranks) \
                <= MAX_IDENTITY_MESSAGES:
            return numel
    return IDENTITY_NUMELS[-1]


@pytest.mark.parametrize("name,params", list(settings()), ids=[label(*s) for s in settings()])
def test_every_rank_bitwise_identical(name, params):
    """Every strategy that declares `identical` (every exact one must) gives every rank the same bits, for
    every op it supports and every dtype that op accepts (naive_ring included: it reduces in rank order).
    float32 for an exact strategy is test_results_and_traffic's own case (the same inputs, every op at 4099 on
    3, 5 and 8 ranks, check_identical), so it runs there only. Integers and bools reduce exactly in any order, so
    ranks can differ only through the strategy's data movement, which no op changes (ops act inside
    strategies.ops): they run one op of each kind, INTEGER_IDENTITY_OPS; the floats every op."""
    config = strategies.make(name, **params)
    if not config.identical:
        pytest.skip(f"{name} is a neighbour average: ranks are meant to differ")
    failures = []
    for workers, op in itertools.product((3, 5, 8), config.ops):
        for dtype in IDENTITY_DTYPES:
            if op not in ACCEPTED[torch.from_numpy(np.zeros(1, dtype)).dtype]:
                continue
            if config.exact and np.dtype(dtype) == default_dtype(op):
                continue  # the matrix's own case: float32 is its arithmetic ops' dtype
            if np.dtype(dtype).kind in "iub" and op not in INTEGER_IDENTITY_OPS:
                continue  # order-independent: the same data movement as the kind's representative op
            numel = identity_numel(config, workers, np.dtype(dtype).itemsize)
            case = f"{label(name, params)} workers={workers} op={op} dtype={np.dtype(dtype)} numel={numel}"
            inputs = make_inputs(workers, numel, op, dtype)
            outputs, _ = run_collective(name, inputs, op=op, timeout=20, **params)
            try:
                check_identical(outputs, case)
            except AssertionError as e:
                failures.append(str(e))
    assert not failures, f"{len(failures)} case(s) not bitwise identical:\n" + "\n".join(failures)
