"""The `syncbench verify` command: every strategy checked against a reference on Ray actors."""

from __future__ import annotations

from experiments.cli.common import P2P_CHOICES, P2P_DEFAULT, names


def add_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--numel", type=int, default=100_003)
    p.add_argument("--op", default="sum", help="the reduction op (see `syncbench strategies`; default sum)")
    p.add_argument("--dtype", default="float32", help="float16/32/64, int8/32/64, uint8/16/32/64 or bool "
                                                       "(default float32)")
    p.add_argument("--strategies", help="comma-separated names (default: all)")
    p.add_argument("--address", help="Ray cluster address")
    p.add_argument("--oversubscribe", action="store_true", help="allow more than 4 ranks per core")
    p.add_argument("--p2p", default=P2P_DEFAULT, choices=P2P_CHOICES,
                   help=f"what carries the strategies' messages: syncbench's own sockets or gloo (default "
                        f"{P2P_DEFAULT})")


def run(args) -> int:
    from experiments.bench.collectives import verify

    return 0 if verify(workers=args.workers, numel=args.numel, op=args.op, names=names(args.strategies),
                       address=args.address, oversubscribe=args.oversubscribe, dtype=args.dtype,
                       p2p=args.p2p) else 1
