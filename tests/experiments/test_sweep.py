"""Sweep files: every bad-config kind is rejected with its key, value and what is accepted, before Ray."""

import textwrap
from pathlib import Path

import pytest

from experiments.config import sweep as sweep_mod
from experiments.config.sweep import SweepError

GOOD = """
name = "quick"
[defaults]
workload = "resnet18"
image_size = 32
batch_size = 32
steps = 20
warmup_steps = 3
device = "cpu"
seed = 0
link = { bandwidth = "1Gbit", latency = "50us" }
[grid]
strategy = ["parameter_server", "reduce_broadcast", "all_to_all", "halving_doubling", "ring", "decentralized", "native"]
workers = [1, 2, 4]
[strategy_params.parameter_server]
servers = 1
partition_mb = 4.0
[strategy_params.decentralized]
topology = "ring"
"""


def load_text(tmp_path, text):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(text))
    return sweep_mod.load(path)


def test_issue_example_expands_to_the_full_grid(tmp_path):
    sweep = load_text(tmp_path, GOOD)
    assert len(sweep.runs) == 21
    assert {r.strategy for r in sweep.runs} >= {"ring", "parameter_server", "native"}
    ps = [r for r in sweep.runs if r.strategy == "parameter_server"][0]
    assert ps.strategy_params == {"servers": 1, "partition_mb": 4.0}
    assert ps.world_size() == ps.workers + 1
    assert ps.network().default.bandwidth == 125e6
    # ids are stable (resume relies on them) and unique
    again = load_text(tmp_path, GOOD)
    assert [r.run_id for r in sweep.runs] == [r.run_id for r in again.runs]
    assert len({r.run_id for r in sweep.runs}) == 21


def test_shipped_sweeps_parse():
    from pathlib import Path

    files = sorted(Path("experiments/config/sweeps").glob("*.toml"))
    assert {f.stem for f in files} >= {"quick", "bandwidth", "scaling", "convergence", "stragglers"}
    for f in files:
        if "\n[simulate]" in f.read_text():  # a simulated sweep: `syncbench simulate` reads it, `run` refuses it
            from experiments.simulate.substrate import load as load_simulated

            assert load_simulated(f)[1]
            with pytest.raises(sweep_mod.SweepError, match="run this file with `syncbench simulate`"):
                sweep_mod.load(f)
        else:
            assert sweep_mod.load(f).runs


@pytest.mark.parametrize("edit, expected", [
    (("[defaults]", "[defaults]\nbatchsize = 3"), ["defaults.batchsize", "accepted are"]),
    (("batch_size = 32", 'batch_size = "32"'), ["batch_size = '32'", "expected int"]),
    (('"native"]', '"native", "butterfly"]'), ["strategy = 'butterfly'", "accepted are", "ring"]),
    (('workload = "resnet18"', 'workload = "alexnet"'), ["workload = 'alexnet'", "resnet50", "tiny"]),
    (("workers = [1, 2, 4]", "workers = [0, 2]"), ["workers = 0", ">= 1"]),
    (("image_size = 32", "image_size = 16"), ["resnet18", "16", "32"]),
    (('bandwidth = "1Gbit"', 'bandwidth = "fast"'), ["'fast'", "1Gbit", "125MB/s"]),
    (('device = "cpu"', 'device = "tpu"'), ["device = 'tpu'", "cpu, cuda"]),
    (("servers = 1", "servers = 0"), ["servers", "0", ">= 1"]),
    (('topology = "ring"', 'topology = "star"'), ["star", "torus", "exponential"]),
    (("[strategy_params.decentralized]", "[strategy_params.decentralised]"), ["decentralised", "unknown strategy"]),
    (("warmup_steps = 3", "warmup_steps = 20"), ["warmup_steps = 20", "less than steps"]),
    (('name = "quick"', 'name = "quick"\nworkers = 3'), ["unknown top-level key 'workers'"]),
])
def test_bad_configs_are_rejected_with_key_value_and_accepted(tmp_path, edit, expected):
    old, new = edit
    assert old in GOOD
    with pytest.raises(SweepError) as info:
        load_text(tmp_path, GOOD.replace(old, new, 1))
    message = str(info.value)
    for fragment in expected:
        assert fragment in message, (fragment, message)


