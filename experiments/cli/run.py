"""The `syncbench run` command: run a sweep file on Ray actors (or thread ranks) and print its runs."""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.cli.common import add_results_arguments, closing_report


def add_arguments(p) -> None:
    p.add_argument("sweep", help="a sweep TOML file, e.g. experiments/config/sweeps/quick.toml")
    add_results_arguments(p, "run")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="allow more than 4 ranks per core (times then measure core contention)")
    p.add_argument("--substrate", default="ray", choices=("ray", "threads"),
                   help="where the ranks run: Ray actors (default) or threads of this process, which can share a "
                        "node's NIC (ranks_per_node > 1; no --address)")


def run(args) -> int:
    from experiments.config import sweep as sweep_mod
    from experiments.pipeline.runner import run_sweep
    from experiments.pipeline.store import default_dir

    sweep = sweep_mod.load(args.sweep, progress=_expansion_progress, skip_invalid=args.skip_invalid)
    for point, reason in sweep.skipped:
        print(f"syncbench run: skipped grid point [{point}]: {reason}", file=sys.stderr)
    if args.out:
        out = Path(args.out)
    else:  # the sweep file's name never chooses a path outside results/
        out, note = default_dir(sweep.name)
        if note:
            print(f"syncbench run: {note}", file=sys.stderr)
    substrate = None  # Ray's
    if args.substrate == "threads":
        from experiments.pipeline.substrate import ThreadSubstrate

        if args.address:
            raise ValueError(f"--substrate threads with --address {args.address}: thread ranks run in this process, "
                             f"not on a Ray cluster (accepted: one of them)")
        substrate = ThreadSubstrate()
    runs = run_sweep(sweep, out, resume=args.resume, overwrite=args.overwrite, address=args.address,
                     oversubscribe=args.oversubscribe, substrate=substrate)
    print_runs(runs)
    if not args.no_report:
        closing_report(out)
    failed = int((runs["status"] != "ok").sum()) if not runs.empty else 0
    return 1 if failed else 0


def _expansion_progress(done: int, total: int) -> None:
    print(f"\rexpanding the grid: {done:,}/{total:,} points", end="\n" if done == total else "",
          file=sys.stderr, flush=True)


# the compression settings a column belongs to (the printed table leaves it blank on other runs)
APPLIES_TO = {"powersgd_rank": ("powersgd",), "topk_ratio": ("topk",), "error_feedback": ("powersgd", "topk")}


def print_runs(runs) -> None:
    import pandas as pd

    if runs.empty:
        return
    cols = ["strategy", "workers", "link", "status", "throughput", "step_time_s", "compute_s", "comm_s",
            "bytes_sent_per_worker"]
    if "accuracy" in runs and runs["accuracy"].notna().any():  # a real data set: held-out accuracy too
        cols += ["final_loss", "accuracy"]
    if "target_metric" in runs and (runs["target_metric"].fillna("") != "").any():  # time to target: both factors
        cols += ["steps_to_target", "time_to_target_s"]
    order = ["link", "workers", "strategy"]
    # every setting that varies between the runs gets a column (strategy parameters by their param_ name), or
    # rows of different runs would look identical
    candidates = ["bucket_mb", "overlap", "compute", "link_latency_s", "link_heterogeneous", "link_emulation",
                  "straggler_ranks", "straggler_slowdown", "p2p", "seed", "compression", "powersgd_rank",
                  "topk_ratio", "error_feedback", "sync_every", "outer_optimizer"]
    # a compression's own parameter means something on the runs with that compression only: blank elsewhere, and
    # an axis only when it varies among those runs (powersgd_rank = 1 beside compression = "none" is no setting)
    runs = runs.copy()
    for column, uses in APPLIES_TO.items():
        if column in runs and "compression" in runs:
            runs[column] = runs[column].astype(object).where(runs["compression"].isin(uses), "")
    varying = [c for c in candidates if c in runs and
               (runs[c][runs[c].map(str) != ""] if c in APPLIES_TO else runs[c]).map(str).nunique() > 1]
    # a strategy parameter is an axis when it varies between runs of one strategy; a column only one strategy
    # fills (NaN or '' for the others) does not vary by being unused, and unused cells print blank
    params = sorted(c for c in runs if c.startswith("param_") and c != "param_norm")
    varying += [c for c in params if (runs.groupby("strategy")[c].agg(lambda v: v.map(str).nunique()) > 1).any()]
    cols[cols.index("strategy") + 1:cols.index("strategy") + 1] = varying
    order += varying
    if "overlap" in varying:  # buckets synced during backward: exposed vs busy
        cols += ["comm_busy_s"]
    table = runs[cols].copy()
    for c in (c for c in varying if c.startswith("param_")):
        table[c] = table[c].map(lambda v: "" if v is None or v != v or v == "" else v).astype(object)
        if "knob_chosen" in runs and "knob" in runs:  # a size knob the sweep left unset: the model's choice
            chosen = runs["knob_chosen"].astype(bool) & (runs["knob"] == c[len("param_"):])
            if chosen.any():
                table[c] = [f"{v:g}" + (" (model)" if by_model else "") if isinstance(v, (int, float)) else v
                            for v, by_model in zip(table[c], chosen)]
    table = table.iloc[sorted(range(len(table)), key=lambda i: [str(v) for v in table[order].iloc[i]])]
    table["bytes_sent_per_worker"] = table["bytes_sent_per_worker"] / 1e6
    table = table.rename(columns={"throughput": "samples/s", "step_time_s": "step s", "compute_s": "compute s",
                                  "comm_s": "comm s", "bytes_sent_per_worker": "MB sent/worker",
                                  "comm_busy_s": "busy s", "steps_to_target": "steps to target",
                                  "time_to_target_s": "s to target"})
    with pd.option_context("display.width", 160, "display.max_rows", 500, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
