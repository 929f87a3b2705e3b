"""Training and collectives through Ray actors over gloo (the real transport)."""

import json

import pandas as pd
import pytest

import strategies
from experiments.config import sweep as sweep_mod
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.store import Store
from experiments.results.dataset import read_steps
from tests.helpers import tiny_sweep_toml

pytestmark = pytest.mark.ray

def tiny_sweep(tmp_path, names):
    path = tmp_path / "tiny.toml"
    path.write_text(tiny_sweep_toml(names, workers=3, link=None))
    return sweep_mod.load(path)


# (workers, op, dtype, names): every strategy that has the op when names is None. The float sum and max on 3 and 4
# workers, the logical and bitwise ops on integer dtypes on awkward world sizes (3 and 7). bxor on 3 workers, not 5:
# the worlds are 3-7 ranks (workers and a parameter server's servers), and 5 workers' 3-server world of 8 started
# 8 more actors for two settings (a quarter of the test's time; every size is checked on threads).
VERIFY_CASES = [
    (3, "sum", "float32", None),
    (4, "max", "float32", None),
    (3, "bxor", "int32", None),
    (7, "land", "uint16", ["ring", "naive_ring", "halving_doubling", "all_to_all", "reduce_broadcast", "native"]),
]


def _verify_cases_on_rank(ctx, cases):
    """verify's rank function once per case that needs this group's world size: per case, its rows."""
    from experiments.bench.verify_rank import verify_on_rank

    return [verify_on_rank(ctx, settings, workers, 1001, op, dtype) for workers, op, dtype, settings in cases]


@pytest.mark.timeout(600)  # four tests of 300 s each before: 6 groups of 3-8 ranks on a loaded machine
def test_every_strategy_and_op_is_correct_over_gloo_one_group_per_world_size(ray_session):
    """verify's checks (the reference, exact for integers and min/max, bitwise identical ranks, every rank's bytes
    and messages sent and received, workers' and servers', equal to the analytic traffic) for every case of
    VERIFY_CASES, on one worker group per world size the cases need (a parameter server's world has its servers):
    a group starts in seconds, a case runs in milliseconds. Every failing case is named in the assertion."""
    import numpy as np

    from experiments.bench.verify_rank import check_setting, setting_label, world_groups
    from experiments.cluster.group import WorkerGroup

    by_world: dict[int, list] = {}
    expected_labels = {}
    for workers, op, dtype, names in VERIFY_CASES:
        settings = [(n, p) for n, p in strategies.registry.settings()
                    if (n in names if names else not strategies.get(n).exact or op in strategies.get(n).ops)]
        assert names is None or {n for n, _ in settings} == set(names)
        expected_labels[workers, op, dtype] = {setting_label(n, p) for n, p in settings}
        for world, group_settings in world_groups(settings, workers):
            by_world.setdefault(world, []).append((workers, op, dtype, group_settings))
    failures, checked = [], {case: set() for case in expected_labels}
    for world, cases in sorted(by_world.items()):
        with WorkerGroup(world, timeout=60) as group:
            per_rank = group.run(_verify_cases_on_rank, cases)
        for index, (workers, op, dtype, group_settings) in enumerate(cases):
            for name, params in group_settings:
                label = setting_label(name, params)
                rows = [r for ranks in per_rank for r in ranks[index] if r["setting"] == label]
                ok, error, why = check_setting(name, params, workers, 1001, op, np.dtype(dtype), rows)
                checked[workers, op, dtype].add(label)
                if not ok:
                    failures.append(f"{label} workers={workers} op={op} dtype={dtype} (world {world}): {why}")
    assert not failures, f"{len(failures)} failing case(s):\n" + "\n".join(failures)
    assert checked == expected_labels  # every setting of every case was run and checked
    assert all(len(labels) >= 6 for labels in checked.values()), checked


def test_a_sweep_over_p2p_trains_on_gloo_and_on_sockets(ray_session, tmp_path):
    """`p2p` is a sweep setting: the same strategies train over gloo and over syncbench's sockets, bytes exact."""
    path = tmp_path / "p2p.toml"
    path.write_text(tiny_sweep_toml(["ring", "parameter_server", "native"], workers=3, link=None,
                                    grid='p2p = ["gloo", "sockets"]'))
    runs = run_sweep(sweep_mod.load(path), tmp_path / "out")
    assert (runs["status"] == "ok").all(), runs[["strategy", "transport", "error"]]
    # native's bytes are gloo's own allreduce whatever p2p says: its runs record gloo
    assert sorted(zip(runs["strategy"], runs["transport"])) == [
        ("native", "gloo"), ("native", "gloo"), ("parameter_server", "gloo"), ("parameter_server", "sockets"),
        ("ring", "gloo"), ("ring", "sockets")]
    counted = runs[runs["bytes_counted"]]
    assert (counted["bytes_sent_per_worker"] == counted["analytic_bytes_sent_per_worker"]).all()
    losses = runs.groupby("strategy")["final_loss"].agg(["min", "max"])
    assert ((losses["max"] - losses["min"]) <= 1e-5 * losses["max"].abs()).all(), losses  # same arithmetic


