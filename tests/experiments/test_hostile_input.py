"""Careless and hostile input (issue 12): every class of defect gets a clear error before any actor starts,
results stay under results/ or --out, nothing waits unbounded, and no wrong result is recorded as ok.

Almost everything here is validation and needs no Ray; the few that do are marked `ray`.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from experiments.cli.main import main
from experiments.cluster.limits import Capacity, LimitError, check_capacity
from experiments.config import sweep as sweep_mod
from experiments.config.sweep import MAX_RUNS, RANGES, RunSpec, SweepError
from experiments.pipeline import runner
from experiments.pipeline.store import Store, StoreError, default_dir
from experiments.pipeline.summary import summarize
from workloads.profile import ProfileError, load_profile

REPO = Path(__file__).resolve().parents[2]

BASE = """
name = "hostile"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 3
warmup_steps = 1
workers = 2
strategy = "ring"
"""


def load(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(text))
    return sweep_mod.load(path)


def refused(tmp_path, text: str) -> str:
    with pytest.raises(SweepError) as info:
        load(tmp_path, text)
    return str(info.value)


# -- 1. results stay where they belong ----------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("quick", "quick"), ("/tmp/x/deep", "tmp_x_deep"), ("../../x", "x"), ("..", "sweep"), (".", "sweep"),
    ("a b/c\\d", "a_b_c_d"), ("~/x", "x"), ("x" * 300, "x" * 100),
])
def test_a_sweep_name_never_chooses_a_path_outside_results(name, expected):
    path, note = default_dir(name)
    assert path == Path("results") / expected
    assert path.resolve().is_relative_to(Path("results").resolve())
    assert (note == "") == (name == expected)
    if note:
        assert repr(name) in note and str(path) in note


@pytest.fixture
def fake_runner(monkeypatch):
    """runner.run_sweep replaced: records where the CLI would write, starts nothing."""
    calls = []

    def run_sweep(sweep, out, **kw):
        calls.append((sweep, Path(out), kw))
        Store(out)
        return pd.DataFrame()

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    return calls


@pytest.mark.parametrize("name", ["/tmp/syncbench-hostile/deep", "../../escaped"])
def test_cli_writes_under_results_whatever_the_name_and_honours_out(tmp_path, monkeypatch, capsys, fake_runner,
                                                                     name):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    sweep = work / "s.toml"
    sweep.write_text(BASE.replace('name = "hostile"', f"name = {json.dumps(name)}"))
    assert main(["run", str(sweep), "--no-report"]) == 0
    out = fake_runner[-1][1]
    assert (work / out).resolve().is_relative_to((work / "results").resolve())
    assert "not a safe directory name" in capsys.readouterr().err
    assert not Path("/tmp/syncbench-hostile").exists() and not (tmp_path / "escaped").exists()
    assert main(["run", str(sweep), "--no-report", "--out", str(tmp_path / "mine")]) == 0
    assert fake_runner[-1][1] == tmp_path / "mine"


def test_out_under_a_file_or_not_writable_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker / "sub", blocker):
        with pytest.raises(StoreError, match="is a file|part of that path is a file"):
            Store(out)
    sweep = tmp_path / "s.toml"
    sweep.write_text(BASE)
    assert main(["run", str(sweep), "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "part of that path is a file" in err
    if os.geteuid() != 0:  # root writes anywhere: the permission check cannot be provoked
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(StoreError, match="not writable"):
            Store(locked)


def test_report_on_another_tools_parquet_is_one_line(tmp_path, capsys):
    pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}).to_parquet(tmp_path / "runs.parquet")
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a syncbench results file" in err and "run_id" in err
    (tmp_path / "runs.parquet").write_text("not parquet at all")
    assert main(["report", str(tmp_path)]) == 2
    assert "not a readable Parquet file" in capsys.readouterr().err
    with pytest.raises(StoreError, match="not a readable Parquet file"):  # --resume into it: the same
        Store(tmp_path).done()


# -- 2. documented finite ranges, checked before Ray ----------------------------------------------------

@pytest.mark.parametrize("line, fragments", [
    ("seed = -1", ["seed = -1", ">= 0"]),
    ("lr = inf", ["lr = inf", "finite"]),
    ("lr = 0.0", ["lr = 0.0", "> 0"]),
    ("momentum = nan", ["momentum = nan", "finite"]),
    ("momentum = -0.5", ["momentum = -0.5", ">= 0"]),
    ("momentum = 1.0", ["momentum = 1.0", "< 1"]),
    ("weight_decay = -1e-4", ["weight_decay = -0.0001", ">= 0"]),
    ("timeout = 1e-9", ["timeout = 1e-09", ">= 1"]),
    ("timeout = inf", ["timeout = inf", "finite"]),
    ("workers = 100000", ["workers = 100000", "<= 16,384"]),
    ("batch_size = 0", ["batch_size = 0", ">= 1"]),
    ("image_size = 1000000", ["image_size = 1000000", "<= 1,024"]),
    ("steps = 100000000", ["steps = 100000000", "<= 1,000,000"]),
    ('link = { bandwidth = "1Gbit", latency = nan }', ["latency", "nan", "finite"]),
    ('link = { bandwidth = "1Gbit", latency = inf }', ["latency", "inf", "finite"]),
    ('link = { bandwidth = "1Gbit", latency = "5s" }', ["latency = 5 s", "0s to 1s"]),
    ('link = { bandwidth = "1bit" }', ["bandwidth = 0.125 bytes/s", "1Mbit to 100Tbit"]),
    ("straggler = { ranks = [1], slowdown = inf }", ["straggler.slowdown = inf", "finite"]),
    ("straggler = { ranks = [1], slowdown = nan }", ["straggler.slowdown = nan", "finite"]),
])
def test_every_numeric_setting_is_finite_and_in_its_range(tmp_path, line, fragments):
    key = line.split("=")[0].strip()
    text = re.sub(rf"^{key} = .*$", line, BASE, flags=re.M) if f"\n{key} = " in BASE else BASE + line + "\n"
    message = refused(tmp_path, text)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


@pytest.mark.parametrize("lines, fragments", [
    ('p2p = "shm"\n', ["p2p = 'shm'", "accepted are gloo, sockets, sockets-unix, sockets-tcp"]),
    ('p2p = "sockets"\ndevice = "cuda"\n', ["p2p = 'sockets' with device = \"cuda\"", "host tensors"]),
])
def test_an_unknown_p2p_or_sockets_for_gpu_tensors_is_refused(tmp_path, lines, fragments):
    message = refused(tmp_path, BASE + lines)
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_every_numeric_setting_has_a_documented_range():
    numeric = {key for key, typ in sweep_mod._TYPES.items() if typ in (int, float)}
    assert numeric <= set(RANGES), f"numeric settings without a range in sweep.RANGES: {numeric - set(RANGES)}"
    section = (REPO / "docs" / "settings.md").read_text()
    for key, accepted in RANGES.items():
        row = next((line for line in section.splitlines() if line.startswith(f"| `{key}`")), None)
        assert row is not None, f"docs/settings.md's range table has no row for {key}"
        assert accepted.describe() in row, (key, accepted.describe(), row)


def test_a_servers_flood_and_10000_workers_are_refused_by_the_machine_limits():
    spec = RunSpec(workload="tiny", workers=4, strategy="parameter_server", strategy_params={"servers": 100})
    two_cores = Capacity(cores=2, memory_bytes=8e9, where="this machine")
    with pytest.raises(LimitError) as info:
        check_capacity([spec], two_cores)
    message = str(info.value)
    for fragment in ("104 ranks", "100 server(s)", "2 cores", "4 ranks per core = 8 ranks", "--oversubscribe"):
        assert fragment in message, (fragment, message)
    with pytest.raises(LimitError, match=r"needs at least 10\.4 GB of memory \(104 x 100 MB\).* 8\.0 GB available"):
        check_capacity([spec], two_cores, oversubscribe=True)  # the flag lifts the core limit, not memory
    check_capacity([RunSpec(workload="tiny", workers=4, strategy="parameter_server")], two_cores)  # 5 ranks fit


def test_machine_limits_refuse_before_ray_starts(tmp_path):
    # in a process of its own (TMPDIR its own, no RAY_ADDRESS): checked whether or not this test session runs a Ray
    (tmp_path / "s.toml").write_text(BASE.replace("workers = 2", "workers = 10000"))  # the example
    proc = subprocess.run([sys.executable, "-m", "experiments", "run", str(tmp_path / "s.toml"), "--out",
                           str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path), "RAY_ADDRESS": ""})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("syncbench run: error: "), proc.stderr
    assert re.search(r"workers = 10000 \(10000 ranks, tiny\): this machine has \d+ cores", proc.stderr), proc.stderr
    assert not list(tmp_path.glob("syncbench-ray-*"))  # Ray never started (and the subprocess had 120 s at most)


# -- 3. wrong results are never recorded as ok -----------------------------------------------------------

@pytest.mark.parametrize("link, fragments", [
    ('{ bandwidth = "10Gbit", ranks = { 1 = { bandwith = "1Gbit" } } }', ["ranks.1", "bandwith", "accepted are"]),
    ('{ bandwidth = "10Gbit", ranks = { 1 = "1Gbit" } }', ["ranks.1 = '1Gbit'", "expected a table"]),
    ('{ bandwidth = "10Gbit", ranks = { one = { bandwidth = "1Gbit" } } }', ["'one'", "rank number"]),
    ('{ bandwidth = "10Gbit", ranks = { 7 = { bandwidth = "1Gbit" } } }',
     ["link.ranks.7", "no run of the sweep has rank 7"]),
    ('{ bandwidth = "10Gbit", ranks = { 1 = { latency = nan } } }', ["latency", "finite"]),
    ('{ bandwidth = "10Gbit", ranks = { 1 = {} } }', ["ranks.1 is empty"]),
])
def test_per_rank_link_overrides_are_checked(tmp_path, link, fragments):
    message = refused(tmp_path, BASE + f"link = {link}\n")
    for fragment in fragments:
        assert fragment in message, (fragment, message)


def test_a_server_rank_may_have_its_own_link(tmp_path):
    text = BASE.replace('strategy = "ring"', 'strategy = "parameter_server"') + (
        'link = { bandwidth = "10Gbit", ranks = { 2 = { bandwidth = "40Gbit" } } }\n')
    (spec,) = load(tmp_path, text).runs
    assert spec.world_size() == 3 and spec.network().link(2).bandwidth == 40e9 / 8


@pytest.mark.parametrize("straggler, fragment", [
    ("{ ranks = [5], slowdown = 2.0 }", "workers = 2 has worker ranks 0..1 only"),
    ("{ ranks = [], slowdown = 2.0 }", "non-empty list"),
    ("{ ranks = [1], slowdown = 0.5 }", ">= 1"),
])
def test_straggler_ranks_must_exist(tmp_path, straggler, fragment):
    assert fragment in refused(tmp_path, BASE + f"straggler = {straggler}\n")


def test_a_nan_loss_fails_the_run_naming_the_step():
    spec = RunSpec(workload="tiny", image_size=16, batch_size=4, steps=3, warmup_steps=1)
    steps = [{"step": s, "rank": r, "role": "worker", "timed": s >= 1, "compute_s": 0.1, "comm_s": 0.1,
              "bytes_sent": 0, "bytes_recv": 0, "loss": math.nan if s == 2 else 1.0, "samples": 4,
              "consensus_distance": math.nan, "wall_s": 0.1} for s in range(3) for r in range(2)]
    final = {"loss": math.nan, "param_norm": 1.0, "numel": 10, "consensus_distance": math.nan}
    meta = {"started_at": "", "duration_s": 1.0, "transport": "gloo", "gpu": "", "cores": 2, "host": "h"}
    row, step_rows = summarize(spec, [{"steps": steps, "final": final}] * 2, "", meta)
    assert row["status"] == "failed" and "loss is nan at step 2 on rank 0" in row["error"] and step_rows == []


def test_training_that_diverges_raises_naming_the_step():
    import torch

    from experiments.pipeline.train import train
    from strategies.transport.threads import run_threads

    torch.set_num_threads(1)
    # built directly, past validation (which refuses lr > 100): a learning rate that must diverge
    spec = RunSpec(workload="tiny", image_size=16, batch_size=8, steps=20, warmup_steps=1, workers=1, lr=1e30)

    def body(comm):
        return train(SimpleNamespace(rank=comm.rank, world_size=1, comm=comm, device="cpu", state={}), spec)

    with pytest.raises(Exception, match=r"loss is (nan|inf|-inf) at step \d+ on rank 0"):
        run_threads(1, body, timeout=60)


# -- 4. run ids cannot collide ------------------------------------------------------------------------------

def test_seeds_that_collided_in_32_bits_are_two_runs(tmp_path):
    runs = load(tmp_path, BASE + "[grid]\nseed = [13466, 31908]\n").runs
    assert len(runs) == 2 and len({r.run_id for r in runs}) == 2
    assert all(re.search(r"-[0-9a-f]{32}$", r.run_id) for r in runs)


def test_expansion_refuses_two_different_runs_with_one_id(tmp_path, monkeypatch):
    monkeypatch.setattr(RunSpec, "run_id", property(lambda self: "same"))
    message = refused(tmp_path, BASE + "[grid]\nseed = [1, 2]\n")
    assert "run id same names two different runs" in message
    assert len(load(tmp_path, BASE + "[grid]\nseed = [1, 1]\n").runs) == 1  # one run listed twice is one run


@pytest.mark.timing
def test_a_huge_grid_is_refused_before_expanding_and_a_large_one_shows_progress():
    start = time.perf_counter()
    with pytest.raises(SweepError, match=r"7,000,000 points \(grid.seed \(7,000\) x grid.lr \(1,000\)\)"):
        sweep_mod.parse({"grid": {"seed": list(range(7000)), "lr": [0.001 * (i + 1) for i in range(1000)]}})
    assert time.perf_counter() - start < 2
    seen = []
    sweep = sweep_mod.parse({"defaults": {"workload": "tiny", "image_size": 16}, "grid": {"seed": list(range(2001))}},
                            progress=lambda done, total: seen.append((done, total)))
    assert len(sweep.runs) == 2001 <= MAX_RUNS and seen == [(1000, 2001), (2000, 2001), (2001, 2001)]


# -- 5. --resume refuses a directory holding a different sweep ------------------------------------------

def test_resume_refuses_a_different_sweep_naming_the_settings(tmp_path):
    first = load(tmp_path, BASE + "[grid]\nlr = [0.05, 0.1]\n")
    store = Store(tmp_path / "out")
    store.write_text("sweep.resolved.json", runner.resolved(first))
    runner.check_same_sweep(store, first)  # the same sweep: fine
    other = load(tmp_path, BASE.replace("steps = 3", "steps = 4") + "[grid]\nlr = [0.05, 0.2]\n")
    with pytest.raises(StoreError) as info:
        runner.check_same_sweep(store, other)
    message = str(info.value)
    assert "lr: 0.05, 0.1 there, 0.05, 0.2 in this sweep" in message
    assert "steps: 3 there, 4 in this sweep" in message and "--overwrite" in message
    before = (store.dir / "sweep.resolved.json").read_text()
    with pytest.raises(StoreError):  # through run_sweep: refused before the record is overwritten or Ray starts
        runner.run_sweep(other, store.dir, resume=True)
    assert (store.dir / "sweep.resolved.json").read_text() == before


def test_resume_without_a_record_refuses_foreign_runs(tmp_path):
    sweep = load(tmp_path, BASE)
    store = Store(tmp_path / "out")
    runner.check_same_sweep(store, sweep)  # empty: fine
    row = {"run_id": "ring-n2-tiny-full_speed-deadbeef", "status": "ok", "strategy": "ring", "workers": 2}
    store.append(row, [])
    with pytest.raises(StoreError, match="holds 1 run"):
        runner.check_same_sweep(store, sweep)


# -- 6. checked before any actor starts: verify, bench, model ------------------------------------------

def test_verify_op_is_checked_against_the_ops_module(capsys):
    from strategies.ops import OPS

    assert main(["verify", "--op", "xor"]) == 2
    err = capsys.readouterr().err
    assert "--op 'xor'" in err and ", ".join(OPS) in err
    assert main(["verify", "--op", "sum", "--strategies", "ring", "--workers", "100000"]) == 2
    assert "100000 ranks" not in (err := capsys.readouterr().err) and "ranks per core" in err


@pytest.mark.parametrize("args, fragment", [
    (["--workload", "alexnet"], "workload = 'alexnet'"),
    (["--batch-size", "0"], "batch_size = 0"),
    (["--device", "tpu"], "device = 'tpu'"),
    (["--image-size", "8"], "image_size"),
])
def test_bench_harness_arguments_are_checked(capsys, args, fragment):
    assert main(["bench", "--harness", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


@pytest.mark.timing
def test_model_workers_are_bounded():
    from reports.model import MAX_MODEL_WORKERS, model_table

    start = time.perf_counter()
    for bad in (0, 10_000):
        with pytest.raises(ValueError, match=f"bad workers {bad}: expected a whole number from 1 to 1,024"):
            model_table(None, 1e6, bad, 1.25e8, 0.5)
    with pytest.raises(ValueError, match="step time"):
        model_table(None, 1e6, 4, 1.25e8, math.inf)
    assert time.perf_counter() - start < 1 and MAX_MODEL_WORKERS == 1024


# -- 7. every wait honours Ctrl-C and has a deadline ------------------------------------------------------

@pytest.mark.timing
def test_an_address_nobody_listens_on_fails_at_once():
    # in a process of its own: checked whether or not this test session runs a Ray
    code = ("import time, ray\nfrom experiments.cluster.ray_runtime import ensure_ray\n"
            "start = time.perf_counter()\n"
            "try:\n    ensure_ray('127.0.0.1:1')\n"
            "except ConnectionError as e:\n    print(e, ray.is_initialized(), time.perf_counter() - start)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAY_ADDRESS": ""})
    assert proc.returncode == 0, proc.stderr
    assert "cannot reach a Ray cluster at --address '127.0.0.1:1'" in proc.stdout, proc.stdout + proc.stderr
    initialized, took = proc.stdout.split()[-2:]
    assert initialized == "False" and float(took) < 5, proc.stdout


@pytest.mark.timing
@pytest.mark.ray
def test_an_address_that_is_not_ray_times_out_and_the_process_exits():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(server.accept()), daemon=True).start()
    code = ("from experiments.cluster.ray_runtime import ensure_ray\n"
            f"ensure_ray('127.0.0.1:{port}', connect_timeout=3)\n")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    server.close()
    assert proc.returncode != 0 and "no Ray cluster answered" in proc.stderr
    assert time.perf_counter() - start < 30


@pytest.mark.timing
@pytest.mark.ray
def test_a_placement_that_cannot_fit_fails_at_once_and_ctrl_c_interrupts_a_wait(ray_session):
    from ray.util.placement_group import placement_group, remove_placement_group

    from experiments.cluster.group import WorkerGroup, _wait_any

    start = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"10000 ranks x 1 CPU need 10000 CPUs: the Ray cluster has \d+"):
        WorkerGroup(10_000)
    assert time.perf_counter() - start < 5
    pg = placement_group([{"CPU": 1, "syncbench_nonexistent": 1}])  # never placed
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    # Ctrl-C as a user's shell delivers it (earlier tests in the session may have left another SIGINT handler)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    start = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _wait_any([pg.ready()], 30)  # a deadline, so a SIGINT that never arrives fails instead of hanging
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
        remove_placement_group(pg)
    assert time.perf_counter() - start < 3


# -- 8. embedded Ray leaves no temp dir; the rendezvous store listens on loopback ------------------------

@pytest.mark.ray
def test_embedded_ray_temp_dirs_are_removed():
    # the process exits with Ray up: the exit hook runs stop_ray(), what the runner calls when it is done
    code = textwrap.dedent("""
        import os
        from experiments.cluster import ray_runtime
        ray_runtime.ensure_ray(num_cpus=1)
        temp = ray_runtime._OWN_TEMP_DIRS[0]
        print(temp, os.path.isdir(os.path.join(temp, "session_latest")))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    temp, had_session = proc.stdout.split()[-2:]
    assert "syncbench-ray-" in temp and had_session == "True" and not os.path.exists(temp)


