"""A harness for strategy authors: run a collective on thread ranks, no Ray needed.

    outputs, traffic = run_collective("ring", [np.ones(10), np.arange(10.0)], op="sum")

`outputs` holds one array per worker rank; `traffic` one dict per rank (workers, then servers) with the
rank's `role`, measured `bytes_sent`, `bytes_recv`, `msgs_sent`, `msgs_recv`.

    check_strategy("my_ring")   # every world size 1-8 x size 0-4099 x op, results and bytes; raises on a mismatch

check_strategy runs all the cases of one world size on one group of thread ranks (threads.ThreadRanks: the threads
and the transport's connections built once, each case a fresh bind of the strategy with counters from zero) and
names every failing case in one error.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

import strategies
from strategies.ops import ARITHMETIC, BITWISE, LOGICAL, reference
from strategies.transport.communicator import DEFAULT_TIMEOUT_S
from strategies.transport.link import Network
from strategies.transport.threads import ThreadRanks, run_threads


def run_collective(name: str, inputs, op: str = "sum", *, timeout: float = DEFAULT_TIMEOUT_S,
                   network: Network | None = None, repeat: int = 1, p2p: str = "threads",
                   ranks: ThreadRanks | None = None, **params):
    """Run strategy `name` once (or `repeat` times, feeding outputs back in) on len(inputs) worker threads.
    `p2p`: the transport that carries the messages between the threads: any name of strategies.transport.factory
    that works over thread ranks ("threads", "sockets", "sockets-unix", "sockets-tcp", or one registered).
    `ranks`: run on this pool of thread ranks (its own world size, p2p and timeout) instead of fresh ones."""
    config = strategies.make(name, **params)
    workers = len(inputs)
    if workers < 1:
        raise ValueError("run_collective needs at least one input array (one per worker rank)")
    if ranks is not None:
        wanted = (config.world_size(workers), p2p, _nodes(config, network), None)
        have = (ranks.world_size, ranks.p2p, ranks.ranks_per_node, network)
        if have != wanted:
            raise ValueError(f"run_collective: the pool of ranks has (world_size, p2p, ranks_per_node, network) "
                             f"{have}, this run needs {wanted}")
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

    if ranks is not None:
        results = ranks.run(body)
    else:
        results = run_threads(config.world_size(workers), body, timeout=timeout, network=network, p2p=p2p,
                              ranks_per_node=_nodes(config, network))
    outputs = [out for out, _ in results[:workers]]
    traffic = [t for _, t in results]
    return outputs, traffic


def _nodes(config, network: Network | None) -> int | None:
    """A node-aware strategy's ranks_per_node places the thread ranks in nodes of that many (unless the network
    says where they are)."""
    k = getattr(config, "ranks_per_node", None)
    return k if network is None else None


def run_sequence(name: str, calls, *, timeout: float = DEFAULT_TIMEOUT_S, **params):
    """Run many collectives on ONE strategy object per rank (sizes, dtypes and ops may change between calls),
    as training and the peers' suites do. `calls` is a list of (op, inputs): one array per worker rank.
    Returns, per call, the worker outputs and every rank's traffic of that call alone (a counter delta)."""
    config = strategies.make(name, **params)
    workers = len(calls[0][1]) if calls else 0
    if workers < 1 or any(len(inputs) != workers for _, inputs in calls):
        raise ValueError("run_sequence needs calls with the same number (>= 1) of input arrays each")
    tensors = [[torch.as_tensor(np.array(a, copy=True)).reshape(-1) for a in inputs] for _, inputs in calls]

    def body(comm):
        runtime = config.bind(comm, workers)
        results = []
        for (op, _), per_rank in zip(calls, tensors):
            comm.reset_counters()
            if runtime.is_server:
                runtime.serve(per_rank[0].numel(), per_rank[0].dtype, op)
                out = None
            else:
                out = per_rank[comm.rank].clone()
                runtime.sync(out, op)
                out = out.numpy()
            role = "server" if runtime.is_server else "worker"
            results.append((out, {"role": role, **comm.counters().as_dict()}))
        return results

    per_rank = run_threads(config.world_size(workers), body, timeout=timeout, ranks_per_node=_nodes(config, None))
    return [([per_rank[r][i][0] for r in range(workers)], [rank_results[i][1] for rank_results in per_rank])
            for i in range(len(calls))]


# -- checking a strategy against a reference (what the test suite runs on every registered strategy) ----

WORLD_SIZES = (1, 2, 3, 4, 5, 7, 8)
NUMELS = (0, 1, 3, 7, 1000, 4099)


class StrategyCheckError(AssertionError):
    """A strategy's result or traffic disagreed with the reference; the message names the case."""


def make_inputs(workers: int, numel: int, op: str, dtype=np.float32) -> list[np.ndarray]:
    """Rank-dependent inputs; values near 1 for prod so that it neither overflows nor underflows; 0/1-heavy
    integers for logical ops (so that both answers occur); full-width bit patterns for bitwise ops."""
    dtype = np.dtype(dtype)
    out = []
    for rank in range(workers):
        rng = np.random.default_rng([workers, numel, rank])
        if dtype == np.bool_:
            out.append(rng.random(numel) < 0.7)
        elif dtype.kind in "iu" and op in BITWISE:
            out.append(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, numel, dtype=dtype, endpoint=True))
        elif dtype.kind in "iu" and op in LOGICAL:
            out.append((rng.integers(0, 4, numel) * (rank + 1)).astype(dtype))
        elif dtype.kind in "iu":
            low = -50 if dtype.kind == "i" else 0
            out.append((rng.integers(low, 50, numel) + rank).astype(dtype))
        elif op == "prod":
            out.append(rng.uniform(0.9, 1.1, numel).astype(dtype))
        else:
            out.append((rng.standard_normal(numel) + rank).astype(dtype))
    return out


