"""Every `syncbench` verb and bench mode run once in its short form, in-process through experiments.cli.main, with
its argument validation: a bad value is exit status 2 and one line naming the option, before anything runs.

Ray-starting cases are few and share the session's Ray (the `ray_session` fixture); each takes seconds.
"""

from __future__ import annotations

import functools
import json

import pytest

import strategies
from experiments.cli.main import main
from strategies.transport.simgrid import simgrid_available


def _run(capsys, *argv) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def _refused(capsys, *argv) -> str:
    """The command's stderr, asserting it exited 2 with one `syncbench <verb>: error:` line."""
    status, out, err = _run(capsys, *argv)
    assert status == 2, (argv, status, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"syncbench {argv[0]}: error: "), err
    return lines[0]


def _usage_error(capsys, *argv) -> str:
    """argparse's refusal (missing or ill-typed option): SystemExit 2 and a usage line naming the option."""
    with pytest.raises(SystemExit) as stop:
        main(list(argv))
    assert stop.value.code == 2
    return capsys.readouterr().err


# -- strategies, schema --------------------------------------------------------------------------------------


def test_strategies_lists_every_registered_strategy_with_its_role_and_parameters(capsys):
    status, out, _ = _run(capsys, "strategies")
    assert status == 0
    for name in strategies.names():
        cls = strategies.get(name)
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
        for param, default in cls.parameters().items():
            assert f"{param}={default!r}" in out, (name, param)
    assert "role: server" in out and "role: gradients" in out and "role: parameters" in out


def test_schema_lists_every_column_of_both_tables(capsys):
    from experiments.results import describe

    status, out, _ = _run(capsys, "schema")
    assert status == 0
    listed = {line.split()[0] for line in out.splitlines() if line.strip() and not line.startswith("#")}
    # every column the pipeline writes is described, by name (the schema's own describe() is what prints)
    for column in ("run_id", "strategy", "workers", "throughput", "step_time_s", "compute_s", "comm_s",
                   "bytes_sent_per_worker", "step", "rank", "bytes_sent", "timed"):
        assert column in listed, column
    assert set(describe.describe().split()) <= set(out.split())


# -- model ----------------------------------------------------------------------------------------------------


def _model_rows(out: str) -> dict[str, list[str]]:
    lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    header = lines[0].split()
    assert header[:2] == ["strategy", "workers"], header
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_model_prints_hand_computed_ring_numbers(capsys):
    """100 MB of gradients, 4 workers, 8 Gbit/s = 1000 MB/s, Ts = 0.1 s: a ring moves 2 x 3/4 x 100 = 150 MB
    per worker (0.150 s), P = 0.1 / 0.25 = 0.4, and P = 0.9 needs 150 MB x 0.9 / (0.1 x 0.1 s) = 13,500 MB/s."""
    status, out, _ = _run(capsys, "model", "--model-bytes", "100MB", "--workers", "4", "--bandwidth", "8Gbit",
                          "--step-time", "0.1")
    assert status == 0
    ring = _model_rows(out)["ring"]
    # workers, rounds, path MB, comm s, optimum s, P, step s, S for P = 0.9 in MB/s (columns after it may be added)
    assert ring[1:9] == ["4", "6", "150.00", "0.150", "0.150", "0.4000", "0.25", "13,500"], ring
    # a parameter server with one dedicated server: its NIC carries 4 x 100 MB in and out
    assert set(_model_rows(out)) >= {"ring", "halving_doubling", "parameter_server", "all_to_all"}


def test_model_limits_to_the_named_strategies_and_a_latency_adds_rounds(capsys):
    status, out, _ = _run(capsys, "model", "--model-bytes", "100MB", "--workers", "4", "--bandwidth", "8Gbit",
                          "--step-time", "0.1", "--latency", "10ms", "--strategy", "ring")
    assert status == 0
    rows = _model_rows(out)
    assert list(rows) == ["ring"]
    assert rows["ring"][4] == "0.210"  # 6 rounds x 10 ms + 0.150 s


@pytest.mark.parametrize(("option", "value", "named"), [
    ("--workers", "0", "workers"),
    ("--bandwidth", "0Gbit", "'0Gbit'"),
    ("--bandwidth", "fast", "'fast'"),
    ("--latency", "-1s", "-1s"),
    ("--model-bytes", "0", "--model-bytes"),
    ("--target-efficiency", "1.5", "1.5"),
    ("--step-time", "-1", "-1"),
    ("--strategy", "nonesuch", "nonesuch"),
], ids=lambda v: v)
def test_model_refuses_a_bad_value_naming_it(capsys, option, value, named):
    settings = {"--model-bytes": "100MB", "--workers": "4", "--bandwidth": "8Gbit", "--step-time": "0.1",
                option: value}
    assert named in _refused(capsys, "model", *(f"{k}={v}" for k, v in settings.items()))


