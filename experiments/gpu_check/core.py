"""What the GPU check's steps share: its sizes and budgets, the Check (device, output folder, budget, files,
sweeps on thread ranks) and small helpers."""

from __future__ import annotations

import json
import math
import shutil
import tarfile
import tempfile
import threading
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from experiments.gpu_check.text import format_summary

STEPS = ("environment", "collectives", "harness", "profiles", "strategies", "scaling")
PARAMS_TOLERANCE = 1e-5  # max |param - native's| after the strategies step's run (float32 sums in another order)
# The strategies step compares after 2 updates (steps = 2, one of them warm-up): on this ResNet-18 (batch 16, 32x32)
# the sums' order leaves every exact strategy within 1.2e-7 of native's after 2 updates, but a third update grows
# that to 6.6e-5 (halving_doubling, double_binary_tree; CPU, 2026-11-26) and 1.2e-4 on an H200: training amplifies
# the float32 rounding, which says nothing of the strategy. The collectives step checks each sync on its own.


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
    collective_workers: tuple[int, ...]  # the collectives step's world sizes
    collective_numels: tuple[int, ...]  # and sizes (elements)
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
             collective_workers=(1, 2, 3, 5, 7, 8), collective_numels=(3, 100_003),
             strategies_workload="resnet18", strategies_image=32, strategies_batch=16, strategies_steps=2,
             scaling_workload="resnet50", scaling_image=224, scaling_classes=1000, scaling_batch=32, scaling_steps=4,
             scaling_workers=(1, 2, 4), scaling_strategies=None, budgets_s=(45, 90, 70, 60, 75, 120), timeout_s=120)
TINY = Sizes(harness_workload="tiny", harness_image=16, harness_classes=10, harness_batch=4,
             harness_warmup=1, harness_timed=2, harness_rounds=1,
             profile_workloads=("tiny",), profile_image=16, profile_classes=10,
             profile_batches=(4, 8), profile_warmup=1, profile_timed=2,
             collective_workers=(1, 3), collective_numels=(2, 11),
             strategies_workload="tiny", strategies_image=16, strategies_batch=4, strategies_steps=2,
             scaling_workload="tiny", scaling_image=16, scaling_classes=10, scaling_batch=4, scaling_steps=2,
             scaling_workers=(1, 2, 4), scaling_strategies=("ring", "parameter_server", "native"),
             budgets_s=(30, 30, 30, 30, 60, 60), timeout_s=60)
GRACE_S = 45  # a step still running this long after its budget is left behind (recorded timed out)


class BudgetSpent(Exception):
    """A step's budget ran out between two units of its work: it stops there, keeping what it measured."""


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
        runs = run_sweep(parse_sweep(text), folder, log=self.log, substrate=Bounded(train_fn))
        return runs, Store(folder).steps()

    def close(self) -> None:
        self.log.close()
        shutil.rmtree(self.work, ignore_errors=True)


def parse_sweep(text: str):
    """A sweep file's text, parsed and validated as `syncbench run` does."""
    from experiments.config import sweep as sweep_mod

    return sweep_mod.parse(tomllib.loads(text), source=text)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA step is timed to its end, not to its launch)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


