"""The table of sweep settings (experiments/config/settings.py): every run setting has one row, and a row's type
and range give the sweep's errors."""

import math
from dataclasses import fields

import pytest

from experiments.config import sweep
from experiments.config.run import RUN_KEYS, RunSpec
from experiments.config.settings import BY_NAME, SETTINGS, TYPES, SweepError

TABLES = {"link", "straggler", "failures", "recovery", "target"}  # table settings: their keys are rows (link.x)


def test_every_run_setting_has_one_row_and_every_row_is_a_run_setting():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)), "a setting defined twice"
    top = {n for n in names if "." not in n}
    assert top == RUN_KEYS - TABLES, (sorted(RUN_KEYS - TABLES - top), sorted(top - RUN_KEYS))
    assert {n.split(".")[0] for n in names if "." in n} <= TABLES
    defaults = {f.name for f in fields(RunSpec)}
    assert top - {"repeats"} <= defaults  # a row's default is its RunSpec field
    for one in SETTINGS:
        assert one.meaning, one.name
        if one.type in (int, float):
            assert one.range is not None, f"{one.name}: a number without a range"


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
