"""The report's numbers against hand-computed answers, on small results written in the results schema: scaling
efficiency at n > 1, the verdict's winner, ratio and tie rule, the bandwidth requirement, the calibration's fitted
link speed and alpha, and the traffic agreement flags. Every expected value below is worked out in its comment.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments.results import schema
from reports import calibration, load, tables, verdicts

NUMEL = 1_000_000  # 4 MB of float32 gradients
MODEL_BYTES = 4 * NUMEL
GBIT = 125e6  # 1 Gbit/s in bytes per second
# the ring's and halving-doubling's analytic traffic at NUMEL (strategies' traffic(); checked in a test below)
RING = {2: (2, 4e6), 4: (6, 6e6)}  # workers -> (rounds, critical-path bytes): 2 (n-1)/n x 4 MB
HALVING = {2: (2, 4e6), 4: (4, 6e6)}  # log2(n) rounds each way, the same bytes


def _run(run_id: str, strategy: str, workers: int, throughput: float, *, seed: int = 0, compute_s: float = 0.2,
         comm_s: float = 0.05, rounds: float = math.nan, path_bytes: float = math.nan, sent: float = math.nan,
         analytic_sent: float = math.nan, bandwidth: float = math.nan, cores: int = 64, oversubscribed: bool = False,
         **extra) -> dict:
    batch = 32
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="numbers", substrate="ray", workload="tiny", image_size=32,
        batch_size=batch, steps=10, warmup_steps=2, device="cpu", seed=seed, lr=0.1, strategy=strategy,
        workers=workers, servers=0, bytes_counted=True, link_bandwidth=bandwidth, link_latency_s=0.0,
        link_emulation="python" if bandwidth == bandwidth else "", straggler_slowdown=1.0, compute="real",
        status="ok", throughput=throughput, step_time_s=workers * batch / throughput, compute_s=compute_s,
        comm_s=comm_s, comm_fraction=comm_s / (compute_s + comm_s), exposed_comm_s=comm_s,
        bytes_sent_per_worker=sent, bytes_recv_per_worker=sent, analytic_bytes_sent_per_worker=analytic_sent,
        analytic_rounds=rounds, analytic_path_bytes=path_bytes, numel=NUMEL, model_bytes=MODEL_BYTES,
        final_loss=1.0, param_norm=1.0, transport="gloo", cores=cores, gpu="", cores_oversubscribed=oversubscribed,
        host="h", started_at="2026-01-01T00:00:00", duration_s=1.0, **extra)


def _load(tmp_path, rows: list[dict]) -> pd.DataFrame:
    schema.conform(pd.DataFrame(rows), schema.RUNS).to_parquet(tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return runs[runs["ok"]]


def test_the_fixture_traffic_is_the_strategies_own():
    from reports.model import critical_path

    for workers in (2, 4):
        assert critical_path("ring", workers, NUMEL)[:2] == RING[workers]
        assert critical_path("halving_doubling", workers, NUMEL)[:2] == HALVING[workers]


# -- scaling efficiency ------------------------------------------------------------------------------------------


def test_scaling_efficiency_at_n_workers_is_throughput_over_n_times_one_worker(tmp_path):
    """One worker: 100 samples/s. Two: 160 -> 160 / (2 x 100) = 0.8. Four: 280 -> 280 / (4 x 100) = 0.7.
    Halving-doubling's 1-worker run (120) averages into the baseline: (100 + 120) / 2 = 110 per worker, so
    ring at 4 is 280 / 440 = 0.63636..., halving-doubling at 4 (330) is 330 / 440 = 0.75."""
    ok = _load(tmp_path, [_run("r1", "ring", 1, 100.0), _run("r2", "ring", 2, 160.0), _run("r4", "ring", 4, 280.0)])
    eff = tables.scaling_efficiency(ok).set_index("workers")["efficiency"]
    assert eff[2] == pytest.approx(0.8, abs=1e-12)
    assert eff[4] == pytest.approx(0.7, abs=1e-12)

    ok = _load(tmp_path, [_run("r1", "ring", 1, 100.0), _run("r4", "ring", 4, 280.0),
                          _run("h1", "halving_doubling", 1, 120.0), _run("h4", "halving_doubling", 4, 330.0)])
    eff = tables.scaling_efficiency(ok).set_index(["strategy", "workers"])["efficiency"]
    assert eff["ring", 4] == pytest.approx(280 / 440, abs=1e-12)
    assert eff["halving_doubling", 4] == pytest.approx(0.75, abs=1e-12)


# -- verdicts ---------------------------------------------------------------------------------------------------


def _repeats(strategy: str, workers: int, throughputs: list[float], **kw) -> list[dict]:
    return [_run(f"{strategy}-{workers}-{seed}", strategy, workers, t, seed=seed, **kw)
            for seed, t in enumerate(throughputs)]


def test_verdict_names_the_winner_and_its_ratio_when_the_lead_is_outside_the_spread(tmp_path):
    """ring 275/280/285 (mean 280, range 275-285) against halving-doubling 195/200/205 (mean 200, range 195-205):
    the ranges do not overlap, so the verdict is clear: use ring, 280 / 200 = 1.40x, a lead of 40%."""
    ok = _load(tmp_path, _repeats("ring", 4, [275.0, 280.0, 285.0], **_traffic(RING, 4))
               + _repeats("halving_doubling", 4, [195.0, 200.0, 205.0], **_traffic(HALVING, 4)))
    best = verdicts.best_strategies(ok, load.link_order(ok))
    assert len(best) == 1
    row = best.iloc[0]
    assert row["best strategy"] == "ring" and row["next"] == "halving_doubling" and row["verdict"] == "clear"
    assert row["samples/s"] == pytest.approx(280.0)
    assert row["lead over next %"] == pytest.approx(40.0)
    assert row["interval samples/s"] == "275.0-285.0"
    [sentence] = verdicts.verdicts(best)
    assert ": use ring, ring 280.0 samples/s (275.0-285.0 over 3 runs) against halving_doubling 200.0 samples/s " \
           "(195.0-205.0 over 3 runs) for the next best, 1.40x" in sentence, sentence


def test_verdict_is_a_tie_when_the_ranges_overlap_or_there_is_one_run_each(tmp_path):
    """ring 250-290 (mean 270) against halving-doubling 240-260 (mean 250): ring's lowest (250) is not above
    the other's highest (260): tie. One run each (280 against 200): no spread to measure a lead against: tie."""
    ok = _load(tmp_path, _repeats("ring", 4, [250.0, 270.0, 290.0]) + _repeats("halving_doubling", 4,
                                                                             [240.0, 250.0, 260.0]))
    best = verdicts.best_strategies(ok, load.link_order(ok))
    assert best.iloc[0]["verdict"] == "tie" and best.iloc[0]["best strategy"] == "ring"
    assert best.iloc[0]["lead over next %"] == pytest.approx(8.0)  # 270 / 250 - 1
    [sentence] = verdicts.verdicts(best)
    assert "tie, not distinguishable" in sentence and "inside the intervals" in sentence, sentence

    ok = _load(tmp_path, [_run("r", "ring", 4, 280.0), _run("h", "halving_doubling", 4, 200.0)])
    best = verdicts.best_strategies(ok, load.link_order(ok))
    assert best.iloc[0]["verdict"] == "tie"
    [sentence] = verdicts.verdicts(best)
    assert "one run each" in sentence, sentence


