"""Plant each bug the tests must catch, one at a time, in a temporary copy of the tree; report which survive.

    .venv/bin/python -m tests.mutations                   # every mutation, on the committed tree (git HEAD)
    make mutations                                        # the same
    .venv/bin/python -m tests.mutations --source worktree # on the working tree as it is (uncommitted edits too)
    .venv/bin/python -m tests.mutations --only ring-path-smallest-chunk,topk-floor
    .venv/bin/python -m tests.mutations --check           # only check that every bug can still be planted
    .venv/bin/python -m tests.mutations --write docs/mutations.md  # and write the result there, dated

The bugs are one table, MUTATIONS: each row is a bug's name, its area, the file, the exact code it replaces (it
must occur exactly once; if the code moved, the row is reported STALE and needs updating here), the code planted
instead, and two scopes of tests to run on it:

- `fast`: the test files that should catch it, run with `make test-fast`'s marker expression (FAST_MARKERS, read
  from the Makefile): only tests `make test-fast` runs can catch it there, so a failure here is a failure of
  `make test-fast`. A file `make test-fast` leaves out (tests/conftest.py's SLOW_MODULES) has no test in scope.
- `wide`: run only when the bug survived `fast`: more files, with `make test`'s selection (every marker but the
  ones this machine skips anyway: netns, gpu). Running the whole `make test` per bug (about 20 minutes on 2 cores)
  is out of reach; `wide` is the files a bug of its kind could reach.

The fast scope keeps `make test-fast`'s `timing` tests (the sleep-scripted SSP/async schedules among them): on
a loaded machine one may fail its unmutated baseline (run twice before it counts: BASELINE-FAILS, never caught),
or fail beside a bug it does not test (CAUGHT-ELSEWHERE).

`expect`, where stated, is the test (an id or its prefix) that must be the one to fail in `fast`: failing another
one is reported CAUGHT-ELSEWHERE (the table or the tests drifted). The tests are first run on the unmutated copy:
a mutation whose tests fail already is reported BASELINE-FAILS, not as caught. The working tree is never touched;
the copy is removed at the end. Exit status 1 if any mutation survived both scopes, was stale, was caught elsewhere
or could not be judged.

The bugs: issue 28's (the report's tables, the run summary, training, the emulation), three the suite caught
before it (kept as controls), the test harness's own (a pool of thread ranks that carries one case's counters into
the next, a check that stops at its first failing case), and the numbers users read (strategies' critical paths,
the parameter server's modes, compression, the cost model, run metrics, verdicts, report tables, the results
schema), the ten that once survived the whole suite among them (area "survivor").
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

REPORT_TESTS = ("tests/reports/test_report_numbers.py", "tests/reports/test_model.py")
SUMMARY_TESTS = ("tests/experiments/test_run_metrics.py",)
SUMMARY_WIDE = ("tests/experiments/test_train.py::test_summary_row_is_complete_and_plausible",
                "tests/experiments/test_pipeline.py")
TRAINING_TESTS = ("tests/experiments/test_training_reference.py",)
EMULATION_TESTS = ("tests/strategies/test_link_per_rank.py",)  # lower bounds only: test_emulation.py is load-sensitive
HARNESS_TESTS = ("tests/strategies/test_strategy_details.py::test_a_pool_of_ranks_serves_many_runs_each_counted_from"
                 "_zero_and_starts_afresh_after_a_failure",
                 "tests/strategies/test_strategy_details.py::test_check_strategy_names_every_failing_case_in_one_error")
TABLES = ("tests/strategies/test_traffic_tables.py",)
DETAILS = ("tests/strategies/test_strategy_details.py",)
MATRIX = ("tests/strategies/test_strategy_matrix.py",)
COMPRESSION = ("tests/strategies/test_compression.py",)
BARRIER_FREE = ("tests/strategies/test_parameter_server_async.py",)
PS_MATRIX = tuple(f"tests/strategies/test_strategy_matrix.py::test_results_and_traffic[parameter_server[{s}]-{n}]"
                  for s, n in (("servers=1", 5), ("servers=2", 3)))  # the matrix's mean at 5 and 3 workers
PS_WIDE = ("tests/strategies/test_parameter_server.py", "tests/strategies/test_ps_pipeline.py")
TIME_TO_TARGET = ("tests/experiments/test_time_to_target.py", "tests/reports/test_time_to_target.py")
SCHEMA = ("tests/experiments/test_schema_types.py", "tests/experiments/test_store.py")
REPORT_WIDE = ("tests/reports/test_build.py", "tests/reports/test_honest.py", "tests/reports/test_levels.py",
               "tests/reports/test_ps_section.py")


@dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]          # the fast scope
    expect: str = ""                # the test (id or prefix) that must fail in the fast scope; "" for any
    wide: tuple[str, ...] = ()      # run if it survived the fast scope


MUTATIONS = (
    # -- the report's tables -------------------------------------------------------------------------------------
    Mutation("efficiency-without-n", "report", "reports/tables.py",
             'agg["efficiency"] = agg["throughput"] / (agg["workers"] * agg["per_worker"])',
             'agg["efficiency"] = agg["throughput"] / agg["per_worker"]', REPORT_TESTS),
    Mutation("verdict-ratio-inverted", "report", "reports/verdicts.py",
             "{winner['throughput'] / runner_up['throughput']:.2f}x",
             "{runner_up['throughput'] / winner['throughput']:.2f}x", REPORT_TESTS),
    Mutation("efficiency-target-wrong", "report", "reports/tables.py",
             "ts[workload][0]), p)", "ts[workload][0]), 0.9)", REPORT_TESTS),
    Mutation("traffic-check-always-equal", "report", "reports/tables.py",
             'same = np.isclose(both["bytes_sent_per_worker"], both["analytic_bytes_sent_per_worker"], rtol=1e-9, '
             'atol=0.5)',
             "same = np.ones(len(both), dtype=bool)", REPORT_TESTS),
    Mutation("calibration-bytes-doubled", "report", "reports/calibration.py",
             'fit = calibrate(g["analytic_rounds"], g["analytic_path_bytes"], g["comm_s"])',
             'fit = calibrate(g["analytic_rounds"], 2 * g["analytic_path_bytes"], g["comm_s"])', REPORT_TESTS),
    # -- the run summary -----------------------------------------------------------------------------------------
    Mutation("throughput-doubled", "summary", "experiments/pipeline/summary.py",
             '"throughput": float(samples.sum() / step_time.sum())',
             '"throughput": float(2 * samples.sum() / step_time.sum())', SUMMARY_TESTS),
    Mutation("warmup-steps-included", "summary", "experiments/pipeline/summary.py",
             'workers = steps[(steps["role"] == "worker") & steps["timed"]].copy()',
             'workers = steps[(steps["role"] == "worker")].copy()', SUMMARY_TESTS),
    Mutation("fastest-worker-as-step-time", "summary", "experiments/pipeline/summary.py",
             'slowest = workers.loc[workers.groupby("step")["total_s"].idxmax()]',
             'slowest = workers.loc[workers.groupby("step")["total_s"].idxmin()]', SUMMARY_TESTS),
    Mutation("comm-share-from-compute", "summary", "experiments/pipeline/summary.py",
             '"comm_fraction": float(slowest["comm_s"].sum() / step_time.sum())',
             '"comm_fraction": float(slowest["compute_s"].sum() / step_time.sum())', SUMMARY_TESTS),
    # -- training ------------------------------------------------------------------------------------------------
    Mutation("weight-decay-dropped-everywhere", "training", "experiments/pipeline/measured.py",
             "return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)",
             "return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)", TRAINING_TESTS),
    Mutation("weight-decay-dropped-on-the-server", "training", "experiments/pipeline/measured.py",
             "self.shards[key] = (param, _optimizer(self.spec, [param]))",
             "self.shards[key] = (param, torch.optim.SGD([param], lr=self.spec.lr, momentum=self.spec.momentum))",
             TRAINING_TESTS),
    # -- the emulation -------------------------------------------------------------------------------------------
    Mutation("per-rank-links-ignored", "emulation", "strategies/transport/link.py",
             "Port(network.link(rank))", "Port(network.default)", EMULATION_TESTS),
    # -- controls: caught before issue 28 ------------------------------------------------------------------------
    Mutation("server-drops-momentum", "control", "experiments/pipeline/measured.py",
             "self.shards[key] = (param, _optimizer(self.spec, [param]))",
             "self.shards[key] = (param, torch.optim.SGD([param], lr=self.spec.lr, "
             "weight_decay=self.spec.weight_decay))", TRAINING_TESTS),
    Mutation("gradients-summed-not-averaged", "control", "experiments/pipeline/bucket_sync.py",
             'overlap: bool, op: str = "mean"', 'overlap: bool, op: str = "sum"', TRAINING_TESTS),
    Mutation("decentralized-graph-loses-a-hop", "control", "strategies/decentralized.py",
             "hops = [1 << k for k in range((n - 1).bit_length()) if 1 << k < n]",
             "hops = [1 << k for k in range((n - 1).bit_length() - 1) if 1 << k < n]",
             ("tests/strategies/test_strategy_details.py", "tests/strategies/test_strategy_matrix.py")),
    # -- the test harness: strategies.testing and the pool of thread ranks it runs the matrix on ----------------------
    Mutation("pool-counters-carry-over", "harness", "strategies/transport/threads.py",
             "            comm.reset_counters()\n            return fn(comm)", "            return fn(comm)",
             HARNESS_TESTS, "tests/strategies/test_strategy_details.py::test_a_pool_of_ranks"),
    Mutation("check-stops-at-first-failure", "harness", "strategies/testing.py",
             "                if len(failures) >= MAX_FAILURES:\n                    break\n        if",
             "                if failures:\n                    break\n        if", HARNESS_TESTS,
             "tests/strategies/test_strategy_details.py::test_check_strategy_names_every_failing_case"),
    Mutation("traffic-unchecked-on-the-pool", "harness", "strategies/testing.py",
             "    check_traffic(config, workers, numel, dtype.itemsize, traffic, case)\n    return outputs",
             "    return outputs", HARNESS_TESTS,
             "tests/strategies/test_strategy_details.py::test_check_strategy_names_every_failing_case"),
    # -- the ten that survived the whole suite once ----------------------------------------------------------------
    Mutation("ring-path-smallest-chunk", "survivor", "strategies/ring.py",
             "path_bytes=2 * (n - 1) * max(sizes))", "path_bytes=2 * (n - 1) * min(sizes))", TABLES,
             "tests/strategies/test_traffic_tables.py::test_traffic_is_the_hand_worked_table[ring", MATRIX),
    Mutation("late-backup-gets-its-own-step", "survivor", "strategies/parameter_server_async.py",
             'made = unit.made[max(unit.made)] if self.mode == "update" else unit.made[step]',
             "made = unit.made[step]", ("tests/strategies/test_parameter_server_async.py::test_a_late_backup_worker_"
                                         "gets_the_newest_parameters_not_its_own_steps",),
             "tests/strategies/test_parameter_server_async.py::test_a_late_backup_worker_gets_the_newest", PS_WIDE),
    Mutation("dbt-one-chunk-too-many", "survivor", "strategies/double_binary_tree.py",
             "rounds = 2 * depth + (self.chunks - 1) if n > 1", "rounds = 2 * depth + self.chunks if n > 1",
             TABLES, "tests/strategies/test_traffic_tables.py::test_traffic_is_the_hand_worked_table[double_binary",
             ("tests/strategies/test_double_binary_tree.py", *MATRIX)),
    Mutation("topk-floor", "survivor", "strategies/compression.py",
             "max(1, math.ceil(ratio * numel))", "max(1, math.floor(ratio * numel))", COMPRESSION,
             "tests/strategies/test_compression.py::test_topk_count_is_the_documented_ceiling"),
    Mutation("bucketed-path-from-the-largest-bucket", "survivor", "experiments/pipeline/summary.py",
             "path + t.path_bytes,", "max(path, t.path_bytes),", SUMMARY_TESTS,
             "tests/experiments/test_run_metrics.py::test_a_bucketed_runs_analytic_traffic", SUMMARY_WIDE),
    Mutation("one-run-winner-called-clear", "survivor", "reports/verdicts.py",
             'return best["runs"] >= 2 and other["runs"] >= 2 and', 'return other["runs"] >= 2 and', REPORT_TESTS,
             "tests/reports/test_report_numbers.py::test_a_one_run_winner", REPORT_WIDE),
    Mutation("comm-share-as-a-fraction", "survivor", "reports/verdicts.py",
             '"comm share %": best["comm_fraction"] * 100', '"comm share %": best["comm_fraction"]', REPORT_TESTS,
             "tests/reports/test_report_numbers.py::test_every_column_of_the_best_strategy_table", REPORT_WIDE),
    Mutation("requirement-compute-from-oversubscribed-runs", "survivor", "reports/tables.py",
             'clean = g[~g["distorted"]] if (~g["distorted"]).any() else g', "clean = g", REPORT_TESTS,
             "tests/reports/test_report_numbers.py::test_the_requirement_compute_time_leaves_out", REPORT_WIDE),
    Mutation("overlap-requirement-ignores-hidden-seconds", "survivor", "reports/tables.py",
             "path / (budget + hidden.fillna(0)) / 1e6", "path / budget / 1e6", REPORT_TESTS,
             "tests/reports/test_report_numbers.py::test_the_overlap_tables_requirements", REPORT_WIDE),
    Mutation("batch-size-stored-as-float", "survivor", "experiments/results/schema.py",
             'Column("batch_size", INT,', 'Column("batch_size", FLOAT,', SCHEMA,
             "tests/experiments/test_schema_types.py::test_every_column_has_its_frozen_arrow_type"),
    # -- strategies' critical paths and bytes ------------------------------------------------------------------------
    Mutation("halving-doubling-unfold-shares-the-last-round", "strategy", "strategies/halving_doubling.py",
             "unfold_round = 2 * levels + 1", "unfold_round = 2 * levels", TABLES, "", DETAILS),
    Mutation("all-to-all-sends-priced-in-parallel", "strategy", "strategies/all_to_all.py",
             "path_bytes=peers * nbytes)", "path_bytes=nbytes)", TABLES, "", DETAILS),
    Mutation("naive-ring-path-one-hop", "strategy", "strategies/naive_ring.py",
             "path_bytes=hops * nbytes)", "path_bytes=nbytes)", TABLES, "", DETAILS),
    # -- the parameter server's modes ------------------------------------------------------------------------------
    Mutation("ps-partitions-rounded-down", "ps", "strategies/partitions.py",
             "count = math.ceil((hi - lo) / limit)", "count = max(1, (hi - lo) // limit) if hi > lo else 0",
             TABLES, "", (*PS_WIDE, *MATRIX)),
    Mutation("ps-mean-not-divided", "ps", "strategies/parameter_server.py",
             "finish_reduction(reduced, op, n)", "pass", (*TABLES, *PS_MATRIX), "", (*PS_WIDE, *MATRIX)),
    Mutation("async-push-not-scaled-by-n", "ps", "strategies/parameter_server_async.py",
             "scaled.div_(self.workers)", "pass", BARRIER_FREE, "", PS_WIDE),
    Mutation("ssp-bound-one-step-loose", "ps", "strategies/parameter_server_async.py",
             "return bound is None or unit.clock.lowest >= bound", "return bound is None or unit.clock.lowest >= "
             "bound - 1", BARRIER_FREE, "", PS_WIDE),
    # -- compression -----------------------------------------------------------------------------------------------
    Mutation("fp16-priced-as-fp32", "compression", "strategies/compression.py",
             "return inner.traffic(workers, numel, 2)", "return inner.traffic(workers, numel, 4)", COMPRESSION),
    Mutation("powersgd-q-priced-as-p", "compression", "strategies/compression.py",
             "inner.traffic(workers, sum(p.cols * p.rank for p in compressed), 4)",
             "inner.traffic(workers, sum(p.rows * p.rank for p in compressed), 4)", COMPRESSION),
    # -- the cost model --------------------------------------------------------------------------------------------
    Mutation("comm-time-without-latency", "cost", "strategies/cost.py",
             "return rounds * latency + path_bytes / bandwidth", "return path_bytes / bandwidth", REPORT_TESTS),
    Mutation("byteps-optimum-denominator", "cost", "strategies/cost.py",
             "(n * n + k * n - 2 * k)", "(n * n + k * n - k)", REPORT_TESTS, "", DETAILS),
    Mutation("local-sgd-period-ignored", "cost", "strategies/cost.py",
             "return (traffic.rounds / period, path / period,",
             "return (traffic.rounds, path,", REPORT_TESTS, "",
             ("tests/experiments/test_local_sgd.py",)),
    # -- run metrics -----------------------------------------------------------------------------------------------
    Mutation("time-to-target-one-step-early", "summary", "experiments/pipeline/summary.py",
             "reached = int(met.index[0]) + 1", "reached = int(met.index[0])", (*SUMMARY_TESTS, *TIME_TO_TARGET)),
    # -- verdicts and report tables --------------------------------------------------------------------------------
    Mutation("touching-intervals-called-clear", "report", "reports/verdicts.py",
             'other["throughput_hi"] < best["throughput_lo"]', 'other["throughput_hi"] <= best["throughput_lo"]',
             REPORT_TESTS, "", REPORT_WIDE),
    Mutation("overlap-efficiency-from-busy-time", "report", "reports/tables.py",
             '"P": agg["compute_s"] / (agg["compute_s"] + agg["exposed_comm_s"])',
             '"P": agg["compute_s"] / (agg["compute_s"] + agg["comm_busy_s"])', REPORT_TESTS, "", REPORT_WIDE),
    # -- the results schema ----------------------------------------------------------------------------------------
    Mutation("step-bytes-stored-as-float", "schema", "experiments/results/schema.py",
             'Column("bytes_sent", INT, "payload bytes sent in the step")',
             'Column("bytes_sent", FLOAT, "payload bytes sent in the step")', SCHEMA),
)


def copy_tree(source: str, into: Path) -> None:
    """The tree to mutate: git HEAD (`head`) or the working tree's tracked and untracked, non-ignored files."""
    if source == "head":
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
        return
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / rel)


