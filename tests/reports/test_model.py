"""The cost model: the worked case of issue 5, the formulas, the calibration and the `syncbench model` table."""

import math

import numpy as np
import pytest

import strategies
from reports.model import (
    EXTRAPOLATION_LINKS,
    EXTRAPOLATION_WORKERS,
    MB,
    bandwidth_needed,
    calibrate,
    comm_time,
    extrapolate,
    format_model_table,
    model_numel,
    model_table,
    parallel_efficiency,
)

# VGG-16, ring, n = 4, 125 MB/s, Ts = 0.55 s -> P = 0.0765, Tp = 7.19 s, S(P=0.9) = 13,582 MB/s.
WORKED = dict(workers=4, bandwidth=125e6, step_time=0.55, target_efficiency=0.9, strategies=["ring"])


def test_worked_case_with_model_bytes():
    row = model_table(None, 553.36e6, **WORKED).iloc[0]
    assert round(row["efficiency"], 4) == 0.0765
    assert round(row["step_s"], 2) == 7.19
    assert round(row["bandwidth_needed"] / MB) == 13582
    assert row["path_bytes"] == 1.5 * 553.36e6  # ring: 2(n-1)/n x d


def test_worked_case_with_torchvision_vgg16():
    assert model_numel("vgg16", 1000) == pytest.approx(138.36e6, rel=1e-4)  # ImageNet's head
    row = model_table("vgg16", None, num_classes=1000, **WORKED).iloc[0]
    assert round(row["efficiency"], 4) == 0.0765
    assert round(row["step_s"], 2) == 7.19
    assert row["bandwidth_needed"] / MB == pytest.approx(13582, rel=1e-3)


def test_format_model_table_is_a_plain_table():
    text = format_model_table(model_table(None, 553.36e6, **WORKED))
    assert "13,582" in text and "0.0765" in text and "7.19" in text and "MB = 10^6 bytes" in text
    assert "<" not in text


def test_every_registered_strategy_gets_a_row():
    df = model_table(None, 100e6, workers=4, bandwidth=1.25e9, step_time=0.1)
    assert list(df["strategy"]) == strategies.names()
    ok = df.dropna(subset=["comm_s"])
    assert "ring" in set(ok["strategy"])
    assert ((ok["efficiency"] > 0) & (ok["efficiency"] <= 1)).all()
    if "native" in set(df["strategy"]):
        native = df.set_index("strategy").loc["native"]
        ring = df.set_index("strategy").loc["ring"]
        assert native["path_bytes"] == ring["path_bytes"] and "ring" in native["note"]


def test_bandwidth_needed_formula():
    # Zero latency: S = bytes x P / ((1-P) Ts).
    assert bandwidth_needed(1e9, 0.5, 0.8) == pytest.approx(1e9 * 0.8 / (0.2 * 0.5))
    # Latency eats the budget first: P = 0.8 of Ts = 0.4 s allows 0.1 s of communication; 10 rounds x 2 ms
    # leave 0.08 s for the bytes.
    assert bandwidth_needed(1e9, 0.4, 0.8, rounds=10, latency=2e-3) == pytest.approx(1e9 / 0.08)
    assert bandwidth_needed(1e9, 0.4, 0.8, rounds=50, latency=2e-3) == math.inf
    assert bandwidth_needed(0, 1.0, 0.9) == 0.0
    # The needed bandwidth gives exactly the target efficiency back.
    s = bandwidth_needed(5e8, 0.3, 0.75, rounds=6, latency=1e-4)
    assert parallel_efficiency(0.3, comm_time(6, 5e8, s, 1e-4)) == pytest.approx(0.75)


def test_calibrate_recovers_alpha_and_beta():
    rng = np.random.default_rng(1)
    rounds = rng.integers(1, 40, 30)
    path_bytes = rng.uniform(1e6, 1e9, 30)
    comm = rounds * 80e-6 + path_bytes / 1.25e8
    fit = calibrate(rounds, path_bytes, comm)
    assert fit.alpha == pytest.approx(80e-6, rel=1e-6)
    assert fit.bandwidth == pytest.approx(1.25e8, rel=1e-9)
    assert fit.runs == 30 and fit.rmse < 1e-9


