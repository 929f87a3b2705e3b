"""`syncbench explain STRATEGY --workers N`: one sync of the strategy's real code on thread ranks, every message
recorded (strategies/explain.py), drawn round by round (reports/explain.py): a text table, and an SVG picture or an
HTML page."""

from __future__ import annotations

from pathlib import Path

MAX_WORKERS, MAX_NUMEL, DEFAULT_NUMEL = 32, 1_000_000, 1000  # strategies/explain.py's (not imported: torch)


def add_arguments(p) -> None:
    p.add_argument("strategy", help="a strategy name, or name:key=value,... e.g. parameter_server:servers=2 "
                                    "(`syncbench strategies` lists them)")
    p.add_argument("--workers", type=int, required=True, help=f"worker ranks, 2 to {MAX_WORKERS}")
    p.add_argument("--numel", type=int, default=DEFAULT_NUMEL,
                   help=f"float32 elements each worker syncs, 1 to {MAX_NUMEL:,} (default {DEFAULT_NUMEL})")
    p.add_argument("--svg", help="also write the picture to this SVG file")
    p.add_argument("--html", help="also write the picture and the table to this HTML page (offline)")


def run(args) -> int:
    from reports.explain import explain, html_page, svg, text
    from strategies.cost import parse_strategy
    from strategies.explain import check, record

    name, params = parse_strategy(args.strategy)
    check(name, dict(params), args.workers, args.numel)
    for option in ("svg", "html"):
        path = getattr(args, option)
        if path and not Path(path).parent.is_dir():
            raise FileNotFoundError(f"--{option} {path}: its directory does not exist")
    rec = record(name, params, args.workers, args.numel)
    x = explain(rec.strategy, rec.events, rec.roles, rec.numel, rec.itemsize, rec.chunks)
    print(text(x), end="")
    print(f"(= the run's counters: {sum(c.bytes_sent for c in rec.counters):,} bytes sent)")
    if args.svg:
        Path(args.svg).write_text(svg(x))
        print(f"wrote {args.svg}")
    if args.html:
        Path(args.html).write_text(html_page(x))
        print(f"wrote {args.html}")
    return 0
