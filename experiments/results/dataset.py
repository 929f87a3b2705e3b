"""A results directory as an append-only dataset: DIR/runs/ and DIR/steps/, one Parquet file per run, then per batch.

Each stored run adds one file to each table (`<seq>.parquet`: steps first, the run last, each written to a
temporary file and renamed), so storing a run costs the same whether it is the first or the ten-thousandth. Every
BATCH runs the writer merges its loose files into one `<first>-<last>.parquet` per table (written, then the loose
files removed), so that reading 10,000 runs opens 100 files, not 10,000: each run is rewritten at most once. A run
stored again (a failed run retried on resume) supersedes the earlier attempt: readers keep the row of the latest
file per run id, and that file's steps. Results written before this layout (DIR/runs.parquet, DIR/steps.parquet)
are read as the oldest file, so old directories still load and resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from experiments.results import schema

TABLES = ("runs", "steps", "events")  # events: the traced steps' phases and messages (schema.EVENTS)
LEGACY = {"runs": "runs.parquet", "steps": "steps.parquet"}  # one rewritten file per table, before the dataset
# the columns the store itself reads: a Parquet file without them is not one of ours (another tool's file, say)
REQUIRED = {"runs": ("run_id", "status"), "steps": ("run_id",), "events": ("run_id",)}
SEQ, ORDER = "_file", "_order"  # while reading: the file a row came from, and that file's rank


class StoreError(ValueError):
    """A results directory that cannot be used: not creatable, not writable, full, or holding someone else's files."""


# every name the store (and the report) deletes or writes at the top of a results directory, besides the tables
WRITTEN = ("runs.parquet", "steps.parquet", "sweep.toml", "sweep.resolved.json", "skipped.json", "report.html",
           "syncbench.lock")


def check_contained(directory: Path) -> None:
    """Refuse, naming the path, a results directory in which a table folder, a part, a temporary file or a file the
    store or the report writes is a symbolic link: following one, --overwrite would delete and a write would land
    outside the directory. Called before any work (the store, the report, export) and whenever a table is listed."""
    directory = Path(directory)
    names = [*WRITTEN, *(name + ".tmp" for name in WRITTEN)]
    for path in [directory / name for name in names] + [directory / t for t in TABLES]:
        _refuse_link(path)
    for table in TABLES:
        folder = directory / table
        if folder.is_dir():
            for path in folder.iterdir():
                _refuse_link(path)
    for tmp in directory.glob("*.tmp") if directory.is_dir() else ():
        _refuse_link(tmp)


def _refuse_link(path: Path) -> None:
    if path.is_symlink():
        raise StoreError(f"{str(path)!r} is a symbolic link (to {os.readlink(path)!r}): syncbench writes and "
                         f"deletes results only inside the results directory, never through a link; remove the "
                         f"link or choose another --out")


BATCH = 100  # loose per-run files merged into one batch file


def parts(directory: Path, table: str) -> list[tuple[int, int, Path]]:
    """(first seq, last seq, path) of every stored file of a table, in the order attempts supersede: by last
    sequence number, a batch after a loose file with the same last number (a merge the writer did not finish
    cleaning up holds the same rows, latest attempts only)."""
    folder = directory / table
    _refuse_link(folder)
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        _refuse_link(path)
        first, _, last = path.stem.partition("-")
        if path.suffix == ".parquet" and first.isdigit() and (last.isdigit() or not last):
            found.append((int(first), int(last or first), path))
    return sorted(found, key=lambda f: (f[1], f[1] != f[0]))


def next_seq(directory: Path) -> int:
    """One past the highest sequence number of either table (a steps part whose run part never landed counts)."""
    return max((last for table in TABLES for _, last, _ in parts(directory, table)), default=-1) + 1


def has_results(directory: Path) -> bool:
    """Whether any run is stored, in either layout."""
    return (directory / LEGACY["runs"]).exists() or bool(parts(directory, "runs"))


def write_run(directory: Path, seq: int, run_row: dict, step_rows: list[dict], event_rows=()) -> None:
    """Store one run as part `seq`: its steps and events, then its row (the run counts as stored once its row is
    there). A failed write (full disk, read-only file system) leaves no temporary file and raises StoreError."""
    steps = schema.to_arrow(step_rows, schema.STEPS) if step_rows else None
    events = schema.to_arrow(list(event_rows), schema.EVENTS) if event_rows else None
    runs = schema.to_arrow([run_row], schema.RUNS)
    if steps is not None:
        _write_atomic(steps, directory / "steps" / f"{seq:08d}.parquet")
    if events is not None:
        _write_atomic(events, directory / "events" / f"{seq:08d}.parquet")
    _write_atomic(runs, directory / "runs" / f"{seq:08d}.parquet")


