"""What `syncbench verify` runs on each rank and checks afterwards, without Ray: the GPU check's collectives step
runs the same on thread ranks on a machine that has no Ray."""

from __future__ import annotations

import numpy as np
import torch

import strategies
from strategies.ops import BITWISE, LOGICAL
from strategies.testing import StrategyCheckError, check_identical, check_traffic, expected, make_inputs


def world_groups(settings, workers: int):
    """Strategy settings grouped by the world size they need (parameter servers need extra ranks)."""
    by_world: dict[int, list] = {}
    for setting in settings:
        name, params = setting if isinstance(setting, tuple) else (setting, {})
        by_world.setdefault(strategies.make(name, **params).world_size(workers), []).append(setting)
    return sorted(by_world.items())


def setting_label(name: str, params: dict) -> str:
    return name + "".join(f"[{k}={v}]" for k, v in params.items())


def verify_on_rank(ctx, settings, workers, numel, op, dtype_name, device: str = "cpu"):
    """Each setting once on this rank, inputs from strategies.testing.make_inputs (on `device`); what it ended
    with (on the host) and every counter (sent and received, bytes and messages) of that one call."""
    rows = []
    for name, params in settings:
        config = strategies.make(name, **params)
        runtime = config.bind(ctx.comm, workers)
        op_here, dtype = (op, np.dtype(dtype_name)) if config.exact else ("mean", np.dtype(np.float32))
        inputs = make_inputs(workers, numel, op_here, dtype)
        ctx.comm.reset_counters()
        if runtime.is_server:
            runtime.serve(numel, torch.from_numpy(inputs[0]).dtype, op_here)
            output = None
        else:
            x = torch.from_numpy(inputs[ctx.rank].copy()).to(device)
            runtime.sync(x, op_here)
            output = x.cpu().numpy()
        role = "server" if runtime.is_server else "worker"
        rows.append({"setting": setting_label(name, params), "rank": ctx.rank, "output": output,
                     "role": role, **ctx.comm.counters().as_dict()})
    return rows


def check_setting(name, params, workers, numel, op, dtype, rows) -> tuple[bool, float, str]:
    """The checks of strategies.testing on what the actors returned: the reference (exact for integers,
    min/max, logical and bitwise ops; relative 1e-5 x n for float sums), bitwise agreement between worker
    ranks, and every rank's bytes and messages, sent and received, against the analytic traffic."""
    config = strategies.make(name, **params)
    op_here, dtype = (op, dtype) if config.exact else ("mean", np.dtype(np.float32))
    inputs = make_inputs(workers, numel, op_here, dtype)
    outputs = [r["output"] for r in rows[:workers]]
    want = expected(config, inputs, op_here)
    error = max((float(np.max(np.abs(o.astype(np.float64) - np.asarray(w, np.float64)))) for o, w in
                 zip(outputs, want)), default=0.0) if numel else 0.0
    scale = max(float(np.max(np.abs(np.asarray(w, np.float64)))) for w in want) if numel else 1.0
    exact = op_here in ("min", "max") + LOGICAL + BITWISE or dtype.kind in "iub"
    tolerance = 0.0 if exact else 1e-5 * max(scale, 1.0) * max(workers, 1)
    problems = [] if error <= tolerance else [f"error {error:.3g} > {tolerance:.3g}"]
    case = f"{setting_label(name, params)} workers={workers} numel={numel} op={op_here} dtype={dtype}"
    for check in ((lambda: check_identical(outputs, case)) if config.identical else None,
                  lambda: check_traffic(config, workers, numel, dtype.itemsize, rows, case)):
        try:
            if check:
                check()
        except StrategyCheckError as e:
            problems.append(str(e).removeprefix(case + ": "))
    return not problems, error, "; ".join(problems)
