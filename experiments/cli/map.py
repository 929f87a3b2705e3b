"""`syncbench map`: the command line of reports/strategy_map.py (which strategy wins where, from the model)."""

from __future__ import annotations

import math
import time

from experiments.cli.common import add_model_source


def add_arguments(p) -> None:
    what = add_model_source(p, "a profile JSON (`syncbench profile`): its model, Ts and gradient readiness; cells "
                               "price its step with buckets overlapped with backward")
    what.add_argument("--collective", action="store_true",
                      help="the collective alone: one allreduce per message size (--sizes) x workers, on one "
                           "--bandwidth")
    p.add_argument("--num-classes", type=int, help="with --model: classifier outputs (default: the workload's)")
    p.add_argument("--step-time", type=float,
                   help="with --model or --model-bytes: compute seconds per step Ts; cells then price the step "
                        "(Ts + sync, no overlap) instead of the sync alone")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="with --profile: bucket size in MiB (default 25)")
    p.add_argument("--workers", default=None,
                   help="comma-separated worker counts, 2 to 16384 (default 2,4,...,1024)")
    p.add_argument("--bandwidth", default=None,
                   help="comma-separated NIC bandwidths per rank, e.g. 1Gbit,10Gbit,100Gbit (default 1 to 400 "
                        "Gbit/s; with --collective: one, default 10Gbit)")
    p.add_argument("--sizes", default=None,
                   help="with --collective: comma-separated message sizes, e.g. 4K,64K,1M (default 1K to 1G, x4)")
    p.add_argument("--latency", default="0s", help="per-message latency, e.g. 50us (default 0s)")
    p.add_argument("--network", default="alpha_beta",
                   help="the physics priced: alpha_beta (default) or tcp (SimGrid's LV08 corrections, as `syncbench "
                        "model --network tcp`; not with --check, whose spot checks run SimGrid alpha_beta)")
    p.add_argument("--ranks-per-node", type=int, default=1,
                   help="ranks sharing one NIC (default 1); > 1 ranks the node-aware strategies")
    p.add_argument("--intra-bandwidth", help="with --ranks-per-node: the link inside a node (default unlimited)")
    p.add_argument("--strategies", help="comma-separated exact strategies to rank (default: all that state their "
                                        "bytes; on nodes, those with per-level traffic)")
    p.add_argument("--ps-placement", default="colocated", choices=("colocated", "dedicated", "both"),
                   help="parameter server placement tried (dedicated: k extra server machines; default colocated)")
    p.add_argument("--inexact", action="store_true",
                   help="also price compression, local SGD and neighbour averaging, shown apart (not ranked)")
    p.add_argument("--within", type=float, default=0.02,
                   help="'the choice stops mattering' threshold, a fraction of the winner's time (default 0.02)")
    p.add_argument("--tie", type=float, default=0.05,
                   help="a lead under this fraction of the winner's time is a tie, not a winner (default 0.05: the "
                        "model's agreement band with SimGrid; 0: only equal times tie)")
    p.add_argument("--check", type=int, default=0,
                   help="SimGrid spot checks at N cells (up to 64 workers): the winner and the runner-up simulated, "
                        "marked where SimGrid agrees on the winner (ResNet-50's sync only; default 0: none)")
    p.add_argument("--nccl-reference", action="store_true",
                   help="also print NCCL's own model (its tuner's ring and tree, Simple protocol) beside syncbench's "
                        "ring and double binary tree per cell, labelled as NCCL's (one sync, one NIC per rank)")
    p.add_argument("--out", help="write DIR/map.csv, DIR/map.json and DIR/map.html")


def _list(option: str, text: str, parse, accepted: str) -> list:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"{option} {text!r}: accepted is a comma-separated list of {accepted}")
    out = []
    for item in items:
        try:
            out.append(parse(item))
        except (ValueError, OverflowError) as e:
            raise ValueError(f"{option}: bad item {item!r} ({e}); accepted are {accepted}") from None
    return out


def _print_nccl_reference(m) -> None:
    """NCCL's model beside syncbench's ring and tree, every cell: a reference, never ranked with the map."""
    from reports.nccl_model import format_reference

    cells = [(r["workers"], r["message_bytes"], r["bandwidth_bytes_per_s"], r["latency_s"])
             for r in m.cells.to_dict("records")]
    print("\n" + "\n".join(format_reference(cells)))