def test_model_needs_a_model_or_its_size(capsys):
    err = _usage_error(capsys, "model", "--workers", "4", "--bandwidth", "1Gbit", "--step-time", "0.1")
    assert "--model" in err


# -- profile --------------------------------------------------------------------------------------------------


def test_profile_measures_the_tiny_model_and_writes_a_loadable_profile(capsys, tmp_path):
    from workloads.profile import load_profile

    path = tmp_path / "tiny.json"
    status, out, _ = _run(capsys, "profile", "--workload", "tiny", "--batch-size", "4", "--image-size", "8",
                          "--steps", "2", "--warmup-steps", "1", "--out", str(path))
    assert status == 0
    profile = load_profile(path)
    assert (profile.model, profile.batch_size, profile.image_size, profile.steps) == ("tiny", 4, 8, 2)
    assert out.splitlines()[-1] == f"profile {profile.id}: {path}"
    assert len(profile.params) == 6 and profile.forward_s > 0 and profile.backward_s > 0
    assert json.loads(path.read_text())["model"] == "tiny"


@pytest.mark.parametrize(("args", "named"), [
    (["--workload", "nonesuch", "--batch-size", "4"], "nonesuch"),
    (["--workload", "tiny", "--batch-size", "0"], "batch"),
    (["--workload", "tiny", "--batch-size", "4", "--image-size", "4"], "image_size"),
    (["--workload", "tiny", "--batch-size", "4", "--steps", "0"], "steps"),
], ids=["workload", "batch-size", "image-size", "steps"])
def test_profile_refuses_a_bad_value_naming_it(capsys, tmp_path, args, named):
    assert named in _refused(capsys, "profile", *args, "--out", str(tmp_path / "p.json"))
    assert not list(tmp_path.iterdir())  # nothing written


def test_profile_refuses_an_existing_directory_as_out_before_measuring(capsys, tmp_path):
    assert str(tmp_path) in _refused(capsys, "profile", "--workload", "tiny", "--batch-size", "4", "--out",
                                     str(tmp_path))


# -- simulate -------------------------------------------------------------------------------------------------

_SIM_SWEEP = """
name = "cli-sim"
[defaults]
workload = "tiny"
steps = 2
warmup_steps = 1
link = { bandwidth = "1Gbit", latency = "50us" }
[grid]
strategy = ["ring"]
workers = [2]
[simulate]
forward_s = 0.01
backward_s = 0.02
optimizer_s = 0.001
"""

needs_simgrid = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")


@needs_simgrid
def test_simulate_runs_a_sweep_and_prints_the_simulated_table(capsys, tmp_path):
    sweep = tmp_path / "sim.toml"
    sweep.write_text(_SIM_SWEEP)
    out_dir = tmp_path / "out"
    status, out, err = _run(capsys, "simulate", str(sweep), "--out", str(out_dir))
    assert status == 0, err
    assert "ring" in out and f"results: {out_dir}" in out
    assert any(out_dir.iterdir())


@needs_simgrid
def test_simulate_bench_times_one_strategy(capsys):
    status, out, _ = _run(capsys, "simulate", "--bench", "--workers", "4", "--strategies", "ring")
    assert status == 0
    assert "ring" in out


def test_simulate_without_a_sweep_or_bench_is_refused(capsys):
    if simgrid_available():
        pytest.skip(simgrid_available())
    assert "needs a sweep file" in _refused(capsys, "simulate")


# -- bench and verify: validation before Ray starts ------------------------------------------------------------


