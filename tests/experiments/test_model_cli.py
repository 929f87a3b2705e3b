"""`syncbench model` and `syncbench profile --synthetic` (issue 24): strategy parameters, a measured or synthetic
profile overlapping buckets with backward (checked against a timeline computed by hand), Gbit/s beside MB/s,
inexact strategies marked, one num_classes default; synthetic profiles used by run and simulate; a refused sweep
leaves no directory behind."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from experiments.cli.main import main
from experiments.config import sweep as sweep_mod
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.substrate import ThreadSubstrate
from reports.model import MB, model_table
from strategies.transport.simgrid import simgrid_available
from workloads.models import DEFAULT_NUM_CLASSES, param_count
from workloads.profile import (
    ParamTiming,
    Profile,
    load_profile,
    measure_profile,
    save_profile,
    synthetic_profile,
)

ROOT = Path(__file__).resolve().parents[2]


def _run(capsys, *argv) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _rows(out: str) -> dict[str, list[str]]:
    """The model table's rows by strategy label, and its header under 'strategy'."""
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    return {line.split()[0]: line for line in lines}


# -- the model table ---------------------------------------------------------------------------------------------

def test_model_with_strategy_parameters_prints_gbit_beside_mb_and_marks_decentralized(capsys):
    status, out, err = _run(capsys, "model", "--model-bytes", "100MB", "--workers", "4", "--bandwidth", "8Gbit",
                            "--step-time", "0.1", "--strategy", "ring", "--strategy", "parameter_server:servers=2",
                            "--strategy", "decentralized")
    assert status == 0, err
    rows = _rows(out)
    assert "Gbit/s" in rows["strategy"] and "S for P=0.9 MB/s" in rows["strategy"]
    assert set(rows) == {"strategy", "ring", "parameter_server:servers=2", "decentralized"}
    assert "NOT an allreduce" in rows["decentralized"]
    assert "NOT" not in rows["ring"] and "NOT" not in rows["parameter_server:servers=2"]
    # ring: 150 MB on its path; S = 150 MB x 0.9 / (0.1 x 0.1) = 13,500 MB/s = 108 Gbit/s
    assert rows["ring"].split()[-2:] == ["13,500", "108.0"]


def test_model_sizes_a_workload_as_sweeps_do_and_says_so(capsys):
    status, out, _ = _run(capsys, "model", "--model", "resnet50", "--workers", "4", "--bandwidth", "10Gbit",
                          "--step-time", "0.1", "--strategy", "ring")
    assert status == 0
    classes = DEFAULT_NUM_CLASSES["resnet50"]
    assert sweep_mod.RunSpec().num_classes == classes  # the sweeps' default is the same one
    assert f"resnet50, {classes:,} classes: {param_count('resnet50', classes):,} parameters" in out
    status, out, _ = _run(capsys, "model", "--model", "resnet50", "--num-classes", "1000", "--workers", "4",
                          "--bandwidth", "10Gbit", "--step-time", "0.1", "--strategy", "ring")
    assert "1,000 classes: 25,557,032 parameters, 102.23 MB fp32" in out


def _two_bucket_profile() -> Profile:
    """forward 0.1 s, backward 0.2 s; a 20 MB gradient ready 0.05 s into backward, a 10 MB one at its end."""
    return Profile(model="tiny", batch_size=8, image_size=16, num_classes=10, dtype="float32", device="cpu",
                   device_name="hand-made", host="test", torch_version="0", threads=1, measured_at="2026-01-01",
                   steps=1, warmup_steps=0, forward_s=0.1, backward_s=0.2, optimizer_s=0.0,
                   params=(ParamTiming("first", 2_500_000, 0.2), ParamTiming("last", 5_000_000, 0.05)))


