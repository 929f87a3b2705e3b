"""Compression around every gradient strategy (strategies/compression.py), on thread ranks: the results each
compression promises, error feedback that loses nothing, and counted bytes equal to traffic() step by step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import strategies
from strategies.base import GRADIENTS
from strategies.testing import check_traffic, run_collective
from strategies.transport.threads import run_threads

GRADIENT_STRATEGIES = [n for n in strategies.names()
                       if strategies.get(n).role == GRADIENTS and not strategies.get(n).wraps_model
                       and strategies.get(n).counted]


def _inputs(workers, numel, seed=0):
    return [np.random.default_rng([seed, workers, r]).standard_normal(numel).astype(np.float32)
            for r in range(workers)]


def _run_steps(name, per_step_inputs, **settings):
    """Call sync() on one runtime per rank for each step's inputs; per step: outputs, counters, residuals."""
    config = strategies.make(name, **settings)
    workers = len(per_step_inputs[0])

    def body(comm):
        runtime = config.bind(comm, workers)
        out = []
        for inputs in per_step_inputs:
            comm.reset_counters()
            buf = torch.tensor(inputs[comm.rank]).clone()
            runtime.sync(buf, "mean")
            residual = None if runtime.residual is None else runtime.residual.clone().numpy()
            out.append((buf.numpy(), {"role": "worker", **comm.counters().as_dict()}, residual))
        return out

    per_rank = run_threads(workers, body, timeout=20)
    return config, [[per_rank[r][s] for r in range(workers)] for s in range(len(per_step_inputs))]


@pytest.mark.parametrize("name", GRADIENT_STRATEGIES)
@pytest.mark.parametrize("kind", ["fp16", "bf16"])
def test_half_compression_equals_the_strategy_in_that_dtype(name, kind):
    """The strategy averaging 16-bit inputs, cast back: the same bits as the compressed run."""
    dtype = {"fp16": np.float16, "bf16": torch.bfloat16}[kind]
    inputs = _inputs(3, 37)
    got, _ = run_collective(name, inputs, op="mean", compression=kind, timeout=20)
    if kind == "fp16":
        want, _ = run_collective(name, [a.astype(np.float16) for a in inputs], op="mean", timeout=20)
        want = [w.astype(np.float32) for w in want]
    else:  # numpy has no bfloat16: the reference runs the strategy's runtime on torch tensors
        config = strategies.make(name)

        def body(comm):
            buf = torch.tensor(inputs[comm.rank]).to(dtype)
            config.bind(comm, 3).sync(buf, "mean")
            return buf.float().numpy()

        want = run_threads(3, body, timeout=20)
    for g, w in zip(got, want):
        assert g.tobytes() == w.tobytes()
    assert np.abs(got[0] - np.mean(inputs, axis=0)).max() < (1e-2 if kind == "fp16" else 6e-2)


@pytest.mark.parametrize("kind", ["fp16", "bf16", "topk", "powersgd"])
@pytest.mark.parametrize("name", GRADIENT_STRATEGIES)
def test_bytes_equal_traffic_on_world_sizes_1_2_3_5(name, kind):
    settings = {"compression": kind, "topk_ratio": 0.05, "powersgd_start": 1, "powersgd_rank": 2}
    for workers in (1, 2, 3, 5):
        steps = [_inputs(workers, 400, seed) for seed in range(2)]  # PowerSGD: one uncompressed step, one not
        config, results = _run_steps(name, steps, **settings)
        for step, per_rank in enumerate(results):
            counted = [t for _, t, _ in per_rank]
            want = config.step_traffic(workers, 400, 4, step)
            case = f"{name} {kind} workers={workers} step={step}"
            assert [r.bytes_sent for r in want.ranks] == [t["bytes_sent"] for t in counted], case
            assert [r.bytes_recv for r in want.ranks] == [t["bytes_recv"] for t in counted], case
        check_traffic(config, workers, 400, 4, [t for _, t, _ in results[-1]], f"{name} {kind} {workers}")
        if workers > 1 and kind != "topk":
            full = strategies.make(name).traffic(workers, 400).worker_bytes_sent
            assert config.traffic(workers, 400).worker_bytes_sent < full


