"""Faults cost the run they hit and nothing else: a killed worker, a stopped sweep, ranks that disagree on sizes."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch

from experiments.results.dataset import read_runs, read_steps
from tests.helpers import resources_back, wait_until

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30  # the communicator's timeout in these runs: generous, so that a machine under load does not time out
DETECTED_S = 10  # a killed rank must fail the run within this: its death is seen (a reset connection), not waited out
KILL_AT_STEP = 5  # rank 1 is killed once rank 0 has finished this many steps: past the warm-up, inside the loop
LONG = 100_000  # steps: a run that only a fault ends

KILL_SWEEP = """
name = "faults"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
warmup_steps = 1
workers = 2
timeout = {timeout}
link = {{ bandwidth = "100Mbit" }}   # 88 kB of gradients per message: each step is mostly communication
strategy = "{strategy}"
[grid]
steps = [{long}, 3]   # the long run is killed; the short one after it must start and succeed
[strategy_params.parameter_server]
servers = 1
"""


class _FlagAtStep:
    """The `progress` rank 0 reports finished steps to: touches `flag` once KILL_AT_STEP steps are done."""

    def __init__(self, flag: str):
        self.flag = Path(flag)

    def put_nowait(self, step: int) -> None:
        if step == KILL_AT_STEP:
            self.flag.touch()


def train_flagging_the_loop(ctx, spec, flag: str):
    """The real train on every rank; rank 0 touches `flag` when it is KILL_AT_STEP steps into the loop."""
    from experiments.pipeline.train import train

    return train(ctx, spec, _FlagAtStep(flag))


def _kill_rank_in_loop(group, rank: int, flag: Path, record: dict) -> None:
    """SIGKILL rank's actor process (as a crash or an OOM kill would) once the run is inside its step loop.

    Rank 0 says when (a file it touches after KILL_AT_STEP steps: the kill never depends on the load); as the
    emulated link makes every step mostly communication, the kill lands in the middle of a collective. (Before,
    this waited for the process to have written 2 MB: the sockets transport sends with sendmsg, which the
    kernel's write counter does not count, so every kill waited out a 60 s fallback.)
    """
    import psutil  # vendored by Ray

    record["pids"] = [info["pid"] for info in group.info]
    process = psutil.Process(group.info[rank]["pid"])
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    record["killed_at"] = time.monotonic()
    process.kill()


@pytest.mark.timing
@pytest.mark.ray
@pytest.mark.parametrize("strategy", ["ring", "parameter_server"])  # a gradient strategy, one with servers
def test_a_killed_worker_fails_its_run_naming_the_rank_and_the_next_run_succeeds(ray_session, monkeypatch,
                                                                                   tmp_path, strategy):
    import psutil  # vendored by Ray

    import experiments.pipeline.ray_substrate as ray_substrate
    import experiments.pipeline.runner as runner
    from experiments.config.sweep import parse

    ray = ray_session
    before = ray.available_resources()
    text = KILL_SWEEP.format(timeout=TIMEOUT_S, strategy=strategy, long=LONG)
    sweep = parse(tomllib.loads(text), source=text)
    record: dict = {}
    flag = tmp_path / "in-the-loop"
    run_one = ray_substrate._run_one

    def train(ctx, spec):  # what the ranks run in the long run (named as the real one, as the error names it)
        return train_flagging_the_loop(ctx, spec, str(flag))

    def run_one_killing_rank_1(group, spec, train_fn, *args):
        if spec.steps != LONG:
            return run_one(group, spec, train_fn, *args)
        threading.Thread(target=_kill_rank_in_loop, args=(group, 1, flag, record), daemon=True).start()
        result = run_one(group, spec, train, *args)
        record["ended_at"] = time.monotonic()
        return result

    monkeypatch.setattr(ray_substrate, "_run_one", run_one_killing_rank_1)
    runs = runner.run_sweep(sweep, tmp_path / "out", log=sys.stdout).set_index("steps")

    killed, after = runs.loc[LONG], runs.loc[3]
    assert killed["status"] == "failed"
    assert "rank 1" in killed["error"] and "actor died" in killed["error"], killed["error"]
    assert killed["error"].startswith("run(train) failed on rank 1"), killed["error"]
    took = record["ended_at"] - record["killed_at"]
    print(f"{strategy}: rank 1 killed, run failed {took:.1f} s later")
    assert took < DETECTED_S, f"the run took {took:.1f} s to fail after rank 1 was killed"
    assert after["status"] == "ok", after["error"]
    # the broken group's actors are gone and every placement group is removed
    alive = lambda: [p for p in record["pids"] if psutil.pid_exists(p)  # noqa: E731
                     and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert wait_until(lambda: not alive()), f"actors of the killed run still running: {alive()}"
    assert wait_until(lambda: resources_back(ray, before)), f"resources not returned: {ray.available_resources()}"
    steps = read_steps(tmp_path / "out")
    assert set(steps["run_id"]) == {after["run_id"]}  # the failed run left no steps behind


# -- SIGTERM and --resume ----------------------------------------------------------------------------------

STOP_SWEEP = """
name = "stopped"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
warmup_steps = 1
workers = 2
strategy = "ring"
link = {{ bandwidth = "100Mbit" }}
[grid]
steps = [3, {long}, 4]   # SIGTERM lands while the long run (~3 s) is in flight
"""
STOP_LONG = 150


def _syncbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "experiments", *args]


@pytest.mark.ray
def test_sigterm_keeps_finished_runs_and_resume_completes_only_what_is_missing(ray_session, tmp_path):
    before = ray_session.available_resources()
    sweep = tmp_path / "stopped.toml"
    sweep.write_text(STOP_SWEEP.format(long=STOP_LONG))
    out = tmp_path / "out"
    # the sweep processes join the session's Ray (--address) rather than each starting one of their own
    address = ["--address", ray_session.get_runtime_context().gcs_address]
    proc = subprocess.Popen(_syncbench("run", str(sweep), "--out", str(out), "--no-report", *address), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert wait_until(lambda: _run_count(out) >= 1 or proc.poll() is not None, 120), "no run finished"
        assert proc.poll() is None, f"the sweep ended before SIGTERM:\n{proc.communicate()[0]}"
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        output, _ = proc.communicate(timeout=60)
        took = time.monotonic() - stopped
        print(f"SIGTERM -> exit in {took:.1f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert took < 8, f"the sweep took {took:.1f} s to stop"  # the run in flight is abandoned, not waited for
    assert "interrupted" in output, output
    runs, steps = read_runs(out), read_steps(out)
    assert list(runs["steps"]) == [3] and list(runs["status"]) == ["ok"], runs[["steps", "status"]]
    assert len(steps) == 3 * 2 and set(steps["run_id"]) == set(runs["run_id"])
    assert not list(out.glob("*.tmp")), "a half-written file was left behind"
    first = runs.loc[0, ["run_id", "started_at"]].to_dict()

    resumed = subprocess.run(_syncbench("run", str(sweep), "--out", str(out), "--resume", "--no-report", *address),
                             cwd=REPO, capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "3 runs, 1 already done" in resumed.stderr, resumed.stderr
    runs, steps = read_runs(out), read_steps(out)
    assert sorted(runs["steps"]) == [3, 4, STOP_LONG] and set(runs["status"]) == {"ok"}
    assert runs["run_id"].is_unique
    assert runs.set_index("run_id").loc[first["run_id"], "started_at"] == first["started_at"]  # not run again
    assert len(steps) == (3 + STOP_LONG + 4) * 2
    assert not steps.duplicated(["run_id", "step", "rank"]).any()
    # both sweep processes' actors and placement groups are released (Ray frees them asynchronously)
    assert wait_until(lambda: resources_back(ray_session, before)), ray_session.available_resources()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_a_store_write_stops_the_sweep_after_the_write(tmp_path, signum):
    """The runner defers SIGINT/SIGTERM while a run is being stored: the run lands whole, then the sweep stops."""
    import os

    from experiments.pipeline.runner import _signals_held, _stop_on_signals
    from experiments.pipeline.store import Store

    store = Store(tmp_path)
    previous = _stop_on_signals()
    try:
        with pytest.raises(KeyboardInterrupt, match=signal.Signals(signum).name):
            with _signals_held():
                store.append({"run_id": "a", "status": "ok"}, [{"run_id": "a", "step": 0}])
                os.kill(os.getpid(), signum)  # arrives between the two writes of one run
                time.sleep(0.1)  # the handler has run by now (it only records the signal)
                store.append({"run_id": "b", "status": "ok"}, [{"run_id": "b", "step": 0}])
        with pytest.raises(KeyboardInterrupt):  # outside a write, a signal stops at once
            os.kill(os.getpid(), signum)
            time.sleep(1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert list(store.runs()["run_id"]) == ["a", "b"] and list(store.steps()["run_id"]) == ["a", "b"]
    assert not list(tmp_path.glob("*.tmp"))


def _run_count(out: Path) -> int:
    try:
        return len(read_runs(out))
    except (OSError, ValueError):  # not there yet
        return 0


# -- ranks that disagree on a tensor's size -----------------------------------------------------------------

def _allreduce_rank_sized(ctx, strategy):
    """Every rank allreduces a tensor whose size depends on its rank: 10 elements on rank 0, 11 on rank 1."""
    import strategies

    runtime = strategies.make(strategy).bind(ctx.comm, ctx.world_size)
    runtime.sync(torch.ones(10 + ctx.rank), "mean")


@pytest.mark.ray
def test_ranks_that_disagree_on_the_size_fail_saying_so(ray_session):
    from experiments.cluster.group import GroupError, WorkerGroup

    before = ray_session.available_resources()
    # a group of its own, shut down at the end: the failure breaks it (the shared group2 would linger broken)
    with WorkerGroup(2, timeout=20) as group, pytest.raises(GroupError) as err:
        group.run(_allreduce_rank_sized, "ring")
    text = str(err.value)
    assert "different sizes" in text and "rank 0: 10" in text and "rank 1: 11" in text, text
    # (a point-to-point receive of the wrong size over gloo: tests/strategies/test_transport_torch.py)
    assert wait_until(lambda: resources_back(ray_session, before)), ray_session.available_resources()


# -- an embedded Ray that does not start in time -----------------------------------------------------------

def test_an_embedded_ray_whose_start_times_out_is_started_once_more_and_the_failed_attempt_removed(monkeypatch,
                                                                                                  capsys):
    """Ray gives its raylet a fixed 30 s to register; at load 40-60 on 2 cores that passed. ensure_ray starts it
    once more, saying so with the load average, after removing what the failed attempt made (its temp dir);
    any other error, or a second timeout, is raised. ray.init faked: no Ray starts here."""
    import os

    import ray

    from experiments.cluster import ray_runtime

    monkeypatch.setattr(ray_runtime, "_REAPERS", [])  # this test's own: the session's Ray is left alone
    monkeypatch.setattr(ray_runtime, "_OWN_TEMP_DIRS", [])
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    handler = signal.getsignal(signal.SIGTERM)
    dirs = []

    def init(outcomes):
        def fake(**kwargs):
            dirs.append(kwargs["_temp_dir"])
            outcome = outcomes.pop(0)
            if outcome:
                raise outcome
        return fake

    timeout = Exception("The current node timed out during startup. This could happen because ...")
    try:
        monkeypatch.setattr(ray, "init", init([timeout, None]))
        assert ray_runtime.ensure_ray(num_cpus=2) is True
        assert len(dirs) == 2 and not os.path.exists(dirs[0]) and os.path.isdir(dirs[1])
        assert "trying once more" in capsys.readouterr().err
        ray_runtime.stop_ray()
        assert not os.path.exists(dirs[1])
        for outcomes in ([timeout, timeout], [ValueError("bad num_cpus")]):
            monkeypatch.setattr(ray, "init", init(outcomes))
            with pytest.raises(Exception, match="timed out|bad num_cpus"):
                ray_runtime.ensure_ray(num_cpus=2)
            assert not [d for d in dirs if os.path.exists(d)] and not ray_runtime._REAPERS
    finally:
        ray_runtime.stop_ray()
        signal.signal(signal.SIGTERM, handler)
