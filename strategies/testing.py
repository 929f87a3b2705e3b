"""A harness for strategy authors: run a collective on thread ranks, no Ray needed.

    outputs, traffic = run_collective("ring", [np.ones(10), np.arange(10.0)], op="sum")

`outputs` holds one array per worker rank; `traffic` one dict per rank (workers, then servers) with the
rank's `role`, measured `bytes_sent`, `bytes_recv`, `msgs_sent`, `msgs_recv`.

    check_strategy("my_ring")   # every world size 1-8 x size 0-4099 x op, results and bytes; raises on a mismatch
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import strategies
from strategies.communicator import DEFAULT_TIMEOUT_S
from strategies.link import Network
from strategies.ops import reference
from strategies.threads import run_threads


def run_collective(name: str, inputs, op: str = "sum", *, timeout: float = DEFAULT_TIMEOUT_S,
                   network: Network | None = None, repeat: int = 1, **params):
    """Run strategy `name` once (or `repeat` times, feeding outputs back in) on len(inputs) worker threads."""
    config = strategies.make(name, **params)
    workers = len(inputs)
    if workers < 1:
        raise ValueError("run_collective needs at least one input array (one per worker rank)")
    tensors = [torch.as_tensor(np.array(a, copy=True)) for a in inputs]

    def body(comm):
        runtime = config.bind(comm, workers)
        if runtime.is_server:
            for _ in range(repeat):
                runtime.serve(tensors[0].numel(), tensors[0].dtype, op)
            out = None
        else:
            out = tensors[comm.rank].clone().reshape(-1)
            for _ in range(repeat):
                runtime.sync(out, op)
            out = out.reshape(tensors[comm.rank].shape).numpy()
        counters = comm.counters()
        role = "server" if runtime.is_server else "worker"
        return out, {"role": role, **counters.as_dict()}

    results = run_threads(config.world_size(workers), body, timeout=timeout, network=network)
    outputs = [out for out, _ in results[:workers]]
    traffic = [t for _, t in results]
    return outputs, traffic


# -- checking a strategy against a reference (what the test suite runs on every registered strategy) ----

WORLD_SIZES = (1, 2, 3, 4, 5, 7, 8)
NUMELS = (0, 1, 3, 7, 1000, 4099)


class StrategyCheckError(AssertionError):
    """A strategy's result or traffic disagreed with the reference; the message names the case."""


def make_inputs(workers: int, numel: int, op: str, dtype=np.float32) -> list[np.ndarray]:
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


def expected(config, inputs: list[np.ndarray], op: str) -> list[np.ndarray]:
    """The exact allreduce for exact strategies; row i of W @ X for a neighbour-averaging one."""
    if config.exact:
        return [reference(inputs, op)] * len(inputs)
    x = np.stack([a.astype(np.float64) for a in inputs])
    return list(config.mixing_matrix(len(inputs)) @ x)


def check_traffic(config, workers: int, numel: int, itemsize: int, measured: list[dict], case: str) -> None:
    """Measured bytes and messages per rank must equal the strategy's analytic traffic exactly."""
    analytic = config.traffic(workers, numel, itemsize)
    if len(analytic.ranks) != config.world_size(workers):
        raise StrategyCheckError(f"{case}: analytic traffic lists {len(analytic.ranks)} ranks, "
                                 f"the strategy runs {config.world_size(workers)}")
    if analytic.rounds < 0 or analytic.path_bytes < 0:
        raise StrategyCheckError(f"{case}: negative rounds or path_bytes in the analytic traffic")
    for rank, (want, got) in enumerate(zip(analytic.ranks, measured)):
        counters = {k: got[k] for k in ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv")}
        if not analytic.counted:
            if any(counters.values()):
                raise StrategyCheckError(f"{case}: rank {rank} counted {counters} for an uncounted backend")
        elif want.as_dict() != {"role": got["role"], **counters}:
            raise StrategyCheckError(f"{case}: rank {rank} analytic {want.as_dict()} != measured {got}")


def check_strategy(name: str, world_sizes=WORLD_SIZES, numels=NUMELS, ops=None, **params) -> int:
    """Run `name` on every world size x size x op (default: all it supports) on threads; check every rank's
    result against numpy and the measured bytes against `traffic()`. Returns the number of cases checked."""
    config = strategies.make(name, **params)
    cases = 0
    for workers, numel, op in itertools.product(world_sizes, numels, ops or config.ops):
        case = f"{name}{params or ''} workers={workers} numel={numel} op={op}"
        inputs = make_inputs(workers, numel, op)
        outputs, traffic = run_collective(name, inputs, op=op, timeout=20, **params)
        roles = ["worker"] * workers + ["server"] * config.num_servers(workers)
        if [t["role"] for t in traffic] != roles:
            raise StrategyCheckError(f"{case}: roles {[t['role'] for t in traffic]}, expected {roles}")
        for rank, (got, want) in enumerate(zip(outputs, expected(config, inputs, op))):
            if got.shape != (numel,) or got.dtype != np.float32:
                raise StrategyCheckError(f"{case}: rank {rank} returned {got.shape} {got.dtype}")
            exact = op in ("min", "max")
            if not (np.array_equal(got, want) if exact else np.allclose(got, want, rtol=2e-5, atol=2e-5)):
                worst = float(np.max(np.abs(got - want))) if numel else 0.0
                raise StrategyCheckError(f"{case}: rank {rank} differs from the reference by up to {worst:.3g}")
        check_traffic(config, workers, numel, 4, traffic, case)
        cases += 1
    return cases
