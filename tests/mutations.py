"""Plant each bug the tests must catch, one at a time, in a temporary copy of the tree; report which survive.

    .venv/bin/python tests/mutations.py                   # every mutation, on the committed tree (git HEAD)
    .venv/bin/python tests/mutations.py --source worktree # on the working tree as it is (uncommitted edits too)
    .venv/bin/python tests/mutations.py --only throughput-doubled,verdict-ratio-inverted
    .venv/bin/python tests/mutations.py --check           # only check that every bug can still be planted

The bugs are one table, MUTATIONS: each row is a bug's name, its area, the file, the exact code it replaces (it
must occur exactly once; if the code moved, the row is reported STALE and needs updating here), the code planted
instead, the tests to run (thread ranks, no Ray, `-x`) and, where one is stated, the test that must be the one to
fail (`expect`, a test id or its prefix): failing another one is reported CAUGHT-ELSEWHERE (the table or the tests
drifted). The tests are first run on the unmutated copy: a mutation whose tests fail already is reported
BASELINE-FAILS, not as caught. The working tree is never touched; the copy is removed at the end. Exit status 1 if
any mutation survived, was stale, was caught elsewhere or could not be judged.

The bugs are those of issue 28 (the report's tables, the run summary, training, the emulation), three the suite
caught before it (kept as controls) and the test harness's own (a pool of thread ranks that carries one case's
counters into the next, a check that stops at its first failing case).
"""

from __future__ import annotations

import argparse
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
SUMMARY_TESTS = ("tests/experiments/test_run_metrics.py", "tests/experiments/test_train.py::"
                 "test_summary_row_is_complete_and_plausible")
TRAINING_TESTS = ("tests/experiments/test_training_reference.py",)
EMULATION_TESTS = ("tests/strategies/test_link_per_rank.py",)  # lower bounds only: test_emulation.py is load-sensitive
HARNESS_TESTS = ("tests/strategies/test_strategy_details.py::test_a_pool_of_ranks_serves_many_runs_each_counted_from"
                 "_zero_and_starts_afresh_after_a_failure",
                 "tests/strategies/test_strategy_details.py::test_check_strategy_names_every_failing_case_in_one_error")


@dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    expect: str = ""  # the test (id or prefix) that must fail; "" for any of `tests`


MUTATIONS = (
    # -- the report's tables -------------------------------------------------------------------------------------
    Mutation("efficiency-without-n", "report", "reports/tables.py",
             'agg["efficiency"] = agg["throughput"] / (agg["workers"] * agg["per_worker"])',
             'agg["efficiency"] = agg["throughput"] / agg["per_worker"]', REPORT_TESTS),
    Mutation("verdict-ratio-inverted", "report", "reports/verdicts.py",
             "{winner['throughput'] / runner_up['throughput']:.2f}x",
             "{runner_up['throughput'] / winner['throughput']:.2f}x", REPORT_TESTS),
    Mutation("efficiency-target-wrong", "report", "reports/tables.py",
             "s = bandwidth_needed(path_bytes, ts[workload][0], p)",
             "s = bandwidth_needed(path_bytes, ts[workload][0], 0.9)", REPORT_TESTS),
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
    Mutation("weight-decay-dropped-everywhere", "training", "experiments/pipeline/train.py",
             "return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)",
             "return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)", TRAINING_TESTS),
    Mutation("weight-decay-dropped-on-the-server", "training", "experiments/pipeline/train.py",
             "self.shards[key] = (param, _optimizer(self.spec, [param]))",
             "self.shards[key] = (param, torch.optim.SGD([param], lr=self.spec.lr, momentum=self.spec.momentum))",
             TRAINING_TESTS),
    # -- the emulation -------------------------------------------------------------------------------------------
    Mutation("per-rank-links-ignored", "emulation", "strategies/transport/link.py",
             "Port(network.link(rank))", "Port(network.default)", EMULATION_TESTS),
    # -- controls: caught before issue 28 ------------------------------------------------------------------------
    Mutation("server-drops-momentum", "control", "experiments/pipeline/train.py",
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


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str]:
    """('pass' | 'fail' | 'error', the first failing test or the reason) of pytest on `tests` in `tree`."""
    present = tuple(t for t in tests if t.startswith("-") or (tree / t.split("::")[0]).exists())
    if not any(not t.startswith("-") for t in present):
        return "error", f"none of the tests exist in this tree: {', '.join(tests)}"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m",
           "not ray and not netns and not gpu and not timing", *present]
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "error", f"tests ran over {timeout:g} s"
    if proc.returncode == 0:
        return "pass", ""
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.M)
    if proc.returncode == 1 and failed:
        return "fail", failed[0]
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return "error", f"pytest exit {proc.returncode}: " + " | ".join(tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", choices=("head", "worktree"), default="head")
    parser.add_argument("--only", help="comma-separated mutation names")
    parser.add_argument("--check", action="store_true", help="only check that every mutation can be planted")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test run (default 900)")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only.split(",")]
    if args.only and len(chosen) != len(set(args.only.split(","))):
        known = ", ".join(m.name for m in MUTATIONS)
        parser.error(f"--only {args.only!r}: known mutations are {known}")
    tree = Path(tempfile.mkdtemp(prefix="syncbench-mutations-"))
    results = []
    try:
        copy_tree(args.source, tree)
        baselines: dict[tuple[str, ...], tuple[str, str]] = {}
        for m in chosen:
            start = time.monotonic()
            path = tree / m.path
            original = path.read_text() if path.exists() else ""
            count = original.count(m.old)
            if count != 1:
                results.append((m, "STALE", f"{m.path}: the code to mutate occurs {count} times (expected once)", 0))
            elif args.check:
                results.append((m, "plantable", "", 0))
            else:
                if m.tests not in baselines:
                    baselines[m.tests] = run_tests(tree, m.tests, args.timeout)
                base, why = baselines[m.tests]
                if base != "pass":
                    results.append((m, "BASELINE-FAILS", why, time.monotonic() - start))
                else:
                    path.write_text(original.replace(m.old, m.new))
                    try:
                        outcome, why = run_tests(tree, m.tests, args.timeout)
                    finally:
                        path.write_text(original)
                    verdict = {"fail": "caught", "pass": "SURVIVED", "error": "ERROR"}[outcome]
                    if verdict == "caught" and not why.startswith(m.expect):
                        verdict, why = "CAUGHT-ELSEWHERE", f"{why} failed, the table expects {m.expect}"
                    results.append((m, verdict, why, time.monotonic() - start))
            m_, verdict, why, took = results[-1]
            print(f"{m.name:36s} {m.area:10s} {verdict:15s} {took:6.0f}s  {why}", flush=True)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    bad = [r for r in results if r[1] not in ("caught", "plantable")]
    print(f"# {len(results) - len(bad)} of {len(results)} mutations "
          f"{'plantable' if args.check else 'caught'} ({args.source}); "
          + ("not: " + ", ".join(f"{m.name} ({v})" for m, v, _, _ in bad) if bad else "none survived"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
