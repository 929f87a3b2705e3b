"""The failure runs' tables (`syncbench faults --out DIR`), in the schema's terms: schema.TABLES lists them."""

from __future__ import annotations

from experiments.results.columns import BOOL, FLOAT, INT, STR, Column

# `syncbench faults --out DIR`: DIR/fault_runs.parquet and DIR/failures.parquet (experiments/results/faults.py)
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
