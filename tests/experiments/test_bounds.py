"""Settings that pass validation never become memory or time bombs: the message count a partition, chunk or
pipeline setting implies for the run's array (strategies.base.MAX_MESSAGES) and the link inside a node are checked
before any work, naming the value and the accepted range; `simulate --bench` takes the sweeps' rank limit."""

from __future__ import annotations

import re
import textwrap
import time

import pytest

import strategies
from experiments.cli.main import main
from experiments.config import sweep as sweep_mod
from experiments.config.sweep import MAX_RANKS, SweepError
from strategies.base import MAX_MESSAGES
from workloads.models import param_count

SWEEP = """
name = "bounds"
[defaults]
workload = "{workload}"
image_size = 32
batch_size = 8
steps = 3
warmup_steps = 1
workers = {workers}
strategy = "{strategy}"
{extra}
[strategy_params.{strategy}]
{params}
"""


def _load(tmp_path, strategy: str, params: str, workload: str = "resnet50", workers: int = 4, extra: str = ""):
    path = tmp_path / "s.toml"
    path.write_text(textwrap.dedent(SWEEP.format(workload=workload, workers=workers, strategy=strategy,
                                                 params=params, extra=extra)))
    return sweep_mod.load(path)


@pytest.mark.timing  # an upper bound on wall time: out of make test-fast
@pytest.mark.parametrize("strategy, params, fragments", [
    ("parameter_server", "partition_mb = 1e-9", ["parameter_server", "partition_mb from", "100,000"]),
    ("parameter_server", "partition_mb = 1e-6", ["parameter_server", "partition_mb from"]),
    ("node_parameter_server", "partition_mb = 1e-9\nranks_per_node = 2",
     ["node_parameter_server", "partition_mb from"]),
    ("hierarchical", "pipeline_mb = 1e-12", ["hierarchical", "pipeline_mb >="]),
    ("double_binary_tree", "chunks = 1000000000", ["chunks = 1000000000", "from 1 to 8,333"]),
    ("parameter_server", "partition_mb = 1e300", ["partition_mb=1e+300", "at most 1,000,000"]),
])
def test_a_setting_that_would_cut_the_model_into_too_many_messages_is_refused_fast(tmp_path, strategy, params,
                                                                                     fragments):
    started = time.perf_counter()
    with pytest.raises(SweepError) as info:
        _load(tmp_path, strategy, params, workers=8)
    assert time.perf_counter() - started < 10  # (was 36 s and 7.1 GB, or a MemoryError)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_the_accepted_bound_named_is_the_bound(tmp_path):
    """At the partition_mb and pipeline_mb the error names the sweep loads; at half of it, it is refused."""
    numel = param_count("resnet50", 1000, 32)
    for name, key, params in (("parameter_server", "partition_mb", {"servers": 3}),
                              ("node_parameter_server", "partition_mb", {"ranks_per_node": 2}),
                              ("hierarchical", "pipeline_mb", {"ranks_per_node": 2})):
        config = strategies.make(name, **params, **{key: 1e-9})
        with pytest.raises(ValueError) as info:
            config.check_messages(8, numel)
        low = float(re.search(rf"{key} (?:from|>=) ([0-9.e-]+)", str(info.value)).group(1))
        ok = strategies.make(name, **params, **{key: low})
        assert ok.messages(8, numel) <= MAX_MESSAGES
        ok.check_messages(8, numel)
        with pytest.raises(ValueError, match=key):
            strategies.make(name, **params, **{key: low / 2}).check_messages(8, numel)
    # the count is the plan's: partitions() cut as many as partition_count() says
    from strategies.parameter_server import partition_count, partitions

    for numel, servers, mb in ((1000, 3, 1e-4), (12345, 4, 3e-4), (7, 8, 1e-6), (0, 2, 1.0)):
        assert partition_count(numel, servers, 4, mb) == sum(len(p) for p in partitions(numel, servers, 4, mb))