def test_calibrate_keeps_alpha_and_beta_non_negative():
    # Time that falls with rounds would need a negative alpha: the fit sets alpha to 0 instead.
    fit = calibrate([10, 1, 5], [1e6, 1e6, 2e6], [0.01, 0.02, 0.03])
    assert fit.alpha == 0.0 and fit.beta > 0
    fit = calibrate([1, 2, float("nan")], [0, 0, 1], [1e-3, 2e-3, 5.0])  # NaN rows are dropped
    assert fit.runs == 2 and fit.alpha == pytest.approx(1e-3) and fit.beta == 0.0
    with pytest.raises(ValueError, match="calibrate"):
        calibrate([], [], [])


@pytest.mark.parametrize("kwargs, match", [
    (dict(model="vgg16", model_bytes=1e6), "not both"),
    (dict(model=None, model_bytes=None), "neither"),
    (dict(model="gpt2", model_bytes=None), "unknown model 'gpt2'"),
    (dict(model=None, model_bytes=1e6, workers=0), "bad workers 0"),
    (dict(model=None, model_bytes=1e6, bandwidth=-1), "bad bandwidth -1"),
    (dict(model=None, model_bytes=1e6, target_efficiency=1.5), "bad target efficiency 1.5"),
    (dict(model=None, model_bytes=1e6, strategies=["carrier_pigeon"]), "unknown strategy 'carrier_pigeon'"),
])
def test_model_table_errors_name_the_bad_value(kwargs, match):
    args = dict(workers=4, bandwidth=125e6, step_time=0.5) | kwargs
    with pytest.raises(ValueError, match=match):
        model_table(**args)


def test_extrapolation_covers_8_to_1024_at_four_links():
    df = extrapolate(1_000_000, [("ring", "ring", "{}")], alpha=50e-6, compute_s=0.1)
    assert sorted(df["workers"].unique()) == list(EXTRAPOLATION_WORKERS)
    assert set(df["link"]) == set(EXTRAPOLATION_LINKS)
    one = df[(df["workers"] == 8) & (df["link"] == "10 Gbit")].iloc[0]
    assert one["comm_s"] == pytest.approx(14 * 50e-6 + 2 * 7 * 125_000 * 4 / 1.25e9)


def test_byteps_optimum_spans_allreduce_to_m_over_b():
    from reports.model import byteps_optimum

    m, b = 44.7e6, 125e6
    assert byteps_optimum(4, 0, m, b) == pytest.approx(2 * 3 * m / (4 * b))  # an allreduce's bound
    assert byteps_optimum(4, 4, m, b) == pytest.approx(m / b)  # k = n: M / B, 1.5x faster than ring
    assert byteps_optimum(8, 8, m, b) == pytest.approx(m / b)
    assert byteps_optimum(4, 2, m, b) == pytest.approx(2 * 4 * 3 * m / ((16 + 8 - 4) * b))
    assert byteps_optimum(1, 0, m, b) == 0.0


def test_model_takes_strategy_parameters_and_shows_the_optimum():
    from reports.model import parse_strategy

    assert parse_strategy("parameter_server:servers=4,placement=colocated,partition_mb=0.5") == (
        "parameter_server", {"servers": 4, "placement": "colocated", "partition_mb": 0.5})
    assert parse_strategy("reduce_broadcast:tree=false") == ("reduce_broadcast", {"tree": False})
    specs = ["ring", "parameter_server:servers=4,partition_mb=1", "parameter_server:servers=4,placement=colocated"]
    df = model_table(None, 44.7e6, workers=4, bandwidth=125e6, step_time=0.5, strategies=specs).set_index("strategy")
    ring, dedicated, colocated = (df.loc[s] for s in specs)
    assert dedicated["optimum_s"] == pytest.approx(44.7e6 / 125e6)
    assert dedicated["optimum_s"] <= dedicated["comm_s"] <= 1.15 * dedicated["optimum_s"]
    assert dedicated["comm_s"] < 0.75 * ring["comm_s"]
    assert colocated["comm_s"] == ring["comm_s"] and colocated["optimum_s"] == ring["optimum_s"]
    assert "optimum s" in format_model_table(df.reset_index())


