"""p2p's default: syncbench's sockets for host tensors, gloo/NCCL for GPU ones; gloo stays selectable, and results
recorded before the default changed (gloo's) still load and resume as gloo's."""

from __future__ import annotations

import json

import pytest

from experiments.config import sweep as sweep_mod
from experiments.pipeline import runner
from experiments.pipeline.store import Store, StoreError
from strategies.transport.names import P2P, default_p2p

SWEEP = {"name": "p2p", "defaults": {"strategy": "ring", "workers": 2, "steps": 3, "warmup_steps": 1}}
# the id this run had while gloo was the default (and before p2p was a setting): p2p = "gloo" keeps it
GLOO_RUN_ID = "ring-n2-resnet18-full_speed-092a9af059538540aeb2ea89e744e97a"


def parse(**defaults) -> sweep_mod.Sweep:
    return sweep_mod.parse({**SWEEP, "defaults": {**SWEEP["defaults"], **defaults}})


def test_a_sweep_that_does_not_say_takes_the_sockets_for_host_tensors_and_gloo_for_gpu_ones():
    assert [run.p2p for run in parse().runs] == ["sockets"]
    assert [run.p2p for run in parse(device="cuda").runs] == ["gloo"]
    assert default_p2p("cpu") == "sockets" and default_p2p("cuda") == "gloo"


def test_gloo_stays_selectable_and_keeps_the_run_id_it_had_before():
    (gloo,), (default,) = parse(p2p="gloo").runs, parse().runs
    assert gloo.p2p == "gloo" and gloo.run_id == GLOO_RUN_ID
    assert default.p2p == "sockets" and default.run_id != GLOO_RUN_ID  # the change is recorded in the run
    assert set(P2P) == {"gloo", "sockets", "sockets-unix", "sockets-tcp"}


def test_sockets_for_gpu_tensors_are_still_refused():
    with pytest.raises(sweep_mod.SweepError, match="p2p = 'sockets' with device = \"cuda\".*host tensors"):
        parse(device="cuda", p2p="sockets")


def _old_results(tmp_path) -> Store:
    """A results directory written while gloo was the default: its record says no p2p, its run is gloo's."""
    store = Store(tmp_path / "old")
    (run,) = parse(p2p="gloo").runs
    settings = {k: v for k, v in json.loads(runner.resolved(parse(p2p="gloo")))["runs"][0].items() if k != "p2p"}
    store.write_text("sweep.resolved.json", json.dumps({"name": "p2p", "description": "", "runs": [settings]}))
    store.append({"run_id": run.run_id, "status": "ok", "strategy": "ring", "workers": 2, "transport": "gloo"}, [])
    return store


def test_results_recorded_under_gloo_load_and_resume_as_gloo(tmp_path):
    store = _old_results(tmp_path)
    gloo = parse(p2p="gloo")
    runner.check_same_sweep(store, gloo)  # the same runs: resume accepts the directory
    assert store.done() == {GLOO_RUN_ID}  # ... and has nothing left to run
    rows = store.runs()
    assert list(rows["run_id"]) == [GLOO_RUN_ID] and list(rows["transport"]) == ["gloo"]


def test_resuming_old_gloo_results_under_the_new_default_is_refused_naming_p2p(tmp_path):
    """Not mixed: the sockets runs would sit beside gloo's under one sweep; the error says which setting differs."""
    store = _old_results(tmp_path)
    with pytest.raises(StoreError, match=r'p2p: \(not set\) there, "sockets" in this sweep'):
        runner.check_same_sweep(store, parse())


def test_resuming_old_gloo_results_with_the_unchanged_sweep_file_keeps_gloo(tmp_path):
    """The same sweep file, written before p2p existed, resumes its directory: the remaining runs take gloo, as the
    finished ones did, and nothing already measured runs again."""
    import io

    from experiments.pipeline.substrate import ThreadSubstrate

    store = _old_results(tmp_path)
    text = 'name = "p2p"\n[defaults]\nstrategy = "ring"\nworkers = 2\nsteps = 3\nwarmup_steps = 1\n'
    sweep = sweep_mod.parse(sweep_mod.loads_toml(text, "t"), source=text)
    assert [run.p2p for run in sweep.runs] == ["sockets"]
    log = io.StringIO()
    rows = runner.run_sweep(sweep, store.dir, resume=True, log=log, substrate=ThreadSubstrate())
    assert list(rows["run_id"]) == [GLOO_RUN_ID] and "0 runs" not in log.getvalue()
    assert "take gloo too" in log.getvalue() and "1 already done" in log.getvalue()
    recorded = json.loads((store.dir / "sweep.resolved.json").read_text())
    assert [run["p2p"] for run in recorded["runs"]] == ["gloo"]
