"""The GPU check's CPU dry run: every step of `python -m experiments.gpu_check` at tiny sizes on the CPU, writing
the files a GPU run returns, so the script cannot rot between GPU runs (docs/gpu.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from experiments import gpu_check
from experiments.gpu_check import core, measure

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The command as the device runs it (PYTHONPATH=., no install), on the CPU at tiny sizes."""
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "experiments.gpu_check", "--out", str(out), "--device", "cpu",
                           "--tiny"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    return proc, out, json.loads((out / "gpu_check.json").read_text())


def test_every_step_runs_and_is_recorded_ok(dry_run):
    proc, _, summary = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(summary["steps"]) == list(core.STEPS)
    for name, entry in summary["steps"].items():
        assert entry["status"] == "ok", (name, entry.get("error"))
        assert entry["seconds"] >= 0 and "result" in entry, name
    assert summary["finished_at"] >= summary["started_at"]


def test_the_files_fit_what_the_device_returns(dry_run):
    """At most 8 files, plain names, no folder, each under 16 MiB."""
    _, out, _ = dry_run
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check.json", "gpu_check.log", "gpu_check.md", "profiles.tar.gz", "scaling.tar.gz",
                     "strategies.tar.gz"], files
    for name in files:
        assert re.fullmatch(r"[A-Za-z0-9._-]+", name) and (out / name).stat().st_size < 16 * 2**20, name
    assert "## harness: ok" in (out / "gpu_check.md").read_text()


def test_the_harness_measures_both_loops_and_their_ratio(dry_run):
    result = dry_run[2]["steps"]["harness"]["result"]
    for key in ("plain_bf16_channels_last", "plain_fp32", "syncbench_fp32"):
        assert len(result[key]) == core.TINY.harness_rounds and all(v > 0 for v in result[key]), key
    assert result["ratio_fp32"] == pytest.approx(result["syncbench_fp32_images_per_s"] /
                                                 result["plain_fp32_images_per_s"])


