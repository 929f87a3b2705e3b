"""The `syncbench bench` command, one subcommand per benchmark: collectives (the default: nccl-tests-style allreduce
times), ps, transport, harness and overlap. The old flags (`bench --ps`, `--transport`, `--harness`, `--overlap`)
still work: `upgrade` turns them into the subcommand and names the new form in a one-line notice."""

from __future__ import annotations

from experiments.cli.common import MAX_MESSAGE_BYTES, P2P_CHOICES, P2P_DEFAULT, check_link, names, size_arg

HELP = {
    "collectives": "nccl-tests-style table of allreduce time, algbw and busbw per strategy (the default)",
    "ps": "the parameter server's communication time (k = 1, 2, 4 x dedicated, colocated x summation, update) "
          "beside ring and BytePS's optimum, then samples/s with one worker 2x and 3x slower (synchronous, SSP 2 and "
          "8, async, 1 backup); 4 workers, resnet18 profile, 1 Gbit",
    "transport": "point-to-point bandwidth and latency of the transport between 2 actors",
    "harness": "1-worker training through syncbench vs a plain PyTorch loop (overhead)",
    "overlap": "profile-mode training, overlap off/on x bucket_mb 1, 25, flat, per strategy and link, measured "
               "beside the timeline prediction",
}
OLD_FLAGS = {"--ps": "ps", "--transport": "transport", "--harness": "harness", "--overlap": "overlap"}


def upgrade(argv: list[str]) -> tuple[list[str], str | None]:
    """`bench` without a subcommand in the old form: `bench --ps ...` -> `bench ps ...` and a notice naming the new
    form; `bench ...` without a mode flag -> `bench collectives ...` (the default, no notice). Any other command
    line is returned as it is. A second old flag stays in place, for the subcommand's parser to refuse."""
    if not argv or argv[0] != "bench" or (len(argv) > 1 and argv[1] in (*HELP, "-h", "--help")):
        return argv, None
    rest = list(argv[1:])
    old = next((a for a in rest if a in OLD_FLAGS), None)
    if old is None:
        return ["bench", "collectives", *rest], None
    rest.remove(old)
    return ["bench", OLD_FLAGS[old], *rest], (f"# note: `syncbench bench {old}` is now `syncbench bench "
                                              f"{OLD_FLAGS[old]}` (the old flag still works)")


def add_arguments(p) -> None:
    modes = p.add_subparsers(dest="mode", required=True, metavar="{" + ",".join(HELP) + "}")
    for name, add in (("collectives", _collectives_arguments), ("ps", _ps_arguments),
                      ("transport", _transport_arguments), ("harness", _harness_arguments),
                      ("overlap", _overlap_arguments)):
        add(modes.add_parser(name, help=HELP[name], description=HELP[name]))


def _collectives_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M", help="message sizes in bytes, e.g. 4K,64K,1M,16M")
    p.add_argument("--strategies", help="comma-separated names (default: all exact allreduces)")
    p.add_argument("--bandwidth", help="emulate links of this bandwidth, e.g. 1Gbit")
    p.add_argument("--latency", default="0s", help="emulated per-message latency, e.g. 50us")
    p.add_argument("--emulation", default="python", choices=("python", "kernel"),
                   help="who shapes --bandwidth: the communicator (python, default) or the kernel, on the cluster "
                        "of `syncbench cluster up` (one rank per node, or k per namespace with --ranks-per-node k; "
                        "native is shaped too)")
    p.add_argument("--ranks-per-node", type=int, default=1,
                   help="nodes of this many ranks sharing one NIC of --bandwidth: thread ranks with python emulation, "
                        "Ray actors k per namespace with --emulation kernel (default strategies: ring, hierarchical, "
                        "double_binary_tree, node_parameter_server)")
    p.add_argument("--intra-bandwidth", help="with --ranks-per-node: the link inside a node, e.g. 100Gbit "
                                             "(default unlimited)")
    p.add_argument("--intra-latency", help="with --ranks-per-node: its per-message latency, e.g. 2us (default 0)")
    p.add_argument("--iters", type=int, default=0, help="timed iterations per size (default: by size)")
    p.add_argument("--p2p", default=P2P_DEFAULT, choices=P2P_CHOICES + ("threads",),
                   help=f"what carries the strategies' messages: syncbench's own sockets (Unix within a network "
                        f"namespace, else TCP) or torch.distributed's gloo (default {P2P_DEFAULT}); native is gloo's "
                        f"either way; with --ranks-per-node also threads (the thread ranks' queues)")
    _ray_arguments(p)