def _write_atomic(table: pa.Table, path: Path) -> None:
    tmp = path.with_suffix(".parquet.tmp")
    _refuse_link(path.parent)
    _refuse_link(path)
    try:
        path.parent.mkdir(exist_ok=True)
        _refuse_link(path.parent)  # (a link made between the check and mkdir)
        with create_temp(tmp) as f:
            pq.write_table(table, f, write_statistics=False)  # min/max of one run's rows: no use, 15% of a file
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        discard(tmp)
        raise StoreError(f"cannot write results to {str(path.parent)!r}: {e.strerror or e} (runs stored before "
                         f"are intact; free space or choose another --out, then --resume)") from None


def write_text_atomic(path: Path, text: str) -> Path:
    """A small text file (sweep.toml, its resolved record) replaced whole or not at all."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    _refuse_link(path)
    try:
        with create_temp(tmp) as f:
            f.write(text.encode("utf-8"))
        os.replace(tmp, path)
    except OSError as e:
        discard(tmp)
        raise StoreError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
    return path


def create_temp(tmp: Path):
    """A new temporary file opened for writing, never through a link: whatever was at its name (a file left by a
    killed writer, or a link planted there) is removed first (unlinking a link removes the link, not its target),
    and O_EXCL | O_NOFOLLOW refuse one that appears in between."""
    discard(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "wb")


def discard(tmp: Path) -> None:
    """Remove a temporary file if there is one (on a read-only file system there cannot be: nothing to do)."""
    try:
        tmp.unlink(missing_ok=True)
    except OSError:
        pass


def tidy(directory: Path) -> None:
    """What a writer killed mid-write left (only the lock holder calls this): temporary files, and loose files a
    finished merge already holds."""
    check_contained(directory)
    for folder in (directory, *(directory / t for t in TABLES)):
        if folder.is_dir():
            for tmp in folder.glob("*.tmp"):
                discard(tmp)
    for table in TABLES:
        found = parts(directory, table)
        batches = [(first, last) for first, last, _ in found if first != last]
        for first, last, path in found:
            if first == last and any(a <= first <= b for a, b in batches):
                path.unlink()


def check_parts(directory: Path) -> None:
    """Every stored part of both tables opens as Parquet (its footer read: a part cut short by a full disk or a
    copy has none), or StoreError naming the first that does not: --resume checks them all before any run, so
    that a damaged steps part is found now, not by the report after the sweep."""
    for table in TABLES:
        for _, _, path in parts(directory, table):
            try:
                pq.read_metadata(path)
            except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds; all mean "not readable"
                raise StoreError(f"{str(path)!r} is not a readable Parquet file ({type(e).__name__}): a write cut "
                                 f"short? Move it away (and the part of the same name in the other table, so that "
                                 f"--resume runs that run again), then --resume") from None


def merge(directory: Path) -> None:
    """Once BATCH loose run files have accumulated: one batch file per table holding their latest attempts,
    then the loose files removed. Skipped (files left as they are) when their columns' types cannot be joined."""
    loose = [(first, path) for first, last, path in parts(directory, "runs") if first == last]
    if len(loose) < BATCH:
        return
    first, last = loose[0][0], loose[-1][0]
    name = f"{first:08d}-{last:08d}.parquet"
    try:
        tables = [_read_arrow(path) for _, path in loose]
        seqs = [seq for (seq, _), t in zip(loose, tables) for _ in range(t.num_rows)]
        runs = pa.concat_tables(tables, promote_options="permissive")
        # the last row of each run id (a retry within the batch supersedes its earlier attempt), and its steps
        keep = pd.Series(range(len(seqs)), index=runs.column("run_id").to_pylist()).groupby(level=0).last()
        winners = {(run_id, seqs[i]) for run_id, i in keep.items()}
        runs = runs.take(sorted(keep.tolist()))
        merged = {}  # steps and events: the rows of the winning attempts
        for table in TABLES[1:]:
            loose_parts = [(a, path) for a, b, path in parts(directory, table) if a == b and first <= a <= last]
            if loose_parts:
                tables = [_read_arrow(path) for _, path in loose_parts]
                mask = [(run_id, seq) in winners for (seq, _), t in zip(loose_parts, tables)
                        for run_id in t.column("run_id").to_pylist()]
                merged[table] = pa.concat_tables(tables, promote_options="permissive").filter(
                    pa.array(mask, pa.bool_()))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):  # a column whose type changed
        return
    for table, rows in merged.items():
        _write_atomic(rows, directory / table / name)
    _write_atomic(runs, directory / "runs" / name)
    for table in TABLES:
        for a, b, path in parts(directory, table):
            if a == b and first <= a <= last:
                path.unlink()


def remove_all(directory: Path) -> None:
    """--overwrite: every stored run and step, in both layouts (never through a link: check_contained)."""
    check_contained(directory)
    for table in TABLES:
        if table in LEGACY:
            (directory / LEGACY[table]).unlink(missing_ok=True)
        for _, _, path in parts(directory, table):
            path.unlink()


# ---- reading ------------------------------------------------------------------------------------------------

def read_runs(directory: str | Path) -> pd.DataFrame:
    """Every run's latest attempt, in the schema's types (an empty frame when there are none)."""
    return _latest_runs(Path(directory)).drop(columns=SEQ)