def test_every_strategy_trains_through_ray(ray_session, tmp_path):
    names = strategies.names()
    runs = run_sweep(tiny_sweep(tmp_path, names), tmp_path / "out")
    assert sorted(runs["strategy"]) == sorted(names)
    assert (runs["status"] == "ok").all(), runs[["strategy", "error"]]
    for column in ("throughput", "step_time_s", "compute_s", "comm_s", "final_loss", "param_norm"):
        assert (runs[column] > 0).all(), column
    counted = runs[runs["bytes_counted"]]  # native and ddp move their bytes inside the backend
    assert (counted["bytes_sent_per_worker"] == counted["analytic_bytes_sent_per_worker"]).all()
    ps = runs[runs["strategy"] == "parameter_server"].iloc[0]
    assert ps["servers"] == 1 and ps["bytes_sent_per_server"] == 3 * ps["model_bytes"]
    # the default p2p carries counted bytes: the sockets; native's and ddp's are gloo's own allreduce
    assert (runs["transport"] == runs["bytes_counted"].map({True: "sockets", False: "gloo"})).all(), runs["transport"]
    assert runs["cores_oversubscribed"].all()  # 3-4 ranks on 2 cores
    resolved = json.loads((tmp_path / "out" / "sweep.resolved.json").read_text())
    assert sorted(r["run_id"] for r in resolved["runs"]) == sorted(runs["run_id"])
    assert all(r["workload"] == "tiny" and r["lr"] > 0 for r in resolved["runs"])  # defaults spelled out
    steps = read_steps(tmp_path / "out")
    assert len(steps) == sum(3 * strategies.make(n, **({"servers": 1} if n == "parameter_server" else {}))
                             .world_size(3) for n in names)
    # from the step rows the workers wrote: each timed step moved 3 workers x 8 samples, and a run's throughput
    # is those samples over the sum of each step's slowest worker (compute + communication)
    timed = steps[(steps["role"] == "worker") & steps["timed"]]
    for run_id, rows in timed.groupby("run_id"):
        assert (rows.groupby("step")["samples"].sum() == 3 * 8).all(), run_id
        slowest = (rows["compute_s"] + rows["comm_s"]).groupby(rows["step"]).max()
        assert runs.set_index("run_id").loc[run_id, "throughput"] == pytest.approx(
            rows["samples"].sum() / slowest.sum(), rel=1e-9), run_id
    dec = runs[runs["strategy"] == "decentralized"].iloc[0]
    assert dec["consensus_distance"] > 0 and 0 < dec["spectral_gap"] <= 1  # neighbours only: never agree


def test_a_failed_run_is_recorded_and_resume_completes_it(ray_session, tmp_path):
    from tests.experiments.flaky_train import train_unless_marked

    marker = tmp_path / "fail.json"
    marker.write_text(json.dumps(["halving_doubling"]))
    sweep = tiny_sweep(tmp_path, ["ring", "halving_doubling"])
    out = tmp_path / "out"
    first = run_sweep(sweep, out, train_fn=_with_env(train_unless_marked, str(marker)))
    status = dict(zip(first["strategy"], first["status"]))
    assert status == {"ring": "ok", "halving_doubling": "failed"}
    failed = first[first["strategy"] == "halving_doubling"].iloc[0]
    assert "injected failure" in failed["error"] and "rank" in failed["error"]
    ring_id = first[first["strategy"] == "ring"]["run_id"].item()
    ring_steps = Store(out).steps().loc[lambda d: d["run_id"] == ring_id]

    marker.write_text(json.dumps([]))
    second = run_sweep(sweep, out, resume=True, train_fn=_with_env(train_unless_marked, str(marker)))
    assert sorted(second["strategy"]) == ["halving_doubling", "ring"]  # nothing duplicated
    assert (second["status"] == "ok").all()
    assert second["run_id"].is_unique
    steps = Store(out).steps()
    pd.testing.assert_frame_equal(steps[steps["run_id"] == ring_id].reset_index(drop=True),
                                  ring_steps.reset_index(drop=True))  # the finished run was not re-run
    assert len(steps) == 2 * 3 * 3


def _with_env(fn, marker):
    """fn with the marker file's path set in the actor's environment (actors do not share the test's)."""

    def wrapped(ctx, spec):
        import os

        os.environ["SYNCBENCH_TEST_FAIL_FILE"] = marker
        return fn(ctx, spec)

    return wrapped


@pytest.mark.timing
def test_a_run_whose_compute_never_ends_is_ended_by_its_deadline_naming_it(ray_session, tmp_path):
    """Real-mode compute is bounded by nothing but the run's deadline (timeout x (steps + 2)): one worker with no
    peer to time out on, a 1 s timeout and 2 steps end within seconds, the run failed naming the deadline."""
    import time

    from tests.experiments.flaky_train import compute_forever

    path = tmp_path / "forever.toml"
    path.write_text('name = "forever"\n[defaults]\nstrategy = "ring"\nworkers = 1\nsteps = 2\nwarmup_steps = 1\n'
                    'timeout = 1.0\nworkload = "tiny"\n')
    sweep = sweep_mod.load(path)
    start = time.monotonic()
    runs = run_sweep(sweep, tmp_path / "out", train_fn=compute_forever)
    assert time.monotonic() - start < 60
    (row,) = runs.to_dict("records")
    assert row["status"] == "failed"
    assert "deadline" in row["error"] and "timeout x (steps + 2) = 1 s x 4" in row["error"], row["error"]