@pytest.mark.timing  # an upper bound on wall time: out of make test-fast
def test_a_runtime_refuses_an_array_cut_into_too_many_messages_before_sending():
    """The same bound where a runtime meets the array (verify, bench, a plug-in's caller): before any message."""
    import numpy as np

    from strategies.testing import run_collective

    started = time.perf_counter()
    inputs = [np.ones(MAX_MESSAGES, np.float32)] * 2
    with pytest.raises(Exception, match="messages per worker") as info:
        run_collective("parameter_server", inputs, partition_mb=1e-6, timeout=20)
    assert "partition_mb from" in str(info.value)
    assert time.perf_counter() - started < 15


@pytest.mark.parametrize("link, fragment", [
    ('{ bandwidth = "1Gbit", intra_bandwidth = "1bit" }', "link.intra_bandwidth = 0.125 bytes/s"),
    ('{ bandwidth = "1Gbit", intra_latency = "2s" }', "link.intra_latency = 2 s"),
])
def test_the_link_inside_a_node_is_range_checked(tmp_path, link, fragment):
    with pytest.raises(SweepError) as info:
        _load(tmp_path, "ring", "", workload="tiny", extra=f"link = {link}\nranks_per_node = 2")
    assert fragment in str(info.value) and "accepted are" in str(info.value)


