"""What derives from the table of settings: docs/settings.md's tables (generated, and a failure when the committed
page is out of date), `syncbench schema --settings`, and a new setting that is one row and nothing else."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli.main import main
from experiments.config import settings_doc, sweep
from experiments.config.settings import SETTINGS
from experiments.config.simulate_table import SIMULATE_RANGES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "settings.md"


def test_the_committed_page_has_the_tables_the_table_of_settings_makes():
    page = PAGE.read_text()
    assert settings_doc.render(page) == page, \
        f"docs/settings.md is out of date: run `{settings_doc.COMMAND}`"
    for one in SETTINGS:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{one.name}` |"))
        assert one.meaning in row and settings_doc.default_text(one) in row, row
    for key, accepted in SIMULATE_RANGES.items():
        assert f"| `{key}` | {accepted.describe()} |" in page


def test_check_fails_on_a_stale_page_and_write_mends_it_keeping_the_prose(tmp_path, capsys):
    stale = PAGE.read_text().replace("| `workers` | integer | 1 |", "| `workers` | integer | 4 |")
    path = tmp_path / "settings.md"
    path.write_text(stale)
    assert settings_doc.main(["--check", str(path)]) == 1
    assert settings_doc.COMMAND in capsys.readouterr().err
    assert settings_doc.main(["--write", str(path)]) == 0
    assert path.read_text() == PAGE.read_text() and settings_doc.main(["--check", str(path)]) == 0


def test_a_page_without_its_markers_is_refused_naming_them(tmp_path, capsys):
    path = tmp_path / "settings.md"
    path.write_text(PAGE.read_text().replace(settings_doc.RUN_MARKERS[1], ""))
    assert settings_doc.main(["--write", str(path)]) == 2
    assert settings_doc.RUN_MARKERS[1] in capsys.readouterr().err


def test_schema_settings_lists_every_setting_with_its_default_and_range(capsys):
    assert main(["schema", "--settings"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for one in SETTINGS:
        line = next(line for line in lines if line.startswith(f"{one.name} "))
        assert settings_doc.default_text(one) in line and settings_doc.accepted_text(one) in line, line


# A new setting as a plug-in author would add it: this row in experiments/config/settings.py and nothing else.
NEW_ROW = ('    Setting("label_smoothing", float, "the loss\'s label smoothing", Range(0, 1, high_open=True), '
           'default=0.0, omitted_at=AT_DEFAULT),\n')
CHILD = r'''
import contextlib, io, json, pickle, sys, types
from dataclasses import fields
from pathlib import Path

import experiments.config

path = Path(experiments.config.__file__).parent / "settings.py"
text = path.read_text()
assert text.count("\n)\nBY_NAME") == 1
module = types.ModuleType("experiments.config.settings")
module.__file__ = str(path)
sys.modules[module.__name__] = experiments.config.settings = module
exec(compile(text.replace("\n)\nBY_NAME", "\n" + sys.argv[1] + ")\nBY_NAME"), str(path), "exec"), module.__dict__)

from experiments.cli.main import main
from experiments.config import settings_doc, sweep
from experiments.config.run import RunSpec

BASE = {"workload": "tiny", "workers": 2, "steps": 4, "warmup_steps": 1}


def problems(**values):
    try:
        sweep.parse({"defaults": {**BASE, **values}})
    except sweep.SweepError as e:
        return str(e)
    return ""


unset, smoothed = (sweep.parse({"defaults": {**BASE, **extra}}).runs[0] for extra in ({}, {"label_smoothing": 0}))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["schema", "--settings"])
print(json.dumps({
    "field": [(f.name, f.type.__name__, f.default) for f in fields(RunSpec) if f.name == "label_smoothing"],
    "unset": [unset.label_smoothing, unset.run_id],
    "smoothed": [smoothed.label_smoothing, type(smoothed.label_smoothing).__name__, smoothed.run_id],
    "grid": [[run.label_smoothing, run.run_id] for run in sweep.parse({"defaults": BASE,
                                                                        "grid": {"label_smoothing": [0.1, 0.2]}}).runs],
    "pickled": pickle.loads(pickle.dumps(smoothed)) == smoothed,
    "not_a_number": problems(label_smoothing="x"),
    "out_of_range": problems(label_smoothing=1.0),
    "misspelt": problems(label_smothing=0.1),
    "page": settings_doc.render((Path("docs") / "settings.md").read_text()),
    "schema": out.getvalue(),
}))
'''


@pytest.mark.slow  # a subprocess importing the whole CLI (3 s): out of make test-fast
def test_a_new_setting_is_one_row_parse_checks_docs_and_schema_take_it_from_there():
    """The settings module run with one more row (the file as it would be, nothing else changed): the RunSpec has
    the field with its default, a sweep sets it and lists it, bad values are refused naming the row's range, the
    run id of a run that leaves it unset stays what it was, the docs' table and `syncbench schema --settings` list
    it."""
    child = subprocess.run([sys.executable, "-c", CHILD, NEW_ROW], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(child.stdout)
    before = sweep.parse({"defaults": {"workload": "tiny", "workers": 2, "steps": 4, "warmup_steps": 1}}).runs[0]
    assert seen["field"] == [["label_smoothing", "float", 0.0]]
    assert seen["unset"] == [0.0, before.run_id]  # added later: earlier runs keep their ids
    assert seen["smoothed"][:2] == [0.0, "float"] and seen["smoothed"][2] == before.run_id
    assert [value for value, _ in seen["grid"]] == [0.1, 0.2] and seen["pickled"]
    assert len({run_id for _, run_id in seen["grid"]} | {before.run_id}) == 3  # set, it is a run of its own
    assert "label_smoothing = 'x': expected a number" in seen["not_a_number"]
    assert "label_smoothing = 1.0: accepted are values >= 0 and < 1" in seen["out_of_range"]
    assert "unknown key 'defaults.label_smothing'" in seen["misspelt"] and "label_smoothing" in seen["misspelt"]
    assert "| `label_smoothing` | number | 0.0 | values >= 0 and < 1 |  | the loss's label smoothing |" in seen["page"]
    assert seen["page"] != PAGE.read_text()  # the committed page is then out of date: the test above says so
    assert any(line.startswith("label_smoothing ") and "values >= 0 and < 1" in line
               for line in seen["schema"].splitlines())
