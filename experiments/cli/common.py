"""What several commands of the command line share: the ranges of its size arguments, and the report written
after a sweep. Beneath every command module (main.py, simulate.py, map.py), so that none imports another for it.
"""

from __future__ import annotations

import sys
from pathlib import Path

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