def fast_markers() -> str:
    """`make test-fast`'s marker expression, as the Makefile states it (FAST_MARKERS := ...)."""
    found = re.search(r"^FAST_MARKERS := (.+)$", (ROOT / "Makefile").read_text(), re.M)
    if not found:
        raise SystemExit("tests/mutations.py: the Makefile has no FAST_MARKERS line to read make test-fast's "
                         "selection from")
    return found.group(1).strip()


WIDE_MARKERS = "not netns and not gpu"  # make test's selection, less what this machine skips anyway


def run_tests(tree: Path, tests: tuple[str, ...], markers: str, timeout: float) -> tuple[str, str]:
    """('pass' | 'fail' | 'none' | 'error', the first failing test or the reason) of pytest on `tests` in `tree`
    with the marker expression `markers`; 'none': no test of `tests` is in that selection."""
    present = tuple(t for t in tests if (tree / t.split("::")[0]).exists())
    if not present:
        return "error", f"none of the tests exist in this tree: {', '.join(tests)}"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", markers, *present]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "error", f"tests ran over {timeout:g} s"
    if proc.returncode == 0:
        return "pass", ""
    if proc.returncode == 5:  # no tests collected: none of these is in this selection
        return "none", f"no test of {', '.join(tests)} is selected by -m {markers!r}"
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", proc.stdout, re.M)  # a test id may hold spaces
    if proc.returncode == 1 and failed:
        return "fail", failed[0]
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return "error", f"pytest exit {proc.returncode}: " + " | ".join(tail)


