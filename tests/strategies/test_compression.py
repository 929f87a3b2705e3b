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


@pytest.mark.parametrize("name", ["decentralized", "parameter_server", "ddp"])
def test_compression_on_a_strategy_that_does_not_average_gradients_is_refused(name):
    with pytest.raises(ValueError, match=rf"compression = 'fp16' applies to strategies that average gradients.*"
                                         rf"{name!r}"):
        strategies.make(name, compression="fp16")


def test_none_is_the_strategy_itself():
    assert strategies.make("ring", compression="none") == strategies.make("ring")
    assert type(strategies.make("ring", compression="fp16")).__name__ == "CompressedConfig"