def test_a_clear_lead_just_outside_the_spread_is_clear_and_touching_ranges_tie(tmp_path):
    """Boundary of the tie rule: ring's lowest repeat 261 against halving-doubling's highest 260 is clear; ring's
    lowest equal to the other's highest (260 = 260) is a tie."""
    for ring_low, verdict in ((261.0, "clear"), (260.0, "tie")):
        ok = _load(tmp_path, _repeats("ring", 4, [ring_low, 300.0]) + _repeats("halving_doubling", 4,
                                                                             [240.0, 260.0]))
        assert verdicts.best_strategies(ok, load.link_order(ok)).iloc[0]["verdict"] == verdict, ring_low


# -- per-step intervals -------------------------------------------------------------------------------------------

T975 = {2: 4.302653}  # Student's t, 97.5% quantile, by degrees of freedom (tables)


def _steps(run_id: str, workers: int, times: list[float], warmup: float = 9.0) -> list[dict]:
    """One warm-up step of `warmup` s (not timed: ignored) then `times`: rank 0 computes 0.2 s and communicates
    the rest of each step; the other workers finish in 0.1 s (the step is its slowest worker's)."""
    rows = []
    for step, total in enumerate([warmup, *times]):
        for rank in range(workers):
            compute, comm = (0.2, total - 0.2) if rank == 0 else (0.1, 0.0)
            rows.append(schema.row(schema.STEPS, run_id=run_id, step=step, rank=rank, role="worker",
                                   timed=step > 0, compute_s=compute, comm_s=comm, samples=32))
    return rows


