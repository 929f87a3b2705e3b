"""The `syncbench simulate` command: run a sweep on a simulated cluster, or time the simulator (--bench)."""

from __future__ import annotations

import sys
from pathlib import Path

from experiments.cli.common import add_results_arguments


def add_arguments(p) -> None:
    p.add_argument("sweep", nargs="?", help="a sweep TOML file with a [simulate] table, e.g. "
                                            "experiments/config/sweeps/simulate.toml")
    add_results_arguments(p, "simulate")
    p.add_argument("--bench", action="store_true",
                   help="instead: wall time to simulate one ResNet-50 step per strategy and rank count (a table)")
    p.add_argument("--workers", default="64,256,1024", help="with --bench: rank counts (default 64,256,1024)")
    p.add_argument("--network-model", default="tcp", choices=("tcp", "alpha_beta"),
                   help="with --bench: SimGrid's network model (default tcp, SimGrid's LV08; alpha_beta: its "
                        "corrections off)")
    p.add_argument("--strategies", help="with --bench: comma-separated names (default: halving_doubling, "
                                        "parameter_server with 8 servers, decentralized, ring, all_to_all)")
    p.add_argument("--max-memory", help="refuse, before it starts, a simulation whose estimated peak memory is over "
                                         "this (e.g. 8GB, 512MiB; default: what this machine has available)")
    p.add_argument("--ps", action="store_true",
                   help="with --bench: the parameter-server family instead: every mode (dedicated/colocated x "
                        "update/summation, SSP s=2, async, backups=1) for each --servers k, against BytePS's optimum")
    p.add_argument("--servers", default="8", help="with --bench --ps: server counts k (default 8)")
    p.add_argument("--platforms", default="star", help="with --bench --ps: star and/or fat_tree (4:1), comma-separated")
    p.add_argument("--modes", help="with --bench --ps: comma-separated modes (default: all)")
    p.add_argument("--nic", default="shared", choices=("shared", "fifo"),
                   help="with --bench --ps or --ranks-per-node: a rank's concurrent sends share its NIC (default) or "
                        "leave one at a time")
    p.add_argument("--ranks-per-node", type=int, default=1,
                   help="with --bench: nodes of this many ranks (10 Gbit/s NIC each, 100 Gbit/s inside) and "
                        "ResNet-50's 25 MiB buckets: ring, hierarchical and double_binary_tree (or --strategies) "
                        "beside the per-level alpha-beta model")