@pytest.mark.parametrize("spec, match", [
    ("parameter_server:servers=0", r"servers=0 is not accepted"),
    ("parameter_server:serverz=2", r"unknown parameter\(s\) \['serverz'\].*servers \(default 1\)"),
    ("parameter_server:servers", r"bad strategy parameter 'servers'.*key=value"),
])
def test_model_refuses_bad_strategy_parameters_by_value(spec, match):
    with pytest.raises(ValueError, match=match):
        model_table(None, 1e6, workers=4, bandwidth=125e6, step_time=0.5, strategies=[spec])


def test_a_setting_that_does_not_fit_the_workers_gets_a_row_saying_why():
    df = model_table(None, 1e6, workers=4, bandwidth=125e6, step_time=0.5,
                     strategies=["parameter_server:servers=5,placement=colocated"])
    assert math.isnan(df["comm_s"][0]) and "needs at least 5 workers" in df["note"][0]


def test_local_sgd_is_priced_per_step_as_a_sync_over_h():
    """sync_every = H: one sync's rounds and bytes / H per step in the model table (and a note saying so);
    compression and local SGD are marked inexact."""
    ring = strategies.make("ring").traffic(4, 1_000_000)
    rows = model_table(None, 4e6, workers=4, bandwidth=125e6, step_time=0.1,
                       strategies=["ring", "ring:sync_every=4", "ring:sync_every=16,outer_optimizer=nesterov",
                                   "ring:compression=fp16"])
    every, h4, h16, fp16 = (rows.iloc[i] for i in range(4))
    assert (every["path_bytes"], every["rounds"]) == (ring.path_bytes, ring.rounds)
    assert (h4["path_bytes"], h4["rounds"]) == (ring.path_bytes / 4, ring.rounds / 4)
    assert h16["path_bytes"] == ring.path_bytes / 16 and h16["comm_s"] == pytest.approx(every["comm_s"] / 16)
    assert "one sync every 4 steps" in h4["note"]
    assert h4["exact"].startswith("NOT exact: local steps") and fp16["exact"] == "NOT exact: fp16 compressed gradients"
    assert fp16["path_bytes"] == ring.path_bytes / 2 and every["exact"] == ""


def test_local_sgd_on_nodes_is_priced_as_a_sync_over_h():
    every, h4 = (model_table(None, 4e6, workers=4, bandwidth=125e6, step_time=0.1, strategies=[s], ranks_per_node=2)
                 .iloc[0] for s in ("ring", "ring:sync_every=4"))
    assert (h4["nic_bytes"], h4["intra_bytes"], h4["rounds"]) == (every["nic_bytes"] / 4, every["intra_bytes"] / 4,
                                                                  every["rounds"] / 4)
    assert h4["comm_s"] == pytest.approx(every["comm_s"] / 4)


def test_powersgd_is_priced_per_tensor_from_the_workload_s_shapes():
    """PowerSGD compresses each parameter tensor on its own; priced as one square matrix, the wide CNN's r = 2 bytes
    came out at half of what the runs move (0.0038 of ring's instead of 0.0075)."""
    from reports.model import model_table, workload_shapes
    from strategies.cost import critical_path
    from workloads.models import param_count, param_shapes

    numel = param_count("wide")
    shapes = param_shapes("wide")
    assert workload_shapes("wide", numel) == shapes and workload_shapes("wide", numel + 1) is None
    powersgd = {"compression": "powersgd", "powersgd_rank": 2}
    ring = critical_path("ring", 4, numel)[1]
    per_tensor = critical_path("ring", 4, numel, powersgd, shapes=shapes)[1]
    square = critical_path("ring", 4, numel, powersgd)[1]
    # per tensor at rank 2: P and Q of each weight matrix, the biases sent as they are (what the runs count)
    config = strategies.make("ring", **powersgd)
    assert per_tensor == config.traffic(4, numel, 4, shapes=shapes).path_bytes
    assert per_tensor / ring == pytest.approx(50_808 / 6_779_196, rel=1e-3) and square < per_tensor / 1.5
    table = model_table(model="wide", model_bytes=None, workers=4, bandwidth=125e6, step_time=0.04,
                        strategies=["ring", "ring:compression=powersgd,powersgd_rank=2"])
    assert table["path_bytes"].tolist() == [ring, per_tensor]
    with pytest.raises(ValueError, match="shapes hold 1,129,866 elements, the buffer 1,129,867"):
        critical_path("ring", 4, numel + 1, powersgd, shapes=shapes)