def test_topk_residual_holds_exactly_what_was_not_sent():
    """Error feedback loses nothing: each step sent + residual = gradient + last residual (bitwise), and over the
    steps sent + final residual = the sum of the gradients."""
    workers, numel, steps = 3, 200, 4
    grads = [_inputs(workers, numel, seed) for seed in range(steps)]
    _, results = _run_steps("ring", grads, compression="topk", topk_ratio=0.05)
    k = 10
    for rank in range(workers):
        previous = np.zeros(numel, np.float32)
        sent_total = np.zeros(numel, np.float64)
        for step in range(steps):
            residual = results[step][rank][2]
            acc = grads[step][rank] + previous
            sent = acc - residual
            assert np.count_nonzero(residual == 0) >= k  # k entries went out
            np.testing.assert_array_equal(sent[residual != 0], 0)  # an entry is sent whole or kept whole
            np.testing.assert_array_equal(residual[residual != 0], acc[residual != 0])
            top = np.sort(np.abs(acc))[-k:]
            np.testing.assert_array_equal(np.sort(np.abs(sent[sent != 0])), top[top != 0])
            sent_total += sent
            previous = residual
        total = np.sum([g[rank] for g in grads], axis=0, dtype=np.float64)
        np.testing.assert_allclose(sent_total + previous, total, atol=1e-5)
    # the average is the mean of what the workers sent, the same bits everywhere
    out = [o for o, _, _ in results[0]]
    for o in out[1:]:
        assert o.tobytes() == out[0].tobytes()
    sent0 = [grads[0][r] - results[0][r][2] for r in range(workers)]
    np.testing.assert_allclose(out[0], np.mean(sent0, axis=0), atol=1e-6)


@pytest.mark.parametrize("name", ["ring", "halving_doubling"])
@pytest.mark.parametrize("rank", [1, 2])
def test_powersgd_reproduces_a_rank_r_mean(name, rank):
    """Workers' matrices A_i B^T share B: their mean has rank r, which PowerSGD rank r reproduces."""
    workers, rows, cols = 3, 12, 12  # numel 144: the flat view is 12 x 12
    rng = np.random.default_rng(7)
    shared = rng.standard_normal((cols, rank))
    grads = []
    for step in range(3):
        grads.append([(np.random.default_rng([step, w]).standard_normal((rows, rank)) @ shared.T)
                      .astype(np.float32).reshape(-1) for w in range(workers)])
    _, results = _run_steps(name, grads, compression="powersgd", powersgd_rank=rank, powersgd_start=0)
    for step in (1, 2):  # after the warm start (step 0 starts from a random Q)
        mean = np.mean(grads[step], axis=0)
        for out, _, _ in results[step]:
            np.testing.assert_allclose(out, mean, atol=1e-4)


def test_powersgd_rank_below_the_mean_rank_is_lossy_and_residual_keeps_the_rest():
    workers = 2
    grads = [_inputs(workers, 144, 3)]
    _, results = _run_steps("ring", grads, compression="powersgd", powersgd_rank=1, powersgd_start=0)
    out, _, residual = results[0][0]
    assert np.abs(out - np.mean(grads[0], axis=0)).max() > 1e-2
    np.testing.assert_allclose(residual, grads[0][0] - out, atol=1e-5)


@pytest.mark.parametrize("settings, match", [
    ({"compression": "int8"}, r"compression = 'int8': accepted are 'none', 'fp16', 'bf16', 'powersgd', 'topk'"),
    ({"compression": "topk", "topk_ratio": 0}, r"topk_ratio = 0: accepted are numbers > 0 and <= 1"),
    ({"compression": "topk", "topk_ratio": 1.5}, r"topk_ratio = 1.5: accepted are"),
    ({"compression": "powersgd", "powersgd_rank": 0}, r"powersgd_rank = 0: accepted are whole numbers 1 to 1024"),
    ({"compression": "powersgd", "powersgd_start": -1}, r"powersgd_start = -1: accepted are"),
    ({"compression": "topk", "error_feedback": "yes"}, r"error_feedback = 'yes': accepted are true or false"),
])
def test_bad_values_are_refused_naming_value_and_accepted(settings, match):
    with pytest.raises(ValueError, match=match):
        strategies.make("ring", **settings)


