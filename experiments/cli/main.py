"""The `syncbench` command line (also `python -m experiments`)."""

from __future__ import annotations

import argparse
import signal
import sys

from experiments.cli import (
    bench,
    break_even,
    cluster,
    explain,
    export,
    faults,
    model,
    profile,
    report,
    run,
    schema,
    simulate,
    strategies,
    trace,
    validate,
    verify,
)
from experiments.cli import map as map_command
from experiments.cli.common import P2P_CHOICES
from experiments.cli.run import print_runs as _print_runs
from experiments.cli.signals import bounded_by_signals

__all__ = ["COMMANDS", "P2P_CHOICES", "_print_runs", "main"]  # P2P_CHOICES and _print_runs: read by tests

# each command: its module (add_arguments, run) and its line in `syncbench -h`, in the order listed there
TABLE = [
    ("run", run, "run a sweep file and write its results to --out: runs/ and steps/ (one Parquet part per run; "
                 "`syncbench export` or experiments.results.load_runs to read them), sweep.toml and report.html"),
    ("simulate", simulate, "run a sweep on a simulated cluster (SimGrid), up to thousands of ranks"),
    ("validate", validate, "the validation matrix: every strategy and variant priced by the model and simulated on "
                           "SimGrid (alpha_beta, tcp), side by side with their ratio"),
    ("report", report, "(re)build DIR/report.html from DIR's results"),
    ("export", export, "DIR's runs and steps as one file per table (every column, each run's latest attempt): "
                       "OUT/runs.parquet and OUT/steps.parquet, or .csv"),
    ("trace", trace, "a run's traced steps as Chrome trace JSON or Chakra ETs"),
    ("model", model, "the analytic model: communication time, efficiency, bandwidth needed"),
    ("map", map_command, "which strategy wins where: workers x bandwidth (or x message size), from the model, each "
                         "strategy at its best knob; the crossovers in words"),
    ("explain", explain, "one sync of a strategy's real code on thread ranks, drawn round by round from its "
                         "messages: a table, SVG or HTML"),
    ("break-even", break_even, "the NIC bandwidth below which each compression (or local SGD) shortens the step, "
                               "and time to target given a steps-to-target ratio"),
    ("faults", faults, "a scripted failure on thread ranks or Ray actors for each strategy and recovery mode: "
                       "steps lost, detection and recovery seconds, the survivors' result checked; or failures "
                       "drawn from a rate on SimGrid against the model (--simulate); or a link down for t seconds "
                       "(--outage) on emulated links, the kernel-shaped network or SimGrid"),
    ("strategies", strategies, "list the registered strategies and their parameters"),
    ("schema", schema, "the columns of the runs and steps tables: name, type, meaning"),
    ("profile", profile, "measure a compute profile: forward, per-parameter gradient readiness, optimizer (one rank "
                         "alone); or describe one (--synthetic)"),
    ("verify", verify, "check every strategy against a reference on Ray actors (over --p2p)"),
    ("bench", bench, "benchmarks, one subcommand each: collectives (nccl-tests-style allreduce table, the default), "
                     "ps, transport, harness, overlap"),
    ("cluster", cluster, "a Ray cluster on this machine: nodes in network namespaces, links shaped by the kernel "
                         "(root only)"),
]
COMMANDS = {name: module.run for name, module, _ in TABLE}  # looked up when a command runs (tests replace one)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="syncbench", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    for name, module, help in TABLE:
        module.add_arguments(sub.add_parser(name, help=help))
    return top


def main(argv: list[str] | None = None) -> int:
    # the old `bench --ps` form: parsed as `bench ps`, its notice printed once the line is accepted
    argv, notice = bench.upgrade(sys.argv[1:] if argv is None else list(argv))
    args = parser().parse_args(argv)
    if notice:
        print(notice, flush=True)
    from experiments.cluster.netns import ClusterError

    try:
        # `cluster` is left to finish its own way out: a forced exit could strand half-removed namespaces
        with bounded_by_signals(args.command, deadline=args.command != "cluster"):
            return COMMANDS[args.command](args) or 0
    except (ValueError, FileExistsError, FileNotFoundError, ClusterError, ConnectionError) as e:
        print(f"syncbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        # (an exception is always true: its text is what may be empty, as Ctrl-C's is)
        print(f"syncbench {args.command}: interrupted ({str(e) or 'SIGINT, Ctrl-C'}); finished runs are saved",
              file=sys.stderr)
        return 128 + (signal.SIGTERM if str(e) == "SIGTERM" else signal.SIGINT)
