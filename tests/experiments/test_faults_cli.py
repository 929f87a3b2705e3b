"""`syncbench faults`: every strategy and mode that fits, each checked against the survivors' reference."""

from __future__ import annotations

import pytest

from experiments.cli.main import main


def test_every_row_matches_the_survivors_reference(capsys):
    assert main(["faults", "--workers", "5", "--steps", "8", "--fail", "4@2", "--fail", "1@4", "--rejoin-steps", "2",
                 "--checkpoint-every", "3"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line and not line.startswith(("#", "-", "strategy"))]
    modes = {(line.split()[0], line.split()[1]) for line in rows}
    assert modes == {(s, m) for s in ("ring", "halving_doubling", "double_binary_tree")
                     for m in ("none", "checkpoint_restart", "elastic")} | {
        ("parameter_server", m) for m in ("none", "checkpoint_restart", "ps_shrink")} | {
        ("parameter_server:staleness=async", "ps_shrink")} | {
        ("decentralized", m) for m in ("none", "checkpoint_restart", "reweight")}
    assert "MISMATCH" not in out
    assert sum("matches" in line for line in rows) == len(rows) - 1  # the barrier-free server has no fixed answer
    ring = {line.split()[1]: line.split()[2:6] for line in rows if line.startswith("ring ")}
    # completed, run, lost: checkpoints every 3 steps, failures in steps 2 and 4: 2 then 1 step lost, 3 redone
    assert ring["checkpoint_restart"][:3] == ["8", "11", "3"] and ring["elastic"][:3] == ["8", "8", "0"]
    assert ring["none"][:3] == ["2", "2", "0"]
    # the decentralized ring of 5 without ranks 4 and 1 falls apart: the run ends after 4 steps, cause named
    reweight = next(line for line in rows if line.startswith("decentralized") and " reweight " in line)
    assert reweight.split()[2] == "4" and "is disconnected" in reweight


@pytest.mark.parametrize("argv, words", [
    (["--workers", "17"], "--workers 17: accepted are 1 to 16"),
    (["--fail", "2-5"], "--fail '2-5': expected RANK@STEP"),
    (["--fail", "9@1"], "failure rank = 9"),
    (["--modes", "retry"], "--modes: 'retry'"),
    (["--strategy", "nosuch"], "unknown strategy 'nosuch'"),
    (["--strategy", "ring", "--modes", "reweight"], "no --strategy and --modes fit together"),
    (["--mtbf", "40s", "--fail", "1@2"], "--mtbf and --fail: give one"),
    (["--mtbf", "soon"], "failures.mtbf = 'soon'"),
    (["--simulate", "2"], "--simulate draws failures from a rate: give --mtbf"),
    (["--simulate", "2", "--mtbf", "20s", "--costs", "boot=3"], "'boot' is not one of detect, restart"),
    (["--simulate", "2", "--mtbf", "20s", "--strategy", "decentralized", "--modes", "elastic"],
     "no --strategy fits the simulated modes"),
    (["--simulate", "2", "--mtbf", "20s", "--replicas", "1"], "--replicas 1: accepted with --servers-fail"),
    (["--simulate", "2", "--mtbf", "20s", "--servers-fail", "--replicas", "3", "--strategy",
      "parameter_server:servers=2"], "recovery.replicas = 3 with servers = 2"),
    # on Ray actors: refused before Ray starts
    (["--substrate", "ray", "--workers", "9"], "--workers 9 with --substrate ray: accepted are 2 to 8"),
    (["--substrate", "ray", "--p2p", "pigeon"], "--p2p 'pigeon': accepted are gloo, sockets"),
    (["--substrate", "ray", "--timeout", "0.5"], "--timeout 0.5: accepted are 1 to 600 seconds"),
])
def test_bad_arguments_are_named(capsys, argv, words):
    assert main(["faults", *argv]) == 2
    assert words in capsys.readouterr().err


def test_results_are_written_typed_and_never_overwritten_unasked(tmp_path, capsys):
    from experiments.results import faults as fault_results

    argv = ["faults", "--workers", "3", "--steps", "5", "--fail", "1@2", "--strategy", "ring",
            "--strategy", "decentralized", "--checkpoint-every", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    runs, failures = fault_results.read(tmp_path)
    assert list(runs["mode"]) == ["none", "checkpoint_restart", "elastic", "none", "checkpoint_restart",
                                  "reweight"]
    ring = runs[runs["strategy"] == "ring"].set_index("mode")
    # the failure in step 2 comes just after the checkpoint taken once 2 steps were complete: nothing lost
    assert ring.loc["checkpoint_restart", ["completed_steps", "steps_run", "steps_lost"]].tolist() == [5, 5, 0]
    assert ring.loc["elastic", "reference"] == "matches" and ring.loc["elastic", "time_to_step_s"] > 0
    assert bool(ring.loc["none", "ended"]) and "recovery.mode = 'none'" in ring.loc["none", "cause"]
    assert str(runs["completed_steps"].dtype) == "int64" and str(runs["recovery_s"].dtype) == "float64"
    assert set(failures["rank"]) == {1} and set(failures["step"]) == {2} and len(failures) == 6
    assert main(argv) == 2 and "already exist" in capsys.readouterr().err
    assert main(argv + ["--overwrite"]) == 0


def test_a_drawn_failure_rate_runs_and_matches(capsys):
    from strategies.faults import draw_failures

    drawn = draw_failures(4, 40.0, 1.0, 30, 3)
    assert main(["faults", "--steps", "30", "--mtbf", "40s", "--seed", "3", "--strategy", "ring",
                 "--modes", "checkpoint_restart,elastic", "--checkpoint-every", "5"]) == 0
    out = capsys.readouterr().out
    assert ", ".join(f"rank {f.rank} at step {f.step}" for f in drawn) in out.splitlines()[0]
    assert len(drawn) >= 1 and "MISMATCH" not in out and out.count("matches") == 2


def test_simulate_prints_the_simulated_time_beside_the_model(capsys):
    from strategies.transport.simgrid import simgrid_available

    if simgrid_available():
        pytest.skip(simgrid_available())
    assert main(["faults", "--simulate", "1", "--workers", "3", "--steps", "20", "--mtbf", "10s", "--strategy",
                 "ring", "--modes", "elastic"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# SimGrid: 3 workers, 20 steps, MTBF 10s per worker, 1 seeds (every step simulated)")
    [row] = [line.split() for line in out if line.startswith("ring")]
    assert row[:3] == ["ring", "elastic", "-"] and float(row[4]) > 20 * 0.1 and float(row[6]) > 20 * 0.1
    # composed: each world size's step simulated once, the same failures over them: the same simulated seconds
    assert main(["faults", "--simulate", "1", "--workers", "3", "--steps", "20", "--mtbf", "10s", "--strategy",
                 "ring", "--modes", "elastic,checkpoint_restart", "--compose", "--checkpoint-every", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "each world size's step simulated once" in out[0]
    rows = {line.split()[1]: line.split() for line in out if line.startswith("ring")}
    assert rows["elastic"][4] == row[4]
    assert int(rows["checkpoint_restart"][2]) >= 1  # Daly's interval in whole simulated steps
    assert any(line.startswith("#   simulated seconds a step at each world size: 3: ") for line in out)


def test_simulate_with_servers_failing_prices_the_replicas(capsys):
    from strategies.transport.simgrid import simgrid_available

    if simgrid_available():
        pytest.skip(simgrid_available())
    # the servers fail too: ps_shrink covered by a chain replica, checkpoint_restart by the restart; ring has no
    # server to fail (no row)
    assert main(["faults", "--simulate", "2", "--workers", "3", "--steps", "20", "--mtbf", "10s", "--strategy",
                 "parameter_server:servers=2", "--strategy", "ring", "--compose", "--servers-fail"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("# servers fail too: ps_shrink with 1 chain replica(s)")
    rows = {line.split()[1]: line.split() for line in out if line.startswith("parameter_server")}
    assert set(rows) == {"checkpoint_restart", "ps_shrink"} and not any(line.startswith("ring") for line in out)
