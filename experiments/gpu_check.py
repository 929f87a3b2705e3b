"""The GPU check: one command that measures what a single GPU can say about syncbench, step by step.

    python3 -m experiments.gpu_check --out DIR [--device cuda|cpu] [--tiny]

Steps, cheapest and most valuable first, each time-boxed and written to DIR as soon as it ends:
  environment  the GPU, torch, CUDA, cuDNN, the driver (nvidia-smi) and the first CUDA operation's time
  harness      ResNet-50 224x224, 1,000 classes, batch 128: a plain PyTorch loop (bf16 autocast + channels_last,
               and fp32 with TF32) against syncbench's 1-worker run through the pipeline on thread ranks (fp32:
               the product has no precision setting); images/s of each and their ratio
  profiles     `syncbench profile --device cuda`'s measurement for ResNet-50 and VGG-16 at 224, batch 32/64/128,
               fp32 (the profile format records the gradients' dtype; autocast is not recordable), named with the GPU
  strategies   every registered strategy on 4 thread ranks sharing the device (ResNet-18): the pipeline's own checks
               (bytes equal traffic(), ranks agree) and final parameters against native's; then native and ddp at
               world size 1 through NCCL (gloo on cpu) in a child process
  scaling      ResNet-50 at 224 on 1, 2 and 4 thread-rank workers sharing the device, every strategy the thread
               substrate runs, a few steps: a normal results directory, packed as scaling.tar.gz

It needs no Ray, plotly or jsonschema (the thread substrate, the pipeline, the store and the profiler only), and
runs on the machine's own torch with PYTHONPATH=. . Files written to DIR (at most 8, each small):
gpu_check.json (every step's status, seconds, error and numbers, rewritten after each step), gpu_check.md (the
same as plain tables), gpu_check.log (the runs' progress lines), profiles.tar.gz, strategies.tar.gz and
scaling.tar.gz (results directories). `--tiny` shrinks every size (the CPU dry run in the test suite).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import tomllib
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

STEPS = ("environment", "harness", "profiles", "strategies", "scaling")
PARAMS_TOLERANCE = 1e-5  # max |param - native's| after the strategies step's run (float32 sums in another order)


@dataclass(frozen=True)
class Sizes:
    """Every size the check uses; FULL on the GPU, TINY for the CPU dry run."""

    harness_workload: str
    harness_image: int
    harness_classes: int
    harness_batch: int
    harness_warmup: int
    harness_timed: int
    harness_rounds: int  # plain and syncbench alternate this many times (drift hits both alike)
    profile_workloads: tuple[str, ...]
    profile_image: int
    profile_classes: int
    profile_batches: tuple[int, ...]
    profile_warmup: int
    profile_timed: int
    strategies_workload: str
    strategies_image: int
    strategies_batch: int
    strategies_steps: int
    scaling_workload: str
    scaling_image: int
    scaling_classes: int
    scaling_batch: int
    scaling_steps: int
    scaling_workers: tuple[int, ...]
    scaling_strategies: tuple[str, ...] | None  # None: every strategy the thread ranks run
    budgets_s: tuple[float, ...]  # per step, in STEPS' order: a step starts no new unit of work after its budget
    timeout_s: float  # every wait of a run


FULL = Sizes(harness_workload="resnet50", harness_image=224, harness_classes=1000, harness_batch=128,
             harness_warmup=5, harness_timed=10, harness_rounds=2,
             profile_workloads=("resnet50", "vgg16"), profile_image=224, profile_classes=1000,
             profile_batches=(32, 64, 128), profile_warmup=2, profile_timed=5,
             strategies_workload="resnet18", strategies_image=32, strategies_batch=16, strategies_steps=3,
             scaling_workload="resnet50", scaling_image=224, scaling_classes=1000, scaling_batch=32, scaling_steps=4,
             scaling_workers=(1, 2, 4), scaling_strategies=None, budgets_s=(45, 75, 60, 75, 135), timeout_s=120)
TINY = Sizes(harness_workload="tiny", harness_image=16, harness_classes=10, harness_batch=4,
             harness_warmup=1, harness_timed=2, harness_rounds=1,
             profile_workloads=("tiny",), profile_image=16, profile_classes=10,
             profile_batches=(4, 8), profile_warmup=1, profile_timed=2,
             strategies_workload="tiny", strategies_image=16, strategies_batch=4, strategies_steps=2,
             scaling_workload="tiny", scaling_image=16, scaling_classes=10, scaling_batch=4, scaling_steps=2,
             scaling_workers=(1, 2, 4), scaling_strategies=("ring", "parameter_server", "native"),
             budgets_s=(30, 30, 30, 60, 60), timeout_s=60)
GRACE_S = 45  # a step still running this long after its budget is left behind (recorded timed out)


class BudgetSpent(Exception):
    """A step's budget ran out between two units of its work: it stops there, keeping what it measured."""


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
        _synchronize(device)
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
            name = f"{workload}_{tag}_b{batch}.json"
            save_profile(profile, folder / name)
            result["profiles"].append({"file": name, "id": profile.id, "device_name": profile.device_name,
                                       "forward_ms": profile.forward_s * 1e3, "backward_ms": profile.backward_s * 1e3,
                                       "optimizer_ms": profile.optimizer_s * 1e3, "step_ms": profile.step_s * 1e3,
                                       "images_per_s": batch / profile.step_s})
            check.pack(folder, "profiles.tar.gz")
            check.partial(result)
    return result


