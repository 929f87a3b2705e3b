"""The sweep's failures and recovery settings: normalized, checked before any work, refused where they cannot run."""

from __future__ import annotations

import textwrap

import pytest

from experiments.config import sweep as sweep_mod
from experiments.config.faults import parse_mtbf
from experiments.config.sweep import RunSpec, SweepError
from experiments.pipeline.substrate import Run, ThreadSubstrate

BASE = """
name = "faults"
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


def refused(tmp_path, text: str) -> str:
    with pytest.raises(SweepError) as info:
        load(tmp_path, text)
    return str(info.value)


def test_a_schedule_and_a_mode_are_normalized_into_the_run(tmp_path):
    sweep = load(tmp_path, 'failures = { schedule = [{ rank = 2, step = 5 }, { rank = 0, step = 1 }] }\n'
                           'recovery = { mode = "elastic", rejoin_steps = 3 }\n')
    [run] = sweep.runs
    assert run.failures == {"schedule": [[1, 0], [5, 2]]}
    assert run.recovery == {"mode": "elastic", "checkpoint_every": 0, "rejoin_steps": 3}


def test_a_rate_and_a_grid_of_modes(tmp_path):
    sweep = load(tmp_path, 'failures = { mtbf = "7.9h", seed = 3 }\n'
                           '[grid]\nrecovery = [{ mode = "checkpoint_restart", checkpoint_every = 5 }, '
                           '{ mode = "elastic" }, { mode = "none" }]\n')
    assert [r.recovery["mode"] for r in sweep.runs] == ["checkpoint_restart", "elastic", "none"]
    assert all(r.failures == {"mtbf_s": pytest.approx(7.9 * 3600), "seed": 3} for r in sweep.runs)
    assert len({r.run_id for r in sweep.runs}) == 3


def test_runs_without_failures_keep_their_ids():
    assert RunSpec(workload="tiny", workers=4).run_id == RunSpec(workload="tiny", workers=4, failures=None).run_id


@pytest.mark.parametrize("lines, fragment", [
    ('recovery = { mode = "elastic" }\n', "without failures: nothing to recover from"),
    ('failures = { schedule = [{ rank = 4, step = 1 }] }\n', "failure rank = 4: the run has ranks 0..3"),
    ('failures = { schedule = [{ rank = 1, step = 10 }] }\n', "failure step = 10: the run has steps 0..9"),
    ('failures = { schedule = [{ rank = 1 }] }\n', "expected { rank = <integer>, step = <integer> }"),
    ('failures = { schedule = [] }\n', "expected a non-empty list"),
    ('failures = { mtbf = "7.9h", schedule = [{ rank = 1, step = 2 }] }\n', "not both"),
    ('failures = { seed = 1 }\n', "not neither"),
    ('failures = { mtbf = "soon" }\n', "failures.mtbf = 'soon'"),
    ('failures = { mtbf = 0.5 }\n', "failures.mtbf = 0.5: accepted is"),
    ('failures = { mtbf = "1h", seed = -1 }\n', "failures.seed = -1"),
    ('failures = { rate = 2 }\n', "expected { schedule"),
    ('failures = { mtbf = "1h" }\nrecovery = { mode = "checkpoint_restart" }\n', "checkpoint_every = 0"),
    ('failures = { mtbf = "1h" }\nrecovery = { mode = "rewind" }\n', "recovery.mode = 'rewind'"),
    ('failures = { mtbf = "1h" }\nrecovery = { mode = "reweight" }\n', "accepted is decentralized"),
    ('failures = { mtbf = "1h" }\nrecovery = { mode = "ps_shrink" }\n', "accepted are strategies with server ranks"),
    ('strategy = "parameter_server"\nfailures = { schedule = [{ rank = 4, step = 1 }] }\n'
     'recovery = { mode = "ps_shrink" }\n', "server rank 4 at step 1"),
    ('strategy = "decentralized"\nfailures = { mtbf = "1h" }\nrecovery = { mode = "elastic" }\n',
     "does not fit strategy 'decentralized'"),
])
def test_bad_failure_settings_are_refused_before_work(tmp_path, lines, fragment):
    text = BASE + lines
    if lines.startswith("strategy"):  # a second strategy line replaces the base's
        text = text.replace('strategy = "ring"\n', "")
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(SweepError) as info:
        sweep_mod.load(path)
    assert fragment in str(info.value), str(info.value)


def test_the_server_failure_is_accepted_with_checkpoint_restart(tmp_path):
    text = (BASE.replace('strategy = "ring"\n', 'strategy = "parameter_server"\n')
            + 'failures = { schedule = [{ rank = 4, step = 1 }] }\n'
              'recovery = { mode = "checkpoint_restart", checkpoint_every = 2 }\n')
    path = tmp_path / "s.toml"
    path.write_text(text)
    [run] = sweep_mod.load(path).runs
    assert run.failures == {"schedule": [[1, 4]]}


def test_the_thread_substrate_applies_failures(tmp_path):
    [run] = load(tmp_path, 'failures = { schedule = [{ rank = 1, step = 2 }] }\n').runs
    assert ThreadSubstrate().problems(Run(run.run_id, run)) == []


@pytest.mark.parametrize("text, seconds", [("7.9h", 7.9 * 3600), ("30min", 1800), ("2d", 172800), ("90s", 90),
                                           (120, 120), ("1.8 hours", 1.8 * 3600)])
def test_mtbf_units(text, seconds):
    assert parse_mtbf(text) == pytest.approx(seconds)
