"""The GPU check's steps (experiments/gpu_check/__init__.py runs them, each bounded by its budget); the
collectives step is in collectives.py."""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import statistics
import subprocess
import time

import pandas as pd
import torch

from experiments.gpu_check.collectives import collectives  # noqa: F401 - a step, looked up here by name
from experiments.gpu_check.core import PARAMS_TOLERANCE, BudgetSpent, Check, parse_sweep, synchronize
from experiments.gpu_check.nccl import world_size_one

# -- the steps ---------------------------------------------------------------------------------------------------


def environment(check: Check) -> dict:
    """What ran the check: GPU, torch, CUDA, cuDNN, driver, and how long the first CUDA operation took."""
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "cores": os.cpu_count(), "host": platform.node(), "device": check.device,
            "cuda_available": torch.cuda.is_available()}
    start = time.perf_counter()
    x = torch.ones(1024, 1024, device=check.device)
    float((x @ x).sum())  # the first operation: context, kernels loaded (excluded from every later timing)
    info["first_op_s"] = time.perf_counter() - start
    if check.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, capability=f"{props.major}.{props.minor}",
                    gpu_memory_gib=props.total_memory / 2**30, multiprocessors=props.multi_processor_count,
                    gpus_visible=torch.cuda.device_count(), bf16_supported=torch.cuda.is_bf16_supported())
    else:
        from workloads.profile import cpu_model

        info["gpu"] = ""
        info["cpu"] = cpu_model()
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = (out.stdout or out.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi"] = f"failed: {e}"
    else:
        info["nvidia_smi"] = "not found"
    return info


def harness(check: Check) -> dict:
    """Plain PyTorch loops (bf16 + channels_last, fp32 + TF32) and syncbench's 1-worker run, alternated."""
    s = check.sizes
    result = {"workload": s.harness_workload, "image_size": s.harness_image, "num_classes": s.harness_classes,
              "batch_size": s.harness_batch, "warmup_steps": s.harness_warmup, "timed_steps": s.harness_timed,
              "tf32": True, "syncbench_precision": "fp32 (TF32 on): the product has no bf16/channels_last setting",
              "plain_bf16_channels_last": [], "plain_fp32": [], "syncbench_fp32": []}
    for round_ in range(s.harness_rounds):
        check.spend()
        result["plain_fp32"].append(_plain_loop(check, bf16=False))
        check.spend()
        result["syncbench_fp32"].append(_syncbench_run(check, f"harness-{round_}"))
        check.spend()
        result["plain_bf16_channels_last"].append(_plain_loop(check, bf16=True))
        check.partial(result)
    for key in ("plain_bf16_channels_last", "plain_fp32", "syncbench_fp32"):
        result[f"{key}_images_per_s"] = statistics.median(result[key])
    result["ratio_fp32"] = result["syncbench_fp32_images_per_s"] / result["plain_fp32_images_per_s"]
    result["target_ratio"] = 0.95
    return result


def _plain_loop(check: Check, bf16: bool) -> float:
    """The loop a user writes: model, SGD, cross-entropy on synthetic data on the device; images/s, the median
    of the timed steps after warm-up (each step ended by a synchronize)."""
    import torch.nn.functional as F

    from experiments.config.run import RunSpec
    from workloads.models import build_model

    s, device = check.sizes, torch.device(check.device)
    defaults = RunSpec()  # the same optimizer settings as the pipeline's run
    torch.manual_seed(0)
    model = build_model(s.harness_workload, num_classes=s.harness_classes, image_size=s.harness_image, seed=0)
    model = model.to(device, memory_format=torch.channels_last) if bf16 else model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=defaults.lr, momentum=defaults.momentum,
                                weight_decay=defaults.weight_decay)
    x = torch.randn(s.harness_batch, 3, s.harness_image, s.harness_image, device=device)
    x = x.contiguous(memory_format=torch.channels_last) if bf16 else x
    y = torch.randint(0, s.harness_classes, (s.harness_batch,), device=device)
    times = []
    for step in range(s.harness_warmup + s.harness_timed):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        synchronize(device)
        if step >= s.harness_warmup:
            times.append(time.perf_counter() - start)
    del model, optimizer, x, y
    return s.harness_batch / statistics.median(times)