@pytest.mark.parametrize(("args", "named"), [
    (["--sizes", "0"], "--sizes '0'"),
    (["--sizes", "4K,lots"], "'lots'"),
    (["--sizes", ","], "--sizes"),
    (["--workers", "1"], "--workers 1"),
    (["--iters", "-1"], "--iters -1"),
    (["--strategies", "nonesuch"], "nonesuch"),
    (["--bandwidth", "1bit"], "--bandwidth '1bit'"),
    (["--emulation", "kernel"], "--emulation kernel"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bench_refuses_a_bad_value_before_ray_starts(capsys, args, named):
    import ray

    was_up = ray.is_initialized()
    assert named in _refused(capsys, "bench", *args)
    assert ray.is_initialized() == was_up


@pytest.mark.parametrize("mode", [[], ["--transport"], ["--harness"], ["--overlap"]], ids=lambda m: m[0] if m
                         else "collectives")
def test_every_bench_mode_refuses_an_unknown_p2p(capsys, mode):
    assert "--p2p" in _usage_error(capsys, "bench", *mode, "--p2p", "pigeon")


@pytest.mark.parametrize(("args", "named"), [
    (["--dtype", "float128"], "--dtype 'float128'"),
    (["--op", "band"], "band"),  # float32 has no bitwise and
    (["--workers", "0"], "--workers 0"),
    (["--numel", "-1"], "--numel -1"),
    (["--strategies", "nonesuch"], "nonesuch"),
], ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_verify_refuses_a_bad_value_before_ray_starts(capsys, args, named):
    assert named in _refused(capsys, "verify", *args)


def test_cluster_up_refuses_no_nodes_and_status_names_a_missing_cluster(capsys, tmp_path):
    tmp_path.chmod(0o700)
    assert "--nodes 0" in _refused(capsys, "cluster", "up", "--nodes", "0", "--bandwidth", "1Gbit",
                                   "--state-dir", str(tmp_path))
    status, out, _ = _run(capsys, "cluster", "status", "--name", "zz", "--state-dir", str(tmp_path))
    assert status == 1 and out.startswith("no cluster 'zz'")


def test_an_unknown_verb_is_a_usage_error(capsys):
    assert "invalid choice" in _usage_error(capsys, "train")


# -- bench and verify on Ray (one short run per mode, sharing the session's Ray and its 1- and 2-rank groups) ------


def test_bench_collectives_prints_one_row_per_strategy_and_size_with_the_model(capsys, lend_groups):
    """One worker group (both strategies need 2 ranks), sockets, an emulated link: the model column is exact."""
    from experiments.bench import collectives

    lend_groups(collectives)
    status, out, _ = _run(capsys, "bench", "--workers", "2", "--sizes", "4K,64K", "--strategies",
                          "ring,halving_doubling", "--iters", "2", "--p2p", "sockets", "--bandwidth", "1Gbit",
                          "--latency", "100us")
    assert status == 0
    rows = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    table = {(int(r[0]), r[1]): r for r in rows if r[0].isdigit()}
    assert sorted(table) == [(4096, "halving_doubling"), (4096, "ring"), (65536, "halving_doubling"),
                             (65536, "ring")]
    for r in table.values():  # busbw = algbw x 2(n-1)/n = algbw at n = 2
        assert float(r[2]) > 0 and r[3] == r[4]
    # ring at n = 2: 2 rounds of 100 us + 2 x 1/2 x 65,536 bytes at 125 MB/s = 0.2 ms + 0.524 ms
    assert table[65536, "ring"][-2] == "0.724", table[65536, "ring"]
    assert float(table[65536, "ring"][-1]) >= 0.9  # never faster than the emulated link allows


def test_verify_checks_a_strategy_on_ray_actors(capsys, lend_groups):
    from experiments.bench import collectives

    lend_groups(collectives)
    status, out, _ = _run(capsys, "verify", "--workers", "2", "--numel", "1001", "--strategies", "ring")
    assert status == 0
    line = next(line for line in out.splitlines() if line.startswith("ring"))
    assert line.split()[1] == "yes" and "4,004" in line  # 2 x 1/2 x 1001 floats, uneven chunks: 501 + 500


def test_bench_transport_prints_latency_and_bandwidth_rows(capsys, lend_groups, monkeypatch):
    from experiments.bench import transport

    lend_groups(transport)

    monkeypatch.setattr(transport, "STREAM_BYTES", 1_000_000)
    monkeypatch.setattr(transport, "transport_bench", functools.partial(transport.transport_bench,
                                                                        sizes=(100_000,), repeats=2, warmup=1))
    status, out, _ = _run(capsys, "bench", "--transport")
    assert status == 0
    assert "latency" in out and "100000" in out.replace(",", "")


def test_bench_harness_compares_syncbench_to_a_plain_loop(capsys, lend_groups, monkeypatch):
    from experiments.bench import transport

    lend_groups(transport)

    monkeypatch.setattr(transport, "harness_bench", functools.partial(transport.harness_bench, steps=6, rounds=2))
    status, out, _ = _run(capsys, "bench", "--harness", "--workload", "tiny", "--batch-size", "4", "--image-size",
                          "8")
    assert status == 0
    rounds = [line.split() for line in out.splitlines() if line.strip() and not line.startswith("#")]
    assert [r[0] for r in rounds] == ["0", "1"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rounds)
    assert "median ratio" in out


def test_bench_overlap_runs_profile_mode_with_overlapped_buckets(capsys, lend_groups, tmp_path, monkeypatch):
    from experiments.bench import overlap
    from experiments.cluster import group
    from experiments.pipeline import ray_substrate

    lend_groups(group, ray_substrate)  # bench --overlap imports WorkerGroup when it measures the profile

    monkeypatch.setattr(overlap, "SETTINGS", [(True, 0.01)])  # one run: buckets of 10 KB, overlapped
    status, out, err = _run(capsys, "bench", "--overlap", "--models", "tiny", "--links", "none", "--strategies",
                            "ring", "--workers", "2", "--steps", "2", "--batch-size", "4", "--image-size", "8",
                            "--out", str(tmp_path))
    assert status == 0, err
    assert "ring" in out and "tiny" in out
