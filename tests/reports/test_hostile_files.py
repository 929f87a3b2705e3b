"""A results directory whose sweep.toml was crafted (issue 27): nested thousands deep or with 400-digit numbers, it
is shown as text and the report is built; it used to be a RecursionError."""

from __future__ import annotations

import pytest

from experiments.cli.main import main


@pytest.mark.parametrize("text", [
    'description = "deep"\nx = ' + "[" * 5000 + "]" * 5000 + "\n",
    'description = "digits"\nx = ' + "9" * 5000 + "\n",
])
def test_a_sweep_toml_nested_thousands_deep_in_results_still_gives_a_report(results_dir, capsys, text):
    (results_dir / "sweep.toml").write_text(text)
    assert main(["report", str(results_dir)]) == 0, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err
    assert text.splitlines()[1][:20] in (results_dir / "report.html").read_text()  # shown as the text it is
