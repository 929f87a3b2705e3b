"""Cases ported from other projects' allreduce suites, run on every exact registered strategy (and each of its
declared variants) on thread ranks. Each test names the file it was ported from; the values are re-derived
here, not copied. A plug-in registered later is picked up with no edits.

Every case runs as one sequence of collectives on ONE strategy object per rank (strategies.testing.run_sequence),
so sizes, dtypes and ops change between calls as they do in the peers' suites; every call's outputs must be
bitwise identical on all ranks and its bytes must equal the strategy's analytic traffic.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import strategies
from strategies.ops import ACCEPTED, reference
from strategies.testing import check_identical, check_traffic, run_sequence

EXACT = [(name, params) for name, params in strategies.registry.settings() if strategies.get(name).exact]
IDS = [name + "".join(f"[{k}={v}]" for k, v in params.items()) for name, params in EXACT]

INT_DTYPES = (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def accepts(config, op, dtype) -> bool:
    return op in config.ops and op in ACCEPTED[torch.from_numpy(np.zeros(1, dtype)).dtype]


def run_and_check(name, params, calls, expected, label):
    """Run `calls` as one sequence; every rank's output equal to `expected[i]` (exactly), identical on all
    ranks, and each call's traffic equal to the analytic traffic. Counts the wrong elements (nccl-tests)."""
    config = strategies.make(name, **params)
    results = run_sequence(name, calls, timeout=30, **params)
    for (op, inputs), want, (outputs, traffic) in zip(calls, expected, results):
        case = f"{label}: {name}{params or ''} n={len(inputs)} op={op} dtype={inputs[0].dtype} count={inputs[0].size}"
        check_identical(outputs, case)
        wrong = int(np.sum(outputs[0] != np.asarray(want, dtype=inputs[0].dtype)))
        assert wrong == 0, f"{case}: #wrong = {wrong} (got {outputs[0][:8]}, want {np.asarray(want)[:8]})"
        check_traffic(config, len(inputs), inputs[0].size, inputs[0].dtype.itemsize, traffic, case)


# -- MPICH test/mpi/coll/allred.c: count 10, every integer type and op, known closed-form solutions --------


def mpich_allred_calls(config, size, count=10):
    """MPICH's patterns: SUM in=i sol=i*size; PROD in=i sol=i**size; MAX/MIN in=rank+i; LAND/LOR/LXOR and
    BAND/BOR/BXOR on rank-dependent bits. Solutions computed in the dtype (wrap-around as C and numpy)."""
    i = np.arange(count)
    calls, expected = [], []
    for dtype in INT_DTYPES + FLOAT_DTYPES:
        per_op = {
            "sum": ([i] * size, i * size),
            # floats: powers of two only (0, 1, 2), whose products are exact in any order
            "prod": ([i] * size, i ** size) if np.dtype(dtype).kind in "iu" else ([i % 3] * size, (i % 3) ** size),
            "max": ([rank + i for rank in range(size)], size - 1 + i),
            "min": ([rank + i for rank in range(size)], i),
            "land": ([np.full(count, rank % 2 or 1) for rank in range(size)], np.ones(count)),
            "lor": ([np.full(count, rank & 1) for rank in range(size)], np.full(count, int(size > 1))),
            "lxor": ([np.full(count, int(rank == 1)) for rank in range(size)], np.full(count, int(size > 1))),
            "band": ([i if rank == size - 1 else np.full(count, -1) for rank in range(size)], i),
            "bor": ([i & (1 << rank % 8) for rank in range(size)], i & ((1 << min(size, 8)) - 1)),
            "bxor": ([np.full(count, 1 << rank % 8) for rank in range(size)], None),
        }
        for op, (inputs, want) in per_op.items():
            if not accepts(config, op, dtype) or (op == "prod" and size > 10):
                continue  # MPICH: "this test will fail for MPI_PROD ... if more than 10 processes are used"
            inputs = [np.asarray(a).astype(dtype) for a in inputs]
            calls.append((op, inputs))
            # the closed form where MPICH states one; it must agree with numpy in the same dtype
            ref = reference(inputs, op)
            if want is not None:
                np.testing.assert_array_equal(ref, np.asarray(want).astype(dtype), err_msg=f"{op} {dtype}")
            expected.append(ref)
    return calls, expected


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_mpich_allred(name, params):
    config = strategies.make(name, **params)
    # 16 ranks (MPICH's int8 wrap-around size) for the chunked allreduces whose chunking changes past 8 ranks;
    # every strategy runs the sizes of the generic matrix
    sizes = (1, 2, 3, 5, 7, 8) + ((16,) if name in ("ring", "halving_doubling", "double_binary_tree") else ())
    for size in sizes:
        calls, expected = mpich_allred_calls(config, size)
        run_and_check(name, params, calls, expected, "MPICH coll/allred.c")