@pytest.mark.parametrize("name", ["decentralized", "parameter_server"])
def test_compression_on_a_strategy_that_does_not_average_gradients_is_refused(name):
    with pytest.raises(ValueError, match=rf"compression = 'fp16' applies to strategies that average gradients.*"
                                         rf"{name!r}"):
        strategies.make(name, compression="fp16")


def test_none_is_the_strategy_itself():
    assert strategies.make("ring", compression="none") == strategies.make("ring")
    assert type(strategies.make("ring", compression="fp16")).__name__ == "CompressedConfig"


# ---- PowerSGD per tensor, as torch's powerSGD_hook --------------------------------------------------------

LAYOUT = [(12, 3, 2, 2), (12,), (10, 30), (10,), (7, 1)]  # conv weight 12 x 12, bias, linear 10 x 30, bias, 7 x 1


def _layout_inputs(workers, rank, step):
    """Per worker a flat buffer of LAYOUT's tensors; every matrix the workers' tensor holds shares its right factor
    B (rank `rank`), so each tensor's mean has rank <= `rank`; 1-d tensors are arbitrary."""
    out = [[] for _ in range(workers)]
    for t, shape in enumerate(LAYOUT):
        rows, cols = shape[0], int(np.prod(shape)) // shape[0]
        shared = np.random.default_rng([99, t]).standard_normal((cols, min(rank, rows, cols)))
        for w in range(workers):
            rng = np.random.default_rng([step, w, t])
            tensor = rng.standard_normal(rows * cols) if len(shape) == 1 else \
                (rng.standard_normal((rows, shared.shape[1])) @ shared.T).reshape(-1)
            out[w].append(tensor)
    return [np.concatenate(parts).astype(np.float32) for parts in out]


def _run_layout(name, per_step_inputs, shapes, **settings):
    config = strategies.make(name, compression="powersgd", **settings)
    workers = len(per_step_inputs[0])

    def body(comm):
        runtime = config.bind(comm, workers)
        runtime.set_shapes(shapes)
        out = []
        for inputs in per_step_inputs:
            comm.reset_counters()
            buf = torch.tensor(inputs[comm.rank]).clone()
            runtime.sync(buf, "mean")
            out.append((buf.numpy(), comm.counters().as_dict()))
        return out

    return config, run_threads(workers, body, timeout=20)