def default_dtype(op: str):
    """The dtype check_strategy tests an op in: float32 for arithmetic, int32 for logical and bitwise ops."""
    return np.float32 if op in ARITHMETIC else np.int32


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


def check_identical(outputs: list[np.ndarray], case: str) -> None:
    """Every worker rank of an exact allreduce must hold the same bits (MPI and NCCL require it; replicas
    that differ in the last bit drift apart in training)."""
    for rank, got in enumerate(outputs[1:], start=1):
        if got.tobytes() != outputs[0].tobytes():
            differ = int(np.sum(got.view(np.uint8) != outputs[0].view(np.uint8)))
            raise StrategyCheckError(f"{case}: rank {rank} differs from rank 0 in {differ} byte(s): "
                                     f"an exact strategy must leave every rank bitwise identical")


def check_case(name: str, inputs: list[np.ndarray], op: str, case: str, p2p: str = "threads",
               ranks: ThreadRanks | None = None, **params) -> list[np.ndarray]:
    """One collective on thread ranks (fresh ones, or the pool `ranks`): roles, dtype and shape, the reference
    (exact for integers, min/max, logical and bitwise ops), bitwise agreement between ranks (exact strategies) and
    traffic. Returns outputs."""
    config = strategies.make(name, **params)
    workers, numel, dtype = len(inputs), inputs[0].size, inputs[0].dtype
    outputs, traffic = run_collective(name, inputs, op=op, timeout=20, p2p=p2p, ranks=ranks, **params)
    roles = ["worker"] * workers + ["server"] * config.num_servers(workers)
    if [t["role"] for t in traffic] != roles:
        raise StrategyCheckError(f"{case}: roles {[t['role'] for t in traffic]}, expected {roles}")
    exact = op in ("min", "max") + LOGICAL + BITWISE or dtype.kind in "iub"
    tol = 2e-5 if dtype.itemsize >= 4 else 1e-2
    for rank, (got, want) in enumerate(zip(outputs, expected(config, inputs, op))):
        if got.shape != (numel,) or got.dtype != dtype:
            raise StrategyCheckError(f"{case}: rank {rank} returned {got.shape} {got.dtype}, "
                                     f"expected ({numel},) {dtype}")
        if exact:
            if not np.array_equal(got, want):
                wrong = int(np.sum(got != want))
                raise StrategyCheckError(f"{case}: rank {rank} has {wrong} element(s) unlike the reference")
        elif not np.allclose(got.astype(np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol):
            worst = float(np.max(np.abs(got.astype(np.float64) - want))) if numel else 0.0
            raise StrategyCheckError(f"{case}: rank {rank} differs from the reference by up to {worst:.3g}")
    if config.exact:
        check_identical(outputs, case)
    check_traffic(config, workers, numel, dtype.itemsize, traffic, case)
    return outputs


def check_strategy(name: str, world_sizes=WORLD_SIZES, numels=NUMELS, ops=None, dtype=None, p2p: str = "threads",
                   **params) -> int:
    """Run `name` on every world size x size x op (default: all it supports) on threads; check every rank's
    result against numpy, bitwise agreement between ranks and the measured bytes against `traffic()`.
    `dtype` (default: float32 for arithmetic, int32 for logical and bitwise ops); `p2p` what carries the
    messages between the threads (see run_collective). Returns the cases checked; raises StrategyCheckError
    naming every failing case (up to MAX_FAILURES, then it stops)."""
    config = strategies.make(name, **params)
    cases, failures, names = 0, [], []
    for workers in world_sizes:
        with ThreadRanks(config.world_size(workers), timeout=20, p2p=p2p,
                         ranks_per_node=_nodes(config, None)) as ranks:
            for numel, op in itertools.product(numels, ops or config.ops):
                case_dtype = np.dtype(dtype or default_dtype(op))
                case = f"{name}{params or ''} workers={workers} numel={numel} op={op} dtype={case_dtype} p2p={p2p}"
                cases += 1
                try:
                    check_case(name, make_inputs(workers, numel, op, case_dtype), op, case, p2p=p2p, ranks=ranks,
                               **params)
                except Exception as e:  # noqa: BLE001 - every failing case is named below
                    failures.append(e)
                    names.append(str(e) if isinstance(e, StrategyCheckError) else f"{case}: {type(e).__name__}: {e}")
                    ranks.close()  # a message of the failed case may be left in flight: the next case starts afresh
                if len(failures) >= MAX_FAILURES:
                    break
        if len(failures) >= MAX_FAILURES:
            break
    if failures:
        left = len(world_sizes) * len(numels) * len(ops or config.ops) - cases
        more = f" (stopped after {MAX_FAILURES}; {left} cases not run)" if left else ""
        raise StrategyCheckError(f"{len(failures)} of {cases} cases failed{more}:\n" + "\n".join(names)) \
            from failures[0]
    return cases


MAX_FAILURES = 10  # a strategy that hangs costs its timeout per case: check_strategy stops after this many