def read_steps(directory: str | Path) -> pd.DataFrame:
    """The steps of every run's latest attempt, in the schema's types (empty when none were stored)."""
    return _read_of_latest(Path(directory), "steps")


def read_events(directory: str | Path, run_id: str | None = None) -> pd.DataFrame:
    """The traced steps' events of every run's latest attempt (or of `run_id`), in the schema's types."""
    events = _read_of_latest(Path(directory), "events")
    return events if run_id is None else events[events["run_id"] == run_id].reset_index(drop=True)


def _read_of_latest(directory: Path, table: str) -> pd.DataFrame:
    runs = _latest_runs(directory)
    winners = set(zip(runs["run_id"], runs[SEQ]))
    rows = _read_table(directory, table)
    if rows.empty:
        return schema.conform(pd.DataFrame(), schema.TABLES[table])
    keep = [(r, s) in winners for r, s in zip(rows["run_id"], rows[SEQ])]
    return schema.conform(rows[keep].drop(columns=[SEQ, ORDER]).reset_index(drop=True), schema.TABLES[table])


def _latest_runs(directory: Path) -> pd.DataFrame:
    """The runs table with its SEQ column (the file a row came from), one row per run id: the latest file wins."""
    runs = _read_table(directory, "runs")
    if runs.empty:
        return schema.conform(pd.DataFrame({SEQ: []}), schema.RUNS)
    runs = runs.sort_values(ORDER, kind="stable").drop_duplicates("run_id", keep="last").drop(columns=ORDER)
    return schema.conform(runs.reset_index(drop=True), schema.RUNS)


def _read_table(directory: Path, table: str) -> pd.DataFrame:
    """Both layouts of one table as one frame with SEQ (the file's name: a run's steps are in the file of the same
    name) and ORDER (later files supersede earlier ones; -1: the single file written before the dataset)."""
    frames = []
    legacy = directory / LEGACY.get(table, "")
    if table in LEGACY and legacy.exists():
        frame = _checked(_read_file(legacy), legacy, table)
        if table == "runs":
            frame = _legacy_params(frame)
        frames.append(frame.assign(**{SEQ: "legacy", ORDER: -1}))
    found = parts(directory, table)
    if found:
        tables = [_checked_arrow(_read_arrow(path), path, table) for _, _, path in found]
        names = [path.stem for (_, _, path), t in zip(found, tables) for _ in range(t.num_rows)]
        order = [i for i, t in enumerate(tables) for _ in range(t.num_rows)]
        try:
            frame = pa.concat_tables(tables, promote_options="permissive").to_pandas()
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):  # a column whose type changed
            frame = pd.concat([t.to_pandas() for t in tables], ignore_index=True)
        frames.append(frame.assign(**{SEQ: names, ORDER: order}))
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame()
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def _read_arrow(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds; all mean "not a Parquet file we can read"
        raise StoreError(f"{str(path)!r} is not a readable Parquet file ({type(e).__name__}): move it away or "
                         f"choose another --out") from None


def _read_file(path: Path) -> pd.DataFrame:
    return _read_arrow(path).to_pandas()


def _checked_arrow(table: pa.Table, path: Path, kind: str) -> pa.Table:
    _check_columns(table.column_names, table.num_rows, path, kind)
    return table


def _checked(frame: pd.DataFrame, path: Path, kind: str) -> pd.DataFrame:
    _check_columns(list(frame.columns), len(frame), path, kind)
    return frame


def _check_columns(columns: list[str], rows: int, path: Path, kind: str) -> None:
    missing = [c for c in REQUIRED[kind] if c not in columns]
    if missing and rows:
        raise StoreError(f"{str(path)!r} is not a syncbench results file (no column(s) {', '.join(missing)}): "
                         f"move it away or choose another --out")


def _legacy_params(frame: pd.DataFrame) -> pd.DataFrame:
    """runs.parquet from before the typed schema: strategy parameters from its JSON column (the sweep's values,
    defaults filled in), replacing the fixed param_* columns whose 0/''/False meant 'not given' as often as not."""
    if "strategy_params" not in frame:
        return frame
    frame = frame.drop(columns=[c for c in frame.columns if c.startswith(schema.PARAM)])
    values: dict[str, list] = {}
    for i, (strategy, text) in enumerate(zip(frame["strategy"] if "strategy" in frame else [""] * len(frame),
                                             frame["strategy_params"])):
        try:
            params = json.loads(text) if isinstance(text, str) and text else {}
        except ValueError:
            params = {}
        try:
            declared = {k: d for k, (_, d) in schema.parameter_types(strategy).items()}
        except (ValueError, TypeError):  # not registered here: the recorded values only
            declared = {}
        params = params if isinstance(params, dict) else {}
        for k, v in {**declared, **params}.items():
            values.setdefault(k, [None] * len(frame))[i] = v
    frame = frame.drop(columns="strategy_params")
    for k, column in sorted(values.items()):
        frame[schema.PARAM + k] = pd.Series(column, index=frame.index, dtype=object)
    return frame