def strategies_step(check: Check) -> dict:
    """Every registered strategy on 4 thread ranks on the device; then world size 1 through NCCL (gloo on cpu)."""
    import strategies
    from experiments.pipeline.substrate import Run, ThreadSubstrate

    s = check.sizes
    names = list(strategies.registry.names())
    text = _sweep_toml("strategies", s.strategies_workload, s.strategies_image, 10, s.strategies_batch,
                       s.strategies_steps, 1, check, strategies=names, workers=[4])
    sweep = _parse(text)
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
        for _, run in runs.iterrows():
            name = run["strategy"]
            row = {"strategy": name, "status": run["status"], "message": run["error"] or "",
                   "bytes_sent_per_worker": float(run["bytes_sent_per_worker"]),
                   "analytic_bytes_sent_per_worker": float(run["analytic_bytes_sent_per_worker"]),
                   "bytes_counted": bool(run["bytes_counted"])}
            row.update(_against_native(strategies.get(name), finals.get(name), native, name))
            ok &= row["status"] == "ok" and row["params"] in ("equal", "not compared", "native itself")
            rows[name] = row
    result = {"workers": 4, "workload": s.strategies_workload, "image_size": s.strategies_image,
              "steps": s.strategies_steps, "tolerance": PARAMS_TOLERANCE,
              "strategies": [rows[n] for n in names if n in rows]}
    check.partial(result)
    result["world_size_1"] = _world_size_one(check)
    ok &= all(r["status"] == "ok" for r in result["world_size_1"])
    result["all_ok"] = bool(ok)
    return result


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


def _world_size_one(check: Check) -> list[dict]:
    """native and ddp on one rank through torch.distributed: NCCL on cuda (what one GPU can test), gloo on cpu.
    In a child process, so the process group does not outlive it."""
    backend = "nccl" if check.device == "cuda" else "gloo"
    out = check.work / "world_size_1.json"
    spec = {"workload": check.sizes.strategies_workload, "image_size": check.sizes.strategies_image,
            "batch_size": check.sizes.strategies_batch, "steps": check.sizes.strategies_steps, "warmup_steps": 1,
            "device": check.device, "timeout": check.sizes.timeout_s}
    code = ("import json, sys; from experiments.gpu_check import world_size_one_child as c; "
            "c(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([sys.executable, "-c", code, backend, json.dumps(spec), str(out)], env=env,
                              capture_output=True, text=True, timeout=max(30.0, check.left() + GRACE_S / 2))
    except subprocess.TimeoutExpired:
        return [{"backend": backend, "strategy": "native, ddp", "status": "failed", "message": "timed out"}]
    if out.exists():
        return json.loads(out.read_text())
    return [{"backend": backend, "strategy": "native, ddp", "status": "failed",
             "message": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}]


