"""The parameter server's settings in sweeps and on the command line: a list of values is a grid axis, every
varying axis is shown, bad values are refused before any actor starts."""

import pytest

from experiments.config.sweep import SweepError, parse, run_label, varying_axes


def sweep(params, grid=None):
    return parse({"name": "ps", "defaults": {"workers": 4, "workload": "tiny"},
                  "grid": grid or {"strategy": ["ring", "parameter_server"]},
                  "strategy_params": {"parameter_server": params}})


def test_a_list_of_strategy_parameter_values_is_a_grid_axis_of_that_strategy_only():
    runs = sweep({"servers": [1, 2, 4], "placement": ["dedicated", "colocated"], "mode": "summation"}).runs
    ps = [r for r in runs if r.strategy == "parameter_server"]
    assert len(runs) == 1 + 6 and len({r.run_id for r in runs}) == 7
    assert sorted((r.strategy_params["servers"], r.strategy_params["placement"]) for r in ps) == [
        (1, "colocated"), (1, "dedicated"), (2, "colocated"), (2, "dedicated"), (4, "colocated"), (4, "dedicated")]
    assert all(r.strategy_params["mode"] == "summation" for r in ps)
    axes = varying_axes(runs)
    assert axes == ["strategy", "servers", "placement"]
    labels = [run_label(r, axes) for r in runs]
    assert len(set(labels)) == len(labels) and "parameter_server servers=4 placement=colocated" in labels
    assert "ring" in labels  # ring has no servers: its label does not pretend it has


def test_every_varying_run_setting_is_an_axis():
    runs = sweep({"servers": 2}, grid={"strategy": ["parameter_server"], "bucket_mb": [1.0, 25.0],
                                       "link": [{"bandwidth": "1Gbit"}, {"bandwidth": "1Gbit", "ranks": {
                                           "0": {"bandwidth": "100Mbit"}}}]}).runs
    axes = varying_axes(runs)
    assert axes == ["link", "bucket_mb"]
    assert len({run_label(r, axes) for r in runs}) == 4


@pytest.mark.parametrize("params, pattern", [
    ({"servers": [1, 0]}, r"servers=0 is not accepted: use an integer >= 1"),
    ({"partition_mb": [4, -1]}, r"partition_mb=-1 is not accepted"),
    ({"staleness": -2}, r"staleness=-2 is not accepted"),
    ({"placement": "rack"}, r"placement='rack' is not accepted"),
    ({"mode": "sgd"}, r"mode='sgd' is not accepted"),
    ({"backups": 4}, r"backups=4 is not accepted with workers=4: use 0 <= backups < 4"),
])
def test_bad_values_are_refused_when_the_sweep_is_read(params, pattern):
    with pytest.raises((SweepError, ValueError), match=pattern):
        sweep(params)


def test_barrier_free_servers_take_buckets_overlap_and_summation_but_not_colocated_placement():
    runs = sweep({"staleness": [2, "async"], "mode": ["summation", "update"]},
                 grid={"strategy": ["parameter_server"], "bucket_mb": [4.0], "overlap": [True, False]}).runs
    assert len(runs) == 8
    with pytest.raises((SweepError, ValueError), match=r"staleness=2, backups=0 need placement='dedicated', got "
                                                       r"placement='colocated'"):
        sweep({"staleness": 2, "placement": "colocated"})
    assert len(sweep({"staleness": [0, 2, "async"]}).runs) == 4
