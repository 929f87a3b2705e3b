"""Results stay inside --out: a table folder, part, temporary file or report that is a symbolic link is refused
with its path named, before any work, and a victim directory outside --out survives `run --overwrite`,
`run --resume` and `report` untouched. No Ray: the store API builds the results, the refusals come first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from experiments.cli.main import main
from experiments.pipeline.store import Store, StoreError
from experiments.results import dataset, schema
from tests.helpers import tiny_sweep_toml


def _run(run_id: str, strategy: str = "ring", **values) -> dict:
    base = {"sweep": "tiny", "workers": 2, "status": "ok", "link_bandwidth": 125e6, "link_latency_s": 50e-6,
            "started_at": "2026-01-01T12:00:00+00:00"}
    return schema.row(schema.RUNS, run_id=run_id, strategy=strategy, **{**base, **values})


def _steps(run_id: str, n: int = 2) -> list[dict]:
    return [schema.row(schema.STEPS, run_id=run_id, step=i, rank=0, role="worker", timed=True) for i in range(n)]


def _victim(root: Path) -> dict[Path, bytes]:
    """A directory outside --out holding files the store's names would match (parts and temporaries)."""
    victim = root / "victim"
    victim.mkdir()
    files = {victim / "00000000.parquet": b"precious 0", victim / "00000007.parquet": b"precious 7",
             victim / "00000000.parquet.tmp": b"precious tmp", victim / "notes.txt": b"precious notes"}
    for path, data in files.items():
        path.write_bytes(data)
    return files


