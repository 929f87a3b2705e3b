"""What several commands of the command line share: the transports' names, the ranges of its size and link
arguments, comma-separated names, and the report written after a sweep. Beneath every command module, so that none
imports another for it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

# the transports' names, read from their one list without importing the strategies package (that imports torch)
_TRANSPORT_NAMES = runpy.run_path(str(Path(__file__).resolve().parents[2] / "strategies" / "transport" / "names.py"))
P2P_CHOICES = _TRANSPORT_NAMES["P2P"]
P2P_DEFAULT = _TRANSPORT_NAMES["default_p2p"]("cpu")  # bench and verify move host tensors

# Ranges of the command line's sizes (docs/settings.md); links take the sweep's link ranges.
MAX_MESSAGE_BYTES = 2**34  # bench --sizes: 16 GiB per message (each rank holds 3; the memory check follows)
MAX_MODEL_BYTES = 10**15  # model --model-bytes: 1 PB of gradients


def size_arg(option: str, text: str, high: int) -> int:
    """A size argument ('64M', '553.36MB') from 1 byte to `high`; one line naming the option otherwise."""
    from strategies.transport.link import parse_size

    shown = repr(text) if len(text) <= 40 else repr(text[:40] + "...")
    try:
        value = parse_size(text)
    except OverflowError:  # 400 digits: beyond any float
        value = None
    if value is None or not 1 <= value <= high:
        raise ValueError(f"{option} {shown}: accepted are sizes from 1 byte to {high:,} bytes, e.g. 4K, 64M, "
                         f"553.36MB")
    return value


def add_results_arguments(p, verb: str) -> None:
    """A sweep's results directory and what to do with what is there, for `run` (verb: run) and `simulate`."""
    p.add_argument("--out", help="results directory (default: results/<sweep name>/)")
    p.add_argument("--resume", action="store_true", help=f"{verb} only what is missing or failed in --out")
    p.add_argument("--overwrite", action="store_true", help="discard results already in --out")
    p.add_argument("--no-report", action="store_true", help="skip writing report.html")
    p.add_argument("--skip-invalid", action="store_true",
                   help=f"{verb} the valid grid points and list every invalid one with its reason (here and in the "
                        "report), instead of refusing the sweep")


def add_model_source(p, profile_help: str, bytes_help: str = "gradient size instead of a model, e.g. 553.36MB"):
    """Where `model` and `map` take the gradients from: a named model, a byte count or a profile (one of them);
    returns the group, for a command that adds a fourth source."""
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="resnet18 | resnet50 | vgg11 | vgg16 (fp32 parameters)")
    what.add_argument("--model-bytes", help=bytes_help)
    what.add_argument("--profile", help=profile_help)
    return what


def closing_report(out: Path) -> None:
    """report.html after a sweep; one that cannot be written (a full or read-only disk) is said in one line and
    does not fail the command: the runs are stored, and `syncbench report DIR` builds it later."""
    from experiments.pipeline.store import StoreError
    from reports.page import build

    try:
        print(f"report: {build(out)}")
    except (StoreError, OSError) as e:
        print(f"report: not written: {e} (the runs are stored: `syncbench report {out}` once it can be)",
              file=sys.stderr)


def check_link(bandwidth_option: str, bandwidth: str | None, latency_option: str, latency: str | None) -> None:
    """A bandwidth and latency within the sweep's link ranges (1Mbit: a 1bit link hung `bench` for ever); None:
    not given."""
    from experiments.config.sweep import RANGES
    from strategies.transport.link import parse_bandwidth, parse_latency

    for option, text, parse, key, unit in ((bandwidth_option, bandwidth, parse_bandwidth, "link.bandwidth", "bytes/s"),
                                          (latency_option, latency, parse_latency, "link.latency", "s")):
        if text is None:
            continue
        value = parse(text)
        if RANGES[key].problem(key, value):
            shown = repr(text) if len(text) <= 40 else repr(text[:40] + "...")
            raise ValueError(f"{option} {shown} ({value:g} {unit}): accepted are {RANGES[key].describe()}")


def names(text: str | None) -> list[str] | None:
    """'a,b, c' -> ['a', 'b', 'c']; None or '' -> None (the command's default)."""
    return [n.strip() for n in text.split(",") if n.strip()] if text else None