def test_powersgd_plan_is_torchs_per_tensor_rule():
    """Each tensor shape[0] x the rest, rank min(r, rows, cols), compressed exactly when torch's _should_compress
    says so (1-d tensors and matrices PowerSGD would not halve go as they are)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

    from strategies.compression import MIN_COMPRESSION_RATE, powersgd_plan

    numel = sum(int(np.prod(s)) for s in LAYOUT)
    for rank in (1, 2, 4, 8):
        plan = powersgd_plan(numel, rank, LAYOUT)
        for piece, shape in zip(plan, LAYOUT):
            rows, cols = shape[0], int(np.prod(shape)) // shape[0]
            r = min(rank, rows, cols)
            assert (piece.rows, piece.cols) == (rows, cols)
            assert bool(piece.rank) == _should_compress(rows, cols, r, MIN_COMPRESSION_RATE)[0], (rank, shape)
            assert piece.rank in (0, r)
    assert [p.rank for p in powersgd_plan(numel, 2, LAYOUT)] == [2, 0, 2, 0, 0]


@pytest.mark.parametrize("name", ["ring", "halving_doubling"])
@pytest.mark.parametrize("rank", [1, 2])
def test_powersgd_per_tensor_reproduces_the_mean_when_each_tensor_has_rank_r(name, rank):
    """Every compressed tensor's mean has rank r, the others go exactly: the whole bucket's mean within 1e-4."""
    workers = 3
    steps = [_layout_inputs(workers, rank, step) for step in range(3)]
    _, per_rank = _run_layout(name, steps, LAYOUT, powersgd_rank=rank, powersgd_start=0)
    for step in (1, 2):  # after the warm start (step 0 starts from random Qs)
        mean = np.mean(steps[step], axis=0)
        for r in range(workers):
            np.testing.assert_allclose(per_rank[r][step][0], mean, atol=1e-4)
        assert per_rank[1][step][0].tobytes() == per_rank[0][step][0].tobytes()


@pytest.mark.parametrize("workers", [2, 3])
def test_powersgd_per_tensor_bytes_equal_traffic(workers):
    """Warm-up (step 0: the whole bucket), then the uncompressed tensors, every P and every Q: counted = traffic."""
    steps = [_inputs(workers, 473, seed) for seed in range(2)]  # 473 = LAYOUT's elements
    config, per_rank = _run_layout("ring", steps, LAYOUT, powersgd_rank=2, powersgd_start=1)
    for step in range(2):
        want = config.step_traffic(workers, 473, 4, step, shapes=LAYOUT)
        assert [r.bytes_sent for r in want.ranks] == [per_rank[r][step][1]["bytes_sent"] for r in range(workers)]
        assert [r.bytes_recv for r in want.ranks] == [per_rank[r][step][1]["bytes_recv"] for r in range(workers)]
    ring = strategies.make("ring")
    rest, p, q = 12 + 10 + 7, (12 + 10) * 2, (12 + 30) * 2  # uncompressed elements, P's rows x r, Q's cols x r
    want = sum(ring.traffic(workers, n).worker_bytes_sent for n in (rest, p, q))
    assert config.step_traffic(workers, 473, 4, 1, shapes=LAYOUT).worker_bytes_sent == want
    assert config.traffic(workers, 473, shapes=LAYOUT) != config.traffic(workers, 473)  # the layout counts


def test_a_layout_that_does_not_fit_the_buffer_is_refused_naming_both_sizes():
    with pytest.raises(ValueError, match=r"layout \[\(12, 3, 2, 2\)\] holds 144 elements, the buffer 145"):
        _run_layout("ring", [_inputs(2, 145)], [(12, 3, 2, 2)], powersgd_start=0)
    with pytest.raises(ValueError, match=r"layout \[\(2, -1\)\]: a dimension is negative"):
        _run_layout("ring", [_inputs(2, 4)], [(2, -1)], powersgd_start=0)


# ---- ddp: DDP's own comm hooks (comm = "gloo"), syncbench's codecs around the strategy (comm = a strategy) -------

@pytest.mark.parametrize("settings, match", [
    ({"compression": "topk"}, r"ddp comm = 'gloo': compression = 'topk' has no DDP comm hook in torch"),
    ({"compression": "powersgd", "comm": "ring"}, r"ddp comm = 'ring': compression = 'powersgd' is not offered"),
    ({"compression": "powersgd", "powersgd_start": 1}, r"powersgd_start = 1 .*start_powerSGD_iter >= 2"),
    ({"sync_every": 4}, r"sync_every = 4 applies to strategies that average through sync\(\).*'ddp'"),
])
def test_ddp_combinations_torch_has_no_hook_for_are_refused_naming_the_value(settings, match):
    with pytest.raises(ValueError, match=match):
        strategies.make("ddp", **settings)


def _gloo_groups(world):
    """A gloo process group per thread rank over one in-process store (no global torch.distributed state)."""
    import torch.distributed as dist

    store = dist.HashStore()

    def group(rank):
        g = dist.ProcessGroup(store, rank, world)
        g._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        g._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                            dist.ProcessGroupGloo(store, rank, world))
        return g

    return group


# slow: out of make test-fast. Run after the file's thread-rank tests on a loaded machine (load 5-7), gloo aborted
# the whole process from a native thread here in 2 of 3 runs (Fatal Python error: Aborted, no Python frame); alone
# it passes. Left for make test, where it ran before, until the cause is found.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fp16", "bf16", "powersgd"])
def test_ddp_over_gloo_runs_torchs_hook(kind):
    """Two ranks' DDP over gloo with the run's compression: fp16/bf16 gradients are representable in that format
    and within its rounding of the mean; PowerSGD rank 1 (from step 2) leaves the weight's gradient rank 1 where
    the exact mean's rank is higher."""
    config = strategies.make("ddp", compression=kind, powersgd_rank=1, powersgd_start=2)
    group = _gloo_groups(2)
    data = [torch.randn(8, 6, generator=torch.Generator().manual_seed(r)) for r in range(2)]

    def body(comm):
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 5)
        ddp = config.wrap(model, None, torch.device("cpu"), process_group=group(comm.rank))
        grads = []
        for _ in range(3):
            ddp.zero_grad()
            ddp(data[comm.rank]).pow(2).sum().backward()
            grads.append(model.weight.grad.clone())
        local = torch.nn.Linear(6, 5)
        local.load_state_dict(model.state_dict())
        local(data[comm.rank]).pow(2).sum().backward()  # this rank's own last gradient, uncompressed
        return grads, local.weight.grad

    out = run_threads(2, body, timeout=30)
    exact = (out[0][1] + out[1][1]) / 2
    got = out[0][0][-1]
    assert torch.equal(got, out[1][0][-1])
    if kind == "powersgd":
        assert torch.linalg.matrix_rank(exact) > 1 and torch.linalg.matrix_rank(got, rtol=1e-5) == 1
        np.testing.assert_allclose(out[0][0][0], ((out[0][0][0] + out[1][0][0]) / 2))  # warm-up: allreduce
    else:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[kind]
        assert torch.equal(got.to(dtype).float(), got)
        assert (got - exact).abs().max() <= (2e-2 if kind == "bf16" else 2e-3) * exact.abs().max()


