"""Defaults at their best: a sweep run that leaves a size knob unset takes the value the model prices cheapest for
its workers, servers, buckets and link (strategies/knobs.py), checked here by brute force over the candidates with
the one price, strategies.cost.sync_seconds; an explicit setting is kept and its slowdown against the best
recorded; a value the messages cap refuses is never chosen."""

from __future__ import annotations

import math

import pytest

import strategies
from experiments.config.sweep import parse
from experiments.pipeline.summary import summarize
from strategies.cost import Fabric, sync_seconds
from strategies.knobs import PARTITIONS_MB, SIZE_KNOBS, choose
from workloads.buckets import make_buckets
from workloads.models import param_sizes

GBIT = 125e6


def _run(latency: str, bucket_mb: float, ps: dict):
    sweep = parse({"name": "knobs", "grid": {"strategy": ["parameter_server"], "workers": [4],
                                            "workload": ["resnet18"], "bucket_mb": [bucket_mb],
                                            "link": [{"bandwidth": "1Gbit", "latency": latency}]},
                   "strategy_params": {"parameter_server": ps}})
    [run] = sweep.runs
    return run


def _brute_force(ps: dict, latency_s: float, bucket_mb: float) -> dict[float, float]:
    """Each candidate partition size's model time for one step of resnet18's buckets, priced one by one."""
    sizes = param_sizes("resnet18", 10, 32)
    buckets = [b.numel for b in make_buckets(sizes, bucket_mb)]
    fabric = Fabric(GBIT, latency_s)
    return {p: sum(sync_seconds(strategies.make("parameter_server", **ps, partition_mb=p), 4, n, fabric)
                   for n in buckets) for p in PARTITIONS_MB}


# 4 workers + 4 dedicated servers at 1 Gbit/s (the case: 1 MiB beats the old default of 4 MiB), and the
# same with 50 ms per message, where each partition's latency (one per partition on a worker's connection to a
# server: 1 MiB's 7 a bucket cost more than 4 MiB's 2, and 16 MiB's single partition fills the pipe worst) makes 4 MiB
# cheapest
@pytest.mark.parametrize("latency, latency_s", [("0us", 0.0), ("50ms", 50e-3)])
def test_an_unset_partition_takes_the_models_minimum_and_the_run_records_it(latency, latency_s):
    ps = {"servers": 4, "placement": "dedicated"}
    prices = _brute_force(ps, latency_s, 25.0)
    best = min(prices, key=prices.get)
    assert sorted(prices.values())[1] > prices[best] * 1.01  # a clear minimum, not a tie the order decides
    run = _run(latency, 25.0, ps)
    assert run.strategy_params == {**ps, "partition_mb": best}
    assert run.strategy_config().partition_mb == best
    assert run.knob_choice == {"knob": "partition_mb", "value": best, "chosen": True, "best": best, "slowdown": 1.0}
    row, _ = summarize(run, None, "not run", {"cores": 2, "transport": "sockets"})
    assert row["param_partition_mb"] == best and row["knob"] == "partition_mb" and row["knob_chosen"] is True
    assert row["knob_best"] == best and row["knob_slowdown"] == 1.0
    if latency_s == 0:
        assert best == 1.0  # the observation: 1 MiB, not the strategy's declared 4
    else:
        assert best == 4.0


def test_an_explicit_partition_is_kept_and_its_slowdown_recorded():
    ps = {"servers": 4, "placement": "dedicated", "partition_mb": 16.0}
    prices = _brute_force({"servers": 4, "placement": "dedicated"}, 0.0, 25.0)
    run = _run("0us", 25.0, ps)
    assert run.strategy_params == ps
    choice = run.knob_choice
    assert choice["chosen"] is False and choice["value"] == 16.0 and choice["best"] == 1.0
    assert choice["slowdown"] == pytest.approx(prices[16.0] / prices[1.0], rel=1e-12)
    assert choice["slowdown"] > 1.1
    row, _ = summarize(run, None, "not run", {"cores": 2, "transport": "sockets"})
    assert row["knob_chosen"] is False and row["param_partition_mb"] == 16.0


