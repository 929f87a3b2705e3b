"""`syncbench schema`: every column of the results tables as a plain table (experiments/results/schema.py)."""

from __future__ import annotations

from experiments.results.labels import type_name
from experiments.results.schema import DERIVED, PARAM, TABLES, parameter_types


def describe() -> str:
    """Every column as a plain table: the stored columns of both tables, the strategy parameter columns of the
    registered strategies, and the display labels derived on read."""
    import strategies

    def line(name, type_, meaning):
        return f"{name:32s} {type_name(type_):24s} {meaning}"

    out = ["# Parquet under a results directory DIR: a file per run (DIR/runs/<n>.parquet, DIR/steps/<n>.parquet,",
           "# DIR/events/<n>.parquet for its traced steps),",
           "# merged per 100 runs (<first>-<last>.parquet); DIR/runs.parquet and DIR/steps.parquet from before.",
           "# Units are in the names (_s seconds, _bytes bytes, bandwidth bytes/s). A value not given is null on disk;",
           "# read through experiments.results it is '' (text), 0 (counts), NaN (measures), False, () or NaT.",
           ""]
    for title, table in TABLES.items():
        per = {"runs": "run", "steps": "step and rank", "events": "event of a traced step",
               "fault_runs": "strategy and recovery mode of `syncbench faults --out DIR` (DIR/fault_runs.parquet)",
               "failures": "failure of those runs (DIR/failures.parquet)"}[title]
        out.append(f"# {title}: one row per {per}")
        out += [line(c.name, c.type, c.meaning) for c in table]
        out.append("")
    out.append("# runs: strategy parameters (null for runs of strategies without that parameter)")
    by_param: dict[str, list] = {}
    for name in strategies.names():
        try:
            declared = parameter_types(name)
        except (TypeError, ValueError) as e:
            out.append(f"# {name}: {e}")
            continue
        for param, (type_, default) in declared.items():
            by_param.setdefault(param, []).append((name, type_, default))
    for param, uses in sorted(by_param.items()):
        types = sorted({type_name(t) for _, t, _ in uses})
        meaning = "; ".join(f"{s} (default {d!r})" for s, _, d in uses)
        out.append(f"{PARAM + param:32s} {' or '.join(types):24s} {meaning}")
    out.append("")
    out.append("# runs: derived on read (not stored)")
    out += [line(c.name, c.type, c.meaning) for c in DERIVED]
    return "\n".join(out) + "\n"
