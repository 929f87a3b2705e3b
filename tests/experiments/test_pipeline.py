"""One pipeline for every substrate: the same rows from a measured and a simulated run, honest byte counts on every
substrate, and runs bounded by their timeout. Thread ranks and SimGrid: no Ray, seconds each."""

from __future__ import annotations

import io
import time
import tomllib
from dataclasses import dataclass

import pytest

import strategies
from experiments.config import sweep as sweep_mod
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.substrate import ThreadSubstrate
from experiments.results import schema
from strategies.base import Strategy
from strategies.ring import RingConfig
from strategies.transport.simgrid import simgrid_available
from tests.experiments.test_overlap import synthetic_profile
from tests.helpers import SIMULATE_TOML as SIMULATE
from tests.helpers import tiny_sweep_toml

TINY = tiny_sweep_toml(["ring", "parameter_server", "decentralized"])


@pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")
def test_a_simulated_and_a_measured_run_of_one_sweep_give_rows_of_the_same_columns_and_types(tmp_path):
    """The tiny sweep measured on thread ranks and simulated on SimGrid through the one runner: runs and steps
    have the same columns with the same types, and the same byte counts (the strategies' own code on both)."""
    from experiments.simulate.substrate import simulate_sweep

    measured = run_sweep(sweep_mod.parse(tomllib.loads(TINY), source=TINY), tmp_path / "measured",
                         log=io.StringIO(), substrate=ThreadSubstrate())
    (tmp_path / "tiny.toml").write_text(TINY + SIMULATE)
    simulated = simulate_sweep(tmp_path / "tiny.toml", tmp_path / "simulated", log=io.StringIO())
    for runs in (measured, simulated):
        assert len(runs) == 3 and (runs["status"] == "ok").all(), runs["error"].tolist()
    assert set(simulated["substrate"]) == {"simgrid"} and set(measured["substrate"]) == {"threads"}
    assert list(measured.columns) == list(simulated.columns)
    assert measured.dtypes.to_dict() == simulated.dtypes.to_dict()
    assert set(schema.names(schema.RUNS)) <= set(measured.columns)
    by_strategy = lambda runs: runs.set_index("strategy")["bytes_sent_per_worker"].to_dict()  # noqa: E731
    assert by_strategy(measured) == by_strategy(simulated)
    from experiments.pipeline.store import Store

    steps = [Store(tmp_path / name).steps() for name in ("measured", "simulated")]
    assert list(steps[0].columns) == list(steps[1].columns)
    assert steps[0].dtypes.to_dict() == steps[1].dtypes.to_dict()


class _BackendInside(Strategy):
    """Moves the gradients with the backend's allreduce, which the communicator does not count."""

    def _sync(self, flat, op):
        self.comm.native_allreduce(flat, op)


@dataclass(frozen=True)
class LyingConfig(RingConfig):
    """A plug-in declaring ring's traffic (and counted = True) while its bytes bypass the counters."""

    name = "lying_ring"
    summary = "ring's traffic declared, the backend's allreduce inside"
    runtime = _BackendInside


def test_a_plugin_whose_bytes_bypass_the_counters_fails_naming_both_byte_counts(tmp_path, monkeypatch):
    monkeypatch.setitem(strategies.registry._REGISTRY, LyingConfig.name, LyingConfig)
    text = tiny_sweep_toml(["lying_ring", "native", "ring"])
    runs = run_sweep(sweep_mod.parse(tomllib.loads(text), source=text), tmp_path, log=io.StringIO(),
                     substrate=ThreadSubstrate()).set_index("strategy")
    lying = runs.loc["lying_ring"]
    declared = RingConfig().traffic(2, int(runs.loc["ring", "numel"])).ranks[0]
    assert lying["status"] == "failed", "a run whose counters disagree with its traffic() was recorded ok"
    assert "measured 0 bytes sent / 0 received" in lying["error"], lying["error"]
    assert f"declares {declared.bytes_sent:,} / {declared.bytes_recv:,}" in lying["error"], lying["error"]
    assert "counted = False" in lying["error"]
    # the honest ones: ring's counters equal its declaration; native says counted = False and is typed so
    assert runs.loc["ring", "status"] == "ok" and runs.loc["ring", "bytes_counted"]
    assert runs.loc["native", "status"] == "ok" and not runs.loc["native", "bytes_counted"]
    assert runs.loc["native", "bytes_sent_per_worker"] == 0


@pytest.mark.timing
@pytest.mark.parametrize("forward_s, names", [(1e4, "timeout = 20 s"), (1e5, "forward_s")])
def test_a_replayed_step_longer_than_the_timeout_ends_at_once_naming_it(tmp_path, forward_s, names):
    """A profile whose step outlasts the run's timeout never starts a rank that would go silent for it: the sweep
    is refused before any actor (1e5 s is beyond a profile's range and refused by name as it is read)."""
    profile = tmp_path / "slow.json"
    synthetic_profile(profile)
    text = profile.read_text().replace('"forward_s": 0.06', f'"forward_s": {forward_s}')
    assert text != profile.read_text()
    profile.write_text(text)
    sweep = f"""
name = "slow"
[defaults]
workload = "resnet18"
batch_size = 16
image_size = 32
steps = 2
warmup_steps = 1
timeout = 20
compute = "profile"
profile = "{profile}"
[grid]
workers = [2]
"""
    start = time.monotonic()
    with pytest.raises(ValueError, match=names):
        run_sweep(sweep_mod.parse(tomllib.loads(sweep), source=sweep), tmp_path / "out", log=io.StringIO())
    assert time.monotonic() - start < 30
    assert not (tmp_path / "out").exists()  # refused before the results directory, before Ray


@pytest.mark.timing
def test_a_measured_profile_longer_than_the_timeout_fails_the_run_on_every_rank(tmp_path):
    """The check holds inside the ranks too (a profile measured at the run's start is known only there)."""
    from types import SimpleNamespace

    from experiments.config.sweep import RunSpec
    from experiments.pipeline.train import train
    from strategies.transport.threads import run_threads

    synthetic_profile(tmp_path / "p.json", forward_s=30.0)
    spec = RunSpec(workload="resnet18", batch_size=16, image_size=32, steps=2, warmup_steps=0, workers=2,
                   timeout=20, compute="profile", profile=str(tmp_path / "p.json"))

    def body(comm):
        return train(SimpleNamespace(rank=comm.rank, world_size=2, comm=comm, device="cpu", state={}), spec)

    start = time.monotonic()
    with pytest.raises(Exception, match=r"one replayed step takes 30.14 s .*timeout = 20 s"):
        run_threads(2, body, timeout=20)
    assert time.monotonic() - start < 30