def _with_steps(tmp_path, runs: list[dict], steps: list[dict]) -> pd.DataFrame:
    ok = _load(tmp_path, runs)
    return load.with_step_intervals(ok, schema.conform(pd.DataFrame(steps), schema.STEPS))


def test_a_runs_per_step_interval_is_students_t_over_its_timed_steps(tmp_path):
    """Timed steps 0.5, 0.6, 0.7 s (the warm-up's 9 s and the faster workers ignored): mean 0.6, sd 0.1, k = 3,
    half-width t(0.975, 2) x 0.1 / sqrt(3) = 4.302653 x 0.057735 = 0.248414 s: step time 0.351586-0.848414 s.
    2 workers x 32 samples = 64 per step, 64 / 0.6 = 106.667 samples/s, interval 64 / 0.848414 = 75.435 to
    64 / 0.351586 = 182.032. A run with one timed step has no interval (NaN)."""
    runs = [_run("a", "ring", 2, 64 / 0.6), _run("b", "ring", 2, 64 / 0.5, seed=1)]
    ok = _with_steps(tmp_path, runs, _steps("a", 2, [0.5, 0.6, 0.7]) + _steps("b", 2, [0.5]))
    a, b = ok.set_index("run_id").loc["a"], ok.set_index("run_id").loc["b"]
    half = T975[2] * 0.1 / math.sqrt(3)
    assert half == pytest.approx(0.248414, abs=1e-6)
    assert a["timed_steps"] == 3
    assert (a["step_time_lo"], a["step_time_hi"]) == pytest.approx((0.6 - half, 0.6 + half), rel=1e-6)
    assert (a["throughput_step_lo"], a["throughput_step_hi"]) == pytest.approx((75.435, 182.032), abs=1e-3)
    assert b["timed_steps"] == 0 and math.isnan(b["throughput_step_lo"]) and math.isnan(b["step_time_hi"])
    # steps wider than their mean: no upper bound
    ok = _with_steps(tmp_path, [_run("c", "ring", 2, 64 / 0.4)], _steps("c", 2, [0.2, 0.2, 0.8]))
    assert ok.iloc[0]["throughput_step_hi"] == math.inf


def test_per_step_variation_turns_a_lead_outside_the_repeats_spread_into_a_tie(tmp_path):
    """4 workers x 32 = 128 samples per step. Ring: two repeats, steps 0.46 x 3 and 0.40/0.46/0.52 (mean 0.46
    each): 128 / 0.46 = 278.26 samples/s both. Halving-doubling: steps 0.5 x 3, twice: 256.0. Between repeats
    alone ring's 278.26-278.26 is above 256-256: clear. The second ring run's steps: sd 0.06, half-width
    4.302653 x 0.06 / sqrt(3) = 0.149048 s, so 128 / 0.609048 = 210.16 to 128 / 0.310952 = 411.64: ring's
    interval 210.16-411.64 reaches below 256: a tie, and the sentence says why."""
    thr = 128 / 0.46
    runs = [_run("r0", "ring", 4, thr), _run("r1", "ring", 4, thr, seed=1),
            _run("h0", "halving_doubling", 4, 256.0), _run("h1", "halving_doubling", 4, 256.0, seed=1)]
    flat = _steps("r0", 4, [0.46] * 3) + _steps("h0", 4, [0.5] * 3) + _steps("h1", 4, [0.5] * 3)
    steady = _with_steps(tmp_path, runs, flat + _steps("r1", 4, [0.46] * 3))
    assert verdicts.best_strategies(steady, load.link_order(steady)).iloc[0]["verdict"] == "clear"

    noisy = _with_steps(tmp_path, runs, flat + _steps("r1", 4, [0.40, 0.46, 0.52]))
    best = verdicts.best_strategies(noisy, load.link_order(noisy))
    row = best.iloc[0]
    assert row["best strategy"] == "ring" and row["verdict"] == "tie"
    assert row["interval samples/s"] == "210.2-411.6"
    [sentence] = verdicts.verdicts(best)
    assert "tie, not distinguishable: ring 278.3 samples/s (210.2-411.6 over 2 runs), halving_doubling 256.0 " \
           "samples/s (256.0-256.0 over 2 runs)" in sentence, sentence
    assert "inside the intervals, which span the repeats and each run's 95% per-step interval" in sentence


