"""The `syncbench model` command: the analytic model's communication time, efficiency and bandwidth needed."""

from __future__ import annotations

from experiments.cli.common import MAX_MODEL_BYTES, add_model_source, check_link, size_arg


def add_arguments(p) -> None:
    add_model_source(p, "a profile JSON (`syncbench profile`, measured or --synthetic): its model and step time, "
                        "buckets overlapped with backward as its gradients are ready",
                     "message size instead of a model, e.g. 553.36MB")
    p.add_argument("--num-classes", type=int,
                   help="with --model: classifier outputs (default: the workload's, as sweeps; ImageNet: 1000)")
    p.add_argument("--workers", action="append", required=True,
                   help="worker counts, comma-separated or repeated, e.g. 4,8,16,32: one table over them")
    p.add_argument("--bandwidth", required=True, help="per-worker link, e.g. 125MB/s, 1Gbit, 25Gbit")
    p.add_argument("--step-time", type=float,
                   help="compute time per step Ts, seconds (not with --profile); without it: bytes and times only")
    p.add_argument("--overlap", action="store_true",
                   help="with --model: overlap buckets with backward on a synthetic profile of --step-time "
                        "(forward:backward 1:2, 224x224, readiness by each layer's backward FLOPs)")
    p.add_argument("--bucket-mb", type=float, default=25.0,
                   help="with --profile or --overlap: MiB per bucket (default 25, DDP's)")
    p.add_argument("--latency", default="0s", help="per-message latency, e.g. 50us (default 0s)")
    p.add_argument("--ranks-per-node", type=int, default=1,
                   help="workers per node sharing one NIC of --bandwidth (default 1): prices each level, e.g. 8")
    p.add_argument("--intra-bandwidth", help="with --ranks-per-node: the link inside a node, e.g. 100Gbit "
                                             "(default unlimited)")
    p.add_argument("--network", default="alpha_beta",
                   help="the physics priced: alpha_beta (default: latency + bytes / bandwidth) or tcp (SimGrid's "
                        "LV08: latency x 13.01, bandwidth x 0.97 within a 4 MiB TCP window per two route latencies, "
                        "ACKs on a NIC that sends while it receives); see docs/validation.md")
    p.add_argument("--target-efficiency", type=float, default=0.9)
    p.add_argument("--nccl-reference", action="store_true",
                   help="also print NCCL's own model of an allreduce (ring, tree) beside syncbench's ring and tree")
    p.add_argument("--strategy", action="append",
                   help="limit to these strategies (repeatable), each a name or name:key=value,..., e.g. "
                        "parameter_server:servers=4,placement=colocated")


def run(args) -> int:
    from reports.model import format_model_table, model_table
    from strategies.cost import NetworkModel
    from strategies.transport.link import parse_bandwidth, parse_latency

    try:
        network = NetworkModel.parse(args.network)
    except ValueError as e:
        raise ValueError(f"--network: {e}") from None

    model_bytes = size_arg("--model-bytes", args.model_bytes, MAX_MODEL_BYTES) if args.model_bytes else None
    if args.nccl_reference and (args.ranks_per_node or 1) != 1:
        raise ValueError("--nccl-reference compares one GPU per node: accepted without --ranks-per-node")
    check_link("--bandwidth", args.bandwidth, "--latency", args.latency)
    check_link("--intra-bandwidth", args.intra_bandwidth, "--intra-latency", None)
    profile, model, step_time = None, args.model, args.step_time
    if args.num_classes is not None and args.model_bytes:
        raise ValueError("--num-classes sizes a --model; with --model-bytes the size is given (accepted: one of them)")
    if args.profile is not None:
        if args.step_time is not None or args.num_classes is not None or args.overlap:
            raise ValueError("--profile gives the model, its classes and Ts: accepted without --step-time, "
                             "--num-classes and --overlap")
        from workloads.profile import load_profile

        profile = load_profile(args.profile)
    elif args.step_time is None and args.overlap:
        raise ValueError("--overlap needs --step-time (the compute the buckets overlap with, seconds, e.g. 0.25)")
    elif args.overlap:
        if args.model is None:
            raise ValueError("--overlap needs --model (a synthetic profile spreads readiness over its layers)")
        from workloads.profile import synthetic_profile

        profile = synthetic_profile(args.model, args.step_time, num_classes=args.num_classes,
                                    describe="model --overlap")
    if profile is not None:
        model = step_time = None
    import math

    import pandas as pd

    no_ts = profile is None and step_time is None  # bytes and times only: Ts 1 s priced, its columns dropped
    tables = [model_table(model=model, model_bytes=model_bytes, workers=n, bandwidth=parse_bandwidth(args.bandwidth),
                          step_time=1.0 if no_ts else step_time, latency=parse_latency(args.latency),
                          target_efficiency=args.target_efficiency, strategies=args.strategy,
                          num_classes=None if profile is not None else args.num_classes, profile=profile,
                          bucket_mb=args.bucket_mb, ranks_per_node=args.ranks_per_node,
                          intra_bandwidth=parse_bandwidth(args.intra_bandwidth) if args.intra_bandwidth
                          else float("inf"), network=network)
              for n in _workers_list(args.workers)]
    table = pd.concat(tables, ignore_index=True)
    table.attrs = dict(tables[0].attrs)
    if no_ts:
        table[["efficiency", "step_s", "bandwidth_needed"]] = math.nan
        table.attrs["step_time"] = math.nan
    print(format_model_table(table))
    if args.nccl_reference:  # NCCL's own model beside syncbench's ring and tree (reports/nccl_model.py)
        from reports.nccl_model import format_reference

        cells = [(n, 4 * int(table.attrs["numel"]), parse_bandwidth(args.bandwidth), parse_latency(args.latency))
                 for n in _workers_list(args.workers) if n > 1]
        print("\n" + "\n".join(format_reference(cells)))
    return 0


def _workers_list(values: list[str]) -> list[int]:
    """--workers 4,8 --workers 16: the counts in order, each once; one line naming a value that is not a count."""
    counts = []
    for text in values:
        for item in (w.strip() for w in text.split(",")):
            if not item.isdigit():
                raise ValueError(f"--workers {item!r}: accepted are whole numbers >= 1, comma-separated or "
                                 f"repeated, e.g. 4,8,16")
            counts.append(int(item))
    return list(dict.fromkeys(counts))