def _ps_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--bandwidth", default="1Gbit", help="emulated links (default 1Gbit)")
    p.add_argument("--latency", default="50us", help="emulated per-message latency (default 50us)")
    p.add_argument("--partition-mb", default="4,1", help="partition sizes in MiB (default 4,1)")
    p.add_argument("--steps", type=int, default=4, help="steps per run, 1 of them warm-up (default 4)")
    p.add_argument("--out", help="keep the profiles and results here (default: a temp dir)")


def _transport_arguments(p) -> None:
    p.add_argument("--address", help="Ray cluster address")


def _harness_arguments(p) -> None:
    p.add_argument("--workload", default="resnet18", help="the model (default resnet18)")
    _batch_arguments(p)
    p.add_argument("--device", default="cpu", help="cpu or cuda")


def _overlap_arguments(p) -> None:
    p.add_argument("--models", default="resnet18,resnet50", help="models to profile")
    p.add_argument("--links", default="1Gbit,10Gbit", help="emulated links ('none': full speed)")
    p.add_argument("--strategies", help="comma-separated names (default: ring, halving_doubling, all_to_all, "
                        "reduce_broadcast, parameter_server, decentralized, native, ddp)")
    p.add_argument("--workers", type=int, default=4)
    _batch_arguments(p)
    p.add_argument("--steps", type=int, default=4, help="steps per run, 1 of them warm-up")
    p.add_argument("--out", help="keep the profiles and results here (default: a temp dir)")
    p.add_argument("--address", help="Ray cluster address")


def _batch_arguments(p) -> None:
    p.add_argument("--batch-size", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--image-size", type=int, default=32, help="input size (default 32)")


def _ray_arguments(p) -> None:
    p.add_argument("--address", help="Ray cluster address")
    p.add_argument("--oversubscribe", action="store_true", help="allow more than 4 ranks per core")


def run(args) -> int:
    return {"collectives": _collectives, "ps": _ps, "transport": _transport, "harness": _harness,
            "overlap": _overlap}[args.mode](args)


def _collectives(args) -> int:
    sizes = [size_arg("--sizes", s, MAX_MESSAGE_BYTES) for s in args.sizes.split(",") if s]
    if args.bandwidth:
        check_link("--bandwidth", args.bandwidth, "--latency", args.latency)
    from experiments.bench.collectives import bench

    link = {"bandwidth": args.bandwidth, "latency": args.latency, "emulation": args.emulation} if args.bandwidth \
        else None
    if args.emulation == "kernel" and not link:
        raise ValueError("--emulation kernel: give the cluster's --bandwidth too (the links the run expects)")
    for key in ("intra_bandwidth", "intra_latency"):
        if getattr(args, key) is not None:
            if not link:
                raise ValueError(f"--{key.replace('_', '-')}: give the node NIC's --bandwidth too")
            link[key] = getattr(args, key)
    if link:
        check_link("--intra-bandwidth", link.get("intra_bandwidth"), "--intra-latency", link.get("intra_latency"))
    bench(workers=args.workers, sizes=sizes, names=names(args.strategies), link=link, iters=args.iters,
          address=args.address, oversubscribe=args.oversubscribe, p2p=args.p2p, ranks_per_node=args.ranks_per_node)
    return 0


def _ps(args) -> int:
    from experiments.bench.parameter_server import format_straggler, format_table, ps_bench, straggler_bench

    parts = [float(p) for p in args.partition_mb.split(",") if p]
    link = {"bandwidth": args.bandwidth, "latency": args.latency}
    print(format_table(ps_bench(workers=args.workers, partition_mb=parts, steps=args.steps, out=args.out, **link)),
          flush=True)
    print(format_straggler(straggler_bench(workers=args.workers, out=args.out and f"{args.out}/straggler", **link)))
    return 0


def _transport(args) -> int:
    from experiments.bench.transport import format_table, transport_bench
    from experiments.cluster.ray_runtime import ensure_ray

    ensure_ray(args.address)
    print(format_table(transport_bench()))
    return 0


def _harness(args) -> int:
    from experiments.bench.transport import format_harness, harness_bench

    print(format_harness(harness_bench(workload=args.workload, batch_size=args.batch_size,
                                       image_size=args.image_size, device=args.device)))
    return 0


def _overlap(args) -> int:
    from experiments.bench.overlap import DEFAULT_STRATEGIES, format_overlap, overlap_bench

    table = overlap_bench(models=names(args.models), links=names(args.links),
                          names=names(args.strategies) or DEFAULT_STRATEGIES, workers=args.workers,
                          batch_size=args.batch_size, image_size=args.image_size, steps=args.steps,
                          out=args.out, address=args.address)
    print(format_overlap(table))
    return 0