@dataclass
class Result:
    mutation: Mutation
    verdict: str   # caught-fast, caught-wide, SURVIVED, STALE, BASELINE-FAILS, CAUGHT-ELSEWHERE, ERROR, plantable
    fast: str      # the fast scope's outcome: the failing test, or why not
    wide: str      # the wide scope's, when it ran
    seconds: float

    @property
    def ok(self) -> bool:
        return self.verdict in ("caught-fast", "caught-wide", "plantable")


def judge(tree: Path, m: Mutation, markers: str, timeout: float, baselines: dict) -> Result:
    """Plant `m` in `tree`, run its fast scope (then its wide one if it survived), restore the file."""
    start = time.monotonic()
    path = tree / m.path
    original = path.read_text() if path.exists() else ""
    count = original.count(m.old)
    if count != 1:
        return Result(m, "STALE", f"{m.path}: the code to mutate occurs {count} times (expected once)", "", 0)
    scopes = [("fast", m.tests, markers)] + ([("wide", m.wide, WIDE_MARKERS)] if m.wide else [])
    outcomes = {}
    for scope, tests, marks in scopes:
        key = (tests, marks)
        if key not in baselines:
            baselines[key] = run_tests(tree, tests, marks, timeout)
            if baselines[key][0] in ("fail", "error"):  # once more: a `timing` test may lose to a loaded machine
                baselines[key] = run_tests(tree, tests, marks, timeout)
        base, why = baselines[key]
        if base not in ("pass", "none"):
            outcomes[scope] = ("baseline", f"{why} (unmutated)")
            continue
        if base == "none":
            outcomes[scope] = ("none", why)
            continue
        path.write_text(original.replace(m.old, m.new))
        try:
            outcomes[scope] = run_tests(tree, tests, marks, timeout)
        finally:
            path.write_text(original)
        if outcomes[scope][0] == "fail":
            break
    took = time.monotonic() - start
    fast, why_fast = outcomes["fast"]
    wide, why_wide = outcomes.get("wide", ("", ""))
    if fast == "fail":
        if m.expect and not why_fast.startswith(m.expect):
            return Result(m, "CAUGHT-ELSEWHERE", f"{why_fast} failed, the table expects {m.expect}", "", took)
        return Result(m, "caught-fast", why_fast, "", took)
    if wide == "fail":
        return Result(m, "caught-wide", why_fast or "survived", why_wide, took)
    if "baseline" in (fast, wide):
        return Result(m, "BASELINE-FAILS", why_fast, why_wide, took)
    if "error" in (fast, wide):
        return Result(m, "ERROR", why_fast, why_wide, took)
    return Result(m, "SURVIVED", why_fast or "survived", why_wide or ("survived" if m.wide else "no wide scope"),
                  took)