def run(args) -> int:
    from reports.strategy_map import (
        DEFAULT_BANDWIDTHS,
        DEFAULT_SIZES,
        DEFAULT_WORKERS,
        check_grid,
        format_table,
        strategy_map,
        write,
    )
    from strategies.transport.link import parse_bandwidth, parse_latency, parse_size

    def whole(text: str) -> int:
        value = float(text)
        return int(value) if value.is_integer() else value

    workers = _list("--workers", args.workers, whole, "whole numbers from 2 to 16,384, e.g. 2,4,8") \
        if args.workers else list(DEFAULT_WORKERS)
    default_bw = [parse_bandwidth("10Gbit")] if args.collective else list(DEFAULT_BANDWIDTHS)
    bandwidths = _list("--bandwidth", args.bandwidth, parse_bandwidth, "bandwidths > 0, e.g. 1Gbit,10Gbit") \
        if args.bandwidth else default_bw
    sizes = None
    if args.collective:
        sizes = _list("--sizes", args.sizes, parse_size, "sizes, e.g. 4K,64K,1M") if args.sizes \
            else list(DEFAULT_SIZES)
    if args.sizes and not args.collective:
        raise ValueError("--sizes is for --collective (message size x workers); accepted: add --collective")
    from strategies.cost import NetworkModel

    try:
        network = NetworkModel.parse(args.network)
    except ValueError as e:
        raise ValueError(f"--network: {e}") from None
    if args.check and network is not NetworkModel.ALPHA_BETA:
        raise ValueError(f"--check runs its spot checks on SimGrid alpha_beta, not on --network {network.value}: "
                         f"accepted is --check with --network alpha_beta")
    latency = parse_latency(args.latency)
    intra = parse_bandwidth(args.intra_bandwidth) if args.intra_bandwidth else math.inf
    names = [n.strip() for n in args.strategies.split(",") if n.strip()] if args.strategies else None
    check_grid(workers, bandwidths, latency, args.ranks_per_node, names, sizes, args.ps_placement, args.within)
    if args.collective and len(bandwidths) != 1:
        raise ValueError(f"--collective takes one --bandwidth, got {len(bandwidths)}: give one")
    if args.num_classes is not None and not args.model:
        raise ValueError("--num-classes sizes a --model (accepted only with --model)")
    if args.step_time is not None and (args.profile or args.collective or not 0 < args.step_time < math.inf):
        raise ValueError(f"--step-time {args.step_time!r}: accepted is seconds > 0 with --model or --model-bytes")

    workload = _workload(args, sizes)
    if args.nccl_reference and (args.ranks_per_node != 1 or workload.measure != "sync"):
        raise ValueError("--nccl-reference prices one allreduce on one NIC per rank: accepted without "
                         "--ranks-per-node, --step-time or --profile")
    if args.check:
        from experiments.map_check import request_problem

        why = request_problem(args.check, "size" if args.collective else "bandwidth", workload.measure,
                              workload.numel, args.ranks_per_node, workers)
        if why:
            raise ValueError(f"--check {args.check}: {why}")
    started = time.perf_counter()
    m = strategy_map(workload, workers, bandwidths, latency, args.ranks_per_node, intra, names, args.ps_placement,
                     args.inexact, args.within, sizes, args.tie, network=network)
    priced = time.perf_counter() - started
    print(format_table(m))
    print(f"\n# {len(m.cells)} cells in {priced:.1f} s")
    if args.check:
        from experiments.map_check import check_lines, spot_check

        started = time.perf_counter()
        spot_check(m, args.check)
        print("\nSimGrid spot checks (alpha_beta network model, one sync each):")
        print("\n".join(f"- {line}" for line in check_lines(m)))
        print(f"# checked in {time.perf_counter() - started:.1f} s")
    if args.nccl_reference:
        _print_nccl_reference(m)
    if args.out:
        for path in write(m, args.out):
            print(f"wrote {path}")
    return 0


def _workload(args, sizes: list[int] | None):
    """What the map prices: a collective of the first size, a profile, a model or a message size."""
    from reports.model import model_numel, workload_shapes
    from reports.strategy_map import Workload

    if args.collective:
        return Workload(numel=sizes[0] // 4, label="collective")
    if args.profile:
        from workloads.profile import load_profile

        profile = load_profile(args.profile)
        return Workload(numel=profile.numel, profile=profile, bucket_mb=args.bucket_mb,
                        shapes=workload_shapes(profile.model, profile.numel, profile.num_classes),
                        label=f"{profile.model} (profile {profile.id})")
    if args.model:
        numel = model_numel(args.model, args.num_classes)
        return Workload(numel=numel, compute_s=args.step_time,
                        shapes=workload_shapes(args.model, numel, args.num_classes), label=args.model)
    from experiments.cli.common import MAX_MODEL_BYTES, size_arg

    nbytes = size_arg("--model-bytes", args.model_bytes, MAX_MODEL_BYTES)
    return Workload(numel=round(nbytes / 4), compute_s=args.step_time, label=f"{nbytes:,} bytes")