def test_one_run_each_stays_a_tie_and_shows_its_steps_interval(tmp_path):
    """Ring's one run (steps 0.5/0.6/0.7 at 2 workers: 75.4-182.0, as above) against halving-doubling's at a
    steady 1.0 s (64 samples/s): the intervals are apart, but a run's steps say nothing of the next run: tie."""
    runs = [_run("r", "ring", 2, 64 / 0.6), _run("h", "halving_doubling", 2, 64.0)]
    ok = _with_steps(tmp_path, runs, _steps("r", 2, [0.5, 0.6, 0.7]) + _steps("h", 2, [1.0] * 3))
    best = verdicts.best_strategies(ok, load.link_order(ok))
    assert best.iloc[0]["verdict"] == "tie"
    [sentence] = verdicts.verdicts(best)
    assert "ring 106.7 samples/s (one run, its steps 75.4-182.0)" in sentence and "one run each" in sentence


# -- bandwidth requirement ----------------------------------------------------------------------------------------


def _traffic(table: dict, workers: int) -> dict:
    rounds, path = table[workers]
    return {"rounds": float(rounds), "path_bytes": path}


def test_bandwidth_requirement_is_path_bytes_times_p_over_one_minus_p_times_ts(tmp_path):
    """Ts = 0.2 s (the median compute time of the fewest-worker runs). Ring at 4 workers carries 6 MB on its
    critical path: S = 6e6 x P / ((1 - P) x 0.2): P = 0.5 -> 30 MB/s, P = 0.8 -> 120 MB/s, P = 0.9 -> 270 MB/s.
    At 2 workers (4 MB): P = 0.9 -> 4e6 x 0.9 / 0.02 = 180 MB/s."""
    ok = _load(tmp_path, [_run("r1", "ring", 1, 100.0, compute_s=0.2), _run("r2", "ring", 2, 160.0, compute_s=0.25),
                          _run("r4", "ring", 4, 280.0, compute_s=0.3)])
    req = tables.requirement_frame(ok).set_index(["workers", "target"])["MB/s"]
    assert req[4, "P = 0.5"] == pytest.approx(30.0)
    assert req[4, "P = 0.8"] == pytest.approx(120.0)
    assert req[4, "P = 0.9"] == pytest.approx(270.0)
    assert req[2, "P = 0.9"] == pytest.approx(180.0)


# -- calibration -------------------------------------------------------------------------------------------------


def test_calibration_fits_the_emulated_link_speed_and_alpha_exactly(tmp_path):
    """comm_s = rounds x 100 us + path bytes / 125 MB/s on a 1 Gbit link, for ring and halving-doubling at 2 and
    4 workers: the least-squares fit gives back 125 MB/s and alpha = 100 us, plausible."""
    alpha = 100e-6
    rows = []
    for strategy, table in (("ring", RING), ("halving_doubling", HALVING)):
        for workers in (2, 4):
            rounds, path = table[workers]
            rows.append(_run(f"{strategy}{workers}", strategy, workers, 100.0, bandwidth=GBIT, rounds=float(rounds),
                             path_bytes=path, comm_s=rounds * alpha + path / GBIT))
    ok = _load(tmp_path, rows)
    fits, predicted = calibration.calibration(ok)
    [fit] = fits.to_dict("records")
    assert fit["runs"] == 4
    assert fit["fitted MB/s"] == pytest.approx(125.0, rel=1e-9)
    assert fit["link MB/s"] == pytest.approx(125.0)
    assert fit["alpha us"] == pytest.approx(100.0, rel=1e-6)
    assert fit["plausible"] == "yes", fit["why not"]
    assert predicted["predicted_s"].to_numpy() == pytest.approx(predicted["comm_s"].to_numpy(), rel=1e-9)