def test_model_overlap_from_a_profile_follows_the_timeline_by_hand():
    # ring on 2 workers moves d per bucket; at 100 MB/s the 20 MB bucket runs 0.05-0.25 s into backward, the
    # 10 MB one 0.25-0.35 s: exposed 0.15 s, P = 0.3 / 0.45. For P = 0.9 the exposed time may be 0.3/9 s: the
    # last bucket alone (10 MB) in that time, 300 MB/s.
    row = model_table(None, None, workers=2, bandwidth=100 * MB, step_time=None, strategies=["ring"],
                      profile=_two_bucket_profile(), bucket_mb=1).iloc[0]
    assert row["comm_s"] == pytest.approx(0.3) and row["exposed_s"] == pytest.approx(0.15)
    assert row["efficiency"] == pytest.approx(0.3 / 0.45)
    assert row["bandwidth_needed"] == pytest.approx(300 * MB, rel=1e-6)
    flat = model_table(None, None, workers=2, bandwidth=100 * MB, step_time=None, strategies=["ring"],
                       profile=_two_bucket_profile(), bucket_mb=None).iloc[0]
    assert flat["exposed_s"] == pytest.approx(0.3)  # one flat bucket waits for the whole backward


def test_model_with_a_measured_profile_and_a_synthetic_one(capsys, tmp_path):
    measured = save_profile(measure_profile("tiny", batch_size=4, image_size=8, steps=1, warmup_steps=0),
                            tmp_path / "tiny.json")
    status, out, err = _run(capsys, "model", "--profile", str(measured), "--workers", "4", "--bandwidth", "1Gbit",
                            "--strategy", "ring", "--strategy", "decentralized")
    assert status == 0, err
    assert "# measured profile tiny-b4-s8-cpu-" in out and "exposed s" in _rows(out)["strategy"]
    status, out, err = _run(capsys, "model", "--model", "vgg16", "--overlap", "--step-time", "0.25", "--workers",
                            "16", "--bandwidth", "25Gbit", "--strategy", "ring")
    assert status == 0, err
    assert "SYNTHETIC profile" in out and "vgg16-b32-s224-synthetic-" in out
    overlapped = _rows(out)["ring"].split()
    status, out, _ = _run(capsys, "model", "--model", "vgg16", "--step-time", "0.25", "--workers", "16",
                          "--bandwidth", "25Gbit", "--strategy", "ring")
    plain = _rows(out)["ring"].split()
    assert float(overlapped[7]) > float(plain[6])  # P: buckets overlapped with backward hide part of the sync


@pytest.mark.parametrize("argv, named", [
    (["--profile", "x.json", "--step-time", "0.1"], "--profile gives the model"),
    (["--model", "vgg16", "--overlap"], "--overlap needs --step-time"),
    (["--model-bytes", "1MB", "--overlap", "--step-time", "0.1"], "--overlap needs --model"),
    (["--model", "vgg16", "--num-classes", "1", "--step-time", "0.1"], "bad num_classes 1"),
    (["--model-bytes", "1MB", "--num-classes", "1000", "--step-time", "0.1"], "--num-classes sizes a --model"),
])
def test_model_refusals_name_the_option(capsys, argv, named):
    status = main(["model", *argv, "--workers", "4", "--bandwidth", "1Gbit"])
    err = capsys.readouterr().err
    assert status == 2 and named in err and err.count("\n") == 1, err


# -- synthetic profiles ------------------------------------------------------------------------------------------

def test_synthetic_vgg16_readies_most_bytes_first_and_sums_to_the_step_time():
    profile = synthetic_profile("vgg16", 0.25)
    assert profile.forward_s + profile.backward_s + profile.optimizer_s == pytest.approx(0.25, abs=1e-12)
    early = sum(n for n, ready in zip(profile.numels, profile.ready_s) if ready <= 0.15 * profile.backward_s)
    assert early / profile.numel >= 0.85  # the fully connected layers: most bytes, little backward work
    assert max(profile.ready_s) == pytest.approx(profile.backward_s)  # the first conv layer is the last ready
    split = synthetic_profile("resnet18", 1.0, image_size=32, split=(1, 2, 1))
    assert (split.forward_s, split.backward_s, split.optimizer_s) == pytest.approx((0.25, 0.5, 0.25))


def test_a_synthetic_profile_is_labelled_and_a_measured_one_keeps_its_file(tmp_path):
    profile = synthetic_profile("tiny", 0.05, batch_size=8, image_size=16)
    path = save_profile(profile, tmp_path / "p.json")
    assert json.loads(path.read_text())["synthetic"] is True
    loaded = load_profile(path)
    assert loaded.synthetic and "-synthetic-" in loaded.id and loaded.device_name.startswith("synthetic")
    measured = measure_profile("tiny", batch_size=2, image_size=8, steps=1, warmup_steps=0)
    assert "synthetic" not in measured.as_dict() and "-cpu-" in measured.id  # old files and ids unchanged


