"""The results store: typed columns on disk, append-only (linear) writes, results from before still loading and
resuming, one writer per directory, and a full or read-only disk as one line with no temporary file left."""

from __future__ import annotations

import gc
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import strategies
from experiments.cli.main import main
from experiments.config import sweep as sweep_mod
from experiments.pipeline import runner
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.store import LOCK, Store, StoreError
from experiments.pipeline.substrate import ThreadSubstrate
from experiments.results import dataset, schema
from experiments.simulate.substrate import simulate_sweep
from tests.helpers import SIMULATE_TOML as SIMULATE
from tests.helpers import tiny_sweep_toml

REPO = Path(__file__).resolve().parents[2]

TINY = tiny_sweep_toml(["ring", "parameter_server"], name="old", servers=2)


def _sweep(text: str = TINY) -> sweep_mod.Sweep:
    return sweep_mod.parse(tomllib.loads(text), source=text)


def _run(run_id: str, strategy: str = "parameter_server", **values) -> dict:
    params = {"parameter_server": {"param_servers": 2, "param_staleness": "async"}}.get(strategy, {})
    base = {"sweep": "s", "workers": 2, "status": "ok", "link_bandwidth": 125e6, "link_latency_s": 50e-6,
            "started_at": "2026-01-01T12:00:00+00:00", "straggler_ranks": (1,)}
    return schema.row(schema.RUNS, run_id=run_id, strategy=strategy, **{**base, **params, **values})


def _steps(run_id: str, n: int = 2, **values) -> list[dict]:
    return [schema.row(schema.STEPS, run_id=run_id, step=i, rank=0, role="worker", timed=True, **values)
            for i in range(n)]