def test_calibration_leaves_out_runs_the_model_does_not_describe(tmp_path):
    """An oversubscribed run (distorted) and a 1-worker run do not enter the fit: with them in, the fit would
    not be 125 MB/s."""
    rows = [_run(f"r{w}", "ring", w, 100.0, bandwidth=GBIT, rounds=float(RING[w][0]), path_bytes=RING[w][1],
                 comm_s=RING[w][1] / GBIT) for w in (2, 4)]
    rows.append(_run("h4", "halving_doubling", 4, 100.0, bandwidth=GBIT, rounds=4.0, path_bytes=6e6,
                     comm_s=6e6 / GBIT))
    rows.append(_run("slow", "halving_doubling", 2, 100.0, bandwidth=GBIT, rounds=2.0, path_bytes=4e6, comm_s=1.0,
                     cores=1, oversubscribed=True))
    fits, _ = calibration.calibration(_load(tmp_path, rows))
    assert fits.iloc[0]["runs"] == 3
    assert fits.iloc[0]["fitted MB/s"] == pytest.approx(125.0, rel=1e-9)


# -- traffic agreement -------------------------------------------------------------------------------------------


def test_traffic_agreement_counts_equal_runs_and_names_the_one_that_differs(tmp_path):
    """Three multi-worker runs: ring at 2 and 4 sent exactly their analytic bytes; halving-doubling at 4 sent one
    byte more than declared: 2 of 3 agree, halving_doubling named. The 1-worker run is not compared."""
    ok = _load(tmp_path, [_run("r1", "ring", 1, 100.0, sent=0.0, analytic_sent=0.0),
                          _run("r2", "ring", 2, 160.0, sent=4e6, analytic_sent=4e6),
                          _run("r4", "ring", 4, 280.0, sent=6e6, analytic_sent=6e6),
                          _run("h4", "halving_doubling", 4, 280.0, sent=6e6 + 1, analytic_sent=6e6)])
    same, compared, differ, hidden = tables.traffic_agreement(ok)
    assert (same, compared, differ, hidden) == (2, 3, ["halving_doubling"], [])


# -- the first screen, cell by cell --------------------------------------------------------------------------------


def test_a_one_run_winner_against_repeated_runners_up_is_a_tie(tmp_path):
    """ring once at 400 samples/s against halving-doubling 195/200/205: the runners-up's spread is measured, the
    winner's is not (one run says nothing of the next on another seed), so the lead is not measured: tie."""
    ok = _load(tmp_path, [_run("r", "ring", 4, 400.0)] + _repeats("halving_doubling", 4, [195.0, 200.0, 205.0]))
    row = verdicts.best_strategies(ok, load.link_order(ok)).iloc[0]
    assert row["best strategy"] == "ring" and row["runs"] == 1 and row["verdict"] == "tie"
    assert row["interval samples/s"] == "one run"


def test_every_column_of_the_best_strategy_table_against_the_results_file(tmp_path):
    """ring 275/280/285 samples/s with 0.05/0.06/0.07 s of communication after 0.2 s of compute, against
    halving-doubling 195/200/205 (0.05 s), 4 workers of batch 32, one oversubscribed ring repeat. Each cell from
    the rows written: the mean throughput 280, its range, 3 runs, the mean step time (4 x 32 / throughput), the
    mean communication share in percent, the lead 280 / 200 - 1 = 40 %, the runner-up, clear, distorted."""
    ring = [_run(f"ring-{s}", "ring", 4, t, seed=s, comm_s=c, oversubscribed=(s == 2))
            for s, (t, c) in enumerate([(275.0, 0.05), (280.0, 0.06), (285.0, 0.07)])]
    ok = _load(tmp_path, ring + _repeats("halving_doubling", 4, [195.0, 200.0, 205.0]))
    written = pd.read_parquet(tmp_path / "runs.parquet")
    mine = written[written["strategy"] == "ring"]
    row = verdicts.best_strategies(ok, load.link_order(ok)).iloc[0]
    expected = {
        "workload": "tiny", "workers": 4, "best strategy": "ring", "runs": 3, "next": "halving_doubling",
        "verdict": "clear", "distorted": "yes", "interval samples/s": "275.0-285.0",
        "samples/s": pytest.approx(280.0),
        "step time s": pytest.approx(sum(4 * 32 / t for t in (275.0, 280.0, 285.0)) / 3),
        "comm share %": pytest.approx(100 * sum(c / (0.2 + c) for c in (0.05, 0.06, 0.07)) / 3),
        "lead over next %": pytest.approx(40.0),
    }
    assert {k: row[k] for k in expected} == expected
    # the same cells straight from the file's columns
    assert row["samples/s"] == pytest.approx(mine["throughput"].mean())
    assert row["step time s"] == pytest.approx(mine["step_time_s"].mean())
    assert row["comm share %"] == pytest.approx(100 * mine["comm_fraction"].mean())
    assert 20.0 < row["comm share %"] < 26.0  # a percentage, not the fraction 0.2-0.26
    assert row["link"] == ok["link"].iloc[0] and row["condition"] == ok["condition_label"].iloc[0]