def world_size_one_child(backend: str, settings: dict, out: str) -> None:
    """In the child: one rank joins a process group of `backend`; native's sync and ddp's training run through it
    and the pipeline's summary checks them. Writes one row per strategy to `out`."""
    import datetime as dt

    import torch.distributed as dist

    from experiments.config.run import RunSpec
    from experiments.pipeline.summary import summarize
    from experiments.pipeline.train import train
    from strategies.transport.torch_dist import TorchCommunicator

    torch.set_num_threads(1)
    device = settings["device"]
    if backend == "nccl":
        torch.cuda.set_device(0)
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=dt.timedelta(seconds=60))
    control = dist.new_group(backend="gloo") if backend == "nccl" else None
    rows = []
    try:
        comm = TorchCommunicator(0, 1, settings["timeout"], control_group=control)
        import strategies

        for name in ("native", "ddp"):
            row = {"backend": backend, "strategy": name}
            try:
                if name == "native":  # the backend's allreduce on one rank: a tensor of the device comes back as is
                    runtime = strategies.make("native").bind(comm, 1)
                    x = torch.arange(1000, dtype=torch.float32, device=device)
                    y = x.clone()
                    runtime.sync(y, "sum")
                    _synchronize(torch.device(device))
                    if not torch.equal(x, y):
                        raise AssertionError(f"native allreduce on one rank changed the tensor: {y[:5]}")
                spec = RunSpec(strategy=name, workers=1, **settings)
                ctx = _Ctx(0, 1, comm, device)
                started = time.perf_counter()
                result = train(ctx, spec)
                meta = {"started_at": "", "duration_s": time.perf_counter() - started, "transport": backend,
                        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "", "cores": os.cpu_count(),
                        "host": platform.node(), "substrate": f"torch.distributed {backend}, world size 1"}
                run, _ = summarize(spec, [result], "", meta)
                row.update(status=run["status"], message=run["error"] or "",
                           images_per_s=float(run["throughput"]))
            except Exception as e:  # noqa: BLE001 - recorded, the next strategy still runs
                row.update(status="failed", message=f"{type(e).__name__}: {e}")
            rows.append(row)
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps(rows, indent=1))


@dataclass
class _Ctx:
    rank: int
    world_size: int
    comm: object
    device: str
    state: dict | None = None

    def __post_init__(self):
        self.state = {}