def test_the_profiles_are_in_the_committed_format(dry_run, tmp_path):
    from workloads.profile import load_profile

    _, out, summary = dry_run
    with tarfile.open(out / "profiles.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    listed = summary["steps"]["profiles"]["result"]["profiles"]
    assert [p["file"] for p in listed] == [f"tiny-b{b}-s16-cpu.json" for b in core.TINY.profile_batches]
    for entry, batch in zip(listed, core.TINY.profile_batches):
        profile = load_profile(tmp_path / "profiles" / entry["file"])
        assert (profile.model, profile.batch_size, profile.device) == ("tiny", batch, "cpu")
        assert not profile.synthetic and profile.step_s * 1e3 == pytest.approx(entry["step_ms"])


def test_every_strategy_is_checked_against_native_and_its_traffic(dry_run):
    """Each registered strategy ran on 4 thread ranks (or says why not: ddp needs torch.distributed ranks), the
    pipeline's byte check passed and an exact strategy ends where native ends; world size 1 ran on gloo."""
    import strategies

    result = dry_run[2]["steps"]["strategies"]["result"]
    rows = {r["strategy"]: r for r in result["strategies"]}
    builtin = {n for n in strategies.registry.names() if strategies.get(n).__module__.startswith("strategies.")}
    assert builtin <= set(rows) and "ddp" in builtin  # (plug-ins too, where the subprocess sees them)
    assert rows["ddp"]["status"] == "not run on thread ranks" and "torch.distributed" in rows["ddp"]["message"]
    for name, row in rows.items():
        if name == "ddp" or name not in builtin:
            continue
        assert row["status"] == "ok", row
        if row["bytes_counted"]:
            assert row["bytes_sent_per_worker"] == row["analytic_bytes_sent_per_worker"] > 0, row
        expected = ("native itself" if name == "native" else "equal" if strategies.get(name).exact
                    else "not compared")
        assert row["params"] == expected, row
    assert [(r["backend"], r["strategy"], r["status"]) for r in result["world_size_1"]] == [
        ("gloo", "native", "ok"), ("gloo", "ddp", "ok")]
    assert result["native_moved_max_abs"] > 100 * result["tolerance"]  # "equal" is not vacuous
    assert result["all_ok"]


def test_the_scaling_sweep_is_a_results_directory(dry_run, tmp_path):
    from experiments.results.dataset import read_runs

    _, out, summary = dry_run
    result = summary["steps"]["scaling"]["result"]
    with tarfile.open(out / "scaling.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    runs = read_runs(tmp_path / "scaling")
    assert len(runs) == result["runs"] == result["ok"] == len(result["strategies"]) * 3
    assert set(runs["workers"]) == {1, 2, 4} and set(runs["device"]) == {"cpu"}
    assert (runs["status"] == "ok").all() and not result["stopped"]


def test_a_failing_step_is_recorded_and_the_next_one_still_runs(tmp_path, monkeypatch):
    def broken(check):
        raise RuntimeError("a broken step")

    monkeypatch.setattr(measure, "profiles", broken)
    summary = gpu_check.run_check(tmp_path, "cpu", tiny=True, steps=("profiles", "environment"))
    assert summary["steps"]["profiles"]["status"] == "failed"
    assert "RuntimeError: a broken step" in summary["steps"]["profiles"]["error"]
    assert summary["steps"]["environment"]["status"] == "ok"
    assert json.loads((tmp_path / "gpu_check.json").read_text())["steps"]["environment"]["status"] == "ok"


def test_a_spent_budget_stops_the_sweep_between_runs(tmp_path, monkeypatch):
    """Budget 0: the scaling step starts no run, says so, and the check goes on."""
    budgets = tuple(0 if s == "scaling" else b for s, b in zip(core.STEPS, core.TINY.budgets_s))
    monkeypatch.setattr(core, "TINY", dataclasses.replace(core.TINY, budgets_s=budgets))
    entry = gpu_check.run_check(tmp_path, "cpu", tiny=True, steps=("scaling",))["steps"]["scaling"]
    assert entry["status"] == "ok" and entry["result"]["runs"] == 0
    assert "budget was spent" in entry["result"]["stopped"]


def test_a_sweep_stopped_by_its_budget_keeps_and_packs_the_runs_before(tmp_path, monkeypatch):
    """The budget runs out before the third run: two runs are stored, packed and counted; the step is ok."""
    from experiments.results.dataset import read_runs

    calls = []

    def spend(check):
        calls.append(check.step)
        if len(calls) == 3:
            raise core.BudgetSpent(f"step {check.step}: its budget was spent; what it measured before is kept")

    monkeypatch.setattr(core.Check, "spend", spend)
    entry = gpu_check.run_check(tmp_path, "cpu", tiny=True, steps=("scaling",))["steps"]["scaling"]
    assert entry["status"] == "ok", entry.get("error")
    assert (entry["result"]["runs"], entry["result"]["ok"]) == (2, 2) and entry["result"]["stopped"]
    with tarfile.open(tmp_path / "scaling.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    assert len(read_runs(tmp_path / "unpacked" / "scaling")) == 2


@pytest.mark.parametrize("argv, names", [(["--device", "tpu"], "accepted are cuda and cpu"),
                                         (["--device", "cpu", "--steps", "harness,nope"], "nope")])
def test_bad_arguments_are_refused_before_any_step(tmp_path, argv, names, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "out"), *argv]) == 2
    assert names in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_device_tag_names_the_gpu_model(monkeypatch):
    import torch

    for name, tag in (("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-40GB", "a100")):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_, n=name: n)
        assert measure._device_tag("cuda") == tag, name
    assert measure._device_tag("cpu") == "cpu"


def test_thread_ranks_refuse_cuda_before_work_where_torch_sees_no_gpu(monkeypatch):
    """The thread substrate computes on the run's device; without a GPU a cuda run is refused, naming the value."""
    import torch

    from experiments.config.run import RunSpec
    from experiments.pipeline.substrate import Run, ThreadSubstrate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = RunSpec(workload="tiny", strategy="ring", workers=2, device="cuda")
    problems = ThreadSubstrate().problems(Run(spec.run_id, spec))
    assert any("device = 'cuda'" in p and "accepted here is device = 'cpu'" in p for p in problems), problems
    assert not ThreadSubstrate().problems(Run(spec.run_id, RunSpec(workload="tiny", strategy="ring", workers=2)))
