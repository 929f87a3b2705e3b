"""The failure tables, typed as the rest of the results: one row per run with failures and one per failure.

`syncbench faults --out DIR` writes DIR/fault_runs.parquet and DIR/failures.parquet beside runs/ and steps/
(each written atomically, an existing one never overwritten unless asked); `read(DIR)` gives them back as frames
in these types. Seconds are measured on the ranks that ran (thread ranks or Ray actors: `substrate` says which).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from experiments.results.dataset import _write_atomic
from experiments.results.schema import BOOL, FLOAT, INT, STR, Column, conform, to_arrow

FAULT_RUNS: tuple[Column, ...] = (
    Column("strategy", STR, "the registered strategy's name"),
    Column("strategy_label", STR, "the strategy with its parameters, as given (name:key=value,...)"),
    Column("substrate", STR, "where it ran: 'threads' (thread ranks of one process) or 'ray' (an actor per rank, "
                             "the failing one killed)"),
    Column("mode", STR, "the recovery mode: none, checkpoint_restart, elastic, ps_shrink or reweight"),
    Column("checkpoint_every", INT, "checkpoint_restart: steps between checkpoints (0 elsewhere)"),
    Column("rejoin_steps", INT, "elastic, ps_shrink: steps until a replacement joins (-1: never)"),
    Column("workers", INT, "worker ranks at the start"),
    Column("steps", INT, "the step S the run was to reach"),
    Column("completed_steps", INT, "steps completed (S, or where a failure without recovery ended the run)"),
    Column("steps_run", INT, "steps executed, those redone after a restart included"),
    Column("failures", INT, "failures that happened"),
    Column("steps_lost", INT, "completed steps thrown away and redone, over all failures"),
    Column("detection_s", FLOAT, "mean seconds from a death to its detection (every survivor stopped; NaN: none)"),
    Column("recovery_s", FLOAT, "mean seconds from a detection to the recovered group's first step (NaN: none)"),
    Column("time_to_step_s", FLOAT, "seconds the run took to reach step S (NaN: it ended before)"),
    Column("ended", BOOL, "a failure the mode could not recover from ended the run"),
    Column("cause", STR, "why it ended ('' when it reached step S)"),
    Column("reference", STR, "the result against the survivors' reference: 'matches', 'mismatch' or 'none' "
                             "(no fixed answer: a barrier-free server)"),
    Column("max_abs_diff", FLOAT, "largest difference from the survivors' reference (NaN: no reference)"),
)

FAILURES: tuple[Column, ...] = (
    Column("strategy_label", STR, "the run's strategy_label"),
    Column("mode", STR, "the run's recovery mode"),
    Column("step", INT, "the step the rank died in (0-based)"),
    Column("rank", INT, "the rank that died (workers first, then servers)"),
    Column("steps_lost", INT, "completed steps this failure threw away"),
    Column("detection_s", FLOAT, "seconds from the death to its detection (NaN: not measured)"),
    Column("recovery_s", FLOAT, "seconds from the detection to the recovered group's first step (NaN: not "
                                "recovered)"),
    Column("survivors", INT, "workers that ran the step after it"),
)

FILES = {"fault_runs": FAULT_RUNS, "failures": FAILURES}


def write(directory: str | Path, runs: list[dict], failures: list[dict], overwrite: bool = False) -> list[Path]:
    """Both tables into `directory`; FileExistsError naming a file already there unless `overwrite`."""
    directory = Path(directory)
    paths = {name: directory / f"{name}.parquet" for name in FILES}
    there = [str(p) for p in paths.values() if p.exists()]
    if there and not overwrite:
        raise FileExistsError(f"{', '.join(there)} already exist(s): pass --overwrite to replace, or another --out")
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("fault_runs", runs), ("failures", failures)):
        _write_atomic(to_arrow(rows, FILES[name]), paths[name])
    return list(paths.values())


def read(directory: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fault_runs, failures) of `directory`, in the schema's types; FileNotFoundError naming a missing one."""
    out = []
    for name, table in FILES.items():
        path = Path(directory) / f"{name}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no failure results here (write them with `syncbench faults --out`)")
        out.append(conform(pq.read_table(path).to_pandas(), table))
    return out[0], out[1]