def _intact(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        assert path.is_file() and path.read_bytes() == data, f"{path} was touched"
    assert sorted(p.name for p in next(iter(files)).parent.iterdir()) == sorted(p.name for p in files)


def _results(out: Path) -> None:
    with Store(out) as store:
        store.append(_run("a"), _steps("a"))
        store.append(_run("b"), _steps("b"))


@pytest.fixture
def plain_page(monkeypatch):
    """The report's page rendered as one fixed line: for tests of where report.html goes and how a failed write is
    told, not of what the page says (rendering two runs' figures took 2-3 s of the fast tier per test)."""
    import reports.page

    monkeypatch.setattr(reports.page, "render", lambda results: "<html>the report</html>")


def _plant(out: Path, how: str, victim: Path) -> Path:
    """One way a results directory can point outside itself; the link's path."""
    if how == "runs folder":
        for part in (out / "runs").iterdir():
            part.unlink()
        (out / "runs").rmdir()
        link = out / "runs"
        os.symlink(victim, link)
    elif how == "steps folder":
        for part in (out / "steps").iterdir():
            part.unlink()
        (out / "steps").rmdir()
        link = out / "steps"
        os.symlink(victim, link)
    elif how == "part":
        link = out / "runs" / "00000005.parquet"
        os.symlink(victim / "00000007.parquet", link)
    elif how == "temporary part":
        link = out / "steps" / "00000009.parquet.tmp"
        os.symlink(victim / "00000000.parquet.tmp", link)
    elif how == "report tmp":
        link = out / "report.html.tmp"
        os.symlink(victim / "notes.txt", link)
    elif how == "report":
        link = out / "report.html"
        os.symlink(victim / "notes.txt", link)
    else:
        raise AssertionError(how)
    return link


HOW = ["runs folder", "steps folder", "part", "temporary part", "report tmp", "report"]


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("command", ["overwrite", "resume", "report"])
def test_a_link_out_of_the_results_directory_is_refused_and_the_victim_survives(tmp_path, capsys, how, command):
    out = tmp_path / "out"
    _results(out)
    files = _victim(tmp_path)
    link = _plant(out, how, tmp_path / "victim")
    sweep = tmp_path / "s.toml"
    sweep.write_text(tiny_sweep_toml(["ring"]))
    argv = {"overwrite": ["run", str(sweep), "--out", str(out), "--overwrite", "--substrate", "threads"],
            "resume": ["run", str(sweep), "--out", str(out), "--resume", "--substrate", "threads"],
            "report": ["report", str(out)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert str(link) in err and "symbolic link" in err
    assert "runs" not in capsys.readouterr().out  # refused before any run
    _intact(files)
    assert link.is_symlink()  # left for the user to see


def test_a_link_planted_at_a_temporary_name_while_writing_is_replaced_not_followed(tmp_path, monkeypatch):
    """A link that appears at a part's temporary name after the checks: the writer removes the link (never its
    target) and creates its own file, O_EXCL | O_NOFOLLOW."""
    out = tmp_path / "out"
    files = _victim(tmp_path)
    store = Store(out)
    store.lock()
    (out / "runs").mkdir()
    os.symlink(tmp_path / "victim" / "00000000.parquet", out / "runs" / "00000000.parquet.tmp")
    monkeypatch.setattr(dataset, "_refuse_link", lambda path: None)  # as if planted after every check
    store.append(_run("a"), _steps("a"))
    store.write_text("sweep.toml", "name = 'x'\n")
    store.close()
    _intact(files)
    assert list(Store(out).runs()["run_id"]) == ["a"]


def test_out_itself_may_be_a_link_to_a_directory(tmp_path, plain_page):
    """--out is the user's choice: a link there is where they want results; only what is inside is checked."""
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "out")
    _results(tmp_path / "out")
    assert main(["report", str(tmp_path / "out")]) == 0
    assert (real / "report.html").read_text() == "<html>the report</html>" and (real / "runs").is_dir()


def test_a_report_that_cannot_be_written_is_one_line_and_leaves_no_temporary(tmp_path, capsys, monkeypatch,
                                                                              plain_page):
    out = tmp_path / "out"
    _results(out)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "report.html" in err
    assert not (out / "report.html.tmp").exists() and not (out / "report.html").exists()


def test_store_refuses_a_linked_table_folder_naming_it(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", out / "steps")
    with pytest.raises(StoreError, match=r"steps.*symbolic link"):
        Store(out)


def test_a_finished_sweep_whose_report_cannot_be_written_exits_0_saying_why(tmp_path, capsys, monkeypatch,
                                                                            plain_page):
    """The runs are stored: a report that cannot be written (full disk) is one line, not a failed command."""
    from experiments.pipeline import runner

    out = tmp_path / "out"

    def run_sweep(sweep, out_dir, **kw):
        _results(out_dir)
        return Store(out_dir).runs()

    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    real_replace = os.replace

    def replace(src, dst):
        if str(dst).endswith("report.html"):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    sweep = tmp_path / "s.toml"
    sweep.write_text(tiny_sweep_toml(["ring"]))
    assert main(["run", str(sweep), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "report: not written" in err and "No space left on device" in err and "Traceback" not in err
    assert not (out / "report.html.tmp").exists()


def test_resume_checks_every_part_before_any_run(tmp_path, capsys):
    """A steps part cut short (a full disk, a copy) is named at once, not by the report after the sweep."""
    out = tmp_path / "out"
    _results(out)
    part = out / "steps" / "00000001.parquet"
    part.write_bytes(part.read_bytes()[:50])
    sweep = tmp_path / "s.toml"
    sweep.write_text(tiny_sweep_toml(["ring"], name="tiny"))
    assert main(["run", str(sweep), "--out", str(out), "--resume", "--substrate", "threads"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(part) in err and "not a readable Parquet file" in err
    assert sorted(Store(out).runs()["run_id"]) == ["a", "b"]  # nothing ran


@pytest.mark.simgrid
def test_simulate_writes_report_html_as_run_does(tmp_path, capsys):
    from strategies.transport.simgrid import simgrid_available
    from tests.helpers import SIMULATE_TOML

    if simgrid_available():
        pytest.skip(simgrid_available())
    sweep = tmp_path / "s.toml"
    sweep.write_text(tiny_sweep_toml(["ring"], name="sim") + SIMULATE_TOML)
    assert main(["simulate", str(sweep), "--out", str(tmp_path / "sim")]) == 0
    assert (tmp_path / "sim" / "report.html").is_file()
    assert f"report: {tmp_path / 'sim' / 'report.html'}" in capsys.readouterr().out


def test_progress_lines_name_every_setting_that_varies(tmp_path):
    """A parameter-server grid on the simulator: four runs differing only in servers and placement print four
    different lines, each naming both (they printed four identical lines)."""
    from experiments.pipeline.runner import progress_line, varying_settings
    from experiments.simulate.substrate import SimGridSubstrate, load
    from tests.helpers import SIMULATE_TOML

    text = tiny_sweep_toml(["parameter_server"], name="ps", workers=4).replace(
        "[strategy_params.parameter_server]\nservers = 1\n", "") + SIMULATE_TOML + "".join(
        f'\n[[strategy_params.parameter_server]]\nservers = {k}\nplacement = "{p}"\n'
        for k in (1, 2) for p in ("dedicated", "colocated"))
    (tmp_path / "ps.toml").write_text(text)
    substrate = SimGridSubstrate(load(tmp_path / "ps.toml")[1])
    runs = substrate.runs()
    varying = varying_settings(runs)
    lines = [progress_line(substrate, run, varying) for run in runs]
    assert len(runs) == 4 and len(set(lines)) == 4, lines
    for line in lines:
        assert "servers=" in line and "placement=" in line, line


def test_ctrl_c_is_named_not_an_empty_pair_of_parentheses(capsys, monkeypatch):
    import importlib

    cli = importlib.import_module("experiments.cli.main")

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "schema", interrupted)
    assert main(["schema"]) == 130
    err = capsys.readouterr().err
    assert "interrupted (SIGINT, Ctrl-C)" in err and "()" not in err


@pytest.mark.slow  # a whole sweep on thread ranks and its report through the CLI: in make test
def test_skip_invalid_runs_the_valid_points_and_lists_the_others_with_their_reason(tmp_path, capsys):
    import html

    text = tiny_sweep_toml(["parameter_server"], name="skip").replace(
        "servers = 1", 'servers = [1, 4]\nplacement = "colocated"')
    sweep = tmp_path / "s.toml"
    sweep.write_text(text)
    out = tmp_path / "out"
    assert main(["run", str(sweep), "--out", str(out), "--substrate", "threads"]) == 2  # refused, as before
    assert "servers=4 with placement='colocated' needs at least 4 workers" in capsys.readouterr().err
    assert main(["run", str(sweep), "--out", str(out), "--substrate", "threads", "--skip-invalid"]) == 0
    err = capsys.readouterr().err
    assert "skipped grid point [" in err and "servers=4" in err and "needs at least 4 workers" in err
    runs = Store(out).runs()
    assert len(runs) == 1 and int(runs["param_servers"].iloc[0]) == 1
    page = html.unescape((out / "report.html").read_text())
    assert "Not run:" in page and "needs at least 4 workers" in page


def test_a_per_rank_link_applies_to_the_runs_that_have_that_rank(tmp_path):
    """A slow NIC on rank 1 beside a 1-worker baseline (the one scaling efficiency needs): the baseline keeps the
    default link (and its label says so), the 2- and 4-worker runs get the override; a rank no run has is refused."""
    from experiments.config import sweep as sweep_mod
    from experiments.config.sweep import SweepError

    text = tiny_sweep_toml(["ring"], link='{ bandwidth = "1Gbit", ranks = { 1 = { bandwidth = "100Mbit" } } }')
    text = text.replace("workers = [2]", "workers = [1, 2, 4]")
    (tmp_path / "s.toml").write_text(text)
    runs = {run.workers: run for run in sweep_mod.load(tmp_path / "s.toml").runs}
    assert sorted(runs) == [1, 2, 4]
    assert "ranks" not in runs[1].link and "heterogeneous" not in runs[1].link_label
    for n in (2, 4):
        assert runs[n].link["ranks"] == {"1": {"bandwidth": "100Mbit"}} and "heterogeneous" in runs[n].link_label
    (tmp_path / "t.toml").write_text(text.replace("ranks = { 1 =", "ranks = { 9 ="))
    with pytest.raises(SweepError, match=r"link.ranks.9: no run of the sweep has rank 9"):
        sweep_mod.load(tmp_path / "t.toml")


@pytest.mark.slow  # a whole sweep on thread ranks and its report through the CLI: in make test
def test_the_report_condition_names_the_runs_that_had_a_per_rank_link(tmp_path, capsys):
    """The runs table records which ranks had a link of their own (link_ranks) and the report's condition names
    them: the 2-worker run's says rank 1 is on its own link, the 1-worker baseline's only the default link."""
    import html

    from reports.load import load_runs

    text = tiny_sweep_toml(["ring"], link='{ bandwidth = "1Gbit", ranks = { 1 = { bandwidth = "100Mbit" } } }')
    (tmp_path / "s.toml").write_text(text.replace("workers = [2]", "workers = [1, 2]"))
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(out), "--substrate", "threads"]) == 0
    capsys.readouterr()
    runs = load_runs(out).set_index("workers")
    assert list(runs.loc[2, "link_ranks"]) == [1] and list(runs.loc[1, "link_ranks"]) == []
    assert "rank 1 on its own link" in runs.loc[2, "condition_label"], runs.loc[2, "condition_label"]
    assert "own link" not in runs.loc[1, "condition_label"] and "heterogeneous" not in runs.loc[1, "condition_label"]
    assert runs.loc[1, "condition_label"].startswith("1Gbit"), runs.loc[1, "condition_label"]
    page = html.unescape((out / "report.html").read_text())
    assert "1Gbit (rank 1 on its own link)" in page


def test_simulate_skip_invalid_simulates_the_valid_points(tmp_path, capsys):
    from strategies.transport.simgrid import simgrid_available
    from tests.helpers import SIMULATE_TOML

    if simgrid_available():
        pytest.skip(simgrid_available())
    text = tiny_sweep_toml(["parameter_server"], name="skipsim").replace(
        "servers = 1", 'servers = [1, 4]\nplacement = "colocated"') + SIMULATE_TOML
    (tmp_path / "s.toml").write_text(text)
    out = tmp_path / "sim"
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--no-report"]) == 2
    capsys.readouterr()
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--no-report", "--skip-invalid"]) == 0
    assert "skipped grid point [" in capsys.readouterr().err
    assert len(Store(out).runs()) == 1 and "needs at least 4 workers" in (out / "skipped.json").read_text()