def markdown(results: list[Result], source: str, markers: str, took: float) -> str:
    """The result as docs/mutations.md: the date, the scopes run, one row per bug."""
    caught_fast = sum(r.verdict == "caught-fast" for r in results)
    caught = sum(r.verdict in ("caught-fast", "caught-wide") for r in results)
    lines = [
        "# Mutation check",
        "",
        f"`make mutations` (tests/mutations.py) on {dt.date.today().isoformat()}, source `{source}`, "
        f"{took / 60:.0f} min on this machine: each bug below planted alone in a copy of the tree, its `fast` "
        f"tests run with `make test-fast`'s marker expression (`{markers}`), and, only if it survived those, its "
        f"`wide` tests with `make test`'s (`{WIDE_MARKERS}`). The whole `make test` was not run per bug (about "
        "20 minutes each on 2 cores): `wide` is the files a bug of its kind could reach, not the suite. A bug "
        "caught in the fast scope fails a test that `make test-fast` selects, so it fails `make test-fast` and "
        "`make test` (which runs every test `make test-fast` does).",
        "",
        f"**{caught_fast} of {len(results)} caught by `make test-fast`'s tests, {caught} of {len(results)} by the "
        f"fast or the wide scope.**",
        "",
        "| bug | area | result | the test that caught it (fast) | wide scope |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.mutation.name} | {r.mutation.area} | {r.verdict} | {r.fast.replace('|', '/')} | "
                     f"{r.wide.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=("head", "worktree"), default="head")
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--area", help="comma-separated areas (survivor, strategy, ps, report, ...)")
    parser.add_argument("--check", action="store_true", help="only check that every mutation can be planted")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run (default 600)")
    parser.add_argument("--write", type=Path, help="write the result as markdown to this file (docs/mutations.md)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if (not args.only or m.name in args.only.split(","))
              and (not args.area or m.area in args.area.split(","))]
    if args.only and len(chosen) != len(set(args.only.split(","))):
        known = ", ".join(m.name for m in MUTATIONS)
        parser.error(f"--only {args.only!r}: known mutations are {known}")
    markers = fast_markers()
    tree = Path(tempfile.mkdtemp(prefix="syncbench-mutations-"))
    results: list[Result] = []
    began = time.monotonic()
    try:
        copy_tree(args.source, tree)
        baselines: dict = {}
        for m in chosen:
            if args.check:
                count = (tree / m.path).read_text().count(m.old) if (tree / m.path).exists() else 0
                results.append(Result(m, "plantable" if count == 1 else "STALE",
                                      "" if count == 1 else f"occurs {count} times", "", 0))
            else:
                results.append(judge(tree, m, markers, args.timeout, baselines))
            r = results[-1]
            print(f"{m.name:46s} {m.area:11s} {r.verdict:16s} {r.seconds:5.0f}s  fast: {r.fast}"
                  + (f"  wide: {r.wide}" if r.wide else ""), flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    bad = [r for r in results if not r.ok]
    fast = sum(r.verdict == "caught-fast" for r in results)
    print(f"# {len(results) - len(bad)} of {len(results)} mutations "
          f"{'plantable' if args.check else 'caught'} ({args.source}); {fast} by make test-fast's tests; "
          + ("not: " + ", ".join(f"{r.mutation.name} ({r.verdict})" for r in bad) if bad else "none survived"))
    if args.write and not args.check:
        args.write.write_text(markdown(results, args.source, markers, time.monotonic() - began))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