def test_the_requirement_compute_time_leaves_out_a_distorted_run_at_the_smallest_worker_count(tmp_path):
    """The 1-worker run is oversubscribed (its 0.5 s compute includes contention): Ts comes from the fewest-worker
    undistorted runs, the 2-worker one's 0.2 s. Ring at 2 workers (4 MB on its path), P = 0.9:
    4e6 x 0.9 / (0.1 x 0.2) = 180 MB/s (with the distorted 0.5 s it would be 72)."""
    ok = _load(tmp_path, [_run("r1", "ring", 1, 100.0, compute_s=0.5, oversubscribed=True),
                          _run("r2", "ring", 2, 160.0, compute_s=0.2), _run("r4", "ring", 4, 280.0, compute_s=0.3)])
    assert tables.compute_time_per_workload(ok) == {"tiny": (pytest.approx(0.2), "median compute time of the "
                                                                               "2-worker runs, measured")}
    req = tables.requirement_frame(ok).set_index(["workers", "target"])["MB/s"]
    assert req[2, "P = 0.9"] == pytest.approx(180.0)
    # every run distorted: nothing cleaner to take, the fewest-worker runs as they are
    ok = _load(tmp_path, [_run("r1", "ring", 1, 100.0, compute_s=0.5, oversubscribed=True),
                          _run("r2", "ring", 2, 160.0, compute_s=0.2, oversubscribed=True)])
    assert tables.compute_time_per_workload(ok)["tiny"][0] == pytest.approx(0.5)


def test_the_overlap_tables_requirements_without_and_with_the_hidden_seconds(tmp_path):
    """Ring at 4 workers, 2 buckets of 1 MiB: compute Ts = 0.2 s, exposed 0.05 s, busy 0.15 s -> hidden 0.10 s;
    6 MB on the critical path. P = 0.2 / 0.25 = 0.8. For P = 0.9 the budget is (0.1 / 0.9) x 0.2 = 0.0222 s:
    without overlap S = 6e6 / 0.0222 = 270 MB/s; with the overlap measured S = 6e6 / (0.0222 + 0.10) = 49.09 MB/s.
    A second configuration hides nothing (busy = exposed): both columns 270."""
    rounds, path = RING[4]
    ok = _load(tmp_path, [
        _run("o", "ring", 4, 280.0, comm_s=0.05, rounds=rounds, path_bytes=path, comm_busy_s=0.15, bucket_mb=1.0,
             overlap=True, backward_end_s=0.2),
        _run("f", "ring", 4, 250.0, comm_s=0.05, rounds=rounds, path_bytes=path, comm_busy_s=0.05, bucket_mb=2.0,
             backward_end_s=0.2)])
    frame = tables.overlap_frame(ok).set_index("bucket MiB")
    budget = 0.1 / 0.9 * 0.2
    hidden = frame.loc["1"]
    assert hidden["hidden s"] == pytest.approx(0.10)
    assert hidden["P"] == pytest.approx(0.8)
    assert hidden["S for P=0.9, no overlap MB/s"] == pytest.approx(6e6 / budget / 1e6)
    assert hidden["S for P=0.9, measured overlap MB/s"] == pytest.approx(6e6 / (budget + 0.10) / 1e6)
    assert hidden["S for P=0.9, measured overlap MB/s"] == pytest.approx(49.0909, abs=1e-3)
    none = frame.loc["2"]
    assert none["hidden s"] == pytest.approx(0.0)
    assert none["S for P=0.9, no overlap MB/s"] == none["S for P=0.9, measured overlap MB/s"] == pytest.approx(270.0)