def _syncbench_run(check: Check, name: str) -> float:
    """syncbench's 1-worker run of the same model and batch through the sweep, the runner and the store on thread
    ranks; images/s from the median timed step (compute + communication) of its steps table."""
    s = check.sizes
    text = _sweep_toml(name, s.harness_workload, s.harness_image, s.harness_classes, s.harness_batch,
                       s.harness_warmup + s.harness_timed, s.harness_warmup, check, strategies=["ring"], workers=[1])
    runs, steps = check.run_sweep(text, check.work / name)
    if runs.iloc[0]["status"] != "ok":
        raise RuntimeError(f"the harness run failed: {runs.iloc[0]['error']}")
    timed = steps[steps["timed"]]
    return s.harness_batch / statistics.median((timed["compute_s"] + timed["comm_s"]).tolist())


def profiles(check: Check) -> dict:
    """Measured compute profiles in the committed format, named with the device (packed as profiles.tar.gz)."""
    from workloads.profile import measure_profile, save_profile

    s = check.sizes
    folder = check.work / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    result = {"dtype": "float32 (TF32 on): the profile format records the gradients' dtype, not autocast",
              "profiles": []}
    tag = _device_tag(check.device)
    for workload in s.profile_workloads:
        for batch in s.profile_batches:
            check.spend()
            profile = measure_profile(workload, batch_size=batch, image_size=s.profile_image, device=check.device,
                                      num_classes=s.profile_classes, steps=s.profile_timed,
                                      warmup_steps=s.profile_warmup)
            name = f"{workload}-b{batch}-s{s.profile_image}-{tag}.json"  # as workloads/profiles/ names them
            save_profile(profile, folder / name)
            result["profiles"].append({"file": name, "id": profile.id, "device_name": profile.device_name,
                                       "forward_ms": profile.forward_s * 1e3, "backward_ms": profile.backward_s * 1e3,
                                       "optimizer_ms": profile.optimizer_s * 1e3, "step_ms": profile.step_s * 1e3,
                                       "images_per_s": batch / profile.step_s})
            check.pack(folder, "profiles.tar.gz")
            check.partial(result)
    return result


def strategies(check: Check) -> dict:
    """Every registered strategy on 4 thread ranks on the device; then world size 1 through NCCL (gloo on cpu)."""
    import strategies
    from experiments.pipeline.substrate import Run, ThreadSubstrate

    s = check.sizes
    names = list(strategies.registry.names())
    text = _sweep_toml("strategies", s.strategies_workload, s.strategies_image, 10, s.strategies_batch,
                       s.strategies_steps, 1, check, strategies=names, workers=[4])
    sweep = parse_sweep(text)
    substrate = ThreadSubstrate()
    refused = {}
    for spec in sweep.runs:
        if problems := substrate.problems(Run(spec.run_id, spec)):
            refused[spec.strategy] = "; ".join(problems)
    runnable = [n for n in names if n not in refused]
    rows = {n: {"strategy": n, "status": "not run on thread ranks", "message": refused[n]} for n in refused}
    finals: dict[str, torch.Tensor] = {}
    ok = True
    if runnable:
        text = _sweep_toml("strategies", s.strategies_workload, s.strategies_image, 10, s.strategies_batch,
                           s.strategies_steps, 1, check, strategies=runnable, workers=[4])
        with _deterministic(check.device):
            runs, _ = check.run_sweep(text, check.work / "strategies", keep=finals)
        check.pack(check.work / "strategies", "strategies.tar.gz")
        native = finals.get("native")
        moved = _moved(native, s.strategies_workload, s.strategies_image)
        for _, run in runs.iterrows():
            name = run["strategy"]
            row = {"strategy": name, "status": run["status"], "message": run["error"] or "",
                   "bytes_sent_per_worker": float(run["bytes_sent_per_worker"]),
                   "analytic_bytes_sent_per_worker": float(run["analytic_bytes_sent_per_worker"]),
                   "bytes_counted": bool(run["bytes_counted"])}
            row.update(_against_native(strategies.get(name), finals.get(name), native, name))
            ok &= row["status"] == "ok" and row["params"] in ("equal", "not compared", "native itself")
            rows[name] = row
        ok &= moved > 100 * PARAMS_TOLERANCE  # else "equal" would say nothing: the parameters barely trained
    result = {"workers": 4, "workload": s.strategies_workload, "image_size": s.strategies_image,
              "steps": s.strategies_steps, "tolerance": PARAMS_TOLERANCE,
              "native_moved_max_abs": moved if runnable else math.nan,
              "strategies": [rows[n] for n in names if n in rows]}
    check.partial(result)
    result["world_size_1"] = world_size_one(check)
    ok &= all(r["status"] == "ok" for r in result["world_size_1"])
    result["all_ok"] = bool(ok)
    return result


