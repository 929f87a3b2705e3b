"""The `syncbench` command line (also `python -m experiments`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="syncbench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a sweep file and write runs.parquet, steps.parquet and report.html")
    p.add_argument("sweep", help="a sweep TOML file, e.g. experiments/config/sweeps/quick.toml")
    p.add_argument("--out", help="results directory (default: results/<sweep name>/)")
    p.add_argument("--resume", action="store_true", help="run only what is missing or failed in --out")
    p.add_argument("--overwrite", action="store_true", help="discard results already in --out")
    p.add_argument("--address", help="Ray cluster address (default: RAY_ADDRESS, else an embedded local Ray)")
    p.add_argument("--no-report", action="store_true", help="skip writing report.html")

    p = sub.add_parser("report", help="(re)build DIR/report.html from DIR's Parquet files")
    p.add_argument("dir")

    p = sub.add_parser("model", help="the analytic model: communication time, efficiency, bandwidth needed")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="resnet18 | resnet50 | vgg11 | vgg16 (fp32 parameters)")
    what.add_argument("--model-bytes", help="message size instead of a model, e.g. 553.36MB")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--bandwidth", required=True, help="per-worker link, e.g. 125MB/s, 1Gbit, 25Gbit")
    p.add_argument("--step-time", type=float, required=True, help="compute time per step Ts, seconds")
    p.add_argument("--latency", default="0s", help="per-message latency, e.g. 50us (default 0s)")
    p.add_argument("--target-efficiency", type=float, default=0.9)
    p.add_argument("--strategy", action="append", help="limit to these strategies (repeatable)")

    sub.add_parser("strategies", help="list the registered strategies and their parameters")

    p = sub.add_parser("verify", help="check every strategy against a reference on Ray actors over gloo")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--numel", type=int, default=100_003)
    p.add_argument("--op", default="sum")
    p.add_argument("--strategies", help="comma-separated names (default: all)")
    p.add_argument("--address", help="Ray cluster address")

    p = sub.add_parser("bench", help="nccl-tests-style table of allreduce time, algbw and busbw per strategy")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes in bytes, e.g. 4K,64K,1M,16M")
    p.add_argument("--strategies", help="comma-separated names (default: all exact allreduces)")
    p.add_argument("--bandwidth", help="emulate links of this bandwidth, e.g. 1Gbit")
    p.add_argument("--latency", default="0s", help="emulated per-message latency, e.g. 50us")
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: by size)")
    p.add_argument("--transport", action="store_true",
                   help="instead: point-to-point bandwidth and latency of the transport between 2 actors")
    p.add_argument("--harness", action="store_true",
                   help="instead: 1-worker training through syncbench vs a plain PyTorch loop (overhead)")
    p.add_argument("--workload", default="resnet18", help="with --harness: the model (default resnet18)")
    p.add_argument("--batch-size", type=int, default=32, help="with --harness: batch size (default 32)")
    p.add_argument("--image-size", type=int, default=32, help="with --harness: input size (default 32)")
    p.add_argument("--device", default="cpu", help="with --harness: cpu or cuda")
    p.add_argument("--address", help="Ray cluster address")

    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args) or 0
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"syncbench {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print(f"syncbench {args.command}: interrupted ({e or 'Ctrl-C'}); finished runs are saved", file=sys.stderr)
        return 130


def _run(args) -> int:
    from experiments.config import sweep as sweep_mod
    from experiments.pipeline.runner import run_sweep

    sweep = sweep_mod.load(args.sweep)
    out = Path(args.out or Path("results") / sweep.name)
    runs = run_sweep(sweep, out, resume=args.resume, overwrite=args.overwrite, address=args.address)
    _print_runs(runs)
    if not args.no_report:
        from reports.build import build

        print(f"report: {build(out)}")
    failed = int((runs["status"] != "ok").sum()) if not runs.empty else 0
    return 1 if failed else 0


def _print_runs(runs) -> None:
    import pandas as pd

    if runs.empty:
        return
    cols = ["strategy", "workers", "link", "status", "throughput", "step_time_s", "compute_s", "comm_s",
            "bytes_sent_per_worker"]
    if "accuracy" in runs and runs["accuracy"].notna().any():  # a real data set: held-out accuracy too
        cols += ["final_loss", "accuracy"]
    table = runs[cols].sort_values(["link", "workers", "strategy"]).copy()
    table["bytes_sent_per_worker"] = table["bytes_sent_per_worker"] / 1e6
    table = table.rename(columns={"throughput": "samples/s", "step_time_s": "step s", "compute_s": "compute s",
                                  "comm_s": "comm s", "bytes_sent_per_worker": "MB sent/worker"})
    with pd.option_context("display.width", 160, "display.max_rows", 500, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))


def _report(args) -> int:
    from reports.build import build

    print(build(Path(args.dir)))
    return 0


def _model(args) -> int:
    from reports.model import format_model_table, model_table
    from strategies.link import parse_bandwidth, parse_latency, parse_size

    table = model_table(model=args.model, model_bytes=parse_size(args.model_bytes) if args.model_bytes else None,
                        workers=args.workers, bandwidth=parse_bandwidth(args.bandwidth), step_time=args.step_time,
                        latency=parse_latency(args.latency), target_efficiency=args.target_efficiency,
                        strategies=args.strategy)
    print(format_model_table(table))
    return 0


def _strategies(args) -> int:
    import strategies

    for name in strategies.names():
        cls = strategies.get(name)
        params = ", ".join(f"{k}={v!r}" for k, v in cls.parameters().items()) or "-"
        print(f"{name:18s} {cls.summary}\n{'':18s} role: {cls.role}; ops: {', '.join(cls.ops)}; params: {params}")
    return 0


def _verify(args) -> int:
    from experiments.bench.collectives import verify

    return 0 if verify(workers=args.workers, numel=args.numel, op=args.op, names=_names(args.strategies),
                       address=args.address) else 1


def _bench(args) -> int:
    from strategies.link import parse_size

    if args.harness:
        from experiments.bench.transport import format_harness, harness_bench

        print(format_harness(harness_bench(workload=args.workload, batch_size=args.batch_size,
                                           image_size=args.image_size, device=args.device)))
        return 0
    if args.transport:
        from experiments.bench.transport import format_table, transport_bench
        from experiments.cluster.ray_runtime import ensure_ray

        ensure_ray(args.address)
        print(format_table(transport_bench()))
        return 0
    from experiments.bench.collectives import bench

    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    link = {"bandwidth": args.bandwidth, "latency": args.latency} if args.bandwidth else None
    bench(workers=args.workers, sizes=sizes, names=_names(args.strategies), link=link, iters=args.iters,
          address=args.address)
    return 0


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


COMMANDS = {"run": _run, "report": _report, "model": _model, "strategies": _strategies, "verify": _verify,
            "bench": _bench}
