"""Run a sweep on a substrate: one run at a time, each finished run appended to the results store.

The runner is the same for every substrate (experiments/pipeline/substrate.py): Ray actors (the default,
measured: experiments/pipeline/ray_substrate.py), thread ranks (tests) or SimGrid (`syncbench simulate`:
experiments/simulate/substrate.py). It refuses before any work a run the substrate cannot apply, resumes only
into the same sweep, and prints one line per run. A failing run records its error and the sweep goes on;
SIGINT/SIGTERM stop between writes, never inside one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import signal
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.config.sweep import Sweep
from experiments.pipeline.store import Store, StoreError
from experiments.pipeline.substrate import Run
from experiments.pipeline.train import train
from workloads.files import check_text
from workloads.models import describe_size


def run_sweep(sweep: Sweep, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
              address: str | None = None, log=None, train_fn=train, oversubscribe: bool = False,
              substrate=None) -> pd.DataFrame:
    """Run every run of the sweep that is not already done; return runs.parquet as a DataFrame.

    `substrate`: where the runs execute (default: Ray actors at `address`, every rank running `train_fn`, with
    `oversubscribe` lifting the machine's ranks-per-core limit; see experiments/pipeline/ray_substrate.py).
    """
    log = sys.stderr if log is None else log  # the stderr of now: a default bound at import may be closed
    if substrate is None:
        from experiments.pipeline.ray_substrate import RaySubstrate

        substrate = RaySubstrate(address, train_fn, oversubscribe)
    if resume and not overwrite:
        sweep = keep_recorded_p2p(sweep, Path(out_dir), log)
    runs = substrate.runs(sweep)
    substrate.check(runs)  # everything the substrate cannot apply, before the results directory is touched
    created = not Path(out_dir).exists()
    store = Store(out_dir)
    try:
        return _run_all(sweep, runs, substrate, store, resume, overwrite, log)
    except BaseException:
        store.close()
        if created and not any(Path(out_dir).rglob("*.parquet")):  # refused before a run was written: no trace
            shutil.rmtree(out_dir, ignore_errors=True)
        raise
    finally:
        store.close()  # this process stops being the directory's writer


def keep_recorded_p2p(sweep: Sweep, out_dir: Path, log) -> Sweep:
    """Resuming results measured before the sockets became the default: a sweep that does not set p2p keeps gloo,
    the transport its finished runs used, so that the runs still to do are comparable with them (said on the log).
    Anything else is left to check_same_sweep, which names what differs."""
    from experiments.config import sweep as sweep_mod

    path = out_dir / "sweep.resolved.json"
    if not sweep.source or not path.is_file():
        return sweep
    try:
        text = path.read_text()
        check_text(text, str(path), json=True)
        recorded = {run.get("p2p", "gloo") for run in json.loads(text)["runs"]}
        data = sweep_mod.loads_toml(sweep.source, "sweep.toml")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, sweep_mod.SweepError):
        return sweep  # check_same_sweep reports an unreadable record
    tables = [data.get("defaults"), data.get("grid")]
    if recorded != {"gloo"} or "simulate" in data or any(isinstance(t, dict) and "p2p" in t for t in tables) \
            or not isinstance(data.get("defaults", {}), dict):
        return sweep  # (a simulated sweep records gloo whatever it says: its runs move no real bytes)
    data["defaults"] = {**data.get("defaults", {}), "p2p": "gloo"}
    try:
        kept = sweep_mod.parse(data, source=sweep.source, where="sweep")
    except sweep_mod.SweepError:
        return sweep
    print(f"resume: {out_dir} holds runs measured over gloo, the default before the sockets: this sweep sets no "
          f"p2p, so its remaining runs take gloo too (set p2p to choose)", file=log, flush=True)
    return kept


def _run_all(sweep: Sweep, runs: list[Run], substrate, store: Store, resume: bool, overwrite: bool,
             log) -> pd.DataFrame:
    store.start(resume, overwrite)
    if resume and not overwrite:
        check_same_sweep(store, sweep, runs)
    store.write_text("sweep.toml", sweep.source)
    store.write_text("sweep.resolved.json", resolved(sweep, runs))
    # --skip-invalid: the grid points left out and why, for the report's "not run" list (empty: none)
    store.write_text("skipped.json", json.dumps([{"point": point, "reason": reason}
                                                 for point, reason in sweep.skipped], indent=1) + "\n")
    done = store.done() if resume else set()
    todo = substrate.order([run for run in runs if run.run_id not in done])
    print(f"{substrate.heading} {sweep.name!r}: {len(runs)} runs, {len(runs) - len(todo)} already done, "
          f"results in {store.dir}", file=log, flush=True)
    for model in dict.fromkeys((r.spec.workload, r.spec.num_classes, r.spec.image_size) for r in runs):
        print(f"  model: {describe_size(*model)}", file=log, flush=True)  # sized as `syncbench model` sizes it
    if not todo:
        return store.runs()
    varying = varying_settings(runs)
    with substrate.session(todo, store, log) as execute:
        previous = _stop_on_signals()
        started = time.perf_counter()
        try:
            for i, run in enumerate(todo, 1):
                eta = _eta(started, i - 1, len(todo))
                print(f"[{substrate.verb} {i}/{len(todo)}] {progress_line(substrate, run, varying)}  (ETA sweep "
                      f"{eta})", file=log, flush=True)
                run_row, step_rows, *events = execute(run)  # a substrate that traces adds the events
                with _signals_held():
                    store.append(run_row, step_rows, events[0] if events else ())
                print(f"           -> {substrate.outcome(run_row)}", file=log, flush=True)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return store.runs()


def run_settings(run: Run) -> dict[str, object]:
    """Every setting of a run, flat: the RunSpec's fields, its strategy's parameters by name, and the substrate's
    own settings (a simulation's platform) as dotted keys."""
    spec = dataclasses.asdict(run.spec)
    flat = {k: v for k, v in spec.items() if k not in ("strategy_params", "sweep")}
    flat.update(spec.get("strategy_params") or {})
    if dataclasses.is_dataclass(run.settings):
        def walk(prefix: str, value) -> None:
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            elif not isinstance(value, (list, tuple)) or len(value) <= 8:  # (a timeline's per-parameter lists)
                flat[prefix] = value
        walk("", dataclasses.asdict(run.settings))
    return flat


def varying_settings(runs: list[Run]) -> list[str]:
    """The settings whose values differ between the sweep's runs, in the order of the first run's."""
    settings = [run_settings(run) for run in runs]
    keys = list(dict.fromkeys(k for one in settings for k in one))
    return [k for k in keys if len({repr(one.get(k)) for one in settings}) > 1]


def progress_line(substrate, run: Run, varying: list[str]) -> str:
    """The substrate's description of the run, and every varying setting it does not already name (a PS grid's
    servers and placement printed four identical lines)."""
    line = substrate.describe(run)
    settings = run_settings(run)
    named = {"strategy", "workload", "straggler", "overlap"}  # described without key=
    extra = [f"{k}={_shown(settings.get(k))}" for k in varying  # (None: not a setting of this run's strategy)
             if k not in named and settings.get(k) is not None and f"{k.rsplit('.', 1)[-1]}=" not in line]
    return " ".join([line, *extra])


def _shown(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_shown(v)}" for k, v in value.items()) + "}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def resolved(sweep: Sweep, runs: list[Run] | None = None) -> str:
    """Every run of the sweep with every setting spelled out (defaults included) and its run id (the substrate's:
    a simulated run's id also digests its platform), as JSON."""
    runs = runs if runs is not None else [Run(spec.run_id, spec) for spec in sweep.runs]
    listed = [{"run_id": run.run_id, **dataclasses.asdict(run.spec)} for run in runs]
    return json.dumps({"name": sweep.name, "description": sweep.description, "runs": listed}, indent=1) + "\n"


def check_same_sweep(store: Store, sweep: Sweep, runs: list | None = None) -> None:
    """--resume only into a directory holding this same sweep: StoreError naming the settings that differ.

    Merging two sweeps would mix their runs and overwrite the only record of the first one's configuration.
    """
    runs = runs if runs is not None else [Run(spec.run_id, spec) for spec in sweep.runs]
    new = {run.run_id: {"sweep": sweep.name, **dataclasses.asdict(run.spec)} for run in runs}
    path = store.dir / "sweep.resolved.json"
    if path.exists():
        try:
            text = path.read_text()
            check_text(text, str(path), json=True)  # nesting and digits bounded before the parser recurses
            recorded = json.loads(text)
            old = {run["run_id"]: {k: v for k, v in run.items() if k != "run_id"} for run in recorded["runs"]}
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{path} is not a syncbench sweep record ({e}): choose another --out") from None
    else:  # no record: the run ids on disk must all belong to this sweep
        foreign = set(store.runs().get("run_id", [])) - set(new)
        if foreign:
            raise StoreError(f"{store.dir} holds {len(foreign)} run(s) that are not in sweep {sweep.name!r} and no "
                             f"sweep.resolved.json to say what they were: choose another --out, or --overwrite to "
                             f"discard them")
        return
    if set(old) == set(new):
        return
    differ = []
    for key in sorted({k for run in [*old.values(), *new.values()] for k in run}):
        before = sorted({json.dumps(run.get(key), sort_keys=True) for run in old.values()})
        after = sorted({json.dumps(run.get(key), sort_keys=True) for run in new.values()})
        if before != after:
            differ.append(f"{key}: {_values(before)} there, {_values(after)} in this sweep")
    if not differ:
        differ.append(f"the runs: {len(set(old) - set(new))} there are not in this sweep, "
                      f"{len(set(new) - set(old))} here are not there")
    raise StoreError(f"{store.dir} holds a different sweep ({recorded.get('name', '?')!r}), --resume would mix "
                     f"the two: " + "; ".join(differ) + ". Choose another --out, or --overwrite to discard it")


def _values(dumped: list[str]) -> str:
    shown = ", ".join(dumped[:4]) + (f", ... ({len(dumped)} values)" if len(dumped) > 4 else "")
    return shown.replace("null", "(not set)")


def _eta(started: float, finished: int, total: int) -> str:
    if finished == 0:
        return "unknown"
    left = (time.perf_counter() - started) / finished * (total - finished)
    return f"{int(left // 60)}m{int(left % 60):02d}s"


_HOLD = {"holding": False, "signum": None}


def _stop_on_signals() -> dict:
    """SIGINT and SIGTERM stop the sweep (KeyboardInterrupt): the run in flight is abandoned, everything
    finished stays on disk; one that arrives while a run is being stored stops the sweep right after."""
    def handler(signum, frame):
        if _HOLD["holding"]:
            _HOLD["signum"] = signum
            return
        raise KeyboardInterrupt(signal.Signals(signum).name)

    try:
        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        return {}


@contextlib.contextmanager
def _signals_held():
    """Defer SIGINT/SIGTERM to the end of the block, so that a run is stored whole or not at all."""
    _HOLD["holding"], _HOLD["signum"] = True, None
    try:
        yield
    finally:
        _HOLD["holding"] = False
    if _HOLD["signum"] is not None:
        raise KeyboardInterrupt(signal.Signals(_HOLD["signum"]).name)

