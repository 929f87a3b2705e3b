"""Measure what the simulator is checked against: every strategy's sync over the python link emulation.

    .venv/bin/python -m experiments.simulate.calibrate      # writes tests/experiments/data/emulated_sync.json

Ray actors over gloo with the communicator's emulated links (1 Gbit/s, 50 us), 4 and 8 workers, one 16 MB
array; medians of the slowest rank per iteration (experiments.bench.collectives.bench). The test
tests/experiments/test_simulate.py simulates the same strategies, links and bytes and compares.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
from pathlib import Path

from experiments.bench.collectives import bench

OUT = Path(__file__).resolve().parents[2] / "tests" / "experiments" / "data" / "emulated_sync.json"
LINK = {"bandwidth": "1Gbit", "latency": "50us"}
SIZE = 16 * 2**20
STRATEGIES = ("parameter_server", "reduce_broadcast", "all_to_all", "halving_doubling", "ring", "naive_ring",
              "decentralized")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--workers", default="4,8")
    args = parser.parse_args(argv)
    rows = []
    for n in (int(w) for w in args.workers.split(",")):
        for r in bench(workers=n, sizes=[SIZE], names=list(STRATEGIES), link=LINK):
            rows.append({"strategy": r["strategy"], "workers": n, "bytes": r["size"], "time_s": r["time_ms"] / 1e3,
                         "model_s": r["model_ms"] / 1e3})
    Path(args.out).write_text(json.dumps({
        "what": "median sync time of the slowest rank, Ray actors over gloo, python link emulation",
        "command": ".venv/bin/python -m experiments.simulate.calibrate",
        "link": LINK, "host": platform.node(), "cores": os.cpu_count(),
        "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