def test_integer_wraparound_matches_numpy_in_the_same_dtype():
    """MPICH allred.c's i*size overflows int8 at size 16 (9*16 = 144 -> -112); numpy agrees in int8."""
    inputs = [np.arange(10, dtype=np.int8)] * 16
    assert reference(inputs, "sum")[9] == np.int8(-112)
    outputs, _ = run_sequence("ring", [("sum", inputs)])[0]
    assert outputs[0][9] == -112


# -- MPICH test/mpi/coll/allred_float.c: floating-point results identical on every rank --------------------


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_mpich_allred_float_identical_on_every_rank(name, params):
    """allred_float.c requires the same floating-point answer on every process. Cancelling values (1e6, -1e6,
    1e-2) expose any rank that adds in its own order; random data at n = 8 shows it on many elements."""
    config = strategies.make(name, **params)
    calls = [("sum", [np.float32([1e6, 3.0]), np.float32([-1e6, 1e-7]), np.float32([1e-2, -3.0])])]
    rng = np.random.default_rng(2)
    for dtype in (np.float16, np.float32, np.float64):
        for op in ("sum", "mean", "prod", "min", "max"):
            if accepts(config, op, dtype):
                scale = 0.05 if op == "prod" else 1.0
                calls.append((op, [(1 + scale * rng.standard_normal(1009)).astype(dtype) for _ in range(8)]))
    by_world: dict[int, list] = {}  # one sequence per world size, on one strategy object per rank (3 and 8 ranks)
    for op, inputs in calls:
        by_world.setdefault(len(inputs), []).append((op, inputs))
    for sequence in by_world.values():
        for (op, inputs), (outputs, _) in zip(sequence, run_sequence(name, sequence, timeout=30, **params),
                                               strict=True):
            case = f"allred_float.c: {name}{params or ''} n={len(inputs)} op={op} dtype={inputs[0].dtype}"
            check_identical(outputs, case)
            np.testing.assert_allclose(outputs[0].astype(np.float64), reference(inputs, op).astype(np.float64),
                                       rtol=2e-2 if inputs[0].dtype == np.float16 else 1e-5, atol=1e-2,
                                       err_msg=case)