def test_every_problem_is_reported_at_once(tmp_path):
    bad = GOOD.replace('workload = "resnet18"', 'workload = "alexnet"').replace('device = "cpu"', 'device = "tpu"')
    with pytest.raises(SweepError) as info:
        load_text(tmp_path, bad)
    assert "alexnet" in str(info.value) and "tpu" in str(info.value)


def test_not_toml_and_missing_file(tmp_path):
    with pytest.raises(SweepError, match="not valid TOML"):
        load_text(tmp_path, "name = ")
    with pytest.raises(SweepError, match="does not exist"):
        sweep_mod.load(tmp_path / "nope.toml")


def test_straggler_and_link_shorthand(tmp_path):
    text = GOOD.replace('link = { bandwidth = "1Gbit", latency = "50us" }',
                        'link = "10Gbit"\nstraggler = { ranks = [1], slowdown = 2.0 }')
    # a straggler rank that a run does not have is refused (it would record a balanced run as a straggler one)
    with pytest.raises(SweepError, match=r"straggler.ranks = \[1\]: workers = 1 has worker ranks 0..0 only"):
        load_text(tmp_path, text)
    sweep = load_text(tmp_path, text.replace("workers = [1, 2, 4]", "workers = [2, 4]"))
    four = [r for r in sweep.runs if r.workers == 4][0]
    assert four.straggler == {"ranks": [1], "slowdown": 2.0}
    assert four.network().default.bandwidth == 10e9 / 8
    with pytest.raises(SweepError, match="slowdown"):
        load_text(tmp_path, text.replace("slowdown = 2.0", "slowdown = 0.5"))


def test_repeats_expand_each_run_with_the_next_seeds():
    base = {"defaults": {"workload": "tiny", "workers": 2, "seed": 7}, "grid": {"strategy": ["ring", "native"]}}
    once = sweep_mod.parse(base).runs
    thrice = sweep_mod.parse({**base, "defaults": {**base["defaults"], "repeats": 3}}).runs
    assert [r.repeat for r in once] == [0, 0]
    assert len(thrice) == 6 and len({r.run_id for r in thrice}) == 6
    rings = [r for r in thrice if r.strategy == "ring"]
    assert [(r.seed, r.repeat) for r in rings] == [(7, 0), (8, 1), (9, 2)]
    # repeat 0 is the run a sweep without repeats names: the same id, its results resume
    assert {r.run_id for r in once} <= {r.run_id for r in thrice}
    in_grid = sweep_mod.parse({**base, "grid": {**base["grid"], "repeats": [1, 2]}}).runs
    assert len(in_grid) == 4  # repeats 1 and 2: the first repeat of each is one run


@pytest.mark.parametrize("value, fragment", [(0, "repeats = 0: accepted are values >= 1"),
                                             ("3", "repeats = '3': expected int"),
                                             (True, "repeats = True: expected int")])
def test_bad_repeats_are_refused_naming_the_value(value, fragment):
    with pytest.raises(SweepError, match=fragment.replace("(", r"\(")):
        sweep_mod.parse({"defaults": {"workload": "tiny", "repeats": value}})


def test_profile_runs_crossed_with_real_ones_under_a_target_are_their_twins_without_a_target():
    """[grid] compute = ["real", "profile"] under a [defaults] target: the real runs train to it, the profile runs
    (which do not train) run without it and give the real runs' seconds per step (reports/tta.py); alone, a profile
    run with a target is still refused."""
    data = {"name": "twins", "defaults": {"workload": "tiny", "dataset": "digits", "image_size": 8, "steps": 4,
                                          "target": {"metric": "accuracy", "value": 0.9}},
            "grid": {"compute": ["real", "profile"], "strategy": ["ring"], "workers": [2]}}
    runs = sweep_mod.parse(data).runs
    assert {(r.compute, r.target is not None) for r in runs} == {("real", True), ("profile", False)}
    # a [defaults] profile goes to the twins only (the real runs compute)
    profile = str(Path(__file__).resolve().parents[2] / "workloads/profiles/tiny-b32-s16-synthetic.json")
    runs = sweep_mod.parse({**data, "defaults": {**data["defaults"], "image_size": 16, "batch_size": 32,
                                                 "profile": profile}}).runs
    assert {(r.compute, r.target is not None, r.profile) for r in runs} == {("real", True, None),
                                                                          ("profile", False, profile)}
    alone = {**data, "grid": {"compute": ["profile"], "strategy": ["ring"], "workers": [2]}}
    with pytest.raises(SweepError, match="target with compute = 'profile'"):
        sweep_mod.parse(alone)