@pytest.mark.ray
def test_the_rendezvous_store_listens_on_loopback_only(group2):
    port = group2.port

    def listeners(ctx):
        import psutil

        return [c.laddr.ip for c in psutil.Process().net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port == port]

    assert group2.run(listeners)[0] == ["127.0.0.1"]



# -- 9. issue 27: bounded parsers, strict [simulate] settings, profile ranges ---------------------------------

SIMULATE = BASE + 'link = { bandwidth = "1Gbit", latency = "50us" }\n' + """
[simulate]
forward_s = 0.01
backward_s = 0.02
optimizer_s = 0.001
"""


def cli_error(capsys, argv) -> str:
    """main(argv) must fail with exit code 2 and no traceback; its stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith(f"syncbench {argv[0]}: error: "), err
    return err


@pytest.mark.parametrize("text, fragments", [
    ("name = 'deep'\n[defaults]\nlink = " + "[" * 5000 + "]" * 5000 + "\n", ["line 3, field defaults.link",
                                                                          "nested more than 32 deep"]),
    ("[defaults]\nlink = " + "{ a = " * 3000 + "1" + " }" * 3000 + "\n", ["field defaults.link", "nested"]),
    ("[defaults]\nlink." + ".".join(["a"] * 3000) + " = 1\n", ["defaults.link.a.a...", "nested more than 32"]),
    ("[grid]\nseed = [1, " + "7" * 400 + "]\n", ["line 2, field grid.seed", "a number of 400 digits",
                                                  "at most 30 digits"]),
    ("x = 1\n" * 200_000, ["larger than 1,000,000 bytes", "sweep file of at most"]),
])
@pytest.mark.parametrize("command", ["run", "simulate"])
def test_a_sweep_nested_thousands_deep_or_with_400_digits_is_one_line(tmp_path, capsys, command, text, fragments):
    path = tmp_path / "hostile.toml"
    path.write_text(text)
    err = cli_error(capsys, [command, str(path), "--out", str(tmp_path / "out")])
    assert err.count("\n") == 1 and str(path) in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert not (tmp_path / "out").exists()


def test_400_digit_integers_given_to_the_sweep_parser_are_out_of_range_not_an_overflow():
    with pytest.raises(SweepError, match=r"seed = 1{400}: accepted are values >= 0"):
        sweep_mod.parse({"defaults": {"workload": "tiny", "seed": int("1" * 400)}})


@pytest.fixture(scope="module")
def profile_data():
    return json.loads((REPO / "experiments/config/profiles/resnet50-b8-s224-cpu.json").read_text())


@pytest.mark.parametrize("field, value, fragments", [
    ("forward_s", "1e300", ["forward_s = 1e+300", "accepted are seconds, a number >= 0 and <= 86,400"]),
    ("optimizer_s", "1" * 400, ["field optimizer_s", "a number of 400 digits"]),
    ("batch_size", "100000000000000000000", ["batch_size = 100000000000000000000", "<= 65,536"]),
    ("params", "[" * 5000 + "]" * 5000, ["field params", "nested more than 32 deep"]),
])
def test_a_profile_with_forward_s_1e300_400_digits_or_nested_deep_is_refused_naming_file_and_field(
        tmp_path, capsys, profile_data, field, value, fragments):
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({**profile_data, field: "PLACEHOLDER"}, indent=1).replace('"PLACEHOLDER"', value))
    sweep = tmp_path / "s.toml"
    sweep.write_text(BASE.replace('workload = "tiny"', 'workload = "resnet50"').replace("image_size = 16",
                                                                                       "image_size = 224")
                     .replace("batch_size = 8", "batch_size = 8\ncompute = \"profile\"\nprofile = "
                              + json.dumps(str(path))))
    err = cli_error(capsys, ["run", str(sweep), "--out", str(tmp_path / "out")])
    for fragment in [str(path), *fragments]:
        assert fragment in err, (fragment, err)
    with pytest.raises(ProfileError) as info:  # simulate, bench --overlap: the same loader
        load_profile(path)
    assert all(fragment in str(info.value) for fragment in fragments)


@pytest.mark.parametrize("line, fragments", [
    ('overlap = "false"', ["simulate.overlap = 'false'", "expected true or false (not a string)"]),
    ('overlap = [true, "false"]', ["simulate.overlap = 'false'"]),
    ("oversubscription = inf", ["simulate.oversubscription = inf", "finite", "<= 1,024"]),
    ('intra_latency = "1e300s"', ["simulate.intra_latency = 1e+300 s", "0s to 1s"]),
    ('intra_bandwidth = "1bit"', ["simulate.intra_bandwidth = 0.125 bytes/s", "1Mbit to 100Tbit"]),
    ("hosts_per_leaf = 0", ["simulate.hosts_per_leaf = 0", ">= 1"]),
    ("hosts_per_leaf = 2.5", ["simulate.hosts_per_leaf = 2.5", "expected int"]),
    ("bucket_mb = []", ["simulate.bucket_mb = []", "non-empty list"]),
    ("forward_s = 1e300", ["simulate.forward_s = 1e+300", "<= 86,400"]),
])
def test_a_string_false_and_out_of_range_simulate_settings_are_refused(tmp_path, capsys, line, fragments):
    key = line.split("=")[0].strip()
    text = re.sub(rf"^{key} = .*$", line, SIMULATE, flags=re.M) if f"\n{key} = " in SIMULATE else SIMULATE + line
    path = tmp_path / "s.toml"
    path.write_text(text + "\n")
    err = cli_error(capsys, ["simulate", str(path), "--out", str(tmp_path / "out")])
    for fragment in [str(path), *fragments]:
        assert fragment in err, (fragment, err)
    assert not (tmp_path / "out").exists()


def test_a_string_false_for_overlap_in_a_sweep_is_refused(tmp_path):
    assert "overlap = 'false': expected true or false" in refused(tmp_path, BASE + 'overlap = "false"\n')


def test_simulate_ranges_are_documented():
    section = (REPO / "docs" / "settings.md").read_text()
    for key, accepted in sweep_mod.SIMULATE_RANGES.items():
        row = next((line for line in section.splitlines() if line.startswith(f"| `{key}`")), None)
        assert row is not None and accepted.describe() in row, (key, accepted.describe(), row)


@pytest.mark.parametrize("argv, fragments", [
    (["bench", "--bandwidth", "1bit"], ["--bandwidth '1bit' (0.125 bytes/s)", "accepted are 1Mbit to 100Tbit"]),
    (["bench", "--bandwidth", "1Gbit", "--latency", "1e300s"], ["--latency '1e300s' (1e+300 s)", "0s to 1s"]),
    (["bench", "--sizes", "4K," + "1" * 400], ["--sizes '" + "1" * 40 + "...'", "1 byte to 17,179,869,184 bytes"]),
    (["bench", "--sizes", "0"], ["--sizes '0'", "from 1 byte"]),
    (["model", "--model-bytes", "9" * 400, "--workers", "4", "--bandwidth", "1Gbit", "--step-time", "0.1"],
     ["--model-bytes '" + "9" * 40 + "...'", "1,000,000,000,000,000 bytes"]),
    (["model", "--model", "resnet18", "--workers", "4", "--bandwidth", "1bit", "--step-time", "0.1"],
     ["--bandwidth '1bit'", "1Mbit to 100Tbit"]),
    (["verify", "--numel", "9" * 400], ["--numel " + "9" * 40 + "...", "numel from 0 to 4,294,967,296"]),
])
def test_bench_bandwidth_1bit_and_400_digit_sizes_are_one_line(capsys, monkeypatch, argv, fragments):
    import experiments.cluster.ray_runtime as ray_runtime

    monkeypatch.setattr(ray_runtime, "ensure_ray", lambda *a, **k: pytest.fail("Ray was started"))
    err = cli_error(capsys, argv)
    assert err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.mark.timing
def test_a_bench_predicted_to_take_hours_is_refused_before_ray_starts(tmp_path):
    # its own process (with TMPDIR of its own): refused before any Ray, whether or not this session runs one
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "experiments", "bench", "--bandwidth", "1Mbit", "--workers", "2",
                           "--strategies", "ring"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path), "RAY_ADDRESS": ""})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--sizes up to 67,108,864 bytes on links of 1 Mbit/s: the alpha-beta model predicts" in proc.stderr
    assert "at most 3,600 s" in proc.stderr and not list(tmp_path.glob("syncbench-ray-*"))
    assert time.perf_counter() - start < 60


def test_profile_out_an_existing_directory_is_refused_before_measuring(tmp_path, capsys, monkeypatch):
    import workloads.profile as profile_mod

    monkeypatch.setattr(profile_mod, "measure_profile", lambda *a, **k: pytest.fail("measured first"))
    err = cli_error(capsys, ["profile", "--workload", "tiny", "--batch-size", "2", "--out", str(tmp_path)])
    assert f"--out {str(tmp_path)!r} is a directory" in err and err.count("\n") == 1
    blocker = tmp_path / "file"
    blocker.write_text("x")
    err = cli_error(capsys, ["profile", "--workload", "tiny", "--batch-size", "2", "--out", str(blocker / "p.json")])
    assert "is a file, not a directory" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no <dir>.tmp, nothing written


def test_resume_into_results_whose_record_is_nested_thousands_deep_is_one_line(tmp_path):
    sweep = load(tmp_path, BASE)
    store = Store(tmp_path / "out")
    (store.dir / "sweep.resolved.json").write_text('{"runs": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(StoreError) as info:
        runner.check_same_sweep(store, sweep)
    message = str(info.value)
    assert "is not a syncbench sweep record" in message and "nested more than 32 deep" in message, message
    assert "field runs" in message and "\n" not in message