def _no_temporaries(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


# ---- typed, append-only ---------------------------------------------------------------------------------------

def test_columns_on_disk_have_the_schema_types_and_parameters_are_typed_never_json(tmp_path):
    store = Store(tmp_path)
    store.append(_run("a"), _steps("a"))
    table = pq.read_table(next((tmp_path / "runs").iterdir()))
    types = dict(zip(table.column_names, table.schema.types))
    assert types["workers"] == pa.int64() and types["overlap"] == pa.bool_() and types["lr"] == pa.float64()
    assert types["started_at"] == pa.timestamp("ms", tz="UTC") and types["straggler_ranks"] == pa.list_(pa.int64())
    assert types["param_servers"] == pa.int64()
    assert types["param_staleness"] == pa.struct([("int", pa.int64()), ("str", pa.string())])  # int | str
    assert not {"strategy_params", "strategy_label", "link", "sim_platform"} & set(types)  # no display text
    run = store.runs().iloc[0]
    assert run["param_servers"] == 2 and run["param_staleness"] == "async"
    assert run["strategy_label"] == "parameter_server (servers=2, staleness=async)"  # derived, not stored
    assert run["link"] == "1Gbit 50us" and run["started_at"] == pd.Timestamp("2026-01-01T12:00:00Z")


def test_a_value_of_the_wrong_type_is_refused_naming_the_column(tmp_path):
    store = Store(tmp_path)
    with pytest.raises(TypeError, match="column overlap = 'false' .*a bool"):
        store.append(_run("a", overlap="false"), [])
    with pytest.raises(KeyError, match="link: derived on read"):
        store.append({**_run("a"), "link": "1Gbit"}, [])
    assert store.runs().empty and not _no_temporaries(tmp_path)


def test_a_retried_run_supersedes_its_earlier_attempt_and_its_steps(tmp_path):
    store = Store(tmp_path)
    store.append(_run("a", status="failed", error="boom"), _steps("a", 3, loss=9.0))
    store.append(_run("b", strategy="ring"), _steps("b", 1))
    store.append(_run("a"), _steps("a", 2, loss=1.0))
    runs, steps = store.runs(), store.steps()
    assert list(runs["run_id"]) == ["b", "a"] and list(runs["status"]) == ["ok", "ok"]
    assert list(steps.loc[steps["run_id"] == "a", "loss"]) == [1.0, 1.0] and store.done() == {"a", "b"}
    assert runs.set_index("run_id").loc["b", "param_servers"] is None  # ring has no servers parameter


def test_batches_keep_the_latest_attempt_and_a_merge_cut_short_is_tidied(tmp_path, monkeypatch):
    """Every BATCH runs the loose files become one file per table; a run retried within a batch or across
    batches reads as its latest attempt with that attempt's steps; loose files a finished merge holds (a writer
    killed before removing them) are removed by the next writer and never read twice."""
    monkeypatch.setattr(dataset, "BATCH", 3)
    store = Store(tmp_path)
    store.start(resume=False, overwrite=False)
    store.append(_run("a", status="failed"), _steps("a", 1, loss=9.0))
    store.append(_run("b"), _steps("b", 1))
    store.append(_run("a"), _steps("a", 2, loss=1.0))  # third: merged with the two before
    store.append(_run("b", status="failed"), [])  # a later attempt in a loose file supersedes the batch's
    assert [p.name for _, _, p in dataset.parts(tmp_path, "runs")] == ["00000000-00000002.parquet", "00000003.parquet"]
    runs, steps = store.runs().set_index("run_id"), store.steps()
    assert runs.loc["a", "status"] == "ok" and runs.loc["b", "status"] == "failed"
    assert list(steps["run_id"]) == ["a", "a"] and set(steps["loss"]) == {1.0}
    store.close()
    for table in ("runs", "steps"):  # as if the merge's loose files had not been removed
        pq.write_table(schema.to_arrow([_run("a", status="failed")] if table == "runs" else _steps("a", 5),
                                       schema.RUNS if table == "runs" else schema.STEPS),
                       tmp_path / table / "00000001.parquet")
    Store(tmp_path).start(resume=True, overwrite=False)
    assert not (tmp_path / "runs" / "00000001.parquet").exists() and len(Store(tmp_path).steps()) == 2


def _stored_batches(directory: Path, runs: int) -> None:
    """`runs` runs (4 steps each) stored as the writer leaves them after merging: one batch file per table per
    dataset.BATCH runs, written at once instead of run by run (the sizes a store grows to, in a second)."""
    row, steps = _run("x"), _steps("x", 4)
    for table in dataset.TABLES:
        (directory / table).mkdir(parents=True, exist_ok=True)
    for first in range(0, runs, dataset.BATCH):
        ids = [f"b{i}" for i in range(first, first + dataset.BATCH)]
        name = f"{first:08d}-{first + dataset.BATCH - 1:08d}.parquet"
        pq.write_table(schema.to_arrow([{**row, "run_id": i} for i in ids], schema.RUNS), directory / "runs" / name)
        pq.write_table(schema.to_arrow([{**s, "run_id": i} for i in ids for s in steps], schema.STEPS),
                       directory / "steps" / name)


@pytest.mark.timing
@pytest.mark.slow
def test_storing_a_run_costs_the_same_beside_2000_runs_as_beside_100(tmp_path, monkeypatch):
    """The store appends a file per run: a run stored beside 2,000 costs what it costs beside 100 (the store that
    rewrote both Parquet files for every run made each run cost in proportion to what was stored: 20x here; a
    doubling from 1,000 to 2,000 runs cost it 4x). The same 100 runs are timed on both stores, interleaved in
    chunks of 25 so that a change of the machine's load falls on both, each including one merge of BATCH loose
    files. fsync is a constant per file whatever the store's shape, and most of the time on this disk: it is left
    out so that the test measures the shape."""
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    stores = {}
    for size in (100, 2000):
        _stored_batches(tmp_path / str(size), size)
        stores[size] = Store(tmp_path / str(size))
        stores[size].start(resume=True, overwrite=False)  # the writer: it merges every dataset.BATCH runs
    row, steps = _run("x"), _steps("x", 4)
    took = dict.fromkeys(stores, 0.0)
    for chunk in range(0, dataset.BATCH, 25):
        for size, store in stores.items():
            start = time.perf_counter()
            for i in range(chunk, chunk + 25):
                store.append({**row, "run_id": f"r{i}"}, [{**s, "run_id": f"r{i}"} for s in steps])
            took[size] += time.perf_counter() - start
    ratio = took[2000] / took[100]
    print(f"store: 100 runs beside 100 in {took[100]:.2f} s, beside 2,000 in {took[2000]:.2f} s (x{ratio:.2f})")
    assert ratio < 2, f"100 runs cost {took[2000]:.2f} s beside 2,000 stored runs, {took[100]:.2f} s beside 100"
    for size, store in stores.items():
        assert len(store.runs()) == size + 100 and len(store.steps()) == 4 * (size + 100)
        assert len(dataset.parts(store.dir, "runs")) == (size + 100) // dataset.BATCH  # the new runs merged too


# ---- results written before the typed, append-only store -----------------------------------------------------

def _old_results(out: Path, sweep: sweep_mod.Sweep, ok: set[str]) -> dict[str, str]:
    """A results directory as the store before this one wrote it: runs.parquet and steps.parquet rewritten
    whole, strategy parameters as JSON text plus fixed param_* columns (0/False/'' when not given), display
    labels stored, started_at as ISO text. Returns run id -> strategy."""
    out.mkdir(parents=True)
    runs, steps = [], []
    for spec in sweep.runs:
        done = spec.strategy in ok
        runs.append({
            "run_id": spec.run_id, "sweep": sweep.name, "substrate": "ray", "workload": spec.workload,
            "image_size": spec.image_size, "batch_size": spec.batch_size, "steps": spec.steps, "seed": 0,
            "lr": 0.1, "strategy": spec.strategy, "workers": spec.workers, "servers": 2 * (spec.strategy != "ring"),
            "strategy_label": f"{spec.strategy} (servers=2)" if spec.strategy != "ring" else "ring",
            "strategy_params": json.dumps(spec.strategy_params),
            "param_servers": spec.strategy_params.get("servers", 0),
            "param_tree": False, "param_topology": "", "param_weights": "", "bytes_counted": True,
            "link": "1Gbit 50us", "link_bandwidth": 125e6, "link_latency_s": 50e-6, "link_emulation": "python",
            "link_heterogeneous": False, "straggler_ranks": [], "straggler_slowdown": 1.0, "sim_platform": "",
            "status": "ok" if done else "failed", "error": "" if done else "RuntimeError: peer 1 timed out",
            "started_at": "2025-06-01T10:00:00+00:00", "throughput": 100.0 if done else float("nan"),
            "step_time_s": 0.5 if done else float("nan")})
        if done:
            steps += [{"run_id": spec.run_id, "step": s, "rank": r, "role": "worker", "timed": s > 0,
                       "compute_s": 0.1, "comm_s": 0.4, "bytes_sent": 100, "bytes_recv": 100, "loss": 2.0,
                       "samples": 8} for s in range(3) for r in range(2)]
    pd.DataFrame(runs).to_parquet(out / "runs.parquet")
    pd.DataFrame(steps).to_parquet(out / "steps.parquet")
    (out / "sweep.toml").write_text(sweep.source)
    (out / "sweep.resolved.json").write_text(runner.resolved(sweep))
    return {spec.run_id: spec.strategy for spec in sweep.runs}


@pytest.mark.slow  # a sweep through the runner or the command line: left out of make test-fast
def test_old_results_load_and_resume(tmp_path):
    """A directory the old store wrote loads typed (its labels kept, its parameters from the JSON), and --resume
    runs only what failed there, appending beside the old files without rewriting them."""
    sweep, out = _sweep(), tmp_path / "old"
    ids = _old_results(out, sweep, ok={"ring"})
    ring = next(i for i, s in ids.items() if s == "ring")
    ps = next(i for i, s in ids.items() if s == "parameter_server")
    before = {name: (out / name).read_bytes() for name in ("runs.parquet", "steps.parquet")}

    runs = Store(out).runs().set_index("run_id")
    assert runs.loc[ps, "param_servers"] == 2 and runs.loc[ring, "param_servers"] is None  # not ring's
    assert runs.loc[ps, "param_staleness"] == 0  # not given then: the strategy's default
    assert runs.loc[ps, "strategy_label"] == "parameter_server (servers=2)" and runs.loc[ring, "link"] == "1Gbit 50us"
    assert runs.loc[ring, "started_at"] == pd.Timestamp("2025-06-01T10:00:00Z")
    assert Store(out).done() == {ring}

    log = io.StringIO()
    resumed = run_sweep(sweep, out, resume=True, log=log, substrate=ThreadSubstrate()).set_index("run_id")
    assert "2 runs, 1 already done" in log.getvalue()
    assert set(resumed.index) == {ring, ps} and (resumed["status"] == "ok").all(), resumed["error"].tolist()
    assert resumed.loc[ring, "throughput"] == 100.0  # the old row, kept
    assert resumed.loc[ps, "param_servers"] == 2 and resumed.loc[ps, "substrate"] == "threads"
    steps = Store(out).steps()
    assert set(steps["run_id"]) == {ring, ps} and len(steps[steps["run_id"] == ring]) == 6
    assert {name: (out / name).read_bytes() for name in before} == before  # append-only: old files untouched
    assert len(dataset.parts(out, "runs")) == 1
    assert main(["report", str(out)]) == 0 and (out / "report.html").exists()


# ---- one writer per results directory --------------------------------------------------------------------------

def test_two_writers_on_one_out_in_one_process(tmp_path):
    out = tmp_path / "out"
    first = Store(out)
    first.start(resume=False, overwrite=False)
    with pytest.raises(StoreError, match=f"being written by pid {os.getpid()} on {platform.node()} since "):
        Store(out).start(resume=True, overwrite=False)
    first.close()
    with Store(out) as second:  # released: the next writer may start
        second.start(resume=True, overwrite=False)


def test_two_writers_on_one_out(tmp_path, capsys):
    """A second `run --resume` or `simulate --resume` while another process writes the directory is refused with
    one line naming the holder; a holder killed with SIGKILL leaves no stale lock."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from experiments.pipeline.store import Store; "
         "s = Store(sys.argv[1]); s.lock(); print('locked', flush=True); time.sleep(120)", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        sweep_file = tmp_path / "s.toml"
        sweep_file.write_text(TINY)
        (tmp_path / "sim.toml").write_text(TINY + SIMULATE)
        capsys.readouterr()
        for argv in (["run", str(sweep_file)], ["simulate", str(tmp_path / "sim.toml")]):
            assert main([*argv, "--out", str(out), "--resume"]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "Traceback" not in err, err
            assert f"being written by pid {holder.pid} on {platform.node()} since " in err
    finally:
        holder.kill()
        holder.wait()
    with Store(out) as store:  # the kernel dropped the dead holder's lock
        assert (store.dir / LOCK).exists()


@pytest.mark.slow  # a sweep through the runner or the command line: left out of make test-fast
def test_simulate_resume_into_another_sweep(tmp_path, capsys):
    """`simulate B --resume` into A's directory is refused before anything is written: A's sweep.toml, record and
    runs stay as they were (it used to mix the sweeps and overwrite A's sweep.toml)."""
    out = tmp_path / "out"
    a = tmp_path / "a.toml"
    a.write_text(tiny_sweep_toml(["ring"], name="a", servers=2)
                 + SIMULATE)
    assert (simulate_sweep(a, out, log=io.StringIO())["status"] == "ok").all()
    before = {name: (out / name).read_bytes() for name in ("sweep.toml", "sweep.resolved.json")}
    runs_before = Store(out).runs()
    b = tmp_path / "b.toml"
    b.write_text(tiny_sweep_toml(["ring", "parameter_server"], name="b", servers=2) + SIMULATE)
    capsys.readouterr()
    assert main(["simulate", str(b), "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "different sweep" in err and "'a'" in err, err
    assert {name: (out / name).read_bytes() for name in before} == before
    pd.testing.assert_frame_equal(Store(out).runs(), runs_before)


# ---- a full or read-only disk ---------------------------------------------------------------------------------

@pytest.fixture
def tmpfs_2mb(tmp_path):
    """A 2 MB tmpfs (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        gc.collect()  # a Store kept alive by a traceback holds its lock file open
        if subprocess.run(["umount", str(mount)]).returncode:
            subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(path: Path, leave_bytes: int) -> None:
    """Fill the file system holding `path` but for about `leave_bytes`."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    with open(path, "r+b") as f:
        f.truncate(max(0, path.stat().st_size - leave_bytes))


@pytest.mark.slow  # a sweep through the runner or the command line: left out of make test-fast
def test_2mb_tmpfs_as_out(tmpfs_2mb, tmp_path, capsys):
    """Runs fill the disk: the run that does not fit is one line naming the cause, no temporary file is left,
    every run stored before reads back; with space again, --resume goes on."""
    store = Store(tmpfs_2mb / "out")
    store.start(resume=False, overwrite=False)
    stored = 0
    with pytest.raises(StoreError) as info:
        for i in range(1000):
            store.append(_run(f"r{i}"), _steps(f"r{i}", 200))
            stored += 1
    message = str(info.value)
    assert "\n" not in message and "No space left on device" in message and "--resume" in message
    assert stored > 2 and not _no_temporaries(tmpfs_2mb)
    assert len(store.runs()) == stored and store.done() == {f"r{i}" for i in range(stored)}
    store.close()
    shutil.rmtree(store.dir)

    # through the command line: a simulation into a full --out is one line, and leaves no temporary file
    sweep_file = tmp_path / "sim.toml"
    sweep_file.write_text(tiny_sweep_toml(["ring"], name="old", servers=2) + SIMULATE)
    out = tmpfs_2mb / "cli"
    _fill(tmpfs_2mb / "filler", leave_bytes=16384)
    capsys.readouterr()
    assert main(["simulate", str(sweep_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "No space left on device" in last and "Traceback" not in err, err
    assert not _no_temporaries(tmpfs_2mb)
    (tmpfs_2mb / "filler").unlink()
    assert (simulate_sweep(sweep_file, out, resume=True, log=io.StringIO())["status"] == "ok").all()
    assert list(Store(out).runs()["status"]) == ["ok"]


def test_read_only_out_is_one_line_and_leaves_no_temporary_file(tmpfs_2mb):
    store = Store(tmpfs_2mb / "out")
    store.append(_run("a"), _steps("a"))
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs_2mb)], check=True)
    with pytest.raises(StoreError, match="Read-only file system") as info:
        store.append(_run("b"), _steps("b"))
    assert "\n" not in str(info.value)
    with pytest.raises(StoreError, match="is not writable: Read-only file system"):
        Store(tmpfs_2mb / "out")
    assert list(store.runs()["run_id"]) == ["a"] and not _no_temporaries(tmpfs_2mb)


# ---- `syncbench schema` ---------------------------------------------------------------------------------------

def test_schema_command_documents_every_column(capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    documented = {line.split()[0] for line in out.splitlines() if line and not line.startswith("#")}
    params = {schema.PARAM + p for name in strategies.names() for p in schema.parameter_types(name)}
    expected = {c.name for table in (schema.RUNS, schema.STEPS, schema.DERIVED) for c in table} | params
    assert expected <= documented and "param_staleness" in documented
