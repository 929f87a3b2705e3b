"""A link outage in a sweep's failure schedule: normalized beside rank failures, checked before any work, refused by
a substrate that cannot apply it."""

from __future__ import annotations

import textwrap

import pytest

from experiments.config import sweep as sweep_mod
from experiments.config.sweep import SweepError
from experiments.pipeline.substrate import Run, ThreadSubstrate

BASE = """
name = "outages"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 10
warmup_steps = 1
workers = 4
strategy = "ring"
"""


def load(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(BASE + text))
    return sweep_mod.load(path)


def test_an_outage_is_normalized_beside_a_rank_failure(tmp_path):
    [run] = load(tmp_path, 'failures = { schedule = [{ link = 2, step = 5, seconds = 1.5 }, { rank = 0, step = 7 }] }\n'
                           'recovery = { mode = "elastic" }\n').runs
    assert run.failures == {"schedule": [[7, 0]], "outages": [[5, 2, 1.5]]}


def test_outages_alone(tmp_path):
    [run] = load(tmp_path, 'failures = { schedule = [{ link = 1, step = 3, seconds = 2 }, '
                           '{ link = 0, step = 1, seconds = 0.25 }] }\n').runs
    assert run.failures == {"outages": [[1, 0, 0.25], [3, 1, 2.0]]}
    assert ThreadSubstrate().problems(Run(run.run_id, run)) == []  # applied: experiments/pipeline/sweep_outages.py
    from experiments.pipeline.ray_sweep_faults import problems

    assert any("a link outage in failures.schedule" in p and "--substrate threads" in p for p in problems(run))


@pytest.mark.parametrize("row, fragment", [
    ("{ link = 4, step = 1, seconds = 1 }", "link outage link = 4: the run has ranks 0..3"),
    ("{ link = 1, step = 10, seconds = 1 }", "link outage step = 10: the run has steps 0..9"),
    ("{ link = 1, step = 1, seconds = 0 }", "link outage seconds = 0: accepted are seconds > 0 and at most 3600"),
    ("{ link = 1, step = 1, seconds = 7200 }", "link outage seconds = 7200"),
    ('{ link = 1, step = 1, seconds = "1s" }', "link outage seconds = '1s'"),
    ("{ link = 1, step = 1 }", "expected { link = <rank>, step = <integer>, seconds = <number> }"),
    ("{ link = 1.5, step = 1, seconds = 1 }", "expected { link = <rank>"),
    ("{ link = 1, step = 1, seconds = 1, rank = 1 }", "expected { link = <rank>"),
    ("{ node = 1, step = 1 }", "(a rank that fails) or { link = <rank>"),
])
def test_bad_outages_are_refused_before_work(tmp_path, row, fragment):
    with pytest.raises(SweepError) as info:
        load(tmp_path, f"failures = {{ schedule = [{row}] }}\n")
    assert fragment in str(info.value), str(info.value)