@pytest.mark.timing  # an upper bound on wall time: out of make test-fast
def test_cli_refuses_bombs_in_one_line(capsys):
    started = time.perf_counter()
    assert main(["model", "--model", "resnet50", "--workers", "4", "--bandwidth", "1Gbit", "--step-time", "0.1",
                 "--strategy", "parameter_server:partition_mb=1e-9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "partition_mb from" in err
    assert time.perf_counter() - started < 10
    assert main(["model", "--model", "resnet50", "--workers", "4", "--bandwidth", "1Gbit", "--step-time", "0.1",
                 "--ranks-per-node", "2", "--intra-bandwidth", "1bit"]) == 2
    assert "--intra-bandwidth '1bit'" in capsys.readouterr().err
    assert main(["bench", "--workers", "2", "--bandwidth", "1Gbit", "--ranks-per-node", "2",
                 "--intra-latency", "2s"]) == 2
    assert "--intra-latency '2s'" in capsys.readouterr().err
    for workers in ("1000000", "0", "x"):
        assert main(["simulate", "--bench", "--workers", workers]) == 2
        err = capsys.readouterr().err
        assert f"--workers '{workers}'" in err and f"1 to {MAX_RANKS:,}" in err


@pytest.mark.parametrize("traffic, fragment", [
    ("raises", "numel = 2,147,483,659 (OverflowError: too large for this plug-in)"),
    ("raises_awkward", "numel = 7 (ZeroDivisionError"),
    ("not_traffic", "to return a Traffic (got dict)"),
])
def test_a_plugin_traffic_that_fails_on_some_size_is_refused_at_registration(traffic, fragment):
    """model, the report and a sweep price sizes after the run's work: registration asks every variant first."""
    from strategies.registry import register

    base = strategies.get("ring")

    def raises(self, workers, numel, itemsize=4):
        if numel > 2**31:
            raise OverflowError("too large for this plug-in")
        return base.traffic(self, workers, numel, itemsize)

    def raises_awkward(self, workers, numel, itemsize=4):
        return base.traffic(self, workers, numel, itemsize) if numel != 7 else 1 // 0

    def not_traffic(self, workers, numel, itemsize=4):
        return base.traffic(self, workers, numel, itemsize) if numel < 100 else {"bytes": 0}

    cls = type("Fragile", (base,), {"name": "fragile", "traffic": locals()[traffic]})
    with pytest.raises(ValueError, match="cannot be registered") as info:
        register(cls)
    assert fragment in str(info.value) and "fragile" in str(info.value)
    assert "fragile" not in strategies.names()


def test_a_strategy_declared_identical_whose_ranks_end_different_is_recorded_failed_naming_the_rank(tmp_path,
                                                                                                 monkeypatch):
    import io
    import tomllib
    from dataclasses import dataclass

    import torch

    from experiments.pipeline.runner import run_sweep
    from experiments.pipeline.substrate import ThreadSubstrate
    from strategies.ring import RingConfig
    from tests.helpers import tiny_sweep_toml

    class Drifting(RingConfig.runtime):
        """An honest ring allreduce, then rank 1 one float32 ulp off: bytes and traffic agree, only the bits
        differ (as a plug-in whose reduction order depends on the rank)."""

        def _sync(self, flat, op):
            super()._sync(flat, op)
            if self.rank == 1:
                flat.copy_(torch.nextafter(flat, torch.full_like(flat, float("inf"))))

    @dataclass(frozen=True)
    class DriftingConfig(RingConfig):
        name = "drifting_ring"
        summary = "ring, with rank 1 one ulp off"
        runtime = Drifting

    monkeypatch.setitem(strategies.registry._REGISTRY, DriftingConfig.name, DriftingConfig)
    text = tiny_sweep_toml(["drifting_ring", "ring"])
    runs = run_sweep(sweep_mod.parse(tomllib.loads(text), source=text), tmp_path, log=io.StringIO(),
                     substrate=ThreadSubstrate()).set_index("strategy")
    assert runs.loc["ring", "status"] == "ok", runs.loc["ring", "error"]
    drifting = runs.loc["drifting_ring"]
    assert drifting["status"] == "failed", "ranks that ended different were recorded ok"
    assert "worker rank 1 ended with parameters different from rank 0's" in drifting["error"], drifting["error"]


def test_a_synthetic_split_that_overflows_or_underflows_never_makes_a_zero_second_profile(tmp_path, capsys):
    from workloads.profile import load_profile

    out = tmp_path / "p.json"
    assert main(["profile", "--workload", "resnet18", "--synthetic", "--step-time", "0.1",
                 "--split", "1e308,1e308,1", "--out", str(out)]) == 0
    profile = load_profile(out)
    assert profile.step_s == pytest.approx(0.1) and profile.forward_s == pytest.approx(0.05)
    assert profile.backward_s == pytest.approx(0.05)
    capsys.readouterr()
    assert main(["profile", "--workload", "resnet18", "--synthetic", "--step-time", "1e-300",
                 "--split", "1e-300,1,0", "--out", str(tmp_path / "q.json")]) == 2
    assert "forward time underflows to 0 s" in capsys.readouterr().err
    assert not (tmp_path / "q.json").exists()


def test_profile_checks_where_it_writes_before_measuring(tmp_path, capsys, monkeypatch):
    import tempfile

    import workloads.profile as profile_mod

    def measured(*a, **k):
        raise AssertionError("measured before the output path was checked")

    monkeypatch.setattr(profile_mod, "measure_profile", measured)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "profiles").write_text("a file where the default directory goes")
    assert main(["profile", "--workload", "tiny", "--batch-size", "4"]) == 2
    assert "'profiles' is a file" in capsys.readouterr().err

    def read_only(*a, **k):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    assert main(["profile", "--workload", "tiny", "--batch-size", "4", "--out", str(tmp_path / "x" / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not writable (Read-only file system)" in err


def test_staleness_beyond_any_run_is_refused_naming_async():
    with pytest.raises(ValueError, match=r"staleness=1000000000 .* from 1 to 1,000,000 .* 'async'"):
        strategies.make("parameter_server", staleness=10**9)
    assert strategies.make("parameter_server", staleness=1_000_000).staleness == 1_000_000


def test_bench_ps_fits_its_server_counts_to_the_workers_and_leaves_no_temporary_directory(monkeypatch, capsys):
    """`bench --ps --workers 2` was refused naming colocated servers = 4 (a setting the user never gave), and every
    call left a syncbench-ps-* directory behind."""
    from pathlib import Path

    from experiments.bench import parameter_server as ps

    seen = {}

    def fake(out_dir, workers, bandwidth, latency, partition_mb, servers, *rest):
        seen.update(dir=Path(out_dir), servers=servers)
        assert Path(out_dir).is_dir()
        return "table"

    monkeypatch.setattr(ps, "_ps_bench", fake)
    assert ps.ps_bench(workers=2) == "table"
    assert seen["servers"] == [1, 2] and not seen["dir"].exists()
    assert main(["bench", "--ps", "--workers", "1"]) == 2
    assert "--workers 1: accepted are 2 or more workers" in capsys.readouterr().err


@pytest.mark.timing  # an upper bound on wall time: out of make test-fast
def test_a_batch_that_cannot_fit_is_refused_before_measuring_or_any_run(tmp_path, capsys):
    started = time.perf_counter()
    with pytest.raises(SweepError, match=r"batch_size = 65,536 of resnet50 at 224x224 needs about .* GB .* "
                                         r"accepted here are batches up to about"):
        sweep_mod.parse({"name": "big", "defaults": {"workload": "resnet50", "image_size": 224, "batch_size": 65536,
                                                     "num_classes": 1000, "strategy": "ring", "workers": 2}})
    # a simulation computes nothing: it is not refused for it
    simulated = sweep_mod.parse({"name": "big", "defaults": {"workload": "resnet50", "image_size": 224,
                                                             "batch_size": 65536, "strategy": "ring", "workers": 2}},
                                measured=False)
    assert len(simulated.runs) == 1
    assert main(["profile", "--workload", "resnet50", "--image-size", "224", "--batch-size", "65536",
                 "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "accepted here are batches up to about" in err
    assert not (tmp_path / "p.json").exists()
    assert time.perf_counter() - started < 30


@pytest.mark.timing  # the runs beside it must finish inside timeout = 3 s (at load 20 one did not)
@pytest.mark.parametrize("workers", [1, 2])
def test_a_thread_run_longer_than_its_timeout_is_stopped_and_failed_and_the_sweep_goes_on(tmp_path, workers):
    """The timeout bounds a whole run, whatever its settings: a million tiny steps under timeout = 3 stop at
    3 s (1 worker: between steps; 2 workers: the waits too), recorded failed naming the timeout, and the runs
    before and after it are measured and kept."""
    import io
    import tomllib

    from experiments.pipeline.runner import run_sweep
    from experiments.pipeline.substrate import ThreadSubstrate

    text = textwrap.dedent(f"""
        name = "bounded"
        [defaults]
        workload = "tiny"
        image_size = 16
        batch_size = 8
        warmup_steps = 1
        strategy = "ring"
        workers = {workers}
        timeout = 3
        [grid]
        steps = [3, 1000000, 4]
        """)
    start = time.perf_counter()
    runs = run_sweep(sweep_mod.parse(tomllib.loads(text), source=text), tmp_path, log=io.StringIO(),
                     substrate=ThreadSubstrate()).set_index("steps")
    took = time.perf_counter() - start
    assert runs.loc[1000000, "status"] == "failed", "a run past its timeout was recorded ok"
    assert "timeout = 3 s" in runs.loc[1000000, "error"], runs.loc[1000000, "error"]
    assert runs.loc[1000000, "duration_s"] < 3 + 5, runs.loc[1000000, "duration_s"]
    for steps in (3, 4):
        assert runs.loc[steps, "status"] == "ok", runs.loc[steps, "error"]
    assert took < 60, took


@pytest.mark.timing  # an upper bound on wall time: out of make test-fast
def test_thread_ranks_deep_in_messages_stop_at_the_run_timeout():
    """Within one step of endless small messages (each wait far inside the per-wait timeout, as a partition of
    millions): the run's deadline aborts every wait, and the failure names the run's timeout."""
    import torch

    from strategies.transport.threads import run_threads

    def ping_pong(comm):
        t = torch.zeros(1)
        while True:
            if comm.rank == 0:
                comm.send(t, 1)
                comm.recv(t, 1)
            else:
                comm.recv(t, 0)
                comm.send(t, 0)

    start = time.perf_counter()
    with pytest.raises(Exception, match=r"the run passed its timeout = 1 s"):
        run_threads(2, ping_pong, timeout=20, run_timeout=1)
    assert time.perf_counter() - start < 10
