"""The table of sweep settings (experiments/config/settings.py): every run setting has one row, and a row's type
and range give the sweep's errors."""

import dataclasses
import math
import pickle
from dataclasses import fields, replace
from pathlib import Path

import pytest

from experiments.config import sweep
from experiments.config.run import RUN_KEYS, RunSpec
from experiments.config.settings import BY_NAME, NEVER, SETTINGS, TYPES, SweepError

SWEEPS = Path(__file__).resolve().parents[2] / "experiments" / "config" / "sweeps"

TABLES = {"link", "straggler", "failures", "recovery", "target"}  # table settings: their keys are rows (link.x)
STRUCTURAL = ["sweep", "strategy_params", "repeat", "knob_choice"]  # RunSpec fields the sweep makes, not sets


def test_every_run_setting_has_one_row_and_every_row_is_a_run_setting():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)), "a setting defined twice"
    top = {n for n in names if "." not in n}
    assert top == RUN_KEYS
    assert {n.split(".")[0] for n in names if "." in n} <= TABLES
    assert {n for n in top if BY_NAME[n].type is dict} == TABLES
    for one in SETTINGS:
        assert one.meaning, one.name
        if one.type in (int, float):
            assert one.range is not None, f"{one.name}: a number without a range"


def test_the_run_spec_is_made_from_the_rows_in_their_order_with_their_types_and_defaults():
    rows = [s for s in SETTINGS if s.run_field]
    assert [f.name for f in fields(RunSpec)] == ["sweep", *[s.name for s in rows], *STRUCTURAL[1:]]
    spec = RunSpec()
    for one in rows:
        assert getattr(spec, one.name) == one.default, one.name
        assert one.default is None or isinstance(one.default, one.type), one.name
        assert one.default is None or one.problem(one.default) is None, f"{one.name}: its default is refused"
    by_field = {f.name: f for f in fields(RunSpec)}
    assert by_field["bucket_mb"].type == float | None and by_field["workers"].type is int
    assert by_field["link"].type == dict | None
    assert pickle.loads(pickle.dumps(spec)) == spec and type(pickle.loads(pickle.dumps(spec))) is RunSpec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.workers = 2


@pytest.mark.parametrize("changes, run_id", [
    # ids written by the hand-written RunSpec before it was made from the table (resume relies on them)
    ({}, "555436b47442baa7d2113ce97d41495d"),
    ({"p2p": "gloo"}, "1fe86e4cb3d567d382b61802765440a1"),  # gloo, p2p's omitted value: not in the id
    ({"p2p": "gloo", "eval_every": 11, "compression": "fp16"}, "cc8f6e846dd8b61da4ae42192abe7c0d"),
    ({"p2p": "gloo", "repeat": 1, "trace_steps": 0, "bucket_mb": 1.0}, "149c125aa812153116ab0c378826d3d7"),
])
def test_a_setting_added_later_is_left_out_of_the_run_id_at_its_omitted_value(changes, run_id):
    assert BY_NAME["p2p"].id_omitted() == "gloo" and BY_NAME["workers"].id_omitted() is NEVER
    assert BY_NAME["eval_every"].id_omitted() == 10
    spec = replace(RunSpec(workload="tiny", workers=2), **changes)
    assert spec.run_id == f"ring-n2-tiny-full_speed-{run_id}"


def test_every_shipped_run_keeps_its_id():
    """The runs of the shipped sweeps (run and simulate; 417, a new sweep appends its lines) keep the ids they had
    before the RunSpec was made from the table (tests/experiments/shipped_run_ids.txt, written at that commit):
    their results still resume."""
    from experiments.simulate.substrate import load as load_simulated

    got = []
    for path in sorted(SWEEPS.glob("*.toml")):
        runs = load_simulated(path)[0].runs if "\n[simulate]" in path.read_text() else sweep.load(path).runs
        got += [f"{path.name} {run.run_id}" for run in runs]
    assert got == (Path(__file__).parent / "shipped_run_ids.txt").read_text().splitlines()


@pytest.mark.parametrize("name, value, message", [
    ("workers", True, "workers = True: expected int"),  # a bool is not an int
    ("workers", 4.0, "workers = 4.0: expected int"),
    ("lr", "0.1", "lr = '0.1': expected a number"),
    ("overlap", "false", "overlap = 'false': expected true or false"),
    ("lr", math.nan, "lr = nan: must be a finite number, values > 0 and <= 100"),
    ("lr", 0, "lr = 0: accepted are values > 0 and <= 100"),
    ("momentum", 1.0, "momentum = 1.0: accepted are values >= 0 and < 1"),
    ("seed", 2**80, "seed = 1208925819614629174706176: accepted are values >= 0 and <= 2,147,483,647"),
    ("failures.seed", -1, "failures.seed = -1: accepted are whole numbers 0 to 2,147,483,647"),
])
def test_a_row_names_the_bad_value_and_what_is_accepted(name, value, message):
    assert BY_NAME[name].problem(value) == message


@pytest.mark.parametrize("name, value", [("workers", 16_384), ("lr", 1), ("momentum", 0), ("overlap", False),
                                         ("compression", "fp16"), ("straggler.slowdown", 100)])
def test_a_value_in_its_row_is_accepted(name, value):
    assert BY_NAME[name].problem(value) is None


def test_the_sweep_reports_the_rows_messages_and_takes_an_int_for_a_float():
    with pytest.raises(SweepError) as info:
        sweep.parse({"defaults": {"workload": "tiny", "workers": True, "lr": "x"}})
    assert "workers = True: expected int" in str(info.value) and "lr = 'x': expected a number" in str(info.value)
    run = sweep.parse({"defaults": {"workload": "tiny", "lr": 1, "steps": 4, "warmup_steps": 1}}).runs[0]
    assert run.lr == 1.0 and isinstance(run.lr, float)
    assert set(TYPES) <= set(BY_NAME)
