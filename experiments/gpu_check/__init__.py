"""The GPU check: one command that measures what a single GPU can say about syncbench, step by step.

    python3 -m experiments.gpu_check --out DIR [--device cuda|cpu] [--tiny]

The steps are in measure.py (world size 1 through NCCL in nccl.py), the plain tables in text.py.

Steps, cheapest and most valuable first, each time-boxed and written to DIR as soon as it ends:
  environment  the GPU, torch, CUDA, cuDNN, the driver (nvidia-smi) and the first CUDA operation's time
  collectives  every strategy's one sync on device tensors at world sizes 1, 2, 3, 5, 7, 8 and sizes 3 and
               100,003 (sum, max): a float64 reference, ranks agreeing, bytes equal to traffic() (as verify)
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
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

from experiments.gpu_check import core, measure
from experiments.gpu_check.core import GRACE_S, STEPS, BudgetSpent, Check, _now
from experiments.gpu_check.text import format_summary


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
    threads, precision = torch.get_num_threads(), torch.get_float32_matmul_precision()
    torch.set_num_threads(1)  # as syncbench's workers compute; the GPU does the work
    torch.set_float32_matmul_precision("high")  # TF32 matmuls (cuDNN's convolutions use TF32 by default)
    check = Check(out, device, core.TINY if tiny else core.FULL)
    functions = {name: getattr(measure, name) for name in STEPS}  # looked up now: a test may replace one
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
        torch.set_num_threads(threads)  # the caller's process as it was (a test suite runs on after it)
        torch.set_float32_matmul_precision(precision)
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