def test_profile_synthetic_command_writes_and_labels_it(capsys, tmp_path):
    out_file = tmp_path / "vgg.json"
    status, out, err = _run(capsys, "profile", "--synthetic", "--workload", "tiny", "--step-time", "0.2",
                            "--image-size", "16", "--split", "1,3,0", "--out", str(out_file))
    assert status == 0, err
    assert "SYNTHETIC (not measured)" in out and "tiny, 10 classes" in out
    profile = load_profile(out_file)
    assert profile.synthetic and profile.backward_s == pytest.approx(0.15)
    assert main(["profile", "--synthetic", "--workload", "tiny"]) == 2
    assert "--synthetic needs --step-time" in capsys.readouterr().err
    assert main(["profile", "--workload", "tiny", "--batch-size", "2", "--step-time", "1"]) == 2
    assert "only with --synthetic" in capsys.readouterr().err


SWEEP = """
name = "synthetic"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 2
warmup_steps = 1
link = {{ bandwidth = "1Gbit", latency = "50us" }}
compute = "profile"
profile = "{profile}"
[grid]
strategy = ["ring"]
workers = [2]
"""


def test_a_synthetic_profile_replays_in_a_run_and_a_simulation(tmp_path):
    path = save_profile(synthetic_profile("tiny", 0.03, batch_size=8, image_size=16, device="cpu"),
                        tmp_path / "synthetic.json")
    text = SWEEP.format(profile=path)
    runs = run_sweep(sweep_mod.parse(tomllib.loads(text), source=text), tmp_path / "run", log=io.StringIO(),
                     substrate=ThreadSubstrate())
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    assert runs["profile_id"].str.contains("-synthetic-").all()
    assert runs["profile_device"].str.startswith("synthetic").all()
    assert runs["profile_synthetic"].all()  # a typed fact: the report calls it synthetic, never measured
    if simgrid_available():
        return  # SimGrid's Python module is missing here (CI installs it)
    from experiments.simulate.substrate import simulate_sweep

    sim = text.replace(f'compute = "profile"\nprofile = "{path}"\n', "") + f'[simulate]\nprofile = "{path}"\n'
    (tmp_path / "sim.toml").write_text(sim)
    simulated = simulate_sweep(tmp_path / "sim.toml", tmp_path / "sim", log=io.StringIO())
    assert (simulated["status"] == "ok").all(), simulated["error"].tolist()
    assert simulated["profile_id"].str.contains("-synthetic-").all()
    assert simulated["profile_synthetic"].all()
    assert simulated["compute_source"].str.startswith("SYNTHETIC profile (described, not measured)").all()


def test_a_refused_sweep_leaves_no_directory_behind(tmp_path):
    sweep = tmp_path / "big.toml"
    sweep.write_text('name = "big"\n[defaults]\nworkload = "tiny"\nsteps = 1\nwarmup_steps = 0\n'
                     '[grid]\nstrategy = ["ring"]\nworkers = [64]\n')
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # refused by this machine's limits
    done = subprocess.run([sys.executable, "-m", "experiments", "run", str(sweep), "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "64 ranks" in done.stderr, done.stderr
    assert not out.exists()


def test_model_takes_several_workers_and_needs_no_step_time_for_bytes_and_times(capsys):
    """One table over n (a curve cost a call per n); without --step-time: bytes and times, P and S left out."""
    from experiments.cli.main import main

    assert main(["model", "--model", "resnet18", "--workers", "2,4", "--workers", "8", "--bandwidth", "10Gbit",
                 "--strategy", "ring"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("ring")]
    assert [int(r[1]) for r in rows] == [2, 4, 8]
    assert all(float(r[4]) > 0 and r[6:10] == ["-", "-", "-", "-"] for r in rows), rows  # comm s given, P/S not
    assert "Ts not given" in out
    assert main(["model", "--model", "resnet18", "--workers", "2,x", "--bandwidth", "10Gbit"]) == 2
    assert "--workers 'x'" in capsys.readouterr().err
