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
from strategies.testing import run_collective

WORLD_SIZES = (1, 2, 3, 4, 5, 7, 8)
NUMELS = (0, 1, 3, 7, 1000, 4099)

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


def make_inputs(workers, numel, op, dtype=np.float32):
    """Rank-dependent inputs; values near 1 for prod so that it neither overflows nor underflows."""
    out = []
    for rank in range(workers):
        rng = np.random.default_rng([workers, numel, rank])
        if np.issubdtype(dtype, np.integer):
            out.append(rng.integers(-50, 50, numel).astype(dtype) + rank)
        elif op == "prod":
            out.append(rng.uniform(0.9, 1.1, numel).astype(dtype))
        else:
            out.append((rng.standard_normal(numel) + rank).astype(dtype))
    return out


def expected(config, inputs, op):
    """The exact allreduce for exact strategies; W @ X for a neighbour-averaging one."""
    if config.exact:
        ref = reference(inputs, op)
        return [ref] * len(inputs)
    w = config.mixing_matrix(len(inputs))
    x = np.stack([a.astype(np.float64) for a in inputs])
    return list(w @ x)


def check_traffic(config, workers, numel, itemsize, measured, case):
    analytic = config.traffic(workers, numel, itemsize)
    assert len(analytic.ranks) == config.world_size(workers), f"{case}: analytic traffic has wrong rank count"
    if not analytic.counted:
        for rank, t in enumerate(measured):
            counters = {k: t[k] for k in ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv")}
            assert not any(counters.values()), f"{case}: rank {rank} counted {counters} for an uncounted backend"
        return
    for rank, (want, got) in enumerate(zip(analytic.ranks, measured)):
        assert want.as_dict() == got, f"{case}: rank {rank} analytic {want.as_dict()} != measured {got}"
    assert analytic.rounds >= 0 and analytic.path_bytes >= 0, f"{case}: negative rounds or path_bytes"


@pytest.mark.parametrize("workers", WORLD_SIZES)
@pytest.mark.parametrize("name,params", list(settings()), ids=[label(*s) for s in settings()])
def test_results_and_traffic(name, params, workers):
    config = strategies.make(name, **params)
    for numel, op in itertools.product(NUMELS, config.ops):
        case = f"{label(name, params)} workers={workers} numel={numel} op={op}"
        inputs = make_inputs(workers, numel, op)
        outputs, traffic = run_collective(name, inputs, op=op, timeout=20, **params)
        assert len(outputs) == workers, case
        for rank, (got, want) in enumerate(zip(outputs, expected(config, inputs, op))):
            assert got.shape == (numel,) and got.dtype == np.float32, f"{case}: rank {rank} shape/dtype"
            if op in ("min", "max"):
                np.testing.assert_array_equal(got, want, err_msg=f"{case}: rank {rank}")
            else:
                np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{case}: rank {rank}")
        roles = ["worker"] * workers + ["server"] * config.num_servers(workers)
        assert [t["role"] for t in traffic] == roles, f"{case}: roles"
        check_traffic(config, workers, numel, 4, traffic, case)


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