def _moved(native, workload: str, image_size: int) -> float:
    """How far native's final parameters are from the initial ones (max |difference|; NaN when unknown)."""
    from workloads.models import build_model

    if native is None:
        return math.nan
    start = torch.nn.utils.parameters_to_vector(
        build_model(workload, num_classes=10, image_size=image_size, seed=0).parameters()).detach()
    return float((native - start).abs().max()) if start.shape == native.shape else math.nan


def _against_native(config, params, native, name: str) -> dict:
    """Final parameters against native's: equal within PARAMS_TOLERANCE for an exact strategy."""
    if name == "native":
        return {"params": "native itself"}
    if params is None or native is None:
        return {"params": "missing", "params_max_abs_diff": math.nan}
    if not config.exact:
        diff = float((params - native).abs().max())
        return {"params": "not compared", "params_max_abs_diff": diff,
                "params_note": "not exact: averages parameters with neighbours"}
    if params.shape != native.shape:
        return {"params": f"different sizes {tuple(params.shape)} vs {tuple(native.shape)}"}
    diff = float((params - native).abs().max())
    return {"params": "equal" if diff <= PARAMS_TOLERANCE else "DIFFERENT", "params_max_abs_diff": diff}


def scaling(check: Check) -> dict:
    """The trimmed scaling sweep: 1, 2, 4 workers sharing the device, every strategy the thread ranks run."""
    import strategies
    from experiments.pipeline.substrate import Run, ThreadSubstrate

    s = check.sizes
    substrate = ThreadSubstrate()
    names = [n for n in s.scaling_strategies or strategies.registry.names()
             if not substrate.problems(Run("", parse_sweep(_sweep_toml(
                 "probe", s.scaling_workload, s.scaling_image, s.scaling_classes, s.scaling_batch, s.scaling_steps, 1,
                 check, strategies=[n], workers=[max(s.scaling_workers)])).runs[0]))]
    text = _sweep_toml("scaling", s.scaling_workload, s.scaling_image, s.scaling_classes, s.scaling_batch,
                       s.scaling_steps, 1, check, strategies=names, workers=list(s.scaling_workers))
    folder = check.work / "scaling"
    stopped = ""
    try:
        runs, _ = check.run_sweep(text, folder, budget=True)
    except BudgetSpent as e:  # the runs finished before it are stored (none: the runner removed the folder)
        from experiments.pipeline.store import Store

        stopped = str(e)
        runs = Store(folder).runs() if folder.exists() else pd.DataFrame(
            {"strategy": [], "workers": [], "status": [], "error": [], "throughput": []})
    finally:
        if folder.exists():
            check.pack(folder, "scaling.tar.gz")
    ok = runs[runs["status"] == "ok"]
    return {"workload": s.scaling_workload, "image_size": s.scaling_image, "batch_size": s.scaling_batch,
            "steps": s.scaling_steps, "workers": list(s.scaling_workers), "strategies": names,
            "runs": len(runs), "ok": len(ok), "stopped": stopped,
            "failed": [f"{r.strategy} x {r.workers}: {r.error[:300]}"
                       for r in runs[runs["status"] != "ok"].itertuples()],
            "images_per_s": {f"{r.strategy} x {r.workers}": float(r.throughput) for r in ok.itertuples()}}


# -- helpers --------------------------------------------------------------------------------------------------


def _sweep_toml(name, workload, image, classes, batch, steps, warmup, check: Check, strategies, workers) -> str:
    quoted = ", ".join(f'"{s}"' for s in strategies)
    return f"""
name = "{name}"
description = "the GPU check's {name} step"
[defaults]
workload = "{workload}"
image_size = {image}
num_classes = {classes}
batch_size = {batch}
steps = {steps}
warmup_steps = {warmup}
device = "{check.device}"
timeout = {check.sizes.timeout_s}
trace_steps = 0
[grid]
strategy = [{quoted}]
workers = [{", ".join(str(w) for w in workers)}]
[strategy_params.parameter_server]
servers = 1
"""


@contextlib.contextmanager
def _deterministic(device: str):
    """cuDNN's deterministic kernels and full fp32 (no TF32) while strategies are compared with native's: atomics
    and TF32's 10-bit rounding would turn the sums' different order into differences far above it."""
    cudnn = torch.backends.cudnn
    before = (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, torch.get_float32_matmul_precision())
    cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32 = True, False, False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32 = before[:3]
        torch.set_float32_matmul_precision(before[3])


def _device_tag(device: str) -> str:
    """A short name for files: the GPU's model (h200, h100, a100, ...) or cpu."""
    if device != "cuda":
        return "cpu"
    import re

    name = torch.cuda.get_device_name(0)
    match = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (match.group(1) if match else re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")).lower()