@pytest.mark.parametrize("kind", ["fp16", "topk"])
def test_ddp_through_ring_compresses_and_counts_the_compressed_bytes(kind):
    """comm = 'ring': the hook runs syncbench's codec around ring on the counted transport; the summary checks
    every rank's bytes in every step against the compressed traffic summed over DDP's buckets."""
    import dataclasses

    from experiments.pipeline.summary import summarize
    from tests.experiments.test_overlap import META, on_threads, spec_for

    spec = dataclasses.replace(spec_for("ddp", workers=2, steps=2), strategy_params={"comm": "ring"},
                               compression=kind, topk_ratio=0.05)
    results = on_threads(spec)
    row, steps = summarize(spec, results, "", META)
    assert row["status"] == "ok", row["error"]
    assert row["compression"] == kind and row["bytes_counted"]
    exact = strategies.make("ring").traffic(2, int(row["numel"])).worker_bytes_sent
    assert 0 < row["bytes_sent_per_worker"] < exact / (1.9 if kind == "fp16" else 4)


def test_ddp_as_a_collective_refuses_the_compression_only_its_hook_applies():
    with pytest.raises(ValueError, match=r"ddp with compression = 'fp16' compresses inside DDP's comm hook"):
        run_collective("ddp", _inputs(2, 4), op="mean", compression="fp16", timeout=20)


@pytest.mark.parametrize("numel, ratio, k", [
    (4099, 0.01, 41),   # 40.99 -> 41: ceil, as documented (floor would send 40)
    (4100, 0.01, 41),   # exactly 41
    (1000, 0.05, 50),   # exactly 50
    (7, 0.05, 1),       # 0.35 -> 1: at least one entry of a non-empty buffer
    (3, 1.0, 3),        # all of them
    (0, 0.5, 0),        # nothing to send
])
def test_topk_count_is_the_documented_ceiling(numel, ratio, k):
    from strategies.compression import topk_count

    assert topk_count(numel, ratio) == k


def test_topk_traffic_carries_ceil_ratio_times_numel_entries():
    """4099 elements at 1 % on 2 workers through the ring: each worker contributes 41 (value, index) pairs to a
    buffer of 2 workers x 2 x 41 = 164 entries that the ring allreduces: chunks of 82 x 4 B = 328 B, one sent in
    the reduce-scatter and one in the all-gather: 656 B per worker (floor's 40 would make it 640)."""
    t = strategies.make("ring", compression="topk", topk_ratio=0.01).traffic(2, 4099, 4)
    assert [r.bytes_sent for r in t.ranks] == [656, 656]