def scaling(check: Check) -> dict:
    """The trimmed scaling sweep: 1, 2, 4 workers sharing the device, every strategy the thread ranks run."""
    import strategies
    from experiments.pipeline.substrate import Run, ThreadSubstrate

    s = check.sizes
    substrate = ThreadSubstrate()
    names = [n for n in s.scaling_strategies or strategies.registry.names()
             if not substrate.problems(Run("", _parse(_sweep_toml(
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


# -- the check: budgets, files, the runs --------------------------------------------------------------------------


class Check:
    """The state the steps share: device, sizes, output folder, the current step's deadline, the log."""

    def __init__(self, out: Path, device: str, sizes: Sizes):
        self.out, self.device, self.sizes = out, device, sizes
        self.work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
        self.summary = {"device": device, "sizes": asdict(sizes), "started_at": _now(), "steps": {}}
        self.step = ""
        self.deadline = math.inf
        self.log = open(out / "gpu_check.log", "a", buffering=1)  # noqa: SIM115 - open for the whole check
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spend(self) -> None:
        """Between two units of work: stop the step if its budget is spent."""
        if self.left() <= 0:
            raise BudgetSpent(f"step {self.step}: its budget was spent; what it measured before is kept")

    def partial(self, result: dict) -> None:
        """A step's results so far, written at once (a later failure or timeout keeps them)."""
        self.record(self.step, {"status": "running", "result": result})

    def record(self, step: str, entry: dict) -> None:
        with self.lock:
            self.summary["steps"][step] = {**self.summary["steps"].get(step, {}), **entry}
            self.summary["updated_at"] = _now()
            _write_atomic(self.out / "gpu_check.json", json.dumps(self.summary, indent=1, default=_jsonable))
            _write_atomic(self.out / "gpu_check.md", format_summary(self.summary))

    def pack(self, folder: Path, name: str) -> None:
        tmp = self.out / f".{name}.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(folder, arcname=folder.name)
        tmp.replace(self.out / name)

    def run_sweep(self, text: str, folder: Path, keep: dict | None = None, budget: bool = False):
        """One sweep through the runner and the store on thread ranks on the device; its runs and steps tables.
        `keep`: rank 0's final parameters by strategy (on the host). `budget`: no new run after the step's
        budget (BudgetSpent, the finished runs stored)."""
        from experiments.pipeline.runner import run_sweep
        from experiments.pipeline.store import Store
        from experiments.pipeline.substrate import ThreadSubstrate
        from experiments.pipeline.train import train

        check = self

        def train_fn(ctx, spec):
            result = train(ctx, spec)
            if keep is not None and ctx.rank == 0:
                keep[spec.strategy] = ctx.state["params"].detach().to("cpu", copy=True)
            return result

        class Bounded(ThreadSubstrate):
            def _execute(self, run):
                if budget:  # the runs stored so far packed first: a kill during this run keeps them
                    if any(folder.rglob("*.parquet")):
                        check.pack(folder, f"{folder.name}.tar.gz")
                    check.spend()
                return super()._execute(run)

        print(f"# {self.step}: {folder.name}", file=self.log)
        runs = run_sweep(_parse(text), folder, log=self.log, substrate=Bounded(train_fn))
        return runs, Store(folder).steps()

    def close(self) -> None:
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def run_check(out: str | Path, device: str = "cuda", tiny: bool = False, steps: tuple[str, ...] = STEPS) -> dict:
    """Run the steps in order, each in a thread of its own bounded by its budget plus a grace; return the summary
    (also in out/gpu_check.json). A step that fails or times out is recorded and the next one runs."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"--device {device!r}: accepted are cuda and cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no CUDA GPU on this machine; accepted here is --device cpu")
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise ValueError(f"--steps {','.join(unknown)}: accepted are {', '.join(STEPS)}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)  # as syncbench's workers compute; the GPU does the work
    torch.set_float32_matmul_precision("high")  # TF32 matmuls (cuDNN's convolutions use TF32 by default)
    check = Check(out, device, TINY if tiny else FULL)
    functions = {"environment": environment, "harness": harness, "profiles": profiles,
                 "strategies": strategies_step, "scaling": scaling}
    try:
        for name in steps:
            budget = check.sizes.budgets_s[STEPS.index(name)]
            check.step, check.deadline = name, time.monotonic() + budget
            check.record(name, {"status": "running", "budget_s": budget})
            print(f"[gpu-check] {name} (budget {budget:.0f} s) ...", flush=True)
            entry = _run_step(functions[name], check, budget + GRACE_S)
            check.record(name, entry)
            print(f"[gpu-check] {name}: {entry['status']} in {entry['seconds']:.1f} s"
                  + (f": {entry['error'].splitlines()[-1]}" if entry.get("error") else ""), flush=True)
            if entry["status"] == "timed out":
                break  # its thread still holds the device: later timings would not be honest
    finally:
        check.summary["finished_at"] = _now()
        check.record(check.step, {})  # rewrites the files with the finishing time
        check.close()
    return check.summary


def _run_step(fn, check: Check, limit: float) -> dict:
    box: dict = {}

    def target():
        try:
            box["result"] = fn(check)
        except BudgetSpent as e:
            box["error"] = str(e)
            box["status"] = "budget spent"
        except BaseException as e:  # noqa: BLE001 - recorded; the next step runs
            box["error"] = "".join(traceback.format_exception(e))[-4000:]
            box["status"] = "failed"

    start = time.perf_counter()
    thread = threading.Thread(target=target, name=f"gpu-check-{check.step}", daemon=True)
    thread.start()
    thread.join(limit)
    seconds = time.perf_counter() - start
    if thread.is_alive():
        return {"status": "timed out", "seconds": seconds,
                "error": f"still running {limit:.0f} s after it started (budget + {GRACE_S} s grace)"}
    entry = {"status": box.get("status", "ok"), "seconds": seconds}
    if "result" in box:
        entry["result"] = box["result"]
    if "error" in box:
        entry["error"] = box["error"]
    return entry


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


def _parse(text: str):
    from experiments.config import sweep as sweep_mod

    return sweep_mod.parse(tomllib.loads(text), source=text)


@contextlib.contextmanager
def _deterministic(device: str):
    """cuDNN's deterministic kernels while strategies are compared with native's (its atomics would add noise)."""
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        yield
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_tag(device: str) -> str:
    """A short name for files: the GPU's model (h200, h100, a100, ...) or cpu."""
    if device != "cuda":
        return "cpu"
    import re

    name = torch.cuda.get_device_name(0)
    match = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", name.replace("NVIDIA", ""))
    return (match.group(1) if match else re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")).lower()


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def format_summary(summary: dict) -> str:
    """The summary as plain tables to paste into an issue."""
    lines = [f"# syncbench GPU check on {summary['device']} (started {summary['started_at']})", ""]
    for name, entry in summary["steps"].items():
        seconds = entry.get("seconds")
        lines.append(f"## {name}: {entry.get('status')}" + (f" ({seconds:.1f} s)" if seconds is not None else ""))
        if entry.get("error"):
            lines.append("    " + entry["error"].strip().splitlines()[-1])
        result = entry.get("result") or {}
        if name == "environment":
            lines += [f"    {k}: {v}" for k, v in result.items()]
        elif name == "harness" and "ratio_fp32" in result:
            lines += [f"    plain bf16 + channels_last: {result['plain_bf16_channels_last_images_per_s']:.1f} images/s",
                      f"    plain fp32 (TF32):          {result['plain_fp32_images_per_s']:.1f} images/s",
                      f"    syncbench fp32 (TF32):      {result['syncbench_fp32_images_per_s']:.1f} images/s",
                      f"    ratio syncbench / plain, fp32: {result['ratio_fp32']:.3f} (target >= 0.95)"]
        elif name == "profiles":
            lines += [f"    {p['file']:<28} step {p['step_ms']:8.2f} ms  fwd {p['forward_ms']:7.2f}  "
                      f"bwd {p['backward_ms']:7.2f}  opt {p['optimizer_ms']:6.2f}  {p['images_per_s']:8.1f} img/s"
                      for p in result.get("profiles", [])]
        elif name == "strategies":
            for r in result.get("strategies", []):
                diff = r.get("params_max_abs_diff")
                lines.append(f"    {r['strategy']:<22} {r['status']:<24} params {r.get('params', '-'):<13} "
                             f"{'' if diff is None else f'max|diff| {diff:.2e}'} {r.get('message', '')[:160]}")
            for r in result.get("world_size_1", []):
                lines.append(f"    world size 1 {r['backend']} {r['strategy']:<8} {r['status']} "
                             f"{r.get('message', '')[:200]}")
        elif name == "scaling" and "runs" in result:
            lines.append(f"    {result['ok']} of {result['runs']} runs ok {result['stopped']}")
            lines += [f"    {k:<28} {v:10.1f} images/s" for k, v in result["images_per_s"].items()]
            lines += [f"    FAILED {f}" for f in result["failed"]]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the results (created)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny sizes, 2 steps (the CPU dry run)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"which steps, in order (default {','.join(STEPS)})")
    args = p.parse_args(argv)
    try:
        summary = run_check(args.out, args.device, args.tiny, tuple(s for s in args.steps.split(",") if s))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_summary(summary), flush=True)
    statuses = [e.get("status") for e in summary["steps"].values()]
    if "timed out" in statuses:  # a step's thread may still hold the device: leave without waiting for it
        sys.stderr.flush()
        os._exit(1)
    return 0 if all(s == "ok" for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