def test_a_run_the_model_set_is_the_run_the_sweep_sets_to_that_value():
    unset = _run("0us", 25.0, {"servers": 4, "placement": "dedicated"})
    same = _run("0us", 25.0, {"servers": 4, "placement": "dedicated", "partition_mb": 1.0})
    assert unset.strategy_params == same.strategy_params and unset.knob_choice != same.knob_choice
    assert unset.run_id == same.run_id and unset == same  # the same run whether the model or the sweep set 1 MiB
    old = _run("0us", 25.0, {"servers": 4, "placement": "dedicated", "partition_mb": 4.0})
    assert old.run_id != unset.run_id  # results of the declared 4 MiB are another run's
    both = parse({"name": "knobs", "grid": {"strategy": ["parameter_server"], "workers": [4], "workload": ["resnet18"],
                                           "bucket_mb": [25.0], "link": [{"bandwidth": "1Gbit", "latency": "0us"}]},
                  "strategy_params": {"parameter_server": [{"servers": 4, "placement": "dedicated"},
                                                           {"servers": 4, "placement": "dedicated",
                                                            "partition_mb": 1.0}]}})
    assert len(both.runs) == 1  # listed twice, run once


def test_a_value_the_messages_cap_refuses_is_never_chosen():
    """Buckets of 8 MiB price 1 MiB partitions cheapest. A model of 2^34 fp32 elements (64 GiB) in 1 MiB
    partitions over one server is 2^34 / 2^18 = 65,536 partitions, 131,072 messages per sync: over the cap
    (MAX_MESSAGES = 100,000), so 1 MiB is no candidate; 4 MiB (16,384 partitions, 32,768 messages) is the cheapest
    the cap accepts."""
    fabric = Fabric(GBIT)
    buckets = [2 * 2**20] * 4  # 8 MiB each
    ps = {"servers": 1, "placement": "dedicated"}
    free = choose("parameter_server", ps, 4, buckets, fabric, total_numel=sum(buckets))
    assert free.value == 1.0
    capped = choose("parameter_server", ps, 4, buckets, fabric, total_numel=2**34)
    with pytest.raises(ValueError, match="messages"):
        strategies.make("parameter_server", **ps, partition_mb=1.0).check_messages(4, 2**34)
    strategies.make("parameter_server", **ps, partition_mb=4.0).check_messages(4, 2**34)
    assert capped.value == 4.0 and capped.chosen


def test_a_tie_keeps_the_declared_default():
    """The tiny model (one bucket well under 1 MiB) is one partition per server at every size tried: the same sync,
    so the declared 4 MiB stays (the model chose it: nothing is faster)."""
    sweep = parse({"name": "knobs", "grid": {"strategy": ["parameter_server"], "workers": [2], "workload": ["tiny"],
                                            "image_size": [16], "link": [{"bandwidth": "1Gbit"}]},
                   "strategy_params": {"parameter_server": {"servers": 2}}})
    [run] = sweep.runs
    assert run.strategy_params == {"servers": 2, "partition_mb": 4.0} and run.knob_choice["chosen"]


def test_no_link_keeps_the_declared_default_and_says_nothing_was_chosen():
    sweep = parse({"name": "knobs", "grid": {"strategy": ["parameter_server", "double_binary_tree"],
                                            "workers": [4], "workload": ["resnet18"]}})
    for run in sweep.runs:
        assert run.knob_choice is None and "partition_mb" not in run.strategy_params
        assert "chunks" not in run.strategy_params


@pytest.mark.parametrize("strategy, knob, nodes", [("double_binary_tree", "chunks", 1),
                                                   ("hierarchical", "pipeline_mb", 2)])
def test_the_other_size_knobs_take_the_models_minimum(strategy, knob, nodes):
    sweep = parse({"name": "knobs", "grid": {"strategy": [strategy], "workers": [6], "workload": ["resnet18"],
                                            "ranks_per_node": [nodes], "bucket_mb": [25.0],
                                            "link": [{"bandwidth": "10Gbit", "latency": "50us"}]}})
    [run] = sweep.runs
    sizes = param_sizes("resnet18", 10, 32)
    buckets = [b.numel for b in make_buckets(sizes, 25.0)]
    fabric = Fabric(10 * GBIT, 50e-6, nodes)
    extra = {"ranks_per_node": nodes} if nodes > 1 else {}
    default = getattr(strategies.get(strategy), knob)
    tried = (default, *(v for v in SIZE_KNOBS[strategy][1] if v != default))  # the declared default first
    prices = {v: sum(sync_seconds(strategies.make(strategy, **extra, **{knob: v}), 6, n, fabric) for n in buckets)
              for v in tried}
    least = min(prices.values())
    first = next(v for v, s in prices.items() if s == least)  # ties keep the first value tried
    assert run.strategy_params[knob] == first and run.knob_choice["chosen"]
    assert math.isfinite(least)