# -- mpi4py test/test_cco_buf.py (testAllreduce): every count below the world size, every typecode --------


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_mpi4py_allreduce_counts_below_world_size(name, params):
    """mpi4py loops count over range(size) (here: all of it up to 8 ranks, 4 counts at 16): 0 elements, and arrays
    shorter than the world size, so that some ranks own empty chunks. SUM of value gives value*size, PROD
    value**size, MAX/MIN value."""
    config = strategies.make(name, **params)
    for size in (1, 2, 5, 7, 16):
        calls, expected = [], []
        # mpi4py takes every count below the size; at 16 ranks (a 16-thread run per call) the empty, the
        # one-element, a middle and the largest count (every kind of chunk split) instead of all 16
        for count in range(size) if size <= 8 else (0, 1, size // 2 - 1, size - 1):
            for dtype, value in ((np.int32, 3), (np.float64, 1.5), (np.uint16, 7), (np.int8, 2)):
                for op in ("sum", "prod", "max", "min"):
                    if not accepts(config, op, dtype) or (op == "prod" and size > 7):
                        continue
                    inputs = [np.full(count, value, dtype=dtype) for _ in range(size)]
                    calls.append((op, inputs))
                    want = {"sum": value * size, "prod": value ** size}.get(op, value)
                    expected.append(np.full(count, want).astype(dtype))
        run_and_check(name, params, calls, expected, "mpi4py test_cco_buf.py testAllreduce")


# -- nccl-tests src/common.cu: verifiable data, #wrong must be 0; half-precision averages -------------------


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_nccl_tests_verifiable_half_precision(name, params):
    """nccl-tests checks every element (#wrong) with data whose reduction is exact in the dtype: here
    integer-valued float16 whose partial sums are all exact, so sum and mean must be bit-exact (the mean is
    the exact mean rounded once), on world sizes that are and are not powers of two."""
    config = strategies.make(name, **params)
    if "mean" not in config.ops:
        pytest.skip(f"{name} has no mean")
    for size in (2, 3, 4, 5, 8):
        calls, expected = [], []
        ints = [np.arange(37) % 9 + rank for rank in range(size)]
        calls.append(("sum", [a.astype(np.float16) for a in ints]))
        expected.append(sum(ints).astype(np.float16))
        calls.append(("mean", [a.astype(np.float16) for a in ints]))
        expected.append((sum(ints) / size).astype(np.float16))
        run_and_check(name, params, calls, expected, "nccl-tests common.cu")


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_float16_mean_scales_before_it_sums(name, params):
    """NCCL's ncclAvg scales before it sums: 4 ranks of 30000 in float16 average to 30000, not inf (their sum
    would overflow). Near the top of the range the prescaled partial sums round like any float16 sum: within
    2 units in the last place of the float32 reference; at powers of two 65504 (the largest) stays exact."""
    config = strategies.make(name, **params)
    if "mean" not in config.ops:
        pytest.skip(f"{name} has no mean")
    [(four, _)] = run_sequence(name, [("mean", [np.full(5, 30000, np.float16)] * 4)], **params)
    [(eight, _)] = run_sequence(name, [("mean", [np.full(5, 65504, np.float16)] * 8)], **params)
    assert np.all(four[0] == 30000) and np.all(eight[0] == 65504), (four[0], eight[0])
    for size in (3, 5, 7, 16):
        inputs = [np.full(5, 30000 + 1000 * rank, np.float16) for rank in range(size)]
        [(per_rank, _)] = run_sequence(name, [("mean", inputs)], **params)
        check_identical(per_rank, f"{name} mean float16 n={size}")
        assert np.all(np.isfinite(per_rank[0])), f"{name} n={size}: overflowed to {per_rank[0]}"
        np.testing.assert_allclose(per_rank[0].astype(np.float64), reference(inputs, "mean").astype(np.float64),
                                   rtol=2 * 2.0 ** -10)


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_bfloat16_mean_does_not_overflow(name, params):
    """bfloat16 shares float32's range: 3e38 on every rank averages to 3e38 (the sum would be inf)."""
    config = strategies.make(name, **params)
    if "mean" not in config.ops:
        pytest.skip(f"{name} has no mean")
    results = []

    def body(comm):
        runtime = config.bind(comm, 4)
        out = torch.full((6,), 3e38, dtype=torch.bfloat16) if not runtime.is_server else None
        if runtime.is_server:
            runtime.serve(6, torch.bfloat16, "mean")
        else:
            runtime.sync(out, "mean")
            results.append(out.float())
        return None

    from strategies.transport.threads import run_threads

    run_threads(config.world_size(4), body, timeout=30)
    want = torch.full((6,), 3e38, dtype=torch.bfloat16).float()
    assert all(torch.equal(r, want) for r in results), f"{name}: {results}"


# -- gloo gloo/test/allreduce_test.cc: rank-dependent fixtures, large prime counts, world sizes to 16 -------


GLOO_MAX_MESSAGES = 600  # at 16 ranks no strategy sends over 64 but the partitioned parameter servers


@pytest.mark.parametrize("name,params", EXACT, ids=IDS)
def test_gloo_allreduce_fixture_large_prime_counts(name, params):
    """gloo's fixture fills element j of rank r with j * size + r; the sum is j * size^2 + size(size-1)/2.
    Counts include large primes (no world size divides them) and the dtypes gloo's builder test covers. A count
    that would cost some rank over GLOO_MAX_MESSAGES messages (a parameter server's 100-byte partitions: 10007
    float64 are 770 of them) runs at the list's 1021, still prime and dozens of partitions."""
    config = strategies.make(name, **params)
    for size in (3, 8, 13, 16):
        calls, expected = [], []
        for count, dtype in ((10007, np.float64), (4099, np.int64), (1021, np.uint64), (997, np.float32)):
            ranks = config.traffic(size, count, np.dtype(dtype).itemsize).ranks
            if max(r.msgs_sent + r.msgs_recv for r in ranks) > GLOO_MAX_MESSAGES:
                count = 1021
            j = np.arange(count)
            calls.append(("sum", [(j * size + rank).astype(dtype) for rank in range(size)]))
            expected.append((j * size * size + size * (size - 1) // 2).astype(dtype))
        run_and_check(name, params, calls, expected, "gloo test/allreduce_test.cc")


# -- the unsupported: refused on every rank before any byte moves -----------------------------------------


@pytest.mark.parametrize("dtype,op", [(torch.float8_e4m3fn, "sum"), (torch.complex64, "max"), (torch.bool, "sum"),
                                      (torch.int32, "mean"), (torch.float32, "band"), (torch.uint32, "mean")])
def test_unreducible_dtype_or_op_is_refused_up_front_naming_it(dtype, op):
    config = strategies.make("ring")

    def body(comm):
        runtime = config.bind(comm, 3)
        try:
            runtime.sync(torch.zeros(5, dtype=dtype), op)
        except ValueError as e:
            return str(e), comm.counters().bytes_sent
        return None, comm.counters().bytes_sent

    from strategies.transport.threads import run_threads

    for message, sent in run_threads(3, body, timeout=10):
        assert message is not None and str(dtype).removeprefix("torch.") in message and "accepted" in message
        assert sent == 0, "refused after bytes moved"