def run(args) -> int:
    from experiments.pipeline.store import default_dir
    from experiments.simulate.substrate import load, simulate_sweep
    from strategies.transport.simgrid import simgrid_available

    missing = simgrid_available()
    if missing:
        print(f"syncbench simulate: error: {missing}", file=sys.stderr)
        return 2
    from experiments.simulate.memory import parse_memory

    max_memory = parse_memory(args.max_memory) if args.max_memory is not None else None
    if args.bench:
        from experiments.simulate.bench import bench, format_bench

        workers = _counts("--workers", args.workers)
        if args.ps and args.ranks_per_node != 1:
            raise ValueError(f"simulate --bench --ps --ranks-per-node {args.ranks_per_node}: the parameter-server "
                             f"bench runs on a star or fat tree of single-rank hosts; accepted: --ps without "
                             f"--ranks-per-node, or --ranks-per-node without --ps")
        if args.ps:
            from experiments.simulate.bench import PS_MODES, PS_PLATFORMS, bench_ps, format_bench_ps

            servers = _counts("--servers", args.servers)
            platforms = [t.strip() for t in args.platforms.split(",") if t.strip()]
            modes = [m.strip() for m in args.modes.split(",")] if args.modes else None
            bad = [t for t in platforms if t not in PS_PLATFORMS] + [m for m in modes or [] if m not in
                                                                       dict(PS_MODES)]
            if bad:
                raise ValueError(f"simulate --bench --ps: {bad} not accepted: platforms {', '.join(PS_PLATFORMS)}; "
                                 f"modes {', '.join(name for name, _ in PS_MODES)}")
            cells = [(n, k, t) for n in workers for t in platforms for k in servers]
            print(format_bench_ps(bench_ps(cells, modes, log=sys.stderr, network_model=args.network_model,
                                            nic=args.nic)))
            return 0
        names = [n.strip() for n in args.strategies.split(",")] if args.strategies else None
        if args.ranks_per_node > 1:
            from experiments.simulate.bench import bench_nodes, format_bench_nodes

            rows = [row for n in workers for row in bench_nodes(n, args.ranks_per_node, names, log=sys.stderr,
                                                                network_model=args.network_model, nic=args.nic)]
            print(format_bench_nodes(rows))
            return 0 if all(not r["error"] for r in rows) else 1
        if args.ranks_per_node < 1:
            raise ValueError(f"simulate --bench --ranks-per-node {args.ranks_per_node}: expected an integer >= 1")
        rows = bench(workers, names, log=sys.stderr, network_model=args.network_model, max_memory=max_memory)
        print(format_bench(rows))
        return 0 if all(not r["error"] for r in rows) else 1
    if not args.sweep:
        raise ValueError("syncbench simulate needs a sweep file (or --bench)")
    out = args.out
    if out is None:  # the sweep file's name never chooses a path outside results/
        out, note = default_dir(load(args.sweep, skip_invalid=args.skip_invalid)[0].name)
        if note:
            print(f"syncbench simulate: {note}", file=sys.stderr)
    runs = simulate_sweep(args.sweep, out, resume=args.resume, overwrite=args.overwrite,
                          skip_invalid=args.skip_invalid, max_memory=max_memory)
    print(format_runs(runs))
    print(f"results: {out}")
    if not args.no_report and not runs.empty:
        from experiments.cli.common import closing_report

        closing_report(Path(out))
    return 1 if (runs["status"] != "ok").any() else 0


def format_runs(runs) -> str:
    """The plain table `syncbench simulate` prints: simulated beside the alpha-beta model."""
    import pandas as pd

    if runs.empty:
        return ""
    # every setting that varies between runs gets a column (as `syncbench run` prints), or rows look identical
    candidates = ["bucket_mb", "straggler_ranks", "straggler_slowdown"] + sorted(
        c for c in runs if c.startswith("param_") and c != "param_norm")
    varying = [c for c in candidates  # within one strategy: another strategy's parameters are not a setting here
               if c in runs and (runs[c].map(str).groupby(runs["strategy"]).nunique() > 1).any()]
    table = runs[["strategy", "workers", *varying, "sim_platform", "sim_network_model", "overlap", "status",
                  "step_time_s", "compute_s", "comm_s", "model_comm_s", "bytes_sent_per_worker", "sim_wall_s"]].copy()
    table["bytes_sent_per_worker"] = table["bytes_sent_per_worker"] / 1e6
    table = table.rename(columns={"sim_platform": "platform", "sim_network_model": "model", "step_time_s": "step s",
                                  "compute_s": "compute s", "comm_s": "comm s", "model_comm_s": "alpha-beta s",
                                  "bytes_sent_per_worker": "MB sent/worker", "sim_wall_s": "wall s",
                                  "straggler_slowdown": "slowdown", "straggler_ranks": "slow ranks"})
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_colwidth", 60,
                           "display.float_format", "{:.3f}".format):
        return table.to_string(index=False)


def _counts(option: str, text: str) -> list[int]:
    """--workers / --servers of the bench: integers from 1 to the sweeps' rank limit (a million workers was 20.9
    million messages), or one line naming the value and the range."""
    from experiments.config.sweep import MAX_RANKS

    values = []
    for item in (w.strip() for w in text.split(",")):
        if not item:
            continue
        if not (item.isdigit() and 1 <= int(item) <= MAX_RANKS):
            shown = repr(item) if len(item) <= 20 else repr(item[:20] + "...")
            raise ValueError(f"simulate --bench {option} {shown}: accepted are integers from 1 to {MAX_RANKS:,}, "
                             f"comma-separated (as a sweep's ranks)")
        values.append(int(item))
    if not values:
        raise ValueError(f"simulate --bench {option} {text!r}: give at least one count, e.g. 64,256")
    return values

