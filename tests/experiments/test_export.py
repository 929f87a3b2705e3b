"""Results a user can load: `syncbench export` and experiments.results.load_runs / load_steps give every column
(also one that only a later run has) and each run's latest attempt only, where a plain pandas.read_parquet of the
runs/ folder drops the later column and keeps superseded attempts."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.cli.main import main
from experiments.pipeline.store import Store
from experiments.results import load_runs, load_steps, schema


def _run(run_id: str, strategy: str, status: str = "ok", **values) -> dict:
    base = {"sweep": "mixed", "workers": 2, "status": status, "link_bandwidth": 125e6, "link_latency_s": 50e-6,
            "started_at": "2026-01-01T12:00:00+00:00", "throughput": 10.0}
    return schema.row(schema.RUNS, run_id=run_id, strategy=strategy, **{**base, **values})


def _steps(run_id: str, n: int, loss: float) -> list[dict]:
    return [schema.row(schema.STEPS, run_id=run_id, step=i, rank=0, role="worker", timed=True, loss=loss)
            for i in range(n)]


@pytest.fixture
def mixed(tmp_path):
    """ring first (no param_* column), then a parameter server (param_servers, param_staleness "async"), and a
    staleness-2 server; the second run failed first and was retried (two attempts, the later one ok)."""
    out = tmp_path / "results"
    with Store(out) as store:
        store.append(_run("r1", "ring"), _steps("r1", 2, 1.0))
        store.append(_run("p1", "parameter_server", status="failed", param_servers=2, param_staleness="async"),
                     _steps("p1", 1, 9.0))
        store.append(_run("p2", "parameter_server", param_servers=4, param_staleness=2), _steps("p2", 3, 3.0))
        store.append(_run("p1", "parameter_server", param_servers=2, param_staleness="async", throughput=20.0),
                     _steps("p1", 2, 2.0))
    return out


def _check(runs: pd.DataFrame, steps: pd.DataFrame) -> None:
    assert sorted(runs["run_id"]) == ["p1", "p2", "r1"]
    by_id = runs.set_index("run_id")
    assert by_id.loc["p1", "status"] == "ok" and by_id.loc["p1", "throughput"] == 20.0  # the latest attempt
    assert int(by_id.loc["p1", "param_servers"]) == 2 and int(by_id.loc["p2", "param_servers"]) == 4
    assert str(by_id.loc["p1", "param_staleness"]) == "async" and str(by_id.loc["p2", "param_staleness"]) == "2"
    assert pd.isna(by_id.loc["r1", "param_servers"])  # ring has no servers
    assert sorted(steps.groupby("run_id").size().items()) == [("p1", 2), ("p2", 3), ("r1", 2)]
    assert set(steps.loc[steps["run_id"] == "p1", "loss"]) == {2.0}  # not the failed attempt's steps
    for column in schema.names(schema.RUNS):
        assert column in runs, column
    for column in schema.names(schema.STEPS):
        assert column in steps, column


def test_plain_read_parquet_of_the_folder_is_not_the_way(mixed):
    """Why the docs point at load_runs and export: pandas takes the first part's columns, keeps every attempt."""
    plain = pd.read_parquet(mixed / "runs")
    assert "param_servers" not in plain.columns or len(plain) == 4


def test_load_runs_and_load_steps(mixed):
    _check(load_runs(mixed), load_steps(mixed))


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_writes_one_file_per_table_with_every_column_latest_attempt_only(mixed, tmp_path, capsys, fmt):
    out = tmp_path / "export"
    assert main(["export", str(mixed), "--out", str(out), "--format", fmt]) == 0
    assert capsys.readouterr().out.split() == [str(out / f"runs.{fmt}"), str(out / f"steps.{fmt}")]
    read = pd.read_parquet if fmt == "parquet" else pd.read_csv
    runs, steps = read(out / f"runs.{fmt}"), read(out / f"steps.{fmt}")
    _check(runs, steps)
    assert sorted(p.name for p in out.iterdir()) == [f"runs.{fmt}", f"steps.{fmt}"]  # no temporary left
    assert main(["export", str(mixed), "--out", str(out), "--format", fmt]) == 0  # replaced whole


def test_export_refuses_what_is_not_results_and_the_results_directory_itself(mixed, tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "holds no results" in capsys.readouterr().err
    for out in (mixed, mixed / "runs"):
        assert main(["export", str(mixed), "--out", str(out)]) == 2
        assert "choose a directory of its own" in capsys.readouterr().err
    assert not (mixed / "runs.parquet").exists()


def test_cli_help_names_the_table_folders(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "runs.parquet" not in text.replace("OUT/runs.parquet", "") and "runs/ and steps/" in text
